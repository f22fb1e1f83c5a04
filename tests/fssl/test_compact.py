"""compact(), kept_inputs(), report() against NumPy references."""

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse import fssl
from tfsparse.layers import SparseDense

# Outputs are O(1) sums of <= 100 float32 products in another order (and
# constants folded in float64): differences stay below ~100 * 2**-24 * scale.
ATOL = 1e-5


def zero_groups(model, rng, column_share=0.3, row_share=0.2):
    """Zeroes random columns and rows of every kernel, leaving each layer something."""
    for layer in model.layers:
        if isinstance(layer, SparseDense):
            dense = layer.to_scipy().toarray()
        elif isinstance(layer, keras.layers.Dense):
            dense = layer.kernel.numpy()
        else:
            continue
        n_in, n_out = dense.shape
        if layer is not model.layers[-1]:
            dense[:, rng.choice(n_out, int(column_share * n_out), replace=False)] = 0
        dense[rng.choice(n_in, int(row_share * n_in), replace=False)] = 0
        if isinstance(layer, SparseDense):
            pattern = layer.pattern
            layer.values.assign(dense[pattern.rows, pattern.cols])
        else:
            layer.kernel.assign(dense)
        if layer.use_bias:
            layer.bias.assign(rng.uniform(-0.5, 0.5, layer.bias.shape).astype(np.float32))


def reference_kept_units(kernels):
    """Fixed point: drop units whose column (from kept inputs) or next row is zero."""
    kept = [np.ones(k.shape[1], bool) for k in kernels]
    kept_in = np.ones(kernels[0].shape[0], bool)
    for _ in range(len(kernels) * 4):
        kept_in = (kernels[0][:, kept[0]] != 0).any(axis=1)
        previous = kept_in
        for i, k in enumerate(kernels[:-1]):
            has_input = (k[previous] != 0).any(axis=0)
            has_reader = (kernels[i + 1][:, kept[i + 1]] != 0).any(axis=1)
            kept[i] = has_input & has_reader
            previous = kept[i]
    return [np.flatnonzero(k) for k in kept], np.flatnonzero(kept_in)


def dense_kernels(model):
    out = []
    for layer in model.layers:
        if isinstance(layer, SparseDense):
            out.append(layer.to_scipy().toarray())
        elif isinstance(layer, keras.layers.Dense):
            out.append(layer.kernel.numpy())
    return out


def build(kind, seed):
    keras.utils.set_random_seed(seed)
    if kind == "dense":
        layers = [keras.Input((20,)), keras.layers.Dense(16, "relu"),
                  keras.layers.Dense(12, "tanh"), keras.layers.Dense(5)]
    elif kind == "sparse":
        layers = [keras.Input((20,)), SparseDense(16, density=0.4, seed=1, activation="relu"),
                  SparseDense(12, density=0.5, seed=2, activation="relu"),
                  SparseDense(5, density=0.5, seed=3)]
    elif kind == "mixed_flatten_dropout":
        layers = [keras.Input((4, 5)), keras.layers.Flatten(),
                  SparseDense(16, density=0.5, seed=1, activation="sigmoid"),
                  keras.layers.Dropout(0.2), keras.layers.Dense(12, "elu"),
                  SparseDense(5, density=0.6, seed=3, activation="softmax")]
    elif kind == "activation_layers":  # constants pass through the activation layers
        layers = [keras.Input((20,)), SparseDense(16, density=0.5, seed=1),
                  keras.layers.ReLU(max_value=0.4), keras.layers.Dense(12),
                  keras.layers.Activation("sigmoid"), keras.layers.Dropout(0.5),
                  keras.layers.LeakyReLU(0.3), keras.layers.Dense(5), keras.layers.ELU()]
    elif kind == "no_bias_sigmoid":  # removed units are constants sigmoid(0) = 0.5
        layers = [keras.Input((20,)), keras.layers.Dense(16, "sigmoid", use_bias=False),
                  keras.layers.Dense(12, "sigmoid", use_bias=False),
                  SparseDense(5, density=0.5, seed=2, use_bias=False)]
    return keras.Sequential(layers)


KINDS = ["dense", "sparse", "mixed_flatten_dropout", "activation_layers", "no_bias_sigmoid"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dense_threshold", [0.0, fssl.DEFAULT_DENSE_THRESHOLD, 1.0])
def test_compacted_outputs_equal_and_units_match_reference(kind, dense_threshold):
    model = build(kind, seed=0)
    zero_groups(model, np.random.default_rng(1))
    x = np.random.default_rng(2).standard_normal((8,) + model.input_shape[1:]).astype(np.float32)
    compacted = fssl.compact(model, dense_threshold=dense_threshold)
    np.testing.assert_allclose(compacted(x).numpy(), model(x).numpy(), atol=ATOL, rtol=0)

    kept_units, kept_in = reference_kept_units(dense_kernels(model))
    plans = fssl.plan(model, dense_threshold)
    for layer_plan, units in zip(plans, kept_units):
        np.testing.assert_array_equal(layer_plan.kept_units, units)
    np.testing.assert_array_equal(fssl.kept_inputs(model), kept_in)
    assert all(len(u) < k.shape[1] for u, k in zip(kept_units[:-1], dense_kernels(model)))
    new_fc = [layer for layer in compacted.layers
              if isinstance(layer, (SparseDense, keras.layers.Dense))]
    assert [layer.units for layer in new_fc] == [len(u) for u in kept_units]
    for layer, layer_plan in zip(new_fc, plans):
        expect_dense = layer_plan.to_dense
        assert isinstance(layer, SparseDense) != expect_dense
        if isinstance(layer_plan.layer, keras.layers.Dense):
            assert expect_dense
        elif dense_threshold == 0.0:
            assert expect_dense
        elif dense_threshold == 1.0:
            assert not expect_dense


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_drop_inputs_takes_only_the_kept_features(kind):
    model = build(kind, seed=3)
    zero_groups(model, np.random.default_rng(4))
    kept = fssl.kept_inputs(model)
    assert kept.size < 20
    x = np.random.default_rng(5).standard_normal((6, 20)).astype(np.float32)
    compacted = fssl.compact(model, drop_inputs=True)
    assert compacted.input_shape == (None, kept.size)
    np.testing.assert_allclose(compacted(x[:, kept]).numpy(), model(x).numpy(), atol=ATOL)


def test_gather_layer_only_for_a_dense_first_layer_that_lost_inputs():
    model = build("dense", seed=6)
    zero_groups(model, np.random.default_rng(7))
    assert isinstance(fssl.compact(model).layers[0], fssl.GatherInputs)
    sparse = build("sparse", seed=6)
    zero_groups(sparse, np.random.default_rng(7))
    first = fssl.compact(sparse, dense_threshold=1.0).layers[0]
    assert isinstance(first, SparseDense) and first.input_dim == 20


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dense_threshold", [0.0, 1.0])
def test_removed_inputs_are_gathered_only_in_front_of_a_first_dense(kind, dense_threshold):
    # Removed units of layer l are removed inputs of layer l + 1: they are simply
    # not built, so no selection is ever needed inside the chain.
    model = build(kind, seed=14)
    zero_groups(model, np.random.default_rng(15))
    compacted = fssl.compact(model, dense_threshold=dense_threshold)
    kept = fssl.kept_inputs(model)
    first_plan = fssl.plan(model, dense_threshold)[0]
    gathers = [i for i, layer in enumerate(compacted.layers)
               if isinstance(layer, fssl.GatherInputs)]
    fc = [layer for layer in compacted.layers if isinstance(layer, (SparseDense, keras.layers.Dense))]
    assert kept.size < 20
    if first_plan.to_dense:
        assert gathers == [1 if kind == "mixed_flatten_dropout" else 0]
        assert compacted.layers[gathers[0]].indices == kept.tolist()
        assert fc[0].kernel.shape[0] == kept.size
    else:  # the pattern reads the kept inputs at their original positions
        assert gathers == []
        assert fc[0].input_dim == 20
        assert np.array_equal(np.unique(fc[0].pattern.rows), kept)
    for before, after in zip(fc, fc[1:]):  # each layer reads all units of the one before
        width = after.input_dim if isinstance(after, SparseDense) else after.kernel.shape[0]
        assert width == before.units


def test_compacted_model_with_gather_exports_as_saved_model(tmp_path):
    model = build("dense", seed=16)
    zero_groups(model, np.random.default_rng(17))
    compacted = fssl.compact(model)
    assert isinstance(compacted.layers[0], fssl.GatherInputs)
    x = np.random.default_rng(18).standard_normal((9, 20)).astype(np.float32)
    tf.saved_model.save(compacted, str(tmp_path))
    served = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    (name,) = served.structured_input_signature[1]
    (outputs,) = served(**{name: tf.constant(x)}).values()
    np.testing.assert_allclose(outputs.numpy(), model(x).numpy(), atol=ATOL, rtol=0)


def test_compacted_model_saves_and_loads(tmp_path):
    model = build("mixed_flatten_dropout", seed=8)
    zero_groups(model, np.random.default_rng(9))
    compacted = fssl.compact(model, dense_threshold=0.0)
    x = np.random.default_rng(10).standard_normal((4, 4, 5)).astype(np.float32)
    path = str(tmp_path / "compact.keras")
    compacted.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), atol=ATOL)


def test_compacted_model_keeps_training():
    model = build("sparse", seed=11)
    zero_groups(model, np.random.default_rng(12))
    compacted = fssl.compact(model, dense_threshold=0.3)
    compacted.compile("sgd", "mse")
    x = np.random.default_rng(13).standard_normal((16, 20)).astype(np.float32)
    loss = compacted.fit(x, np.zeros((16, 5), np.float32), epochs=2, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss))


@pytest.mark.parametrize("zeroed", [0, 1, 2])
def test_every_weight_removed_is_a_clear_error(zeroed):
    names = ["first", "hidden", "last"]
    model = keras.Sequential([keras.Input((6,))] + [
        keras.layers.Dense(4, name=name) for name in names])
    model.layers[zeroed].kernel.assign(tf.zeros_like(model.layers[zeroed].kernel))
    with pytest.raises(ValueError) as info:
        fssl.compact(model)
    assert str(info.value) == (
        f"Cannot compact: every weight of layer {names[zeroed]!r} would be removed (none "
        "connects an input that still varies to a unit the outputs depend on), which would "
        "leave an empty layer; train with a weaker group penalty or a lower threshold.")


def test_every_input_removed_is_a_clear_error():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="only")])
    model.layers[0].kernel.assign(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="every weight of layer 'only' would be removed"):
        fssl.compact(model)


PREFIX = ('Received an invalid value for "model", expected a Sequential chain of Dense and '
          "SparseDense layers, with Flatten before the first of them and Dropout or elementwise "
          "activation layers (Activation, ReLU, LeakyReLU, ELU) after them. ")


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: keras.Sequential([keras.Input((4,)),
                                   keras.layers.Dense(3, "softmax", name="soft"),
                                   keras.layers.Dense(2)]),
         PREFIX + "Received: layer 'soft' of type Dense (activation 'softmax' is not "
                  "elementwise, so its units cannot be removed)"),
        (lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                   keras.layers.Activation("softmax", name="act"),
                                   keras.layers.Dense(2)]),
         PREFIX + "Received: layer 'act' of type Activation (activation 'softmax' is not "
                  "elementwise, so its units cannot be removed)"),
        (lambda: keras.Sequential([keras.layers.Dense(2)], name="lazy"),
         'Received an invalid value for "model", expected a built tf_keras Sequential model '
         "(give it an Input or call it once). Received: the unbuilt model 'lazy'"),
    ],
)
def test_unsupported_models_are_clear_errors(make, message):
    # Sequential models with other layers (BatchNormalization, Conv2D, ...) and
    # functional models are compacted by the functional path:
    # tests/fssl/test_compact_functional.py.
    model = make()
    if isinstance(model, keras.Sequential) and model.built:
        kernel = model.layers[0].kernel.numpy()
        kernel[:, 0] = 0  # a unit to remove
        model.layers[0].kernel.assign(kernel)
    with pytest.raises(ValueError) as info:
        fssl.compact(model)
    assert str(info.value) == message


@pytest.mark.parametrize("kwargs, received", [
    (dict(dense_threshold=1.5), "dense_threshold=1.5"),
    (dict(dense_threshold=True), "dense_threshold=True"),
    (dict(drop_inputs="no"), "drop_inputs='no'"),
])
def test_invalid_arguments_name_themselves(kwargs, received):
    model = build("dense", seed=0)
    with pytest.raises(ValueError) as info:
        fssl.compact(model, **kwargs)
    assert str(info.value).startswith(f'Received an invalid value for "{received.split("=")[0]}"')
    assert str(info.value).endswith(f"Received: {received}")


def test_numpy_thresholds_are_accepted():
    model = build("dense", seed=0)
    fssl.compact(model, dense_threshold=np.float32(0.5))


def test_report_rows_match_a_hand_count():
    keras.utils.set_random_seed(0)
    pattern = scipy.sparse.csr_matrix(np.array(
        [[1, 0, 2, 0], [0, 0, 3, 0], [4, 0, 0, 5], [0, 0, 0, 0], [6, 0, 7, 0]], np.float32))
    model = keras.Sequential([keras.Input((5,)),
                              SparseDense(4, pattern=pattern, activation="relu", name="s"),
                              keras.layers.Dense(3, name="d")])
    kernel = model.layers[1].kernel.numpy()
    kernel[0] = 0  # unit 0 of "s" is read by nobody
    model.layers[1].kernel.assign(kernel)
    lines = []
    rows = fssl.report(model, dense_threshold=0.9, print_fn=lines.append)
    # "s": unit 1 has no fan-in, unit 0 no reader -> units {2, 3}; input 3 unused,
    # input 0 only feeds unit 0 and 2 -> inputs {0, 1, 2, 4}; kept nnz: 2, 3, 5, 7.
    assert rows[0] == {"layer": "s", "type": "SparseDense -> SparseDense",
                       "shape_before": (5, 4), "shape_after": (4, 2), "nnz_before": 7,
                       "nnz_after": 4, "macs_before": 7, "macs_after": 4,
                       "nnz_removed": pytest.approx(3 / 7), "macs_removed": pytest.approx(3 / 7)}
    assert rows[1]["shape_after"] == (2, 3) and rows[1]["macs_before"] == 12
    assert rows[1]["macs_after"] == 6 and rows[1]["nnz_before"] == 9
    assert rows[1]["macs_removed"] == pytest.approx(0.5)
    assert rows[2]["layer"] == "total" and rows[2]["macs_after"] == 10
    assert rows[2]["macs_removed"] == pytest.approx(1 - 10 / 19)
    assert "SparseDense -> SparseDense" in lines[0] and "42.9%" in lines[0]


def test_compacted_layers_drop_group_lasso_and_keep_other_regularizers():
    from tfsparse.regularizers import GroupLasso

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6,)),
        SparseDense(5, density=0.5, seed=1, activation="relu",
                    kernel_regularizer=GroupLasso(0.1) + keras.regularizers.L2(0.01)),
        keras.layers.Dense(3, kernel_regularizer=GroupLasso(0.1, "rows")),
    ])
    compacted = fssl.compact(model, dense_threshold=1.0)
    first, second = compacted.layers
    assert type(first.kernel_regularizer).__name__ == "L2"
    assert second.kernel_regularizer is None
    expected = 0.01 * float(tf.reduce_sum(tf.square(first.values)))
    assert float(tf.add_n(compacted.losses)) == pytest.approx(expected, rel=1e-6)


def test_a_chain_on_inputs_of_rank_3_is_compacted_as_a_graph():
    # Dense acts on each of the 3 positions: the chain path (one row of
    # features) counted 20 multiply-adds for 60, and drop_inputs=True built
    # a model of input (None, 4) and output (None, 2) for one of output
    # (None, 3, 2).
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3, 5)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2)])
    kernel, bias = model.layers[0].get_weights()
    kernel[1] = 0.0  # input feature 1 unread
    model.layers[0].set_weights([kernel, bias])
    assert fssl.report(model)[0]["macs_before"] == 3 * 5 * 4
    with pytest.raises(ValueError, match='"drop_inputs", expected False for a model that is not '
                                         "a Sequential chain"):
        fssl.compact(model, drop_inputs=True)
    small = fssl.compact(model)
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    assert small.output_shape == (None, 3, 2)
    np.testing.assert_allclose(small(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_models_compact_and_report(dtype):
    # scipy.sparse holds no half types: the kernels are read as float32
    # (exactly; before, compact and report raised scipy's dtype error).
    rng = np.random.default_rng(3)
    model = keras.Sequential([
        keras.Input((12,)),
        SparseDense(10, density=0.5, seed=0, activation="relu", dtype=dtype),
        keras.layers.Dense(8, activation="relu", dtype=dtype),
        SparseDense(3, density=0.5, seed=1, dtype=dtype)])
    zero_groups(model, rng)
    assert model.layers[0].to_scipy().dtype == np.float32
    small = fssl.compact(model)
    x = tf.constant(rng.uniform(-1, 1, (6, 12)), dtype)
    want = model(x).numpy().astype(np.float64)
    got = small(x).numpy().astype(np.float64)
    # The same half-precision products, the zero ones dropped and the rest
    # summed in another order: a few ulps of O(1) values (2**-8 in bfloat16).
    ulp = 2.0**-10 if dtype == "float16" else 2.0**-7
    np.testing.assert_allclose(got, want, atol=8 * ulp * max(1, np.abs(want).max()))
    rows = fssl.report(model, print_fn=None)
    nonzeros = [model.layers[0].nnz, int(np.count_nonzero(model.layers[1].kernel.numpy())),
                model.layers[2].nnz]
    assert [row["nnz_before"] for row in rows[:3]] == nonzeros


@pytest.mark.parametrize("flatten", [False, True])
def test_a_float64_chain_stays_float64_where_inputs_are_dropped(flatten):
    # The first Dense lost input rows: compact puts a GatherInputs in front
    # of it, which took float32 by default and rounded the float64 inputs
    # (3.6e-8 off). Now float64 throughout: one order of additions less
    # than 2**-52 * a few terms of O(1) apart.
    keras.utils.set_random_seed(0)
    shape = (4, 5) if flatten else (20,)
    layers = [keras.Input(shape, dtype="float64")]
    if flatten:
        layers.append(keras.layers.Flatten(dtype="float64"))
    model = keras.Sequential(layers + [
        keras.layers.Dense(10, activation="relu", dtype="float64"),
        keras.layers.Dense(2, dtype="float64")])
    first = model.layers[-2]
    kernel = first.kernel.numpy()
    kernel[[1, 4, 7]] = 0
    first.kernel.assign(kernel)
    small = fssl.compact(model)
    assert [layer.dtype for layer in small.layers] == ["float64"] * len(small.layers)
    assert any(isinstance(layer, fssl.GatherInputs) for layer in small.layers)
    x = np.random.default_rng(0).normal(size=(8,) + shape)
    np.testing.assert_allclose(small(x).numpy(), model(x).numpy(), rtol=0, atol=1e-14)
