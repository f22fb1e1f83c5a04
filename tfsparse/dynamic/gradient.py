"""RigL's grow scores: the dense kernel gradient, one block of columns at a time.

For a layer ``z = x @ W + b`` the loss gradient with respect to the dense
kernel is ``x^T @ dz``, an ``input_dim x units`` matrix that is never stored
whole: it is formed ``block_elements`` entries at a time, its magnitudes
offered to a running top-k, and freed.
"""

import numpy as np
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse._validation import invalid_value
from tfsparse.dynamic.selection import RunningTopK

DEFAULT_BLOCK_ELEMENTS = 1 << 23  # 32 MiB of float32 scores per block


def layer_gradients(model, layers, x, y, loss=None):
    """Each layer's 2-D inputs and loss gradient w.r.t. its pre-activation outputs.

    One eager forward and backward pass of ``model`` on ``(x, y)`` in
    training mode; ``loss`` defaults to the model's compiled loss (one output).
    For updates outside ``fit`` (a custom loop): ``callbacks.DynamicSparsity``
    takes the training step's own (``StepGradients``) and needs no extra pass.

    Returns:
      A list of ``(inputs [batch, input_dim], d loss / d z [batch, units])``.
    """
    loss_fn = keras.losses.get(loss if loss is not None else _compiled_loss(model))
    records = {}
    with tf.GradientTape() as tape:

        def probe(layer, inputs, outputs):
            if id(layer) in records:
                raise NotImplementedError(
                    f"RigL needs one call per layer and step; {layer.name} is called "
                    "more than once in the model (a shared layer).")
            tape.watch(outputs)
            records[id(layer)] = (inputs, outputs)
            return outputs

        for layer in layers:
            layer._gradient_probe = probe
        try:
            predictions = model(x, training=True)
            value = tf.reduce_mean(loss_fn(y, predictions))  # a function loss is per sample
        finally:
            for layer in layers:
                layer._gradient_probe = None
    missing = [layer.name for layer in layers if id(layer) not in records]
    if missing:
        raise ValueError(f"The layers {missing} are not called by the model's forward pass.")
    outputs = [records[id(layer)][1] for layer in layers]
    gradients = tape.gradient(value, outputs)
    return [(records[id(layer)][0], g) for layer, g in zip(layers, gradients)]


def _compiled_loss(model):
    loss = getattr(model, "loss", None)
    if loss is None or isinstance(loss, (dict, list, tuple)):
        raise invalid_value(
            "loss", "a loss for RigL's grow gradient: compile the model with one loss, "
            "or pass loss= to the callback", loss)
    return loss


def largest_gradient_keys(inputs, output_gradients, taken, count, block_elements=None,
                          average=None):
    """The ``count`` free positions where ``|inputs^T @ output_gradients|`` is largest.

    Args:
      inputs: ``[batch, input_dim]`` float tensor.
      output_gradients: ``[batch, units]`` float tensor.
      taken: sorted int64 keys (``col * input_dim + row``) that cannot grow.
      count: how many positions to grow.
      block_elements: the most gradient entries formed at once.
      average: optional ``f(block, start_column) -> block`` that averages a
        block over processes (Horovod) before it is scored.

    Returns:
      The chosen keys, sorted (ties: smaller key first).

    Example:
      >>> import numpy as np
      >>> x = np.array([[1.0, 0.0, 2.0]], "float32")      # batch 1, input_dim 3
      >>> dz = np.array([[1.0, -3.0]], "float32")         # units 2
      >>> # |x^T dz| by key (col * 3 + row): [1, 0, 2, 3, 0, 6]; key 5 is taken.
      >>> largest_gradient_keys(x, dz, taken=np.array([5]), count=2).tolist()
      [2, 3]
    """
    input_dim, units = int(inputs.shape[-1]), int(output_gradients.shape[-1])
    block_elements = block_elements or DEFAULT_BLOCK_ELEMENTS
    columns = max(1, block_elements // input_dim)
    best = RunningTopK(count)
    buffer = None  # the scores of every block, written in place: no allocation per block
    for start in range(0, units, columns):
        stop = min(units, start + columns)
        # (x^T dz)[:, start:stop] transposed: row j is column start + j, so
        # the C-order flattening follows the keys.
        block = tf.matmul(output_gradients[:, start:stop], inputs, transpose_a=True)
        if average is not None:
            block = average(block, start)
        block = np.asarray(block)  # a view of the tensor's memory, not a copy
        if buffer is None:
            buffer = np.empty(min(columns, units) * input_dim, block.dtype)
        scores = buffer[:block.size]
        np.abs(block, out=scores.reshape(block.shape))
        del block
        if not np.isfinite(scores.max()):  # the max is NaN or Inf if any score is
            raise ValueError("RigL's grow gradient has non-finite values (NaN or Inf).")
        first = start * input_dim
        lo, hi = np.searchsorted(taken, [first, stop * input_dim])
        scores[taken[lo:hi] - first] = -np.inf  # never grow an active position
        best.add(scores, offset=first)
    return best.keys()
