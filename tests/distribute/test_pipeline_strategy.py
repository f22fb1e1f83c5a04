"""PipelineStrategy on two logical CPU devices (run in a subprocess).

Logical devices must be configured before TensorFlow initialises its
devices, so pipeline_strategy_checks.py runs every check in a fresh process
and this module asserts on its JSON results.
"""

import os

import numpy as np
import pytest

import checks_subprocess
from checks_subprocess import run_checks

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_strategy_checks.py")
TIMEOUT_S = 300
# float32 weights after 8 updates, gradients summed in a different order
# (micro-batch means averaged instead of one batch mean): a few ulps of O(1)
# values per step, far below 1e-5.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_checks(SCRIPT, tmp_path_factory.mktemp("pipeline") / "results.json", TIMEOUT_S)


def assert_weights_close(got, want):
    checks_subprocess.assert_weights_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "layerpipe", "pipedream"])
def test_one_step_windows_equal_training_with_gradient_accumulation(results, schedule, optimizer):
    # A window of one step drains the pipeline before the update, so every
    # schedule (LayerPipe with rows of a layer on two stages included) is
    # plain training on the whole batch: the mean of the micro-batch means.
    got, plain = results[f"{schedule}_{optimizer}"], results[f"plain_{optimizer}"]
    assert_weights_close(got["weights"], plain["weights"])
    np.testing.assert_allclose(got["history"]["loss"], plain["history"]["loss"], rtol=1e-5)
    assert got["history"]["accuracy"] == plain["history"]["accuracy"]
    assert got["iterations"] == 8  # 48 samples / 12 per batch * 2 epochs


@pytest.mark.parametrize("batch_size", [20, 23])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "layerpipe", "pipedream"])
def test_batches_num_microbatches_does_not_divide_train_as_plain_keras(
        results, schedule, batch_size):
    # 48 rows with num_microbatches=3: batches of 20 (7, 7, 6 rows) and a
    # last one of 8 (3, 3, 2); or of 23 and a last one of 2 (two of 1 row).
    # Each micro-batch's gradient weighted by its rows: the batch's mean.
    got, plain = results[f"uneven_{batch_size}_{schedule}"], results[f"uneven_{batch_size}_plain"]
    assert_weights_close(got["weights"], plain["weights"])
    np.testing.assert_allclose(got["history"]["loss"], plain["history"]["loss"], rtol=1e-5)
    assert got["history"]["accuracy"] == plain["history"]["accuracy"]
    assert got["iterations"] == 6  # 3 batches per epoch, 2 epochs
    if schedule == "layerpipe":  # rows of layer 0 lent to stage 0, as with even batches
        assert got["stage_iterations"] == [0, 6] and got["borrowed"][0] > 0


def test_layerpipe_really_splits_a_layer_over_two_devices(results):
    got = results["layerpipe_sgd"]
    # 12x40 dense first layer dominates: stage 0 owns no layer and computes
    # 2 of every 3 rows of layer 0 (micro-batches of 3 rows).
    assert got["stages"] == [[], [0, 1, 2]]
    assert got["borrowed"] == pytest.approx([2 / 3, 0.0])
    assert got["stage_iterations"] == [0, 8]
    assert results["gpipe_sgd"]["stage_iterations"] == [8, 8]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream", "layerpipe", "async"])
def test_windows_of_four_steps_follow_the_action_lists(results, schedule):
    # NumPy reference of the lists' semantics (weight versions, stashing,
    # update groups) for two linear stages; float32 like the model.
    got = results[f"async_{schedule}"]
    assert_weights_close(got["got"], got["reference"])
    differs = max(np.max(np.abs(np.array(a) - np.array(b)))
                  for a, b in zip(got["got"], got["synchronous"]))
    if schedule in ("gpipe", "1f1b"):
        assert differs < 1e-5
    else:  # stale weights really were used
        assert differs > 1e-3


def test_predict_evaluate_and_save(results):
    got = results["predict"]
    # Same layers, same weights, rows split into micro-batches (10 rows into
    # 4 uneven parts): identical arithmetic per row.
    np.testing.assert_allclose(got["got"], got["want"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["evaluate"], got["evaluate_plain"], rtol=1e-6)
    np.testing.assert_allclose(got["loaded"], got["got"], rtol=1e-6, atol=1e-6)


def test_training_graph_uses_both_devices(results):
    assert results["devices_used"] == ["device:CPU:0", "device:CPU:1"]


def test_bad_inputs_raise_keras_style_errors(results):
    errors = results["errors"]
    assert errors["schedule"] == (
        "Received an invalid value for \"schedule\", expected one of 'gpipe', '1f1b', "
        "'pipedream', 'layerpipe', 'async'. Received: schedule='zb-v'")
    assert errors["device"] == (
        'Received an invalid value for "devices", expected existing devices (this '
        "process has: /device:CPU:0, /device:CPU:1). Received: devices=['/cpu:0', '/cpu:7']")
    assert errors["stages"] == (
        'Received an invalid value for "devices", expected at most one device per '
        "layer (the model has 1 layer). Received: devices=['/cpu:0', '/cpu:1']")
