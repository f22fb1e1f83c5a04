"""Two Horovod ranks under mixed_float16, the loss scale optimizer inside
DistributedOptimizer or outside it (as Keras's compile wraps it).

Before, each rank decided alone whether its step overflowed: the ranks'
loss scales and steps drifted apart and their collectives paired gradients
of different steps until the job died (or, with nonfinite="skip", the
overflowing gradients became zeros and the scale never fell).
"""

import os

import numpy as np
import pytest

from horovod_launcher import run_ranks

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "loss_scaling.py")
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(SCRIPT, tmp_path_factory.mktemp("loss_scaling"), size=2,
                     timeout=TIMEOUT_S)


@pytest.mark.parametrize("run", ["plain", "none", "topk", "topk_skip", "outside_none",
                                 "outside_topk", "outside_legacy", "outside_legacy_passes",
                                 "compile_wrapped", "rigl"])
def test_ranks_skip_the_same_steps_and_hold_the_same_weights(ranks, run):
    first, second = ranks[0][run], ranks[1][run]
    assert first["scales"] == second["scales"]
    assert first["scales"][-1] < 32768  # rank 1's overflows lowered both scales
    for a, b in zip(first["weights"], second["weights"]):
        np.testing.assert_array_equal(np.array(a), np.array(b))
        assert np.isfinite(np.array(a)).all()


def test_without_compression_equals_horovods_own_loss_scaling(ranks):
    # hvd.DistributedOptimizer allreduces before the loss scale optimizer
    # judges the gradients: the same skipped steps, the same updates.
    got, plain = ranks[0]["none"], ranks[0]["plain"]
    assert got["scales"] == plain["scales"]
    for a, b in zip(got["weights"], plain["weights"]):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("run", ["outside_none", "compile_wrapped"])
def test_the_loss_scale_optimizer_outside_skips_the_steps_horovods_own_does(ranks, run):
    # Before, each rank's outer loss scale optimizer judged its own
    # gradients: rank 1 skipped its first steps while rank 0 exchanged, and
    # the job died in a collective.
    got, plain = ranks[0][run], ranks[0]["plain"]
    assert got["scales"] == plain["scales"]
    if run == "outside_none":  # the same exchange as Horovod's (no compression)
        for a, b in zip(got["weights"], plain["weights"]):
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-6, atol=1e-7)


def test_compile_wraps_the_optimizer_and_the_monitor_finds_its_statistics(ranks):
    run = ranks[0]["compile_wrapped"]
    assert run["wrapped_by_compile"]
    # One exchange per applied step; skipped steps exchange nothing.
    applied = sum(1 for a, b in zip(run["scales"], [32768.0] + run["scales"]) if a >= b)
    assert run["exchanges"] == applied
    assert run["monitor_records"] == applied


def test_rigl_skips_the_updates_of_steps_any_rank_overflowed_on_every_rank(ranks):
    # Only rank 1's gradients overflow; one allreduce decides for both ranks,
    # so both skip the same updates and keep one pattern.
    first, second = ranks[0]["rigl"], ranks[1]["rigl"]
    assert first["skipped_steps"] and first["skipped_steps"] == second["skipped_steps"]
    assert first["updates"] and first["updates"] == second["updates"]
    assert not set(first["skipped_steps"]) & set(first["updates"])
    assert first["pattern"] == second["pattern"]
