"""SparseDense and sparse_matmul inside functions XLA compiles (jit_compile=True)."""

import numpy as np
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.ops import sparse_matmul


def test_jit_compiled_product_and_gradients_equal_numpy():
    layer = SparseDense(6, density=0.4, seed=0)
    layer.build((None, 9))
    layer.bias.assign(np.linspace(-1, 1, 6).astype("float32"))
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 9)), tf.float32)
    upstream = tf.constant(np.random.default_rng(1).normal(size=(4, 6)), tf.float32)
    pattern = layer.pattern

    @tf.function(jit_compile=True)
    def step(x, values, bias):
        with tf.GradientTape() as tape:
            tape.watch([x, values, bias])
            y = sparse_matmul(x, values, pattern, bias=bias)
        return y, tape.gradient(y, [x, values, bias], output_gradients=upstream)

    y, (dx, dvalues, dbias) = step(x, tf.identity(layer.values), tf.identity(layer.bias))
    # It really ran under XLA: the compiled function's graph has no tfsparse
    # or CSR op, which XLA cannot compile.
    graph = step.get_concrete_function(x, layer.values, layer.bias).graph
    kinds = {op.type for op in graph.get_operations()}
    assert not any(kind.startswith(("Tfsparse", "SparseMatrix")) for kind in kinds), kinds
    kernel = layer.to_scipy().toarray().astype(np.float64)
    x64, up64 = x.numpy().astype(np.float64), upstream.numpy().astype(np.float64)
    # float32 sums of at most 9 products of O(1) terms.
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.numpy(), x64 @ kernel + layer.bias.numpy(), **tol)
    np.testing.assert_allclose(dx.numpy(), up64 @ kernel.T, **tol)
    np.testing.assert_allclose(dvalues.numpy(),
                               (x64.T @ up64)[np.asarray(pattern.rows), np.asarray(pattern.cols)],
                               **tol)
    np.testing.assert_allclose(dbias.numpy(), up64.sum(axis=0), **tol)


def test_fit_with_jit_compile_equals_fit_without():
    rng = np.random.default_rng(2)
    x = rng.random((48, 20)).astype("float32")
    y = rng.integers(0, 3, 48)
    weights = []
    for jit in (False, True):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((20,)),
                                  SparseDense(16, density=0.3, seed=1, activation="relu"),
                                  SparseDense(3, density=0.5, seed=2)])
        model.compile(keras.optimizers.SGD(0.1),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=jit)
        model.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    # Six SGD steps with the same float32 arithmetic in another order.
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
