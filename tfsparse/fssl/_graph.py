"""Channel analysis of a functional Keras model: which channels compaction may remove.

Every tensor of the model has channels (its last axis). For each tensor the
analysis finds, channel by channel:

- ``varying``: the channel depends on the inputs; otherwise it is the same
  number at every sample and position, its ``value``;
- ``needed``: some layer reads it with a nonzero weight on the way to the
  outputs;
- ``kept``: it stays in the compacted model. A channel goes when nothing
  needs it, or when it is a constant that every reader can fold exactly
  (into a Dense or Conv bias; a convolution with "same" padding and a kernel
  wider than 1 cannot fold a nonzero constant exactly, its zero padding makes
  the contribution depend on the position, so such a channel stays).

Layers that act channel by channel (BatchNormalization, activations, Dropout,
pooling, Add and the other elementwise merges) keep the same channels on
their inputs and outputs; Concatenate maps its channels to its inputs';
Flatten maps features to channels. Layers the analysis cannot reason about
(custom layers, Lambda, Reshape, ...) are "opaque": every channel around them
stays. Decisions only ever add kept channels until nothing changes, so every
constraint holds at the end.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.fssl._layers import is_convolution
from tfsparse.fssl._layers import is_fully_connected
from tfsparse.fssl._layers import is_library_layer
from tfsparse.layers import SparseDense

# Activations applied unit by unit: removing some units leaves the others'
# outputs unchanged. (Softmax is not: it cannot lose units.)
ELEMENTWISE = frozenset({
    "linear", "relu", "relu6", "leaky_relu", "elu", "selu", "gelu", "sigmoid",
    "hard_sigmoid", "tanh", "softplus", "softsign", "swish", "silu", "mish",
    "exponential",
})

_L = keras.layers
# Identity at inference or a function of each channel alone, with no weights.
_CHANNELWISE = (
    _L.Activation, _L.ReLU, _L.LeakyReLU, _L.ELU, _L.Dropout, _L.GaussianNoise,
    _L.GaussianDropout, _L.AlphaDropout,
)
_POOLING = (
    _L.MaxPooling1D, _L.MaxPooling2D, _L.MaxPooling3D, _L.AveragePooling1D,
    _L.AveragePooling2D, _L.AveragePooling3D, _L.GlobalMaxPooling1D, _L.GlobalMaxPooling2D,
    _L.GlobalMaxPooling3D, _L.GlobalAveragePooling1D, _L.GlobalAveragePooling2D,
    _L.GlobalAveragePooling3D,
)
_MERGES = (_L.Add, _L.Subtract, _L.Average, _L.Maximum, _L.Minimum)
# A size for spatial axes the model leaves open, to evaluate constants on.
_OPEN_SIZE = 16


def activation_name(layer):
    name = keras.activations.serialize(layer.activation)
    return name if isinstance(name, str) else str(name)


def _channels_last(layer):
    return getattr(layer, "data_format", "channels_last") == "channels_last"


def layer_kind(layer):
    """``"weighted"``, ``"channelwise"``, ``"concatenate"``, ``"flatten"`` or
    ``"opaque"``: how the analysis treats ``layer`` (a subclass of a
    Keras layer written elsewhere is opaque: it may compute otherwise)."""
    if not is_library_layer(layer):
        return "opaque"
    if is_fully_connected(layer):
        return "weighted"
    if is_convolution(layer) and _channels_last(layer) and layer.groups == 1:
        return "weighted"
    if isinstance(layer, _L.BatchNormalization):
        rank = len(layer.input.shape)
        return "channelwise" if list(layer.axis) == [rank - 1] else "opaque"
    if isinstance(layer, _L.Activation) and activation_name(layer) not in ELEMENTWISE:
        return "opaque"
    if isinstance(layer, (_L.SpatialDropout1D, _L.SpatialDropout2D, _L.SpatialDropout3D)):
        return "channelwise" if _channels_last(layer) else "opaque"
    if isinstance(layer, _POOLING):
        return "channelwise" if _channels_last(layer) else "opaque"
    if isinstance(layer, _CHANNELWISE):
        return "channelwise"
    if isinstance(layer, _MERGES):
        widths = {t.shape[-1] for t in layer.input}
        ranks = {len(t.shape) for t in layer.input}
        same = len(widths) == 1 and None not in widths and len(ranks) == 1
        return "channelwise" if same else "opaque"
    if isinstance(layer, _L.Concatenate):
        rank = len(layer.input[0].shape)
        return "concatenate" if layer.axis in (-1, rank - 1) else "opaque"
    if isinstance(layer, _L.Flatten):
        static = all(d is not None for d in layer.input.shape[1:])
        return "flatten" if _channels_last(layer) and static else "opaque"
    return "opaque"


def as_list(tensors):
    return list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]


@dataclasses.dataclass
class TensorInfo:
    """What the analysis knows about one tensor's channels."""

    shape: tuple
    varying: np.ndarray = None
    value: np.ndarray = None
    needed: np.ndarray = None
    kept: np.ndarray = None
    pinned: bool = False

    @property
    def width(self):
        return int(self.shape[-1])


def lowered_kernel(layer):
    """The kernel as a float64 array ``(positions, in_channels, out_channels)``."""
    if isinstance(layer, SparseDense):
        return layer.to_scipy().toarray().astype(np.float64)[None]
    kernel = layer.kernel.numpy().astype(np.float64)
    return kernel.reshape((-1,) + kernel.shape[-2:])


def bias_of(layer, width):
    return layer.bias.numpy().astype(np.float64) if layer.use_bias else np.zeros(width)


def folds_exactly(layer):
    """Whether a constant input channel of ``layer`` adds the same to every output position."""
    if not is_convolution(layer):
        return True
    return layer.padding == "valid" or all(k == 1 for k in layer.kernel_size)


class Analysis:
    """The channel analysis of a functional model (see the module docstring).

    Attributes:
        order: the model's layers but its InputLayers, in topological order.
        tensors: ``{id(keras tensor): TensorInfo}``.
        kinds: ``{layer name: kind}``.
        opaque: the layers left intact.
    """

    def __init__(self, model):
        self.model = model
        self.order = topological_order(model)
        self.kinds = {layer.name: layer_kind(layer) for layer in self.order}
        self.opaque = [layer for layer in self.order if self.kinds[layer.name] == "opaque"]
        self.tensors, self.consumers, self._kernels = {}, {}, {}
        for tensor in as_list(model.inputs):
            self.tensors[id(tensor)] = TensorInfo(
                tuple(tensor.shape[1:]), np.ones(tensor.shape[-1], bool),
                np.zeros(tensor.shape[-1]))
        for layer in self.order:
            for tensor in as_list(layer.output):
                if tensor.shape.rank is None or tensor.shape[-1] is None:
                    raise ValueError(
                        "compact needs the number of channels (last axis) of every tensor. "
                        f"Received: output of layer {layer.name!r} with shape {tensor.shape}")
                self.tensors[id(tensor)] = TensorInfo(tuple(tensor.shape[1:]))
            for tensor in as_list(layer.input):
                self.consumers.setdefault(id(tensor), []).append(layer)
        self._pin()
        self._forward()
        self._decide()

    def info(self, tensor):
        return self.tensors[id(tensor)]

    def kernel(self, layer):
        if layer.name not in self._kernels:
            self._kernels[layer.name] = lowered_kernel(layer)
        return self._kernels[layer.name]

    def _pin(self):
        for tensor in as_list(self.model.inputs) + as_list(self.model.outputs):
            self.info(tensor).pinned = True
        for layer in self.order:
            kind = self.kinds[layer.name]
            softmax_like = kind == "weighted" and activation_name(layer) not in ELEMENTWISE
            if kind == "opaque" or softmax_like:
                for tensor in as_list(layer.output) + ([] if softmax_like else as_list(layer.input)):
                    self.info(tensor).pinned = True

    # Forward: which channels vary, and the value of the constant ones.
    def _forward(self):
        for layer in self.order:
            kind = self.kinds[layer.name]
            out = self.info(layer.output) if kind != "opaque" else None
            if kind == "opaque":
                for tensor in as_list(layer.output):
                    info = self.info(tensor)
                    info.varying, info.value = np.ones(info.width, bool), np.zeros(info.width)
                continue
            inputs = [self.info(t) for t in as_list(layer.input)]
            if kind == "weighted":
                out.varying, out.value = self._weighted_constants(layer, inputs[0], out)
            elif kind == "channelwise":
                out.varying = np.logical_or.reduce([i.varying for i in inputs])
                out.value = _run_on_constants(layer, inputs, out)
            elif kind == "concatenate":
                out.varying = np.concatenate([i.varying for i in inputs])
                out.value = np.concatenate([i.value for i in inputs])
            else:  # flatten: feature f is channel f % channels
                repeats = out.width // inputs[0].width
                out.varying = np.tile(inputs[0].varying, repeats)
                out.value = np.tile(inputs[0].value, repeats)

    def _weighted_constants(self, layer, source, out):
        reads = self.kernel(layer) != 0
        varying = reads[:, source.varying].any(axis=(0, 1))
        if not folds_exactly(layer):  # a nonzero constant read through zero padding
            shifted = ~source.varying & (source.value != 0)
            varying |= reads[:, shifted].any(axis=(0, 1))
        if activation_name(layer) not in ELEMENTWISE:
            return np.ones(out.width, bool), np.zeros(out.width)
        pre = bias_of(layer, out.width) + np.where(
            source.varying, 0.0, source.value) @ self.kernel(layer).sum(axis=0)
        value = layer.activation(tf.constant(pre[None], tf.float64)).numpy()[0]
        return varying, np.where(varying, 0.0, value)

    # Backward and fixpoint: which channels are needed and kept.
    def _decide(self):
        for info in self.tensors.values():
            info.kept = np.full(info.width, info.pinned)
        while True:
            before = [info.kept.copy() for info in self.tensors.values()]
            self._backward()
            for key, info in self.tensors.items():
                foldable = self._foldable(key, info)
                info.kept = info.kept | info.pinned | (
                    info.needed & (info.varying | ~foldable))
            self._propagate()
            if all(np.array_equal(a, info.kept) for a, info in zip(before, self.tensors.values())):
                return

    def _backward(self):
        for info in self.tensors.values():
            info.needed = info.kept.copy()
        for layer in reversed(self.order):
            kind = self.kinds[layer.name]
            inputs = [self.info(t) for t in as_list(layer.input)]
            if kind == "opaque":
                for info in inputs:
                    info.needed[:] = True
                continue
            out = self.info(layer.output)
            if kind == "weighted":
                wanted = out.needed if not out.pinned or not out.needed.any() else out.kept
                reads = self.kernel(layer)[:, :, wanted] != 0
                inputs[0].needed |= reads.any(axis=(0, 2))
            elif kind == "channelwise":
                for info in inputs:
                    info.needed |= out.needed
            elif kind == "concatenate":
                for info, part in zip(inputs, _segments(out.needed, inputs)):
                    info.needed |= part
            else:
                inputs[0].needed |= out.needed.reshape(-1, inputs[0].width).any(axis=0)

    def _foldable(self, key, info):
        """Per channel: every reader of the tensor can take it away as a constant."""
        foldable = np.ones(info.width, bool)
        for layer in self.consumers.get(key, []):
            if self.kinds[layer.name] == "weighted" and not folds_exactly(layer):
                reads = (self.kernel(layer) != 0).any(axis=(0, 2))
                foldable &= ~(reads & (info.value != 0))
        return foldable

    def _propagate(self):
        changed = True
        while changed:
            changed = False
            for layer in self.order:
                kind = self.kinds[layer.name]
                if kind in ("channelwise", "concatenate", "flatten"):
                    changed |= self._unify(kind, [self.info(t) for t in as_list(layer.input)],
                                           self.info(layer.output))

    @staticmethod
    def _unify(kind, inputs, out):
        old = [info.kept.copy() for info in inputs + [out]]
        if kind == "channelwise":
            union = np.logical_or.reduce([info.kept for info in inputs + [out]])
            for info in inputs + [out]:
                info.kept = union.copy()
        elif kind == "concatenate":
            parts = _segments(out.kept, inputs)
            for info, part in zip(inputs, parts):
                info.kept = info.kept | part
            out.kept = np.concatenate([info.kept for info in inputs])
        else:
            source = inputs[0]
            source.kept = source.kept | out.kept.reshape(-1, source.width).any(axis=0)
            out.kept = np.tile(source.kept, out.width // source.width)
        return any(not np.array_equal(a, info.kept) for a, info in zip(old, inputs + [out]))


def _segments(array, inputs):
    bounds = np.cumsum([0] + [info.width for info in inputs])
    return [array[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _run_on_constants(layer, inputs, out):
    """The layer's output channels on inputs that hold each channel's constant everywhere."""
    arrays = []
    for info in inputs:
        shape = (1,) + tuple(_OPEN_SIZE if d is None else int(d) for d in info.shape)
        value = np.where(info.varying, 0.0, info.value).astype(layer.dtype or "float32")
        arrays.append(tf.constant(np.broadcast_to(value, shape)))
    result = layer(arrays if len(arrays) > 1 else arrays[0], training=False)
    flat = np.asarray(result, np.float64).reshape(-1, out.width)[0]
    return np.where(np.logical_or.reduce([i.varying for i in inputs]), 0.0, flat)


def topological_order(model):
    """The model's layers but its InputLayers, each after the producers of its inputs.

    Raises:
        ValueError: for a layer called more than once (shared in the model,
            or also called outside it), whose weights compaction cannot split,
            or a model nested in the model.
    """
    producer = {}
    for layer in model.layers:
        if isinstance(layer, _L.InputLayer):
            continue
        if isinstance(layer, keras.Model):
            raise ValueError(
                "compact supports models whose layers are not models themselves. Received: "
                f"layer {layer.name!r} of type {type(layer).__name__}, a model nested in "
                f"{model.name!r}: build the outer model from the inner model's layers, or "
                "compact the inner model on its own")
        if len(layer.inbound_nodes) != 1:
            raise ValueError(
                "compact supports layers called once in the model. Received: layer "
                f"{layer.name!r} of type {type(layer).__name__}, which is shared (called "
                f"{len(layer.inbound_nodes)} times, in this model or another)")
        for tensor in as_list(layer.output):
            producer[id(tensor)] = layer
    inputs = {id(tensor) for tensor in as_list(model.inputs)}
    order, done = [], set()

    def visit(layer):
        if layer.name in done:
            return
        done.add(layer.name)
        for tensor in as_list(layer.input):
            if id(tensor) not in inputs:
                visit(producer[id(tensor)])
        order.append(layer)

    for layer in producer.values():
        visit(layer)
    return order
