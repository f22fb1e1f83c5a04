"""``x @ W`` for a sparse kernel ``W``, with a fast exact gradient."""

import functools

import tensorflow as tf

from tfsparse._validation import check_bool
from tfsparse._validation import invalid_value
from tfsparse.ops import _tf_internal
from tfsparse.ops import kernels
from tfsparse.ops import tflite
from tfsparse.ops._gather_products import segment_sum_product
from tfsparse.ops.sddmm import int32_indices
from tfsparse.ops.sddmm import sampled_products
from tfsparse.ops.sddmm import use_compiled_kernels


def sparse_matmul(x, values, pattern, use_kernel=None, bias=None):
    """Computes ``x @ W (+ bias)`` where ``W`` is sparse with ``values`` at ``pattern``.

    Only the nonzeros are stored and multiplied. On CPU the forward product and
    the input gradient run on tfsparse's compiled SpMM kernel; on GPU, without
    the compiled kernels, and in exported SavedModels on TensorFlow's CSR
    kernels; in functions XLA compiles (``jit_compile=True``) as a gather and
    a segment sum over the nonzeros; inside ``tfsparse.export.tflite_compatible()``
    with TFLite builtin ops (``tfsparse.ops.tflite``). The gradient with
    respect to ``values`` is an SDDMM (``tfsparse.ops.sddmm``). Both gradients
    are exact, and differentiable in turn (gradient penalties, Hessians).

    Args:
      x: float tensor ``[batch, input_dim]`` (float16 and bfloat16, as
        under Keras mixed precision, are computed in float32 and returned
        in their own dtype). Another width is a ``ValueError`` (an
        ``InvalidArgumentError`` where it is known only when the product runs).
      values: float tensor ``[nnz]``, the nonzeros in pattern order.
      pattern: a ``SparsityPattern``, or any object with ``rows``, ``cols``,
        ``row_major_order`` (integer arrays, tensors or variables) and
        ``shape`` ``(input_dim, units)`` (int64 indices are taken while
        they fit in int32), its nonzeros in the order a
        ``SparsityPattern`` keeps: ``cols`` non-decreasing, and
        ``row_major_order`` the permutation that sorts them by row. Another
        order is an ``InvalidArgumentError`` when the product runs.
      use_kernel: ``True``/``False`` to force the compiled kernels or
        TensorFlow's own ops; ``None`` for ``use_compiled_kernels()``.
      bias: optional float tensor ``[units]`` added to every row; the
        compiled kernel adds it while writing the product (no extra pass).

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
    if use_kernel is not None:  # a bias passed in its place would be ignored
        use_kernel = check_bool("use_kernel", use_kernel)
    x = tf.convert_to_tensor(x)
    if x.dtype in (tf.float16, tf.bfloat16):
        # Neither tfsparse's kernels nor TensorFlow's CSR ones take half
        # precision: compute (and accumulate) in float32, return x's dtype.
        y = sparse_matmul(tf.cast(x, tf.float32), tf.cast(values, tf.float32), pattern,
                          use_kernel, None if bias is None else tf.cast(bias, tf.float32))
        return tf.cast(y, x.dtype)
    if tflite.in_tflite_compatible_scope():
        y = tflite.builtin_ops_product(x, values, pattern, bias)
        y.set_shape(x.shape[:-1].concatenate([pattern.shape[1]]))
        return y
    values = tf.convert_to_tensor(values, dtype=x.dtype)
    if bias is not None:
        bias = tf.convert_to_tensor(bias, dtype=x.dtype)
    rows = int32_indices("pattern.rows", pattern.rows, "sparse_matmul")
    cols = int32_indices("pattern.cols", pattern.cols, "sparse_matmul")
    _check_shapes(x, values, bias, rows, pattern)
    x = checked_last_dim(x, int(pattern.shape[0]),
                         f"sparse_matmul: x must have input_dim={int(pattern.shape[0])} columns")
    if use_kernel is None:
        use_kernel = use_compiled_kernels()
    if use_kernel:
        product = _compiled_product
    elif _tf_internal.in_xla_context():
        product = segment_sum_product  # XLA compiles neither ours nor the CSR ops
    else:
        product = _csr_product
    units = int(pattern.shape[1])
    inputs = [x, values] + ([] if bias is None else [bias])
    if tf.executing_eagerly() and not _tf_internal.gradient_may_be_recorded(inputs):
        # No tape watches the inputs, so no gradient can be asked for: the
        # product alone, without tf.custom_gradient's bookkeeping per eager
        # call (a variable watcher, an inspection of the gradient function,
        # an identity op), which costs more than the product at small batches.
        y = product(x, values, rows, cols, units=units, bias=bias)
    else:
        y = _differentiable_product(product, x, values, rows, cols, pattern, bias, use_kernel)
    # tf.custom_gradient drops static shapes; the output's is known.
    y.set_shape(x.shape[:-1].concatenate([units]))
    return y


def _check_shapes(x, values, bias, rows, pattern):
    """The static shapes of sparse_matmul's arguments against the pattern's."""
    input_dim, units = int(pattern.shape[0]), int(pattern.shape[1])
    if x.shape.rank is not None and x.shape.rank != 2:
        raise invalid_value("x", f"a 2-D tensor [batch, input_dim={input_dim}]",
                            received=f"x of shape {x.shape}")
    if x.shape.rank == 2 and x.shape[1] is not None and x.shape[1] != input_dim:
        # A wider x was multiplied by its first input_dim columns, silently.
        raise invalid_value(
            "x", f"[batch, {input_dim}]: as many columns as the pattern has rows "
            f"(pattern.shape={tuple(pattern.shape)})", received=f"x of shape {x.shape}")
    nnz = rows.shape[0] if rows.shape.rank == 1 else None
    if values.shape.rank is not None and (
            values.shape.rank != 1 or not values.shape.is_compatible_with([nnz])):
        raise invalid_value("values", f"a 1-D tensor of the pattern's {nnz} nonzeros",
                            received=f"values of shape {values.shape}")
    if bias is not None and bias.shape.rank is not None and (
            bias.shape.rank != 1 or not bias.shape.is_compatible_with([units])):
        raise invalid_value("bias", f"a 1-D tensor [units={units}]",
                            received=f"bias of shape {bias.shape}")


def checked_last_dim(x, size, message):
    """``x``, with a run-time check (``message``) that its last dimension is ``size``
    where that is not static."""
    if x.shape.rank is not None and x.shape[-1] is not None:
        return x
    with tf.control_dependencies([tf.debugging.assert_equal(tf.shape(x)[-1], size,
                                                            message=message)]):
        return tf.identity(x)


def _differentiable_product(product, x, values, rows, cols, pattern, bias, use_kernel):
    """``product(x, values, ...)`` with its exact gradients (SpMM and SDDMM)."""
    order = int32_indices("pattern.row_major_order", pattern.row_major_order, "sparse_matmul")
    input_dim, units = (int(s) for s in pattern.shape)

    def backward(x, values, dy):
        # dy @ W^T: the kernel W^T has the rows and cols of W swapped, and
        # W's row-major order sorts it by its output index, as required (the
        # compiled kernel permutes the nonzeros itself, in one pass).
        if product is _compiled_product:
            dx = kernels.spmm(dy, values, cols, rows, input_dim, order=order)
            # x and dy as they are: the op transposes them itself.
            return dx, kernels.sddmm(x, dy, rows, cols, batch_major=True)
        dx = product(dy, tf.gather(values, order), tf.gather(cols, order),
                     tf.gather(rows, order), units=input_dim)
        dvalues = sampled_products(tf.transpose(x), tf.transpose(dy), rows, cols, use_kernel)
        return dx, dvalues

    if bias is None:

        @tf.custom_gradient
        def matmul(x, values):
            return product(x, values, rows, cols, units=units), functools.partial(
                backward, x, values
            )

        return matmul(x, values)

    @tf.custom_gradient
    def matmul_bias(x, values, bias):
        def grad(dy):
            return backward(x, values, dy) + (tf.reduce_sum(dy, axis=0),)

        return product(x, values, rows, cols, units=units, bias=bias), grad

    return matmul_bias(x, values, bias)


# Both products compute x @ K for a kernel K with nonzeros ``values`` at
# (rows, cols), sorted by the output index ``cols``; K has ``units`` columns.


def _compiled_product(x, values, rows, cols, units, bias=None):
    """On tfsparse's compiled SpMM kernel (CPU)."""
    return kernels.spmm(x, values, rows, cols, units, bias)


def _csr_product(x, values, rows, cols, units, bias=None):
    """On TensorFlow's CSR kernels (CPU and GPU)."""
    # K^T is [units, x.shape[1]], row-major because the nonzeros are sorted by
    # cols. TensorFlow's conversion assumes that order without checking it
    # (out of order, the product is silently wrong), so it is checked here,
    # as the compiled kernel checks it: a pattern that is not a
    # SparsityPattern, or pattern weights set by hand, may be out of order.
    cols = _sorted_segments(cols)
    indices = tf.cast(tf.stack([cols, rows], axis=1), tf.int64)
    dense_shape = tf.stack([tf.constant(units, tf.int64), tf.shape(x, out_type=tf.int64)[1]])
    kernel_t = _tf_internal.csr_from_sorted_coo(indices, values, dense_shape)
    y = _tf_internal.csr_matmul(kernel_t, x, transpose_b=True, transpose_output=True)
    return y if bias is None else tf.nn.bias_add(y, bias)


def _sorted_segments(cols):
    """``cols`` once checked non-decreasing (InvalidArgumentError otherwise)."""
    message = ("the nonzeros must be sorted by their output index: pattern.cols "
               "non-decreasing in pattern order (pattern.rows in row_major_order, "
               "for the input gradient), as SparsityPattern keeps them")
    check = tf.debugging.assert_greater_equal(cols[1:], cols[:-1], message=message)
    with tf.control_dependencies([check]):
        return tf.identity(cols)
