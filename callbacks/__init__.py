"""Keras callbacks of tfsparse: a top-level package beside ``tfsparse``.

Callbacks drive tfsparse's procedures from ``model.fit``: they import
``tfsparse``, never the reverse, so the library works without them.

- ``FSSL``: the structured-sparsity schedule (group-lasso training, removal of
  groups under a threshold, fine-tuning without the penalty).
- ``DynamicSparsity``: SET and RigL, patterns that move during training.
- ``CompressionMonitor``: records what gradient compression achieves under
  ``tfsparse.horovod.DistributedOptimizer`` (ratio, estimation quality,
  stages, time, bytes) to the History, TensorBoard and a PNG plot.

Example:
    >>> import callbacks
    >>> sorted(callbacks.__all__)
    ['CompressionMonitor', 'DynamicSparsity', 'FSSL']
"""

from callbacks.compression_monitor import CompressionMonitor
from callbacks.dynamic_sparsity import DynamicSparsity
from callbacks.fssl import FSSL

__all__ = [
    "CompressionMonitor",
    "DynamicSparsity",
    "FSSL",
]
