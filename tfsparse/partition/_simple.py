"""Contiguous and random assignments, and the choice of the input owners."""

import numpy as np

from tfsparse.partition.volume import needs_matrix


def contiguous(work, k):
    """Splits items, in order, into ``k`` ranges of about equal total work.

    Item ``j`` goes to the range that holds the midpoint of its work on the
    cumulative scale; with no work at all the ranges have equal counts.

    Example:
        >>> contiguous(np.array([1, 1, 1, 1, 4]), 2).tolist()
        [0, 0, 0, 0, 1]
    """
    work = np.asarray(work, dtype=np.float64)
    n = work.size
    total = work.sum()
    if total <= 0:
        return (np.arange(n) * k // max(n, 1)).astype(np.int64)
    midpoint = np.cumsum(work) - work / 2.0
    return np.minimum((midpoint * k / total).astype(np.int64), k - 1)


def random_contiguous(work, k, rng):
    """``contiguous`` applied to a random order of the items."""
    order = rng.permutation(np.asarray(work).size)
    owners = np.empty(order.size, dtype=np.int64)
    owners[order] = contiguous(np.asarray(work)[order], k)
    return owners


def place_unowned(owners, k):
    """Gives each ``-1`` entry to the worker owning the fewest entries so far."""
    owners = np.array(owners, dtype=np.int64)
    counts = np.bincount(owners[owners >= 0], minlength=k)
    for j in np.flatnonzero(owners < 0):
        p = int(np.argmin(counts))
        owners[j] = p
        counts[p] += 1
    return owners


def choose_input_owners(pattern, output_owners, k):
    """Owners for the inputs of the first layer, given its output owners.

    Each input goes to one of the workers that need it, so it costs exactly
    ``(workers that need it) - 1`` words, the least any owner allows. Among
    those workers it goes to the one with the least traffic (sent plus
    received words) so far, inputs needed by the most workers first; inputs
    nobody needs go to the worker owning the fewest inputs.

    Args:
        pattern: CSR pattern ``(inputs, outputs)`` of the first layer.
        output_owners: int array ``(outputs,)``.
        k: number of workers.

    Returns:
        int64 array ``(inputs,)``.
    """
    free = np.full(pattern.shape[0], -1, dtype=np.int64)
    return place_at_needers(pattern, free, output_owners, k)


def place_at_needers(pattern, input_owners, output_owners, k):
    """Fills the ``-1`` entries of ``input_owners`` with workers that need them.

    Each free input goes to one of the workers owning an output that reads
    it, so it costs exactly ``(workers that need it) - 1`` words in this
    layer, the least any owner allows: among them the one with the least
    traffic (sent plus received words, counting free inputs as received)
    so far, inputs needed by the most workers first. Free inputs nobody
    needs go to the worker owning the fewest inputs. Entries ``>= 0`` are
    kept.

    Args:
        pattern: CSR pattern ``(inputs, outputs)``.
        input_owners: int array ``(inputs,)``, ``-1`` where free.
        output_owners: int array ``(outputs,)`` of workers in ``[0, k)``.
        k: number of workers.

    Returns:
        int64 array ``(inputs,)``.

    Example:
        >>> import scipy.sparse
        >>> pattern = scipy.sparse.csr_matrix(np.array([[1, 0], [0, 1]]))
        >>> place_at_needers(pattern, [-1, 0], [1, 1], 2).tolist()
        [1, 0]
    """
    owners = np.array(input_owners, dtype=np.int64)
    need = needs_matrix(pattern, output_owners, k)
    free = owners < 0
    fixed = np.flatnonzero(~free)
    traffic = need[free].sum(axis=0).astype(np.int64)  # as if all came in
    remote = need[fixed].copy()
    remote[np.arange(fixed.size), owners[fixed]] = False
    traffic += remote.sum(axis=0)
    traffic += np.bincount(owners[fixed], weights=remote.sum(axis=1),
                           minlength=k).astype(np.int64)
    spread = need.sum(axis=1)
    for i in np.argsort(-spread, kind="stable"):
        if spread[i] == 0:
            break
        if not free[i]:
            continue
        candidates = np.flatnonzero(need[i])
        p = int(candidates[np.argmin(traffic[candidates])])
        owners[i] = p
        traffic[p] += spread[i] - 2  # now sends spread-1, no longer receives
    return place_unowned(owners, k)
