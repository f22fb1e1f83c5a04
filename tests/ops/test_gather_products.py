"""The gather-and-sum products (XLA and TFLite forms) against a NumPy reference."""

import numpy as np
import pytest
import scipy.sparse

from tfsparse.ops import SparsityPattern
from tfsparse.ops._gather_products import PaddedColumns
from tfsparse.ops._gather_products import padded_columns_product
from tfsparse.ops._gather_products import segment_sum_product


def _reference(x, values, rows, cols, units, bias=None):
    """Sums each nonzero's products into its unit, never touching a zero weight."""
    y = np.zeros((x.shape[0], units))
    for value, row, col in zip(values, rows, cols):
        y[:, col] += value * x[:, row].astype(np.float64)
    return y if bias is None else y + bias


def _pattern(kind):
    if kind == "equal fan-in":
        return SparsityPattern.random((12, 5), 0.25, seed=0)
    matrix = scipy.sparse.random(12, 5, density=0.3, format="csr", rng=1)
    if kind == "uneven fan-in, a unit without nonzeros":
        matrix = matrix.tolil()
        matrix[:, 3] = 0
    return SparsityPattern.from_scipy(scipy.sparse.csr_matrix(matrix))[0]


KINDS = ["equal fan-in", "uneven fan-in", "uneven fan-in, a unit without nonzeros"]


@pytest.mark.parametrize("kind", KINDS)
def test_padded_layout_places_every_nonzero_once_and_pads_with_the_zero_row(kind):
    pattern = _pattern(kind)
    layout = PaddedColumns(pattern.rows, pattern.cols, pattern.shape)
    counts = np.bincount(pattern.cols, minlength=5)
    assert layout.fan_in == counts.max()
    real = layout.value_index < pattern.nnz
    assert sorted(layout.value_index[real]) == list(range(pattern.nnz))
    np.testing.assert_array_equal(layout.input_rows[real], pattern.rows[layout.value_index[real]])
    # Slot s belongs to unit s // fan_in; padding slots read row input_dim.
    np.testing.assert_array_equal(real.reshape(5, -1).sum(axis=1), counts)
    assert np.all(layout.input_rows[~real] == 12)
    assert layout.padded == (kind != "equal fan-in")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("form", ["padded", "segment_sum"])
def test_products_match_the_reference(kind, use_bias, form):
    pattern = _pattern(kind)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 12)).astype(np.float32)
    values = rng.standard_normal(pattern.nnz).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32) if use_bias else None
    if form == "padded":
        y = padded_columns_product(
            x, values, PaddedColumns(pattern.rows, pattern.cols, pattern.shape), bias)
    else:
        y = segment_sum_product(x, values, pattern.rows, pattern.cols, 5, bias)
    # float32 sums of at most 12 products of O(1) terms: error <= 12 * 2^-24 * O(10).
    np.testing.assert_allclose(
        y.numpy(), _reference(x, values, pattern.rows, pattern.cols, 5, bias),
        rtol=1e-5, atol=1e-5)


def test_padding_never_multiplies_an_input_by_zero():
    # Unit 1 reads input 0 only; inputs 1 and 2, which it does not read, are
    # inf and nan. A padding slot multiplying one of them by a zero weight
    # would turn unit 1's output into nan.
    layout = PaddedColumns([1, 2, 0], [0, 0, 1], (3, 2))
    assert layout.padded
    x = np.array([[2.0, np.inf, np.nan]], np.float32)
    y = padded_columns_product(x, np.array([1.0, 1.0, 3.0], np.float32), layout).numpy()
    assert np.isnan(y[0, 0])
    assert y[0, 1] == 6.0


def test_padded_layout_takes_nonzeros_in_any_order():
    pattern = _pattern("uneven fan-in")
    order = np.random.default_rng(3).permutation(pattern.nnz)
    rows, cols = pattern.rows[order], pattern.cols[order]
    x = np.random.default_rng(4).standard_normal((3, 12)).astype(np.float32)
    values = np.arange(1, pattern.nnz + 1, dtype=np.float32)
    y = padded_columns_product(x, values, PaddedColumns(rows, cols, pattern.shape))
    np.testing.assert_allclose(y.numpy(), _reference(x, values, rows, cols, 5),
                               rtol=1e-5, atol=1e-4)  # products of O(30) terms
