"""Compressed gradient exchange for Horovod, without patching Horovod.

`DistributedOptimizer(optimizer, compression=...)` wraps a tf_keras optimizer
with Horovod's arguments; `CompressedExchange` (compress, allgather, combine)
and `GradientAccumulator` (``backward_passes_per_step``) are the
framework-neutral parts it is built on; `MetricAverageCallback` is Horovod's,
given the Keras 2 backend it needs when Keras 3 is installed too.
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
