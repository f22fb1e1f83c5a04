"""RigL's grow scores: the dense kernel gradient, one block of columns at a time.

For a layer ``z = x @ W + b`` the loss gradient with respect to the dense
kernel is ``x^T @ dz``, an ``input_dim x units`` matrix that is never stored
whole: it is formed ``block_elements`` entries at a time, its magnitudes
offered to a running top-k, and freed. A ``SparseConv2D``'s dense kernel
gradient (``Conv2DBackpropFilter``) is formed whole: ``kh * kw * cin *
filters`` floats, no more than the layer's dense kernel, small beside its
activations.
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
      A list of ``(inputs, d loss / d z)``: ``[batch, input_dim]`` and
      ``[batch, units]`` for a SparseDense, ``[batch, h, w, cin]`` and
      ``[batch, out_h, out_w, filters]`` for a SparseConv2D.
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
        _offer(best, scores, start * input_dim, taken)
    return best.keys()


def largest_conv_gradient_keys(layer, inputs, output_gradients, taken, count, average=None):
    """The ``count`` free positions of a SparseConv2D where the kernel gradient is largest.

    The dense kernel gradient ``Conv2DBackpropFilter(inputs, output_gradients)``
    with the layer's strides, padding and dilations, as its im2col matrix
    ``(kh * kw * cin, filters)``; formed whole (the size of a dense kernel).

    Args:
      layer: the built ``SparseConv2D``.
      inputs: ``[batch, h, w, cin]`` float tensor, the layer's inputs.
      output_gradients: ``[batch, out_h, out_w, filters]``, the loss gradient
        with respect to its pre-activation outputs.
      taken, count, average: as ``largest_gradient_keys`` (``average`` gets
        the whole gradient, start column 0).

    Returns:
      The chosen keys (``col * kh * kw * cin + row``), sorted (ties: smaller key first).

    Example:
      >>> import numpy as np
      >>> from tfsparse.layers import SparseConv2D
      >>> layer = SparseConv2D(1, 1, pattern=np.array([[[[1.0], [0.0]]]]))
      >>> x = np.array([[[[1.0, -2.0]]]], "float32")     # one pixel, cin 2
      >>> _ = layer(x)
      >>> dz = np.array([[[[3.0]]]], "float32")          # |gradient| = [3, 6]
      >>> largest_conv_gradient_keys(layer, x, dz, taken=np.array([0]), count=1).tolist()
      [1]
    """
    kh, kw = layer.kernel_size
    inputs = tf.convert_to_tensor(inputs)
    gradient = tf.raw_ops.Conv2DBackpropFilter(
        input=inputs, filter_sizes=[kh, kw, int(inputs.shape[-1]), layer.filters],
        out_backprop=tf.cast(output_gradients, inputs.dtype),
        strides=[1, *layer.strides, 1], padding=layer.padding.upper(),
        dilations=[1, *layer.dilation_rate, 1])
    # (kh, kw, cin, filters) -> im2col (kh * kw * cin, filters), transposed so
    # the C-order flattening follows the keys col * rows + row.
    block = tf.transpose(tf.reshape(gradient, [-1, layer.filters]))
    if average is not None:
        block = average(block, 0)
    best = RunningTopK(count)
    _offer(best, np.abs(np.asarray(block)).reshape(-1), 0, taken)
    return best.keys()


def _offer(best, scores, first, taken):
    """Offers ``scores`` of keys ``first, first + 1, ...`` to ``best``, the taken ones excluded.

    Overwrites the taken keys' scores with ``-inf``.
    """
    if not np.isfinite(scores.max()):  # the max is NaN or Inf if any score is
        raise ValueError("RigL's grow gradient has non-finite values (NaN or Inf).")
    lo, hi = np.searchsorted(taken, [first, first + scores.size])
    scores[taken[lo:hi] - first] = -np.inf  # never grow an active position
    best.add(scores, offset=first)
