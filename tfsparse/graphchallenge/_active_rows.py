"""The schedule of the challenge's inference over the inputs that are still alive.

Under the challenge's rule a row of ``Y`` that becomes all zero stays zero
(``Z = 0`` gets no bias), and on the challenge networks most rows die within
a few layers (1024 x 120 on the MNIST digits: 5,000 rows, 727 left after
layer 6, 638 at the end). As the fastest published implementations do, a row
is dropped from the working batch in the layer where it dies, and the
survivors of different input batches are merged into full batches again:

1. every input batch runs, layer by layer, until it is thin (at most half of
   ``batch_size`` rows alive) or finished, and is parked at its layer;
2. then, lowest layer first, the parked blocks at one layer are merged and
   run, in batches of at most ``batch_size`` rows, up to the next layer where
   blocks are parked (or to the end), and parked there again.

Each block carries the input indices of its rows, so the outputs are placed
exactly where they belong; dropping a row changes nothing in the others
(rows are independent), so the result is the same as running every row
through every layer.
"""

import numpy as np
import scipy.sparse
import tensorflow as tf


class _Schedule:
    """Runs ``step`` (``y, alive = step(y, *layer)``) over ``layers`` for all rows."""

    def __init__(self, layers, step, batch_size, bar):
        self.layers, self.step, self.batch_size, self.bar = layers, step, batch_size, bar
        self.parked = {}  # layer -> list of (input indices, activations tensor)
        self.finished = []  # (input indices, CSR activations after the last layer)

    def advance(self, rows, y, layer, stop, thin):
        """Runs the block from ``layer`` to ``stop``, or until at most ``thin`` rows live."""
        while layer < stop:
            y, alive = self.step(y, *self.layers[layer])
            layer += 1
            self.bar.update(rows.size)
            alive = alive.numpy()
            if not alive.all():
                dead = rows.size - int(alive.sum())
                self.bar.update(dead * (len(self.layers) - layer))  # their work is done
                rows, y = rows[alive], tf.boolean_mask(y, alive)
                if rows.size <= thin:
                    break
        self.keep(rows, y, layer)

    def keep(self, rows, y, layer):
        if rows.size == 0:
            return
        if layer == len(self.layers):
            self.finished.append((rows, scipy.sparse.csr_matrix(y.numpy())))
        else:
            self.parked.setdefault(layer, []).append((rows, y))

    def drain(self):
        """Merges parked blocks layer by layer until every row is finished or dead."""
        while self.parked:
            layer = min(self.parked)
            blocks = self.parked.pop(layer)
            rows = np.concatenate([block[0] for block in blocks])
            y = blocks[0][1] if len(blocks) == 1 else tf.concat([block[1] for block in blocks], 0)
            stop = min(self.parked, default=len(self.layers))
            # Equal batches: 4,212 rows in batches of 4,096 run as 2 x 2,106, not 4,096 + 116.
            size = -(-rows.size // -(-rows.size // self.batch_size))
            for start in range(0, rows.size, size):
                self.advance(rows[start:start + size], y[start:start + size], layer, stop, thin=0)


def run_active_rows(features, layers, step, batch_size, bar):
    """Returns the final activations of all ``features`` rows, as float32 CSR.

    Args:
        features: CSR float32 inputs ``(inputs, neurons)``.
        layers: per layer, the tensors ``step`` takes after ``y``.
        step: ``(y, *layer) -> (next y, bool per row: any nonzero)``.
        batch_size: the most rows ``step`` is called on at once.
        bar: a tqdm bar counting input-layers (``inputs * len(layers)`` in all).
    """
    schedule = _Schedule(layers, step, batch_size, bar)
    inputs = features.shape[0]
    for start in range(0, inputs, batch_size):
        rows = np.arange(start, min(start + batch_size, inputs))
        y = tf.constant(features[start:start + batch_size].toarray())
        schedule.advance(rows, y, 0, len(layers), thin=batch_size // 2)
    schedule.drain()
    return _assemble(schedule.finished, features.shape)


def _assemble(finished, shape):
    """Places the finished rows at their input indices; every other row is zero."""
    if not finished:
        return scipy.sparse.csr_matrix(shape, dtype=np.float32)
    rows = np.concatenate([block[0] for block in finished])
    order = np.argsort(rows, kind="stable")
    survivors = scipy.sparse.vstack([block[1] for block in finished], format="csr")[order]
    counts = np.zeros(shape[0], np.int64)
    counts[rows[order]] = np.diff(survivors.indptr)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    return scipy.sparse.csr_matrix(
        (survivors.data, survivors.indices, indptr), shape=shape, dtype=np.float32
    )
