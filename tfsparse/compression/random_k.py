"""Random-k: k positions drawn at random (a baseline without any selection cost)."""

import tensorflow as tf

from tfsparse import _validation
from tfsparse.compression.base import INDEX_DTYPE
from tfsparse.compression.base import Compressor

# Up to this ratio positions are drawn with replacement, oversampled so that
# k distinct ones remain (O(k)); above it a full shuffle is cheaper than retries.
_SHUFFLE_ABOVE = 0.1
_OVERSAMPLE = 1.25


class RandomK(Compressor):
    """Sends about ``max(1, round(ratio * n))`` positions drawn uniformly at random.

    The draw is stateless: it depends on ``(seed, call counter)`` only, so
    workers with the same seed pick the same positions at the same step, and
    a run is reproducible. Positions holding zeros are not sent. Up to
    ratio 0.1 the positions are drawn with replacement (25% oversampled, then
    deduplicated; in the rare case fewer than k distinct positions remain,
    fewer are sent); above, a shuffle gives exactly k.

    Args:
        ratio: fraction of elements sent, in (0, 1].
        seed: integer seed.
        name: optional module name.

    Example:
        >>> import tensorflow as tf
        >>> values, indices = RandomK(0.5, seed=1).compress(tf.range(1.0, 101.0))
        >>> int(tf.size(indices))
        50
    """

    def __init__(self, ratio, seed=0, name=None):
        super().__init__(ratio, name=name)
        self._seed = _validation.check_non_negative_int("seed", seed)
        with self.name_scope:
            self._calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="calls")

    def _compress(self, flat):
        size = tf.size(flat, out_type=INDEX_DTYPE)
        k = tf.minimum(self.target_count(size), size)
        seed = tf.stack([tf.constant(self._seed, tf.int64), self._calls.assign_add(1)])
        if self.ratio > _SHUFFLE_ABOVE:
            positions = tf.random.experimental.stateless_shuffle(tf.range(size), seed=seed)[:k]
        else:
            draws = tf.cast(tf.math.ceil(tf.cast(k, tf.float32) * _OVERSAMPLE), INDEX_DTYPE)
            drawn = tf.random.stateless_uniform(
                [draws], seed=seed, minval=0, maxval=tf.maximum(size, 1), dtype=INDEX_DTYPE
            )
            positions = tf.unique(drawn).y[:k]
        values = tf.gather(flat, positions)
        nonzero = tf.not_equal(values, 0)
        return tf.boolean_mask(values, nonzero), tf.boolean_mask(positions, nonzero)

    def get_config(self):
        config = super().get_config()
        config["seed"] = self._seed
        return config
