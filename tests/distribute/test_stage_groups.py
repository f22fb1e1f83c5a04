"""Stage planning with stages on groups of devices (partitioned layers)."""

import numpy as np
import pytest

from tfsparse.distribute import plan_stages
from tfsparse.distribute import simulate
from tfsparse.distribute.stages import StagePlan
from tfsparse.distribute.stages import _borrowing
from tfsparse.distribute.stages import _layer_shares
from stage_partitions import all_partitions
from stage_partitions import partitions_with_empty_stages


def case(seed, n, p):
    rng = np.random.default_rng(seed)
    costs = [tuple(rng.uniform(0.1, 3.0, 3)) for _ in range(n)]
    groups = tuple(int(g) for g in rng.integers(1, 4, p))
    partitioned = tuple(bool(f) for f in rng.random(n) < 0.6)
    return costs, groups, partitioned


def busiest(part, costs, groups, partitioned):
    # Reference: a partitioned layer costs work / group size on its stage.
    return max(sum(sum(costs[i]) / (groups[s] if partitioned[i] else 1) for i in group)
               for s, group in enumerate(part))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("p", [2, 3])
def test_grouped_plan_is_the_brute_force_optimum(seed, p):
    costs, groups, partitioned = case(seed, 7, p)
    best = min(busiest(part, costs, groups, partitioned) for part in all_partitions(7, p))
    plan = plan_stages(costs, p, group_sizes=groups, partitioned=partitioned)
    assert plan.max_stage_cost(costs) == pytest.approx(best, rel=1e-12)
    assert busiest(plan.stages, costs, groups, partitioned) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("p", [2, 3])
def test_grouped_split_plan_is_the_brute_force_optimum(seed, p):
    # Reference as in test_stages: per partition the bisected best borrowing.
    costs, groups, partitioned = case(seed, 6, p)
    work = [sum(c) for c in costs]
    flags = (True,) * 6
    shares = _layer_shares(groups, partitioned, p, 6)
    best = min(StagePlan(part, _borrowing(part, work, flags, shares), groups,
                         partitioned).max_stage_cost(costs)
               for part in partitions_with_empty_stages(6, p))
    plan = plan_stages(costs, p, split=True, group_sizes=groups, partitioned=partitioned)
    assert plan.max_stage_cost(costs) == pytest.approx(best, rel=1e-9)
    for s in range(1, p):  # a partitioned layer on a group never lends rows
        first = plan.stages[s][0] if plan.stages[s] else None
        if plan.borrowed[s - 1] > 0:
            assert not (partitioned[first] and groups[s] > 1)


def test_a_group_of_two_takes_twice_the_partitioned_work():
    # Four sparse layers of work 3, a dense one of 6: on a group of 2 the four
    # sparse layers cost 6 (one layer fewer: 4.5 there but 3 + 6 on stage 1).
    costs = [(1, 1, 1)] * 4 + [(2, 2, 2)]
    plan = plan_stages(costs, 2, group_sizes=[2, 1],
                       partitioned=[True, True, True, True, False])
    assert plan.stages == ((0, 1, 2, 3), (4,))
    assert plan.stage_costs(costs) == ((2.0, 2.0, 2.0), (2.0, 2.0, 2.0))
    assert plan.group_sizes == (2, 1)
    # Without the group the same layers would be split 3 / 2 (9 against 9).
    assert plan_stages(costs, 2).stages == ((0, 1, 2), (3, 4))


def test_without_groups_the_plan_is_unchanged():
    costs = [(1, 2, 3), (4, 4, 8), (1, 1, 1), (2, 0, 2)]
    for split in (False, True):
        plain = plan_stages(costs, 3, split=split)
        ones = plan_stages(costs, 3, split=split, group_sizes=[1, 1, 1],
                           partitioned=[True] * 4)
        assert (ones.stages, ones.borrowed) == (plain.stages, plain.borrowed)
        assert ones.stage_costs(costs) == plain.stage_costs(costs)


def test_simulator_replays_a_grouped_plan():
    costs = [(1, 1, 1)] * 4
    plan = plan_stages(costs, 2, group_sizes=[2, 1], partitioned=[True] * 4)
    result = simulate("gpipe", costs, 2, 4, stages=plan)
    assert result.stage_costs == plan.stage_costs(costs)
    # Stage 0 (3 layers / 2) costs 1.5 per task, stage 1 one layer: 1.
    assert result.stage_costs == ((1.5, 1.5, 1.5), (1.0, 1.0, 1.0))
    assert result.cycles > 0


@pytest.mark.parametrize("kwargs,message", [
    (dict(group_sizes=[1]),
     'Received an invalid value for "group_sizes", expected one positive integer per '
     "stage (2). Received: group_sizes=[1]"),
    (dict(group_sizes=[1, 0]),
     'Received an invalid value for "group_sizes", expected a positive integer. '
     "Received: group_sizes=0"),
    (dict(partitioned=[True]),
     'Received an invalid value for "partitioned", expected one flag per layer (3). '
     "Received: partitioned=(True,)"),
])
def test_bad_group_arguments(kwargs, message):
    with pytest.raises(ValueError) as error:
        plan_stages([(1, 1, 1)] * 3, 2, **kwargs)
    assert str(error.value) == message


def test_a_sparse_layer_left_unpartitioned_in_a_group_is_reported(caplog):
    from tfsparse._keras import keras
    from tfsparse.distribute._partitioned import find_runs
    from tfsparse.layers import SparseDense

    layers = [SparseDense(8, density=0.5, activation="relu"),
              SparseDense(8, density=0.5, kernel_regularizer=keras.regularizers.L2(0.1)),
              SparseDense(4, density=0.5, activation="softmax")]
    with caplog.at_level("WARNING", logger="tfsparse"):
        runs = find_runs(layers, [(0, 1, 2)], [("/cpu:0", "/cpu:1")], [["/cpu:0", "/cpu:1"]])
    assert runs == [(0, (0,)), (0, (2,))]  # softmax is partitioned, applied after the gather
    unpartitioned = [r.getMessage() for r in caplog.records if "runs unpartitioned" in r.getMessage()]
    assert unpartitioned == [f"tfsparse: SparseDense layer {layers[1].name!r} of stage 0 runs "
                             "unpartitioned on /cpu:0: its kernel_regularizer is set."]


def test_sparse_layers_on_sequences_stay_unpartitioned(caplog):
    # The partitioned forward computes rows of (batch, features) inputs: a
    # SparseDense layer on (batch, time, features) runs whole, with a warning.
    from tfsparse.distribute._partitioned import find_runs
    from tfsparse.partition.shards import partitionable
    from tfsparse.layers import SparseDense

    flat = SparseDense(8, density=0.5, activation="relu")
    sequence = SparseDense(8, density=0.5, activation="relu")
    flat(np.ones((2, 6), "float32"))
    sequence(np.ones((2, 3, 6), "float32"))
    assert partitionable(flat) and not partitionable(sequence)
    with caplog.at_level("WARNING", logger="tfsparse"):
        runs = find_runs([flat, sequence], [(0, 1)], [("/cpu:0", "/cpu:1")], [["/cpu:0"]])
    assert runs == [(0, (0,))]
    assert any("2-D inputs" in r.getMessage() and repr(sequence.name) in r.getMessage()
               for r in caplog.records)
