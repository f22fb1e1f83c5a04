"""Brute-force enumeration of stage assignments, the reference the planners are checked against."""

import itertools


def all_partitions(n, p):
    """Every split of layers 0..n-1 into p contiguous, non-empty stages."""
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = (0,) + cuts + (n,)
        yield tuple(tuple(range(a, b)) for a, b in zip(bounds, bounds[1:]))


def partitions_with_empty_stages(n, p):
    """Partitions where a stage other than the last may own no layer (it then
    borrows rows of the next stage's first layer), never two empty in a row."""
    for cuts in itertools.combinations_with_replacement(range(0, n + 1), p - 1):
        bounds = (0,) + cuts + (n,)
        groups = [tuple(range(a, b)) for a, b in zip(bounds, bounds[1:])]
        if not groups[-1] or any(not a and not b for a, b in zip(groups, groups[1:])):
            continue
        yield tuple(groups)
