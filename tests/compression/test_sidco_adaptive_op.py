"""Adaptive SIDCo on both paths (fused op, pure TensorFlow) against a NumPy reference of the rule."""

import importlib
import math

import numpy as np
import pytest
import tensorflow as tf

from tfsparse.compression import SIDCo
from tfsparse.compression.sidco import initial_adaptation
from tfsparse.compression.sidco import unpack_adaptation
from tfsparse.compression.sidco_select import sidco_select
from tfsparse.compression.sidco_select import sidco_select_adaptive
from tfsparse.ops import kernels

from kernel_paths import PATHS, VARIANTS

# The module, not the function the package re-exports under the same name.
select_module = importlib.import_module("tfsparse.compression.sidco_select")
MAX_STAGES = 7  # ratio 0.01
ADAPT_EVERY = 5
F32 = np.float32


def reference_observe(stages, state, achieved, target, band=(0.8, 1.2), memory=10):
    """SIDCo._observe + next_stage_count in NumPy float32/int arithmetic.

    Returns (new stage count, new adaptation vector, the branch taken or None).
    """
    slots = MAX_STAGES + 1
    calls, total, windows = int(state[0]), F32(state[1]), int(state[2])
    qualities = np.asarray(state[3:3 + slots], np.float32).copy()
    recorded = np.asarray(state[3 + slots:], np.int64).copy()
    valid = achieved > 0
    quality = F32(achieved) / F32(max(target, 1))
    calls += int(valid)
    total = F32(total + (quality if valid else F32(0)))
    if calls < ADAPT_EVERY:
        return stages, [calls, total, windows, *qualities, *recorded], None
    mean = F32(total / F32(calls))
    qualities[stages], recorded[stages] = mean, windows
    # float64 logs of the float32 values: the paths' float32 logs decide the
    # same unless two |ln q| lie within a float32 rounding of each other.
    distance = abs(math.log(mean))

    def usable(count):
        if not 1 <= count <= MAX_STAGES:
            return False
        remembered = recorded[count] >= 0 and windows - recorded[count] < memory
        seen = max(qualities[count], F32(1e-30))
        return not (remembered and abs(math.log(seen)) >= distance)

    too_many = mean > F32(band[1])
    preferred, alternative = (stages - 1, stages + 1) if too_many else (stages + 1, stages - 1)
    if F32(band[0]) <= mean <= F32(band[1]):
        new, branch = stages, "in band"
    elif usable(preferred):
        new, branch = preferred, "preferred"
    elif usable(alternative):
        new, branch = alternative, "alternative"
    else:
        new, branch = stages, "both worse"
    return new, [0, 0, windows + 1, *qualities, *recorded], branch


@pytest.fixture
def on_path(monkeypatch):
    """on_path(True) serves SIDCo with the fused op, on_path(False) with pure TensorFlow."""

    def choose(use_kernel):
        if not use_kernel:
            monkeypatch.setattr(select_module, "use_compiled_kernels", lambda: False)
        else:
            monkeypatch.undo()

    return choose


def _random_case(rng):
    """A reachable adaptation state, a stage count and a gradient."""
    slots = MAX_STAGES + 1
    windows = int(rng.integers(0, 30))
    calls = int(rng.choice([ADAPT_EVERY - 1, ADAPT_EVERY - 1, rng.integers(0, ADAPT_EVERY)]))
    qualities = np.exp(rng.uniform(-2.0, 2.0, slots)).astype(np.float32)
    # Seen 0 to 11 windows ago (memory: 10, so around the expiry), or never.
    recorded = windows - rng.integers(0, 12, slots)
    recorded[(recorded < 0) | (rng.random(slots) < 0.2)] = -1
    total = F32(calls) * F32(np.exp(rng.uniform(-1.5, 1.5)))
    state = np.array([calls, total, windows, *qualities, *recorded], np.float64)
    family = rng.choice(["normal", "laplace", "t3", "zeros"])
    size = 2000
    g = {
        "normal": lambda: rng.normal(size=size),
        "laplace": lambda: rng.laplace(size=size),
        "t3": lambda: rng.standard_t(3, size=size),
        "zeros": lambda: np.zeros(size),
    }[family]()
    return int(rng.integers(1, MAX_STAGES + 1)), state, g.astype(np.float32)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_one_call_from_random_states_matches_the_reference(use_kernel, on_path):
    on_path(use_kernel)
    rng = np.random.default_rng(11)
    compressor = SIDCo(0.01)
    branches = set()
    for _ in range(120):
        stages, state, g = _random_case(rng)
        compressor.stages.assign(stages)
        compressor._adaptation.assign(state)
        _, indices = compressor.compress(tf.constant(g))
        expected_stages, expected_state, branch = reference_observe(stages, state, int(tf.size(indices)), 20)
        branches.add(branch)
        assert int(compressor.stages.numpy()) == expected_stages
        # Eager float32 arithmetic on both sides: exactly equal.
        np.testing.assert_array_equal(compressor._adaptation.numpy(), np.array(expected_state, np.float64))
    # Every branch of the rule was exercised, and windows that did not end.
    assert branches == {None, "in band", "preferred", "alternative", "both worse"}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", ["normal", "t3"])
def test_both_paths_adapt_alike_inside_tf_function(variant, family, on_path):
    rng = np.random.default_rng(12)
    g = tf.constant((rng.normal(size=100_000) if family == "normal"
                     else rng.standard_t(3, size=100_000)).astype(np.float32))
    trajectories, states = [], []
    for use_kernel in (True, False):
        on_path(use_kernel)
        compressor = SIDCo(0.01)
        compress = tf.function(compressor.compress)
        trajectory = []
        for _ in range(30):
            compress(g)
            trajectory.append(int(compressor.stages.numpy()))
        ops = {op.type for op in compress.get_concrete_function(g).graph.get_operations()}
        assert ("TfsparseSidcoAdaptive" in ops) == use_kernel
        trajectories.append(trajectory)
        states.append(compressor._adaptation.numpy())
    assert trajectories[0] == trajectories[1]
    assert len(set(trajectories[0])) > 1  # the count did move
    # Grappler turns the graph path's division by the (constant) target into
    # a multiplication by its reciprocal: each quality may differ by 1 ulp,
    # a window mean of 5 by a few (float32 ulp = 1.2e-7 relative).
    np.testing.assert_allclose(states[0], states[1], rtol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_values_read_before_the_op_keep_their_value(variant):
    # ReadVariableOp aliases the variable's buffer; the op must not write into it.
    g = tf.constant(np.random.default_rng(13).normal(size=50_000).astype(np.float32))
    compressor = SIDCo(0.01)
    held_stages = compressor.stages.read_value()
    held_state = compressor._adaptation.read_value()
    snapshot = held_state.numpy().copy()
    for _ in range(ADAPT_EVERY):
        compressor.compress(g)
    assert int(compressor.stages.numpy()) == 2  # Gaussian data: one more stage
    assert int(held_stages.numpy()) == 1
    np.testing.assert_array_equal(held_state.numpy(), snapshot)


@pytest.mark.parametrize("variant", VARIANTS)
def test_selection_is_that_of_sidco_select(variant):
    g = tf.constant(np.random.default_rng(14).standard_t(3, size=30_000).astype(np.float32))
    stages = tf.Variable(3)
    adaptation = tf.Variable(initial_adaptation(MAX_STAGES), dtype=tf.float64)
    values, indices, eta = sidco_select_adaptive(
        g, 0.01, stages, adaptation, "gpareto", exclude_zeros=True, max_stages=MAX_STAGES)
    expected = sidco_select(g, 0.01, 3, "gpareto", exclude_zeros=True, use_kernel=True)
    assert float(eta) == float(expected[2])
    np.testing.assert_array_equal(indices.numpy(), expected[1].numpy())
    np.testing.assert_array_equal(values.numpy(), expected[0].numpy())
    calls, total, windows, _, _ = unpack_adaptation(adaptation, MAX_STAGES)
    assert (int(calls), int(windows)) == (1, 0)
    assert float(total) == np.float32(int(tf.size(indices))) / np.float32(300)


@pytest.mark.parametrize("variant", VARIANTS)
def test_variables_of_the_wrong_shape_or_a_stage_count_out_of_range_raise(variant):
    g = tf.constant(np.random.default_rng(15).laplace(size=5_000).astype(np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"SIDCo's adaptation variable must be double \[19\], got double \[4\]"):
        sidco_select_adaptive(g, 0.01, tf.Variable(1), tf.Variable(tf.zeros([4], tf.float64)),
                              "exponential", max_stages=MAX_STAGES)
    state = np.array(initial_adaptation(MAX_STAGES))
    state[0] = ADAPT_EVERY - 1  # this call ends the window
    adaptation = tf.Variable(state)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"stage count must lie in \[0, 7\] when it adapts, got 9"):
        sidco_select_adaptive(g, 0.01, tf.Variable(9), adaptation, "exponential", max_stages=MAX_STAGES)
    np.testing.assert_array_equal(adaptation.numpy(), state)  # unchanged


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("sample_chunk, sample_chunks", [(2**40, 2**40), (0, 4096), (16, -1)])
def test_sample_sizes_out_of_range_are_an_error_in_both_ops(variant, sample_chunk, sample_chunks):
    # 2**40 * 2**40 wrapped to 0, the divisor of the sample's stride: the
    # process died of SIGFPE when the sampled count ran (more than
    # exact_count_limit elements).
    g = tf.constant(np.random.default_rng(16).laplace(size=1_000).astype(np.float32))
    sample = dict(exact_count_limit=10, sample_chunk=sample_chunk, sample_chunks=sample_chunks)
    message = (r"sample_chunk and sample_chunks must be positive with a product that fits int64, "
               fr"got {sample_chunk} and {sample_chunks}")
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        kernels.sidco(g, tf.constant(1), tf.constant(0.1, tf.float64),
                      tf.constant(0.1, tf.float64), "gamma", True, **sample)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        kernels.sidco_adaptive(g, tf.Variable(1), tf.Variable(initial_adaptation(MAX_STAGES)),
                               0.1, 0.1, "gamma", True, **sample, max_stages=MAX_STAGES,
                               adapt_every=ADAPT_EVERY, band_low=0.8, band_high=1.2, memory=4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_sampled_tensor_shorter_than_a_chunk_is_counted_whole(variant):
    # More than exact_count_limit elements, so the nonzero count is sampled,
    # but fewer than sample_chunk: no chunk fitted, and the count was 0 / 0
    # (NaN), which made the threshold NaN. It is now the exact count, so the
    # op selects what it selects with the count exact.
    rng = np.random.default_rng(17)
    g = rng.laplace(size=1_000).astype(np.float32)
    g[rng.random(1_000) < 0.3] = 0
    args = (tf.constant(g), tf.constant(1), tf.constant(0.1, tf.float64),
            tf.constant(0.1, tf.float64), "gamma", True)
    sampled = kernels.sidco(*args, exact_count_limit=10, sample_chunk=4096, sample_chunks=4)
    exact = kernels.sidco(*args, exact_count_limit=10**6, sample_chunk=4096, sample_chunks=4)
    assert np.isfinite(float(exact[2])) and int(tf.size(exact[1])) > 0
    for got, expected in zip(sampled, exact):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
