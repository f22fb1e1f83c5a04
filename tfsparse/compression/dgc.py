"""DGC: a threshold from a random sample, refined, then exact top-k if needed."""

import tensorflow as tf

from tfsparse import _validation
from tfsparse.compression.base import INDEX_DTYPE
from tfsparse.compression.base import Compressor
from tfsparse.compression.base import select_above
from tfsparse.compression.base import selection_block

_LOW, _HIGH = 0.8, 1.25
_STEP = 1.3


class DGC(Compressor):
    """Deep Gradient Compression's sampled threshold (Lin et al., ICLR 2018).

    The k-th largest magnitude of a uniform sample of ``sample_ratio * n``
    elements estimates the threshold. While the count it selects is outside
    ``[0.8 k, 1.25 k]`` the threshold is refined (multiplied or divided by 1.3
    until the target is bracketed, then bisected), at most
    ``max_refinements`` times; if still more than ``1.25 k`` remain, the exact
    top-k of those candidates is sent.

    Args:
        ratio: fraction of elements sent, in (0, 1].
        sample_ratio: fraction of elements sampled, in (0, 1].
        max_refinements: most threshold refinements per call (>= 0).
        seed: integer seed of the (stateless) sampling.
        name: optional module name.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> g = tf.constant(np.random.default_rng(0).normal(size=100_000), tf.float32)
        >>> values, indices = DGC(0.01).compress(g)
        >>> 800 <= int(tf.size(values)) <= 1250
        True
    """

    def __init__(self, ratio, sample_ratio=0.01, max_refinements=10, seed=0, name=None):
        super().__init__(ratio, name=name)
        self._sample_ratio = _validation.check_fraction("sample_ratio", sample_ratio)
        self._max_refinements = _validation.check_non_negative_int(
            "max_refinements", max_refinements
        )
        self._seed = _validation.check_non_negative_int("seed", seed)
        with self.name_scope:
            self._calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="calls")

    def _sampled_threshold(self, magnitudes, size):
        seed = tf.stack([tf.constant(self._seed, tf.int64), self._calls.assign_add(1)])
        samples = tf.minimum(
            tf.maximum(
                tf.cast(tf.math.ceil(tf.cast(size, tf.float64) * self._sample_ratio), INDEX_DTYPE), 1
            ),
            size,
        )
        positions = tf.random.stateless_uniform(
            [samples], seed=seed, minval=0, maxval=tf.maximum(size, 1), dtype=INDEX_DTYPE
        )
        sample = tf.gather(magnitudes, positions)
        sample_k = tf.minimum(
            tf.maximum(
                tf.cast(tf.math.ceil(tf.cast(samples, tf.float64) * self.ratio), INDEX_DTYPE), 1
            ),
            samples,
        )
        return tf.reduce_min(tf.math.top_k(sample, k=sample_k, sorted=False).values)

    def _refine(self, magnitudes, threshold, k):
        low_count = tf.cast(_LOW * tf.cast(k, tf.float32), INDEX_DTYPE)
        high_count = tf.cast(tf.math.ceil(_HIGH * tf.cast(k, tf.float32)), INDEX_DTYPE)

        def count(t):
            return tf.reduce_sum(tf.cast(magnitudes > t, INDEX_DTYPE))

        def keep_going(i, t, lower, upper, selected):
            outside = tf.logical_or(selected > high_count, tf.logical_and(selected < low_count, t > 0))
            return tf.logical_and(i < self._max_refinements, outside)

        def step(i, t, lower, upper, selected):
            too_many = selected > high_count
            lower = tf.where(too_many, t, lower)
            upper = tf.where(too_many, upper, t)
            bracketed = tf.logical_and(lower > 0, tf.math.is_finite(upper))
            t = tf.where(
                bracketed,
                0.5 * (lower + upper),
                tf.where(too_many, t * _STEP, t / _STEP),
            )
            return i + 1, t, lower, upper, count(t)

        zero = tf.zeros([], magnitudes.dtype)
        infinity = tf.constant(float("inf"), magnitudes.dtype)
        _, threshold, _, _, selected = tf.while_loop(
            keep_going, step, (tf.constant(0), threshold, zero, infinity, count(threshold))
        )
        return threshold, selected, high_count

    def _compress(self, flat):
        magnitudes = tf.abs(flat)
        size = tf.size(flat, out_type=INDEX_DTYPE)
        k = self.target_count(size)
        threshold, selected, high_count = self._refine(
            magnitudes, self._sampled_threshold(magnitudes, size), k
        )
        indices = select_above(magnitudes, threshold, selection_block(self.ratio))

        def exact_top_k():
            candidates = tf.gather(magnitudes, indices)
            best = tf.math.top_k(candidates, k=tf.minimum(k, tf.size(candidates)), sorted=False)
            return tf.gather(indices, best.indices)

        indices = tf.cond(selected > high_count, exact_top_k, lambda: indices)
        return tf.gather(flat, indices), indices

    def get_config(self):
        config = super().get_config()
        config.update(
            sample_ratio=self._sample_ratio,
            max_refinements=self._max_refinements,
            seed=self._seed,
        )
        return config
