"""Pipeline schedules as data: per stage, the ordered list of actions.

A schedule is a pure function of (name, stages, micro-batches, steps). The
simulator (``tfsparse.distribute.simulate``) replays the lists with costs and
``PipelineStrategy`` executes the same lists with TensorFlow, so the simulator
predicts the pipeline by construction.

Micro-batches carry global indices ``0 .. steps * num_microbatches - 1``;
micro-batch ``m`` belongs to mini-batch (training step) ``m //
num_microbatches``. Stage ``s`` receives activations from ``s - 1`` and
gradients from ``s + 1``. Every action kind:

- ``forward`` m, ``backward_input`` m (the activation gradient, needed by the
  previous stage), ``backward_weight`` m (the weight gradient, needed only by
  the update);
- ``send_activation`` / ``receive_activation`` m (stage s to s + 1),
  ``send_gradient`` / ``receive_gradient`` m (stage s + 1 to s);
- ``send_weight_gradient`` / ``receive_weight_gradient`` (stage s to s + 1, a
  group of micro-batches): LayerPipe's borrowed rows (see
  ``tfsparse.distribute.stages``) make partial weight gradients of the next
  stage's first layer;
- ``update``: applies the mean gradient of ``microbatches`` to the stage's
  weights.

The schedules:

- ``"gpipe"``: per step all forwards, then all backwards, one update per
  stage (a flush). Equals training with gradient accumulation.
- ``"1f1b"``: PipeDream-Flush: per step, stage ``s`` runs ``P - s`` forwards,
  then alternates one backward and one forward, then the remaining
  backwards, then updates (a flush).
- ``"pipedream"``: asynchronous 1F1B over all ``steps`` without a flush,
  weight stashing, one update per stage after the backward of a mini-batch's
  last micro-batch. A micro-batch's backward sends its gradient after both
  halves (one backward task, as PipeDream runs it).
- ``"layerpipe"``: as ``"pipedream"``, but the backward is two tasks: the
  activation gradient is sent as soon as it is computed and the weight
  gradient runs after the send (off the critical path); with the row-split
  balancing of ``stages.plan_stages(..., split=True)`` the stage before the
  owner of a layer computes part of it and sends its partial weight gradient
  before the owner's update. Each update is placed one micro-batch later
  (after the weight gradient of the next mini-batch's first micro-batch), so
  waiting for that partial gradient never stalls the owner.
- ``"async"``: AMPNet-style: no flush, each stage updates after every
  ``min_update_interval`` weight gradients, and at most ``max_in_flight``
  micro-batches are between their first forward and their last backward.

Delays (``update_delays``): the number of updates a stage applies between
the forward of a micro-batch and the update that applies its gradient. For
``"gpipe"`` and ``"1f1b"`` it is 0. For ``"pipedream"`` on stage ``s`` it is
``ceil(S / M)`` with ``S = P - 1 - s`` stages after it; for ``"layerpipe"``
``ceil((S + 1) / M)`` (the update waits one more micro-batch); for
``"async"`` ``ceil((min(K, P - s) - 1) / u)``. With one micro-batch per
update (``M = 1``) PipeDream's delay is ``S`` micro-batches, which is
LayerPipe2's ``2 * S(l)`` steps when a step is one forward or one backward
(a micro-batch's round trip crosses ``S`` stages twice).
"""

import collections
import dataclasses
import math

from tfsparse._validation import check_choice
from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value as invalid

SCHEDULES = ("gpipe", "1f1b", "pipedream", "layerpipe", "async")

FORWARD = "forward"
BACKWARD_INPUT = "backward_input"
BACKWARD_WEIGHT = "backward_weight"
SEND_ACTIVATION = "send_activation"
RECEIVE_ACTIVATION = "receive_activation"
SEND_GRADIENT = "send_gradient"
RECEIVE_GRADIENT = "receive_gradient"
SEND_WEIGHT_GRADIENT = "send_weight_gradient"
RECEIVE_WEIGHT_GRADIENT = "receive_weight_gradient"
UPDATE = "update"

COMPUTE_KINDS = (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, UPDATE)
# receive kind -> (send kind, offset of the sending stage)
RECEIVES = {
    RECEIVE_ACTIVATION: (SEND_ACTIVATION, -1),
    RECEIVE_GRADIENT: (SEND_GRADIENT, +1),
    RECEIVE_WEIGHT_GRADIENT: (SEND_WEIGHT_GRADIENT, -1),
}


class Action(collections.namedtuple("Action", ["kind", "stage", "microbatch", "microbatches"])):
    """One action of a stage.

    Attributes:
      kind: one of the kind constants of this module.
      stage: the stage running it.
      microbatch: the global micro-batch index, or -1 for ``update`` and the
        weight-gradient transfers.
      microbatches: for ``update`` and weight-gradient transfers, the tuple of
        micro-batches whose gradients they carry; otherwise ``()``.
    """

    __slots__ = ()

    def __str__(self):
        if self.microbatch >= 0:
            return f"{self.kind}({self.microbatch})@{self.stage}"
        return f"{self.kind}{list(self.microbatches)}@{self.stage}"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: the ordered actions of every stage.

    Attributes:
      name: the schedule's name (one of ``SCHEDULES``).
      num_stages: number of stages ``P``.
      num_microbatches: micro-batches per mini-batch ``M``.
      steps: mini-batches (training steps) covered.
      actions: tuple with one tuple of ``Action`` per stage, in execution order.
    """

    name: str
    num_stages: int
    num_microbatches: int
    steps: int
    actions: tuple

    @property
    def total_microbatches(self):
        return self.steps * self.num_microbatches


def schedule(name, num_stages, num_microbatches, steps=1, *,
             min_update_interval=None, max_in_flight=None):
    """Generates the per-stage action lists of a pipeline schedule.

    Args:
      name: one of ``"gpipe"``, ``"1f1b"``, ``"pipedream"``, ``"layerpipe"``,
        ``"async"``.
      num_stages: positive int, the number of stages ``P``.
      num_microbatches: positive int, micro-batches per mini-batch ``M``.
      steps: positive int, mini-batches covered (the asynchronous schedules
        run them without a flush in between).
      min_update_interval: ``"async"`` only: gradients a stage accumulates
        before it updates (default ``num_microbatches``).
      max_in_flight: ``"async"`` only: most micro-batches in flight at once
        (default ``num_stages``, a full pipeline).

    Returns:
      A ``Schedule``.

    Raises:
      ValueError: for an unknown name or a non-positive count.

    Example:
      >>> s = schedule("gpipe", 2, 2)
      >>> [str(a) for a in s.actions[1]][:3]
      ['receive_activation(0)@1', 'forward(0)@1', 'receive_activation(1)@1']
    """
    check_choice("name", name, SCHEDULES)
    num_stages = check_positive_int("num_stages", num_stages)
    num_microbatches = check_positive_int("num_microbatches", num_microbatches)
    steps = check_positive_int("steps", steps)
    if name != "async":
        for arg, value in (("min_update_interval", min_update_interval),
                           ("max_in_flight", max_in_flight)):
            if value is not None:
                raise invalid(arg, 'None unless name="async"', value)
    interval = num_microbatches if min_update_interval is None else check_positive_int(
        "min_update_interval", min_update_interval)
    in_flight = num_stages if max_in_flight is None else check_positive_int(
        "max_in_flight", max_in_flight)
    total = steps * num_microbatches
    lists = []
    for stage in range(num_stages):
        if name in ("gpipe", "1f1b"):
            actions = []
            for step in range(steps):
                mbs = list(range(step * num_microbatches, (step + 1) * num_microbatches))
                depth = len(mbs) if name == "gpipe" else num_stages - stage
                actions += _build(stage, num_stages, _order(mbs, depth),
                                  [tuple(mbs)], split=False, defer=False)
            lists.append(tuple(actions))
            continue
        mbs = list(range(total))
        if name == "async":
            depth = min(in_flight, num_stages - stage)
            groups = [tuple(mbs[i:i + interval]) for i in range(0, total, interval)]
        else:
            depth = num_stages - stage
            groups = [tuple(mbs[i:i + num_microbatches])
                      for i in range(0, total, num_microbatches)]
        layerpipe = name == "layerpipe"
        lists.append(tuple(_build(stage, num_stages, _order(mbs, depth), groups,
                                  split=layerpipe, defer=layerpipe)))
    return Schedule(name, num_stages, num_microbatches, steps, tuple(lists))


def _order(microbatches, depth):
    """1F1B order with at most ``depth`` micro-batches between forward and backward.

    ``depth >= len(microbatches)`` gives GPipe's all-forwards-then-backwards.
    """
    order, forwarded, backwarded = [], 0, 0
    while backwarded < len(microbatches):
        if forwarded < len(microbatches) and forwarded - backwarded < depth:
            order.append((FORWARD, microbatches[forwarded]))
            forwarded += 1
        else:
            order.append((BACKWARD_INPUT, microbatches[backwarded]))
            backwarded += 1
    return order


def _build(stage, num_stages, order, groups, split, defer):
    """Turns a forward/backward order into actions with transfers and updates.

    Args:
      split: backward as two tasks, gradient sent between them (LayerPipe),
        with weight-gradient transfers to the next stage.
      defer: place each update after the weight gradient of the next group's
        first micro-batch (the last group's update ends the list).
    """
    first, last = stage == 0, stage == num_stages - 1
    group_of = {m: g for g, members in enumerate(groups) for m in members}
    backwards_left = collections.Counter(group_of[m] for kind, m in order
                                         if kind == BACKWARD_INPUT)
    pending = []  # groups whose weight gradients are complete, update not placed
    actions = []

    def update(group):
        members = groups[group]
        if split and not first:
            actions.append(Action(RECEIVE_WEIGHT_GRADIENT, stage, -1, members))
        actions.append(Action(UPDATE, stage, -1, members))

    for kind, m in order:
        if kind == FORWARD:
            if not first:
                actions.append(Action(RECEIVE_ACTIVATION, stage, m, ()))
            actions.append(Action(FORWARD, stage, m, ()))
            if not last:
                actions.append(Action(SEND_ACTIVATION, stage, m, ()))
            continue
        if not last:
            actions.append(Action(RECEIVE_GRADIENT, stage, m, ()))
        actions.append(Action(BACKWARD_INPUT, stage, m, ()))
        if split and not first:
            actions.append(Action(SEND_GRADIENT, stage, m, ()))
        actions.append(Action(BACKWARD_WEIGHT, stage, m, ()))
        if not split and not first:
            actions.append(Action(SEND_GRADIENT, stage, m, ()))
        group = group_of[m]
        backwards_left[group] -= 1
        if defer:
            while pending and pending[0] < group:
                update(pending.pop(0))
        if backwards_left[group] == 0:
            if split and not last:
                actions.append(Action(SEND_WEIGHT_GRADIENT, stage, -1, groups[group]))
            if defer:
                pending.append(group)
            else:
                update(group)
    for group in pending:
        update(group)
    return actions


def update_delays(sched):
    """The largest weight delay of every stage, measured from the action lists.

    A micro-batch's delay on a stage is the number of updates the stage
    applies between that micro-batch's forward and the update that applies
    its gradient (0: synchronous). Rows of a stage's first layer that
    LayerPipe lends to the stage before it are computed in that stage's
    forward, which these lists do not show: their delay can be one more.

    Args:
      sched: a ``Schedule``.

    Returns:
      A tuple with one int per stage.

    Example:
      >>> update_delays(schedule("pipedream", 3, 1, steps=6))
      (2, 1, 0)
    """
    delays = []
    for actions in sched.actions:
        version, forward_version, worst = 0, {}, 0
        for action in actions:
            if action.kind == FORWARD:
                forward_version[action.microbatch] = version
            elif action.kind == UPDATE:
                for m in action.microbatches:
                    worst = max(worst, version - forward_version[m])
                version += 1
        delays.append(worst)
    return tuple(delays)


def stated_delay(name, stage, num_stages, num_microbatches,
                 min_update_interval=None, max_in_flight=None):
    """The closed-form delay of ``update_delays`` in steady state (see module doc)."""
    after = num_stages - 1 - stage
    if name in ("gpipe", "1f1b"):
        return 0
    if name == "pipedream":
        return math.ceil(after / num_microbatches)
    if name == "layerpipe":
        return math.ceil((after + 1) / num_microbatches)
    interval = min_update_interval or num_microbatches
    depth = min(max_in_flight or num_stages, num_stages - stage)
    return math.ceil((depth - 1) / interval)
