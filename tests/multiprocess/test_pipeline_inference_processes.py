"""evaluate/predict pipelined over processes: horovodrun -np 2 --gloo.

PipelineStrategy(devices="horovod"): process r runs only stage r's layers
on every micro-batch; the last stage's loss, metrics and outputs reach both
processes. Compared with the same weights in one process.
"""

import os

import numpy as np
import pytest

from horovod_launcher import run_ranks

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_scripts",
                      "pipeline_inference_processes.py")
TIMEOUT_S = 400
MICROBATCHES = 4
EVALUATE_BATCHES = [12, 12, 12, 12, 6]  # 54 rows in batches of 12
PREDICT_BATCHES = [16, 16, 16, 2]  # 50 rows in batches of 16
# The pipeline runs the same float32 ops per row as one process, but each
# matmul on fewer rows (a micro-batch), which may change the kernel's
# blocking and so the summation order of dot products of length <= 40: a few
# ulps per output (seen: 1.8e-7 on O(1) logits), at most ~40 * 6e-8 relative.
# The loss and metrics are means over rows of such values.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
CASES = ["fresh", "trained"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline_inference")
    return run_ranks(SCRIPT, out, size=2, timeout=TIMEOUT_S)


def test_two_processes_ran(ranks):
    assert [(r["rank"], r["size"]) for r in ranks] == [(0, 2), (1, 2)]


@pytest.mark.parametrize("case", CASES)
def test_every_process_returns_the_same_results(ranks, case):
    # The last stage's results are broadcast: bit-identical copies.
    first, second = (r[case]["processes"] for r in ranks)
    assert first["evaluate"] == second["evaluate"]
    assert first["predict"] == second["predict"]
    assert first["metrics_state"] == second["metrics_state"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("rank", [0, 1])
def test_results_equal_one_process_without_pipeline(ranks, case, rank):
    got, plain = ranks[rank][case]["processes"], ranks[rank][case]["plain"]
    assert len(got["evaluate"]) == 4  # loss, accuracy, crossentropy, weighted accuracy
    np.testing.assert_allclose(got["evaluate"], plain["evaluate"], **TOLERANCE)
    np.testing.assert_allclose(got["metrics_state"], plain["metrics_state"], **TOLERANCE)
    assert np.array(got["predict"]).shape == (sum(PREDICT_BATCHES), 3)
    np.testing.assert_allclose(got["predict"], plain["predict"], **TOLERANCE)


@pytest.mark.parametrize("case", CASES)
def test_local_devices_equal_one_process_without_pipeline(ranks, case):
    got, plain = ranks[0][case]["devices"], ranks[0][case]["plain"]
    np.testing.assert_allclose(got["evaluate"], plain["evaluate"], **TOLERANCE)
    np.testing.assert_allclose(got["predict"], plain["predict"], **TOLERANCE)


def test_validation_in_fit_is_pipelined_and_shared(ranks):
    first, second = (r["trained"] for r in ranks)
    assert first["val_loss"] == second["val_loss"]
    np.testing.assert_allclose(first["val_loss"], [first["plain_val_loss"]], **TOLERANCE)


def microbatches(batches):
    # A batch that 4 does not divide becomes min(4, rows) micro-batches.
    return sum(min(MICROBATCHES, rows) for rows in batches)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("rank", [0, 1])
def test_each_process_executes_only_its_own_stage(ranks, case, rank):
    result = ranks[rank][case]
    stages = result["forward_stages"]
    assert stages == [[0], [1, 2]]
    # The counters work: without a pipeline every layer runs once per batch.
    assert result["plain"]["evaluate_counts"] == {
        "calls": [len(EVALUATE_BATCHES)] * 3, "rows": [sum(EVALUATE_BATCHES)] * 3}
    for kind, batches in (("evaluate", EVALUATE_BATCHES), ("predict", PREDICT_BATCHES)):
        counts = result["processes"][f"{kind}_counts"]
        mine = [index in stages[rank] for index in range(3)]
        assert counts["calls"] == [microbatches(batches) if m else 0 for m in mine]
        assert counts["rows"] == [sum(batches) if m else 0 for m in mine]
