"""Group norms (dense and sparse COO) against NumPy references."""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse.regularizers import group_norms

# float32 sums of at most ~100 squares: relative error below 100 * 2**-24 ~ 6e-6.
RTOL = 1e-5

CASES = [
    ("rows", None),
    ("columns", None),
    ("blocks", (2, 3)),
    ("blocks", (4, 4)),  # tiles do not divide the shape: ragged last tiles
    ("blocks", (1, 1)),
]


def reference_norms(w, groups, block_shape=None):
    if groups == "rows":
        return np.sqrt((w.astype(np.float64) ** 2).sum(axis=1))
    if groups == "columns":
        return np.sqrt((w.astype(np.float64) ** 2).sum(axis=0))
    bh, bw = block_shape
    out = []
    for i in range(0, w.shape[0], bh):
        for j in range(0, w.shape[1], bw):
            out.append(np.linalg.norm(w[i:i + bh, j:j + bw].astype(np.float64)))
    return np.array(out)


def random_sparse(shape, density, seed):
    rng = np.random.default_rng(seed)
    mask = rng.random(shape) < density
    mask[:, 1] = False  # an empty column
    mask[2, :] = False  # an empty row
    rows, cols = np.nonzero(mask.T)[::-1]  # column-major order, like SparsityPattern
    values = rng.standard_normal(rows.size).astype(np.float32)
    dense = np.zeros(shape, np.float32)
    dense[rows, cols] = values
    return values, rows.astype(np.int32), cols.astype(np.int32), dense


@pytest.mark.parametrize("groups,block_shape", CASES)
def test_dense_norms_match_numpy(groups, block_shape):
    w = np.random.default_rng(1).standard_normal((10, 13)).astype(np.float32)
    got = group_norms.dense_group_norms(w, groups, block_shape).numpy()
    np.testing.assert_allclose(got, reference_norms(w, groups, block_shape), rtol=RTOL)
    assert got.size == group_norms.num_groups(w.shape, groups, block_shape)


@pytest.mark.parametrize("groups,block_shape", CASES)
def test_sparse_norms_match_numpy_of_dense(groups, block_shape):
    values, rows, cols, dense = random_sparse((10, 13), 0.3, seed=2)
    got = group_norms.sparse_group_norms(values, rows, cols, dense.shape, groups, block_shape)
    np.testing.assert_allclose(got.numpy(), reference_norms(dense, groups, block_shape),
                               rtol=RTOL, atol=0)


@pytest.mark.parametrize("groups,block_shape", CASES)
def test_sparse_and_dense_group_ids_agree(groups, block_shape):
    _, rows, cols, dense = random_sparse((10, 13), 0.5, seed=3)
    ids = group_norms.group_ids(rows, cols, dense.shape, groups, block_shape)
    if groups == "rows":
        expected = rows
    elif groups == "columns":
        expected = cols
    else:
        bh, bw = block_shape
        expected = (rows // bh) * int(np.ceil(13 / bw)) + cols // bw
    assert ids.dtype == tf.int32
    np.testing.assert_array_equal(ids.numpy(), expected)


def test_sparse_norms_never_densify_a_huge_kernel():
    # A dense (10^6 x 10^6) float32 kernel would need 4 TB: only an nnz-sized
    # computation can answer this.
    shape = (1_000_000, 1_000_000)
    rows = np.array([5, 999_999, 7], np.int32)
    cols = np.array([3, 3, 999_998], np.int32)
    values = tf.constant([3.0, 4.0, 2.0])
    norms = group_norms.sparse_group_norms(values, rows, cols, shape, "blocks", (1000, 1000))
    assert norms.shape == (1_000_000,)
    assert norms[0].numpy() == pytest.approx(3.0)
    assert norms[999 * 1000].numpy() == pytest.approx(4.0)
    assert norms[999].numpy() == pytest.approx(2.0)
    assert float(tf.reduce_sum(norms)) == pytest.approx(9.0)


def test_safe_norm_value_and_gradient_at_zero():
    s = tf.constant([0.0, 4.0, 0.25])
    with tf.GradientTape() as tape:
        tape.watch(s)
        y = group_norms.safe_norm(s)
    np.testing.assert_allclose(y.numpy(), [0.0, 2.0, 0.5])
    grad = tape.gradient(y, s).numpy()
    # d sqrt(s)/ds = 0.5/sqrt(s); 0 (a subgradient choice) at s = 0.
    np.testing.assert_allclose(grad, [0.0, 0.25, 1.0])


@pytest.mark.parametrize("groups,block_shape", CASES)
def test_penalty_gradient_is_finite_with_zero_groups(groups, block_shape):
    values, rows, cols, dense = random_sparse((10, 13), 0.3, seed=4)
    values[cols == 0] = 0.0  # a group zeroed exactly, as masking does
    dense[rows, cols] = values
    var = tf.Variable(values)
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(group_norms.sparse_group_norms(
            var, rows, cols, dense.shape, groups, block_shape))
    grad = tape.gradient(total, var).numpy()
    assert np.all(np.isfinite(grad))
    # Reference: d/dw_i sum_g ||w_g|| = w_i / ||w_{g(i)}||, and 0 for a zero group.
    ids = group_norms.group_ids(rows, cols, dense.shape, groups, block_shape).numpy()
    norms = reference_norms(dense, groups, block_shape)[ids]
    expected = np.divide(values, norms, out=np.zeros_like(norms), where=norms > 0)
    np.testing.assert_allclose(grad, expected, rtol=RTOL, atol=1e-7)


def test_group_sparsity_counts_groups_at_or_under_threshold():
    norms = tf.constant([0.0, 1e-3, 2e-3, 1.0])
    assert float(group_norms.group_sparsity(norms, 1e-3)) == pytest.approx(0.5)
    assert float(group_norms.group_sparsity(tf.zeros([0]), 1e-3)) == 0.0


def test_keep_masks_drop_groups_under_threshold_sparse_and_dense():
    values, rows, cols, dense = random_sparse((10, 13), 0.4, seed=5)
    values[cols == 4] *= 1e-5  # a column to drop
    values[rows == 7] *= 1e-5  # a row to drop
    dense[:, :] = 0.0
    dense[rows, cols] = values
    threshold = 1e-3
    col_norms = reference_norms(dense, "columns")
    row_norms = reference_norms(dense, "rows")
    expected = ((col_norms[cols] > threshold) & (row_norms[rows] > threshold)).astype(np.float32)
    assert expected.min() == 0.0 and expected.max() == 1.0
    got = group_norms.sparse_keep_mask(values, rows, cols, dense.shape,
                                       ("rows", "columns"), threshold)
    np.testing.assert_array_equal(got.numpy(), expected)
    dense_mask = group_norms.dense_keep_mask(dense, ("rows", "columns"), threshold).numpy()
    expected_dense = np.outer(row_norms > threshold, col_norms > threshold).astype(np.float32)
    np.testing.assert_array_equal(dense_mask, expected_dense)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"groups": "filters"},
         'Received an invalid value for "groups", expected one of \'rows\', \'columns\', '
         "'blocks'. Received: groups='filters'"),
        ({"groups": "blocks"},
         'Received an invalid value for "block_shape", expected a pair of positive '
         'integers (bh, bw) when groups=\'blocks\'. Received: block_shape=None'),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError) as info:
        group_norms.dense_group_norms(tf.ones([2, 2]), **kwargs)
    assert str(info.value) == message


def test_dense_norms_reject_non_matrix():
    with pytest.raises(ValueError, match=r'expected a 2-D tensor \(input_dim, units\). '
                                         r'Received: kernel with shape \(4,\)'):
        group_norms.dense_group_norms(tf.ones([4]), "rows")


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("groups,block_shape", CASES)
def test_half_precision_norms_sum_their_squares_in_float32(dtype, groups, block_shape):
    # Weights of about 100: a group's sum of squares (10^4 per entry) is far
    # beyond float16's 65504, its norm is not (before: inf in float16).
    w = tf.cast(100 * np.random.default_rng(5).uniform(0.5, 1, (9, 10)), dtype)
    want = reference_norms(tf.cast(w, tf.float64).numpy(), groups, block_shape)
    values, rows, cols = [], [], []
    for (i, j), value in np.ndenumerate(w.numpy()):
        values.append(value), rows.append(i), cols.append(j)
    for got in (group_norms.dense_group_norms(w, groups, block_shape),
                group_norms.sparse_group_norms(tf.stack(values), rows, cols, (9, 10),
                                               groups, block_shape)):
        assert got.dtype == dtype
        # One rounding to the half type (2**-11 or 2**-8 relative).
        rtol = 2.0**-10 if dtype == tf.float16 else 2.0**-7
        np.testing.assert_allclose(tf.cast(got, tf.float64).numpy(), want, rtol=rtol)
