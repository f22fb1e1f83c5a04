"""SparseDense under Keras mixed precision (float16 and bfloat16 compute)."""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.ops import sparse_matmul

from kernel_paths import PATHS

# Unit roundoff of each half type: the product is computed in float32 from
# the half inputs and rounded once to the half type.
ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


@pytest.fixture(params=["mixed_float16", "mixed_bfloat16"])
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param.split("_")[1]
    keras.mixed_precision.set_global_policy(None)  # back to floatx, as when unset


@pytest.mark.parametrize("use_kernel", PATHS)
def test_forward_and_gradients_in_half_precision(policy, use_kernel):
    dtype = tf.as_dtype(policy)
    layer = SparseDense(6, density=0.4, seed=0)
    x = tf.constant(np.random.default_rng(0).normal(size=(5, 8)), tf.float32)
    layer.build((None, 8))
    assert layer.values.dtype == tf.float32  # variables stay float32
    half_x = tf.cast(x, dtype)
    with tf.GradientTape() as tape:
        tape.watch(half_x)
        y = sparse_matmul(half_x, tf.cast(layer.values, dtype), layer.pattern,
                          use_kernel=use_kernel, bias=tf.cast(layer.bias, dtype))
        loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
    assert y.dtype == dtype
    # NumPy reference on the inputs as rounded to the half type.
    kernel = layer.to_scipy().toarray()
    rounded = lambda t: tf.cast(tf.cast(t, dtype), tf.float64).numpy()  # noqa: E731
    want = rounded(x) @ rounded(kernel) + rounded(layer.bias)
    np.testing.assert_allclose(tf.cast(y, tf.float64).numpy(), want,
                               rtol=2 * ROUNDOFF[policy], atol=2 * ROUNDOFF[policy])
    dx = tape.gradient(loss, half_x)
    assert dx.dtype == dtype
    dx_want = 2 * tf.cast(y, tf.float64).numpy() @ rounded(kernel).T
    np.testing.assert_allclose(tf.cast(dx, tf.float64).numpy(), dx_want,
                               rtol=8 * ROUNDOFF[policy], atol=8 * ROUNDOFF[policy])


def test_model_fit_and_reload_under_mixed_precision(policy, tmp_path):
    rng = np.random.default_rng(1)
    x = rng.random((64, 16)).astype("float32")
    y = rng.integers(0, 3, 64)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)),
                              SparseDense(12, density=0.3, seed=2, activation="relu"),
                              keras.layers.Dense(3, dtype="float32")])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.layers[0].values.numpy().copy()
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert model.layers[0].compute_dtype == policy
    assert not np.array_equal(model.layers[0].values.numpy(), before)  # trained
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("use_kernel", PATHS)
def test_sddmm_in_half_precision(dtype, use_kernel):
    from tfsparse.ops import sddmm

    rng = np.random.default_rng(2)
    x_t = tf.cast(rng.normal(size=(7, 5)), dtype)
    dy_t = tf.cast(rng.normal(size=(4, 5)), dtype)
    rows, cols = np.array([0, 3, 6, 6], "int32"), np.array([1, 0, 3, 2], "int32")
    out = sddmm(x_t, dy_t, rows, cols, use_kernel=use_kernel)
    assert out.dtype == dtype
    x64, dy64 = (tf.cast(t, tf.float64).numpy() for t in (x_t, dy_t))
    want = np.sum(x64[rows] * dy64[cols], axis=1)
    np.testing.assert_allclose(tf.cast(out, tf.float64).numpy(), want,
                               rtol=4 * ROUNDOFF[dtype], atol=4 * ROUNDOFF[dtype])
