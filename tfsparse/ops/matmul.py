"""``x @ W`` for a sparse kernel ``W``, with a fast exact gradient."""

import tensorflow as tf

from tfsparse.ops import _tf_internal
from tfsparse.ops.sddmm import sddmm


def sparse_matmul(x, values, pattern):
    """Computes ``x @ W`` where ``W`` is sparse with ``values`` at ``pattern``.

    Only the nonzeros are stored and multiplied. The forward product and the
    input gradient run on TensorFlow's CSR kernels (CPU and GPU); the gradient
    with respect to ``values`` is an SDDMM (``tfsparse.ops.sddmm``). Both
    gradients are exact.

    Args:
      x: float tensor ``[batch, input_dim]``.
      values: float tensor ``[nnz]``, the nonzeros in pattern order.
      pattern: a ``SparsityPattern``, or any object with ``rows``, ``cols``,
        ``row_major_order`` (integer arrays or tensors) and ``shape``
        ``(input_dim, units)``.

    Returns:
      A tensor ``[batch, units]``.

    Example:
      >>> import numpy as np, scipy.sparse
      >>> from tfsparse.ops import SparsityPattern
      >>> pattern, values = SparsityPattern.from_scipy(
      ...     scipy.sparse.random(6, 4, density=0.5, format="csr", rng=0))
      >>> x = np.ones((2, 6), "float32")
      >>> y = sparse_matmul(x, values.astype("float32"), pattern)
      >>> y.shape
      TensorShape([2, 4])
    """
    x = tf.convert_to_tensor(x)
    values = tf.convert_to_tensor(values, dtype=x.dtype)
    rows = tf.convert_to_tensor(pattern.rows, dtype=tf.int32)
    cols = tf.convert_to_tensor(pattern.cols, dtype=tf.int32)
    order = tf.convert_to_tensor(pattern.row_major_order, dtype=tf.int32)
    input_dim, units = (int(s) for s in pattern.shape)
    transposed_indices = tf.cast(tf.stack([cols, rows], axis=1), tf.int64)

    @tf.custom_gradient
    def matmul(x, values):
        # W^T is [units, input_dim]; column-major W is row-major W^T.
        kernel_t = _tf_internal.csr_from_sorted_coo(
            transposed_indices, values, tf.constant([units, input_dim], tf.int64)
        )
        y = _tf_internal.csr_matmul(
            kernel_t, x, transpose_b=True, transpose_output=True
        )

        def grad(dy):
            x_t = tf.transpose(x)
            dy_t = tf.transpose(dy)
            indices = tf.cast(
                tf.stack([tf.gather(rows, order), tf.gather(cols, order)], axis=1),
                tf.int64,
            )
            kernel = _tf_internal.csr_from_sorted_coo(
                indices,
                tf.gather(values, order),
                tf.constant([input_dim, units], tf.int64),
            )
            dx = _tf_internal.csr_matmul(kernel, dy_t, transpose_output=True)
            return dx, sddmm(x_t, dy_t, rows, cols)

        return y, grad

    return matmul(x, values)
