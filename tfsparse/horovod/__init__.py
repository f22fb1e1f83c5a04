"""Compressed gradient exchange for Horovod, without patching Horovod.

`DistributedOptimizer(optimizer, compression=...)` wraps a tf_keras optimizer
with Horovod's arguments; `CompressedExchange` (compress, allgather, combine)
and `GradientAccumulator` (``backward_passes_per_step``) are the
framework-neutral parts it is built on; `MetricAverageCallback` is Horovod's,
given the Keras 2 backend it needs when Keras 3 is installed too.

Example:
  >>> import horovod.tensorflow.keras as hvd
  >>> import numpy as np
  >>> from tfsparse import keras
  >>> from tfsparse.horovod import MetricAverageCallback
  >>> hvd.init()
  >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  >>> model.compile(optimizer="sgd", loss="mse")
  >>> history = model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0,
  ...                     callbacks=[MetricAverageCallback()])  # loss averaged over ranks
  >>> sorted(history.history)
  ['loss']
"""

from tfsparse.horovod.accumulation import GradientAccumulator
from tfsparse.horovod.exchange import CompressedExchange
from tfsparse.horovod.metric_average import MetricAverageCallback
from tfsparse.horovod.optimizer import DistributedOptimizer

__all__ = [
    "CompressedExchange",
    "DistributedOptimizer",
    "GradientAccumulator",
    "MetricAverageCallback",
]
