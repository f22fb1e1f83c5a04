"""sparse_conv2d under XLA (jit_compile=True): custom calls to the compiled kernels.

The results against tf.nn.conv2d are in test_conv.py (its ``xla-*`` cases);
here: what XLA compiles, where it cannot, and the errors.
"""

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.layers import SparseConv2D
from tfsparse.ops import SparsityPattern
from tfsparse.ops import conv
from tfsparse.ops import kernels
from tfsparse.ops.conv import sparse_conv2d

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason="compiled kernels not built (python -m tfsparse.ops.build)")


def _layer_case(cin=8, filters=6, density=0.3):
    pattern, values = SparsityPattern.from_scipy(scipy.sparse.random(
        3 * 3 * cin, filters, density=density, format="csr", random_state=0))
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((2, 10, 10, cin)), tf.float32)
    return x, tf.Variable(values.astype(np.float32)), pattern


def _training_step(pattern, values, bias):
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = sparse_conv2d(x, values, pattern, (3, 3), (1, 1), "same", bias=bias)
            loss = tf.reduce_sum(y * y)
        return (y, *tape.gradient(loss, [x, values, bias]))
    return step


def test_training_step_compiles_to_the_kernels_custom_calls_without_a_dense_kernel():
    x, values, pattern = _layer_case(cin=8, filters=6)
    bias = tf.Variable(tf.ones([6]))
    step = tf.function(_training_step(pattern, values, bias), jit_compile=True)
    hlo = step.experimental_get_compiler_ir(x)(stage="optimized_hlo")
    assert set(re.findall(r'custom_call_target="(\w+)"', hlo)) == {
        "tfsparse_sparse_conv_forward", "tfsparse_sparse_conv_backprop_input",
        "tfsparse_sparse_conv_backprop_values"}
    assert "convolution(" not in hlo
    # No array of the dense kernel's size (3 * 3 * 8 * 6 elements, in any
    # shape: the values are 3 * 3 * 8 * 6 * 0.3 of them).
    shapes = re.findall(r"f32\[([\d,]*)\]", hlo)
    sizes = {int(np.prod([int(d) for d in s.split(",") if d])) for s in shapes}
    assert 3 * 3 * 8 * 6 not in sizes
    # And it computes what the eager kernels compute, bit for bit (the same
    # kernels on the same inputs).
    for got, want in zip(step(x), tf.function(_training_step(pattern, values, bias))(x)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_jit_compile_with_use_kernel_false_is_an_error_naming_jit_compile():
    x, values, pattern = _layer_case()
    compiled = tf.function(
        lambda x: sparse_conv2d(x, values, pattern, (3, 3), use_kernel=False), jit_compile=True)
    with pytest.raises(ValueError, match=r"jit_compile.*use_kernel=False"):
        compiled(x)


def test_without_the_kernels_xla_is_an_error_for_the_op_and_the_layer(monkeypatch):
    monkeypatch.setattr(kernels, "available", lambda: False)
    assert not conv.xla_supported()
    x, values, pattern = _layer_case()
    compiled = tf.function(lambda x: sparse_conv2d(x, values, pattern, (3, 3)),
                           jit_compile=True)
    with pytest.raises(ValueError, match="not available.*jit_compile=False"):
        compiled(x)
    model = keras.Sequential([keras.Input((6, 6, 2)), SparseConv2D(4, 3, density=0.5, seed=0),
                              keras.layers.Flatten()])
    model.compile("sgd", "mse", jit_compile=True)
    with pytest.raises(ValueError, match="not available"):
        model.fit(np.ones((4, 6, 6, 2)), np.zeros((4, 64)), verbose=0)
    model.compile("sgd", "mse")
    model.fit(np.ones((4, 6, 6, 2)), np.zeros((4, 64)), verbose=0)  # the TensorFlow path


def test_bad_nonzeros_are_reported_from_the_custom_call():
    x, values, _ = _layer_case(cin=8, filters=6)
    outside = SparsityPattern.from_coo([3 * 3 * 8 - 1], [0], (3 * 3 * 8, 6))
    # The pattern claims 8 input channels; x has 4: row 71 is past 3 * 3 * 4.
    # (A channel count known when tracing is refused before any op runs,
    # tests/ops/test_conv.py; here it is known to XLA only.)
    compiled = tf.function(lambda x: sparse_conv2d(x, values[:1], outside, (3, 3)),
                           jit_compile=True,
                           input_signature=[tf.TensorSpec([2, 10, 10, None], tf.float32)])
    with pytest.raises(tf.errors.OpError, match=r"outside the im2col kernel of shape \(36, 6\)"):
        compiled(x[..., :4])


def test_kernels_loaded_after_xla_has_compiled_still_compile():
    # XLA registers its ops' compilation kernels at its first compilation; the
    # library registers its own whenever it loads (sparse_conv_xla.cc).
    script = textwrap.dedent("""
        import numpy as np, scipy.sparse, tensorflow as tf
        assert tf.function(lambda x: x * 2.0, jit_compile=True)(tf.ones([2])).numpy().tolist() == [2.0, 2.0]
        from tfsparse.ops import SparsityPattern
        from tfsparse.ops.conv import sparse_conv2d
        pattern, values = SparsityPattern.from_scipy(
            scipy.sparse.random(9 * 2, 3, density=0.5, format="csr", random_state=0))
        x = tf.ones([1, 4, 4, 2])
        f = lambda x: sparse_conv2d(x, values.astype("float32"), pattern, (3, 3))
        np.testing.assert_array_equal(tf.function(f, jit_compile=True)(x), f(x))
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("input_shape, dy_shape", [
    ([1, -5, 3, 1], [1, 0, 1, 2]),  # a negative size: TensorShape aborted the process
    ([2**31 - 1, 2**31 - 1, 1, 2**31 - 1], [2**31 - 1, 2**31 - 3, 0, 2]),  # past int64
    ([1, 5, 5], [1, 3, 3, 2]),
])
def test_input_gradient_rejects_an_input_shape_it_cannot_allocate(jit_compile, input_shape,
                                                                  dy_shape):
    # The raw op with an input_shape no tensor can have. Run eagerly it gets
    # the dy that input_shape implies (no elements to read), which the op
    # accepted before allocating. Compiled, the check is at compile time and
    # any dy will do (XLA itself crashes on an empty tensor with dimensions
    # as large as the second case's).
    def input_gradient(dy):
        return kernels._library().tfsparse_sparse_conv_backprop_input(
            dy=dy, values=tf.zeros([0]), rows=tf.zeros([0], tf.int32),
            cols=tf.zeros([0], tf.int32), input_shape=tf.constant(input_shape, tf.int32),
            filters=2, kernel_size=[3, 3], strides=[1, 1], dilations=[1, 1], padding="VALID")

    dy = tf.zeros([1, 3, 3, 2] if jit_compile else dy_shape)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input_shape must be 4 sizes >= 0 whose product fits int64, got \["):
        tf.function(input_gradient, jit_compile=jit_compile)(dy)
