"""SparseConv2D: the layer contract, its outputs against Conv2D, its arguments."""

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf
import tensorflow_model_optimization as tfmot

from tfsparse._keras import keras
from tfsparse.layers import SparseConv2D
from layer_contract import check_layer_contract


def _kernel(shape=(3, 3, 4, 5), density=0.3, seed=0):
    rng = np.random.default_rng(seed)
    kernel = rng.standard_normal(shape) * (rng.random(shape) < density)
    kernel[..., -1] = 0  # a filter with no inputs
    kernel[:, :, 0, :] = 0  # an input channel that feeds nothing
    kernel[1, 1, 1, 0] = 0.5
    return kernel.astype(np.float32)


@pytest.mark.parametrize(
    "make_layer",
    [
        lambda: SparseConv2D(5, 3, padding="same", density=0.2, seed=1, activation="relu"),
        lambda: SparseConv2D(5, 3, strides=2, pattern=_kernel(), use_bias=False),
        lambda: SparseConv2D(5, (3, 3), dilation_rate=2, pattern=_kernel() != 0),
        lambda: SparseConv2D(5, 3, pattern=scipy.sparse.csr_matrix(_kernel().reshape(-1, 5))),
    ],
    ids=["random-same", "array-strided", "boolean-dilated", "scipy"],
)
def test_layer_contract(make_layer, tmp_path):
    check_layer_contract(make_layer, (7, 8, 4), tmp_path, terms=3 * 3 * 4)


@pytest.mark.parametrize("strides,padding,dilation", [(1, "same", 1), (2, "valid", 1),
                                                      (1, "valid", 2), (2, "same", 2)])
def test_forward_equals_conv2d_with_the_dense_kernel(strides, padding, dilation):
    kernel = _kernel()
    layer = SparseConv2D(5, 3, strides, padding, dilation, pattern=kernel,
                         activation="tanh", bias_initializer="random_normal")
    x = np.random.default_rng(1).standard_normal((2, 9, 8, 4)).astype(np.float32)
    y = layer(x).numpy()
    expected = np.tanh(tf.nn.conv2d(x.astype(np.float64), kernel.astype(np.float64),
                                    strides, padding.upper(), dilations=dilation).numpy()
                       + layer.bias.numpy())
    # float32 sums of at most 36 products of O(1) terms.
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert y.shape == tuple(layer.compute_output_shape(x.shape))
    np.testing.assert_array_equal(layer.to_dense(), kernel)
    assert layer.nnz == np.count_nonzero(kernel)
    assert layer.density == np.count_nonzero(kernel) / kernel.size


def test_compute_output_shape_refuses_what_the_layer_cannot_take():
    # Before: (9, 8, 4), an image without its batch axis, gave (9, 6, 2, 5),
    # reading the width and channels as the image's sizes; a built layer
    # took inputs of another channel count.
    layer = SparseConv2D(5, 3, density=0.5, seed=0)
    assert layer.compute_output_shape((None, 9, 8, 4)).as_list() == [None, 7, 6, 5]
    with pytest.raises(ValueError, match=r'"input_shape".*4 dimensions.*\(9, 8, 4\)'):
        layer.compute_output_shape((9, 8, 4))
    layer.build((None, 9, 8, 4))
    with pytest.raises(ValueError, match=r"with 4 channels.*\(None, 9, 8, 3\)"):
        layer.compute_output_shape((None, 9, 8, 3))


def test_a_half_precision_kernel_array_gives_the_pattern_and_its_values():
    # Before: scipy's "does not support dtype float16", whatever the layer's dtype.
    import ml_dtypes

    kernel = _kernel()
    for narrow in (np.float16, ml_dtypes.bfloat16):
        exact = kernel.astype(narrow)
        for dtype in ("float16", "float32"):
            layer = SparseConv2D(5, 3, pattern=exact, dtype=dtype)
            layer.build((None, 6, 6, 4))
            np.testing.assert_array_equal(layer.to_dense(), exact.astype(np.float32))


def test_an_empty_image_with_same_padding_names_its_size():
    # Before: the kernel "is larger than the input with padding='valid'".
    layer = SparseConv2D(5, 3, padding="same", density=0.5, seed=0)
    with pytest.raises(ValueError, match=r"positive height and width.*\(2, 0, 7, 4\)"):
        layer.compute_output_shape((2, 0, 7, 4))


def test_an_input_of_unknown_rank_is_taken_as_conv2d_takes_it():
    # Before: "Cannot iterate over a shape with unknown rank".
    layer = SparseConv2D(3, 3, density=0.5, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 6, 5, 4)).astype(np.float32)
    want = layer(x).numpy()
    call = tf.function(layer, input_signature=[tf.TensorSpec(None, tf.float32)])
    np.testing.assert_array_equal(call(x), want)
    with pytest.raises(tf.errors.InvalidArgumentError):
        call(x[..., :3])


def test_only_the_nonzeros_are_weights_and_glorot_uses_the_sparse_fans():
    layer = SparseConv2D(64, 3, density=0.1, seed=0)
    layer.build((None, 8, 8, 32))
    assert layer.values.shape == (layer.nnz,)
    assert {w.name.split("/")[-1].split(":")[0] for w in layer.weights} == {
        "pattern_rows", "pattern_cols", "values", "bias"}
    # Glorot uniform: variance 2 / (fan_in + fan_out), the fans of the nonzeros.
    fan_in, fan_out = layer.nnz / 64, layer.nnz / 32
    expected = 2 / (fan_in + fan_out)
    # The sample variance of nnz draws is within a few standard errors.
    assert abs(np.var(layer.values.numpy()) / expected - 1) < 0.15


def test_model_trains_with_jit_compile_and_reloads(tmp_path):
    model = keras.Sequential([keras.Input((8, 8, 3)), SparseConv2D(6, 3, density=0.5, seed=0),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8, 8, 3)).astype(np.float32)
    y = rng.standard_normal((16, 2)).astype(np.float32)
    eager = keras.models.clone_model(model)
    eager.set_weights(model.get_weights())
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=True)
    eager.compile(keras.optimizers.SGD(0.01), "mse")
    jit_losses = model.fit(x, y, epochs=3, batch_size=16, verbose=0).history["loss"]
    eager_losses = eager.fit(x, y, epochs=3, batch_size=16, verbose=0).history["loss"]
    # The same kernels under XLA (custom calls) and eagerly; the model's other
    # ops (Dense, the loss) XLA fuses in other orders: equal up to rounding.
    np.testing.assert_allclose(jit_losses, eager_losses, rtol=1e-4)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.fixture(params=["mixed_float16", "mixed_bfloat16"])
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param.split("_")[1]
    keras.mixed_precision.set_global_policy(None)  # back to floatx, as when unset


def test_mixed_precision_computes_in_float32_and_rounds_once(policy):
    layer = SparseConv2D(5, 3, pattern=_kernel())
    x = np.random.default_rng(0).standard_normal((2, 6, 6, 4)).astype(np.float32)
    y = layer(x)
    assert y.dtype == policy and layer.values.dtype == tf.float32
    half_x = tf.cast(tf.cast(x, policy), tf.float64)
    half_kernel = tf.cast(tf.cast(_kernel(), policy), tf.float64)
    expected = tf.nn.conv2d(half_x, half_kernel, 1, "VALID").numpy()
    roundoff = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[policy]
    # One rounding to the half type after a float32 sum of 36 terms.
    np.testing.assert_allclose(tf.cast(y, tf.float64).numpy(), expected,
                               rtol=2 * roundoff, atol=36 * 2 ** -23 * 10)


def test_tfmot_prunes_the_values():
    model = keras.Sequential([keras.Input((6, 6, 3)), SparseConv2D(4, 3, density=0.6, seed=0),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    schedule = tfmot.sparsity.keras.ConstantSparsity(0.5, begin_step=0, frequency=1)
    pruned = tfmot.sparsity.keras.prune_low_magnitude(model, pruning_schedule=schedule)
    pruned.compile(keras.optimizers.SGD(0.01), "mse")
    x = np.random.default_rng(0).standard_normal((8, 6, 6, 3)).astype(np.float32)
    pruned.fit(x, np.zeros((8, 1), "float32"), epochs=2, verbose=0,
               callbacks=[tfmot.sparsity.keras.UpdatePruningStep()])
    stripped = tfmot.sparsity.keras.strip_pruning(pruned)
    values = stripped.layers[0].values.numpy()
    assert np.mean(values == 0) == pytest.approx(0.5, abs=1 / values.size)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(filters=0, kernel_size=3), "filters=0"),
        (dict(filters=4, kernel_size=(3, 0)), "kernel_size=(3, 0)"),
        (dict(filters=4, kernel_size=3, strides=(1, 2, 3)), "strides=(1, 2, 3)"),
        (dict(filters=4, kernel_size=3, padding="causal"), "padding='causal'"),
        (dict(filters=4, kernel_size=3, dilation_rate=0), "dilation_rate=0"),
        (dict(filters=4, kernel_size=3, density=1.5), "density=1.5"),
        (dict(filters=4, kernel_size=3, seed=-1), "seed=-1"),
        (dict(filters=4, kernel_size=3, pattern=np.ones((3, 3, 2))), "pattern of shape (3, 3, 2)"),
        (dict(filters=4, kernel_size=3, pattern=np.zeros((3, 3, 2, 4))), "an all-zero pattern"),
        (dict(filters=4, kernel_size=3, pattern=np.ones((3, 3, 2, 4)), density=0.5),
         "density=0.5"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match="Received an invalid value for") as error:
        SparseConv2D(**kwargs)
    assert message in str(error.value)


def test_pattern_of_other_input_channels_is_rejected_at_build():
    layer = SparseConv2D(5, 3, pattern=_kernel())
    with pytest.raises(ValueError, match='"pattern", expected a kernel of 2 input channels'):
        layer.build((None, 8, 8, 2))


@pytest.mark.parametrize("given", [True, False], ids=["given-pattern", "drawn-pattern"])
def test_clone_model_rebuilds_the_same_pattern(given):
    # clone_model rebuilds layers from get_config alone: the clone must be the
    # same network before any set_weights (issue 14's bug, for SparseConv2D).
    rng = np.random.default_rng(3)
    pattern = rng.random((3, 3, 4, 5)) < 0.3 if given else None
    layer = SparseConv2D(5, 3, pattern=pattern, density=None if given else 0.3, seed=7)
    model = keras.Sequential([keras.Input((8, 8, 4)), layer])
    clone = keras.models.clone_model(model)
    np.testing.assert_array_equal(clone.layers[0].pattern_rows.numpy(), layer.pattern_rows.numpy())
    np.testing.assert_array_equal(clone.layers[0].pattern_cols.numpy(), layer.pattern_cols.numpy())


def test_an_array_pattern_keeps_its_values_exactly_in_a_float64_layer():
    # They went through float32: 1 + 1e-12 was rounded and 1e-50 dropped
    # from the pattern (2 nonzeros instead of 3), as a scipy matrix never was.
    kernel = np.zeros((1, 1, 3, 2))
    kernel[0, 0, 0, 0], kernel[0, 0, 1, 1], kernel[0, 0, 2, 0] = 0.1, 1e-50, 1 + 1e-12
    for pattern in (kernel, scipy.sparse.csr_matrix(kernel.reshape(3, 2))):
        layer = SparseConv2D(2, 1, pattern=pattern, dtype="float64", use_bias=False)
        y = layer(np.ones((1, 1, 1, 3))).numpy().ravel()
        assert layer.nnz == 3
        np.testing.assert_array_equal(y, [0.1 + (1 + 1e-12), 1e-50])


def test_pattern_values_beyond_the_layers_dtype_are_refused():
    array = np.zeros((1, 1, 2, 2))
    array[0, 0, 0, 0], array[0, 0, 1, 1] = 7e4, 1.0  # inf in float16
    with pytest.raises(ValueError, match="finite values in the layer's dtype float16"):
        SparseConv2D(2, 1, pattern=array, dtype="float16")
    layer = SparseConv2D(2, 1, pattern=array, dtype="bfloat16")  # in bfloat16's range
    layer.build((None, 3, 3, 2))
    assert np.isfinite(layer.values.numpy().astype(np.float32)).all()
    kernel = layer.to_dense()  # through scipy (no half types there) and back
    assert kernel.dtype.name == "bfloat16"
    np.testing.assert_array_equal(kernel.astype(np.float64),
                                  array.astype(layer.values.numpy().dtype).astype(np.float64))



def test_a_group_lasso_on_its_nonzeros_is_refused_naming_the_argument():
    # Before, it was applied to the vector of nonzeros and failed at the first
    # call with an error about "the 2-D kernel (input_dim, units)".
    from tfsparse.regularizers import GroupLasso

    for regularizer in (GroupLasso(0.1, groups="filters"),
                        GroupLasso(0.1, groups="channels") + keras.regularizers.L2(0.1)):
        with pytest.raises(ValueError, match=r'"kernel_regularizer", expected a regularizer of '
                                             r'the nonzeros one by one.*Conv2D'):
            SparseConv2D(4, 3, density=0.5, kernel_regularizer=regularizer)
    layer = SparseConv2D(4, 3, density=0.5, seed=0, kernel_regularizer=keras.regularizers.L2(0.5))
    layer(np.ones((1, 5, 5, 2), np.float32))
    np.testing.assert_allclose(float(layer.losses[0]),
                               0.5 * float(np.sum(layer.values.numpy() ** 2)), rtol=1e-6)


def test_a_kernel_larger_than_the_input_is_refused_as_conv2d_does():
    # It returned an empty output, so a model of it, Flatten and Dense
    # answered the Dense bias alone.
    with pytest.raises(ValueError, match=r"One of the dimensions in the output of SparseConv2D "
                                         r"is <= 0"):
        keras.Sequential([keras.Input((3, 3, 2)), SparseConv2D(4, 5, density=0.5)])
    layer = SparseConv2D(4, 3, density=0.5, dilation_rate=2)
    layer(np.ones((1, 5, 5, 2), np.float32))
    with pytest.raises(ValueError, match="is <= 0"):
        layer(np.ones((1, 4, 4, 2), np.float32))
    assert SparseConv2D(4, 5, density=0.5, padding="same")(
        np.ones((1, 3, 3, 2), np.float32)).shape == (1, 3, 3, 4)
