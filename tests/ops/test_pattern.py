import re

import numpy as np
import pytest
import scipy.sparse

from tfsparse.ops import SparsityPattern


def test_from_scipy_keeps_nonzeros_in_column_major_order():
    dense = np.array([[0, 2, 0], [1, 0, 0], [0, 3, 4], [0, 0, 0]], np.float32)
    matrix = scipy.sparse.csr_matrix(dense)
    matrix.data[0] = 0  # an explicitly stored zero is not part of the pattern
    pattern, values = SparsityPattern.from_scipy(matrix)
    assert pattern.shape == (4, 3)
    assert pattern.rows.tolist() == [1, 2, 2]
    assert pattern.cols.tolist() == [0, 1, 2]
    assert values.tolist() == [1, 3, 4]
    expected = dense.copy()
    expected[0, 1] = 0
    np.testing.assert_array_equal(pattern.to_scipy(values).toarray(), expected)


def test_row_major_order_sorts_by_row_then_column():
    rng = np.random.default_rng(0)
    pattern, _ = SparsityPattern.from_scipy(
        scipy.sparse.random(30, 20, density=0.3, format="csr", rng=rng)
    )
    order = pattern.row_major_order
    keys = pattern.rows[order].astype(np.int64) * 20 + pattern.cols[order]
    assert np.all(np.diff(keys) > 0)


@pytest.mark.parametrize("shape,density", [((100, 7), 0.05), ((40, 30), 0.9), ((5, 3), 1.0)])
def test_random_pattern_has_equal_distinct_fan_in(shape, density):
    pattern = SparsityPattern.random(shape, density, seed=3)
    fan_in = max(1, round(density * shape[0]))
    counts = np.bincount(pattern.cols, minlength=shape[1])
    assert np.all(counts == fan_in)
    # distinct positions (the constructor also checks it)
    assert len(set(zip(pattern.rows.tolist(), pattern.cols.tolist()))) == pattern.nnz
    assert pattern == SparsityPattern.random(shape, density, seed=3)
    assert pattern != SparsityPattern.random(shape, density, seed=4) or density == 1.0


def test_random_pattern_of_a_huge_kernel_costs_memory_of_nnz_only():
    pattern = SparsityPattern.random((1 << 20, 64), 8 / (1 << 20), seed=0)
    assert pattern.nnz == 8 * 64


def test_invalid_patterns_are_rejected_with_the_argument_named():
    with pytest.raises(ValueError, match='"shape".*Received: shape=\\(0, 3\\)'):
        SparsityPattern([], [], (0, 3))
    with pytest.raises(ValueError, match='"rows", expected indices in \\[0, 2\\)'):
        SparsityPattern([0, 2], [0, 0], (2, 2))
    with pytest.raises(ValueError, match="sorted by column then row"):
        SparsityPattern([1, 0], [0, 0], (2, 2))
    with pytest.raises(ValueError, match='"matrix", expected a scipy.sparse matrix'):
        SparsityPattern.from_scipy(np.eye(2))


def test_from_coo_sorts():
    pattern = SparsityPattern.from_coo([1, 0, 2], [1, 1, 0], (3, 2))
    assert pattern.rows.tolist() == [2, 0, 1]
    assert pattern.cols.tolist() == [0, 1, 1]


@pytest.mark.parametrize("make, message", [
    # Each was accepted, truncated or wrapped before: rows [0, 2] from
    # [0.9, 2.99], -2**31 from NaN, (2, 3) from (2.7, 3) or "23".
    (lambda: SparsityPattern([0.9, 2.99], [0, 1], (3, 3)), '"rows", expected integer indices'),
    (lambda: SparsityPattern([np.nan, 1], [0, 0], (3, 3)), '"rows", expected integer indices'),
    (lambda: SparsityPattern([0], [0.5], (3, 3)), '"cols", expected integer indices'),
    (lambda: SparsityPattern([0], [0], (2.7, 3)), '"shape", expected (input_dim, units)'),
    (lambda: SparsityPattern([0], [0], "23"), '"shape", expected (input_dim, units)'),
    (lambda: SparsityPattern([0], [0], (True, True)), '"shape"'),
    (lambda: SparsityPattern([0], [0], None), '"shape"'),
    (lambda: SparsityPattern([0], [0], (2**32, 1)), "up to 2147483647"),
    (lambda: SparsityPattern.from_coo([0, 1], [0], (3, 3)), '"rows", expected 1-D index arrays'),
    # from_coo sorts; a repeat it cannot resolve is named, not blamed on the order.
    (lambda: SparsityPattern.from_coo([2, 0, 2], [1, 1, 1], (3, 3)),
     '"rows", expected unique (row, col) positions. Received: position (2, 1) more than once'),
    (lambda: SparsityPattern([1, 0], [0, 0], (3, 3)), "(use SparsityPattern.from_coo to sort). "
     "Received: unsorted positions"),
    (lambda: SparsityPattern.random((8, 4), 0), '"density", expected a float in (0, 1]'),
    (lambda: SparsityPattern.random((8, 4), 1.5), '"density"'),
    (lambda: SparsityPattern.random((8, 4), float("nan")), '"density"'),
    (lambda: SparsityPattern.random((8, 4), True), '"density"'),
    (lambda: SparsityPattern.random((0, 4), 0.5), '"shape"'),
    (lambda: SparsityPattern.random((8, 4), 0.5, seed=-1), '"seed", expected a non-negative'),
    (lambda: SparsityPattern([0], [0], (3, 3)).to_scipy([1.0, 2.0]), '"values", expected one value'),
])
def test_bad_arguments_are_named(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()
