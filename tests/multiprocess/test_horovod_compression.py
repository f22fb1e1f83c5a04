"""Two real Horovod ranks (horovodrun -np 2 --gloo) training with compressed gradients."""

import importlib.util
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


# Every compressor, op, backward_passes_per_step and row-sparse gradients at
# 2 ranks, against NumPy: what each rank sent is what left its error feedback
# (gradient + residual before - residual after, in float32 as the rank
# computed it), and what both ranks apply is the sum of what they sent,
# halved for hvd.Average.
CASES_SCRIPT = os.path.join(os.path.dirname(SCRIPT), "horovod_optimizer_cases.py")


def load_cases_script():
    spec = importlib.util.spec_from_file_location("horovod_optimizer_cases", CASES_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = load_cases_script()


@pytest.fixture(scope="module")
def case_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("horovod_optimizer_cases")
    assert [r["size"] for r in run_ranks(CASES_SCRIPT, out, size=2, timeout=TIMEOUT_S)] == [2, 2]
    return [dict(np.load(out / f"rank{rank}.npz")) for rank in range(2)]


def exchanged_gradients(rank, first, passes, average):
    """NumPy: rank's gradients of passes first..first+passes-1, summed (or averaged), dense."""
    dense = np.zeros(CASES.DENSE_SIZE, np.float32)
    table = np.zeros(CASES.TABLE_SHAPE, np.float32)
    for step in range(first, first + passes):
        gradient, rows, values = CASES.pass_gradients(rank, step)
        dense += gradient
        np.add.at(table, rows, values)
    if average:
        dense, table = dense / np.float32(passes), table / np.float32(passes)
    return [dense, table], {int(r) for s in range(first, first + passes)
                            for r in CASES.pass_gradients(rank, s)[1]}


def sent_by(arrays, case, step, index, gradient):
    """What a rank sent for one variable: the corrected gradient minus what it kept."""
    before = arrays[f"{case}/{step}/residual_before/{index}"]
    after = arrays[f"{case}/{step}/residual_after/{index}"]
    return (gradient + before) - after, gradient + before


@pytest.mark.parametrize("case", list(CASES.CASES))
def test_two_ranks_apply_what_numpy_combines(case_ranks, case):
    settings = CASES.CASES[case]()
    passes = settings.get("backward_passes_per_step", 1)
    average = settings.get("average_aggregated_gradients", False)
    scale = 1.0 if settings.get("op") == CASES.hvd.Sum else 0.5
    for step in range(CASES.PASSES):
        for index in range(2):
            keys = [f"{case}/{step}/weights_{when}/{index}" for when in ("before", "after")]
            before, after = (case_ranks[0][k] for k in keys)
            np.testing.assert_array_equal(after, case_ranks[1][keys[1]])  # ranks agree
            if (step + 1) % passes:
                np.testing.assert_array_equal(after, before)  # accumulating: nothing applied
                continue
            sent = []
            for rank, arrays in enumerate(case_ranks):
                gradients, touched = exchanged_gradients(rank, step + 1 - passes, passes, average)
                sent.append(sent_by(arrays, case, step, index, gradients[index])[0])
                if index == 1 and not settings.get("sparse_as_dense"):
                    # A row-sparse gradient sends from the rows it touched only.
                    untouched = sorted(set(range(CASES.TABLE_SHAPE[0])) - touched)
                    assert not sent[-1][untouched].any()
            expected = scale * (sent[0].astype(np.float64) + sent[1])
            assert np.count_nonzero(expected) > 0
            # SGD(1.0): before - after is the combined gradient. Weights are O(1-10):
            # recovering it from w - (w - c) in float32 costs up to ulp(8) ~ 1e-6,
            # the ranks' float32 sums (up to 2 x 12 rows) a few ulps of O(10) more.
            np.testing.assert_allclose(before - after, expected, rtol=1e-6, atol=4e-6)


@pytest.mark.parametrize("case", ["topk", "topk_sum", "topk_passes"])
def test_two_ranks_send_numpys_top_k(case_ranks, case):
    passes = CASES.CASES[case]().get("backward_passes_per_step", 1)
    for step in range(passes - 1, CASES.PASSES, passes):
        for rank, arrays in enumerate(case_ranks):
            gradients, _ = exchanged_gradients(rank, step + 1 - passes, passes, False)
            sent, corrected = sent_by(arrays, case, step, 0, gradients[0])
            top = np.argsort(-np.abs(corrected))[:30]  # TopK(0.1) of 300
            assert sorted(np.flatnonzero(sent).tolist()) == sorted(top.tolist())
            np.testing.assert_array_equal(sent[top], corrected[top])
