"""sidco_select on both paths (compiled op and pure TensorFlow) against a NumPy reference."""

import math

import numpy as np
import pytest
import scipy.special
import tensorflow as tf

from tfsparse.compression import SIDCo
from tfsparse.compression.sidco_select import sidco_select
from tfsparse.ops import kernels

from kernel_paths import PATHS, VARIANTS

DISTRIBUTIONS = ["exponential", "gpareto", "gamma"]
# float32 moments: both paths sum float32 values in blocks or trees of at
# most a few thousand terms (relative error ~1e-7, at worst ~1e-5 for 2**7
# sequential terms per lane) before float64; the estimators are smooth in
# the moments (gamma through s ~ 0.5 on these data), so 2e-5 covers both.
FLOAT32_RTOL = 2e-5


def _fit(x, ratio, distribution, exclude_zeros, eps):
    """thresholds._fit in float64: x holds the fitted magnitudes (nonzeros if exclude_zeros)."""
    m = x.mean() if x.size else 0.0
    if m <= 0:
        return 0.0
    if distribution == "exponential":
        return -m * math.log(ratio)
    if distribution == "gpareto":
        v = x.var()
        if v <= 1e-12 * m * m:
            return m
        q = m * m / v
        alpha, k = 0.5 * m * (q + 1), 0.5 * (q - 1)
        return -alpha * math.log(ratio) if abs(k) < 1e-8 else alpha * (1 - ratio**k) / k
    logs = np.log(x) if exclude_zeros else np.log(x + eps * m)
    s = max(math.log(m) - logs.mean(), 0.0)
    if s <= 1e-12:
        return m
    shape = (3 - s + math.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)
    return m / shape * scipy.special.gammainccinv(shape, ratio)


def reference_threshold(a, ratio, stages, distribution, exclude_zeros, first_ratio=0.25):
    """SIDCo's multi-stage threshold for magnitudes `a` (exact nonzero count)."""
    eps = np.finfo(a.dtype).eps
    a64 = a.astype(np.float64)
    x = a64[a64 > 0] if exclude_zeros else a64
    if exclude_zeros:
        ratio = min(ratio * a.size / max(x.size, 1), 1.0)
    if stages <= 1 or ratio >= first_ratio:
        return _fit(x, ratio, distribution, exclude_zeros, eps)
    eta = _fit(x, first_ratio, distribution, exclude_zeros, eps)
    later = (ratio / first_ratio) ** (1 / (stages - 1))
    for _ in range(stages - 1):
        survivors = a64[a > a.dtype.type(eta)]  # compared in the input dtype, as both paths do
        if survivors.size == 0:
            break
        low = survivors.min()
        refit = "gpareto" if distribution == "gamma" else distribution
        eta = _fit(survivors - low, later, refit, False, eps) + low
    return eta


def _gradient(family, size, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    if family == "laplace":
        g = rng.laplace(size=size)
    elif family == "normal":
        g = rng.normal(size=size)
    else:  # Student-t(3) with 40% dead units (exact zeros)
        g = rng.standard_t(3, size=size)
        g[rng.random(size) < 0.4] = 0.0
    return g.astype(dtype)


def _check_selection(g, values, indices, threshold):
    """The positions with |g| > float(threshold), or the largest if none and not all zero."""
    magnitudes = np.abs(g)
    expected = np.flatnonzero(magnitudes > g.dtype.type(threshold))
    if expected.size == 0 and magnitudes.max(initial=0) > 0:
        expected = np.array([np.argmax(magnitudes)])
    assert indices.dtype == tf.int32
    np.testing.assert_array_equal(indices.numpy(), expected)
    np.testing.assert_array_equal(values.numpy(), g[expected])


def _select_and_check(g, ratio, stages, distribution, exclude_zeros, use_kernel,
                      rel=FLOAT32_RTOL):
    """Runs sidco_select on g; checks its threshold against the NumPy reference
    (to ``rel``) and its selection against that threshold. Returns its outputs."""
    values, indices, eta = sidco_select(
        tf.constant(g), ratio, stages, distribution, exclude_zeros=exclude_zeros,
        use_kernel=use_kernel)
    expected = reference_threshold(np.abs(g), ratio, stages, distribution, exclude_zeros)
    assert float(eta) == pytest.approx(expected, rel=rel)
    _check_selection(g, values, indices, float(eta))
    return values, indices, eta


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("stages", [1, 3])
@pytest.mark.parametrize("exclude_zeros", [True, False])
@pytest.mark.parametrize("family", ["laplace", "normal", "dead_student_t3"])
def test_matches_numpy_reference(use_kernel, distribution, stages, exclude_zeros, family):
    g = _gradient(family, 60_000, seed=len(family))
    _, _, eta = _select_and_check(g, 0.01, stages, distribution, exclude_zeros, use_kernel)
    assert eta.dtype == tf.float64


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_float64_matches_numpy_reference_closely(use_kernel, distribution):
    g = _gradient("dead_student_t3", 50_000, seed=3, dtype=np.float64)
    # float64 sums on all sides, in different orders: ~1e-13 relative.
    values, _, _ = _select_and_check(g, 0.001, 2, distribution, True, use_kernel, rel=1e-9)
    assert values.dtype == tf.float64



@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("exclude_zeros", [True, False])
def test_gamma_fit_of_tightly_spread_magnitudes(use_kernel, exclude_zeros):
    # |g| uniform in [1, 1.5]: s = ln(mean) - mean(ln|g|) is only ~0.007, so
    # the threshold moves by ~1e-3 for an error of 1e-5 in mean(ln|g|): this
    # checks the op's vectorized log to ~1e-7. The float32 logs of both paths
    # (errors ~1e-7 each, averaging out) keep s to ~1e-6 relative.
    rng = np.random.default_rng(9)
    g = (rng.uniform(1.0, 1.5, 60_000) * rng.choice([-1.0, 1.0], 60_000)).astype(np.float32)
    _select_and_check(g, 0.01, 1, "gamma", exclude_zeros, use_kernel)

@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("stages", [1, 4])
def test_paths_agree_with_sampled_nonzero_count_and_threads(variant, distribution, stages):
    # 2.2M elements: above EXACT_COUNT_LIMIT (both paths sample the same
    # chunks) and above 2**21, where the op splits its passes over 2 parts.
    size = 2_200_001
    g = _gradient("laplace", size, seed=4)
    rows = g[: size // 256 * 256].reshape(-1, 256)
    rows[np.random.default_rng(5).random(len(rows)) < 0.4] = 0.0  # dead units in runs
    flat = tf.constant(g)
    kernel = sidco_select(flat, 0.001, stages, distribution, exclude_zeros=True, use_kernel=True)
    fallback = sidco_select(flat, 0.001, stages, distribution, exclude_zeros=True, use_kernel=False)
    assert float(kernel[2]) == pytest.approx(float(fallback[2]), rel=FLOAT32_RTOL)
    for values, indices, eta in (kernel, fallback):
        _check_selection(g, values, indices, float(eta))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("exclude_zeros", [True, False])
@pytest.mark.parametrize("sample_scale", [1.0, 0.01, 100.0])
def test_selection_is_exact_whatever_the_sample_guesses(variant, distribution, exclude_zeros,
                                                        sample_scale):
    # From 2**18 elements the op fits 16 evenly spaced chunks of 2048
    # elements first, for a threshold below stage 1's; pass 1 keeps the
    # elements above it, pass 2 filters them. Scaled down, the sample guesses
    # far too low (most elements kept, then filtered); scaled up, above the
    # real threshold (pass 2 selects from all of x again): neither may change
    # the threshold (that of the TensorFlow path, which samples the same
    # nonzero count above EXACT_COUNT_LIMIT) or the selection.
    size = 300_001
    g = _gradient("dead_student_t3", size, seed=12)
    for j in range(16):
        begin = (size - 2048) * j // 15
        g[begin:begin + 2048] *= sample_scale
    kernel = sidco_select(tf.constant(g), 0.01, 1, distribution, exclude_zeros=exclude_zeros,
                          use_kernel=True)
    fallback = sidco_select(tf.constant(g), 0.01, 1, distribution, exclude_zeros=exclude_zeros,
                            use_kernel=False)
    assert float(kernel[2]) == pytest.approx(float(fallback[2]), rel=FLOAT32_RTOL)
    _check_selection(g, *kernel)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("exclude_zeros", [True, False])
def test_edge_cases(use_kernel, distribution, exclude_zeros):
    def run(g, ratio=0.01, stages=3):
        return sidco_select(tf.constant(g, tf.float32), ratio, stages, distribution,
                            exclude_zeros=exclude_zeros, use_kernel=use_kernel)

    for empty in (np.zeros(0), np.zeros(1000)):  # nothing to send, no NaN
        values, indices, eta = run(empty)
        assert indices.shape == (0,) and values.shape == (0,) and float(eta) == 0.0
    # Fewer elements than 1 / ratio: the largest magnitude is still sent.
    _, indices, _ = run([0.0, 0.5, -3.0, 1.0])
    assert indices.numpy().tolist() == [2]
    # Constant magnitudes: a finite threshold at or above them (gpareto and
    # gamma degenerate to the mean), so the first largest is sent.
    values, indices, eta = run(np.full(5000, -2.0))
    assert math.isfinite(float(eta)) and float(eta) >= 2.0
    assert indices.numpy().tolist() == [0] and values.numpy().tolist() == [-2.0]


@pytest.mark.parametrize("use_kernel", PATHS)
def test_inside_tf_function_with_a_stage_variable(use_kernel):
    g = _gradient("normal", 40_000, seed=6)
    stages = tf.Variable(1)
    compiled = tf.function(
        lambda flat: sidco_select(flat, 0.01, stages, "gpareto", exclude_zeros=True, use_kernel=use_kernel)
    )
    for count in (1, 4):
        stages.assign(count)
        values, indices, eta = compiled(tf.constant(g))
        assert float(eta) == pytest.approx(
            reference_threshold(np.abs(g), 0.01, count, "gpareto", True), rel=FLOAT32_RTOL)
        _check_selection(g, values, indices, float(eta))


def test_half_precision_runs_on_the_tensorflow_path():
    g = _gradient("laplace", 20_000, seed=7)
    values, indices, _ = sidco_select(tf.constant(g, tf.float16), 0.01, 2, "exponential")
    assert values.dtype == tf.float16
    assert 150 <= int(tf.size(indices)) <= 260


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("distribution", ["exponential", "gpareto", "gamma"])
def test_half_precision_later_stages_fit_in_float32(distribution, dtype):
    # |g| about 100: the survivors' excess over stage 1's threshold sums to
    # about 5e6 and its squares far more, beyond float16's 65504. The later
    # stages' moments are float32 (as stage 1's), so the threshold is the
    # float32 one of the same (rounded) values; before, float16 gave inf.
    g = (100 * _gradient("laplace", 200_000, seed=9)).astype(np.float32)
    half = tf.cast(tf.constant(g), dtype)
    _, indices, eta = sidco_select(half, 0.001, 3, distribution)
    want = reference_threshold(np.abs(tf.cast(half, tf.float64).numpy()), 0.001, 3,
                               distribution, False)
    assert float(eta) == pytest.approx(want, rel=FLOAT32_RTOL)
    assert 100 <= int(tf.size(indices)) <= 400  # 200 asked


@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_model_export_uses_core_ops_only(variant, tmp_path):
    module = tf.Module()
    module.compressor = SIDCo(0.01)
    module.compress = tf.function(
        module.compressor.compress, input_signature=[tf.TensorSpec([None], tf.float32)]
    )
    g = tf.constant(_gradient("laplace", 10_000, seed=8))
    eager_values, eager_indices = module.compress(g)  # traced with the op
    assert "TfsparseSidco" in str(
        module.compress.get_concrete_function().graph.as_graph_def())
    tf.saved_model.save(module, str(tmp_path))
    assert b"TfsparseSidco" not in (tmp_path / "saved_model.pb").read_bytes()
    loaded = tf.saved_model.load(str(tmp_path))
    values, indices = loaded.compress(g)
    # Thresholds agree to float32 rounding; on 1e4 elements no magnitude lies that close.
    np.testing.assert_array_equal(indices.numpy(), eager_indices.numpy())
    np.testing.assert_array_equal(values.numpy(), eager_values.numpy())



@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("exclude_zeros", [True, False])
def test_gamma_fit_of_magnitudes_spread_over_many_exponents(use_kernel, exclude_zeros):
    # log-uniform |g| over 1e-8..1e8 (54 binary exponents), 30% zeros, and a
    # size that leaves a partial block: the op sums ln|g| as exponents plus
    # the log of a running product of mantissas; s ~ 15 here, where the
    # threshold moves ~like s, so FLOAT32_RTOL checks mean(ln|g|) to ~1e-4 absolute.
    rng = np.random.default_rng(10)
    size = 70_001
    g = (10.0 ** rng.uniform(-8, 8, size) * rng.choice([-1.0, 1.0], size)).astype(np.float32)
    g[rng.random(size) < 0.3] = 0.0
    _select_and_check(g, 0.01, 1, "gamma", exclude_zeros, use_kernel)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("magnitude", [0.3, 2.0, 1e-20])
def test_gamma_fit_of_constant_magnitudes_is_their_mean(variant, magnitude):
    # s = ln(mean) - mean(ln|g|) must be exactly 0, or the threshold moves
    # like sqrt(s): s = 1e-11 would put it 2.5e-5 above the mean. Zeros are
    # excluded; 5 blocks of 2048 and a tail.
    g = np.full(10_300, -magnitude, np.float32)
    g[::7] = 0.0
    _, indices, eta = sidco_select(tf.constant(g), 0.01, 1, "gamma", exclude_zeros=True, use_kernel=True)
    # Equal magnitudes: their mean is that magnitude exactly, on every variant
    # (not the float block sums, which drift with the number of terms a vector
    # lane adds: 1.7e-5 relative on AVX2 for 0.3).
    assert float(eta) == float(np.float32(magnitude))
    assert indices.numpy().tolist() in ([1], np.flatnonzero(np.abs(g) > np.float32(float(eta))).tolist())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("ratio", [0.2, 0.025, 0.02, 0.01, 0.005, 0.001, 0.0001])
def test_every_compaction_selects_exactly_the_elements_above(variant, ratio):
    # The op compacts by 16-lane compress or by bit scans with one or two
    # branch-free copies per 64 elements, by the expected fraction of
    # survivors (each method at least twice here); a size that is not
    # a multiple of 64 leaves a tail for the scalar loop.
    g = _gradient("laplace", 100_003, seed=11)
    values, indices, eta = sidco_select(tf.constant(g), ratio, 1, "exponential", use_kernel=True)
    _check_selection(g, values, indices, float(eta))
    assert int(tf.size(indices)) == pytest.approx(ratio * g.size, rel=0.2, abs=5)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("distribution,stages", [("gpareto", 1), ("gamma", 3), ("exponential", 3)])
@pytest.mark.parametrize("scale", [1e-20, 1e18])
def test_float32_magnitudes_far_from_one_select_what_they_select_at_scale_one(
        use_kernel, distribution, stages, scale):
    # The sums of squares (gpareto's variance, the later stages') were taken
    # in float32: at 1e-20 the squares fell below its normal range and the
    # variance was lost (gpareto kept 36,809 of 100,000 at ratio 0.01), at
    # 1e18 they overflowed (16 kept). The thresholds are scale-equivariant,
    # so scaling by a power of two must keep the same elements.
    g = _gradient("laplace", 100_000, seed=21)
    power = np.float32(2.0 ** round(np.log2(scale)))
    unit = sidco_select(tf.constant(g), 0.01, stages, distribution, use_kernel=use_kernel)
    far = sidco_select(tf.constant(g * power), 0.01, stages, distribution, use_kernel=use_kernel)
    np.testing.assert_array_equal(far[1].numpy(), unit[1].numpy())
    assert float(far[2]) == pytest.approx(float(unit[2]) * float(power), rel=FLOAT32_RTOL)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("distribution,stages", [("gpareto", 1), ("gpareto", 3), ("gamma", 3),
                                                 ("exponential", 3)])
@pytest.mark.parametrize("exponent", [-1000, -530, 520, 1000])
def test_float64_magnitudes_far_from_one_select_what_they_select_at_scale_one(
        use_kernel, distribution, stages, exponent):
    # float64 magnitudes beyond about 2**+-511 have squares outside double's
    # range: the variance (gpareto's, the later stages') overflowed or was
    # lost (gpareto kept 1 or 36,809 of 100,000 at ratio 0.01, on both
    # paths). Scaling by a power of two must keep the same elements.
    g = _gradient("laplace", 100_000, seed=21, dtype=np.float64)
    power = 2.0 ** exponent
    unit = sidco_select(tf.constant(g), 0.01, stages, distribution, use_kernel=use_kernel)
    far = sidco_select(tf.constant(g * power), 0.01, stages, distribution, use_kernel=use_kernel)
    np.testing.assert_array_equal(far[1].numpy(), unit[1].numpy())
    assert float(far[2]) == pytest.approx(float(unit[2]) * power, rel=1e-12)
