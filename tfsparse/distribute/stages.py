"""Stage assignment: contiguous groups of layers balanced by cost.

Every layer ``l`` has a cost triple ``(forward, backward_input,
backward_weight)``. A ``StagePlan`` assigns contiguous layers to stages; the
busiest stage bounds a pipeline's throughput, so plans minimise the largest
stage cost (PipeDream's partitioning, without its communication term).

LayerPipe balances further by splitting a layer's work over two consecutive
processors. tfsparse splits by rows of the micro-batch: with ``borrowed[s] =
a``, stage ``s`` computes the first layer of stage ``s + 1`` (forward,
activation gradient and weight gradient) for the last ``a`` fraction of each
micro-batch's rows, and stage ``s + 1`` for the rest; the two partial weight
gradients add up before the owner's update. This works for any layer that
treats rows independently (dense and sparse layers, activations), and lets
every stage reach the same cost whenever the split layers are large enough.
"""

import dataclasses

from tfsparse.distribute._validation import check_positive_int
from tfsparse.distribute._validation import invalid

_BISECTION_STEPS = 100


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """Layers of every stage, and the rows each stage borrows from the next.

    Attributes:
      stages: tuple of tuples of consecutive layer indices, one per stage.
        With borrowing, a stage other than the last may own no layer and
        only compute rows of the next stage's first layer.
      borrowed: tuple of floats in [0, 1], one per stage: the fraction of the
        rows of the next stage's first layer this stage computes (0 for the
        last stage).
    """

    stages: tuple
    borrowed: tuple

    @property
    def num_stages(self):
        return len(self.stages)

    def stage_costs(self, costs):
        """Per stage the summed ``(forward, backward_input, backward_weight)``."""
        costs = check_costs(costs)
        totals = []
        for s, layers in enumerate(self.stages):
            total = [0.0, 0.0, 0.0]
            for j, layer in enumerate(layers):
                share = 1.0 - self.borrowed[s - 1] if (j == 0 and s > 0) else 1.0
                total = [t + share * c for t, c in zip(total, costs[layer])]
            if self.borrowed[s] > 0:
                lent = costs[self.stages[s + 1][0]]
                total = [t + self.borrowed[s] * c for t, c in zip(total, lent)]
            totals.append(tuple(total))
        return tuple(totals)

    def max_stage_cost(self, costs):
        return max(sum(c) for c in self.stage_costs(costs))


def check_costs(costs):
    """Returns ``costs`` as a tuple of float triples or raises ``ValueError``."""
    try:
        triples = tuple(tuple(float(c) for c in layer) for layer in costs)
    except (TypeError, ValueError):
        raise invalid("costs", "a list of (forward, backward_input, "
                      "backward_weight) tuples, one per layer", costs) from None
    if not triples or any(len(t) != 3 or min(t) < 0 for t in triples):
        raise invalid("costs", "a non-empty list of (forward, backward_input, "
                      "backward_weight) tuples of non-negative numbers", costs)
    return triples


def plan_stages(costs, num_stages, split=False, splittable=None, stages=None):
    """Assigns layers to ``num_stages`` stages, minimising the busiest stage.

    Args:
      costs: one ``(forward, backward_input, backward_weight)`` per layer.
      num_stages: positive int, at most the number of layers.
      split: LayerPipe's balancing: let each stage compute a fraction of the
        rows of the next stage's first layer.
      splittable: with ``split``, one bool per layer (default all True):
        whether that layer's rows may be split.
      stages: explicit assignment, a list of lists of consecutive layer
        indices covering every layer once; ``split`` then only adds the
        borrowed fractions.

    Returns:
      A ``StagePlan``.

    Example:
      >>> plan_stages([(1, 1, 1)] * 3, 2).stages
      ((0,), (1, 2))
      >>> plan = plan_stages([(1, 1, 1)] * 3, 2, split=True)
      >>> plan.stages, [round(b, 6) for b in plan.borrowed]
      (((0,), (1, 2)), [0.5, 0.0])
      >>> [round(sum(c), 6) for c in plan.stage_costs([(1, 1, 1)] * 3)]
      [4.5, 4.5]
    """
    costs = check_costs(costs)
    num_layers = len(costs)
    num_stages = check_positive_int("num_stages", num_stages)
    if num_stages > num_layers:
        raise invalid("num_stages", f"at most the number of layers ({num_layers})",
                      num_stages)
    if splittable is None:
        splittable = (True,) * num_layers
    splittable = tuple(bool(f) for f in splittable)
    if len(splittable) != num_layers:
        raise invalid("splittable", f"one flag per layer ({num_layers})",
                      splittable)
    work = [sum(c) for c in costs]
    if stages is not None:
        partition = check_stages(stages, num_layers, num_stages)
        borrowed = (_borrowing(partition, work, splittable) if split
                    else (0.0,) * num_stages)
    elif split:
        partition, borrowed = _split_partition(work, num_stages, splittable)
    else:
        partition = _min_max_partition(work, num_stages)
        borrowed = (0.0,) * num_stages
    return _whole_layers_owned(partition, borrowed)


def _whole_layers_owned(partition, borrowed):
    """A layer borrowed entirely moves to the borrowing stage (if its owner keeps one)."""
    partition, borrowed = [list(g) for g in partition], list(borrowed)
    for s in range(len(partition) - 1):
        if borrowed[s] >= 1.0 - 1e-12 and len(partition[s + 1]) > 1:
            partition[s].append(partition[s + 1].pop(0))
            borrowed[s] = 0.0
    return StagePlan(tuple(tuple(g) for g in partition), tuple(borrowed))


def check_stages(stages, num_layers, num_stages=None):
    """Validates an explicit assignment; returns it as a tuple of tuples."""
    try:
        partition = tuple(tuple(int(i) for i in group) for group in stages)
    except (TypeError, ValueError):
        raise invalid("stages", "a list of lists of layer indices", stages) from None
    flat = [i for group in partition for i in group]
    if (not partition or any(not group for group in partition)
            or flat != list(range(num_layers))):
        raise invalid("stages", "non-empty lists of consecutive layer indices "
                      f"covering layers 0..{num_layers - 1} once, in order", stages)
    if num_stages is not None and len(partition) != num_stages:
        raise invalid("stages", f"{num_stages} stages (one per device)", stages)
    return partition


def _min_max_partition(work, num_stages):
    """Contiguous partition minimising the largest stage sum (dynamic programme)."""
    n = len(work)
    prefix = [0.0]
    for w in work:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for end in range(s, n - (num_stages - s) + 1):
            for start in range(s - 1, end):
                value = max(best[s - 1][start], prefix[end] - prefix[start])
                if value < best[s][end]:
                    best[s][end], cut[s][end] = value, start
    return _unwind(cut, num_stages, n)


def _unwind(cut, num_stages, n):
    bounds, end = [], n
    for s in range(num_stages, 0, -1):
        start = cut[s][end]
        bounds.append(tuple(range(start, end)))
        end = start
    return tuple(reversed(bounds))


def _split_partition(work, num_stages, splittable):
    """The partition and borrowing with the smallest busiest stage.

    Bisection on the target ``T``; ``_feasible_partition`` decides each
    ``T`` exactly, and ``_greedy_fractions`` turns the partition found for
    the smallest feasible ``T`` into fractions.
    """
    partition = _min_max_partition(work, num_stages)
    high, found = _bisect_smallest_target(
        sum(work) / num_stages,
        max(sum(work[i] for i in group) for group in partition),
        lambda target: _feasible_partition(work, num_stages, splittable, target),
    )
    partition = partition if found is None else found
    return partition, _greedy_fractions(partition, work, splittable, high)


def _feasible_partition(work, num_stages, splittable, target):
    """A partition whose stages all stay within ``target``, or None.

    Dynamic programme over (stages used, next layer): ``left[s][i]`` is the
    least work of layer ``i`` left for the stage that owns it after ``s``
    stages (the previous one borrowed what fitted; less is always better).
    A stage either owns layers ``start .. end - 1`` and borrows rows of
    layer ``end``, or (not the last stage) owns no layer and borrows rows of
    the untouched layer ``i`` (which the next stage then owns): that lets a
    heavy first layer spread over two stages.
    """
    n = len(work)
    inf = float("inf")
    tolerance = 1e-12 * max(target, 1.0)
    prefix = [0.0]
    for w in work:
        prefix.append(prefix[-1] + w)
    left = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    owned = [[False] * (n + 1) for _ in range(num_stages + 1)]  # reached owning layers
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    left[0][0], owned[0][0] = work[0], True
    for s in range(1, num_stages + 1):
        for end in range(n + 1):
            for start in range(end - 1, -1, -1):
                if prefix[end] - prefix[start + 1] > target + tolerance:
                    break  # owning more layers only adds work
                remaining = left[s - 1][start]
                if remaining == inf:
                    continue
                load = remaining + prefix[end] - prefix[start + 1]
                if load > target + tolerance:
                    continue
                if end == n:
                    rest = 0.0
                elif splittable[end]:
                    rest = max(0.0, work[end] - (target - load))
                else:
                    rest = work[end]
                owned[s][end] = True
                if rest < left[s][end]:
                    left[s][end], cut[s][end] = rest, start
            if (s < num_stages and end < n and splittable[end]
                    and owned[s - 1][end]):
                rest = max(0.0, work[end] - target)
                if rest < left[s][end]:
                    left[s][end], cut[s][end] = rest, end
    if left[num_stages][n] == inf:
        return None
    return _unwind(cut, num_stages, n)


def _greedy_fractions(partition, work, splittable, target):
    """Each stage borrows as much of the next stage's first layer as fits.

    Borrowing as much as possible only lightens later stages, so this finds
    fractions within ``target`` whenever any exist (None otherwise).
    """
    tolerance = 1e-12 * max(target, 1.0)
    result, carried = [], 0.0
    for s, group in enumerate(partition):
        load = sum(work[i] for i in group) - carried
        if load > target + tolerance:
            return None
        carried = 0.0
        nxt = partition[s + 1] if s + 1 < len(partition) else ()
        share = 0.0
        if nxt and splittable[nxt[0]] and work[nxt[0]] > 0:
            share = min(1.0, max(0.0, target - load) / work[nxt[0]])
            carried = share * work[nxt[0]]
        result.append(share)
    return tuple(result)


def _borrowing(partition, work, splittable):
    """Fractions for a fixed partition, minimising the busiest stage."""
    high = max(sum(work[i] for i in group) for group in partition)
    _, found = _bisect_smallest_target(
        sum(work) / len(partition),
        high,
        lambda target: _greedy_fractions(partition, work, splittable, target),
    )
    return _greedy_fractions(partition, work, splittable, high) if found is None else found


def _bisect_smallest_target(low, high, solve):
    """Bisects for the smallest target in (low, high] that ``solve`` accepts.

    ``solve(target)`` returns a solution or None. Returns the smallest accepted
    target found (``high`` if none below it was) and its solution (None then).
    """
    best = None
    for _ in range(_BISECTION_STEPS):
        if high - low <= 1e-12 * max(high, 1.0):
            break
        target = (low + high) / 2
        found = solve(target)
        if found is None:
            low = target
        else:
            high, best = target, found
    return high, best
