"""SDDMM: a dense-dense product sampled at a sparse pattern."""

import numpy as np
import tensorflow as tf

from tfsparse._validation import check_bool
from tfsparse._validation import invalid_value
from tfsparse.ops import _tf_internal
from tfsparse.ops import kernels


def use_compiled_kernels():
    """Whether tfsparse's compiled CPU kernels serve the current trace.

    They do when they are built and enabled, no GPU is visible (on GPUs
    TensorFlow's CSR kernels run), no SavedModel is being exported (an
    exported graph holds core TensorFlow ops only, so it loads where tfsparse
    is not installed) and XLA is not compiling the trace (``jit_compile``).
    """
    return (
        kernels.available()
        and not _tf_internal.gpu_visible()
        and not _tf_internal.in_saved_model_export()
        and not _tf_internal.in_xla_context()
    )


def sddmm(x_t, dy_t, rows, cols, use_kernel=None):
    """Computes ``out[k] = sum_b x_t[rows[k], b] * dy_t[cols[k], b]``.

    This is the gradient of a sparse kernel's values: with ``x`` the layer input
    ``[batch, input_dim]`` and ``dy`` the output gradient ``[batch, units]``,
    ``sddmm(x^T, dy^T, rows, cols)`` is ``(x^T dy)`` read at the nonzeros only.

    Args:
      x_t: float tensor ``[input_dim, batch]`` (float16 and bfloat16 are
        accumulated in float32 and returned in their own dtype).
      dy_t: float tensor ``[units, batch]``, same dtype.
      rows: int32 tensor ``[nnz]`` of row indices into ``x_t``.
      cols: int32 tensor ``[nnz]`` of row indices into ``dy_t``.
      use_kernel: ``True`` for the compiled CPU kernel, ``False`` for the
        pure-TensorFlow path, ``None`` for ``use_compiled_kernels()``.

    Returns:
      A tensor ``[nnz]``.

    Example:
      >>> import numpy as np
      >>> out = sddmm(np.ones((3, 2), "float32"), np.ones((2, 2), "float32"),
      ...             np.array([0, 2], "int32"), np.array([1, 1], "int32"))
      >>> out.numpy().tolist()
      [2.0, 2.0]
    """
    if use_kernel is not None:
        use_kernel = check_bool("use_kernel", use_kernel)
    x_t = tf.convert_to_tensor(x_t)
    # A list takes x_t's dtype; an array or a tensor must have it (a float64
    # dy_t was rounded to a float32 x_t's dtype).
    typed = tf.is_tensor(dy_t) or isinstance(dy_t, np.ndarray)
    dy_t = tf.convert_to_tensor(dy_t, dtype=None if typed else x_t.dtype)
    if dy_t.dtype != x_t.dtype:
        raise invalid_value("dy_t", f"a tensor of x_t's dtype {x_t.dtype.name}",
                            received=f"dy_t of dtype {dy_t.dtype.name}")
    rows, cols = int32_indices("rows", rows, "sddmm"), int32_indices("cols", cols, "sddmm")
    if x_t.shape.rank != 2 or dy_t.shape.rank != 2:
        raise invalid_value("x_t", "x_t [input_dim, batch] and dy_t [units, batch], both 2-D",
                            received=f"x_t of shape {x_t.shape} and dy_t of shape {dy_t.shape}")
    if not x_t.shape[1:].is_compatible_with(dy_t.shape[1:]):
        raise invalid_value("dy_t", f"the batch of x_t ({x_t.shape[1]}) as its second dimension",
                            received=f"dy_t of shape {dy_t.shape}")
    if rows.shape.rank != 1 or not rows.shape.is_compatible_with(cols.shape):
        raise invalid_value("rows", "1-D rows and cols of one length",
                            received=f"rows of shape {rows.shape} and cols of shape {cols.shape}")
    if use_kernel is None:
        use_kernel = use_compiled_kernels()
    if not use_kernel:  # the compiled kernel checks these itself
        checks = [
            tf.debugging.assert_equal(tf.shape(x_t)[1], tf.shape(dy_t)[1], message=(
                "sddmm: x_t and dy_t must have the same batch (second) dimension")),
            tf.debugging.assert_equal(tf.size(rows), tf.size(cols), message=(
                "sddmm: rows and cols must have one length")),
            _assert_in_range(rows, tf.shape(x_t)[0], "rows", "x_t's rows (input_dim)"),
            _assert_in_range(cols, tf.shape(dy_t)[0], "cols", "dy_t's rows (units)"),
        ]
        with tf.control_dependencies(checks):
            rows, cols = tf.identity(rows), tf.identity(cols)
    return sampled_products(x_t, dy_t, rows, cols, use_kernel)


def sampled_products(x_t, dy_t, rows, cols, use_kernel):
    """``sddmm`` without its checks, for callers whose indices are a checked pattern's."""
    if x_t.dtype in (tf.float16, tf.bfloat16):
        # The compiled kernel takes float32 and float64: accumulate in float32.
        out = sampled_products(tf.cast(x_t, tf.float32), tf.cast(dy_t, tf.float32), rows, cols,
                               use_kernel)
        return tf.cast(out, x_t.dtype)
    rows = tf.convert_to_tensor(rows, dtype=tf.int32)
    cols = tf.convert_to_tensor(cols, dtype=tf.int32)
    if use_kernel is None:
        use_kernel = use_compiled_kernels()
    if use_kernel:
        return kernels.sddmm(x_t, dy_t, rows, cols)
    return tf.reduce_sum(tf.gather(x_t, rows) * tf.gather(dy_t, cols), axis=1)


def int32_indices(name, value, op):
    """``value`` as an int32 tensor: integers within int32 (never wrapped nor truncated).

    ``name`` and ``op`` name the argument and the function in errors.
    """
    if tf.is_tensor(value):
        if not value.dtype.is_integer:
            raise invalid_value(name, "integer indices", received=f"{name} of dtype "
                                f"{value.dtype.name}")
        if value.dtype == tf.int32:
            return tf.convert_to_tensor(value)  # a variable read, a tensor itself
        wide = tf.cast(value, tf.int64)  # every integer dtype fits (uint64 above 2**63 wraps
        # to a negative, which the range check below refuses as well)
        info = np.iinfo(np.int32)
        with tf.control_dependencies([tf.debugging.assert_equal(
                tf.reduce_all((wide >= info.min) & (wide <= info.max)), True,
                message=f"{op}: {name} must fit in int32")]):
            return tf.cast(wide, tf.int32)
    array = np.asarray(value)
    if array.dtype == np.int32:
        return tf.constant(array)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise invalid_value(name, "integer indices", received=f"{name} of dtype {array.dtype}")
    if array.size and (array.min() < np.iinfo(np.int32).min
                       or array.max() > np.iinfo(np.int32).max):
        raise invalid_value(name, "indices that fit in int32",
                            received=f"{name} with entries from {array.min()} to {array.max()}")
    return tf.constant(array.astype(np.int32).reshape(array.shape))


def _assert_in_range(index, limit, name, what):
    return tf.debugging.assert_equal(
        tf.reduce_all((index >= 0) & (index < limit)), True,
        message=f"sddmm: every entry of {name} must index {what}")
