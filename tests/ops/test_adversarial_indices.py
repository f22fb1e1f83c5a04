"""The compiled ops on random indices, many of them broken on purpose.

Each case either breaks the op's contract (an index out of range, negative
or huge; segments out of order; an `order` entry outside the nonzeros) and
must raise InvalidArgumentError, or keeps it and must match NumPy. A
broken index that an op read or wrote through would crash the process
(as a first segment entry of 2**30 did, writing past the column pointers)
or give numbers NumPy does not.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse.ops import kernels

from kernel_paths import VARIANTS

CASES = 150
HUGE = [-1, -(2**31), 2**31 - 1, 2**30, 2**20]


def _break(indices, limit, rng):
    """``indices`` with one entry (first, last or any) made huge, negative,
    ``limit``, random, or swapped with its neighbour; unchanged if empty."""
    indices = indices.copy()
    if indices.size == 0:
        return indices
    at = [0, indices.size - 1, int(rng.integers(indices.size))][rng.integers(3)]
    kind = rng.integers(4)
    if kind == 0:
        indices[at] = rng.choice(HUGE)
    elif kind == 1:
        indices[at] = limit
    elif kind == 2:
        after = (at + 1) % indices.size
        indices[[at, after]] = indices[[after, at]]
    else:
        indices[at] = rng.integers(-3, limit + 3)
    return indices


def _break_one_of(rng, *arrays, chance=0.7):
    """The ``(indices, limit)`` pairs' indices, one of them (at random) broken
    by ``_break`` with probability ``chance``."""
    broken = rng.integers(len(arrays)) if rng.random() < chance else None
    return [_break(a, limit, rng) if i == broken else a for i, (a, limit) in enumerate(arrays)]


def _in_range(indices, limit):
    return indices.size == 0 or (indices.min() >= 0 and indices.max() < limit)


def _layer(rng):
    """A random small layer: x, values, sorted seg and idx, and its sizes."""
    batch = int(rng.choice([0, 1, 2, 3, 5, 8, 16, 17, 33]))
    n_in, units, nnz = int(rng.integers(1, 70)), int(rng.integers(1, 70)), int(rng.integers(0, 200))
    seg = np.sort(rng.integers(0, units, nnz)).astype(np.int32)
    idx = rng.integers(0, n_in, nnz).astype(np.int32)
    values = rng.standard_normal(nnz).astype(np.float32)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    return x, values, idx, seg, units


def _check(run, valid, reference):
    """``run()`` raises InvalidArgumentError exactly when not ``valid``; else
    it matches ``reference()``'s ``(expected, sum of |products|, terms)``
    within float32 summation's error bound."""
    if not valid:
        with pytest.raises(tf.errors.InvalidArgumentError):
            run()
        return
    got = run()
    expected, magnitude, terms = reference()
    # Sums of at most `terms` float32 products, in any order: |error| <=
    # (terms + 2) eps sum|products|.
    assert np.all(np.abs(got - expected) <= (terms + 2) * np.finfo(np.float32).eps * magnitude)


def _keeps_spmm_contract(x, idx, seg, units):
    return bool(np.all(np.diff(seg) >= 0) and _in_range(seg, units)
                and _in_range(idx, x.shape[1]))


def _spmm_reference(x, values, idx, seg, units):
    expected = np.zeros((x.shape[0], units))
    magnitude = np.zeros_like(expected)
    products = x[:, idx].astype(np.float64) * values
    np.add.at(expected.T, seg, products.T)
    np.add.at(magnitude.T, seg, np.abs(products).T)
    return expected, magnitude, values.size


@pytest.mark.parametrize("variant", VARIANTS)
def test_spmm_rejects_broken_segments_and_indices_or_matches_numpy(variant):
    rng = np.random.default_rng(1)
    for _ in range(CASES):
        x, values, idx, seg, units = _layer(rng)
        seg, idx = _break_one_of(rng, (seg, units), (idx, x.shape[1]))
        _check(lambda: kernels.spmm(x, values, idx, seg, units).numpy(),
               _keeps_spmm_contract(x, idx, seg, units),
               lambda: _spmm_reference(x, values, idx, seg, units))


@pytest.mark.parametrize("variant", VARIANTS)
def test_spmm_in_an_order_rejects_broken_orders_and_indices_or_matches_numpy(variant):
    # The nonzeros stored shuffled, `order` taking them back to sorted seg
    # (the input gradient's row-major order); then one of order, idx or seg
    # broken.
    rng = np.random.default_rng(2)
    for _ in range(CASES):
        x, values, idx, seg, units = _layer(rng)
        shuffle = rng.permutation(values.size)
        order = np.argsort(shuffle).astype(np.int32)
        values, idx, seg = values[shuffle], idx[shuffle], seg[shuffle]
        order, idx, seg = _break_one_of(rng, (order, values.size), (idx, x.shape[1]),
                                        (seg, units), chance=0.75)
        valid = _in_range(order, values.size) and _keeps_spmm_contract(
            x, idx[order], seg[order], units)
        _check(lambda: kernels.spmm(x, values, idx, seg, units, order=order).numpy(), valid,
               lambda: _spmm_reference(x, values[order], idx[order], seg[order], units))


@pytest.mark.parametrize("variant", VARIANTS)
def test_sddmm_rejects_broken_rows_and_columns_or_matches_numpy(variant):
    rng = np.random.default_rng(3)
    for _ in range(CASES):
        x, _, rows, _, units = _layer(rng)
        cols = rng.integers(0, units, rows.size).astype(np.int32)
        dy = rng.standard_normal((x.shape[0], units)).astype(np.float32)
        rows, cols = _break_one_of(rng, (rows, x.shape[1]), (cols, units))
        batch_major = rng.random() < 0.5

        def run():
            if batch_major:
                return kernels.sddmm(x, dy, rows, cols, batch_major=True).numpy()
            return kernels.sddmm(x.T.copy(), dy.T.copy(), rows, cols).numpy()

        def reference():
            products = x[:, rows].astype(np.float64) * dy[:, cols]
            return products.sum(0), np.abs(products).sum(0), x.shape[0]

        _check(run, _in_range(rows, x.shape[1]) and _in_range(cols, units), reference)
