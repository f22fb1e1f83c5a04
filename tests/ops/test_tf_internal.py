"""Guards the non-public TensorFlow API that tfsparse wraps in one file."""

import numpy as np
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.ops import _tf_internal


def test_csr_product_of_the_private_module_matches_numpy():
    dense = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]], np.float32)
    indices = np.array([[0, 0], [0, 2], [1, 2]], np.int64)
    csr = _tf_internal.csr_from_sorted_coo(
        indices, dense[indices[:, 0], indices[:, 1]], np.array([2, 3], np.int64)
    )
    b = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = _tf_internal.csr_matmul(csr, b, transpose_b=True, transpose_output=True)
    np.testing.assert_array_equal(got.numpy(), (dense @ b.T).T)


def test_export_context_is_detected_only_while_saving(tmp_path):
    seen = []
    module = tf.Module()
    module.f = tf.function(
        lambda: seen.append(_tf_internal.in_saved_model_export()) or tf.constant(1.0),
        input_signature=[],
    )
    assert not _tf_internal.in_saved_model_export()
    tf.saved_model.save(module, str(tmp_path))
    assert True in seen


def test_xla_context_is_detected_only_while_tracing_for_xla():
    seen = {}

    def probe(name):
        seen[name] = _tf_internal.in_xla_context()
        return tf.constant(1.0)

    assert not _tf_internal.in_xla_context()
    tf.function(lambda: probe("graph"))()
    tf.function(lambda: probe("xla"), jit_compile=True)()
    assert seen == {"graph": False, "xla": True}


def test_gradient_recording_is_detected_only_for_watched_tensors():
    x, other = tf.constant(1.0), tf.constant(2.0)
    assert not _tf_internal.gradient_may_be_recorded([x])
    with tf.GradientTape() as tape:
        tape.watch(x)
        assert _tf_internal.gradient_may_be_recorded([x, other])
        assert not _tf_internal.gradient_may_be_recorded([other])
    with tf.autodiff.ForwardAccumulator(x, tf.constant(1.0)):
        assert _tf_internal.gradient_may_be_recorded([x])


def test_untaped_read_is_one_op_only_where_nothing_can_record_it():
    variable = tf.Variable([1.0, 2.0])
    value = _tf_internal.read_untaped(variable)
    assert not isinstance(value, tf.Variable)
    np.testing.assert_array_equal(value.numpy(), [1.0, 2.0])
    variable.assign([3.0, 4.0])  # a read is never cached
    np.testing.assert_array_equal(_tf_internal.read_untaped(variable).numpy(), [3.0, 4.0])
    # Anywhere a read could be recorded or differs, the variable itself.
    with tf.GradientTape():
        assert _tf_internal.read_untaped(variable) is variable
    with tf.autodiff.ForwardAccumulator(tf.constant(1.0), tf.constant(1.0)):
        assert _tf_internal.read_untaped(variable) is variable
    seen = []
    tf.function(lambda: seen.append(_tf_internal.read_untaped(variable)))()
    assert seen == [variable]
    # A Keras mixed-precision weight (an AutoCastVariable) reads as float16.
    layer = keras.layers.Dense(1, dtype="mixed_float16")
    layer.build((None, 1))
    assert _tf_internal.read_untaped(layer.kernel) is layer.kernel
