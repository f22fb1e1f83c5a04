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

A stage may run on a group of devices (``group_sizes[s] > 1``): its
``partitioned`` layers (SparseDense layers row-partitioned over the group,
see ``tfsparse.distribute.PipelineStrategy``) then cost ``1 / group_sizes[s]``
of their work on the stage's busiest device (the partition balances the
work within ``epsilon``; the exchange between the group's devices is not
counted), and its other layers their whole work (they run on the group's
first device). A partitioned layer is never split by rows with the previous
stage.
"""

import dataclasses
import math

from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value as invalid

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
      group_sizes: None, or one int per stage: its number of devices.
      partitioned: None, or one bool per layer: whether the layer's work
        divides over its stage's devices (see ``plan_stages``).
    """

    stages: tuple
    borrowed: tuple
    group_sizes: tuple = None
    partitioned: tuple = None

    @property
    def num_stages(self):
        return len(self.stages)

    def stage_costs(self, costs):
        """Per stage the summed ``(forward, backward_input, backward_weight)``.

        A stage on a group of devices counts its partitioned layers divided
        by the group size (the work of its busiest device).
        """
        costs = check_costs(costs)
        shares = _layer_shares(self.group_sizes, self.partitioned, self.num_stages,
                               len(costs))
        totals = []
        for s, layers in enumerate(self.stages):
            total = [0.0, 0.0, 0.0]
            for j, layer in enumerate(layers):
                share = 1.0 - self.borrowed[s - 1] if (j == 0 and s > 0) else 1.0
                share *= shares[s][layer]
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
    if not triples or any(len(t) != 3 or not all(0 <= c < math.inf for c in t)
                          for t in triples):
        raise invalid("costs", "a non-empty list of (forward, backward_input, "
                      "backward_weight) tuples of finite non-negative numbers", costs)
    return triples


def plan_stages(costs, num_stages, split=False, splittable=None, stages=None,
                group_sizes=None, partitioned=None):
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
      group_sizes: optional, one positive int per stage: the devices that
        stage runs on (default 1 each).
      partitioned: optional, one bool per layer (default all False): whether
        the layer's work divides over a stage's group of devices. On a stage
        of ``g`` devices such a layer costs ``1 / g`` of its work, and its
        rows are never split with the previous stage.

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
      >>> plan_stages([(1, 1, 1)] * 3, 2, group_sizes=[1, 2],
      ...             partitioned=[True] * 3).stages
      ((0,), (1, 2))
    """
    costs = check_costs(costs)
    num_layers = len(costs)
    num_stages = check_positive_int("num_stages", num_stages)
    if num_stages > num_layers:
        raise invalid("num_stages", f"at most the number of layers ({num_layers})",
                      num_stages)
    splittable = _check_flags("splittable", splittable, num_layers, True)
    grouped = group_sizes is not None or partitioned is not None
    if group_sizes is not None:
        if (not isinstance(group_sizes, (list, tuple)) or len(group_sizes) != num_stages):
            raise invalid("group_sizes", f"one positive integer per stage ({num_stages})",
                          group_sizes)
        group_sizes = tuple(check_positive_int("group_sizes", g) for g in group_sizes)
    partitioned = _check_flags("partitioned", partitioned, num_layers, False)
    shares = _layer_shares(group_sizes, partitioned, num_stages, num_layers)
    work = [sum(c) for c in costs]
    if stages is not None:
        partition = check_stages(stages, num_layers, num_stages)
        borrowed = (_borrowing(partition, work, splittable, shares) if split
                    else (0.0,) * num_stages)
    elif split:
        partition, borrowed = _split_partition(work, num_stages, splittable, shares)
    else:
        partition = _min_max_partition(work, num_stages, shares)
        borrowed = (0.0,) * num_stages
    plan = _whole_layers_owned(partition, borrowed)
    if grouped:
        plan = dataclasses.replace(plan, group_sizes=group_sizes, partitioned=partitioned)
    return plan


def _check_flags(name, flags, num_layers, default):
    if flags is None:
        return (default,) * num_layers
    flags = tuple(bool(f) for f in flags)
    if len(flags) != num_layers:
        raise invalid(name, f"one flag per layer ({num_layers})", flags)
    return flags


def _layer_shares(group_sizes, partitioned, num_stages, num_layers):
    """``shares[s][i]``: the part of layer ``i``'s work that stage ``s``'s
    busiest device does (``1 / group size`` for a partitioned layer)."""
    sizes = group_sizes or (1,) * num_stages
    flags = partitioned or (False,) * num_layers
    return [[1.0 / size if flag else 1.0 for flag in flags] for size in sizes]


def _lendable(splittable, shares, stage, layer):
    """Whether ``layer``, owned by ``stage``, may lend rows to the stage before."""
    return splittable[layer] and (shares is None or shares[stage][layer] == 1.0)


def _stage_prefixes(work, shares, num_stages):
    """Per stage, the prefix sums of the layers' work on that stage."""
    prefixes = []
    for s in range(num_stages):
        prefix = [0.0]
        for i, w in enumerate(work):
            prefix.append(prefix[-1] + (w if shares is None else w * shares[s][i]))
        prefixes.append(prefix)
    return prefixes


def _lower_bound(work, shares, num_stages):
    if shares is None:
        return sum(work) / num_stages
    return sum(w * min(row[i] for row in shares) for i, w in enumerate(work)) / num_stages


def _largest_stage(partition, work, shares):
    return max(sum(work[i] * (1.0 if shares is None else shares[s][i]) for i in group)
               for s, group in enumerate(partition))


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


def _min_max_partition(work, num_stages, shares=None):
    """Contiguous partition minimising the largest stage sum (dynamic programme)."""
    n = len(work)
    prefix = _stage_prefixes(work, shares, num_stages)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        stage = prefix[s - 1]
        for end in range(s, n - (num_stages - s) + 1):
            for start in range(s - 1, end):
                value = max(best[s - 1][start], stage[end] - stage[start])
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


def _split_partition(work, num_stages, splittable, shares=None):
    """The partition and borrowing with the smallest busiest stage.

    Bisection on the target ``T``; ``_feasible_partition`` decides each
    ``T`` exactly, and ``_greedy_fractions`` turns the partition found for
    the smallest feasible ``T`` into fractions.
    """
    partition = _min_max_partition(work, num_stages, shares)
    high, found = _bisect_smallest_target(
        _lower_bound(work, shares, num_stages),
        _largest_stage(partition, work, shares),
        lambda target: _feasible_partition(work, num_stages, splittable, target, shares),
    )
    partition = partition if found is None else found
    return partition, _greedy_fractions(partition, work, splittable, high, shares)


def _feasible_partition(work, num_stages, splittable, target, shares=None):
    """A partition whose stages all stay within ``target``, or None.

    Dynamic programme over (stages used, next layer): ``left[s][i]`` is the
    least work of layer ``i`` left for the stage that owns it after ``s``
    stages (the previous one borrowed what fitted; less is always better).
    A stage either owns layers ``start .. end - 1`` and borrows rows of
    layer ``end``, or (not the last stage) owns no layer and borrows rows of
    the untouched layer ``i`` (which the next stage then owns): that lets a
    heavy first layer spread over two stages. A layer's work counts with its
    owner's ``shares``; borrowed rows only come from layers whose share is 1.
    """
    n = len(work)
    inf = float("inf")
    tolerance = 1e-12 * max(target, 1.0)
    prefixes = _stage_prefixes(work, shares, num_stages)
    left = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    owned = [[False] * (n + 1) for _ in range(num_stages + 1)]  # reached owning layers
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    left[0][0], owned[0][0] = work[0], True
    for s in range(1, num_stages + 1):
        prefix = prefixes[s - 1]
        for end in range(n + 1):
            for start in range(end - 1, -1, -1):
                if prefix[end] - prefix[start + 1] > target + tolerance:
                    break  # owning more layers only adds work
                remaining = left[s - 1][start]
                if remaining == inf:
                    continue
                if shares is not None:
                    remaining *= shares[s - 1][start]
                load = remaining + prefix[end] - prefix[start + 1]
                if load > target + tolerance:
                    continue
                if end == n:
                    rest = 0.0
                elif s < num_stages and _lendable(splittable, shares, s, end):
                    rest = max(0.0, work[end] - (target - load))
                else:
                    rest = work[end]
                owned[s][end] = True
                if rest < left[s][end]:
                    left[s][end], cut[s][end] = rest, start
            if (s < num_stages and end < n and _lendable(splittable, shares, s, end)
                    and owned[s - 1][end]):
                rest = max(0.0, work[end] - target)
                if rest < left[s][end]:
                    left[s][end], cut[s][end] = rest, end
    if left[num_stages][n] == inf:
        return None
    return _unwind(cut, num_stages, n)


def _greedy_fractions(partition, work, splittable, target, shares=None):
    """Each stage borrows as much of the next stage's first layer as fits.

    Borrowing as much as possible only lightens later stages, so this finds
    fractions within ``target`` whenever any exist (None otherwise).
    """
    tolerance = 1e-12 * max(target, 1.0)
    result, carried = [], 0.0
    for s, group in enumerate(partition):
        load = sum(work[i] * (1.0 if shares is None else shares[s][i])
                   for i in group) - carried
        if load > target + tolerance:
            return None
        carried = 0.0
        nxt = partition[s + 1] if s + 1 < len(partition) else ()
        share = 0.0
        if nxt and _lendable(splittable, shares, s + 1, nxt[0]) and work[nxt[0]] > 0:
            share = min(1.0, max(0.0, target - load) / work[nxt[0]])
            carried = share * work[nxt[0]]
        result.append(share)
    return tuple(result)


def _borrowing(partition, work, splittable, shares=None):
    """Fractions for a fixed partition, minimising the busiest stage."""
    high = _largest_stage(partition, work, shares)
    _, found = _bisect_smallest_target(
        _lower_bound(work, shares, len(partition)),
        high,
        lambda target: _greedy_fractions(partition, work, splittable, target, shares),
    )
    return (_greedy_fractions(partition, work, splittable, high, shares)
            if found is None else found)


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
