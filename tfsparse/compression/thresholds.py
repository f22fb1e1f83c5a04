"""SIDCo's threshold estimators as plain TensorFlow math (no Keras, no state).

SIDCo (Abdelmoniem et al., MLSys 2021) models the gradient magnitudes as a
sparsity-inducing distribution, fits it in closed form and keeps the elements
above the fitted quantile ``1 - ratio``:

- exponential: ``eta = -mean * ln(ratio)``;
- generalized Pareto by moments: ``alpha = 0.5*m*(m^2/v + 1)``,
  ``k = 0.5*(m^2/v - 1)``, ``eta = alpha * (1 - ratio^k) / k``;
- gamma (first stage only, then generalized Pareto):
  ``s = ln(mean) - mean(ln a)``, ``shape = (3 - s + sqrt((s-3)^2 + 24 s)) / (12 s)``,
  ``eta = mean/shape * gammainccinv(shape, ratio)``.

Multi-stage estimation keeps ``first_ratio`` (0.25) in stage 1 and splits the
remaining factor ``ratio / first_ratio`` evenly over the other stages; each later
stage refits on the elements above the previous threshold, shifted by their
minimum (computed with masked sums over the whole tensor, `survivor_moments`,
which is cheaper than compacting 25% of it). All estimators are
scale-equivariant, so they run on ``|g|`` directly (the paper's normalisation
by ``||g||_2`` would not change the selection). In floating point too: the
sums of squares (the gpareto fit's, the later stages') of magnitudes outside
2**-40 .. 2**40 are taken of them times a power of two and the fits made in
those units (`_by_scale`), so a float32 gradient of 1e-20 or 1e18, or a
float64 one of 1e-160 or 1e160, keeps what it keeps at 1 (before, its
variance was lost: gpareto kept 36,809 and 16 of 100,000 elements at ratio
0.01). With ``exclude_zeros`` the
first stage fits only the nonzero magnitudes and asks them for the same count
(a departure from the paper, which fits exact zeros too).

TensorFlow has ``igamma``/``igammac`` but no inverse; `gammaincinv` and
`gammainccinv` solve ``P(a, x) = p`` and ``Q(a, x) = q`` by Halley's method.
"""

import math

import tensorflow as tf

from tfsparse import _validation

DISTRIBUTIONS = ("exponential", "gpareto", "gamma")
FIRST_RATIO = 0.25
_HALLEY_STEPS = 20


def _float64(x):
    """x as a float64 tensor; Python numbers are not rounded to float32 on the way."""
    if isinstance(x, (tf.Tensor, tf.Variable)):
        return tf.cast(x, tf.float64)
    return tf.convert_to_tensor(x, tf.float64)


def _result_dtype(x):
    if isinstance(x, (tf.Tensor, tf.Variable)) and x.dtype.is_floating:
        return x.dtype
    return tf.float64


def max_stages(ratio):
    """The largest useful stage count: ceil(log(ratio) / log(0.5)), at least 1."""
    return max(1, math.ceil(math.log(ratio) / math.log(0.5) - 1e-9))


def stage_ratios(ratio, stages, first_ratio=FIRST_RATIO):
    """(first-stage ratio, ratio of each later stage) as float64 tensors.

    With one stage or `ratio >= first_ratio` the first stage uses `ratio` itself
    and there are no later stages.
    """
    stages = _float64(stages)
    ratio = _float64(ratio)
    single = tf.logical_or(stages <= 1, ratio >= first_ratio)
    first = tf.where(single, ratio, tf.constant(first_ratio, tf.float64))
    later = tf.pow(ratio / first_ratio, 1.0 / tf.maximum(stages - 1.0, 1.0))
    return first, tf.where(single, tf.constant(1.0, tf.float64), later)


def _halley_inverse(a, p, q):
    """Solves P(a, x) = p, given both p and q = 1 - p exactly (float64)."""
    lower = p <= 0.5
    # Start: Wilson-Hilferty for a > 1, never below the lower bound
    # (p Gamma(a+1))^(1/a) (P(a, x) <= x^a / Gamma(a+1) for all x); for a <= 1
    # that series joined to an exponential tail.
    z = tf.math.ndtri(tf.clip_by_value(p, 1e-300, 1.0 - 1e-16))
    wilson_hilferty = a * tf.pow(
        tf.maximum(1.0 - 1.0 / (9.0 * a) + z / (3.0 * tf.sqrt(a)), 0.0), 3.0
    )
    series = tf.exp((tf.math.log(p) + tf.math.lgamma(a + 1.0)) / a)
    t = 1.0 - a * (0.253 + a * 0.12)
    tail = 1.0 - tf.math.log(tf.maximum(q, 1e-300) / (1.0 - t))
    small_a = tf.where(p < t, tf.exp(tf.math.log(p / t) / a), tail)
    x = tf.where(a > 1.0, tf.maximum(wilson_hilferty, series), small_a)
    x = tf.maximum(x, 1e-300)
    log_gamma_a = tf.math.lgamma(a)

    for _ in range(_HALLEY_STEPS):
        # err = P(a, x) - p, computed from the smaller tail for accuracy.
        err = tf.where(lower, tf.math.igamma(a, x) - p, q - tf.math.igammac(a, x))
        density = tf.exp((a - 1.0) * tf.math.log(x) - x - log_gamma_a)
        u = err / tf.maximum(density, 1e-300)
        step = u / (1.0 - 0.5 * tf.minimum(u * ((a - 1.0) / x - 1.0), 1.0))
        x_new = x - step
        x = tf.where(x_new > 0.0, x_new, 0.5 * x)
    x = tf.where(p <= 0.0, tf.zeros_like(x), x)
    return tf.where(q <= 0.0, tf.fill(tf.shape(x), tf.constant(math.inf, tf.float64)), x)


def gammaincinv(a, p):
    """Inverse of the regularised lower incomplete gamma function in x.

    Returns x with ``P(a, x) = tf.math.igamma(a, x) = p`` (SciPy's
    `scipy.special.gammaincinv`), computed in float64 and returned in the dtype
    of `a`.

    Example:
        >>> round(float(gammaincinv(2.0, 0.5)), 6)
        1.678347
    """
    dtype = _result_dtype(a)
    a64 = _float64(a)
    p64 = _float64(p)
    a64, p64 = a64 + tf.zeros_like(p64), p64 + tf.zeros_like(a64)
    return tf.cast(_halley_inverse(a64, p64, 1.0 - p64), dtype)


def gammainccinv(a, q):
    """Inverse of the regularised upper incomplete gamma function in x.

    Returns x with ``Q(a, x) = tf.math.igammac(a, x) = q`` (SciPy's
    `scipy.special.gammainccinv`); accurate for small q, where 1 - q would
    round.

    Example:
        >>> round(float(gammainccinv(1.0, 0.001)), 6)  # -ln(0.001)
        6.907755
    """
    dtype = _result_dtype(a)
    a64 = _float64(a)
    q64 = _float64(q)
    a64, q64 = a64 + tf.zeros_like(q64), q64 + tf.zeros_like(a64)
    return tf.cast(_halley_inverse(a64, 1.0 - q64, q64), dtype)


def exponential_threshold(mean, ratio):
    """Quantile 1 - ratio of an exponential distribution with this mean."""
    mean = _float64(mean)
    return -mean * tf.math.log(_float64(ratio))


def gpareto_threshold(mean, variance, ratio):
    """Quantile 1 - ratio of the generalized Pareto fitted by moments.

    A zero variance (all magnitudes equal) returns the mean; a shape near 0
    takes the exponential limit ``-alpha * ln(ratio)``.
    """
    mean = _float64(mean)
    variance = _float64(variance)
    log_ratio = tf.math.log(_float64(ratio))
    degenerate = variance <= 1e-12 * tf.square(mean)
    q = tf.square(mean) / tf.where(degenerate, tf.ones_like(variance), variance)
    alpha = 0.5 * mean * (q + 1.0)
    k = 0.5 * (q - 1.0)
    near_zero = tf.abs(k) < 1e-8
    safe_k = tf.where(near_zero, tf.ones_like(k), k)
    eta = tf.where(near_zero, -alpha * log_ratio, -alpha * tf.math.expm1(safe_k * log_ratio) / safe_k)
    return tf.where(degenerate, mean, eta)


def gamma_shape(log_gap):
    """Approximate maximum-likelihood gamma shape from s = ln(mean) - mean(ln x)."""
    s = _float64(log_gap)
    safe_s = tf.maximum(s, 1e-12)
    return (3.0 - safe_s + tf.sqrt(tf.square(safe_s - 3.0) + 24.0 * safe_s)) / (12.0 * safe_s)


def gamma_threshold(mean, log_gap, ratio):
    """Quantile 1 - ratio of the gamma fitted from the mean and s = ln(mean) - mean(ln x).

    A zero `log_gap` (all magnitudes equal) returns the mean.
    """
    mean = _float64(mean)
    shape = gamma_shape(log_gap)
    eta = mean / shape * gammainccinv(shape, _float64(ratio))
    return tf.where(_float64(log_gap) <= 1e-12, mean, eta)


def fit_threshold(magnitudes, ratio, distribution, exclude_zeros=False):
    """Fits `distribution` to non-negative `magnitudes` and returns its 1 - ratio quantile.

    With ``exclude_zeros`` the fit uses the nonzero magnitudes only (their
    count from `nonzero_count`) and the ratio becomes
    ``ratio * size / nonzeros`` (at most 1): the same count is
    asked for, from the continuous part of a distribution with a point mass
    at zero (dead units, constant inputs). Moments are computed in float32
    (float64 for float64 input); the returned threshold is float64. An empty
    or all-zero input gives 0.
    """
    x = _moment_dtype(magnitudes)
    if exclude_zeros:
        count = nonzero_count(x)
        ratio = _nonzero_ratio(ratio, tf.size(x), count)
    else:
        count = tf.size(x)
    return _fit(x, ratio, distribution, count, exclude_zeros)


def _moment_dtype(magnitudes):
    if magnitudes.dtype in (tf.float32, tf.float64):
        return magnitudes
    return tf.cast(magnitudes, tf.float32)


# Above this size the nonzero fraction is measured on a sample of
# SAMPLE_CHUNKS chunks of SAMPLE_CHUNK contiguous elements, evenly spaced with
# an odd stride (so it does not alias with power-of-two layer shapes):
# counting every nonzero costs three passes (compare, cast, sum), as much as
# the rest of a one-stage fit.
EXACT_COUNT_LIMIT = 2**18
SAMPLE_CHUNK = 16
SAMPLE_CHUNKS = 4096


def nonzero_count(magnitudes):
    """The number of nonzeros (float64), estimated from a sample for large tensors.

    Up to `EXACT_COUNT_LIMIT` (262,144) elements the count is exact. Above,
    it is the nonzero fraction of about 4,096 evenly spaced chunks of 16
    elements times the size: even when zeros come in whole chunks (dead
    units), the standard error of the fraction is below 1% (0.8%).
    """
    size = tf.size(magnitudes)

    def exact():
        return _float64(tf.math.count_nonzero(magnitudes))

    def sampled():
        stride = tf.maximum(size // (SAMPLE_CHUNK * SAMPLE_CHUNKS), 1) // 2 * 2 + 1
        starts = tf.range(0, size - SAMPLE_CHUNK + 1, stride * SAMPLE_CHUNK)
        chunks = tf.gather(magnitudes, starts[:, None] + tf.range(SAMPLE_CHUNK)[None, :])
        fraction = _float64(tf.math.count_nonzero(chunks)) / _float64(tf.size(chunks))
        return fraction * _float64(size)

    static = magnitudes.shape[0]
    if static is not None:
        return exact() if static <= EXACT_COUNT_LIMIT else sampled()
    return tf.cond(size <= EXACT_COUNT_LIMIT, exact, sampled)


def _nonzero_ratio(ratio, size, nonzero):
    """The ratio of the nonzeros that asks for the same count as `ratio` of all."""
    return tf.minimum(_float64(ratio) * _float64(size) / tf.maximum(_float64(nonzero), 1.0), 1.0)


def _fit(x, ratio, distribution, count, exclude_zeros):
    """Threshold of `distribution` fitted to `count` elements of x (its nonzeros if exclude_zeros)."""
    _validation.check_choice("distribution", distribution, DISTRIBUTIONS)
    count = tf.maximum(tf.cast(count, x.dtype), 1.0)
    mean = tf.reduce_sum(x) / count
    if distribution == "exponential":
        eta = exponential_threshold(mean, ratio)
    elif distribution == "gpareto":
        # E[x^2] - mean^2: the norm is one fused pass (x - mean would be another
        # tensor); float32 keeps ~6 digits of v, enough where v ~ mean^2.
        def plain():
            second = tf.square(tf.math.reduce_euclidean_norm(x)) / count
            return gpareto_threshold(mean, _float64(tf.maximum(second - tf.square(mean), 0.0)),
                                     ratio)

        def scaled():  # fitted to x times a power of two near 1 / mean (exact), then unscaled
            scale = _power_of_two_near_inverse(mean, x.dtype)
            scaled_mean = _float64(mean * scale)
            norm = _float64(tf.math.reduce_euclidean_norm(x * scale))
            variance = tf.maximum(tf.square(norm) / _float64(count) - tf.square(scaled_mean), 0.0)
            return gpareto_threshold(scaled_mean, variance, ratio) / _float64(scale)

        eta = _by_scale(mean, plain, scaled)
    else:  # "gamma"
        # s = -mean(ln(x/mean + eps)) = ln(mean) - mean(ln(x + eps*mean)); eps
        # (machine epsilon) relative to the mean keeps exact zeros finite.
        eps = tf.constant(tf.experimental.numpy.finfo(x.dtype.as_numpy_dtype).eps, x.dtype)
        safe_mean = tf.where(mean > 0, mean, tf.ones_like(mean))
        if exclude_zeros:
            logs = tf.math.log(tf.where(x > 0, x, safe_mean)) - tf.math.log(safe_mean)
            log_gap = -tf.reduce_sum(logs) / count
        else:
            mean_log = tf.reduce_sum(tf.math.log(x + eps * safe_mean)) / count
            log_gap = tf.math.log(safe_mean) - mean_log
        eta = gamma_threshold(mean, tf.maximum(log_gap, 0.0), ratio)
    return tf.where(mean > 0, eta, tf.zeros_like(eta))


def multistage_threshold(
    magnitudes, ratio, stages, distribution, first_ratio=FIRST_RATIO, exclude_zeros=False
):
    """SIDCo's (multi-stage) threshold for non-negative `magnitudes`.

    Args:
        magnitudes: 1-D tensor of |g|.
        ratio: target fraction kept, a Python float in (0, 1].
        stages: number of stages (Python int or int tensor, >= 1).
        distribution: "exponential", "gpareto" or "gamma" (gamma fits stage 1
            only; later stages use the generalized Pareto, as in the paper).
        first_ratio: the ratio of stage 1 when there are several stages.
        exclude_zeros: fit the nonzero magnitudes only, asking for the same
            count (see `fit_threshold`); later stages see only survivors,
            which are nonzero anyway.

    Returns:
        The threshold as a float64 scalar; elements with magnitude above it
        are sent.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> a = tf.constant(np.random.default_rng(0).exponential(size=100_000))
        >>> eta = multistage_threshold(a, 0.01, 2, "exponential")
        >>> 800 < int(tf.reduce_sum(tf.cast(a > eta, tf.int32))) < 1250
        True
    """
    x = _moment_dtype(magnitudes)
    count = tf.size(x)
    if exclude_zeros:
        count = nonzero_count(x)
        ratio = _nonzero_ratio(ratio, tf.size(x), count)
    first, later = stage_ratios(ratio, stages, first_ratio)
    eta = _fit(x, first, distribution, count, exclude_zeros)
    later_distribution = "gpareto" if distribution == "gamma" else distribution
    stages = tf.cast(stages, tf.int32)
    n_later = tf.where(_float64(ratio) < first_ratio, stages - 1, 0)

    def refine(i, eta):
        count, low, mean, variance, unit = survivor_moments(x, eta)
        if later_distribution == "exponential":
            shifted = exponential_threshold(mean, later)
        else:
            shifted = gpareto_threshold(mean, variance, later)
        fitted = tf.where(mean > 0, shifted, tf.zeros_like(shifted)) * unit + low
        return i + 1, tf.where(count > 0, fitted, eta)

    _, eta = tf.while_loop(lambda i, eta: i < n_later, refine, (tf.constant(0), eta))
    return eta


def _survivor_sums(magnitudes, threshold):
    """count, min, sum and sum of squares of the survivors' excess over `threshold`, and a unit.

    The sums are of the excess divided by the unit: 1 for a `threshold` in
    2**-40 .. 2**40, else a power of two near it (`_by_scale`), so that they
    stay in the dtype's range and in float64's (a float64 excess of 1e160
    has a square beyond it).

    Masked reductions over the whole tensor: compacting the survivors
    (``tf.where``) is several times slower while they are many (25% after
    stage 1). Sums use the dtype of `magnitudes` (Eigen's tree reductions
    keep float32 sums of 25M elements to ~1e-7 relative).
    """
    threshold = tf.cast(threshold, magnitudes.dtype)
    above = magnitudes > threshold
    zero = tf.zeros([], magnitudes.dtype)
    largest = tf.constant(magnitudes.dtype.max, magnitudes.dtype)
    excess = tf.where(above, magnitudes - threshold, zero)  # scalars broadcast: no fills
    count = tf.reduce_sum(tf.cast(above, tf.int32))
    low = tf.reduce_min(tf.where(above, magnitudes, largest))

    def plain():
        return (_float64(tf.reduce_sum(excess)), _float64(tf.reduce_sum(tf.square(excess))),
                tf.constant(1.0, tf.float64))

    def scaled():  # the excess times a power of two near 1 / threshold (exact)
        scale = _power_of_two_near_inverse(threshold, magnitudes.dtype)
        scaled_excess = excess * scale
        return (_float64(tf.reduce_sum(scaled_excess)),
                _float64(tf.reduce_sum(tf.square(scaled_excess))), 1.0 / _float64(scale))

    total, squares, unit = _by_scale(threshold, plain, scaled)
    return count, _float64(low), total, squares, unit


def _by_scale(reference, plain, scaled):
    """``plain()`` for magnitudes near `reference` in 2**-40 .. 2**40, else ``scaled()``.

    A sum of squares in float32 loses the small ones below about 1e-19 and
    overflows above about 1e19. ``scaled()`` works on the values times a
    power of two near ``1 / reference``, which keeps them in range at any
    scale, but costs a pass more; within the range ``plain()`` is exact
    enough (and was used alone before).
    """
    reference = _float64(reference)
    return tf.cond((reference > 2.0**-40) & (reference < 2.0**40), plain, scaled)


# The largest binary exponent of a scale factor per dtype: the factor and
# its inverse stay normal numbers of the dtype.
_SCALE_EXPONENT_LIMIT = {tf.float16: 14, tf.bfloat16: 126, tf.float32: 126, tf.float64: 1022}


def _power_of_two_near_inverse(reference, dtype):
    """``2**-round(log2(reference))`` in `dtype`; 1 where `reference` is not positive and finite.

    Multiplying by it is exact (in the normal range), so a sum of squares of
    the scaled values is exactly the scale's square times the plain one,
    without leaving the dtype's range.
    """
    reference = _float64(reference)
    usable = tf.math.is_finite(reference) & (reference > 0)
    exponent = -tf.round(tf.math.log(tf.where(usable, reference, 1.0)) / math.log(2.0))
    limit = float(_SCALE_EXPONENT_LIMIT[dtype])
    exponent = tf.clip_by_value(tf.where(usable, exponent, 0.0), -limit, limit)
    return tf.cast(tf.pow(tf.constant(2.0, tf.float64), exponent), dtype)


def survivor_moments(magnitudes, threshold):
    """Moments of the elements above `threshold`, shifted by their minimum.

    Returns ``(count, low, mean, variance, unit)`` (int32 count, float64
    others): the mean and variance of ``(x - low) / unit`` over ``x =
    magnitudes[magnitudes > threshold]``, ``low`` their minimum, without
    extracting them (sums of the excess over `threshold`). ``unit`` is 1 for
    a `threshold` in 2**-40 .. 2**40, else a power of two near it, which
    keeps the variance in float64's range at any magnitude. An empty set
    gives count 0 (the rest is then meaningless).
    """
    threshold = _float64(threshold)
    count, low, excess, excess_squares, unit = _survivor_sums(magnitudes, threshold)
    n = tf.maximum(tf.cast(count, tf.float64), 1.0)
    mean_excess = excess / n
    variance = tf.maximum(excess_squares / n - tf.square(mean_excess), 0.0)
    return count, low, mean_excess - (low - threshold) / unit, variance, unit
