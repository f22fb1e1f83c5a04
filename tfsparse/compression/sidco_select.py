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
"""

import tensorflow as tf

from tfsparse.compression import thresholds
from tfsparse.compression.base import select_above
from tfsparse.compression.base import selection_block
from tfsparse.ops import kernels
from tfsparse.ops.sddmm import use_compiled_kernels

_KERNEL_DTYPES = (tf.float32, tf.float64)


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
        use_kernel = flat.dtype in _KERNEL_DTYPES and use_compiled_kernels()
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
