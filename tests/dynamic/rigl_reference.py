"""RigL's and SET's drop-and-grow by the book, on a dense 0/1 mask, in NumPy.

Shared by tests/dynamic and tests/callbacks (which puts this folder on sys.path).
"""

import numpy as np


def reference_update(keys, values, slots, grow_scores, count, total):
    """RigL/SET by the book, on a dense 0/1 mask, in NumPy."""
    dense_values = np.zeros(total)
    dense_values[keys] = values
    order = np.lexsort((keys, np.abs(values)))  # smallest |w| first, then key
    kept = np.sort(keys[order[count:]])
    scores = np.array(grow_scores, float)
    scores[kept] = -np.inf
    grown = np.lexsort((np.arange(total), -scores))[:count]
    new_keys = np.sort(np.concatenate([kept, grown]))
    was_active = np.isin(new_keys, keys)
    new_values = np.where(was_active, dense_values[new_keys], 0.0)
    new_slots = []
    for slot in slots:
        dense_slot = np.zeros(total)
        dense_slot[keys] = slot
        new_slots.append(np.where(was_active, dense_slot[new_keys], 0.0))
    return new_keys, new_values, new_slots
