"""Export of models with sparse layers to where tfsparse is not installed.

A plain ``tf.saved_model.save`` already writes graphs of core TensorFlow ops
(TensorFlow's CSR kernels) that serve without tfsparse. For TFLite, which has
no CSR op, ``to_tflite(model)`` converts with builtin ops only, and
``tflite_compatible()`` makes ``tf.saved_model.save`` (or
``tf.lite.TFLiteConverter.from_keras_model``) trace that form.

Example:
  >>> import numpy as np, tensorflow as tf
  >>> from tfsparse import SparseDense, keras
  >>> from tfsparse.export import to_tflite
  >>> model = keras.Sequential([keras.Input((8,)), SparseDense(4, density=0.5, seed=0)])
  >>> flatbuffer = to_tflite(model)
  >>> interpreter = tf.lite.Interpreter(model_content=flatbuffer)
  >>> interpreter.allocate_tensors()
  >>> x = np.ones((1, 8), np.float32)
  >>> interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
  >>> interpreter.invoke()
  >>> y = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
  >>> bool(np.allclose(y, model.predict(x, verbose=0), atol=1e-5))
  True
"""

from tfsparse.export.tflite import to_tflite
from tfsparse.ops.tflite import tflite_compatible

__all__ = [
    "tflite_compatible",
    "to_tflite",
]
