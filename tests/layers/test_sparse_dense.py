import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.layers import _pattern_config
from tfsparse.ops import SparsityPattern
from layer_contract import check_layer_contract


def _pattern(shape, density=0.3, seed=0):
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal(shape) * (rng.random(shape) < density)
    dense[0, :] = 0  # an input that feeds nothing
    dense[:, -1] = 0  # a unit with no inputs
    dense[1, 0] = 0.5
    return scipy.sparse.csr_matrix(dense.astype(np.float32))


@pytest.mark.parametrize(
    "make_layer,input_dim",
    [
        (lambda: SparseDense(7, density=0.2, seed=1, activation="relu"), 11),
        (lambda: SparseDense(5, pattern=_pattern((9, 5)), use_bias=False), 9),
    ],
    ids=["random-pattern", "given-pattern"],
)
def test_layer_contract(make_layer, input_dim, tmp_path):
    check_layer_contract(make_layer, input_dim, tmp_path)


def test_forward_equals_dense_with_the_masked_kernel():
    matrix = _pattern((12, 6))
    layer = SparseDense(6, pattern=matrix, activation="tanh",
                        bias_initializer="random_normal")
    x = np.random.default_rng(1).standard_normal((4, 12)).astype(np.float32)
    y = layer(x).numpy()
    expected = np.tanh(x @ matrix.toarray() + layer.bias.numpy())
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(layer.to_scipy().toarray(), matrix.toarray())
    assert layer.nnz == matrix.count_nonzero()
    assert layer.density == matrix.count_nonzero() / (12 * 6)


@pytest.mark.parametrize("use_bias", [True, False])
def test_static_output_shape_is_known_on_symbolic_inputs(use_bias):
    outputs = SparseDense(12, use_bias=use_bias)(keras.Input((20,)))
    assert outputs.shape.as_list() == [None, 12]


def test_compute_output_shape_refuses_what_the_layer_cannot_take():
    # Before: (8,) gave (5,), a shape no call returns; a built layer gave
    # (None, 5) for inputs of another width, which its call refuses.
    layer = SparseDense(5, density=0.5, seed=0)
    assert layer.compute_output_shape((None, 3, 7)).as_list() == [None, 3, 5]
    assert layer.compute_output_shape(tf.TensorShape(None)).rank is None
    with pytest.raises(ValueError, match=r'"input_shape".*at least 2 dimensions.*\(8,\)'):
        layer.compute_output_shape((8,))
    layer.build((None, 7))
    assert layer.compute_output_shape((4, None)).as_list() == [4, 5]
    with pytest.raises(ValueError, match=r"input_dim 7.*\(None, 6\)"):
        layer.compute_output_shape((None, 6))


def test_random_pattern_is_seeded_and_reproducible():
    a = SparseDense(8, density=0.25, seed=7)
    b = SparseDense(8, density=0.25, seed=7)
    a.build((None, 16))
    b.build((None, 16))
    assert a.pattern == b.pattern
    assert a.nnz == 8 * 4


def _built(layer, input_dim=16):
    layer.build((None, input_dim))
    return layer


def test_drawn_seed_is_kept_in_the_config():
    original = _built(SparseDense(8, density=0.25))
    # Two unseeded layers draw different seeds, hence different patterns...
    assert _built(SparseDense(8, density=0.25)).pattern != original.pattern
    # ...and the config keeps the drawn one: every layer built from it has its pattern.
    config = original.get_config()
    first, second = (_built(SparseDense.from_config(config)) for _ in range(2))
    assert first.pattern == original.pattern
    assert second.pattern == original.pattern


def test_given_pattern_is_rebuilt_from_the_config():
    original = _built(SparseDense(8, pattern=_pattern((16, 8))))
    config = original.get_config()
    first, second = (_built(SparseDense.from_config(config)) for _ in range(2))
    assert first.pattern == original.pattern
    assert second.pattern == original.pattern


def test_only_the_nonzeros_are_weights():
    layer = SparseDense(1000, density=0.01, seed=0)
    layer.build((None, 2000))
    assert [w.name.split("/")[-1] for w in layer.trainable_weights] == ["values:0", "bias:0"]
    assert layer.values.shape == (20 * 1000,)
    assert {w.shape.num_elements() for w in layer.non_trainable_weights} == {20000}


def test_glorot_uses_the_sparse_fans():
    layer = SparseDense(400, density=0.05, seed=0, kernel_initializer=keras.initializers.GlorotUniform(seed=1))
    layer.build((None, 800))
    fan_in, fan_out = 40, 40 * 400 / 800
    limit = np.sqrt(6 / (fan_in + fan_out))
    values = layer.values.numpy()
    assert np.abs(values).max() <= limit
    # uniform(-limit, limit) has variance limit^2/3; 16000 draws: 3% is > 5 sigma.
    assert abs(values.var() / (limit**2 / 3) - 1) < 0.03


def test_elementwise_regularizer_and_constraint_apply_to_the_values():
    layer = SparseDense(4, density=0.5, seed=0, kernel_regularizer=keras.regularizers.L1(0.1),
                        kernel_constraint=keras.constraints.NonNeg())
    layer(np.ones((1, 6), np.float32))
    np.testing.assert_allclose(layer.losses[0].numpy(), 0.1 * np.abs(layer.values.numpy()).sum(), rtol=1e-6)
    assert layer.kernel_constraint is not None


def test_sparse_aware_regularizer_gets_the_pattern():
    class ColumnCount(keras.regularizers.Regularizer):
        def __call__(self, values):
            raise AssertionError("the sparse path must be used")

        def sparse_penalty(self, values, pattern):
            ones = tf.ones_like(values)
            per_column = tf.math.unsorted_segment_sum(ones, pattern.cols, pattern.shape[1])
            return tf.reduce_max(per_column)

    layer = SparseDense(5, density=0.5, seed=0, kernel_regularizer=ColumnCount())
    layer(np.ones((1, 8), np.float32))
    assert layer.losses[0].numpy() == 4


def _message(name, expected, received):
    return (f'Received an invalid value for "{name}", expected {expected}. '
            f"Received: {received}")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(units=0), _message("units", "a positive integer", "units=0")),
        (dict(units=4, density=0.0), _message("density", "a float in (0, 1]", "density=0.0")),
        (dict(units=4, density=1.5), _message("density", "a float in (0, 1]", "density=1.5")),
        (dict(units=4, pattern=scipy.sparse.eye(3, 5, format="csr")),
         _message("pattern", "a matrix of shape (input_dim, 4) (units=4)", "pattern of shape (3, 5)")),
        (dict(units=2, pattern=scipy.sparse.csr_matrix(np.array([[np.nan, 1.0]]))),
         _message("pattern", "finite values", "pattern with 1 non-finite values")),
        # 7e4 is inf in float16 (it was stored as inf, the output inf).
        (dict(units=2, dtype="float16", pattern=scipy.sparse.csr_matrix(np.array([[7e4, 1.0]]))),
         _message("pattern", "finite values in the layer's dtype float16",
                  "1 value(s) beyond its range (the largest: 70000)")),
        (dict(units=2, pattern=np.eye(2)),
         _message("pattern", "a scipy.sparse matrix of shape (input_dim, units)", "pattern of type ndarray")),
        (dict(units=2, density=0.5, pattern=scipy.sparse.eye(2, format="csr")),
         _message("density", "None when a pattern is given (the pattern sets it)", "density=0.5")),
        (dict(units=2, seed=-1), _message("seed", "a non-negative integer", "seed=-1")),
        (dict(units=2, seed=1.5), _message("seed", "a non-negative integer", "seed=1.5")),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError) as error:
        SparseDense(**kwargs)
    assert str(error.value) == message


def test_pattern_that_does_not_match_the_input_is_rejected_at_build():
    layer = SparseDense(3, pattern=scipy.sparse.eye(4, 3, format="csr"))
    with pytest.raises(ValueError) as error:
        layer(np.ones((2, 5), np.float32))
    assert str(error.value) == _message(
        "pattern", "a matrix of shape (5, 3) to match the input dimension 5",
        "pattern of shape (4, 3)")


def test_one_dimensional_input_is_rejected():
    with pytest.raises(ValueError) as error:
        SparseDense(3)(np.ones((4,), np.float32))
    assert str(error.value) == _message(
        "inputs", "an input of at least 2 dimensions (batch, ..., input_dim) with known "
        "input_dim", "inputs of shape (4,)")


@pytest.mark.parametrize("shape", [(3, 5, 9), (2, 3, 4, 9)])
def test_acts_on_the_last_axis_of_higher_rank_inputs(shape):
    # As Dense: (batch, ..., input_dim) -> (batch, ..., units), forward and
    # gradients equal to the product over the last axis (NumPy, float64).
    layer = SparseDense(6, density=0.4, seed=3, activation="tanh")
    x = tf.constant(np.random.default_rng(0).normal(size=shape), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(y * tf.range(6, dtype=tf.float32))
    assert y.shape == shape[:-1] + (6,)
    kernel = layer.to_scipy().toarray().astype(np.float64)
    x64 = x.numpy().astype(np.float64)
    want = np.tanh(x64 @ kernel + layer.bias.numpy())
    # float32 sums of at most 9 products of O(1) terms.
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)
    dx, dvalues = tape.gradient(loss, [x, layer.values])
    upstream = (1 - want ** 2) * np.arange(6)
    np.testing.assert_allclose(dx.numpy(), upstream @ kernel.T, rtol=1e-5, atol=1e-5)
    rows, cols = (np.asarray(t) for t in (layer.pattern.rows, layer.pattern.cols))
    flat_x, flat_up = x64.reshape(-1, 9), upstream.reshape(-1, 6)
    np.testing.assert_allclose(dvalues.numpy(), (flat_x.T @ flat_up)[rows, cols],
                               rtol=1e-5, atol=1e-5)


def test_sequence_model_trains_and_reloads(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.random((32, 7, 10)).astype("float32")
    y = rng.random((32, 7, 4)).astype("float32")
    model = keras.Sequential([keras.Input((None, 10)),
                              SparseDense(12, density=0.3, seed=0, activation="relu"),
                              SparseDense(4, density=0.5, seed=1)])
    model.compile("adam", "mse")
    history = model.fit(x, y, epochs=3, batch_size=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert model.predict(x[:, :3], verbose=0).shape == (32, 3, 4)  # any length
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_properties_need_a_built_layer():
    with pytest.raises(RuntimeError, match="known once the layer is built"):
        SparseDense(3).nnz


def test_checkpoint_restores_values_and_pattern(tmp_path):
    layer = SparseDense(4, pattern=_pattern((6, 4)))
    layer(np.ones((1, 6), np.float32))
    layer.values.assign(layer.values * 2)
    checkpoint = tf.train.Checkpoint(layer=layer)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    restored = SparseDense.from_config(layer.get_config())
    restored.build((None, 6))
    tf.train.Checkpoint(layer=restored).restore(path).assert_consumed()
    np.testing.assert_array_equal(restored.to_scipy().toarray(), layer.to_scipy().toarray())


def test_float64_layer():
    layer = SparseDense(3, density=0.5, seed=0, dtype="float64")
    x = np.random.default_rng(0).standard_normal((2, 4))
    y = layer(x)
    assert y.dtype == tf.float64
    np.testing.assert_allclose(y.numpy(), x @ layer.to_scipy().toarray() + layer.bias.numpy(), atol=1e-12)


def test_keras_set_random_seed_fixes_patterns_drawn_without_a_seed():
    def patterns():
        keras.utils.set_random_seed(7)
        layers = [SparseDense(5, density=0.3), SparseDense(5, density=0.3)]
        for layer in layers:
            layer.build((None, 12))
        return [(layer.seed, np.asarray(layer.pattern.rows).tolist()) for layer in layers]

    first, second = patterns(), patterns()
    assert first == second  # as Dense's kernels under set_random_seed
    assert first[0][0] != first[1][0]  # two layers draw two patterns


def _clone_of(layer, input_dim):
    inputs = keras.Input((input_dim,))
    model = keras.Model(inputs, layer(inputs))
    return keras.models.clone_model(model).layers[-1]


def test_clone_model_rebuilds_a_given_pattern():
    # Issue 14: the clone drew a placeholder pattern (62 of 140 positions
    # differed on this 20 x 7 kernel with 42 nonzeros).
    matrix = scipy.sparse.random(20, 7, density=0.3, format="csr", rng=0, dtype=np.float32)
    layer = SparseDense(7, pattern=matrix)
    clone = _clone_of(layer, 20)
    assert clone.pattern == layer.pattern
    # Fresh values (a clone is a new initialisation, as for Dense), same fans.
    assert clone.nnz == 42 and not np.array_equal(clone.values.numpy(), layer.values.numpy())


def test_random_pattern_is_rebuilt_from_the_seed_and_moved_ones_from_positions():
    layer = SparseDense(6, density=0.3, seed=4)
    layer.build((None, 10))
    config = layer.get_config()
    assert config["pattern"] is None and config["density"] == 0.3  # the seed suffices
    rebuilt = SparseDense.from_config(config)
    rebuilt.build((None, 10))
    assert rebuilt.pattern == layer.pattern
    moved = SparsityPattern.from_coo(np.arange(layer.nnz) % 10, np.arange(layer.nnz) // 10,
                                     (10, 6))
    layer.set_pattern(moved, np.ones(layer.nnz, np.float32))
    config = layer.get_config()
    assert config["density"] is None and config["pattern"]["nnz"] == layer.nnz
    assert _clone_of(layer, 10).pattern == moved


def test_pattern_config_of_a_huge_kernel_uses_wide_deltas():
    # A 70000 x 70000 kernel with two nonzeros: their keys differ by > 2**32.
    pattern = SparsityPattern.from_coo([0, 5], [0, 69999], (70000, 70000))
    entry = _pattern_config.encode(pattern)
    assert entry["encoding"] == "zlib-delta-u64"
    assert _pattern_config.decode(entry) == pattern


def test_a_config_pattern_without_positions_is_refused():
    with pytest.raises(ValueError) as error:
        SparseDense(3, pattern={"nnz": 4})
    assert str(error.value) == (
        'Received an invalid value for "pattern", expected a dict written by '
        "SparseDense.get_config (with shape, nnz, encoding and positions). "
        "Received: pattern={'nnz': 4}")  # the layout of 0.1.0's configs: no positions


def test_set_pattern_refuses_another_nnz():
    layer = SparseDense(3, density=0.5, seed=0)
    layer.build((None, 4))
    with pytest.raises(ValueError, match='"pattern", expected a pattern of shape'):
        layer.set_pattern(SparsityPattern.from_coo([0], [0], (4, 3)), np.ones(1))


@pytest.mark.parametrize("form", ["dok_matrix", "dok_array"])
def test_a_dok_pattern_is_a_scipy_matrix_not_a_config(form):
    # A dok matrix is a dict: it was taken for get_config's encoded positions
    # ("IndexError: Index encoding length needs to match self.shape").
    from tfsparse.layers import SparseConv2D

    kernel = np.zeros((6, 3), np.float32)
    kernel[[0, 2, 5], [0, 1, 2]] = [1.5, -2.0, 0.5]
    dok = getattr(scipy.sparse, form)(kernel)
    layer = SparseDense(3, pattern=dok, use_bias=False)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(layer(x).numpy(), x @ kernel)
    conv = SparseConv2D(3, (1, 1), pattern=dok, use_bias=False)
    image = x.reshape(2, 1, 1, 6)
    np.testing.assert_array_equal(conv(image).numpy().reshape(2, 3), x @ kernel)


def test_inputs_of_another_width_than_the_built_layer_are_refused():
    # As Dense: a wider input was multiplied by its first input_dim
    # columns, silently.
    layer = SparseDense(5, density=0.5, seed=0)
    layer(np.ones((2, 7), np.float32))
    for width in (9, 6):
        with pytest.raises(ValueError, match=r"expected axis -1 of input shape to have value 7"):
            layer(np.ones((2, width), np.float32))
    assert layer(np.ones((2, 3, 7), np.float32)).shape == (2, 3, 5)


@pytest.mark.parametrize("make", [
    lambda constraint: SparseDense(5, density=0.5, kernel_constraint=constraint),
    lambda constraint: __import__("tfsparse").SparseConv2D(4, 3, density=0.5,
                                                           kernel_constraint=constraint),
])
def test_norm_constraints_over_kernel_axes_are_refused(make):
    # Applied to the vector of nonzeros, MaxNorm(1) scaled all of them by one
    # norm (column norms 0.26-0.73 where Dense's are 0.66-1), silently; a
    # conv's axes failed inside the optimizer.
    for constraint in (keras.constraints.MaxNorm(1), keras.constraints.UnitNorm(),
                       keras.constraints.MinMaxNorm(0.5, 1.0), "max_norm",
                       keras.constraints.MaxNorm(1, axis=[0, 1, 2])):
        with pytest.raises(ValueError, match=r'"kernel_constraint", expected a constraint of '
                                             r'the nonzeros one by one'):
            make(constraint)
    layer = make(keras.constraints.NonNeg())  # elementwise: as on a dense kernel
    assert isinstance(layer.kernel_constraint, keras.constraints.NonNeg)


def test_sparse_and_ragged_inputs_are_taken_as_dense_takes_them():
    # Before: "Attempt to convert a value (SparseTensor(...)) with an
    # unsupported type" and "object of type 'RaggedTensor' has no len()".
    layer = SparseDense(5, density=0.5, seed=0)
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    x[x < 0.3] = 0
    layer(x)  # built
    want = x.astype(np.float64) @ layer.to_scipy().toarray() + layer.bias.numpy()
    np.testing.assert_allclose(layer(tf.sparse.from_dense(x)), want, rtol=1e-6, atol=1e-6)
    ragged = tf.RaggedTensor.from_row_lengths(x, [1, 2])
    got = layer(ragged)
    assert isinstance(got, tf.RaggedTensor) and got.shape.as_list() == [2, None, 5]
    np.testing.assert_allclose(got.flat_values, want, rtol=1e-6, atol=1e-6)
    inputs = keras.Input((7,), sparse=True)
    model = keras.Model(inputs, layer(inputs))
    np.testing.assert_allclose(model(tf.sparse.from_dense(x)), want, rtol=1e-6, atol=1e-6)


def test_an_input_of_unknown_rank_is_taken_as_dense_takes_it():
    # Before: "expected an input of at least 2 dimensions ... Received:
    # inputs of shape <unknown>".
    layer = SparseDense(5, density=0.5, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 3, 7)).astype(np.float32)
    want = layer(x).numpy()
    call = tf.function(layer, input_signature=[tf.TensorSpec(None, tf.float32)])
    np.testing.assert_array_equal(call(x), want)
    # 3 rows instead of 6: another kernel path, another order of the sums.
    np.testing.assert_allclose(call(x[0]), want[0], rtol=1e-6, atol=1e-6)
