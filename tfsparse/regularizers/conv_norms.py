"""Group norms of a convolution kernel, SSL's conv groups (plain math, no Keras).

A Conv1D/2D/3D kernel ``W`` of shape ``(*spatial, in_channels, filters)``
(Keras' ``channels_last`` layout) lowered by im2col is the matrix
``M = reshape(W, (prod(spatial) * in_channels, filters))``: row
``r = position * in_channels + c`` holds the weights of input channel ``c`` at
one kernel position, column ``n`` is filter ``n``. SSL's groups (Wen et al.
2016) are:

- ``"filters"``: one output channel's whole kernel ``W[..., n]`` (a column of
  ``M``; ``filters`` groups);
- ``"channels"``: one input channel across all positions and filters
  ``W[..., c, :]`` (``in_channels`` groups);
- ``"shapes"``: one ``(*position, c)`` entry across all filters, a row of
  ``M`` (``prod(spatial) * in_channels`` groups);
- ``"blocks"``: ``(bh, bw)`` tiles of ``M``, row-major over the tile grid, as
  for a Dense kernel.

A zero filter removes an output channel (and the matching input channel of
the layers that read it); a zero channel removes an input channel; a zero
shape removes a row of the lowered matrix.
"""

import numpy as np
import tensorflow as tf

from tfsparse.regularizers import group_norms
from tfsparse._validation import invalid_value, one_of

CONV_KINDS = ("filters", "channels", "shapes", "blocks")


def _check(shape, groups, block_shape):
    if len(shape) < 3:
        raise invalid_value(
            "kernel", "a convolution kernel of rank 3 to 5 (*spatial, in_channels, filters)",
            received=f"shape {tuple(shape)}")
    if groups not in CONV_KINDS:
        raise invalid_value("groups", one_of(CONV_KINDS), groups)
    if groups == "blocks" and block_shape is None:
        raise invalid_value(
            "block_shape", "a pair of positive integers (bh, bw) when groups='blocks'", None)


def lowered_shape(shape):
    """``(prod(spatial) * in_channels, filters)``, the im2col matrix of a kernel shape.

    Example:
        >>> lowered_shape((3, 3, 16, 32))
        (144, 32)
    """
    shape = tuple(int(d) for d in shape)
    return int(np.prod(shape[:-1])), shape[-1]


def conv_num_groups(shape, groups, block_shape=None):
    """Number of groups of one kind in a convolution kernel of ``shape``.

    Example:
        >>> conv_num_groups((3, 3, 16, 32), "shapes")
        144
    """
    _check(shape, groups, block_shape)
    rows, filters = lowered_shape(shape)
    if groups == "filters":
        return filters
    if groups == "channels":
        return int(shape[-2])
    if groups == "shapes":
        return rows
    return group_norms.num_groups((rows, filters), "blocks", block_shape)


def conv_group_ids(shape, groups, block_shape=None):
    """The group of every kernel entry, an int array of the kernel's ``shape``.

    Example:
        >>> conv_group_ids((1, 2, 2, 1), "channels").ravel().tolist()
        [0, 1, 0, 1]
    """
    _check(shape, groups, block_shape)
    rows, filters = lowered_shape(shape)
    row, col = np.meshgrid(np.arange(rows), np.arange(filters), indexing="ij")
    if groups == "filters":
        ids = col
    elif groups == "channels":
        ids = row % int(shape[-2])
    elif groups == "shapes":
        ids = row
    else:
        ids = group_norms.group_ids(row.ravel(), col.ravel(), (rows, filters), "blocks",
                                    block_shape).numpy()
    return np.reshape(ids, tuple(int(d) for d in shape))


def conv_group_norms(kernel, groups, block_shape=None):
    """The L2 norm of each group of a convolution kernel.

    Args:
        kernel: float tensor ``(*spatial, in_channels, filters)``.
        groups: ``"filters"``, ``"channels"``, ``"shapes"`` or ``"blocks"``.
        block_shape: ``(bh, bw)`` tiles of the lowered matrix, needed for ``"blocks"``.

    Returns:
        A float tensor (num_groups,), in the order of :func:`conv_group_ids`.

    Example:
        >>> w = tf.reshape(tf.range(8.0), (1, 2, 2, 2))  # W[0, p, c, n] = 4p + 2c + n
        >>> (conv_group_norms(w, "channels").numpy() ** 2).round(3)  # 0+1+16+25, 4+9+36+49
        array([42., 98.], dtype=float32)
    """
    kernel = tf.convert_to_tensor(kernel)
    _check(kernel.shape, groups, block_shape)
    if groups == "blocks":
        lowered = tf.reshape(kernel, lowered_shape(kernel.shape))
        return group_norms.dense_group_norms(lowered, "blocks", block_shape)
    squares = group_norms.wide_squares(kernel)
    rank = kernel.shape.rank
    if groups == "filters":
        summed = tf.reduce_sum(squares, axis=list(range(rank - 1)))
    elif groups == "channels":
        summed = tf.reduce_sum(squares, axis=list(range(rank - 2)) + [rank - 1])
    else:  # "shapes"
        summed = tf.reshape(tf.reduce_sum(squares, axis=-1), [-1])
    return group_norms.norms_in(summed, kernel.dtype)


def conv_keep_mask(kernel, groups, threshold, block_shape=None):
    """A 0/1 mask of the kernel's shape: 0 where an entry's group norm is <= threshold.

    With several kinds (a sequence), an entry is dropped when any of its groups is.

    Example:
        >>> w = tf.constant([[[[1.0, 1e-4]], [[1.0, 0.0]]]])  # (1, 2, 1, 2)
        >>> conv_keep_mask(w, "filters", 1e-3).numpy()[0, :, 0, :]
        array([[1., 0.],
               [1., 0.]], dtype=float32)
    """
    kernel = tf.convert_to_tensor(kernel)
    keep = tf.ones_like(kernel, dtype=tf.bool)
    for kind in (groups,) if isinstance(groups, str) else tuple(groups):
        norms = conv_group_norms(kernel, kind, block_shape)
        ids = conv_group_ids(kernel.shape, kind, block_shape)
        keep = tf.logical_and(keep, tf.gather(norms, ids) > threshold)
    return tf.cast(keep, kernel.dtype)
