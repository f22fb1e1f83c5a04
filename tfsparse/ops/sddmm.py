"""SDDMM: a dense-dense product sampled at a sparse pattern."""

import tensorflow as tf

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
    x_t = tf.convert_to_tensor(x_t)
    if x_t.dtype in (tf.float16, tf.bfloat16):
        # The compiled kernel takes float32 and float64: accumulate in float32.
        out = sddmm(tf.cast(x_t, tf.float32), tf.cast(dy_t, tf.float32), rows, cols,
                    use_kernel)
        return tf.cast(out, x_t.dtype)
    dy_t = tf.convert_to_tensor(dy_t, dtype=x_t.dtype)
    rows = tf.convert_to_tensor(rows, dtype=tf.int32)
    cols = tf.convert_to_tensor(cols, dtype=tf.int32)
    if use_kernel is None:
        use_kernel = use_compiled_kernels()
    if use_kernel:
        return kernels.sddmm(x_t, dy_t, rows, cols)
    return tf.reduce_sum(tf.gather(x_t, rows) * tf.gather(dy_t, cols), axis=1)
