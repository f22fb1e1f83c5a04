"""The identity compressor: every element is sent (dense allreduce in the optimizer)."""

import tensorflow as tf

from tfsparse.compression.base import INDEX_DTYPE
from tfsparse.compression.base import Compressor


class NoCompression(Compressor):
    """Sends every element; the baseline without compression.

    `tfsparse.horovod.DistributedOptimizer` sees ``sends_dense = True`` and
    uses a dense ``hvd.allreduce``, so it matches ``hvd.DistributedOptimizer``.
    Through the contract it returns all values and ``range(n)``.

    Example:
        >>> import tensorflow as tf
        >>> values, indices = NoCompression().compress(tf.constant([0.0, 2.0]))
        >>> indices.numpy().tolist()
        [0, 1]
    """

    sends_dense = True

    def __init__(self, name=None):
        super().__init__(1.0, name=name)

    def _compress(self, flat):
        return flat, tf.range(tf.size(flat, out_type=INDEX_DTYPE), dtype=INDEX_DTYPE)

    def decompress(self, values, indices, size):
        if values.shape.rank == 1 and values.shape[0] is not None and values.shape[0] == size:
            return values
        return super().decompress(values, indices, size)

    def get_config(self):
        config = super().get_config()
        del config["ratio"]  # always 1
        return config
