"""Gradient compressors behind one contract, and error feedback.

``values, indices = compressor.compress(flat)`` keeps some elements of a 1-D
float tensor (int32 positions); ``compressor.decompress(values, indices, size)``
rebuilds the dense tensor. The SIDCo threshold estimators are plain functions
in `tfsparse.compression.thresholds`; `sidco_select` is SIDCo's hot path
(a fused compiled op on CPU, pure TensorFlow elsewhere).

Example:
  >>> import tensorflow as tf
  >>> from tfsparse.compression import TopK
  >>> compressor = TopK(0.5)
  >>> values, indices = compressor.compress(tf.constant([0.1, -3.0, 0.2, 2.0]))
  >>> compressor.decompress(values, indices, 4).numpy().tolist()
  [0.0, -3.0, 0.0, 2.0]
"""

from tfsparse.compression import thresholds
from tfsparse.compression.base import Compressor
from tfsparse.compression.dgc import DGC
from tfsparse.compression.error_feedback import ErrorFeedback
from tfsparse.compression.no_compression import NoCompression
from tfsparse.compression.random_k import RandomK
from tfsparse.compression.sidco import SIDCo
from tfsparse.compression.sidco_select import sidco_select
from tfsparse.compression.topk import TopK

__all__ = [
    "Compressor",
    "DGC",
    "ErrorFeedback",
    "NoCompression",
    "RandomK",
    "SIDCo",
    "TopK",
    "sidco_select",
    "thresholds",
]
