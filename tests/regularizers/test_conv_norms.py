"""SSL's convolution groups (filters, channels, shapes, blocks) against NumPy references."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.regularizers import GroupLasso
from tfsparse.regularizers import conv_norms

from test_group_lasso import GROUPS  # noqa: E402  (the one wording of the groups error)

# float32 sums of at most 3*3*4*5 = 180 squares: relative error below 180 * 2**-24 ~ 1.1e-5.
RTOL = 2e-5

SHAPES = [(3, 3, 4, 5), (3, 4, 5), (2, 2, 2, 3, 4)]
KINDS = [("filters", None), ("channels", None), ("shapes", None), ("blocks", (4, 2)),
         ("blocks", (5, 3))]


def reference_norms(w, kind, block_shape=None):
    """One norm per group, written with explicit loops over the kernel's indices."""
    w = w.astype(np.float64)
    *spatial, channels, filters = w.shape
    positions = list(itertools.product(*(range(s) for s in spatial)))
    if kind == "filters":
        return np.array([np.sqrt((w[..., n] ** 2).sum()) for n in range(filters)])
    if kind == "channels":
        return np.array([np.sqrt((w[..., c, :] ** 2).sum()) for c in range(channels)])
    if kind == "shapes":  # row-major over (*position, channel)
        return np.array([np.linalg.norm(w[p + (c,)]) for p in positions for c in range(channels)])
    rows = np.stack([w[p + (c,)] for p in positions for c in range(channels)])
    bh, bw = block_shape
    return np.array([np.linalg.norm(rows[i:i + bh, j:j + bw])
                     for i in range(0, rows.shape[0], bh) for j in range(0, filters, bw)])


def kernel(shape, seed=0):
    w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    w[..., 1] = 0  # a zero filter
    w[..., 2, :] = 0  # a zero channel
    return w


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind,block_shape", KINDS)
def test_norms_and_ids_match_numpy(shape, kind, block_shape):
    w = kernel(shape)
    norms = conv_norms.conv_group_norms(w, kind, block_shape).numpy()
    expected = reference_norms(w, kind, block_shape)
    np.testing.assert_allclose(norms, expected, rtol=RTOL, atol=0)
    assert norms.size == conv_norms.conv_num_groups(shape, kind, block_shape)
    ids = conv_norms.conv_group_ids(shape, kind, block_shape)
    # The norm of each id's entries is the norm the function gives that group.
    by_id = np.sqrt(np.bincount(ids.ravel(), (w.astype(np.float64) ** 2).ravel(),
                                minlength=norms.size))
    np.testing.assert_allclose(by_id, expected, rtol=RTOL, atol=0)


@pytest.mark.parametrize("kinds", ["filters", ("filters", "channels"), ("shapes", "blocks")])
def test_keep_mask_zeroes_entries_of_small_groups(kinds):
    w = kernel((3, 3, 4, 5), seed=1)
    w[0, 1, 3, :] *= 1e-4  # a tiny shape
    w[..., 4] *= 1e-4  # a tiny filter
    mask = conv_norms.conv_keep_mask(w, kinds, 1e-2, (4, 2)).numpy()
    expected = np.ones_like(w, bool)
    for kind in (kinds,) if isinstance(kinds, str) else kinds:
        norms = reference_norms(w, kind, (4, 2))
        ids = conv_norms.conv_group_ids(w.shape, kind, (4, 2))
        expected &= norms[ids] > 1e-2
    np.testing.assert_array_equal(mask, expected.astype(np.float32))
    assert not mask[..., 4].any()


@pytest.mark.parametrize("groups", ["filters", ("filters", "channels", "shapes")])
def test_conv2d_kernel_regularizer_loss(groups):
    layer = keras.layers.Conv2D(5, 3, kernel_regularizer=GroupLasso(0.01, groups))
    layer(tf.ones([1, 6, 6, 4]))
    w = layer.kernel.numpy()
    expected = 0.01 * sum(reference_norms(w, kind).sum()
                          for kind in ((groups,) if isinstance(groups, str) else groups))
    assert float(tf.add_n(layer.losses)) == pytest.approx(expected, rel=RTOL)


def test_conv_penalty_round_trips_through_a_saved_model(tmp_path):
    reg = GroupLasso(0.1, ("filters", "blocks"), block_shape=(3, 2))
    model = keras.Sequential([keras.Input((5, 5, 2)),
                              keras.layers.Conv2D(4, 3, kernel_regularizer=reg)])
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert float(tf.add_n(loaded.losses)) == pytest.approx(float(tf.add_n(model.losses)),
                                                           rel=1e-7)


@pytest.mark.parametrize(
    "groups,shape",
    [("filters", (4, 5)), ("rows", (3, 3, 4, 5)), (("columns",), (3, 3, 4, 5))],
)
def test_groups_of_the_other_family_are_a_clear_error(groups, shape):
    with pytest.raises(ValueError) as info:
        GroupLasso(0.1, groups)(tf.ones(shape))
    assert str(info.value).startswith('Received an invalid value for "x", expected the 2-D '
                                      "kernel (input_dim, units) of a dense layer")
    kinds = (groups,) if isinstance(groups, str) else groups
    assert str(info.value).endswith(
        f"Received: x with shape {tf.TensorShape(shape)} and groups={kinds!r}")


def test_mixing_families_is_a_clear_error():
    with pytest.raises(ValueError) as info:
        GroupLasso(0.1, ("rows", "filters"))
    assert str(info.value) == (
        'Received an invalid value for "groups", expected ' + GROUPS + ". "
        "Received: groups=('rows', 'filters')")


def test_conv_groups_on_a_sparse_kernel_are_a_clear_error():
    from tfsparse.layers import SparseDense

    layer = SparseDense(4, density=0.5, seed=0, kernel_regularizer=GroupLasso(0.1, "filters"))
    layer(tf.ones([2, 6]))
    with pytest.raises(ValueError) as info:
        layer.losses  # the penalty is computed when the losses are collected
    assert str(info.value) == (
        "Received an invalid value for \"groups\", expected 'rows', 'columns' or 'blocks' for "
        "the kernel of a SparseDense layer. Received: groups=('filters',)")


@pytest.mark.parametrize("kind,block_shape", KINDS)
def test_float16_norms_sum_their_squares_in_float32(kind, block_shape):
    w = tf.cast(100 * (1 + np.abs(kernel((3, 3, 4, 5), seed=3))), tf.float16)
    want = reference_norms(tf.cast(w, tf.float64).numpy(), kind, block_shape)
    got = conv_norms.conv_group_norms(w, kind, block_shape)
    assert got.dtype == tf.float16  # was inf: sums of squares beyond 65504
    np.testing.assert_allclose(tf.cast(got, tf.float64).numpy(), want, rtol=2.0**-10)
