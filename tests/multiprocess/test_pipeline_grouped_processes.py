"""PipelineStrategy under horovodrun -np 2 --gloo, every stage on a group of
two local devices (``local_devices``): stages across processes, partitioned
SparseDense layers inside each."""

import ast
import os

import numpy as np
import pytest

from horovod_launcher import ROOT
from horovod_launcher import assert_arrays_close
from horovod_launcher import run_ranks
from horovod_launcher import run_script
from tfsparse.distribute.stages import plan_stages

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_scripts",
                      "pipeline_grouped_processes.py")
TIMEOUT_S = 400
CASES = ["gpipe", "pipedream", "layerpipe", "1f1b", "async", "first_only"]
# The same float32 operations as the ungrouped pipeline, with the partitioned
# layers' sums split over two devices: a few ulps of O(1) weights after 8
# updates (measured: at most 1.2e-7).
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline_grouped_processes")
    return run_ranks(SCRIPT, out, size=2, timeout=TIMEOUT_S)


@pytest.mark.parametrize("case", CASES)
def test_processes_hold_the_same_model_and_results(ranks, case):
    first, second = (r[case]["processes"] for r in ranks)
    for a, b in zip(first["weights"], second["weights"]):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    assert first["loss"] == second["loss"]
    assert first["evaluate"] == second["evaluate"]
    assert first["predict"] == second["predict"]


@pytest.mark.parametrize("case", CASES)
def test_grouped_processes_equal_the_ungrouped_pipeline(ranks, case):
    # Partitioning is exact: the same pipeline on two ungrouped local devices
    # gives the same weights, losses, evaluate and predict (a last batch of
    # 12 rows cut into micro-batches of 3).
    got, local = ranks[0][case]["processes"], ranks[0][case]["devices"]
    assert got["plan"] == local["plan"]
    assert got["borrowed"] == local["borrowed"] == [0.0, 0.0]
    assert_arrays_close(got["weights"], local["weights"], **TOLERANCE)
    np.testing.assert_allclose(got["loss"], local["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["evaluate"], local["evaluate"], rtol=1e-5)
    assert_arrays_close(got["predict"], local["predict"], **TOLERANCE)


@pytest.mark.parametrize("case", ["gpipe", "1f1b", "first_only"])
def test_grouped_synchronous_schedules_equal_training_with_gradient_accumulation(ranks, case):
    got, plain = ranks[0][case]["processes"], ranks[0][case]["plain"]
    assert_arrays_close(got["weights"], plain["weights"], **TOLERANCE)


def test_each_process_partitions_only_its_own_stage(ranks):
    for rank, result in enumerate(ranks):
        got = result["gpipe"]["processes"]
        assert got["partitioned_stages"] == [rank]
        assert got["partition_k"] == [2]
        assert got["runs"] == [["sparse_0+sparse_1+sparse_2"], ["sparse_4"]][rank]
        assert got["shard_devices"] == ["device:CPU:0", "device:CPU:1"]


@pytest.mark.parametrize("case", ["gpipe", "pipedream", "layerpipe", "1f1b", "async"])
def test_training_and_predict_graphs_run_the_partition_on_both_devices(ranks, case):
    # Read off the traced graphs: the partitioned layers' ops are placed on
    # both devices of the process's group (an unpartitioned stage has none).
    for result in ranks:
        ops = result[case]["processes"]["partitioned_ops"]
        for kind in ("train", "predict"):
            assert sorted(ops[kind]) == ["device:CPU:0", "device:CPU:1"], (kind, ops)
            assert min(ops[kind].values()) > 0


def test_a_stage_without_layers_to_partition_runs_on_its_first_device(ranks):
    # Stage 1 holds only the classifier (Dense): no run and no partition
    # there, and no error; stage 0's two runs are partitioned.
    first, second = (r["first_only"]["processes"] for r in ranks)
    assert first["runs"] == ["sparse_0+sparse_1+sparse_2", "sparse_4"]
    assert first["partition_k"] == [2, 2]
    assert second["runs"] == [] and second["partitioned_stages"] == []


def test_bad_local_devices_raise_keras_style_errors(ranks):
    errors = ranks[0]["errors"]
    assert 'local_devices' in errors["not_horovod"]
    assert 'None unless devices="horovod"' in errors["not_horovod"]
    assert "existing devices" in errors["missing"] and "/cpu:7" in errors["missing"]
    assert "non-empty list" in errors["string"] and "'/cpu:0'" in errors["string"]


def test_every_process_plans_with_rank_zeros_costs(ranks):
    # Rank 1 passed its costs in reverse order; both plan with rank 0's.
    first, second = (r["rank_costs"] for r in ranks)
    assert first == second
    costs = [(10.0,) * 3] * 3 + [(1.0,) * 3] * 3
    assert first["costs"] == [list(c) for c in costs]
    want = [list(s) for s in plan_stages(costs, 2).stages]
    assert first["plan"] == want
    assert want != [list(s) for s in plan_stages(costs[::-1], 2).stages]


def test_the_example_trains_a_grouped_pipeline_over_two_processes(tmp_path):
    # examples/pipeline_mnist.py --horovod --local-devices 2, one epoch on the
    # shipped MNIST sample: trains, evaluates, saves and reloads in rank 0,
    # each process partitions its own stage over its two devices.
    example = os.path.join(ROOT, "examples", "pipeline_mnist.py")
    output = run_script(example, ["--horovod", "--local-devices", "2", "--epochs", "1",
                                  "--out", tmp_path], timeout=TIMEOUT_S)
    assert "the reloaded model predicts the same: True" in output
    # The plan follows rank 0's measured costs (printed), so either stage may
    # hold both SparseDense layers (0 and 1) and the other only the Dense
    # classifier (2). Rank 0 gathers every process's report and prints it.
    plan = ast.literal_eval(output.split("Plan: stages ")[1].split(", rows borrowed")[0])
    assert sorted(i for stage in plan for i in stage) == [0, 1, 2]
    for rank, layers in enumerate(plan):
        if {0, 1} & set(layers):
            assert f"rank {rank}: stage {rank} partitioned into 2 parts" in output
        else:
            assert f"rank {rank}: stage {rank} holds no SparseDense layer to partition" in output
    accuracy = float(output.split("test accuracy ")[1].split("%")[0])
    assert accuracy > 50  # 10 classes; one epoch reaches about 80%
