"""2-D convolution with a sparse kernel, computed tap by tap on the nonzeros."""

import tensorflow as tf

from tfsparse._validation import check_positive_pair
from tfsparse._validation import invalid_value
from tfsparse._validation import one_of
from tfsparse.ops import _tf_internal
from tfsparse.ops import kernels
from tfsparse.ops.matmul import checked_last_dim
from tfsparse.ops.matmul import sparse_matmul
from tfsparse.ops.sddmm import use_compiled_kernels
from tfsparse.ops.tflite import in_tflite_compatible_scope


class _TapPattern:
    """The nonzeros of one kernel tap ``(i, j)``: a ``(cin, filters)`` pattern."""

    def __init__(self, rows, cols, shape):
        self.rows = rows
        self.cols = cols
        # Sorted by input then output: a stable sort of the column-major
        # nonzeros by their row.
        self.row_major_order = tf.argsort(rows, stable=True)
        self.shape = shape


def xla_supported():
    """Whether ``sparse_conv2d`` compiles under XLA (``jit_compile=True``) here.

    It does as a custom call to tfsparse's compiled CPU kernels: when they
    are built and enabled, no GPU is visible and no SavedModel is being
    exported. Without them XLA could only compile a convolution with the
    dense kernel, which tfsparse does not do.

    Example:
      >>> xla_supported() == (kernels.available() and not tf.config.list_logical_devices("GPU"))
      True
    """
    return _why_not_xla(use_kernel=None) is None


def _why_not_xla(use_kernel):
    """Why the compiled kernels cannot serve XLA here, or ``None`` if they can."""
    if use_kernel is False:
        return "use_kernel=False asks for TensorFlow's ops, which XLA cannot compile"
    if not kernels.available():
        return "tfsparse's compiled kernels are not available (not built, or disabled)"
    if _tf_internal.gpu_visible():
        return "a GPU is visible, and the kernels are the CPU's only"
    if _tf_internal.in_saved_model_export():
        return "an exported SavedModel holds core TensorFlow ops only"
    return None


def _output_size_and_padding(size, kernel, stride, dilation, padding):
    """Output size and the padding before/after of one spatial axis, as Conv2D."""
    extent = (kernel - 1) * dilation + 1
    if padding == "valid":  # no output where the window is wider than the input
        out = tf.maximum((size - extent) // stride + 1, 0)
        return out, 0, 0
    out = (size + stride - 1) // stride
    total = tf.maximum((out - 1) * stride + extent - size, 0)
    return out, total // 2, total - total // 2


def _checked_padding(padding):
    """``"valid"`` or ``"same"`` from either in any case (``tf.nn.conv2d`` takes "VALID")."""
    if isinstance(padding, str) and padding.lower() in ("valid", "same"):
        return padding.lower()
    raise invalid_value("padding", one_of(("valid", "same")) + " (any case)", padding)


def sparse_conv2d(x, values, pattern, kernel_size, strides=(1, 1), padding="valid",
                  dilation_rate=(1, 1), use_kernel=None, bias=None):
    """``conv2d(x, K) (+ bias)`` for a sparse kernel ``K`` of shape ``(kh, kw, cin, filters)``.

    ``K`` is given as its im2col matrix ``(kh * kw * cin, filters)`` (row
    ``(i * kw + j) * cin + c``), sparse with ``values`` at ``pattern`` as for
    ``sparse_matmul``. No dense kernel and no im2col buffer are allocated:

    * on CPU with tfsparse's compiled kernels (``use_kernel``), a direct
      sparse convolution: each output row segment of a filter is summed in
      registers over that filter's nonzeros (each a shifted input row times
      its value); the input gradient is the same sum over dy through the
      flipped kernel (split by the stride's phases, so only real terms are
      multiplied), the values gradient blocked dot products of the two.
      Each thread lays out one image's rows at a time in planar form;
    * otherwise (GPU, kernels off, exported SavedModels, which then hold core
      TensorFlow ops only) as a sum over the ``kh * kw`` taps of each tap's
      shifted input window ``[batch * out_h * out_w, cin]`` times the tap's
      sparse ``(cin, filters)`` slice, by ``sparse_matmul`` on TensorFlow's
      CSR kernels. Training keeps every tap's window for the gradient: ``kh *
      kw`` copies of the input, the size of an im2col buffer;
    * in functions XLA compiles (``jit_compile=True``) for the CPU, the same
      compiled kernels as XLA custom calls (on XLA's thread pool), when
      ``xla_supported()``; otherwise a ``ValueError`` says why (XLA
      could only compile the dense kernel; run it without ``jit_compile``).

    Both compute the same sums (in other orders); the gradients with
    respect to ``x``, ``values`` and ``bias`` are exact.

    Args:
      x: float tensor ``[batch, height, width, cin]`` (channels last; float16
        and bfloat16 are computed in float32 and returned in their own dtype;
        ``cin`` must be ``pattern.shape[0] / (kh * kw)``).
      values: float tensor ``[nnz]``, the nonzeros in pattern order.
      pattern: a ``SparsityPattern`` or any object with ``rows``, ``cols``,
        ``row_major_order`` and ``shape == (kh * kw * cin, filters)``.
      kernel_size, strides, dilation_rate: positive ints or pairs of them.
      padding: ``"valid"`` or ``"same"`` (any case), as ``tf.nn.conv2d``.
      use_kernel: ``True``/``False`` to force the compiled kernels or
        TensorFlow's ops; ``None`` for ``use_compiled_kernels()`` (under
        XLA, the compiled kernels; ``False`` is then an error).
      bias: optional float tensor ``[filters]``.

    Returns:
      A tensor ``[batch, out_h, out_w, filters]``.

    Example:
      >>> import numpy as np, scipy.sparse
      >>> from tfsparse.ops import SparsityPattern
      >>> pattern, values = SparsityPattern.from_scipy(
      ...     scipy.sparse.random(3 * 3 * 2, 4, density=0.3, format="csr", rng=0))
      >>> x = np.ones((1, 5, 5, 2), "float32")
      >>> sparse_conv2d(x, values.astype("float32"), pattern, (3, 3)).shape
      TensorShape([1, 3, 3, 4])
    """
    if in_tflite_compatible_scope():
        raise ValueError(
            "sparse_conv2d (SparseConv2D) has no form of TFLite builtin ops: it cannot be "
            "traced inside tflite_compatible() nor converted by to_tflite. Export the model "
            "as a SavedModel (tf.saved_model.save), or convert a copy whose SparseConv2D "
            "layers are Conv2D (kernel: SparseConv2D.to_dense()).")
    x = tf.convert_to_tensor(x)
    if x.dtype in (tf.float16, tf.bfloat16):
        # Sum the taps in float32 (as sparse_matmul does each tap), round once.
        y = sparse_conv2d(tf.cast(x, tf.float32), tf.cast(values, tf.float32), pattern,
                          kernel_size, strides, padding, dilation_rate, use_kernel,
                          None if bias is None else tf.cast(bias, tf.float32))
        return tf.cast(y, x.dtype)
    kernel_size = check_positive_pair("kernel_size", kernel_size)
    strides = check_positive_pair("strides", strides)
    dilation_rate = check_positive_pair("dilation_rate", dilation_rate)
    padding = _checked_padding(padding)
    kh, kw = kernel_size
    rows_total, filters = (int(s) for s in pattern.shape)
    if rows_total % (kh * kw):
        raise invalid_value(
            "pattern", f"an im2col pattern of kh * kw * cin rows, kernel_size={kernel_size}",
            received=f"pattern of shape {tuple(pattern.shape)}")
    cin = rows_total // (kh * kw)
    if x.shape.rank is not None and (x.shape.rank != 4 or x.shape[3] not in (None, cin)):
        # Another channel count was read with the pattern's rows taken for
        # other taps and channels (kernels) or its first channels (ops): two
        # different wrong answers, silently.
        raise invalid_value(
            "x", f"[batch, height, width, cin={cin}] (cin = pattern.shape[0] / (kh * kw), "
            f"pattern.shape={tuple(pattern.shape)}, kernel_size={kernel_size})",
            received=f"x of shape {x.shape}")
    x = checked_last_dim(x, cin, "sparse_conv2d: x must have cin = pattern.shape[0] / (kh * kw) "
                                 f"= {cin} channels")
    if _tf_internal.in_xla_context():
        reason = _why_not_xla(use_kernel)
        if reason is not None:
            raise ValueError(
                "sparse_conv2d compiles under XLA (jit_compile=True) only as a call to "
                f"tfsparse's compiled CPU kernels, and here {reason}. Run it without "
                "jit_compile (model.compile(..., jit_compile=False), the default).")
        use_kernel = True
    elif use_kernel is None:
        use_kernel = use_compiled_kernels()
    rows = tf.convert_to_tensor(pattern.rows, tf.int32)
    cols = tf.convert_to_tensor(pattern.cols, tf.int32)
    values = tf.convert_to_tensor(values, x.dtype)
    if use_kernel:
        return _compiled_conv2d(x, values, rows, cols, filters, kernel_size, strides, padding,
                                dilation_rate, bias)
    shape = tf.shape(x)
    out_h, top, bottom = _output_size_and_padding(
        shape[1], kh, strides[0], dilation_rate[0], padding)
    out_w, left, right = _output_size_and_padding(
        shape[2], kw, strides[1], dilation_rate[1], padding)
    if padding == "same":
        x = tf.pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]])
    tap_of = rows // cin
    # The input rows and columns a tap's window spans; none for an empty
    # output (unclamped, a negative end would count from the input's end).
    span_h = tf.maximum((out_h - 1) * strides[0] + 1, 0)
    span_w = tf.maximum((out_w - 1) * strides[1] + 1, 0)
    y = None
    for tap in range(kh * kw):
        i, j = divmod(tap, kw)
        window = tf.strided_slice(
            x,
            [0, i * dilation_rate[0], j * dilation_rate[1], 0],
            [shape[0], i * dilation_rate[0] + span_h, j * dilation_rate[1] + span_w, cin],
            [1, strides[0], strides[1], 1],
        )
        at = tf.reshape(tf.where(tf.equal(tap_of, tap)), [-1])  # column-major still
        tap_pattern = _TapPattern(
            tf.gather(rows, at) - tap * cin, tf.gather(cols, at), (cin, filters))
        product = sparse_matmul(
            tf.reshape(window, [-1, cin]), tf.gather(values, at), tap_pattern,
            use_kernel=use_kernel, bias=bias if tap == 0 else None,
        )
        y = product if y is None else y + product
    y = tf.reshape(y, tf.stack([shape[0], out_h, out_w, filters]))
    return y


def _compiled_conv2d(x, values, rows, cols, filters, kernel_size, strides, padding,
                     dilation_rate, bias):
    """On tfsparse's compiled direct sparse convolution (CPU), channels last.

    The kernels pad, and lay out the rows of one image at a time that they
    work on, themselves (sparse_conv.cc says what they allocate: per thread
    about one image's input and output); the bias is added in the forward
    pass, and its gradient summed with the values gradient. No tensor
    besides the outputs and gradients is allocated here.
    """
    library = kernels._library()  # noqa: SLF001  (the ops of sparse_conv.cc)
    attrs = dict(filters=filters, kernel_size=list(kernel_size), strides=list(strides),
                 dilations=list(dilation_rate), padding=padding.upper(), isa=kernels.isa())

    def forward(x, values, bias):
        return library.tfsparse_sparse_conv_forward(x, values, rows, cols, bias, **attrs)

    def gradients(x, values, dy):
        """``dx``, ``dvalues`` and ``dbias`` (computed alongside ``dvalues``)."""
        dx = library.tfsparse_sparse_conv_backprop_input(
            dy, values, rows, cols, tf.shape(x), **attrs)
        dvalues, dbias = library.tfsparse_sparse_conv_backprop_values(
            x, dy, rows, cols, **attrs)
        return dx, dvalues, dbias

    if bias is None:
        @tf.custom_gradient
        def conv(x, values):
            return (forward(x, values, tf.zeros([0], x.dtype)),
                    lambda dy: gradients(x, values, dy)[:2])

        return conv(x, values)

    @tf.custom_gradient
    def conv_with_bias(x, values, bias):
        return forward(x, values, bias), lambda dy: gradients(x, values, dy)

    return conv_with_bias(x, values, tf.cast(bias, x.dtype))
