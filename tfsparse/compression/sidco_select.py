"""SIDCo's hot path: threshold estimation and selection, on one of two paths.

On CPU, with tfsparse's compiled kernels built (``python -m tfsparse.ops.build``),
one fused op (``tfsparse/ops/kernels/sidco.cc``) estimates the threshold and
selects the elements above it in two or three passes over the gradient.
Elsewhere (GPU, SavedModel export, ``TFSPARSE_USE_KERNELS=0``, float16 or
bfloat16 gradients) the pure-TensorFlow path runs: `thresholds.multistage_threshold`
then `select_above`. Both fit the same closed-form estimators with the same
stage ratios and the same nonzero count; their sums are taken in different
orders (float32 trees here, float blocks added in float64 in the op), so the
thresholds agree to float32 reduction-order tolerance (~1e-6 relative), and
each path selects exactly the positions with ``|g| > float(threshold)`` of its
own threshold (the largest element when that leaves none, unless all are zero).
(With constant magnitudes the op's gamma fit has s = 0 exactly, as exact
arithmetic does; TensorFlow's rounded mean can leave s ~ 1e-8 there.)

`sidco_select_adaptive` is the op for an adaptive `SIDCo`: it also applies the
adaptive-stage rule to the compressor's variables, so a compress call is one op.
"""

import tensorflow as tf

from tfsparse.compression import thresholds
from tfsparse.compression.base import select_above
from tfsparse.compression.base import selection_block
from tfsparse.ops import kernels
from tfsparse.ops.sddmm import use_compiled_kernels

_KERNEL_DTYPES = (tf.float32, tf.float64)


def kernel_serves(flat):
    """Whether the compiled op serves `flat` in the current trace (float32/float64 on CPU)."""
    return flat.dtype in _KERNEL_DTYPES and use_compiled_kernels()


def sidco_select(
    flat,
    ratio,
    stages,
    distribution,
    first_ratio=thresholds.FIRST_RATIO,
    exclude_zeros=False,
    use_kernel=None,
):
    """Keeps the elements of `flat` whose magnitude exceeds SIDCo's threshold.

    Args:
        flat: 1-D floating-point tensor (a flattened gradient).
        ratio: target fraction kept, a Python float in (0, 1].
        stages: number of stages (Python int or int32 tensor, >= 1).
        distribution: "exponential", "gpareto" or "gamma".
        first_ratio: the ratio of stage 1 when there are several stages.
        exclude_zeros: fit the nonzero magnitudes only, asking for the same
            count (see `thresholds.fit_threshold`).
        use_kernel: True for the compiled CPU op, False for the
            pure-TensorFlow path, None to decide with
            `tfsparse.ops.sddmm.use_compiled_kernels` (float32/float64 only).

    Returns:
        `(values, indices, threshold)`: the kept values, their int32
        positions (ascending) and the float64 threshold.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> g = tf.constant(np.random.default_rng(0).laplace(size=100_000), tf.float32)
        >>> values, indices, eta = sidco_select(g, 0.01, 1, "exponential")
        >>> bool(tf.reduce_all(tf.abs(values) > tf.cast(eta, tf.float32)))
        True
        >>> 800 < int(tf.size(indices)) < 1250
        True
    """
    flat = tf.convert_to_tensor(flat)
    if use_kernel is None:
        use_kernel = kernel_serves(flat)
    if use_kernel:
        values, indices, threshold = kernels.sidco(
            flat,
            tf.cast(stages, tf.int32),
            tf.constant(ratio, tf.float64),
            tf.constant(first_ratio, tf.float64),
            distribution,
            exclude_zeros,
            thresholds.EXACT_COUNT_LIMIT,
            thresholds.SAMPLE_CHUNK,
            thresholds.SAMPLE_CHUNKS,
        )
        return values, indices, threshold
    magnitudes = tf.abs(flat)
    threshold = thresholds.multistage_threshold(
        magnitudes, ratio, stages, distribution, first_ratio, exclude_zeros=exclude_zeros
    )
    indices = select_above(magnitudes, tf.cast(threshold, magnitudes.dtype), selection_block(ratio))
    return tf.gather(flat, indices), indices, threshold


def sidco_select_adaptive(
    flat,
    ratio,
    stages,
    adaptation,
    distribution,
    first_ratio=thresholds.FIRST_RATIO,
    exclude_zeros=False,
    adapt_every=5,
    max_stages=None,
    band=(0.8, 1.2),
    memory=10,
):
    """`sidco_select` with the stage count of an adaptive SIDCo, then its update, in one op.

    The compiled op (CPU, float32/float64; see `kernel_serves`) reads the
    stage count from the `stages` variable, selects as `sidco_select`, then
    counts the call in the `adaptation` variable and, every `adapt_every`
    calls, moves the stage count by the rule of
    `tfsparse.compression.sidco.next_stage_count`, in the same float32 and
    int32 arithmetic as `SIDCo._observe` (which does the same on the
    pure-TensorFlow path), updating both variables in place.

    Args:
        flat: 1-D float32 or float64 tensor (a flattened gradient).
        ratio: target fraction kept, a Python float in (0, 1].
        stages: int32 scalar `tf.Variable`, the stage count.
        adaptation: float64 `tf.Variable` of length ``3 + 2 * (max_stages + 1)``
            (layout: `tfsparse.compression.sidco.unpack_adaptation`).
        distribution: "exponential", "gpareto" or "gamma".
        first_ratio: the ratio of stage 1 when there are several stages.
        exclude_zeros: fit the nonzero magnitudes only.
        adapt_every: calls between two adjustments.
        max_stages: the largest stage count (Python int).
        band: the (low, high) band of mean qualities that need no change.
        memory: windows during which a seen quality is trusted.

    Returns:
        `(values, indices, threshold)`, as `sidco_select`.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> from tfsparse.compression.sidco import initial_adaptation
        >>> stages = tf.Variable(1)
        >>> adaptation = tf.Variable(initial_adaptation(7), dtype=tf.float64)
        >>> g = tf.constant(np.random.default_rng(0).normal(size=100_000), tf.float32)
        >>> for _ in range(5):  # one window: Gaussian data need more stages
        ...     _ = sidco_select_adaptive(g, 0.01, stages, adaptation, "exponential", max_stages=7)
        >>> int(stages.numpy())
        2
    """
    return kernels.sidco_adaptive(
        flat, stages, adaptation, ratio, first_ratio, distribution, exclude_zeros,
        exact_count_limit=thresholds.EXACT_COUNT_LIMIT,
        sample_chunk=thresholds.SAMPLE_CHUNK,
        sample_chunks=thresholds.SAMPLE_CHUNKS,
        max_stages=max_stages,
        adapt_every=adapt_every,
        band_low=band[0],
        band_high=band[1],
        memory=memory,
    )
