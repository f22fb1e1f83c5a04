"""RigL and SET under a real horovodrun -np 2 --gloo: every rank keeps the same pattern."""

import os

import numpy as np
import pytest

from horovod_launcher import run_ranks

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts",
                      "dynamic_sparsity.py")
RUNS = ["rigl_topk", "rigl_sidco", "rigl_dense", "set_topk"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dynamic_sparsity")
    results = run_ranks(SCRIPT, out, size=2, timeout=400)
    for rank, result in enumerate(results):
        result["arrays"] = dict(np.load(out / f"rank{rank}.npz"))
    return results


@pytest.mark.parametrize("run", RUNS)
def test_ranks_end_with_identical_patterns_and_weights(ranks, run):
    assert [r["size"] for r in ranks] == [2, 2]
    # 3 epochs of 8 steps, updates every 4 steps until step 0.9 * 24 = 21.
    assert ranks[0][run]["updates"] == [4, 8, 12, 16, 20]
    assert ranks[0][run]["moved"] == [True, True, True]  # conv, hidden, out
    first, second = ranks[0]["arrays"], ranks[1]["arrays"]
    keys = [k for k in first if k.startswith(f"{run}/") and not k.endswith("_residual")]
    assert len(keys) == 9
    for key in keys:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)


@pytest.mark.parametrize("run", ["rigl_topk", "rigl_sidco", "set_topk"])
def test_error_feedback_residuals_are_per_rank_and_follow_the_pattern(ranks, run):
    for result in ranks:
        arrays = result["arrays"]
        for layer in ("conv", "hidden", "out"):
            residual = arrays[f"{run}/{layer}_residual"]
            assert residual.shape == arrays[f"{run}/{layer}_values"].shape
            assert np.all(np.isfinite(residual))
    # Each rank keeps what it did not send: the residuals differ between ranks.
    assert not np.array_equal(ranks[0]["arrays"][f"{run}/hidden_residual"],
                              ranks[1]["arrays"][f"{run}/hidden_residual"])
