"""Per-layer pipeline costs of a Keras model: modelled, or measured on the device.

Both return one ``(forward, backward_input, backward_weight)`` tuple per
layer of the model's chain, for one call on ``batch_size`` rows (pass the
micro-batch size). The network input needs no gradient, so the first layer's
``backward_input`` is 0 (the pipeline does not compute it either).
"""

import time

import numpy as np
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse._model_chain import chain_layers
from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value as invalid
from tfsparse.layers import SparseDense

_ROW_WISE = (keras.layers.Dense, SparseDense, keras.layers.Activation,
             keras.layers.Dropout, keras.layers.Flatten, keras.layers.ReLU,
             keras.layers.LeakyReLU, keras.layers.Softmax)


def splittable_layers(layers):
    """Per layer, whether LayerPipe may split its rows between two stages.

    True for layers that treat rows independently (dense, sparse, activation,
    dropout, flatten) and add no losses (a regulariser's batch mean would be
    counted twice).
    """
    flags = []
    for layer in layers:
        regularized = any(getattr(layer, name, None) is not None for name in
                          ("kernel_regularizer", "bias_regularizer",
                           "activity_regularizer"))
        flags.append(isinstance(layer, _ROW_WISE) and not regularized)
    return flags


def model_costs(model, batch_size):
    """Modelled costs: multiply-adds per layer for ``batch_size`` rows.

    A ``SparseDense`` layer costs ``nnz * batch_size`` for each of its
    forward, activation gradient and weight gradient; a ``Dense`` layer
    ``input_dim * units * batch_size``; other layers their output size times
    ``batch_size`` forward and backward (elementwise work) and no weight
    gradient.

    Args:
      model: a built Sequential model or functional chain.
      batch_size: rows per call (the micro-batch size).

    Returns:
      A list of ``(forward, backward_input, backward_weight)`` floats.

    Example:
      >>> from tfsparse._keras import keras
      >>> m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
      >>> model_costs(m, 2)
      [(64.0, 0.0, 64.0)]
    """
    batch_size = check_positive_int("batch_size", batch_size)
    costs = []
    for index, layer in enumerate(chain_layers(model)):
        if isinstance(layer, SparseDense):
            work = float(layer.nnz * batch_size)
            triple = [work, work, work]
        elif isinstance(layer, keras.layers.Dense):
            work = float(layer.kernel.shape[0] * layer.kernel.shape[1] * batch_size)
            triple = [work, work, work]
        else:
            size = float(np.prod(layer.output_shape[1:]) * batch_size)
            triple = [size, size, 0.0]
        if index == 0:
            triple[1] = 0.0
        costs.append(tuple(triple))
    return costs


def profile(model, batch, repeats=20, warmup=3):
    """Measures every layer's forward, activation gradient and weight gradient.

    Each layer runs on its real input (the previous layers' output on
    ``batch``) inside ``tf.function`` on the current device. The activation
    gradient is the time of forward + gradient with respect to the layer's
    input minus the forward time; the weight gradient likewise with respect
    to its trainable weights (so recording the forward is not counted twice).
    Medians of ``repeats`` interleaved runs.

    Args:
      model: a built Sequential model or functional chain.
      batch: one micro-batch of inputs (array or tensor).
      repeats: timed runs per measurement.
      warmup: untimed runs first.

    Returns:
      A list of ``(forward, backward_input, backward_weight)`` in seconds, one
      per layer; the first layer's ``backward_input`` is 0.

    Example:
      >>> import numpy as np
      >>> from tfsparse._keras import keras
      >>> m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
      >>> len(profile(m, np.ones((2, 8), "float32"), repeats=2))
      1
    """
    repeats = check_positive_int("repeats", repeats)
    layers = chain_layers(model)
    x = tf.convert_to_tensor(batch)
    costs = []
    for index, layer in enumerate(layers):
        y = layer(x, training=True)
        upstream = tf.ones_like(y)
        weights = layer.trainable_variables
        runs = {"forward": _forward_fn(layer)}
        if index > 0:
            runs["input"] = _gradient_fn(layer, lambda tape, x, out: tape.gradient(
                out, x, output_gradients=upstream))
        if weights:
            runs["weight"] = _gradient_fn(layer, lambda tape, x, out: tape.gradient(
                out, weights, output_gradients=upstream))
        medians = _interleaved_medians(runs, x, repeats, warmup)
        forward = medians["forward"]
        costs.append((forward,
                      max(0.0, medians.get("input", forward) - forward),
                      max(0.0, medians.get("weight", forward) - forward)))
        x = y
    return costs


def _forward_fn(layer):
    @tf.function
    def run(x):
        return layer(x, training=True)
    return run


def _gradient_fn(layer, gradient):
    @tf.function
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = layer(x, training=True)
        return gradient(tape, x, out)
    return run


def _interleaved_medians(runs, x, repeats, warmup):
    for run in runs.values():
        for _ in range(warmup):
            _block(run(x))
    samples = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            _block(run(x))
            samples[name].append(time.perf_counter() - start)
    return {name: float(np.median(times)) for name, times in samples.items()}


def _block(result):
    for tensor in tf.nest.flatten(result):
        if tensor is not None:
            tensor.numpy()
