"""Top-k: the exact k largest magnitudes (the baseline SIDCo approximates)."""

import tensorflow as tf

from tfsparse.compression.base import INDEX_DTYPE
from tfsparse.compression.base import Compressor


class TopK(Compressor):
    """Sends the ``max(1, round(ratio * n))`` largest magnitudes (`tf.math.top_k`).

    Zeros among the k largest are not sent, so an all-zero gradient sends
    nothing.

    Args:
        ratio: fraction of elements sent, in (0, 1].
        name: optional module name.

    Example:
        >>> import tensorflow as tf
        >>> values, indices = TopK(0.25).compress(tf.constant([1.0, -8.0, 3.0, 0.5]))
        >>> values.numpy().tolist(), indices.numpy().tolist()
        ([-8.0], [1])
    """

    def _compress(self, flat):
        magnitudes = tf.abs(flat)
        k = tf.minimum(self.target_count(tf.size(flat)), tf.size(flat))
        top, indices = tf.math.top_k(magnitudes, k=k, sorted=False)
        indices = tf.boolean_mask(tf.cast(indices, INDEX_DTYPE), top > 0)
        return tf.gather(flat, indices), indices
