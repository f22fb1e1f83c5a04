"""Two real Horovod ranks (horovodrun -np 2 --gloo) training with compressed gradients."""

import os

import numpy as np
import pytest

from horovod_launcher import run_ranks

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "horovod_compression.py")
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("horovod_compression")
    results = run_ranks(SCRIPT, out, size=2, timeout=TIMEOUT_S)
    for rank, result in enumerate(results):
        result["weights"] = dict(np.load(out / f"rank{rank}.npz"))
    return results


def test_two_ranks_ran(ranks):
    assert [r["size"] for r in ranks] == [2, 2]


@pytest.mark.parametrize("run", ["sidco", "fused"])
def test_ranks_hold_identical_weights_and_loss_falls(ranks, run):
    np.testing.assert_array_equal(ranks[0]["weights"][run], ranks[1]["weights"][run])
    for result in ranks:
        losses = result[f"{run}_loss"]
        assert losses[-1] < 0.75 * losses[0], losses


def test_bytes_counted_match_the_payloads(ranks):
    for result in ranks:
        stats = result["sidco_stats"]
        # Every element sent is a float32 value and an int32 index.
        assert stats["total_bytes_sent"] == 8 * stats["total_selected"]
        # What each rank gathered is what all ranks sent (an allreduce of the
        # local counts against the sizes of the tensors allgather returned).
        assert stats["total_bytes_gathered"] == result["sidco_sum_of_bytes_sent"]
        assert stats["total_dense_bytes"] == stats["steps"] * 4 * (20 * 64 + 64 + 64 * 2 + 2)
        # SIDCo at 0.01 sends about 1% of the elements, 8 bytes instead of 4 each.
        assert 0.005 < stats["total_bytes_sent"] / stats["total_dense_bytes"] < 0.1
        # The monitor's epoch values are per-step means of the same totals,
        # averaged over the ranks by MetricAverageCallback (listed after it).
        assert sum(result["sidco_monitor_bytes"]) * stats["steps"] / 4 == pytest.approx(
            result["sidco_sum_of_bytes_sent"] / 2)


def test_known_payload_with_an_empty_rank(ranks):
    for rank, result in enumerate(ranks):
        known = result["known"]
        assert known["max_error"] == 0.0  # scatter-add of 20 exact values, halved: exact
        assert known["stats"]["bytes_sent"] == (160.0 if rank == 0 else 0.0)
        assert known["stats"]["bytes_gathered"] == 160.0


def test_no_compression_matches_horovod_distributed_optimizer(ranks):
    for result in ranks:
        # Both average with one allreduce per tensor; only the order of the
        # float32 operations may differ: a few ulps on O(1) weights after 32 steps.
        np.testing.assert_allclose(result["weights"]["none"], result["weights"]["horovod"],
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ranks[0]["weights"]["none"], ranks[1]["weights"]["none"])
