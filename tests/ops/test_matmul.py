"""sparse_matmul against a dense NumPy reference on the masked kernel."""

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse.ops import SparsityPattern
from tfsparse.ops import sparse_matmul


def _kernel(shape, density, seed, empty_row=None, empty_col=None):
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal(shape) * (rng.random(shape) < density)
    if empty_row is not None:
        dense[empty_row, :] = 0
    if empty_col is not None:
        dense[:, empty_col] = 0
    return scipy.sparse.csr_matrix(dense)


CASES = [
    # (input_dim, units), density, empty input row, empty output column
    ((13, 7), 0.3, None, None),
    ((7, 29), 0.4, 2, 5),
    ((64, 64), 0.05, 0, 63),
    ((1, 5), 1.0, None, None),
]


def _gradients(x, values, pattern, dy, use_function):
    def run(x, values):
        with tf.GradientTape() as tape:
            tape.watch([x, values])
            y = sparse_matmul(x, values, pattern)
            loss = tf.reduce_sum(y * dy)
        return (y,) + tuple(tape.gradient(loss, [x, values]))

    if use_function:
        run = tf.function(run)
    return [t.numpy() for t in run(tf.constant(x), tf.constant(values))]


@pytest.mark.parametrize("shape,density,empty_row,empty_col", CASES)
@pytest.mark.parametrize("use_function", [False, True])
def test_forward_and_gradients_match_masked_dense_reference(
    shape, density, empty_row, empty_col, use_function
):
    matrix = _kernel(shape, density, seed=1, empty_row=empty_row, empty_col=empty_col)
    pattern, values = SparsityPattern.from_scipy(matrix)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, shape[0]))
    dy = rng.standard_normal((9, shape[1]))
    y, dx, dvalues = _gradients(x, values, pattern, dy, use_function)

    kernel = matrix.toarray()
    # float64 throughout: sums of at most max(shape) * batch terms of size
    # O(10), so rounding stays below 1e-12.
    np.testing.assert_allclose(y, x @ kernel, atol=1e-12)
    np.testing.assert_allclose(dx, dy @ kernel.T, atol=1e-12)
    np.testing.assert_allclose(dvalues, (x.T @ dy)[pattern.rows, pattern.cols], atol=1e-12)


def test_float32_matches_float64_reference_within_rounding():
    matrix = _kernel((256, 128), 0.1, seed=4)
    pattern, values = SparsityPattern.from_scipy(matrix)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 256))
    dy = rng.standard_normal((32, 128))
    y, dx, dvalues = _gradients(
        x.astype(np.float32), values.astype(np.float32), pattern,
        dy.astype(np.float32), use_function=True,
    )
    kernel = matrix.toarray()
    # Each output is a sum of n products; float32 rounding is bounded by
    # n * eps * sum|a_i b_i|, checked entry by entry.
    eps = np.finfo(np.float32).eps
    for got, a, b, n in [
        (y, x, kernel, 256),
        (dx, dy, kernel.T, 128),
    ]:
        bound = (n + 2) * eps * (np.abs(a) @ np.abs(b))
        assert np.all(np.abs(got - a @ b) <= bound + 1e-30)
    full = x.T @ dy
    bound = 34 * eps * (np.abs(x.T) @ np.abs(dy))[pattern.rows, pattern.cols]
    assert np.all(np.abs(dvalues - full[pattern.rows, pattern.cols]) <= bound)


def test_output_has_the_batch_dimension_of_the_input_in_a_function():
    pattern = SparsityPattern.random((10, 4), 0.3, seed=0)
    values = np.ones(pattern.nnz, np.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 10], tf.float32)])
    def apply(x):
        return sparse_matmul(x, values, pattern)

    assert apply(np.ones((3, 10), np.float32)).shape == (3, 4)
