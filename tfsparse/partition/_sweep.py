"""Layer-by-layer sweeps that keep owners consistent across layers."""

import numpy as np
from tqdm.auto import tqdm

from tfsparse.partition._simple import place_at_needers
from tfsparse.partition._simple import place_unowned
from tfsparse.partition.volume import needs_matrix


def _constants(pattern):
    """Outputs of a layer with an empty fan-in: constants, no work, no reads."""
    return np.asarray(pattern.sum(axis=0)).ravel() == 0


def _filled(owners):
    """Owners with ``-1`` (constants, whose columns are empty) set to 0.

    Only for ``needs_matrix``: an output with an empty fan-in adds no pins
    whatever its owner, so the placeholder changes nothing.
    """
    return np.maximum(owners, 0)


def place_constants(patterns, owners, k):
    """Moves each constant neuron to a worker that reads it in the next layer.

    A neuron with an empty fan-in (all its weights pruned) computes a
    constant: it reads nothing and does no work, so its owner changes only
    the next layer's volume, where the words it costs are fewest, exactly
    ``(workers that read it) - 1``, on one of its readers. Levels ``1 ..
    L - 1``; a constant already on a reader, or read by nobody, keeps its
    owner. Never increases the volume and leaves the load unchanged.

    Args:
        patterns: CSR patterns of the ``L`` layers.
        owners: owners of levels ``0..L``, all set.
        k: number of workers.

    Returns:
        The same list, updated.
    """
    for level in range(1, len(patterns)):
        constant = _constants(patterns[level - 1])
        if not constant.any():
            continue
        need = needs_matrix(patterns[level], owners[level + 1], k)
        current = owners[level]
        misplaced = constant & need.any(axis=1) & ~need[
            np.arange(current.size), current]
        if misplaced.any():
            trial = np.where(misplaced, -1, current)
            owners[level] = place_at_needers(patterns[level], trial,
                                             owners[level + 1], k)
    return owners


def forward_sweep(patterns, k, partition_layer, progress=False):
    """Partitions layer 1, 2, ... in turn, each with its input owners fixed.

    Constant neurons (an empty fan-in) are left free while the next layer
    is partitioned (``input_owners`` holds ``-1`` for them) and then go to
    one of the workers that read them (``place_at_needers``); those of the
    last level are placed by count.

    Args:
        patterns: CSR patterns of the ``L`` layers.
        k: number of workers.
        partition_layer: ``f(pattern, input_owners, layer, next_pattern)``
            returning output owners (-1 for outputs to place by count);
            ``input_owners`` is None for the first layer, and has ``-1``
            for free inputs (constants) after it; ``next_pattern`` is None
            for the last layer.
        progress: show a progress bar.

    Returns:
        ``owners`` for levels ``1..L``, with ``owners[0]`` None.
    """
    owners = [None] * (len(patterns) + 1)
    for layer in tqdm(range(len(patterns)), desc="layers",
                      disable=not progress, leave=False):
        next_pattern = (patterns[layer + 1] if layer + 1 < len(patterns)
                        else None)
        owners[layer + 1] = partition_layer(patterns[layer], owners[layer],
                                            layer, next_pattern)
        if layer > 0:
            owners[layer] = place_at_needers(patterns[layer], owners[layer],
                                             _filled(owners[layer + 1]), k)
    owners[-1] = place_unowned(owners[-1], k)
    return owners


def level_cost(patterns, owners, level, k):
    """Exact words of the two layers next to ``level`` (its in- and outputs).

    For ``level == 1`` the inputs are taken as owned by one of the workers
    that need them (as ``choose_input_owners`` does).
    """
    need = needs_matrix(patterns[level - 1], owners[level], k)
    if level == 1:
        cost = np.maximum(need.sum(axis=1) - 1, 0).sum()
    else:
        need[np.arange(need.shape[0]), owners[level - 1]] = False
        cost = need.sum()
    if level < len(patterns):
        need = needs_matrix(patterns[level], owners[level + 1], k)
        need[np.arange(need.shape[0]), owners[level]] = False
        cost += need.sum()
    return int(cost)


def refine(patterns, owners, k, partition_level, passes, progress=False):
    """Backward sweeps that re-partition each level with both neighbours fixed.

    Level ``l`` is partitioned again with a hypergraph whose km1 is the exact
    volume of layers ``l`` and ``l + 1``; the result is kept only when that
    exact volume is lower, so a sweep never makes the partition worse.

    Args:
        patterns: CSR patterns of the ``L`` layers.
        owners: owners of levels ``0..L`` (level 0 may be None).
        k: number of workers.
        partition_level: ``f(pattern, input_owners, layer, next_needs=...)``.
        passes: number of sweeps.
        progress: show a progress bar.

    Returns:
        The refined owners (the same list, updated).
    """
    levels = list(range(len(patterns) - 1, 0, -1)) * passes
    for level in tqdm(levels, desc="refine", disable=not progress,
                      leave=False):
        next_needs = needs_matrix(patterns[level], owners[level + 1], k)
        candidate = partition_level(patterns[level - 1],
                                    owners[level - 1] if level > 1 else None,
                                    level - 1, next_needs=next_needs)
        # Constants (-1) go to a worker reading them in the next layer.
        candidate = place_at_needers(patterns[level], candidate,
                                     owners[level + 1], k)
        trial = owners[:level] + [candidate] + owners[level + 1:]
        if level_cost(patterns, trial, level, k) < level_cost(
                patterns, owners, level, k):
            owners[level] = candidate
    return owners
