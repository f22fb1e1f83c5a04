"""sparsify's measured rule: time a layer and its sparse twin on the layer's own input shape.

As SparseProp's ``swap_modules_with_sparse`` does, but timed as benchmarks
time: each candidate is traced once, warmed up, then run in interleaved
rounds (the two see the same background load) and the medians compared.
"""

import numpy as np
import tensorflow as tf

from tfsparse._timing import interleaved_medians

MODES = ("inference", "training")
REPEATS = 7
_WARMUP = 2


def _inference(layer, x):
    run = tf.function(lambda: layer(x, training=False))
    return lambda: run().numpy()


def _training(layer, x):
    """Forward and gradients with respect to the input and the weights (no update)."""
    @tf.function
    def run():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [x] + layer.trainable_weights)

    return lambda: [g.numpy() for g in run()]


def input_shape(layer):
    """The layer's input shape if it is one known shape, else a reason why it is not."""
    try:
        shape = tuple(layer.input_shape)
    except AttributeError:  # a shared layer called on inputs of different shapes
        return None, "called on inputs of several shapes: not timed"
    if any(size is None for size in shape[1:]):
        return None, f"input shape {shape} has unknown sizes: not timed"
    return shape, None


def time_pair(dense, sparse, shape, batch_size, mode):
    """``(dense seconds, sparse seconds)`` on random inputs of ``(batch_size, *shape[1:])``."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch_size, *shape[1:])), dense.compute_dtype)
    make = _inference if mode == "inference" else _training
    medians = interleaved_medians({"dense": make(dense, x), "sparse": make(sparse, x)},
                                  repeats=REPEATS, warmup=_WARMUP)
    return medians["dense"], medians["sparse"]
