"""Group norms of a fully connected kernel, dense or sparse (plain math, no Keras).

A kernel ``W`` of shape ``(input_dim, units)`` is split into groups:

- ``"rows"``: one group per kernel row, the fan-out of one input neuron
  (``input_dim`` groups);
- ``"columns"``: one group per kernel column, the fan-in of one output neuron
  (``units`` groups);
- ``"blocks"``: one group per ``(bh, bw)`` tile, numbered row-major over the
  tile grid (``ceil(input_dim / bh) * ceil(units / bw)`` groups; the tiles of
  the last tile row and column may be smaller).

The sparse functions take the kernel in COO form (``values``, ``rows``,
``cols``, ``shape``): the group norms are computed over the nonzeros with
``tf.math.unsorted_segment_sum``, without densifying. A group with no
nonzeros has norm 0.

The square root uses :func:`safe_norm`, whose gradient at a zero group is 0
(a subgradient of ``||w||_2`` at 0) instead of NaN, so a group that masking
zeroed exactly never poisons the training step.
"""

import numpy as np
import tensorflow as tf

from tfsparse._validation import check_choice
from tfsparse._validation import invalid_value

GROUP_KINDS = ("rows", "columns", "blocks")


def _check_kind(groups, block_shape):
    check_choice("groups", groups, GROUP_KINDS)
    if groups == "blocks" and block_shape is None:
        raise invalid_value(
            "block_shape", "a pair of positive integers (bh, bw) when groups='blocks'",
            block_shape,
        )


def num_groups(shape, groups, block_shape=None):
    """Number of groups of a kernel of ``shape`` for one kind of grouping.

    Args:
        shape: ``(input_dim, units)`` of the kernel.
        groups: ``"rows"``, ``"columns"`` or ``"blocks"``.
        block_shape: ``(bh, bw)``, needed for ``"blocks"``.

    Returns:
        The number of groups, an int.

    Example:
        >>> num_groups((5, 7), "blocks", (2, 3))
        9
    """
    _check_kind(groups, block_shape)
    n_in, n_out = int(shape[0]), int(shape[1])
    if groups == "rows":
        return n_in
    if groups == "columns":
        return n_out
    bh, bw = block_shape
    return (-(-n_in // bh)) * (-(-n_out // bw))


def group_ids(rows, cols, shape, groups, block_shape=None):
    """The group of each nonzero of a COO kernel.

    Args:
        rows: int array or tensor, the row of each nonzero.
        cols: int array or tensor, the column of each nonzero.
        shape: ``(input_dim, units)`` of the kernel (Python ints).
        groups: ``"rows"``, ``"columns"`` or ``"blocks"``.
        block_shape: ``(bh, bw)``, needed for ``"blocks"``.

    Returns:
        An int32 tensor of the same length as ``rows``, values in
        ``[0, num_groups(shape, groups, block_shape))``.

    Example:
        >>> group_ids([0, 3], [4, 1], (4, 6), "blocks", (2, 2)).numpy()
        array([2, 3], dtype=int32)
    """
    _check_kind(groups, block_shape)
    rows = tf.cast(tf.convert_to_tensor(rows), tf.int32)
    cols = tf.cast(tf.convert_to_tensor(cols), tf.int32)
    if groups == "rows":
        return rows
    if groups == "columns":
        return cols
    bh, bw = block_shape
    tiles_per_row = -(-int(shape[1]) // bw)
    return (rows // bh) * tiles_per_row + cols // bw


def safe_norm(sum_of_squares):
    """``sqrt(sum_of_squares)`` with gradient 0 (not NaN or inf) where it is 0.

    Args:
        sum_of_squares: a non-negative float tensor.

    Returns:
        The elementwise square root, exact; its gradient is ``0.5 / sqrt(s)``
        where ``s > 0`` and 0 where ``s == 0``.

    Example:
        >>> safe_norm(tf.constant([0.0, 4.0])).numpy()
        array([0., 2.], dtype=float32)
    """
    positive = sum_of_squares > 0
    safe = tf.where(positive, sum_of_squares, tf.ones_like(sum_of_squares))
    return tf.where(positive, tf.sqrt(safe), tf.zeros_like(sum_of_squares))


def wide_squares(values):
    """``values ** 2``, in float32 for float16 and bfloat16 ``values``.

    A group's sum of squares leaves float16's range from weights of about
    256 / sqrt(group size), while its norm stays in it: the sums are made in
    float32 and the norms (``norms_in``) returned in the values' dtype.

    Example:
        >>> wide_squares(tf.constant([300.0], tf.float16)).numpy()
        array([90000.], dtype=float32)
    """
    values = tf.convert_to_tensor(values)
    if values.dtype in (tf.float16, tf.bfloat16):
        values = tf.cast(values, tf.float32)
    return tf.square(values)


def norms_in(sum_of_squares, dtype):
    """``safe_norm(sum_of_squares)`` in ``dtype`` (the weights')."""
    return tf.cast(safe_norm(sum_of_squares), dtype)


def sparse_group_norms(values, rows, cols, shape, groups, block_shape=None):
    """The L2 norm of each group of a sparse kernel in COO form.

    Args:
        values: float tensor (nnz,), the nonzero values.
        rows: int array or tensor (nnz,), the row of each value.
        cols: int array or tensor (nnz,), the column of each value.
        shape: ``(input_dim, units)`` of the kernel.
        groups: ``"rows"``, ``"columns"`` or ``"blocks"``.
        block_shape: ``(bh, bw)``, needed for ``"blocks"``.

    Returns:
        A float tensor (num_groups,) of group norms; groups with no nonzeros
        have norm 0.

    Example:
        >>> sparse_group_norms(tf.constant([3.0, 4.0]), [0, 1], [1, 1],
        ...                    (2, 2), "columns").numpy()
        array([0., 5.], dtype=float32)
    """
    values = tf.convert_to_tensor(values)
    ids = group_ids(rows, cols, shape, groups, block_shape)
    count = num_groups(shape, groups, block_shape)
    squares = tf.math.unsorted_segment_sum(wide_squares(values), ids, count)
    return norms_in(squares, values.dtype)


def dense_group_norms(kernel, groups, block_shape=None):
    """The L2 norm of each group of a dense 2-D kernel.

    Args:
        kernel: float tensor (input_dim, units).
        groups: ``"rows"``, ``"columns"`` or ``"blocks"``.
        block_shape: ``(bh, bw)``, needed for ``"blocks"``.

    Returns:
        A float tensor (num_groups,) of group norms, in the group order of
        :func:`group_ids`.

    Example:
        >>> dense_group_norms(tf.constant([[3.0, 0.0], [4.0, 1.0]]), "columns").numpy()
        array([5., 1.], dtype=float32)
    """
    _check_kind(groups, block_shape)
    kernel = tf.convert_to_tensor(kernel)
    if kernel.shape.rank != 2:
        raise invalid_value("kernel", "a 2-D tensor (input_dim, units)",
                            received=f"kernel with shape {kernel.shape}")
    squares = wide_squares(kernel)
    if groups == "rows":
        return norms_in(tf.reduce_sum(squares, axis=1), kernel.dtype)
    if groups == "columns":
        return norms_in(tf.reduce_sum(squares, axis=0), kernel.dtype)
    bh, bw = block_shape
    n_in, n_out = kernel.shape
    grid_rows, grid_cols = -(-n_in // bh), -(-n_out // bw)
    padded = tf.pad(squares, [[0, grid_rows * bh - n_in], [0, grid_cols * bw - n_out]])
    tiles = tf.reshape(padded, [grid_rows, bh, grid_cols, bw])
    return norms_in(tf.reshape(tf.reduce_sum(tiles, axis=[1, 3]), [-1]), kernel.dtype)


def group_sparsity(norms, threshold):
    """Share of groups whose norm is at most ``threshold``.

    Args:
        norms: float tensor or array of group norms.
        threshold: a non-negative float.

    Returns:
        A float in [0, 1] as a scalar tensor (0 for no groups).

    Example:
        >>> float(group_sparsity(tf.constant([0.0, 1e-5, 0.5, 2.0]), 1e-3))
        0.5
    """
    norms = tf.convert_to_tensor(norms)
    below = tf.cast(norms <= threshold, tf.float32)
    return tf.math.divide_no_nan(tf.reduce_sum(below), tf.cast(tf.size(below), tf.float32))


def sparse_keep_mask(values, rows, cols, shape, groups, threshold, block_shape=None):
    """A 0/1 mask over the nonzeros: 0 where the value's group norm is <= threshold.

    With several kinds of groups (a sequence such as ``("rows", "columns")``),
    a value is dropped when any of its groups is under the threshold.

    Args:
        values: float tensor (nnz,).
        rows: int array or tensor (nnz,).
        cols: int array or tensor (nnz,).
        shape: ``(input_dim, units)``.
        groups: a kind of group or a sequence of kinds.
        threshold: a non-negative float, the norm at or under which a group is removed.
        block_shape: ``(bh, bw)``, needed for ``"blocks"``.

    Returns:
        A tensor (nnz,) of the dtype of ``values``, 1 to keep, 0 to drop.

    Example:
        >>> sparse_keep_mask(tf.constant([1e-4, 1.0]), [0, 1], [0, 1], (2, 2),
        ...                  "columns", 1e-3).numpy()
        array([0., 1.], dtype=float32)
    """
    values = tf.convert_to_tensor(values)
    keep = tf.ones_like(values, dtype=tf.bool)
    for kind in _as_kinds(groups):
        norms = sparse_group_norms(values, rows, cols, shape, kind, block_shape)
        ids = group_ids(rows, cols, shape, kind, block_shape)
        keep = tf.logical_and(keep, tf.gather(norms, ids) > threshold)
    return tf.cast(keep, values.dtype)


def dense_keep_mask(kernel, groups, threshold, block_shape=None):
    """A 0/1 mask of the kernel's shape: 0 where the entry's group norm is <= threshold.

    Args:
        kernel: float tensor (input_dim, units).
        groups: a kind of group or a sequence of kinds.
        threshold: a non-negative float.
        block_shape: ``(bh, bw)``, needed for ``"blocks"``.

    Returns:
        A tensor of the kernel's shape and dtype, 1 to keep, 0 to drop.

    Example:
        >>> dense_keep_mask(tf.constant([[1.0, 1e-4], [1.0, 0.0]]), "columns", 1e-3).numpy()
        array([[1., 0.],
               [1., 0.]], dtype=float32)
    """
    kernel = tf.convert_to_tensor(kernel)
    n_in, n_out = kernel.shape
    rows, cols = np.meshgrid(np.arange(n_in), np.arange(n_out), indexing="ij")
    rows, cols = rows.ravel(), cols.ravel()
    flat = tf.reshape(kernel, [-1])
    keep = tf.ones_like(flat, dtype=tf.bool)
    for kind in _as_kinds(groups):
        norms = dense_group_norms(kernel, kind, block_shape)
        ids = group_ids(rows, cols, (n_in, n_out), kind, block_shape)
        keep = tf.logical_and(keep, tf.gather(norms, ids) > threshold)
    return tf.reshape(tf.cast(keep, kernel.dtype), [n_in, n_out])


def _as_kinds(groups):
    return (groups,) if isinstance(groups, str) else tuple(groups)
