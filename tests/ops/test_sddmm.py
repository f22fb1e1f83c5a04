import platform
import re

import numpy as np
import pytest
import tensorflow as tf

from tfsparse.ops import kernels
from tfsparse.ops import sddmm

from kernel_paths import PATHS, VARIANTS, variant_marks



def _case(dtype, seed=0, n_in=40, n_out=30, batch=17, nnz=200):
    rng = np.random.default_rng(seed)
    x_t = rng.standard_normal((n_in, batch)).astype(dtype)
    dy_t = rng.standard_normal((n_out, batch)).astype(dtype)
    rows = rng.integers(0, n_in, nnz).astype(np.int32)
    cols = rng.integers(0, n_out, nnz).astype(np.int32)
    expected = np.einsum("kb,kb->k", x_t[rows].astype(np.float64), dy_t[cols])
    return x_t, dy_t, rows, cols, expected


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# Batches below, at and past the vector widths (4 for the portable
# variant's SSE2, 8, 16) and the steps (8, 16, 32) of the float kernels,
# with their tails; the portable variant takes four nonzeros at a time from
# batch 16. 203 nonzeros leave a remainder after groups of four.
@pytest.mark.parametrize("batch, nnz", [(17, 200), (1, 203), (7, 203), (8, 203), (23, 203),
                                        (40, 203), (64, 200)])
def test_sddmm_matches_numpy(use_kernel, dtype, batch, nnz):
    x_t, dy_t, rows, cols, expected = _case(dtype, batch=batch, nnz=nnz)
    got = sddmm(x_t, dy_t, rows, cols, use_kernel=use_kernel).numpy()
    assert got.dtype == dtype
    # batch-term dot products summed in any order: |error| <= batch eps
    # sum|x dy| (plus the rounding of the result).
    eps = np.finfo(dtype).eps
    bound = (batch + 2) * eps * np.einsum("kb,kb->k", np.abs(x_t[rows]), np.abs(dy_t[cols]))
    assert np.all(np.abs(got - expected) <= bound)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# With and without whole 64 x 64 tiles and whole 4 x 4 and 8 x 8 blocks of
# the op's own transposes, in both operands; batch 300 splits them over the
# pool. x under 2 MiB: one slice, the same sums in the same order.
@pytest.mark.parametrize("batch, n_in, n_out", [(1, 40, 30), (7, 131, 70), (8, 64, 64),
                                                (17, 200, 129), (70, 300, 65), (300, 257, 190)])
def test_batch_major_inputs_give_the_same_sums_bit_for_bit(variant, dtype, batch, n_in, n_out):
    x_t, dy_t, rows, cols, expected = _case(dtype, n_in=n_in, n_out=n_out, batch=batch, nnz=203)
    assert x_t.nbytes <= 2**21
    transposed = kernels.sddmm(x_t, dy_t, rows, cols).numpy()
    batch_major = kernels.sddmm(np.ascontiguousarray(x_t.T), np.ascontiguousarray(dy_t.T),
                                rows, cols, batch_major=True).numpy()
    # The op transposes exactly, then sums in the same order.
    np.testing.assert_array_equal(batch_major, transposed)
    bound = (batch + 2) * np.finfo(dtype).eps * np.einsum(
        "kb,kb->k", np.abs(x_t[rows]), np.abs(dy_t[cols]))
    assert np.all(np.abs(batch_major - expected) <= bound)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# From batch 128, four float nonzeros of one column (a pattern sorted by
# column) share their loads of dy's row: their sums must not change. 150
# leaves a tail past the vector steps.
@pytest.mark.parametrize("batch", [128, 150])
def test_nonzeros_sharing_a_column_give_the_sums_they_give_apart(variant, dtype, batch):
    x_t, dy_t, _, _, _ = _case(dtype, n_in=300, n_out=40, batch=batch)
    rng = np.random.default_rng(1)
    cols = np.repeat(np.arange(40), rng.integers(1, 13, 40)).astype(np.int32)
    rows = rng.integers(0, 300, cols.size).astype(np.int32)
    groups = cols[: cols.size // 4 * 4].reshape(-1, 4)
    assert np.sum(np.all(groups == groups[:, :1], axis=1)) >= 10  # shared groups exist
    # dy's rows twice over: column c + 40 holds column c's values. Every
    # other nonzero names the copy, so no four neighbours share a column,
    # with the same products at the same positions.
    dy_twice = np.concatenate([dy_t, dy_t])
    apart = (cols + 40 * (np.arange(cols.size) % 2)).astype(np.int32)
    shared_sums = kernels.sddmm(x_t, dy_twice, rows, cols).numpy()
    np.testing.assert_array_equal(shared_sums, kernels.sddmm(x_t, dy_twice, rows, apart).numpy())
    expected = np.einsum("kb,kb->k", x_t[rows].astype(np.float64), dy_t[cols])
    bound = (batch + 2) * np.finfo(dtype).eps * np.einsum(
        "kb,kb->k", np.abs(x_t[rows]), np.abs(dy_t[cols]))
    assert np.all(np.abs(shared_sums - expected) <= bound)


# The portable variant's SSE2 sums: their order is emulated on x86-64 only.
SSE2_ONLY = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                               reason="SSE2 sums: x86-64 only")


def _products_in_vectors(a, b, width, steps):
    """The two chains of Dot4 (sddmm_variant.inc) of one float32 dot product.

    ``a``, ``b``: ``[nonzeros, 2 * width * steps]``. Step by step, vector 0
    of each step into one chain and vector 1 into the other; the first
    product of a chain is rounded once (a multiply-add onto zero), a later
    one rounded, then added (the portable variant's, which has no fused
    multiply-add; the others take one step here). Returns the chains' sum,
    ``[nonzeros, width]``.
    """
    chains = [None, None]
    for step in range(steps):
        for chain in range(2):
            part = slice((2 * step + chain) * width, (2 * step + chain + 1) * width)
            product = a[:, part] * b[:, part]  # float32: rounded
            chains[chain] = product if chains[chain] is None else chains[chain] + product
    return chains[0] + chains[1]


@pytest.mark.parametrize("variant, batch, nnz", [
    pytest.param("avx512", 32, 64, marks=variant_marks("avx512")),
    # Sixteen nonzeros at a time, two to a register (Dot16Batch8): 256
    # nonzeros run in ranges of 32 (sddmm.cc, Blocks::SizeFor).
    pytest.param("avx512", 8, 256, marks=variant_marks("avx512")),
    pytest.param("avx2", 16, 64, marks=variant_marks("avx2")),
    # Eight at a time on AVX2 (Dot8Batch8).
    pytest.param("avx2", 8, 256, marks=variant_marks("avx2")),
    pytest.param("portable", 16, 64, marks=[*variant_marks("portable"), SSE2_ONLY]),
    # Four at a time on the portable variant at batch 8 (Dot4Batch8Sse2),
    # each the sum of DotSse2's one chain.
    pytest.param("portable", 8, 256, marks=[*variant_marks("portable"), SSE2_ONLY]),
])
def test_four_nonzeros_at_a_time_add_their_lanes_in_the_variants_order(variant, batch, nnz):
    # Dot4 sums four nonzeros' vectors at once (Sum4 on AVX-512 and AVX2):
    # each sum must be, bit for bit, that of the variant's one-vector
    # reduction, emulated here in float32 NumPy. One step of two vectors
    # covers the batch (two steps of the portable variant's 4 lanes), so no
    # multiply-add chain is longer than one product (whose rounding is the
    # same fused or not), except the portable variant's second step, which
    # is a product then a sum there as here. 64 nonzeros: all in fours.
    # At batch 8 on AVX-512 half of Dot4's one vector is masked off (zeros),
    # so its reduction's first level only adds zeros.
    x_t, dy_t, rows, cols, _ = _case(np.float32, n_in=50, n_out=40, batch=batch, nnz=nnz)
    a, b = x_t[rows], dy_t[cols]
    if variant == "avx512" and batch == 8:
        v = a * b + np.float32(0)  # a multiply-add onto +0: -0 products give +0
        quarters = v[:, 4:] + v[:, :4]
        pairs = quarters[:, :2] + quarters[:, 2:]
    elif variant == "portable" and batch == 8:
        v = a[:, :4] * b[:, :4] + a[:, 4:] * b[:, 4:]
        pairs = v[:, :2] + v[:, 2:]
    elif variant == "avx2" and batch == 8:
        v = a * b + np.float32(0)
        halves = v[:, :4] + v[:, 4:]
        pairs = halves[:, :2] + halves[:, 2:]
    elif variant == "avx512":
        v = _products_in_vectors(a, b, 16, 1)
        halves = v[:, 8:] + v[:, :8]
        quarters = halves[:, 4:] + halves[:, :4]
        pairs = quarters[:, :2] + quarters[:, 2:]
    elif variant == "avx2":
        v = _products_in_vectors(a, b, 8, 1)
        halves = v[:, :4] + v[:, 4:]
        pairs = halves[:, :2] + halves[:, 2:]
    else:
        v = _products_in_vectors(a, b, 4, 2)
        pairs = v[:, :2] + v[:, 2:]
    expected = pairs[:, 0] + pairs[:, 1]
    np.testing.assert_array_equal(kernels.sddmm(x_t, dy_t, rows, cols).numpy(), expected)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# x over 2 MiB: summed in slices of the batch (of 64 float32 rows of 8192,
# 32 float64 ones; 150 rows make a short last slice), in another order.
def test_batch_major_inputs_over_two_mebibytes_are_summed_in_slices(variant, dtype):
    x_t, dy_t, rows, cols, expected = _case(dtype, n_in=8192, n_out=50, batch=150, nnz=2003)
    got = kernels.sddmm(np.ascontiguousarray(x_t.T), np.ascontiguousarray(dy_t.T),
                        rows, cols, batch_major=True).numpy()
    bound = (150 + 2) * np.finfo(dtype).eps * np.einsum(
        "kb,kb->k", np.abs(x_t[rows]), np.abs(dy_t[cols]))
    assert np.all(np.abs(got - expected) <= bound)
    # The slices' sums differ in order from one sum over the batch.
    assert not np.array_equal(got, kernels.sddmm(x_t, dy_t, rows, cols).numpy())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype, slice_rows", [(np.float32, 64), (np.float64, 32)])
@pytest.mark.parametrize("batch", [150, 200])
def test_slices_are_the_sums_of_each_slice_added_in_order(variant, dtype, slice_rows, batch):
    # Each slice is transposed into the same buffers just before its
    # products (sddmm.cc): the result must be, bit for bit, the products of
    # each slice alone (transposed inputs, one slice) added slice after
    # slice. 8192 inputs: slices of 64 float32 or 32 float64 rows, the last
    # one short (150 rows), or of 8 rows (200 rows: AVX-512's path for
    # slices of 8, adding onto the sums so far).
    x_t, dy_t, rows, cols, _ = _case(dtype, n_in=8192, n_out=50, batch=batch, nnz=2003)
    got = kernels.sddmm(np.ascontiguousarray(x_t.T), np.ascontiguousarray(dy_t.T),
                        rows, cols, batch_major=True).numpy()
    expected = None
    for first in range(0, batch, slice_rows):
        part = slice(first, first + slice_rows)
        sums = kernels.sddmm(np.ascontiguousarray(x_t[:, part]), np.ascontiguousarray(dy_t[:, part]),
                             rows, cols).numpy()
        expected = sums if expected is None else expected + sums
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_batch_of_one_gives_each_product_rounded_once(variant):
    # One row: each sum is one float32 product (sddmm_variant.inc: gathers
    # on AVX-512 and AVX2, 16 or 8 at a time; 203 nonzeros leave a tail).
    x_t, dy_t, rows, cols, _ = _case(np.float32, n_in=300, n_out=40, batch=1, nnz=203)
    np.testing.assert_array_equal(kernels.sddmm(x_t, dy_t, rows, cols).numpy(),
                                  x_t[rows, 0] * dy_t[cols, 0])
    # A last slice of one row adds its products onto the sums so far:
    # 40000 float32 inputs take slices of 16 rows (sddmm.cc, SliceRows),
    # so a batch of 17 ends with one.
    x_t, dy_t, rows, cols, _ = _case(np.float32, n_in=40000, n_out=40, batch=17, nnz=203)
    got = kernels.sddmm(np.ascontiguousarray(x_t.T), np.ascontiguousarray(dy_t.T),
                        rows, cols, batch_major=True).numpy()
    first = kernels.sddmm(np.ascontiguousarray(x_t[:, :16]), np.ascontiguousarray(dy_t[:, :16]),
                          rows, cols).numpy()
    np.testing.assert_array_equal(got, first + x_t[rows, 16] * dy_t[cols, 16])


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefetching_the_rows_of_a_large_x_leaves_the_sums_unchanged(variant):
    # The op prefetches the rows of x ahead of the products when x takes
    # more than half of the core's L2 (sddmm.cc; on AVX2 and the portable
    # variant): a choice of speed only. The same products over x's 9.4 MiB
    # (prefetched on any L2 under 18 MiB) and over a copy of just the 300
    # rows they read (175 KiB: not prefetched on any L2 of 350 KiB or
    # more), bit for bit. Sorted by column, so four nonzeros of a column
    # share dy's row (batch 150 >= 128) as well as not.
    rng = np.random.default_rng(5)
    n_in, batch = 16384, 150
    x_t = rng.standard_normal((n_in, batch)).astype(np.float32)
    dy_t = rng.standard_normal((40, batch)).astype(np.float32)
    used = np.sort(rng.choice(n_in, 300, replace=False))
    picks = rng.integers(0, used.size, 2003)
    cols = np.sort(rng.integers(0, 40, picks.size)).astype(np.int32)
    large = kernels.sddmm(x_t, dy_t, used[picks].astype(np.int32), cols).numpy()
    small = kernels.sddmm(x_t[used], dy_t, picks.astype(np.int32), cols).numpy()
    np.testing.assert_array_equal(large, small)


@pytest.mark.parametrize("variant", VARIANTS)
def test_batch_major_inputs_of_different_batches_are_rejected(variant):
    with pytest.raises(tf.errors.InvalidArgumentError, match="same batch \\(first\\) dimension"):
        kernels.sddmm(np.ones((3, 4), "float32"), np.ones((2, 5), "float32"),
                      np.zeros(1, "int32"), np.zeros(1, "int32"), batch_major=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_and_fallback_agree_inside_tf_function(variant):
    x_t, dy_t, rows, cols, _ = _case(np.float32, seed=3, batch=256, nnz=5000)
    kernel = tf.function(lambda *a: sddmm(*a, use_kernel=True))(x_t, dy_t, rows, cols)
    fallback = sddmm(x_t, dy_t, rows, cols, use_kernel=False)
    bound = 260 * np.finfo(np.float32).eps * np.einsum(
        "kb,kb->k", np.abs(x_t[rows]), np.abs(dy_t[cols]))
    assert np.all(np.abs(kernel.numpy() - fallback.numpy()) <= 2 * bound)


@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_rejects_indices_outside_the_kernel(variant):
    x_t, dy_t, rows, cols, _ = _case(np.float32)
    rows[3] = 40
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside the kernel"):
        sddmm(x_t, dy_t, rows, cols, use_kernel=True)


def test_empty_pattern_gives_empty_result():
    got = sddmm(np.ones((3, 2), "float32"), np.ones((2, 2), "float32"),
                np.zeros(0, "int32"), np.zeros(0, "int32"))
    assert got.shape == (0,)


X_T = np.arange(12, dtype=np.float32).reshape(4, 3)
DY_T = np.ones((2, 3), np.float32)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("x_t, dy_t, rows, cols, message", [
    # Each was broadcast or taken as another index on the TensorFlow path
    # (the GPU's and exported models' path): [21, 21, 21] for 1 row and 3
    # cols; int64 2**32 read row 0; 1.7 read row 1.
    (X_T, DY_T, [2], [0, 1, 1], '"rows", expected 1-D rows and cols of one length'),
    (X_T, DY_T[:, :1], [0], [0], '"dy_t", expected the batch of x_t (3)'),
    (X_T, DY_T, [[0], [1]], [[0], [1]], '"rows", expected 1-D rows and cols'),
    (X_T, DY_T.astype(np.float64), [0], [0], '"dy_t", expected a tensor of x_t\'s dtype'),
    (X_T, DY_T, np.array([2**32], np.int64), [0], '"rows", expected indices that fit in int32'),
    (X_T, DY_T, np.array([1.7]), [0], '"rows", expected integer indices'),
])
def test_mismatched_arguments_are_clear_errors(use_kernel, x_t, dy_t, rows, cols, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sddmm(x_t, dy_t, rows, cols, use_kernel=use_kernel)


@pytest.mark.parametrize("rows, cols", [([4], [0]), ([-1], [0]), ([0], [2])])
def test_out_of_range_indices_are_errors_on_the_tensorflow_path(rows, cols):
    # tf.gather gives zeros for them on a GPU; its CPU error named GatherV2.
    with pytest.raises(tf.errors.InvalidArgumentError, match="sddmm: every entry of"):
        sddmm(X_T, DY_T, rows, cols, use_kernel=False)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_index_tensors_of_any_integer_dtype_are_taken_and_checked(use_kernel):
    want = X_T[[1, 3]] @ DY_T[[0, 1]].T
    for dtype in (tf.int8, tf.uint8, tf.int16, tf.int64):
        got = sddmm(X_T, DY_T, tf.constant([1, 3], dtype), tf.constant([0, 1], dtype),
                    use_kernel=use_kernel)
        np.testing.assert_array_equal(got.numpy(), np.diag(want))
    with pytest.raises(tf.errors.InvalidArgumentError, match="sddmm: rows must fit in int32"):
        sddmm(X_T, DY_T, tf.constant([2**32], tf.int64), tf.constant([0], tf.int64),
              use_kernel=use_kernel)


def test_use_kernel_must_be_a_bool():
    with pytest.raises(ValueError, match='"use_kernel", expected a bool'):
        sddmm(np.ones((2, 3), "float32"), np.ones((2, 3), "float32"), [0], [1], use_kernel="yes")
