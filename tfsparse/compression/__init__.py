"""Gradient compressors behind one contract, and error feedback.

``values, indices = compressor.compress(flat)`` keeps some elements of a 1-D
float tensor (int32 positions); ``compressor.decompress(values, indices, size)``
rebuilds the dense tensor. The SIDCo threshold estimators are plain functions
in `tfsparse.compression.thresholds`; `sidco_select` is SIDCo's hot path
(a fused compiled op on CPU, pure TensorFlow elsewhere).

Example:
  >>> import numpy as np
  >>> import tensorflow as tf
  >>> from tfsparse.compression import SIDCo, TopK
  >>> gradient = tf.constant(np.random.default_rng(0).laplace(size=100_000), tf.float32)
  >>> exact = int(tf.size(TopK(0.01).compress(gradient)[0]))  # sorts to find the top 1%
  >>> estimated = int(tf.size(SIDCo(0.01).compress(gradient)[0]))  # fits a threshold instead
  >>> exact, 0.5 * exact <= estimated <= 2 * exact
  (1000, True)
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
