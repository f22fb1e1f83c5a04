"""Greedy repair of a hypergraph partition whose blocks exceed their limit.

Mt-KaHyPar treats the block weights as a target: with fixed vertices and few,
heavy vertices (a heavily pruned layer: under a hundred neurons of very
unequal fan-in over 16 blocks) it sometimes returns a block a few units over
it. ``rebalance`` then moves vertices out of the heaviest block, each time the
move with the smallest increase of the weighted connectivity-1 objective
among those that fit, or, when no single vertex fits anywhere, the swap of
a vertex with a lighter one of another block that brings both blocks within
the limit, until every block is within it.
"""

import numpy as np


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
        block is now within ``limit`` (False only when no move fits).

    Example:
        >>> blocks, ok = rebalance(np.array([0, 0, 0, 1]), np.array([2, 2, 2, 2]),
        ...                        4, [np.array([0, 1])], [1], 2)
        >>> ok, np.bincount(blocks, weights=[2, 2, 2, 2]).tolist()
        (True, [4.0, 4.0])
    """
    blocks = np.array(blocks, dtype=np.int64)
    work = np.asarray(work, dtype=np.int64)
    load = np.bincount(blocks, weights=work, minlength=k).astype(np.int64)
    count = np.zeros((len(nets), k), dtype=np.int64)
    incident = [[] for _ in range(blocks.size)]
    for e, pins in enumerate(nets):
        np.add.at(count[e], blocks[pins], 1)
        for v in pins:
            incident[v].append(e)
    incident = [np.array(e, dtype=np.int64) for e in incident]
    net_weights = np.asarray(net_weights, dtype=np.int64)
    def delta(v, source):
        """Objective change of moving ``v`` from ``source`` to each block."""
        nets_v = incident[v]
        # Leaving ``source`` saves w_e where v is its only pin there;
        # joining block b costs w_e where b had no pin of the net.
        saved = (net_weights[nets_v] * (count[nets_v, source] == 1)).sum()
        added = (net_weights[nets_v, None] * (count[nets_v] == 0)).sum(axis=0)
        return added - saved

    def move(v, source, target):
        count[incident[v], source] -= 1
        count[incident[v], target] += 1
        blocks[v] = target
        load[source] -= work[v]
        load[target] += work[v]

    while load.max() > limit:
        source = int(np.argmax(load))
        best = None
        for v in np.flatnonzero((blocks == source) & (work > 0)):
            fits = load + work[v] <= limit
            fits[source] = False
            if not fits.any():
                continue
            cost = np.where(fits, delta(v, source), np.iinfo(np.int64).max)
            target = int(np.argmin(cost))
            key = (int(cost[target]), -int(work[v]))
            if best is None or key < best[0]:
                best = (key, v, target)
        if best is not None:
            move(best[1], source, best[2])
            continue
        # No vertex fits anywhere: swap v (source) with a lighter u (b) such
        # that both blocks end within the limit; the cheapest such swap
        # (the two moves' changes, each as if alone) wins.
        for v in np.flatnonzero((blocks == source) & (work > 0)):
            cost_v = delta(v, source)
            for u in np.flatnonzero((blocks != source) & (work > 0)
                                    & (work < work[v])):
                b = blocks[u]
                if (load[b] + work[v] - work[u] > limit
                        or load[source] - work[v] + work[u] > limit):
                    continue
                key = (int(cost_v[b] + delta(u, b)[source]), 0)
                if best is None or key < best[0]:
                    best = (key, v, u)
        if best is None:
            return blocks, False
        _, v, u = best
        b = int(blocks[u])
        move(v, source, b)
        move(u, b, source)
    return blocks, True
