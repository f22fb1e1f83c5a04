"""PipelineStrategy with a stage row-partitioned over a group of devices.

pipeline_partitioned_checks.py runs every check in a fresh process with four
logical CPU devices; this module asserts on its JSON results.
"""

import os

import numpy as np
import pytest

import checks_subprocess
from checks_subprocess import run_checks

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "pipeline_partitioned_checks.py")
TIMEOUT_S = 600
# float32. A device sums each neuron's fan-in in its local input order and
# the activation gradients of an input are summed across devices in another
# order than one kernel does: a few ulps of the O(1) values per operation,
# carried through 8 updates of step 0.1 (SGD) or 0.01 (Adam), far below 1e-5.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
EQUIVALENCE = ["first_gpipe_sgd", "first_layerpipe_adam", "first_async_sgd",
               "last_gpipe_adam", "last_1f1b_sgd", "last_pipedream_sgd", "last_layerpipe_sgd"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_checks(SCRIPT, tmp_path_factory.mktemp("partitioned") / "results.json", TIMEOUT_S)


def assert_weights_close(got, want):
    checks_subprocess.assert_weights_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("key", EQUIVALENCE)
def test_partitioned_stage_trains_like_the_unpartitioned_pipeline(results, key):
    got, want = results[key]["grouped"], results[key]["reference"]
    assert_weights_close(got["weights"], want["weights"])
    np.testing.assert_allclose(got["history"]["loss"], want["history"]["loss"], rtol=1e-5)
    assert got["history"]["accuracy"] == want["history"]["accuracy"]
    assert got["stage_iterations"] == want["stage_iterations"]
    assert got["borrowed"] == want["borrowed"]  # the same plan executed
    assert got["iterations"] == 8  # 32 samples / 8 per batch * 2 epochs


@pytest.mark.parametrize("key,optimizer", [("first_gpipe_sgd", "sgd"),
                                           ("last_gpipe_adam", "adam")])
def test_partitioned_gpipe_equals_training_with_gradient_accumulation(results, key,
                                                                      optimizer):
    got, plain = results[key]["grouped"], results[f"plain_{optimizer}"]
    assert_weights_close(got["weights"], plain["weights"])
    np.testing.assert_allclose(got["history"]["loss"], plain["history"]["loss"], rtol=1e-5)


def test_layerpipe_borrows_rows_next_to_a_group(results):
    got = results["first_layerpipe_borrowing"]
    # Stage 0 (its SparseDense layers halved) computes rows of stage 1's
    # Dense layer; one-step windows: plain training on the whole batch.
    assert got["borrowed"][0] > 0
    assert_weights_close(got["weights"], results["plain_sgd"]["weights"])


def test_words_moved_per_layer_equal_the_partition(results):
    volume = results["volume"]
    assert sorted(volume) == ["sparse_1+sparse_2", "sparse_4"]
    for run in volume.values():
        assert run["k"] == 3
        # Read off the traced graph: per later layer exactly the partition's
        # predicted words per sample (its send counts).
        assert run["measured_layers"] == run["predicted_layers"]
        # The first layer reads the stage input on the group's first device:
        # each other device receives the inputs its neurons reference.
        assert run["measured_entry"] == run["predicted_entry"]
        assert run["measured_exit"] == run["predicted_exit"]
        entry, layers, exit_words = run["words_per_sample"]
        assert (entry, layers, exit_words) == (run["predicted_entry"],
                                              run["predicted_layers"],
                                              run["predicted_exit"])
        assert run["forward_total"] == entry + sum(layers) + exit_words
        # The backward moves as many words back and no weight gradient leaves
        # its device: forward + backward is exactly twice the forward.
        assert run["training_total"] == 2 * run["forward_total"]
        assert run["shard_devices"] == ["device:CPU:1", "device:CPU:2", "device:CPU:3"]
    assert volume["sparse_1+sparse_2"]["predicted_layers"][0] > 0


def test_weight_gradients_stay_on_their_device_in_training(results):
    # In the training window's graph every consumer of a shard's weight
    # gradient (accumulation, scaling, the optimizer) runs on its device.
    assert results["weight_gradient_edges"] > 0
    assert results["weight_gradient_edges_leaving"] == 0


def test_partitioned_gradients_equal_one_kernel(results):
    for run in results["volume"].values():
        # float32 sums of at most 24 products of O(1) values in another order.
        assert run["output_error"] < 1e-5
        assert run["input_gradient_error"] < 1e-5
        assert run["weight_gradient_error"] < 1e-5


def test_training_graph_uses_every_device_of_the_group(results):
    assert results["devices_used"] == ["device:CPU:0", "device:CPU:1", "device:CPU:2",
                                       "device:CPU:3"]


def test_weights_of_another_pattern_loaded_after_partitioning_are_refused(results):
    # The shards were cut from the trained pattern; reading the loaded
    # values at its positions gave outputs off by up to 1.1 before.
    got = results["changed_pattern"]
    for kind in ("predict", "fit"):
        assert "The pattern of sparse_1 changed after PipelineStrategy partitioned it" in (
            got[f"{kind}_error"] or "")
    # Attached again, or loaded before the pipeline first ran: partitioned
    # from the loaded pattern (a few float32 ulps, as below).
    for kind in ("reattached_predict", "loaded_first_predict"):
        np.testing.assert_allclose(got[kind], got["plain_predict"], rtol=1e-6, atol=1e-6)


def test_save_checkpoint_evaluate_predict(results):
    got = results["save"]
    # One Keras variable per weight, as without the group: no shard is saved.
    assert got["variables"] == got["plain_variables"]
    assert_weights_close(got["loaded_weights"], got["weights"])
    assert_weights_close(got["restored_weights"], got["weights"])
    # Same weights; the partitioned layers sum each neuron's fan-in (at most
    # 24 products of O(1) values) in another order: a few float32 ulps.
    np.testing.assert_allclose(got["predict"], got["plain_predict"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["loaded_predict"], got["predict"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["evaluate"], got["plain_evaluate"], rtol=1e-6)


@pytest.mark.parametrize("config", ["last", "first"])
def test_evaluate_and_predict_of_a_grouped_stage_equal_plain_keras(results, config):
    got = results["inference"][config]
    # "last": trained, then new weights set (the shards still hold the
    # trained ones); "first": no training (the runs are built while
    # evaluate/predict trace). 31 rows: a last batch of 7 in micro-batches of
    # 4 and 3. Partitioned layers sum each neuron's fan-in (at most 24
    # products of O(1) values) in another order than one kernel: a few
    # float32 ulps per layer through 6 layers, far below 1e-5.
    assert len(got["predict"]) == 31
    np.testing.assert_allclose(got["predict"], got["plain_predict"], **TOLERANCE)
    np.testing.assert_allclose(got["evaluate"], got["plain_evaluate"], **TOLERANCE)
    assert all(len(devices) > 1 for _, devices in got["runs"])


def test_inference_is_partitioned_over_the_group(results):
    graphs = results["inference"]["graphs"]
    assert sorted(graphs) == ["sparse_1+sparse_2", "sparse_4"]
    for run in graphs.values():
        # Read off the traced predict graph: every device of the group runs
        # the partitioned layers' ops, and each run moves per sample exactly
        # the partition's words, as training's forward does.
        for kind in ("predict", "evaluate"):
            assert run["devices"][kind] == ["device:CPU:1", "device:CPU:2", "device:CPU:3"]
        assert run["measured_layers"] == run["predicted_layers"]
        assert run["measured_entry"] == run["predicted_entry"] > 0
    assert graphs["sparse_1+sparse_2"]["predicted_layers"][0] > 0


def test_a_softmax_ends_its_run_and_sees_whole_rows(results):
    got = results["softmax"]
    # sparse_1's softmax ends a run; sparse_3's log_softmax is applied to the
    # assembled output of the run [sparse_2, sparse_3]. Regression: a
    # normalisation over each device's slice of a row.
    assert got["runs"] == [["sparse_1"], ["sparse_2", "sparse_3"]]
    for other in ("reference", "plain"):  # gpipe = plain with accumulation
        assert_weights_close(got["grouped"]["weights"], got[other]["weights"])
        np.testing.assert_allclose(got["grouped"]["history"]["loss"],
                                   got[other]["history"]["loss"], rtol=1e-5)
        np.testing.assert_allclose(got["grouped"]["predict"], got[other]["predict"],
                                   **TOLERANCE)
    # Rows of 3 float32 log-probabilities: their exponentials sum to 1 to a few ulps.
    np.testing.assert_allclose(np.sum(np.exp(got["grouped"]["predict"]), axis=1), 1.0,
                               rtol=1e-6)


def test_weights_set_between_fits_are_trained_from(results):
    got = results["set_weights"]
    assert_weights_close(got["grouped"]["weights"], got["reference"]["weights"])


def test_simulate_counts_a_group_at_its_share(results):
    got = results["simulate"]
    costs = [sum(c) for c in got["costs"]]
    sparse = [0, 1, 2, 4]
    for s, stage in enumerate(got["stages"]):
        divisor = 2 if s == 0 else 1
        want = sum(costs[i] / divisor if i in sparse else costs[i] for i in stage)
        assert sum(got["stage_costs"][s]) == pytest.approx(want)
    assert got["cycles"] > 0


def test_explicit_partitions_are_used(results):
    assert results["explicit"] is True


def test_bad_inputs_raise_keras_style_errors(results):
    errors = results["errors"]
    assert errors["missing"] == (
        'Received an invalid value for "devices", expected existing devices (this '
        "process has: /device:CPU:0, /device:CPU:1, /device:CPU:2, /device:CPU:3). "
        "Received: devices=[['/cpu:0', '/cpu:9'], '/cpu:1']")
    assert errors["empty"] == (
        'Received an invalid value for "devices", expected a list with, per stage, a '
        "device name or a non-empty list of device names. Received: devices=[[], '/cpu:1']")
    assert errors["method"].startswith(
        'Received an invalid value for "partition", expected a method (\'hypergraph\', '
        "'graph', 'block', 'random'), a Partition")
    assert errors["method"].endswith("Received: partition='metis'")
    assert errors["k"].startswith(
        'Received an invalid value for "partition", expected Partitions into 2 parts for '
        "stage 0 (its group of devices). Received: partition=Partition(method='hypergraph', "
        "k=3, layers=3, ")
    assert errors["single"].startswith(
        'Received an invalid value for "partition", expected a method')
    assert ("Received: partition=[None, Partition(method='hypergraph', k=2, layers=3, "
            in errors["single"])
    assert errors["no_sparse"] == (
        'Received an invalid value for "devices", expected a group of devices only for a '
        "stage with SparseDense layers to partition (on 2-D inputs, without regularizers "
        "or constraints); "
        "stage 1 has dense_5. Received: devices=['/cpu:0', ['/cpu:1', '/cpu:2']]")
    assert errors["count"].startswith(
        'Received an invalid value for "partition", expected 2 Partitions for stage 0 (one '
        "per run of consecutive SparseDense layers). Received: partition=(Partition(")
    assert errors["sizes"].startswith(
        'Received an invalid value for "partition", expected a Partition of layer sizes '
        "[16, 16] for the SparseDense layers ['sparse_4']. Received: partition=Partition(")
