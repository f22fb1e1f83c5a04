"""Export of models with sparse layers to where tfsparse is not installed.

A plain ``tf.saved_model.save`` already writes graphs of core TensorFlow ops
(TensorFlow's CSR kernels) that serve without tfsparse. For TFLite, which has
no CSR op, ``to_tflite(model)`` converts with builtin ops only, and
``tflite_compatible()`` makes ``tf.saved_model.save`` (or
``tf.lite.TFLiteConverter.from_keras_model``) trace that form.
"""

from tfsparse.export.tflite import to_tflite
from tfsparse.ops.tflite import tflite_compatible

__all__ = [
    "tflite_compatible",
    "to_tflite",
]
