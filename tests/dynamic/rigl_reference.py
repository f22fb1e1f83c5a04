"""RigL's and SET's drop-and-grow by the book, on a dense 0/1 mask, and Conv2D, in NumPy.

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


def conv_patches(x, kernel_size, strides, padding, dilation):
    """``[batch, out_h, out_w, kh, kw, cin]``: each output pixel's input window, as Conv2D."""
    (kh, kw), (sh, sw), (dh, dw) = kernel_size, strides, dilation
    pads = []
    for size, k, s, d in zip(x.shape[1:3], (kh, kw), (sh, sw), (dh, dw)):
        extent = (k - 1) * d + 1
        out = -(-size // s) if padding == "same" else (size - extent) // s + 1
        total = max((out - 1) * s + extent - size, 0) if padding == "same" else 0
        pads.append((out, total // 2, total - total // 2))
    (oh, top, bottom), (ow, left, right) = pads
    x = np.pad(x, [(0, 0), (top, bottom), (left, right), (0, 0)])
    return np.stack([np.stack([
        x[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
        for j in range(kw)], axis=3) for i in range(kh)], axis=3)
