"""SIDCo: threshold sparsification from a fitted sparsity-inducing distribution."""

import tensorflow as tf

from tfsparse import _validation
from tfsparse.compression import thresholds
from tfsparse.compression.base import Compressor
from tfsparse.compression.sidco_select import kernel_serves
from tfsparse.compression.sidco_select import sidco_select
from tfsparse.compression.sidco_select import sidco_select_adaptive

QUALITY_BAND = (0.8, 1.2)
MEMORY_WINDOWS = 10
# The adaptation variable (float64, exact for its int32 and float32 entries):
# [window_calls, window_quality, windows, qualities[0..max], recorded[0..max]],
# as the fused op reads it (tfsparse/ops/kernels/sidco_adaptation.h).
_WINDOW_FIELDS = 3


def initial_adaptation(max_stages):
    """The adaptation state before any call: an empty window, nothing recorded."""
    slots = max_stages + 1
    return [0.0] * _WINDOW_FIELDS + [0.0] * slots + [-1.0] * slots


def unpack_adaptation(state, max_stages):
    """`(window_calls, window_quality, windows, qualities, recorded)` of an adaptation vector."""
    slots = max_stages + 1
    state = tf.convert_to_tensor(state, tf.float64)
    return (
        tf.cast(state[0], tf.int32),
        tf.cast(state[1], tf.float32),
        tf.cast(state[2], tf.int32),
        tf.cast(state[_WINDOW_FIELDS:_WINDOW_FIELDS + slots], tf.float32),
        tf.cast(state[_WINDOW_FIELDS + slots:], tf.int32),
    )


def pack_adaptation(window_calls, window_quality, windows, qualities, recorded):
    """The adaptation vector (float64) of `unpack_adaptation`'s parts."""
    scalars = [tf.reshape(tf.cast(v, tf.float64), [1]) for v in (window_calls, window_quality, windows)]
    return tf.concat(scalars + [tf.cast(qualities, tf.float64), tf.cast(recorded, tf.float64)], 0)


def next_stage_count(stages, mean_quality, qualities, recorded, window, max_stages,
                     band=QUALITY_BAND, memory=MEMORY_WINDOWS):
    """One adaptive-stage decision, as plain TensorFlow math.

    The rule of the SIDCo paper comes first: a mean achieved/target above
    ``band[1]`` removes a stage, below ``band[0]`` adds one. Because the
    direction in which the count moves the ratio depends on the data (more
    stages raise it on Gaussian data but lower it on Student-t data), the
    other neighbour is tried when the preferred one is out of ``[1,
    max_stages]`` or was seen farther from 1 (in ``|ln q|``) within the last
    `memory` windows; when both are, the count stays. Memories expire, so
    neighbours are tried again as the gradients drift.

    Args:
        stages: current stage count (int32 scalar).
        mean_quality: mean achieved/target over the window that just ended (> 0).
        qualities: float32 vector of length ``max_stages + 1``: the last mean
            quality seen with each stage count.
        recorded: int32 vector, same length: the window in which each entry
            of `qualities` was seen, or -1 if never.
        window: the index of the window that just ended (int32 scalar).
        max_stages: the largest allowed count (Python int).
        band: the (low, high) band of qualities that need no change.
        memory: windows during which a seen quality is trusted.

    Returns:
        `(new_stages, new_qualities, new_recorded)`.
    """
    stages = tf.cast(stages, tf.int32)
    window = tf.cast(window, tf.int32)
    mean_quality = tf.cast(mean_quality, tf.float32)
    qualities = tf.tensor_scatter_nd_update(qualities, [[stages]], [mean_quality])
    recorded = tf.tensor_scatter_nd_update(recorded, [[stages]], [window])
    low, high = band
    in_band = tf.logical_and(mean_quality >= low, mean_quality <= high)
    too_many = mean_quality > high
    preferred = tf.where(too_many, stages - 1, stages + 1)
    alternative = tf.where(too_many, stages + 1, stages - 1)
    distance = tf.abs(tf.math.log(mean_quality))

    def usable(count):
        inside = tf.logical_and(count >= 1, count <= max_stages)
        slot = tf.clip_by_value(count, 0, max_stages)
        seen_at = tf.gather(recorded, slot)
        remembered = tf.logical_and(seen_at >= 0, window - seen_at < memory)
        seen = tf.maximum(tf.gather(qualities, slot), 1e-30)
        worse = tf.logical_and(remembered, tf.abs(tf.math.log(seen)) >= distance)
        return tf.logical_and(inside, tf.logical_not(worse))

    moved = tf.where(
        usable(preferred), preferred, tf.where(usable(alternative), alternative, stages)
    )
    return tf.where(in_band, stages, moved), qualities, recorded


class SIDCo(Compressor):
    """Sparsity-inducing-distribution compression (Abdelmoniem et al., MLSys 2021).

    Keeps the elements whose magnitude exceeds the ``1 - ratio`` quantile of a
    distribution fitted in closed form to ``|g|`` (one or a few passes over
    the tensor instead of a sort). With several stages, stage 1 keeps 25% and
    each later stage refits on the survivors. With ``adaptive=True`` the stage
    count is adjusted every ``adapt_every`` calls from the mean achieved/target
    ratio (see `next_stage_count`). The state lives in two variables, the
    stage count and the adaptation window (`unpack_adaptation`), so it works
    inside `tf.function` and is checkpointed. Estimation and selection run in
    `sidco_select`: one fused compiled op on CPU when tfsparse's kernels are
    built, pure TensorFlow elsewhere; when the count adapts, the fused op also
    applies the rule to the variables (`sidco_select_adaptive`), with the same
    float32 arithmetic as `_observe`, so a call is a single op.

    Args:
        ratio: target fraction of elements sent, in (0, 1].
        distribution: "exponential", "gpareto" or "gamma".
        stages: initial number of stages, 1 to ``ceil(log(ratio)/log(0.5))``.
        adaptive: adjust the stage count while training.
        adapt_every: calls between two adjustments.
        first_ratio: ratio of the first stage when there are several, in (0, 1].
        exclude_zeros: fit only the nonzero magnitudes, asking for the same
            count, so exact zeros (dead ReLU units, constant inputs: 40% of an
            MNIST MLP's gradient) do not pull the fit; costs one more pass (a
            nonzero count). False is the paper's estimator, which fits all.
        name: optional module name.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> g = tf.constant(np.random.default_rng(0).laplace(size=100_000), tf.float32)
        >>> values, indices = SIDCo(0.01).compress(g)
        >>> 800 < int(tf.size(values)) < 1250
        True
    """

    def __init__(
        self,
        ratio,
        distribution="exponential",
        stages=1,
        adaptive=True,
        adapt_every=5,
        first_ratio=thresholds.FIRST_RATIO,
        exclude_zeros=True,
        name=None,
    ):
        super().__init__(ratio, name=name)
        self._distribution = _validation.check_choice(
            "distribution", distribution, thresholds.DISTRIBUTIONS
        )
        self._max_stages = thresholds.max_stages(self.ratio)
        stages = _validation.check_positive_int("stages", stages)
        if stages > self._max_stages:
            raise _validation.invalid_value(
                "stages",
                f"an integer in [1, {self._max_stages}] (ceil(log(ratio)/log(0.5)) "
                f"for ratio={self.ratio})",
                stages,
            )
        self._initial_stages = stages
        self._adaptive = _validation.check_bool("adaptive", adaptive)
        self._adapt_every = _validation.check_positive_int("adapt_every", adapt_every)
        self._first_ratio = _validation.check_fraction("first_ratio", first_ratio)
        self._exclude_zeros = _validation.check_bool("exclude_zeros", exclude_zeros)
        with self.name_scope:
            self._stages = tf.Variable(stages, dtype=tf.int32, trainable=False, name="stages")
            self._adaptation = tf.Variable(
                initial_adaptation(self._max_stages), dtype=tf.float64, trainable=False,
                name="adaptation",
            )

    @property
    def stages(self):
        """The current stage count (an int32 variable)."""
        return self._stages

    @property
    def max_stages(self):
        return self._max_stages

    @property
    def distribution(self):
        return self._distribution

    def _compress(self, flat):
        observe = self._adaptive and self._max_stages > 1 and self.ratio < self._first_ratio
        if observe and kernel_serves(flat):
            values, indices, _ = sidco_select_adaptive(
                flat, self.ratio, self._stages, self._adaptation, self._distribution,
                self._first_ratio, exclude_zeros=self._exclude_zeros,
                adapt_every=self._adapt_every, max_stages=self._max_stages,
                band=QUALITY_BAND, memory=MEMORY_WINDOWS,
            )
            return values, indices
        values, indices, _ = sidco_select(
            flat, self.ratio, self._stages, self._distribution, self._first_ratio,
            exclude_zeros=self._exclude_zeros, use_kernel=kernel_serves(flat),
        )
        if observe:
            self._observe(tf.size(indices), self.target_count(tf.size(flat)))
        return values, indices

    def _observe(self, achieved, target):
        """Counts a call that sent `achieved` of `target` elements; adapts after a window."""
        calls, total, windows, qualities, recorded = unpack_adaptation(
            self._adaptation, self._max_stages
        )
        valid = achieved > 0
        quality = tf.cast(achieved, tf.float32) / tf.cast(tf.maximum(target, 1), tf.float32)
        calls += tf.cast(valid, tf.int32)
        total += tf.where(valid, quality, 0.0)

        def adapt():
            stages, new_qualities, new_recorded = next_stage_count(
                self._stages, total / tf.cast(calls, tf.float32), qualities, recorded,
                windows, self._max_stages,
            )
            self._stages.assign(stages)
            return pack_adaptation(0, 0.0, windows + 1, new_qualities, new_recorded)

        def keep():
            return pack_adaptation(calls, total, windows, qualities, recorded)

        self._adaptation.assign(tf.cond(calls >= self._adapt_every, adapt, keep))

    def get_config(self):
        config = super().get_config()
        config.update(
            distribution=self._distribution,
            stages=self._initial_stages,
            adaptive=self._adaptive,
            adapt_every=self._adapt_every,
            first_ratio=self._first_ratio,
            exclude_zeros=self._exclude_zeros,
        )
        return config
