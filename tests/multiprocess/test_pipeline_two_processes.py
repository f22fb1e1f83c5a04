"""PipelineStrategy with one stage per process: horovodrun -np 2 --gloo."""

import os

import numpy as np
import pytest

from horovod_launcher import assert_arrays_close
from horovod_launcher import run_ranks

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_scripts",
                      "pipeline_two_processes.py")
TIMEOUT_S = 400
# Same float32 operations as one process, in a different order across the
# collectives: a few ulps of O(1) weights after 8 updates.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline_processes")
    return run_ranks(SCRIPT, out, size=2, timeout=TIMEOUT_S)


def test_two_processes_ran(ranks):
    assert [(r["rank"], r["size"]) for r in ranks] == [(0, 2), (1, 2)]


@pytest.mark.parametrize("case", ["gpipe", "layerpipe", "pipedream", "regularized"])
def test_processes_hold_the_same_model(ranks, case):
    first, second = (r[case]["processes"] for r in ranks)
    for a, b in zip(first["weights"], second["weights"]):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    assert first["loss"] == second["loss"]


@pytest.mark.parametrize("case", ["gpipe", "layerpipe", "pipedream", "regularized"])
def test_processes_equal_one_process_with_two_devices(ranks, case):
    # The same action lists, executed over Horovod instead of between local
    # devices (LayerPipe: stage 0 borrows rows of layer 0 from stage 1).
    got, local = ranks[0][case]["processes"], ranks[0][case]["devices"]
    assert got["plan"] == local["plan"]
    assert_arrays_close(got["weights"], local["weights"], **TOLERANCE)
    np.testing.assert_allclose(got["loss"], local["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["evaluate"], local["evaluate"], rtol=1e-5)


def test_layerpipe_plan_splits_layer_zero_across_processes(ranks):
    assert ranks[0]["layerpipe"]["processes"]["plan"] == [[], [0, 1, 2]]


def test_gpipe_over_processes_equals_training_without_pipeline(ranks):
    got, plain = ranks[0]["gpipe"]["processes"], ranks[0]["gpipe"]["plain"]
    assert_arrays_close(got["weights"], plain["weights"], **TOLERANCE)


@pytest.mark.parametrize("kind", ["processes", "devices"])
def test_reported_losses_include_every_stages_penalties(ranks, kind):
    # Stage 0 holds a kernel regularizer, an activity regularizer and an
    # add_loss, stage 1 a bias regularizer; 1F1B is synchronous, so fit's
    # History and evaluate equal plain Keras, whose losses add all of them
    # (fit and evaluate in batches of 18 rows: micro-batches of 5, 5, 4 and 4
    # rows, each micro-batch's gradient and loss weighted by its rows).
    # Same float32 ops as one process, penalties summed in another order:
    # a few ulps of an O(1) loss, as for the weights (TOLERANCE).
    runs = ranks[0]["regularized"]
    got, plain = runs[kind], runs["plain"]
    assert got["plan"] == [[0, 1], [2, 3]]
    # Stage 0's penalties are far above the tolerance: without them the
    # losses would differ by this much.
    assert sum(plain["penalty"][:2]) > 0.1
    assert plain["penalty"][1] > 0.01 and plain["penalty"][3] > 0.01
    assert_arrays_close(got["weights"], plain["weights"], **TOLERANCE)
    np.testing.assert_allclose(got["loss"], plain["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["evaluate"], plain["evaluate"], rtol=1e-5)
