"""SIDCo's estimators against NumPy/SciPy references written here."""

import math

import numpy as np
import pytest
import scipy.special
import scipy.stats
import tensorflow as tf

from tfsparse.compression import thresholds

SHAPES = [0.01, 0.05, 0.1, 0.5, 0.9, 1.0, 1.5, 3.0, 10.0, 100.0, 1000.0, 1e5]
PROBABILITIES = [1e-12, 1e-8, 1e-4, 1e-3, 0.01, 0.25, 0.5, 0.75, 0.99, 0.999999]


def _grid(reference):
    a, p = np.meshgrid(SHAPES, PROBABILITIES)
    expected = reference(a, p)
    # Below ~1e-250 the answer underflows toward float64's subnormals, where
    # relative accuracy is meaningless (SciPy itself returns 0 for some).
    keep = expected > 1e-250
    return a[keep], p[keep], expected[keep]


@pytest.mark.parametrize(
    "ours, reference",
    [
        (thresholds.gammaincinv, scipy.special.gammaincinv),
        (thresholds.gammainccinv, scipy.special.gammainccinv),
    ],
)
def test_inverse_incomplete_gamma_matches_scipy(ours, reference):
    a, p, expected = _grid(reference)
    result = ours(tf.constant(a), tf.constant(p)).numpy()
    # Halley's method converges cubically; what is left is the float64
    # accuracy of igamma/igammac (~1e-14) amplified by the condition number of
    # the inverse, which stays below ~1e3 on this grid: 1e-10 relative.
    np.testing.assert_allclose(result, expected, rtol=1e-10)


def test_inverse_incomplete_gamma_round_trip_and_edges():
    a = tf.constant([0.3, 2.0, 40.0], tf.float64)
    x = thresholds.gammainccinv(a, tf.constant(0.001, tf.float64))
    np.testing.assert_allclose(tf.math.igammac(a, x).numpy(), 0.001, rtol=1e-11)
    assert float(thresholds.gammainccinv(1.0, 1.0)) == 0.0
    assert math.isinf(float(thresholds.gammainccinv(1.0, 0.0)))
    # Q(1, x) = exp(-x): the inverse is -ln q.
    assert float(thresholds.gammainccinv(1.0, 1e-3)) == pytest.approx(-math.log(1e-3), rel=1e-12)
    assert thresholds.gammainccinv(tf.constant(2.0, tf.float32), 0.01).dtype == tf.float32


def test_exponential_threshold_is_the_exponential_quantile():
    mean, ratio = 0.37, 0.001
    eta = float(thresholds.exponential_threshold(mean, ratio))
    assert math.exp(-eta / mean) == pytest.approx(ratio, rel=1e-12)


@pytest.mark.parametrize("mean, variance", [(1.0, 0.5), (1.0, 1.0), (2.0, 9.0), (0.01, 3e-4)])
@pytest.mark.parametrize("ratio", [0.25, 0.01, 0.001])
def test_gpareto_threshold_is_the_quantile_of_the_moment_fit(mean, variance, ratio):
    # Reference: fit SciPy's genpareto by the method of moments (its shape
    # c = -k in the paper's notation), then ask for its quantile 1 - ratio.
    c = 0.5 * (1.0 - mean**2 / variance)
    scale = mean * (1.0 - c)
    expected = scipy.stats.genpareto.isf(ratio, c, scale=scale)
    eta = float(thresholds.gpareto_threshold(mean, variance, ratio))
    assert eta == pytest.approx(expected, rel=1e-10)


def test_gpareto_threshold_degenerate_cases():
    # Zero variance: every magnitude equals the mean.
    assert float(thresholds.gpareto_threshold(2.0, 0.0, 0.01)) == 2.0
    # Exponential moments (v = m^2): k = 0, the limit -m ln(ratio).
    assert float(thresholds.gpareto_threshold(3.0, 9.0, 0.01)) == pytest.approx(-3.0 * math.log(0.01))


@pytest.mark.parametrize("shape, scale", [(0.5, 2.0), (1.0, 1.0), (3.0, 0.1)])
def test_gamma_threshold_recovers_the_gamma_quantile(shape, scale):
    sample = np.random.default_rng(0).gamma(shape, scale, size=400_000)
    mean = sample.mean()
    log_gap = math.log(mean) - np.log(sample).mean()
    # The reference: SciPy's quantile of the gamma whose shape is the same
    # closed-form approximation of the maximum-likelihood estimate.
    s = log_gap
    fitted_shape = (3 - s + math.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)
    expected = scipy.stats.gamma.isf(0.01, fitted_shape, scale=mean / fitted_shape)
    eta = float(thresholds.gamma_threshold(mean, log_gap, 0.01))
    assert eta == pytest.approx(expected, rel=1e-9)
    # And the approximation recovers the true quantile (sampling error of
    # the fit on 400k samples: about 1%).
    assert eta == pytest.approx(scipy.stats.gamma.isf(0.01, shape, scale=scale), rel=0.03)


def test_max_stages_and_stage_ratios():
    assert thresholds.max_stages(0.5) == 1
    assert thresholds.max_stages(0.25) == 2
    assert thresholds.max_stages(0.1) == 4
    assert thresholds.max_stages(0.01) == 7
    assert thresholds.max_stages(0.001) == 10
    first, later = thresholds.stage_ratios(0.001, 4)
    assert float(first) == 0.25
    assert float(later) == pytest.approx((0.001 / 0.25) ** (1 / 3))
    assert float(first) * float(later) ** 3 == pytest.approx(0.001)
    first, later = thresholds.stage_ratios(0.001, 1)
    assert (float(first), float(later)) == (0.001, 1.0)
    first, _ = thresholds.stage_ratios(0.3, 3)
    assert float(first) == 0.3


def reference_fit(x, ratio, distribution):
    m = x.mean()
    if m == 0:
        return 0.0
    if distribution == "exponential":
        return -m * math.log(ratio)
    if distribution == "gpareto":
        q = m * m / x.var()
        alpha, k = 0.5 * m * (q + 1), 0.5 * (q - 1)
        return alpha * (1 - ratio**k) / k
    s = math.log(m) - np.mean(np.log(x / m + np.finfo(x.dtype).eps) + math.log(m))
    shape = (3 - s + math.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)
    return m / shape * scipy.special.gammainccinv(shape, ratio)


def reference_multistage(a, ratio, stages, distribution):
    """The paper's multi-stage estimate, in NumPy."""
    if stages == 1 or ratio >= 0.25:
        return reference_fit(a, ratio, distribution)
    eta = reference_fit(a, 0.25, distribution)
    later = (ratio / 0.25) ** (1 / (stages - 1))
    x = a
    for _ in range(stages - 1):
        x = x[x > eta]
        low = x.min()
        eta = reference_fit(x - low, later, "gpareto" if distribution == "gamma" else distribution) + low
    return eta


@pytest.mark.parametrize("distribution", ["exponential", "gpareto", "gamma"])
@pytest.mark.parametrize("stages", [1, 2, 4])
@pytest.mark.parametrize("family", ["laplace", "normal", "student_t3"])
def test_multistage_threshold_matches_numpy_reference(distribution, stages, family):
    rng = np.random.default_rng(7)
    draw = {"laplace": rng.laplace, "normal": rng.normal,
            "student_t3": lambda size: rng.standard_t(3, size=size)}[family]
    a = np.abs(draw(size=100_000))
    eta = float(thresholds.multistage_threshold(tf.constant(a), 0.001, stages, distribution))
    expected = reference_multistage(a, 0.001, stages, distribution)
    # float64 on both sides; the sums differ only in summation order (~1e-13).
    assert eta == pytest.approx(expected, rel=1e-9)


def test_multistage_threshold_in_float32_and_graph_mode():
    a = np.abs(np.random.default_rng(8).laplace(size=50_000)).astype(np.float32)
    compiled = tf.function(thresholds.multistage_threshold, reduce_retracing=True)
    eta = float(compiled(tf.constant(a), 0.01, tf.constant(3), "gpareto"))
    expected = reference_multistage(a.astype(np.float64), 0.01, 3, "gpareto")
    # float32 sums over 5e4 elements: relative error ~1e-6 in the moments.
    assert eta == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("distribution", ["exponential", "gpareto", "gamma"])
def test_fit_threshold_of_zeros_and_constants_is_finite(distribution):
    assert float(thresholds.fit_threshold(tf.zeros([10]), 0.01, distribution)) == 0.0
    assert float(thresholds.fit_threshold(tf.zeros([0]), 0.01, distribution)) == 0.0
    constant = float(thresholds.fit_threshold(tf.fill([10], 2.0), 0.01, distribution))
    assert math.isfinite(constant) and constant >= 2.0


def test_fit_threshold_rejects_unknown_distribution():
    with pytest.raises(ValueError, match='"distribution".*Received: distribution=\'cauchy\''):
        thresholds.fit_threshold(tf.ones([3]), 0.1, "cauchy")


def test_nonzero_count_exact_below_the_limit():
    x = np.abs(np.random.default_rng(9).laplace(size=10_000)).astype(np.float32)
    x[::3] = 0
    assert float(thresholds.nonzero_count(tf.constant(x))) == np.count_nonzero(x)


def test_nonzero_count_sampled_above_the_limit_even_with_runs_of_zeros():
    size = 2_000_003
    x = np.abs(np.random.default_rng(10).laplace(size=size)).astype(np.float32)
    # Dead units: 40% of the tensor in zero runs of 256 (rows of a kernel).
    rows = x[: size // 256 * 256].reshape(-1, 256)
    rows[np.random.default_rng(11).random(len(rows)) < 0.4] = 0
    estimate = float(thresholds.nonzero_count(tf.constant(x)))
    # 16-element chunks every 31 chunks (496 elements): ~4,030 chunks, at
    # most one per run of 256, so the sd of the fraction is at most
    # sqrt(0.24 / 4030) = 0.8%; 5 sd of the 60% kept is 6.5% relative.
    assert estimate == pytest.approx(np.count_nonzero(x), rel=0.065)


def reference_multistage_nonzero(a, ratio, stages, distribution):
    """The same estimate on the nonzeros, asking for the same count."""
    nonzero = a[a > 0]
    return reference_multistage(nonzero, min(1.0, ratio * a.size / nonzero.size), stages, distribution)


@pytest.mark.parametrize("distribution", ["exponential", "gpareto", "gamma"])
@pytest.mark.parametrize("stages", [1, 3])
def test_exclude_zeros_fits_the_nonzeros_for_the_same_count(distribution, stages):
    rng = np.random.default_rng(12)
    a = np.abs(rng.laplace(size=200_000))
    a[rng.random(a.size) < 0.4] = 0.0
    eta = float(thresholds.multistage_threshold(tf.constant(a), 0.001, stages, distribution,
                                                exclude_zeros=True))
    assert eta == pytest.approx(reference_multistage_nonzero(a, 0.001, stages, distribution), rel=1e-9)
    # The count asked for is reached from the nonzeros: Laplace magnitudes,
    # ~200 expected (Poisson sd 14; fit error adds a few %).
    assert 150 <= np.count_nonzero(a > eta) <= 260


def test_exclude_zeros_with_fewer_nonzeros_than_asked_selects_all_nonzeros():
    a = np.zeros(10_000)
    a[:5] = [1.0, 2.0, 3.0, 4.0, 5.0]
    for distribution in ["exponential", "gpareto", "gamma"]:
        eta = float(thresholds.fit_threshold(tf.constant(a), 0.01, distribution, exclude_zeros=True))
        assert eta == 0.0
