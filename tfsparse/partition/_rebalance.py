"""Repair of a hypergraph partition whose blocks exceed their limit.

Mt-KaHyPar treats the block weights as a target: with fixed vertices and few,
heavy vertices (a heavily pruned layer: under a hundred neurons of very
unequal fan-in over 16 blocks) it sometimes returns a block a few units over
it. ``rebalance`` then moves vertices out of the heaviest block, each time the
move with the smallest increase of the weighted connectivity-1 objective
among those that fit, or, when no single vertex fits anywhere, the swap of
a vertex with a lighter one of another block that brings both blocks within
the limit, until every block is within it. When neither fits (loads that
only an exact packing meets, as block-pruned layers need: every neuron's
work a multiple of the block), it solves the assignment exactly
(``assign_within_limit``).
"""

import numpy as np
import scipy.sparse
from scipy.optimize import Bounds
from scipy.optimize import LinearConstraint
from scipy.optimize import milp


def km1(nets, net_weights, blocks):
    """Weighted connectivity-1 objective: ``sum_e w_e (|blocks(e)| - 1)``.

    Example:
        >>> km1([np.array([0, 1]), np.array([1, 2])], [1, 3],
        ...     np.array([0, 1, 1]))
        1
    """
    total = 0
    for pins, weight in zip(nets, net_weights):
        total += int(weight) * (np.unique(blocks[pins]).size - 1)
    return total


def rebalance(blocks, work, limit, nets, net_weights, k):
    """Moves vertices until every block's work is at most ``limit``.

    Args:
        blocks: int array ``(vertices,)``, the partition (not modified).
        work: int array ``(vertices,)``: the balanced weight of each vertex;
            0 for vertices that do not count (anchors, look-ahead outputs),
            which are never moved.
        limit: largest allowed work per block.
        nets: list of int arrays of pins.
        net_weights: weight of each net.
        k: number of blocks.

    Returns:
        ``(blocks, balanced)``: the repaired partition and whether every
        block is now within ``limit`` (False only when no assignment of the
        vertices meets it, or none was found in ``assign_within_limit``'s
        time limit).

    Example:
        >>> blocks, ok = rebalance(np.array([0, 0, 0, 1]), np.array([2, 2, 2, 2]),
        ...                        4, [np.array([0, 1])], [1], 2)
        >>> ok, np.bincount(blocks, weights=[2, 2, 2, 2]).tolist()
        (True, [4.0, 4.0])
    """
    state = _Blocks(blocks, work, nets, net_weights, k)
    blocks, work, load = state.blocks, state.work, state.load
    while load.max() > limit:
        source = int(np.argmax(load))
        best = None
        for v in np.flatnonzero((blocks == source) & (work > 0)):
            fits = load + work[v] <= limit
            fits[source] = False
            if not fits.any():
                continue
            cost = np.where(fits, state.delta(v), np.iinfo(np.int64).max)
            target = int(np.argmin(cost))
            key = (int(cost[target]), -int(work[v]))
            if best is None or key < best[0]:
                best = (key, v, target)
        if best is not None:
            state.move(best[1], best[2])
            continue
        # No vertex fits anywhere: swap v (source) with a lighter u (b) such
        # that both blocks end within the limit; the cheapest such swap
        # (the two moves' changes, each as if alone) wins.
        for v in np.flatnonzero((blocks == source) & (work > 0)):
            cost_v = state.delta(v)
            for u in np.flatnonzero((blocks != source) & (work > 0)
                                    & (work < work[v])):
                b = blocks[u]
                if (load[b] + work[v] - work[u] > limit
                        or load[source] - work[v] + work[u] > limit):
                    continue
                key = (int(cost_v[b] + state.delta(u)[source]), 0)
                if best is None or key < best[0]:
                    best = (key, v, u)
        if best is None:
            return assign_within_limit(blocks, work, limit, nets, net_weights, k)
        _, v, u = best
        b = int(blocks[u])
        state.move(v, b)
        state.move(u, source)
    return blocks, True


class _Blocks:
    """A partition being repaired: blocks, block loads, and pins of every net
    per block, kept in step by ``move``; ``delta`` prices a move."""

    def __init__(self, blocks, work, nets, net_weights, k):
        self.blocks = np.array(blocks, dtype=np.int64)
        self.work = np.asarray(work, dtype=np.int64)
        self.load = np.bincount(self.blocks, weights=self.work, minlength=k).astype(np.int64)
        self.net_weights = np.asarray(net_weights, dtype=np.int64)
        self.count = np.zeros((len(nets), k), dtype=np.int64)
        incident = [[] for _ in range(self.blocks.size)]
        for e, pins in enumerate(nets):
            np.add.at(self.count[e], self.blocks[pins], 1)
            for v in pins:
                incident[v].append(e)
        self.incident = [np.array(e, dtype=np.int64) for e in incident]

    def delta(self, v):
        """Objective change of moving ``v`` alone from its block to each block."""
        nets_v, source = self.incident[v], self.blocks[v]
        # Leaving ``source`` saves w_e where v is its only pin there; joining
        # block b costs w_e where b had no pin of the net.
        saved = (self.net_weights[nets_v] * (self.count[nets_v, source] == 1)).sum()
        added = (self.net_weights[nets_v, None] * (self.count[nets_v] == 0)).sum(axis=0)
        return added - saved

    def move(self, v, target):
        source = self.blocks[v]
        self.count[self.incident[v], source] -= 1
        self.count[self.incident[v], target] += 1
        self.load[source] -= self.work[v]
        self.load[target] += self.work[v]
        self.blocks[v] = target


def assign_within_limit(blocks, work, limit, nets, net_weights, k, time_limit=30.0):
    """Every block within ``limit`` by an exact assignment (HiGHS MILP).

    A generalised assignment: each vertex costs the objective change of its
    move as if it moved alone (0 where it stays, fewest moves among equals),
    every block's load is at most ``limit``; vertices with zero work
    (anchors, look-ahead outputs) stay where they are. Moves that share a
    net do not add up exactly, so single moves that lower the objective
    within the limit follow (``_improve``). For the loads that greedy moves
    cannot reach: when every block must be filled almost exactly (a layer
    whose neurons' work comes in a few large multiples) only a packing of
    the whole layer meets the limit.

    Args:
        blocks, work, limit, nets, net_weights, k: as ``rebalance``.
        time_limit: seconds HiGHS may search.

    Returns:
        ``(blocks, balanced)``; ``blocks`` unchanged when ``balanced`` is
        False (no assignment exists, or none was found in time).

    Example:
        >>> blocks, ok = assign_within_limit(
        ...     np.array([0, 0, 0, 1, 1, 1]), np.array([3, 3, 3, 2, 2, 2]), 8,
        ...     [np.array([0, 1])], [1], 2)
        >>> ok, np.bincount(blocks, weights=[3, 3, 3, 2, 2, 2]).tolist()
        (True, [8.0, 7.0])
    """
    state = _Blocks(blocks, work, nets, net_weights, k)
    blocks, work = state.blocks, state.work
    movable = np.flatnonzero(work > 0)
    m = movable.size
    costs = np.array([state.delta(v) for v in movable], dtype=np.float64).reshape(m, k)
    moved = np.arange(k)[None, :] != blocks[movable][:, None]
    costs[~moved] = 0.0  # staying costs nothing
    # Below 1 in total, so the fewest moves only break ties.
    costs += moved * (0.5 / max(m, 1))
    one_block = scipy.sparse.csr_matrix(
        (np.ones(m * k), (np.repeat(np.arange(m), k), np.arange(m * k))), shape=(m, m * k))
    loads = scipy.sparse.csr_matrix(
        (np.repeat(work[movable], k).astype(np.float64),
         (np.tile(np.arange(k), m), np.arange(m * k))), shape=(k, m * k))
    result = milp(costs.ravel(), integrality=np.ones(m * k), bounds=Bounds(0, 1),
                  constraints=[LinearConstraint(one_block, 1, 1),
                               LinearConstraint(loads, -np.inf, limit)],
                  options={"time_limit": float(time_limit)})
    if result.x is None:
        return blocks, False
    assigned = np.argmax(result.x.reshape(m, k), axis=1)
    if np.bincount(assigned, weights=work[movable], minlength=k).max() > limit:
        return blocks, False
    for v, target in zip(movable, assigned):
        state.move(v, target)
    return _improve(state, limit), True


def _improve(state, limit):
    """Applies the best single move that lowers the objective within ``limit``
    until none does (each lowers the integer objective, so this ends);
    returns the blocks."""
    movable = np.flatnonzero(state.work > 0)
    while True:
        best = (0, None, None)
        for v in movable:
            delta = state.delta(v)
            fits = state.load + state.work[v] <= limit
            fits[state.blocks[v]] = False
            if fits.any():
                target = int(np.flatnonzero(fits)[np.argmin(delta[fits])])
                if delta[target] < best[0]:
                    best = (int(delta[target]), v, target)
        if best[1] is None:
            return state.blocks
        state.move(best[1], best[2])
