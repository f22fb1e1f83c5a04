"""sparse_matmul against a dense NumPy reference on the masked kernel."""

import collections

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse.ops import SparsityPattern
from tfsparse.ops import kernels
from tfsparse.ops import sparse_matmul

from kernel_paths import PATHS, VARIANTS

# Every test runs on every path: each variant of tfsparse's compiled kernels
# and TensorFlow's own CSR ops (the GPU and SavedModel path, and the fallback).


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


def _gradients(x, values, pattern, dy, use_function, use_kernel):
    def run(x, values):
        with tf.GradientTape() as tape:
            tape.watch([x, values])
            y = sparse_matmul(x, values, pattern, use_kernel=use_kernel)
            loss = tf.reduce_sum(y * dy)
        return (y,) + tuple(tape.gradient(loss, [x, values]))

    if use_function:
        run = tf.function(run)
    return [t.numpy() for t in run(tf.constant(x), tf.constant(values))]


@pytest.mark.parametrize("shape,density,empty_row,empty_col", CASES)
@pytest.mark.parametrize("use_function", [False, True])
@pytest.mark.parametrize("use_kernel", PATHS)
def test_forward_and_gradients_match_masked_dense_reference(
    shape, density, empty_row, empty_col, use_function, use_kernel
):
    matrix = _kernel(shape, density, seed=1, empty_row=empty_row, empty_col=empty_col)
    pattern, values = SparsityPattern.from_scipy(matrix)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, shape[0]))
    dy = rng.standard_normal((9, shape[1]))
    y, dx, dvalues = _gradients(x, values, pattern, dy, use_function, use_kernel)

    kernel = matrix.toarray()
    # float64 throughout: sums of at most max(shape) * batch terms of size
    # O(10), so rounding stays below 1e-12.
    np.testing.assert_allclose(y, x @ kernel, atol=1e-12)
    np.testing.assert_allclose(dx, dy @ kernel.T, atol=1e-12)
    np.testing.assert_allclose(dvalues, (x.T @ dy)[pattern.rows, pattern.cols], atol=1e-12)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize(
    "batch,input_dim,units",
    [
        (32, 256, 128),  # a whole 32-row panel (16-row: portable), 16-column tiles
        (37, 45, 29),  # a partial panel, inputs and columns past the last 16
        (31, 45, 29),  # the largest batch of 16-row panels on AVX2 and AVX-512
        (96, 45, 29),  # three whole 32-row panels
        (5, 40, 20),  # fewer rows than one 16-row panel (the portable loop)
        (16, 16, 16),
        (48, 13, 21),  # whole panels; inputs fewer than one 16-wide transpose
        (33, 24, 40),  # 8-wide (AVX2) and 16-wide (AVX-512) transposes plus a tail
        (1, 300, 70),  # one row: no panel, nonzeros read straight from x
        (2, 61, 33),
        (3, 300, 70),  # the largest batch without a panel
        (4, 61, 33),  # the smallest batch with a panel
        (8, 300, 70),  # one whole 8-row panel (8x8 transposes on AVX2/AVX-512)
        (12, 61, 33),  # two 8-row panels, the second partial
        (64, 300, 70),  # several 16-row panels, on the calling thread
        # Over 2**21 multiply-adds, on the thread pool: few panels split over
        # column ranges, and many panels of a unit each.
        (40, 1024, 1536),
        (160, 1024, 512),
        (8, 2048, 1536),  # one 8-row panel split over column ranges
    ],
)
def test_float32_matches_float64_reference_within_rounding(use_kernel, batch, input_dim, units):
    matrix = _kernel((input_dim, units), 0.1, seed=4)
    pattern, values = SparsityPattern.from_scipy(matrix)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((batch, input_dim))
    dy = rng.standard_normal((batch, units))
    y, dx, dvalues = _gradients(
        x.astype(np.float32), values.astype(np.float32), pattern,
        dy.astype(np.float32), use_function=True, use_kernel=use_kernel,
    )
    kernel = matrix.toarray()
    # Each output is a sum of n products; float32 rounding is bounded by
    # n * eps * sum|a_i b_i|, checked entry by entry.
    eps = np.finfo(np.float32).eps
    for got, a, b, n in [
        (y, x, kernel, input_dim),
        (dx, dy, kernel.T, units),
    ]:
        bound = (n + 2) * eps * (np.abs(a) @ np.abs(b))
        assert np.all(np.abs(got - a @ b) <= bound + 1e-30)
    full = x.T @ dy
    bound = (batch + 2) * eps * (np.abs(x.T) @ np.abs(dy))[pattern.rows, pattern.cols]
    assert np.all(np.abs(dvalues - full[pattern.rows, pattern.cols]) <= bound)


@pytest.mark.parametrize("variant", VARIANTS)
# Float batches of 32 rows or more take 32-row panels on AVX2 and AVX-512
# while a panel (input_dim x 32 floats) takes at most a quarter of the
# core's L2, else 16-row ones (spmm_variant.inc, cache_size.h): 300 inputs
# take 32-row panels on a CPU with 150 KiB of L2 or more, 9000 inputs 16-row
# ones on a CPU with under 4.3 MiB. Whichever it picks, the sums are
# those of 16-row panels (batches of 16), bit for bit: the CPU's cache may
# change the speed, not the result.
@pytest.mark.parametrize("input_dim", [300, 9000])
def test_panel_rows_picked_from_the_cache_size_leave_the_sums_unchanged(variant, input_dim):
    matrix = _kernel((input_dim, 70), 0.05, seed=10)
    pattern, values = SparsityPattern.from_scipy(matrix)
    values = values.astype(np.float32)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, input_dim)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)

    def product(rows):
        return sparse_matmul(rows, values, pattern, use_kernel=True, bias=bias).numpy()

    whole = product(x)
    np.testing.assert_array_equal(whole, np.concatenate([product(x[b:b + 16]) for b in range(0, 64, 16)]))
    # And right: float32 sums of the bias and at most input_dim terms.
    kernel = matrix.toarray()
    bound = (input_dim + 3) * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(kernel) + np.abs(bias))
    assert np.all(np.abs(whole - (x.astype(np.float64) @ kernel + bias)) <= bound)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_a_large_kernel_runs_on_the_thread_pool(use_kernel, batch):
    # Over 2**21 multiply-adds: the product is split over the pool instead of
    # running on the calling thread (spmm_variant.inc), for the batches
    # without a panel (1-3 rows) and with one.
    matrix = _kernel((2048, 1536), 0.7, seed=8)
    pattern, values = SparsityPattern.from_scipy(matrix)
    assert pattern.nnz > 2**21
    rng = np.random.default_rng(9)
    x, dy = rng.standard_normal((batch, 2048)), rng.standard_normal((batch, 1536))
    y, dx, dvalues = _gradients(x, values, pattern, dy, use_function=True, use_kernel=use_kernel)
    kernel = matrix.toarray()
    # float64: sums of at most 2048 terms of size ~1, far below 1e-10.
    np.testing.assert_allclose(y, x @ kernel, atol=1e-10)
    np.testing.assert_allclose(dx, dy @ kernel.T, atol=1e-10)
    np.testing.assert_allclose(dvalues, (x.T @ dy)[pattern.rows, pattern.cols], atol=1e-10)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("batch", [1, 3, 8, 19])
def test_any_batch_size_through_one_traced_function(use_kernel, batch):
    # 19 rows = two full panels of 8 and a partial one in the compiled kernel.
    pattern, values = SparsityPattern.from_scipy(_kernel((10, 4), 0.5, seed=6))
    x = np.random.default_rng(7).standard_normal((batch, 10))

    @tf.function(input_signature=[tf.TensorSpec([None, 10], tf.float64)])
    def apply(x):
        return sparse_matmul(x, values, pattern, use_kernel=use_kernel)

    np.testing.assert_allclose(apply(x).numpy(), x @ pattern.to_scipy(values).toarray(), atol=1e-12)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("batch", [1, 8])
def test_eager_call_without_a_tape_matches_the_reference(use_kernel, use_bias, batch):
    # No tape watches the inputs: the product runs without tf.custom_gradient.
    matrix = _kernel((40, 24), 0.3, seed=10)
    pattern, values = SparsityPattern.from_scipy(matrix)
    rng = np.random.default_rng(11)
    x, bias = rng.standard_normal((batch, 40)), rng.standard_normal(24)
    y = sparse_matmul(x, values, pattern, use_kernel=use_kernel, bias=bias if use_bias else None)
    # float64: sums of at most 40 terms of size ~1, far below 1e-12.
    np.testing.assert_allclose(y.numpy(), x @ matrix.toarray() + use_bias * bias, atol=1e-12)
    assert y.shape == (batch, 24)


def test_a_tape_watching_only_the_input_still_gets_its_gradient():
    # The tape watches x alone (not the values): the product must still be
    # recorded with its gradient.
    matrix = _kernel((6, 5), 0.5, seed=12)
    pattern, values = SparsityPattern.from_scipy(matrix)
    x = tf.ones([3, 6], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(sparse_matmul(x, values, pattern, bias=np.zeros(5)))
    dx = tape.gradient(loss, x).numpy()
    np.testing.assert_allclose(dx, np.ones((3, 5)) @ matrix.toarray().T, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_kernel_rejects_a_malformed_pattern(variant):
    x, values = np.ones((2, 3), np.float32), np.ones(2, np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        kernels.spmm(x, values, np.array([0, 3], np.int32), np.array([0, 1], np.int32), 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted and in"):
        kernels.spmm(x, values, np.array([0, 1], np.int32), np.array([1, 0], np.int32), 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted and in"):
        kernels.spmm(x, values, np.array([0, 1], np.int32), np.array([0, 2], np.int32), 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="differ in length"):
        kernels.spmm(x, values, np.array([0, 1], np.int32), np.array([0], np.int32), 2)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("use_function", [False, True])
def test_a_duck_typed_pattern_out_of_order_is_an_error_on_every_path(use_kernel, use_function):
    # A pattern object that is not a SparsityPattern, its nonzeros in SciPy's
    # row-major (CSR) order: TensorFlow's CSR conversion assumed column order
    # without checking it and returned a wrong product (error up to 2.0).
    Pattern = collections.namedtuple("Pattern", "rows cols row_major_order shape")
    coo = scipy.sparse.random(5, 4, density=0.5, format="csr", rng=1).tocoo()
    assert np.any(np.diff(coo.col) < 0)
    rows, cols = coo.row.astype(np.int32), coo.col.astype(np.int32)
    pattern = Pattern(rows, cols, np.arange(coo.nnz, dtype=np.int32), coo.shape)
    x, values = np.ones((2, 5), np.float32), coo.data.astype(np.float32)
    product = lambda x: sparse_matmul(x, values, pattern, use_kernel=use_kernel)  # noqa: E731
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted"):
        (tf.function(product) if use_function else product)(x)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_a_wrong_row_major_order_is_an_error_in_the_input_gradient(use_kernel):
    # Column order is right, so the product runs; row_major_order (which sorts
    # the nonzeros by row for dx) is the identity, which does not.
    Pattern = collections.namedtuple("Pattern", "rows cols row_major_order shape")
    good, _ = SparsityPattern.from_scipy(_kernel((6, 4), 0.6, seed=3))
    assert np.any(np.diff(good.rows) < 0)  # the identity does not sort them by row
    pattern = Pattern(good.rows, good.cols, np.arange(good.nnz, dtype=np.int32), good.shape)
    x = tf.ones((2, 6))
    values = tf.ones(good.nnz)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = sparse_matmul(x, values, pattern, use_kernel=use_kernel)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted"):
        tape.gradient(y, x)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("batch", [5, 37])  # below and above one 16-row panel
def test_bias_is_added_and_gets_the_summed_output_gradient(use_kernel, batch):
    matrix = _kernel((45, 29), 0.2, seed=8, empty_col=3)
    pattern, values = SparsityPattern.from_scipy(matrix)
    rng = np.random.default_rng(9)
    x, dy, bias = rng.standard_normal((batch, 45)), rng.standard_normal((batch, 29)), rng.standard_normal(29)

    @tf.function
    def run(x, values, bias):
        with tf.GradientTape() as tape:
            tape.watch([x, values, bias])
            y = sparse_matmul(x, values, pattern, use_kernel=use_kernel, bias=bias)
            loss = tf.reduce_sum(y * dy)
        return (y,) + tuple(tape.gradient(loss, [x, values, bias]))

    y, dx, dvalues, dbias = [t.numpy() for t in run(tf.constant(x), tf.constant(values), tf.constant(bias))]
    kernel = matrix.toarray()
    # float64: sums of at most 45 terms of size O(10), rounding below 1e-12.
    np.testing.assert_allclose(y, x @ kernel + bias, atol=1e-12)
    np.testing.assert_allclose(dx, dy @ kernel.T, atol=1e-12)
    np.testing.assert_allclose(dvalues, (x.T @ dy)[pattern.rows, pattern.cols], atol=1e-12)
    np.testing.assert_allclose(dbias, dy.sum(axis=0), atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_kernel_rejects_a_bias_of_the_wrong_length(variant):
    with pytest.raises(tf.errors.InvalidArgumentError, match="bias must be empty or of length 2"):
        kernels.spmm(np.ones((2, 3), np.float32), np.ones(2, np.float32),
                     np.array([0, 1], np.int32), np.array([0, 1], np.int32), 2,
                     bias=np.ones(3, np.float32))


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_kernel_builds_column_pointers_over_runs_and_gaps(variant):
    # Long enough for the 16-wide neighbour comparison: columns with runs of
    # up to 40 nonzeros, gaps of empty columns at the start, inside, at the end.
    rng = np.random.default_rng(10)
    units, n_in = 300, 50
    counts = rng.integers(0, 41, units) * (rng.random(units) < 0.6)
    counts[:7] = 0
    counts[-9:] = 0
    seg = np.repeat(np.arange(units), counts).astype(np.int32)
    idx = rng.integers(0, n_in, seg.size).astype(np.int32)
    values = rng.standard_normal(seg.size).astype(np.float32)
    x = rng.standard_normal((20, n_in)).astype(np.float32)
    kernel = np.zeros((n_in, units))
    np.add.at(kernel, (idx, seg), values)
    # float32 sums of at most 40 products of O(1) terms: well within 1e-4.
    np.testing.assert_allclose(kernels.spmm(x, values, idx, seg, units).numpy(), x @ kernel,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("position", [0, 5, 21, 38])  # 0: the first entry past units
def test_compiled_kernel_rejects_a_long_unsorted_segment_list(variant, position):
    seg = np.arange(40, dtype=np.int32)
    idx = np.zeros(40, np.int32)
    x, values = np.ones((2, 3), np.float32), np.ones(40, np.float32)
    descending = seg.copy()
    descending[position], descending[position + 1] = seg[position + 1], seg[position]
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted and in"):
        kernels.spmm(x, values, idx, descending, 40)
    huge = seg.copy()
    huge[position] = 2**30  # out of range, first or inside: rejected, nothing written past ptr
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted and in"):
        kernels.spmm(x, values, idx, huge, 40)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("position", [0, 13, 38, 67, 70])  # in 16-index blocks and the tail
@pytest.mark.parametrize("bad", [9, 2**31 - 1, -1, -2**31])
def test_compiled_kernel_names_the_first_index_outside_the_input(variant, position, bad):
    # 71 indices: four blocks of 16 and a tail of 7 for the vectorized
    # check of every variant. A valid array whose largest index (8) sits at
    # `position` passes; the same with `bad` there names it.
    rng = np.random.default_rng(position)
    idx = rng.integers(0, 8, 71).astype(np.int32)
    idx[position] = 8
    seg = np.repeat(np.arange(10), [7] * 9 + [8]).astype(np.int32)
    x = rng.standard_normal((3, 9)).astype(np.float32)
    values = rng.standard_normal(71).astype(np.float32)
    kernel = np.zeros((9, 10))
    np.add.at(kernel, (idx, seg), values)
    # float32 sums of at most 8 products of O(1) terms: well within 1e-5.
    np.testing.assert_allclose(kernels.spmm(x, values, idx, seg, 10).numpy(), x @ kernel,
                               rtol=1e-5, atol=1e-5)
    idx[position] = bad
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"idx\[{position}\]={bad} is outside \[0, 9\)"):
        kernels.spmm(x, values, idx, seg, 10)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_kernel_takes_the_nonzeros_in_a_given_order(variant, dtype):
    # The input gradient dy @ W^T from W's column-major pattern and its
    # row-major order, permuted inside the op: the same sums as the
    # pre-gathered call (bit for bit), and dy @ W^T.
    matrix = _kernel((45, 29), 0.2, seed=13, empty_row=4, empty_col=3)
    pattern, values = SparsityPattern.from_scipy(matrix)
    values = values.astype(dtype)
    dy = np.random.default_rng(14).standard_normal((19, 29)).astype(dtype)
    order = pattern.row_major_order
    in_order = kernels.spmm(dy, values, pattern.cols, pattern.rows, 45, order=order).numpy()
    gathered = kernels.spmm(dy, values[order], pattern.cols[order], pattern.rows[order],
                            45).numpy()
    np.testing.assert_array_equal(in_order, gathered)
    # Sums of at most 29 products of O(1) terms: within 1e-4 in float32.
    np.testing.assert_allclose(in_order, dy @ matrix.toarray().T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_kernel_rejects_a_malformed_order(variant):
    x, values = np.ones((2, 3), np.float32), np.ones(3, np.float32)
    idx = np.array([0, 1, 2], np.int32)
    seg = np.array([0, 0, 1], np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="order must be empty or of length"):
        kernels.spmm(x, values, idx, seg, 2, order=np.array([0, 1], np.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"order\[1\]=3 is outside"):
        kernels.spmm(x, values, idx, seg, 2, order=np.array([0, 3, 1], np.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"order\[0\]=-1 is outside"):
        kernels.spmm(x, values, idx, seg, 2, order=np.array([-1, 0, 1], np.int32))
    # An order that does not sort seg.
    with pytest.raises(tf.errors.InvalidArgumentError, match="taken in `order`.*sorted"):
        kernels.spmm(x, values, idx, seg, 2, order=np.array([2, 0, 1], np.int32))


def _input_gradient_reference(dy, values, rows, cols, input_dim):
    """dy @ W^T in float64, W (input_dim x dy's width) with values at (rows, cols)."""
    kernel = np.zeros((input_dim, dy.shape[1]))
    np.add.at(kernel, (rows, cols), values)
    return dy @ kernel.T


@pytest.mark.parametrize("variant", VARIANTS)
def test_kept_permuted_pattern_follows_every_change_of_the_pattern(variant):
    # The op keeps W's pattern taken in `order` while (order, idx, seg) stay
    # the same (ordered_pattern.h). One tf.function, so one kernel, reads the
    # pattern from variables: new values, a moved pattern (as RigL writes
    # it) and one index changed past the first entries the op compares
    # cheaply must each show in the result; a malformed order after a good
    # one is rejected, not served from the kept pattern.
    input_dim, units = 300, 200
    first = SparsityPattern.random((input_dim, units), 0.05, seed=21)
    moved = SparsityPattern.random((input_dim, units), 0.05, seed=22)
    assert first.nnz == moved.nnz > 64
    rng = np.random.default_rng(23)
    dy = rng.standard_normal((9, units)).astype(np.float32)
    v = rng.standard_normal(first.nnz).astype(np.float32)
    rows, cols = tf.Variable(first.rows), tf.Variable(first.cols)
    order, values = tf.Variable(first.row_major_order), tf.Variable(v)

    @tf.function
    def input_gradient(dy):
        return kernels.spmm(dy, values, cols, rows, input_dim, order=order)

    def check():
        expected = _input_gradient_reference(dy, values.numpy(), rows.numpy(), cols.numpy(),
                                             input_dim)
        # float32 sums of at most ~30 products of O(1) terms.
        np.testing.assert_allclose(input_gradient(dy).numpy(), expected, rtol=1e-4, atol=1e-4)

    check()
    check()  # the kept pattern
    values.assign(2 * v - 1)
    check()
    rows.assign(moved.rows)
    cols.assign(moved.cols)
    order.assign(moved.row_major_order)
    check()
    for k in (moved.nnz - 1, 0):  # one nonzero moved to another output column
        changed = cols.numpy()
        changed[k] = (changed[k] + 1) % units
        cols.assign(changed)
        check()
    bad = order.numpy()
    bad[-1] = moved.nnz
    order.assign(bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"order\[{moved.nnz - 1}\]="):
        input_gradient(dy)


@pytest.mark.parametrize("variant", VARIANTS)
def test_kept_permuted_patterns_of_eager_calls(variant):
    # Eager calls share one kernel among the calls with equal attributes:
    # three patterns taken in turns are each multiplied correctly, and the
    # kept pattern's indices are checked again against a narrower dy.
    input_dim, units = 120, 90
    rng = np.random.default_rng(31)
    dy = rng.standard_normal((5, units)).astype(np.float32)
    patterns = [SparsityPattern.random((input_dim, units), 0.1, seed=s) for s in (1, 2, 3)]
    values = [rng.standard_normal(p.nnz).astype(np.float32) for p in patterns]
    for _ in range(2):
        for pattern, v in zip(patterns, values):
            got = kernels.spmm(dy, v, pattern.cols, pattern.rows, input_dim,
                               order=pattern.row_major_order)
            expected = _input_gradient_reference(dy, v, pattern.rows, pattern.cols, input_dim)
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4)
    pattern = patterns[0]
    narrow = dy[:, : int(pattern.cols.max())]  # misses the largest column index
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"idx \(taken in `order`\)"):
        kernels.spmm(narrow, values[0], pattern.cols, pattern.rows, input_dim,
                     order=pattern.row_major_order)


def test_a_bias_in_use_kernels_place_is_refused():
    # sparse_matmul(x, values, pattern, bias) took the bias as use_kernel:
    # with one unit it was truthy and dropped (4 for 104), silently.
    pattern = SparsityPattern.from_coo([0, 1], [0, 0], (2, 1))
    x, values = np.ones((2, 2), "float32"), np.full(2, 2.0, "float32")
    with pytest.raises(ValueError, match='"use_kernel", expected a bool'):
        sparse_matmul(x, values, pattern, np.array([100.0], "float32"))
    got = sparse_matmul(x, values, pattern, bias=np.array([100.0], "float32"))
    np.testing.assert_array_equal(got.numpy(), [[104.0], [104.0]])
    assert sparse_matmul(x, values, pattern, np.True_).shape == (2, 1)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("width", [9, 6])
def test_an_input_of_another_width_is_an_error_naming_x(use_kernel, width):
    # A wider x was multiplied by its first input_dim columns, silently.
    pattern, values = SparsityPattern.from_scipy(_kernel((7, 5), 0.5, seed=3))
    values = values.astype(np.float32)
    with pytest.raises(ValueError, match=r'"x", expected \[batch, 7\].*x of shape \(3, %d\)' % width):
        sparse_matmul(np.ones((3, width), np.float32), values, pattern, use_kernel=use_kernel)
    with pytest.raises(ValueError, match=r'"x", expected a 2-D tensor'):
        sparse_matmul(np.ones(7, np.float32), values, pattern, use_kernel=use_kernel)
    with pytest.raises(ValueError, match=r'"values", expected a 1-D tensor'):
        sparse_matmul(np.ones((3, 7), np.float32), values[None], pattern, use_kernel=use_kernel)
    # A width known only when the function runs: checked then.
    product = tf.function(lambda x: sparse_matmul(x, values, pattern, use_kernel=use_kernel),
                          input_signature=[tf.TensorSpec([None, None], tf.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="x must have input_dim=7 columns"):
        product(tf.ones((3, width)))
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    np.testing.assert_allclose(product(x), x @ pattern.to_scipy(values).toarray(), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_a_pattern_of_int64_tensors_gives_the_int32_product(use_kernel):
    Pattern = collections.namedtuple("Pattern", "rows cols row_major_order shape")
    pattern, values = SparsityPattern.from_scipy(_kernel((7, 5), 0.5, seed=3))
    values = values.astype(np.float32)
    wide = Pattern(*(tf.constant(a, tf.int64) for a in
                     (pattern.rows, pattern.cols, pattern.row_major_order)), pattern.shape)
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    with tf.GradientTape() as tape:
        values_variable = tf.Variable(values)
        y = sparse_matmul(x, values_variable, wide, use_kernel=use_kernel)
    np.testing.assert_array_equal(y, sparse_matmul(x, values, pattern, use_kernel=use_kernel))
    assert tape.gradient(y, values_variable) is not None
    # An index beyond int32 is refused, not wrapped (2**32 + 1 would wrap to 1).
    beyond = wide._replace(rows=tf.tensor_scatter_nd_update(wide.rows, [[0]], [2**32 + 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="pattern.rows must fit in int32"):
        sparse_matmul(x, values, beyond, use_kernel=use_kernel)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_gradients_of_gradients_equal_the_dense_products(use_kernel):
    # A gradient penalty (d/dvalues of |dL/dx|^2) and the Hessian of the
    # loss in the values differentiate the backward ops themselves: before,
    # "gradient registry has no entry for: TfsparseSpmm".
    pattern, values = SparsityPattern.from_scipy(_kernel((8, 5), 0.5, seed=3))
    rows, cols = pattern.rows, pattern.cols
    x = tf.constant(np.random.default_rng(1).standard_normal((4, 8)), tf.float64)

    def penalty_and_hessian(product, weights):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss = tf.reduce_sum(tf.tanh(product(x)) ** 2)
            penalty = tf.reduce_sum(inner.gradient(loss, x) ** 2)
        with tf.GradientTape() as outer_h:
            with tf.GradientTape() as inner_h:
                loss = tf.reduce_sum(tf.tanh(product(x)) ** 2)
            gradient = inner_h.gradient(loss, weights)
        return outer.gradient(penalty, weights), outer_h.jacobian(gradient, weights)

    sparse_values = tf.Variable(values.astype(np.float32))
    got_penalty, got_hessian = penalty_and_hessian(
        lambda x: sparse_matmul(tf.cast(x, tf.float32), sparse_values, pattern,
                                use_kernel=use_kernel), sparse_values)
    kernel = tf.Variable(pattern.to_scipy(values).toarray())
    want_penalty, want_hessian = penalty_and_hessian(lambda x: x @ kernel, kernel)
    want_penalty = want_penalty.numpy()[rows, cols]
    want_hessian = want_hessian.numpy()[rows, cols][:, rows, cols]
    # float32 products of a few terms, then tanh and its derivatives: ~1e-6 relative.
    np.testing.assert_allclose(got_penalty, want_penalty, rtol=1e-4,
                               atol=1e-5 * np.abs(want_penalty).max())
    np.testing.assert_allclose(got_hessian, want_hessian, rtol=1e-4,
                               atol=1e-5 * np.abs(want_hessian).max())
