"""Which positions a drop-and-grow update removes and adds: plain NumPy.

A position of a kernel of shape ``(input_dim, units)`` is named by its key
``col * input_dim + row``: sorted keys are the column-major order the
kernels need. Ties are broken the same way everywhere, so that every rank
and the NumPy references in the tests choose the same positions:

- drop: the smallest magnitudes; among equal magnitudes the smaller key
  drops first.
- grow: the largest scores; among equal scores the smaller key grows first.
"""

import numpy as np


def keys_of(rows, cols, input_dim):
    """The int64 keys ``col * input_dim + row`` of positions."""
    return np.asarray(cols, np.int64) * int(input_dim) + np.asarray(rows, np.int64)


def kept_after_drop(values, n_drop):
    """Indices (sorted) of the ``len(values) - n_drop`` largest magnitudes.

    ``values`` are in key order, so ties drop the smaller key first.

    Example:
      >>> kept_after_drop([0.5, -0.1, 0.1, 2.0], 2).tolist()
      [0, 3]
    """
    return split_by_magnitude(values, n_drop)[0]


def split_by_magnitude(values, n_drop):
    """``(kept, dropped)``: sorted indices of the largest and the ``n_drop`` smallest magnitudes.

    Among equal magnitudes the smaller index drops first.

    Example:
      >>> [part.tolist() for part in split_by_magnitude([0.5, -0.1, 0.1, 2.0], 2)]
      [[0, 3], [1, 2]]
    """
    magnitudes = np.abs(np.asarray(values))
    if magnitudes.size and not np.isfinite(magnitudes.max()):  # max is NaN if any is
        raise ValueError("Cannot drop weights by magnitude: the layer has non-finite values.")
    # The n_drop largest of -magnitude, smaller index first among equal ones:
    # linear time, and a small selection (n_drop, not the kept majority).
    dropping = np.zeros(magnitudes.size, bool)
    dropping[top_k(-magnitudes, int(n_drop))] = True
    return np.flatnonzero(~dropping), np.flatnonzero(dropping)


def top_k(scores, k, keys=None):
    """Indices of the ``k`` largest scores; equal scores take smaller keys first.

    ``keys`` default to the indices. Linear time: a strided sample bounds the
    k-th largest score from below, a comparison keeps the few scores above
    that bound (all of the top k and their ties, so the result is exact), and
    only those are partitioned; the threshold's ties are sorted by key.

    Example:
      >>> top_k(np.array([1.0, 3.0, 1.0, 1.0]), 2, keys=np.array([9, 5, 2, 7])).tolist()
      [1, 2]
    """
    scores = np.asarray(scores)
    if k >= scores.size:
        return np.arange(scores.size)
    if k <= 0:
        return np.zeros(0, np.int64)
    if scores.size > max(8 * k, 1 << 16):
        candidates = np.flatnonzero(scores >= _lower_bound_of_kth(scores, k))
        if k <= candidates.size < scores.size:  # else the sample misled: select from all
            chosen = top_k(scores[candidates], k,
                           None if keys is None else keys[candidates])
            return candidates[chosen]
    # float64: NumPy's float32 partition is very slow on many equal values.
    wide = scores.astype(np.float64)
    threshold = np.partition(wide, wide.size - k)[wide.size - k]
    above = np.flatnonzero(wide > threshold)
    ties = np.flatnonzero(wide == threshold)
    if keys is not None:
        ties = ties[np.argsort(keys[ties], kind="stable")]
    return np.concatenate([above, ties[: k - above.size]])


def _lower_bound_of_kth(scores, k):
    """A value about ``2 k`` of ``scores`` reach, from a strided sample of ~65k."""
    sample = scores[:: max(1, scores.size // 65536)].astype(np.float64)
    rank = min(sample.size - 1, int(np.ceil(2 * k / scores.size * sample.size)))
    return np.partition(sample, sample.size - 1 - rank)[sample.size - 1 - rank]


class RunningTopK:
    """The ``k`` largest scores seen over blocks, with their keys.

    Holds at most ``2 k`` candidates, so the largest scores of a whole
    kernel are found one block at a time.

    Example:
      >>> best = RunningTopK(2)
      >>> best.add(np.array([0.1, 0.9]), offset=0)
      >>> best.add(np.array([0.5, 0.2]), offset=2)
      >>> best.keys().tolist()
      [1, 2]
    """

    def __init__(self, k):
        self.k = int(k)
        self._scores = np.zeros(0, np.float64)
        self._keys = np.zeros(0, np.int64)

    def add(self, scores, offset):
        """Offers ``scores`` of the keys ``offset, offset + 1, ...``, blocks in key order."""
        scores = np.asarray(scores).ravel()
        candidates = None
        if self._scores.size >= self.k:  # only scores above the k-th best can enter
            candidates = np.flatnonzero(scores > self._scores.min())  # ties: older keys win
            scores = scores[candidates]
        chosen = top_k(scores, self.k)  # keys increase with the index here
        if candidates is not None:
            scores, chosen = scores[chosen], candidates[chosen]
        else:
            scores = scores[chosen]
        scores = np.concatenate([self._scores, scores.astype(np.float64)])
        keys = np.concatenate([self._keys, offset + chosen.astype(np.int64)])
        chosen = top_k(scores, self.k, keys=keys)
        self._scores, self._keys = scores[chosen], keys[chosen]

    def keys(self):
        """The chosen keys, sorted."""
        return np.sort(self._keys)


def random_free_keys(rng, total, count, taken):
    """``count`` distinct keys in ``[0, total)`` not in sorted ``taken``, uniformly.

    Example:
      >>> rng = np.random.default_rng(0)
      >>> keys = random_free_keys(rng, 10, 3, np.array([0, 1, 2]))
      >>> len(set(keys.tolist()) - {0, 1, 2})
      3
    """
    free = int(total) - taken.size
    if count > free:
        raise ValueError(f"Cannot grow {count} positions: only {free} are free.")
    if total <= 1 << 22 or 4 * count > free:  # draw from the free keys themselves
        free_keys = np.setdiff1d(np.arange(total, dtype=np.int64), taken, assume_unique=True)
        return np.sort(rng.choice(free_keys, size=count, replace=False))
    chosen = np.zeros(0, np.int64)
    while chosen.size < count:  # rejection: draws land on free keys with odds >= 3/4
        draws = rng.integers(0, total, size=2 * (count - chosen.size) + 16)
        draws = draws[~_contains(taken, draws)]
        merged = np.concatenate([chosen, draws])
        _, first = np.unique(merged, return_index=True)
        chosen = merged[np.sort(first)][:count]  # distinct, in order of drawing
    return np.sort(chosen)


def _contains(sorted_keys, queries):
    if sorted_keys.size == 0:
        return np.zeros(queries.shape, bool)
    at = np.minimum(np.searchsorted(sorted_keys, queries), sorted_keys.size - 1)
    return sorted_keys[at] == queries


def new_order(old_keys, new_keys):
    """For each new key, its index among ``old_keys`` or -1 if it is new.

    Example:
      >>> new_order(np.array([1, 4, 6]), np.array([1, 5, 6])).tolist()
      [0, -1, 2]
    """
    at = np.minimum(np.searchsorted(old_keys, new_keys), old_keys.size - 1)
    return np.where(old_keys[at] == new_keys, at, -1)


def merge_kept_and_grown(old_keys, kept, dropped, grown_keys):
    """The new sorted keys and, for each, its index among ``old_keys`` or -1 if new.

    Args:
      old_keys: the sorted keys before the update.
      kept: sorted indices into ``old_keys`` of the positions kept.
      dropped: sorted indices into ``old_keys`` of the others (a grown key may
        be one of them: it then keeps its index).
      grown_keys: sorted keys grown, none of them kept.

    Equals ``(keys, new_order(old_keys, keys))`` with ``keys`` the sorted
    union, in linear time: a stable sort of two sorted runs is one merge.

    Example:
      >>> keys, source = merge_kept_and_grown(
      ...     np.array([1, 4, 6]), np.array([0, 2]), np.array([1]), np.array([5]))
      >>> keys.tolist(), source.tolist()
      ([1, 5, 6], [0, -1, 2])
    """
    grown_keys = np.asarray(grown_keys, np.int64)
    dropped_keys = old_keys[dropped]
    grown_source = np.full(grown_keys.size, -1, np.int64)
    if dropped_keys.size:
        at = np.minimum(np.searchsorted(dropped_keys, grown_keys), dropped_keys.size - 1)
        regrown = dropped_keys[at] == grown_keys
        grown_source[regrown] = dropped[at[regrown]]
    keys = np.concatenate([old_keys[kept], grown_keys])
    order = np.argsort(keys, kind="stable")
    return keys[order], np.concatenate([kept, grown_source])[order]
