"""sparse_matmul inside tflite_compatible(): builtin-op forms, exact, scoped."""

import threading

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse.ops import SparsityPattern
from tfsparse.ops import sparse_matmul
from tfsparse.ops.tflite import in_tflite_compatible_scope
from tfsparse.ops.tflite import tflite_compatible


def _skewed_pattern():
    """Unit 0 reads all 40 inputs, the other 9 units one each: padding to 40
    slots per unit would compute 400 products for 49 nonzeros."""
    dense = np.zeros((40, 10))
    dense[:, 0] = 1
    dense[np.arange(1, 10), np.arange(1, 10)] = 1
    return SparsityPattern.from_scipy(scipy.sparse.csr_matrix(dense))[0]


PATTERNS = {
    "equal fan-in": lambda: SparsityPattern.random((40, 10), 0.1, seed=0),
    "uneven fan-in": lambda: SparsityPattern.from_scipy(
        scipy.sparse.random(40, 10, density=0.1, format="csr", rng=1))[0],
    "skewed fan-in": _skewed_pattern,
}


@pytest.mark.parametrize("name,expected_sum_op", [
    ("equal fan-in", "Sum"), ("uneven fan-in", "Sum"),
    ("skewed fan-in", "UnsortedSegmentSum")])
def test_traces_a_builtin_form_with_exact_product_and_gradients(name, expected_sum_op):
    pattern = PATTERNS[name]()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((5, 40)), tf.float32)
    values = tf.Variable(rng.standard_normal(pattern.nnz).astype(np.float32))
    bias = tf.Variable(rng.standard_normal(10).astype(np.float32))
    upstream = tf.constant(rng.standard_normal((5, 10)), tf.float32)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = sparse_matmul(x, values, pattern, bias=bias)
        gradients = tape.gradient(y, [x, values, bias], output_gradients=upstream)
        # The padded form gathers the values: their gradient is IndexedSlices.
        return y, [tf.convert_to_tensor(gradient) for gradient in gradients]

    with tflite_compatible():
        graph = step.get_concrete_function(x).graph
        y, (dx, dvalues, dbias) = step(x)
    kinds = {op.type for op in graph.get_operations()}
    assert expected_sum_op in kinds
    assert not any(kind.startswith(("Tfsparse", "SparseMatrix")) for kind in kinds), kinds
    kernel = pattern.to_scipy(values.numpy()).toarray().astype(np.float64)
    x64, up64 = x.numpy().astype(np.float64), upstream.numpy().astype(np.float64)
    # float32 sums of at most 40 products of O(1) terms: error <= 40 * 2^-24 * O(10).
    tol = dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(y.numpy(), x64 @ kernel + bias.numpy(), **tol)
    np.testing.assert_allclose(dx.numpy(), up64 @ kernel.T, **tol)
    np.testing.assert_allclose(dvalues.numpy(), (x64.T @ up64)[pattern.rows, pattern.cols], **tol)
    np.testing.assert_allclose(dbias.numpy(), up64.sum(axis=0), **tol)


def test_pattern_variables_are_read_when_tracing():
    pattern = SparsityPattern.random((8, 4), 0.5, seed=0)
    variables = type("Pattern", (), dict(
        rows=tf.Variable(pattern.rows), cols=tf.Variable(pattern.cols),
        row_major_order=tf.Variable(pattern.row_major_order), shape=pattern.shape))
    values = np.arange(1, pattern.nnz + 1, dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    with tflite_compatible():
        y = tf.function(lambda x: sparse_matmul(x, values, variables))(x)
    np.testing.assert_allclose(y.numpy(), x @ pattern.to_scipy(values).toarray(),
                               rtol=1e-5, atol=1e-5)


def test_a_pattern_unknown_at_trace_time_is_refused():
    pattern = SparsityPattern.random((8, 4), 0.5, seed=0)

    @tf.function
    def product(x, rows):
        traced = type("Pattern", (), dict(rows=rows, cols=pattern.cols, shape=pattern.shape))
        return sparse_matmul(x, np.ones(pattern.nnz, np.float32), traced)

    with tflite_compatible(), pytest.raises(ValueError) as error:
        product(np.ones((2, 8), np.float32), pattern.rows)
    # tf.function prefixes the user code's frames to the message.
    assert (
        'Received an invalid value for "pattern.rows", expected an array known when '
        "the function is traced (a NumPy array, a constant or a variable) inside "
        "tfsparse.export.tflite_compatible(). Received: pattern.rows=<tf.Tensor 'rows:0' "
        "shape=(16,) dtype=int32>"
    ) in str(error.value)


def test_scope_nests_restores_and_is_per_thread():
    seen_in_thread = []
    assert not in_tflite_compatible_scope()
    with tflite_compatible():
        with tflite_compatible():
            assert in_tflite_compatible_scope()
        assert in_tflite_compatible_scope()
        thread = threading.Thread(
            target=lambda: seen_in_thread.append(in_tflite_compatible_scope()))
        thread.start()
        thread.join()
    assert not in_tflite_compatible_scope()
    assert seen_in_thread == [False]
    with pytest.raises(RuntimeError), tflite_compatible():
        raise RuntimeError("leaves the scope")
    assert not in_tflite_compatible_scope()


def test_fully_connected_traces_a_matmul_with_the_kernel_as_a_constant():
    pattern = SparsityPattern.random((8, 4), 0.5, seed=0)
    values = tf.Variable(np.arange(1, pattern.nnz + 1, dtype=np.float32))
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    product = tf.function(lambda x: sparse_matmul(x, values, pattern))
    with tflite_compatible(fully_connected=True):
        graph = product.get_concrete_function(x).graph
        y = product(x)
    kinds = {op.type for op in graph.get_operations()}
    assert "MatMul" in kinds and "GatherV2" not in kinds, kinds
    np.testing.assert_allclose(y.numpy(), x @ pattern.to_scipy(values.numpy()).toarray(),
                               rtol=1e-5, atol=1e-5)


def test_fully_connected_refuses_a_kernel_too_large_for_a_graph():
    pattern = SparsityPattern.random((32768, 16384), 1e-4, seed=0)
    with tflite_compatible(fully_connected=True), pytest.raises(ValueError) as error:
        sparse_matmul(np.ones((1, 32768), np.float32), np.ones(pattern.nnz, np.float32), pattern)
    assert str(error.value) == (
        'Received an invalid value for "fully_connected", expected False for a layer whose dense '
        "kernel (32768 x 16384 float32, 2.0 GiB) does not fit the 2 GiB a graph or a "
        "TFLite file holds. Received: fully_connected=True")


def test_fully_connected_must_be_a_bool():
    with pytest.raises(ValueError) as error, tflite_compatible(fully_connected="yes"):
        pass
    assert str(error.value) == (
        'Received an invalid value for "fully_connected", expected a bool. '
        "Received: fully_connected='yes'")
    with tflite_compatible(fully_connected=np.True_):  # NumPy's bool was refused
        pass
