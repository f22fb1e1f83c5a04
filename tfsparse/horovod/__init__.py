"""Compressed gradient exchange for Horovod, without patching Horovod.

`DistributedOptimizer(optimizer, compressor)` wraps a tf_keras optimizer;
`CompressedExchange` is the framework-neutral part (compress, allgather,
average) it is built on; `MetricAverageCallback` is Horovod's, given the
Keras 2 backend it needs when Keras 3 is installed too.
"""

from tfsparse.horovod.exchange import CompressedExchange
from tfsparse.horovod.metric_average import MetricAverageCallback
from tfsparse.horovod.optimizer import DistributedOptimizer

__all__ = [
    "CompressedExchange",
    "DistributedOptimizer",
    "MetricAverageCallback",
]
