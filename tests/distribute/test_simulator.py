"""The pipeline simulator against hand-computed cases and closed forms."""

import os

import pytest

from tfsparse.distribute import plot_gantt
from tfsparse.distribute import schedule
from tfsparse.distribute import simulate
from tfsparse.distribute import schedules as S


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_gpipe_bubble_is_exact(p, m):
    # Equal integer stage costs: every time is an exact float, and equal
    # rationals round to the same double, so == is the right comparison.
    result = simulate("gpipe", [(2, 3, 1)] * p, p, m)
    assert result.bubble_fraction == (p - 1) / (m + p - 1)
    assert result.cycles == (m + p - 1) * 6
    assert result.peak_activations == (m,) * p


@pytest.mark.parametrize("p,m", [(2, 2), (3, 5), (4, 8)])
def test_1f1b_has_gpipe_makespan_and_less_memory(p, m):
    result = simulate("1f1b", [(1, 1, 1)] * p, p, m)
    assert result.cycles == (m + p - 1) * 3
    assert result.peak_activations == tuple(min(p - s, m) for s in range(p))


def test_hand_computed_two_stage_gpipe():
    # Stage 1: F0 [1,2] F1 [2,3] B0 [3,5] W0 [5,6] B1 [6,8] W1 [8,9];
    # stage 0: F0 [0,1] F1 [1,2] B0 [6,8] W0 [8,9] B1 [9,11] W1 [11,12].
    result = simulate("gpipe", [(1, 2, 1)] * 2, 2, 2)
    spans = {(a.kind[:10], a.stage, a.microbatch): (s, e) for a, s, e in result.timeline}
    assert spans[("backward_i", 0, 0)] == (6, 8)
    assert spans[("backward_i", 0, 1)] == (9, 11)
    assert result.cycles == 12
    assert result.utilization == (8 / 12, 8 / 12)


def test_hand_computed_two_stage_pipedream_and_layerpipe():
    # PipeDream sends the gradient after the whole backward: stage 0's B0
    # waits until 5, B1 until 9 -> makespan 12. LayerPipe sends after the
    # activation gradient: B0 at 4, B1 at 8 -> makespan 11.
    costs = [(1, 2, 1)] * 2
    pipedream = simulate("pipedream", costs, 2, 2)
    layerpipe = simulate("layerpipe", costs, 2, 2, stages=[[0], [1]])
    assert pipedream.cycles == 12
    assert layerpipe.cycles == 11
    b0 = [(s, e) for a, s, e in layerpipe.timeline
          if a.stage == 0 and a.kind == S.BACKWARD_INPUT]
    assert b0 == [(4, 6), (8, 10)]


def test_async_with_one_sample_in_flight_is_sequential():
    costs = [(1, 2, 1)] * 3
    result = simulate("async", costs, 3, 2, steps=2, max_in_flight=1)
    assert result.cycles == 4 * 3 * 4  # every micro-batch crosses all stages alone
    assert result.peak_activations == (1, 1, 1)


def test_steady_state_throughput_is_the_busiest_stage():
    # Stage costs 4 and 2 per micro-batch: 1F1B without flush settles at one
    # micro-batch per 4 units; the fill and drain add a constant.
    costs = [(1, 2, 1), (0.5, 1, 0.5)]
    short = simulate("pipedream", costs, 2, 4, steps=5, stages=[[0], [1]])
    long = simulate("pipedream", costs, 2, 4, steps=10, stages=[[0], [1]])
    assert long.cycles - short.cycles == pytest.approx(20 * 4)


def test_layerpipe_balances_unequal_layers_by_borrowing_rows():
    # Three equal layers on two stages: whole layers give 6 vs 3; borrowing
    # half of the middle layer's rows gives 4.5 on both.
    costs = [(1, 1, 1)] * 3
    pipedream = simulate("pipedream", costs, 2, 4, steps=20)
    layerpipe = simulate("layerpipe", costs, 2, 4, steps=20)
    assert sorted(sum(c) for c in pipedream.stage_costs) == [3, 6]
    assert [sum(c) for c in layerpipe.stage_costs] == pytest.approx([4.5, 4.5])
    assert layerpipe.cycles < 0.8 * pipedream.cycles


def test_update_and_transfer_costs_lengthen_the_run():
    base = simulate("gpipe", [(1, 1, 1)] * 2, 2, 2)
    slower = simulate("gpipe", [(1, 1, 1)] * 2, 2, 2, update_cost=2, transfer_time=0.5)
    # The critical path crosses the link twice (micro-batch 0's activation
    # down, micro-batch 1's gradient up; the other transfers overlap work),
    # then stage 0 updates.
    assert slower.cycles == base.cycles + 2 * 0.5 + 2


def test_explicit_stages_and_schedule_object():
    sched = schedule("1f1b", 2, 3)
    result = simulate(sched, [(1, 1, 1), (2, 2, 2), (1, 1, 1)], 2, 3, stages=[[0, 1], [2]])
    assert result.plan.stages == ((0, 1), (2,))
    assert result.stage_costs == ((3, 3, 3), (1, 1, 1))
    with pytest.raises(ValueError, match='"schedule"'):
        simulate(sched, [(1, 1, 1)] * 3, 2, 4)


@pytest.mark.parametrize("kwargs,message", [
    (dict(costs=[(1, 1)]), 'Received an invalid value for "costs", expected a '
     "non-empty list of (forward, backward_input, backward_weight) tuples of "
     "finite non-negative numbers. Received: costs=[(1, 1)]"),
    (dict(costs=[(float("nan"), 1, 1)] * 2), 'Received an invalid value for "costs", expected '
     "a non-empty list of (forward, backward_input, backward_weight) tuples of finite "
     "non-negative numbers. Received: costs=[(nan, 1, 1), (nan, 1, 1)]"),
    (dict(costs=[(1, float("inf"), 1)]), 'Received an invalid value for "costs", expected '
     "a non-empty list of (forward, backward_input, backward_weight) tuples of finite "
     "non-negative numbers. Received: costs=[(1, inf, 1)]"),
    (dict(costs=[(1, 1, 1)], num_stages=2), 'Received an invalid value for '
     '"num_stages", expected at most the number of layers (1). Received: num_stages=2'),
    (dict(costs=[(1, 1, 1)] * 2, num_stages=2, stages=[[1], [0]]),
     'Received an invalid value for "stages", expected non-empty lists of '
     "consecutive layer indices covering layers 0..1 once, in order. "
     "Received: stages=[[1], [0]]"),
])
def test_bad_arguments(kwargs, message):
    arguments = dict(schedule="gpipe", costs=[(1, 1, 1)], num_stages=1, num_microbatches=2)
    arguments.update(kwargs)
    with pytest.raises(ValueError) as error:
        simulate(**arguments)
    assert str(error.value) == message


def test_plot_gantt_writes_a_png(tmp_path):
    result = simulate("layerpipe", [(1, 2, 1)] * 6, 3, 4, steps=2)
    path = plot_gantt(result, str(tmp_path / "gantt.png"))
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 5000
