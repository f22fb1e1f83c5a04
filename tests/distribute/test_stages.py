"""Stage assignment: the min-max partition and LayerPipe's row borrowing."""

import numpy as np
import pytest

from tfsparse.distribute import plan_stages
from tfsparse.distribute.stages import StagePlan
from tfsparse.distribute.stages import _borrowing
from stage_partitions import all_partitions
from stage_partitions import partitions_with_empty_stages


def random_costs(seed, n):
    rng = np.random.default_rng(seed)
    return [tuple(rng.uniform(0.1, 3.0, 3)) for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("p", [2, 3, 4])
def test_partition_is_the_brute_force_optimum(seed, p):
    costs = random_costs(seed, 7)
    work = [sum(c) for c in costs]
    best = min(max(sum(work[i] for i in g) for g in part) for part in all_partitions(7, p))
    plan = plan_stages(costs, p)
    assert plan.borrowed == (0.0,) * p
    assert plan.max_stage_cost(costs) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("p", [2, 3, 4])
def test_split_plan_is_the_brute_force_optimum(seed, p):
    # Reference: for every partition, bisect the best borrowing (a greedy that
    # is optimal for a fixed partition) and keep the smallest busiest stage.
    costs = random_costs(seed, 6)
    work = [sum(c) for c in costs]
    flags = (True,) * 6
    best = min(StagePlan(part, _borrowing(part, work, flags)).max_stage_cost(costs)
               for part in partitions_with_empty_stages(6, p))
    plan = plan_stages(costs, p, split=True)
    assert plan.max_stage_cost(costs) == pytest.approx(best, rel=1e-9)
    assert plan.max_stage_cost(costs) <= plan_stages(costs, p).max_stage_cost(costs) + 1e-12


@pytest.mark.parametrize("layers,p", [(3, 2), (10, 7), (12, 9), (16, 7)])
def test_equal_layers_balance_perfectly_with_borrowing(layers, p):
    costs = [(1.0, 1.0, 1.0)] * layers
    plan = plan_stages(costs, p, split=True)
    totals = [sum(c) for c in plan.stage_costs(costs)]
    assert totals == pytest.approx([3.0 * layers / p] * p, rel=1e-9)
    # Stage costs conserve the work: borrowed rows move work, never create it.
    assert sum(totals) == pytest.approx(3.0 * layers)


def test_a_heavy_first_layer_spreads_over_two_stages():
    # Work 8 then 2: stage 0 owns nothing and computes 5/8 of layer 0's rows.
    costs = [(4, 0, 4), (1, 0.5, 0.5)]
    plan = plan_stages(costs, 2, split=True)
    assert plan.stages == ((), (0, 1))
    assert plan.borrowed == pytest.approx((5 / 8, 0.0))
    assert [sum(c) for c in plan.stage_costs(costs)] == pytest.approx([5.0, 5.0])


def test_unsplittable_layers_are_not_borrowed():
    costs = [(1.0, 1.0, 1.0)] * 3
    plan = plan_stages(costs, 2, split=True, splittable=[True, False, False])
    assert plan.borrowed == (0.0, 0.0)
    assert plan.max_stage_cost(costs) == 6.0


def test_stage_costs_hand_computed():
    plan = StagePlan(((0,), (1, 2)), (0.25, 0.0))
    costs = [(1, 2, 3), (4, 4, 8), (1, 1, 1)]
    assert plan.stage_costs(costs) == ((2.0, 3.0, 5.0), (4.0, 4.0, 7.0))


def test_explicit_stages_must_match_the_device_count():
    with pytest.raises(ValueError, match=r'"stages", expected 3 stages'):
        plan_stages([(1, 1, 1)] * 4, 3, stages=[[0, 1], [2, 3]])
