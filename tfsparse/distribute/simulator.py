"""Discrete-event replay of a pipeline schedule with per-layer costs.

Every stage runs its action list in order, one action at a time. A compute
action starts when the stage is free; a receive waits until the matching
send of the neighbouring stage has happened plus ``transfer_time``. Sends
cost the stage nothing (the link carries them). So the result is the
as-soon-as-possible timing of exactly the order the strategy executes.
"""

import dataclasses

from tfsparse._validation import invalid_value as invalid
from tfsparse.distribute import schedules as _schedules
from tfsparse.distribute.stages import StagePlan
from tfsparse.distribute.stages import check_costs
from tfsparse.distribute.stages import plan_stages

_SPLIT_SCHEDULES = ("layerpipe",)


@dataclasses.dataclass(frozen=True)
class SimulationResult:
    """What a replayed schedule did.

    Attributes:
      cycles: the makespan, in the unit of the costs.
      utilization: per stage, busy time / ``cycles``.
      bubble_fraction: idle share of all stages' time, ``1 - mean(utilization)``.
      peak_activations: per stage, the most micro-batches whose activations
        were held at once (between a micro-batch's forward and its weight
        gradient).
      throughput: micro-batches per unit of cost, ``total / cycles``.
      timeline: tuple of ``(action, start, end)`` for the compute actions.
      order: every action of every stage in one sequence, by simulated time,
        each stage's list order kept and every send before its receive (the
        order in which ``PipelineStrategy`` builds the TensorFlow graph).
      plan: the ``StagePlan`` used.
      stage_costs: per stage ``(forward, backward_input, backward_weight)``.
      schedule: the replayed ``Schedule``.
    """

    cycles: float
    utilization: tuple
    bubble_fraction: float
    peak_activations: tuple
    throughput: float
    timeline: tuple
    order: tuple
    plan: StagePlan
    stage_costs: tuple
    schedule: object


def simulate(schedule, costs, num_stages, num_microbatches, steps=1, *,
             stages=None, splittable=None, update_cost=0.0, transfer_time=0.0,
             **schedule_options):
    """Replays a schedule with per-layer costs and measures it.

    Args:
      schedule: a schedule name (see ``tfsparse.distribute.SCHEDULES``) or a
        ``Schedule`` from ``tfsparse.distribute.schedule``.
      costs: one ``(forward, backward_input, backward_weight)`` per layer, for
        one micro-batch.
      num_stages: number of stages.
      num_microbatches: micro-batches per mini-batch.
      steps: mini-batches replayed.
      stages: a ``StagePlan``, an explicit list of lists of layer indices, or
        ``None`` for the balanced plan (with LayerPipe's row split for
        ``"layerpipe"``).
      splittable: per layer, whether LayerPipe may split its rows.
      update_cost: cost of one update of a stage.
      transfer_time: delay between a send and its receive.
      **schedule_options: ``min_update_interval``/``max_in_flight`` for
        ``"async"``.

    Returns:
      A ``SimulationResult``.

    Example:
      >>> r = simulate("gpipe", [(1, 1, 1)] * 4, 4, 8)
      >>> r.bubble_fraction == 3 / 11
      True
    """
    sched = _as_schedule(schedule, num_stages, num_microbatches, steps, schedule_options)
    costs = check_costs(costs)
    if isinstance(stages, StagePlan):
        plan = stages
        if plan.num_stages != sched.num_stages:
            raise invalid("stages", f"a plan with {sched.num_stages} stages",
                          plan.num_stages)
    else:
        plan = plan_stages(costs, sched.num_stages,
                           split=sched.name in _SPLIT_SCHEDULES,
                           splittable=splittable, stages=stages)
    stage_costs = plan.stage_costs(costs)
    return replay(sched, stage_costs, plan, update_cost, transfer_time)


def _as_schedule(schedule, num_stages, num_microbatches, steps, options):
    if isinstance(schedule, _schedules.Schedule):
        given = (schedule.num_stages, schedule.num_microbatches, schedule.steps)
        if given != (num_stages, num_microbatches, steps):
            raise invalid("schedule", f"a schedule for num_stages={num_stages}, "
                          f"num_microbatches={num_microbatches}, steps={steps}",
                          f"a schedule with (stages, microbatches, steps)={given}")
        return schedule
    return _schedules.schedule(schedule, num_stages, num_microbatches, steps, **options)


def _action_cost(action, costs, update_cost):
    forward, backward_input, backward_weight = costs[action.stage]
    return {
        _schedules.FORWARD: forward,
        _schedules.BACKWARD_INPUT: backward_input,
        _schedules.BACKWARD_WEIGHT: backward_weight,
        _schedules.UPDATE: update_cost,
    }.get(action.kind, 0.0)


def replay(sched, stage_costs, plan=None, update_cost=0.0, transfer_time=0.0):
    """Replays ``sched`` with per-stage costs; see ``simulate``.

    Raises:
      RuntimeError: when the action lists deadlock (a receive whose send can
        never happen).
    """
    num_stages = sched.num_stages
    position = [0] * num_stages
    clock = [0.0] * num_stages
    busy = [0.0] * num_stages
    sent = {}
    timeline = []
    times = [[] for _ in range(num_stages)]  # every action's time, in list order
    remaining = sum(len(actions) for actions in sched.actions)
    while remaining:
        progressed = False
        for s, actions in enumerate(sched.actions):
            while position[s] < len(actions):
                action = actions[position[s]]
                if action.kind in _schedules.RECEIVES:
                    send_kind, offset = _schedules.RECEIVES[action.kind]
                    key = (send_kind, s + offset, action.microbatch, action.microbatches)
                    if key not in sent:
                        break
                    clock[s] = max(clock[s], sent[key] + transfer_time)
                    times[s].append(clock[s])
                elif action.kind.startswith("send_"):
                    sent[(action.kind, s, action.microbatch, action.microbatches)] = clock[s]
                    times[s].append(clock[s])
                else:
                    times[s].append(clock[s])
                    cost = _action_cost(action, stage_costs, update_cost)
                    timeline.append((action, clock[s], clock[s] + cost))
                    clock[s] += cost
                    busy[s] += cost
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [str(actions[position[s]]) for s, actions in enumerate(sched.actions)
                     if position[s] < len(actions)]
            raise RuntimeError(f"Schedule {sched.name!r} deadlocks at {stuck}")
    cycles = max(clock)
    utilization = tuple(b / cycles if cycles > 0 else 0.0 for b in busy)
    total = num_stages * cycles
    bubble = (total - sum(busy)) / total if total > 0 else 0.0
    return SimulationResult(
        cycles=cycles,
        utilization=utilization,
        bubble_fraction=bubble,
        peak_activations=peak_activations(sched),
        throughput=sched.total_microbatches / cycles if cycles > 0 else float("inf"),
        timeline=tuple(timeline),
        order=_merge_by_time(sched, times),
        plan=plan,
        stage_costs=tuple(stage_costs),
        schedule=sched,
    )


def _merge_by_time(sched, times):
    """Merges the stage lists by time; ties go to sends, then lower stages."""
    position = [0] * sched.num_stages
    sent = set()
    order = []
    total = sum(len(actions) for actions in sched.actions)
    while len(order) < total:
        best = None
        for s, actions in enumerate(sched.actions):
            if position[s] == len(actions):
                continue
            action = actions[position[s]]
            if action.kind in _schedules.RECEIVES:
                send_kind, offset = _schedules.RECEIVES[action.kind]
                if (send_kind, s + offset, action.microbatch, action.microbatches) not in sent:
                    continue
            key = (times[s][position[s]], not action.kind.startswith("send_"), s)
            if best is None or key < best[0]:
                best = (key, s, action)
        _, s, action = best
        if action.kind.startswith("send_"):
            sent.add((action.kind, s, action.microbatch, action.microbatches))
        order.append(action)
        position[s] += 1
    return tuple(order)


def peak_activations(sched):
    """Per stage, the most micro-batches held between forward and weight gradient."""
    peaks = []
    for actions in sched.actions:
        held = peak = 0
        for action in actions:
            if action.kind == _schedules.FORWARD:
                held += 1
                peak = max(peak, held)
            elif action.kind == _schedules.BACKWARD_WEIGHT:
                held -= 1
        peaks.append(peak)
    return tuple(peaks)
