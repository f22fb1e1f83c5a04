"""sparse_conv2d and its gradients against tf.nn.conv2d with the masked dense kernel."""

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from kernel_paths import PATHS
from kernel_paths import VARIANTS
from tfsparse.ops import SparsityPattern
from tfsparse.ops import kernels
from tfsparse.ops.conv import sparse_conv2d


def _kernel(kh, kw, cin, filters, seed=0):
    """A random sparse kernel with an empty filter and an empty input channel."""
    rng = np.random.default_rng(seed)
    shape = (kh, kw, cin, filters)
    kernel = rng.standard_normal(shape) * (rng.random(shape) < 0.4)
    kernel[..., 1] = 0  # a filter with no nonzeros
    kernel[:, :, 0, :] = 0  # an input channel that feeds nothing
    kernel[0, 0, 1, 0] = 0.5
    return kernel


def _reference(x, kernel, dy, strides, padding, dilation):
    """float64 output and gradients of tf.nn.conv2d with the dense kernel.

    TensorFlow's CPU gradients take no dilation: the dilated kernel is written
    out (zeros between the taps), the same convolution with dilation 1.
    """
    kh, kw, cin, filters = kernel.shape
    dilated = np.zeros(((kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1, cin, filters))
    dilated[::dilation[0], ::dilation[1]] = kernel
    x, dilated, dy = (tf.constant(a, tf.float64) for a in (x, dilated, dy))
    with tf.GradientTape() as tape:
        tape.watch([x, dilated])
        y = tf.nn.conv2d(x, dilated, [1, *strides, 1], padding.upper())
    dx, dkernel = tape.gradient(y, [x, dilated], output_gradients=dy)
    dkernel = dkernel.numpy()[::dilation[0], ::dilation[1]]
    return y.numpy(), dx.numpy(), dkernel, tf.reduce_sum(dy, [0, 1, 2]).numpy()


_GEOMETRIES = [
    pytest.param(strides, padding, dilation, size, batch,
                 id=f"s{strides}-{padding}-d{dilation}-{size[0]}x{size[1]}-b{batch}")
    for strides in (1, 2)
    for padding in ("valid", "same")
    for dilation in (1, 2)
    for size, batch in (((7, 9), 1), ((8, 6), 3))
]


def _eager(function):
    return function


def _xla(function):
    return tf.function(function, jit_compile=True)


# The compiled variants and TensorFlow's CSR path (eager), and each compiled
# variant as XLA's custom calls (jit_compile).
_RUNS = [pytest.param(path.values[0], _eager, id=path.id, marks=path.marks) for path in PATHS] + [
    pytest.param(None, _xla, id=f"xla-{variant.values[0]}", marks=variant.marks)
    for variant in VARIANTS]


@pytest.mark.parametrize("use_kernel,compile_with", _RUNS)
@pytest.mark.parametrize("strides,padding,dilation,size,batch", _GEOMETRIES)
def test_output_and_gradients_equal_dense_conv2d(use_kernel, compile_with, strides, padding,
                                                 dilation, size, batch):
    _check_against_dense_conv2d(use_kernel, compile_with, strides, padding, dilation, size,
                                batch, (3, 2, 3, 4))


@pytest.mark.parametrize("use_kernel,compile_with", _RUNS)
# An empty batch (the input gradient divided by it), and with "same",
# dilated windows wider than the input (11 > 7 rows; 7 > 4) that pad past it.
@pytest.mark.parametrize("padding,size,batch,dilation", [
    ("valid", (7, 9), 0, 1), ("same", (7, 9), 0, 1), ("same", (7, 9), 2, 5),
    ("same", (4, 4), 1, 3)])
def test_empty_batches_and_windows_wider_than_the_input_equal_dense_conv2d(
        use_kernel, compile_with, padding, size, batch, dilation):
    _check_against_dense_conv2d(use_kernel, compile_with, 1, padding, dilation, size, batch,
                                (3, 2, 3, 4))


@pytest.mark.parametrize("use_kernel,compile_with", _RUNS)
@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("strides", [(7, 9), (1000, 1000)])
def test_strides_as_long_as_the_input_or_longer_equal_dense_conv2d(use_kernel, compile_with,
                                                                   padding, strides):
    # One output pixel; the input gradient's stride phases past the input
    # have no pixels of dx, and it no longer makes them.
    _check_against_dense_conv2d(use_kernel, compile_with, strides, padding, 1, (7, 9), 2,
                                (3, 2, 3, 4))


@pytest.mark.parametrize("variant", VARIANTS)
def test_input_gradient_of_a_stride_of_2_to_the_31_equals_tensorflows_path(variant):
    # It made one stride phase per row of the stride (2**31 - 1: the process
    # crashed); now only the phases with pixels. (A column stride that long
    # would give the values gradient's planar copy as many column phases: an
    # error naming kernel_size, strides and dilations.)
    pattern, values = SparsityPattern.from_scipy(
        scipy.sparse.csr_matrix(_kernel(3, 2, 3, 4).reshape(-1, 4)))
    x = tf.constant(np.random.default_rng(3).standard_normal((2, 7, 9, 3)), tf.float32)
    dy = tf.constant(np.random.default_rng(4).standard_normal((2, 1, 2, 4)), tf.float32)

    def input_gradient(use_kernel):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = sparse_conv2d(x, tf.constant(values, tf.float32), pattern, (3, 2),
                              (2**31 - 1, 5), "same", use_kernel=use_kernel)
        return tape.gradient(y, x, output_gradients=dy).numpy()

    # One output row of two pixels five apart: each element of dx sums at
    # most the 4 filters' products of O(1) terms, float32: within 1e-5.
    np.testing.assert_allclose(input_gradient(True), input_gradient(False), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_kernel,compile_with", _RUNS)
@pytest.mark.parametrize("size,dilation", [((7, 9), 5), ((4, 4), 3), ((2, 5), 1)])
@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
def test_valid_windows_wider_than_the_input_give_no_output_and_zero_gradients(
        use_kernel, compile_with, size, dilation, strides):
    # tf.nn.conv2d raises for these (a negative output size); every path
    # here gives the empty output, and x and the values feed nothing. With
    # strides, TensorFlow's path sliced a window for the first tap from a
    # negative end (counted from the input's end): a shape error.
    pattern, values = SparsityPattern.from_scipy(
        scipy.sparse.csr_matrix(_kernel(3, 2, 3, 4).reshape(-1, 4)))
    x = tf.constant(np.ones((2, *size, 3)), tf.float32)
    values = tf.constant(values, tf.float32)

    def run(x, values):
        with tf.GradientTape() as tape:
            tape.watch([x, values])
            y = sparse_conv2d(x, values, pattern, (3, 2), strides, "valid",
                              (dilation, dilation), use_kernel=use_kernel)
            total = tf.reduce_sum(y)
        return y, tape.gradient(total, [x, values])

    y, (dx, dvalues) = compile_with(run)(x, values)
    assert y.shape[0] == 2 and y.shape[3] == 4 and y.shape[1] * y.shape[2] == 0
    np.testing.assert_array_equal(dx.numpy(), np.zeros(x.shape))
    np.testing.assert_array_equal(tf.convert_to_tensor(dvalues).numpy(), np.zeros(values.shape))


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("strides,padding", [(1, "same"), (1, "valid"), (2, "same"),
                                             (2, "valid")])
def test_wide_layers_equal_dense_conv2d(use_kernel, strides, padding, dilation):
    # Rows and channels wider than a vector (and not multiples of one): the
    # compiled kernels' block transposes, their edges, several vectors per
    # output row (the forward pass interleaves their columns across the
    # lanes, the last lanes of each vector partly past the row) and taps
    # that land in other vectors.
    _check_against_dense_conv2d(use_kernel, _eager, strides, padding, dilation, (9, 37), 2,
                                (3, 3, 21, 18))


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("padding,dilation", [("valid", 1), ("valid", 2), ("same", 1)])
def test_rows_of_whole_vectors_equal_dense_conv2d(use_kernel, padding, dilation):
    # 34 columns, valid 3x3: 32 output columns (30 dilated), which fill each
    # variant's vectors, so the forward pass's vectors past the span (each
    # its predecessor moved one lane down) take their last lane from a pixel
    # of the image, not from the padding.
    _check_against_dense_conv2d(use_kernel, _eager, 1, padding, dilation, (6, 34), 2,
                                (3, 3, 19, 6))


@pytest.mark.parametrize("use_kernel", PATHS)
def test_outputs_larger_than_the_caches_equal_dense_conv2d(use_kernel):
    # 8 MiB outputs and input gradients: the compiled kernels store them past
    # the caches (non-temporal stores) when they exceed 1 MiB per thread.
    _check_against_dense_conv2d(use_kernel, _eager, 1, "same", 1, (128, 128), 4,
                                (3, 3, 32, 32))


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("strides,padding,kernel_size", [
    ((1, 2), "same", (3, 3)), ((3, 2), "valid", (3, 2)), ((2, 2), "same", (1, 1)),
    ((3, 3), "same", (2, 4))])
def test_strided_input_gradient_equals_dense_conv2d(use_kernel, strides, padding, kernel_size):
    # The compiled input gradient computes each stride phase of dx (every
    # stride-th row and column) from the taps that reach it: unequal strides,
    # phases of unequal sizes, and phases no tap reaches (a 1x1 kernel with
    # stride 2, two taps with stride 3), whose dx is zero.
    _check_against_dense_conv2d(use_kernel, _eager, strides, padding, 1, (7, 8), 2,
                                (*kernel_size, 3, 5))


@pytest.mark.parametrize("use_kernel,compile_with", _RUNS)
@pytest.mark.parametrize("strides", [1, 2])
def test_float64_layers_equal_dense_conv2d(use_kernel, compile_with, strides):
    # The compiled kernels' double-precision code (other vector widths and
    # block transposes than float32's) on wide rows and channels.
    _check_against_dense_conv2d(use_kernel, compile_with, strides, "same", 1, (9, 37), 2,
                                (3, 3, 21, 18), dtype=tf.float64)


def _check_against_dense_conv2d(use_kernel, compile_with, strides, padding, dilation, size,
                                batch, kernel_shape, dtype=tf.float32):
    kh, kw, cin, filters = kernel_shape
    kernel = _kernel(kh, kw, cin, filters)
    pattern, values = SparsityPattern.from_scipy(
        scipy.sparse.csr_matrix(kernel.reshape(-1, filters)))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, *size, cin))
    strides = strides if isinstance(strides, tuple) else (strides, strides)
    dilation = (dilation, dilation)
    bias = rng.standard_normal(filters)
    x_t, values_t, bias_t = (tf.constant(a, dtype) for a in (x, values, bias))

    def run(x_t, values_t, bias_t, dy):
        with tf.GradientTape() as tape:
            tape.watch([x_t, values_t, bias_t])
            y = sparse_conv2d(x_t, values_t, pattern, (kh, kw), strides, padding, dilation,
                              use_kernel=use_kernel, bias=bias_t)
        return y, tape.gradient(y, [x_t, values_t, bias_t], output_gradients=dy)

    out_shape = sparse_conv2d(x_t, values_t, pattern, (kh, kw), strides, padding,
                              dilation, use_kernel=False).shape
    dy = rng.standard_normal(out_shape)
    y, (dx, dvalues, dbias) = compile_with(run)(x_t, values_t, bias_t,
                                               tf.constant(dy, dtype))
    expected = _reference(x, kernel, dy, strides, padding, dilation)
    # Each result is a float32 sum of at most n terms, n the longest of the
    # forward (kh*kw*cin), input-gradient (kh*kw*filters) and kernel-gradient
    # (batch*out_h*out_w) sums: it is off by at most n * eps * the sum of the
    # terms' magnitudes, which the same reference computes on |x|, |K|, |dy|.
    # In float64 the reference's own error is as large: twice that.
    n = max(kh * kw * cin, kh * kw * filters, int(np.prod(dy.shape[:3]))) + 1
    magnitude = _reference(np.abs(x), np.abs(kernel), np.abs(dy), strides, padding, dilation)
    eps = np.finfo(dtype.as_numpy_dtype).eps * (2 if dtype == tf.float64 else 1)
    rows, cols = np.asarray(pattern.rows), np.asarray(pattern.cols)
    results = [y.numpy() - bias, dx.numpy(), tf.convert_to_tensor(dvalues).numpy(),
               dbias.numpy()]
    wanted = [expected[0], expected[1], expected[2].reshape(-1, filters)[rows, cols],
              expected[3]]
    bounds = [magnitude[0] + np.abs(bias), magnitude[1],
              magnitude[2].reshape(-1, filters)[rows, cols], magnitude[3]]
    for result, want, bound in zip(results, wanted, bounds):
        assert result.shape == want.shape
        assert np.all(np.abs(result - want) <= n * eps * bound + 1e-30)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("strides", [1, 2])
def test_input_gradient_of_non_finite_values_equals_the_tensorflow_path(use_kernel, strides):
    # An inf value reaches the input gradient only through the pixels its
    # window covers; the padding must not add 0 * inf = NaN terms.
    kh, kw, cin, filters = 3, 3, 2, 3
    kernel = _kernel(kh, kw, cin, filters, seed=4)
    kernel[1, 0, 1, 2] = np.inf
    pattern, values = SparsityPattern.from_scipy(
        scipy.sparse.csr_matrix(kernel.reshape(-1, filters)))
    rng = np.random.default_rng(5)
    x = tf.constant(rng.standard_normal((2, 7, 6, cin)), tf.float32)
    values = tf.constant(values, tf.float32)

    def input_gradient(use):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = sparse_conv2d(x, values, pattern, (kh, kw), (strides, strides), "same",
                              use_kernel=use)
        return tape.gradient(y, x, output_gradients=tf.ones_like(y)).numpy()

    dx, expected = input_gradient(use_kernel), input_gradient(False)
    np.testing.assert_array_equal(np.isfinite(dx), np.isfinite(expected))
    assert np.any(np.isinf(expected)) and not np.any(np.isnan(expected))
    np.testing.assert_array_equal(dx[np.isinf(dx)], expected[np.isinf(expected)])
    finite = np.isfinite(expected)
    # float32 sums of at most kh * kw * filters = 27 O(1) products.
    np.testing.assert_allclose(dx[finite], expected[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_values_gradient_reads_only_each_nonzeros_window(use_kernel):
    # An inf input pixel reaches the gradient of exactly the nonzeros whose
    # window holds it (one term each: +-inf); the others stay finite.
    kh, kw, cin, filters = 3, 3, 2, 3
    kernel = _kernel(kh, kw, cin, filters, seed=2)
    kernel[0, 2, 1, 0] = 0.7  # the one tap whose window holds the corner below
    pattern, values = SparsityPattern.from_scipy(
        scipy.sparse.csr_matrix(kernel.reshape(-1, filters)))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 7, cin))
    x[1, 0, 6, 1] = np.inf  # a corner: outside most taps' windows
    x32, values32 = tf.constant(x, tf.float32), tf.constant(values, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(values32)
        y = sparse_conv2d(x32, values32, pattern, (kh, kw), use_kernel=use_kernel)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dvalues = tf.convert_to_tensor(tape.gradient(y, values32, output_gradients=dy)).numpy()
    out_h, out_w = y.shape[1:3]
    expected = []
    for row, col in zip(pattern.rows, pattern.cols):
        (i, j), c = divmod(int(row) // cin, kw), int(row) % cin
        window = x[:, i:i + out_h, j:j + out_w, c]
        expected.append(np.sum(window * dy[..., col].astype(np.float64)))
    expected = np.array(expected)
    np.testing.assert_array_equal(np.isfinite(dvalues), np.isfinite(expected))
    assert not np.all(np.isfinite(expected)) and np.any(np.isfinite(expected))
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.sign(dvalues[~finite]), np.sign(expected[~finite]))
    # float32 sums of 2*4*5 = 40 products of O(1) terms.
    np.testing.assert_allclose(dvalues[finite], expected[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_forward_op_on_an_input_without_channels_gives_the_bias(variant):
    # No input channels, so no nonzeros: y is the bias (the op divided by the
    # channel count). The raw op: a SparsityPattern has at least one row.
    y = kernels._library().tfsparse_sparse_conv_forward(
        tf.zeros([2, 5, 6, 0]), tf.zeros([0]), tf.zeros([0], tf.int32), tf.zeros([0], tf.int32),
        tf.constant([1.0, -2.0, 0.5, 3.0]), filters=4, kernel_size=[3, 3], strides=[1, 1],
        dilations=[1, 1], padding="SAME", isa=kernels.isa())
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to([1.0, -2.0, 0.5, 3.0], (2, 5, 6, 4)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("pass_name", ["forward", "backprop_input", "backprop_values"])
def test_a_dilation_far_past_the_input_is_an_error_naming_it(variant, pass_name):
    # A 2**29 dilation with "same" padding: each thread's planar copy of its
    # input would be ~2**30 rows (the process crashed writing past a buffer).
    # Each pass's op on its own ("same": dy has x's 5 x 5 pixels).
    library = kernels._library()
    rows, cols = tf.constant([0, 4, 17], tf.int32), tf.constant([0, 1, 2], tf.int32)
    x, dy, values = tf.ones([1, 5, 5, 2]), tf.ones([1, 5, 5, 3]), tf.ones([3])
    attrs = dict(filters=3, kernel_size=[3, 3], strides=[1, 1], dilations=[2**29, 1],
                 padding="SAME", isa=kernels.isa())
    passes = {
        "forward": lambda: library.tfsparse_sparse_conv_forward(
            x, values, rows, cols, tf.zeros([0]), **attrs),
        "backprop_input": lambda: library.tfsparse_sparse_conv_backprop_input(
            dy, values, rows, cols, tf.constant([1, 5, 5, 2]), **attrs),
        "backprop_values": lambda: library.tfsparse_sparse_conv_backprop_values(
            x, dy, rows, cols, **attrs),
    }
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="kernel_size, strides and dilations: each thread's planar copy"):
        passes[pass_name]()


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_dilated_kernel_past_int32_is_an_error_naming_it(variant):
    # (2**20 - 1) * 2**20 + 1 pixels: the planar layouts' sizes overflowed
    # int64 and the forward pass ran on (it did not return in 15 minutes).
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"kernel_size and dilations: the dilated kernel, \(kernel_size - 1\) "
                             r"\* dilations \+ 1 = 1099510579201 pixels along axis 0, must be at "
                             r"most 2\*\*31 - 1"):
        kernels._library().tfsparse_sparse_conv_forward(
            tf.ones([1, 4, 4, 2]), tf.zeros([0]), tf.zeros([0], tf.int32),
            tf.zeros([0], tf.int32), tf.zeros([0]), filters=2, kernel_size=[2**20, 3],
            strides=[1, 1], dilations=[2**20, 1], padding="SAME", isa=kernels.isa())


def _sparse(kh, kw, cin, filters):
    pattern, values = SparsityPattern.from_scipy(
        scipy.sparse.csr_matrix(_kernel(kh, kw, cin, filters).reshape(-1, filters)))
    return pattern, values.astype(np.float32)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_an_input_of_another_channel_count_is_an_error_naming_x(use_kernel):
    # Three channels for a two-channel pattern gave two different wrong
    # answers (the kernels read the pattern's rows as other taps and
    # channels, the ops its first two channels), up to 4.1 apart.
    pattern, values = _sparse(3, 3, 2, 4)
    for channels in (3, 1):
        x = np.ones((1, 6, 6, channels), np.float32)
        with pytest.raises(ValueError, match=r'"x", expected \[batch, height, width, cin=2\]'):
            sparse_conv2d(x, values, pattern, (3, 3), use_kernel=use_kernel)
    with pytest.raises(ValueError, match=r'"pattern", expected an im2col pattern of kh \* kw'):
        sparse_conv2d(np.ones((1, 6, 6, 2), np.float32), values, pattern, (2, 2),
                      use_kernel=use_kernel)
    convolve = tf.function(
        lambda x: sparse_conv2d(x, values, pattern, (3, 3), use_kernel=use_kernel),
        input_signature=[tf.TensorSpec([None, None, None, None], tf.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="x must have cin = .* = 2 channels"):
        convolve(tf.ones((1, 6, 6, 3)))


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("padding", ["VALID", "Same", "same"])
def test_padding_in_any_case_and_int_sizes_equal_dense_conv2d(use_kernel, padding):
    # tf.nn.conv2d's "VALID" and "SAME": the ops' path took anything but
    # "valid" for "same" and padded only for "same" (a shape error).
    pattern, values = _sparse(3, 3, 2, 4)
    x = np.random.default_rng(1).standard_normal((2, 6, 7, 2)).astype(np.float32)
    got = sparse_conv2d(x, values, pattern, 3, strides=2, padding=padding, dilation_rate=1,
                        use_kernel=use_kernel)
    kernel = pattern.to_scipy(values).toarray().reshape(3, 3, 2, 4)
    want = tf.nn.conv2d(x.astype(np.float64), kernel.astype(np.float64), 2, padding.upper())
    np.testing.assert_allclose(got, want, rtol=0, atol=18 * 4 * np.finfo(np.float32).eps)
    with pytest.raises(ValueError, match=r'"padding", expected one of .valid., .same. \(any case\)'):
        sparse_conv2d(x, values, pattern, 3, padding="full", use_kernel=use_kernel)
    with pytest.raises(ValueError, match=r'"strides", expected a positive integer or a pair'):
        sparse_conv2d(x, values, pattern, 3, strides=(1, 2, 3), use_kernel=use_kernel)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_gradient_of_the_convolutions_gradient_is_a_clear_error(variant):
    pattern, values = _sparse(3, 3, 2, 4)
    weights = tf.Variable(values)
    x = tf.constant(np.ones((1, 5, 5, 2), np.float32))
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner.watch(x)
            loss = tf.reduce_sum(sparse_conv2d(x, weights, pattern, 3, use_kernel=True) ** 2)
        penalty = tf.reduce_sum(inner.gradient(loss, x) ** 2)
    with pytest.raises(LookupError, match="a gradient of the convolution's gradient .* is not "
                                          "supported yet"):
        outer.gradient(penalty, weights)
