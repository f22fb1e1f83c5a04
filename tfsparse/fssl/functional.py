"""compact() and report() for functional models: CNNs, branches, residual nets.

:class:`tfsparse.fssl._graph.Analysis` decides which channels of each tensor
stay; this module rebuilds the model with those channels only. Dense,
SparseDense and convolution layers lose the kernel rows/columns of removed
channels, with the constants of removed constant channels folded into their
bias; BatchNormalization loses the statistics of removed channels; the
other supported layers are rebuilt from their config. Opaque layers are
rebuilt from their config with their weights, every channel around them
kept, and listed by :func:`intact_layers`.

Example:
  >>> import numpy as np
  >>> from tfsparse._keras import keras
  >>> from tfsparse.fssl.functional import compact_graph
  >>> inputs = keras.Input((4,))
  >>> hidden = keras.layers.Dense(3, activation="relu")(inputs)
  >>> model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
  >>> kernel, bias = model.layers[1].get_weights()
  >>> kernel[:, 0], bias[0] = 0.0, 0.0  # hidden unit 0 is always 0: removable
  >>> model.layers[1].set_weights([kernel, bias])
  >>> compact_graph(model, 0.0).layers[1].units
  2
"""

import warnings

import numpy as np
import scipy.sparse
import tensorflow as tf

from tfsparse._framework_internal import nested_inputs_outputs
from tfsparse._keras import keras
from tfsparse.fssl import _build
from tfsparse.fssl import _graph
from tfsparse.fssl._layers import is_convolution
from tfsparse.layers import SparseDense
from tfsparse._validation import invalid_value


def _everything_removed(layer):
    return ValueError(
        f"Cannot compact: every input channel of layer {layer.name!r} would be removed "
        "(none that still varies reaches a channel the outputs depend on), which would "
        "leave an empty layer; train with a weaker group penalty or a lower threshold.")


def check_model(model):
    """Raises a ValueError unless ``model`` is a built graph (functional or Sequential) model."""
    if not isinstance(model, keras.Model) or not getattr(model, "built", False) or not getattr(
            model, "inputs", None):
        raise invalid_value(
            "model", "a built tf_keras functional or Sequential model (with an Input)",
            received=f"{getattr(model, 'name', model)!r} of type {type(model).__name__}")
    for layer in model.layers:
        if type(layer).__name__ == "PruneLowMagnitude":
            raise ValueError(
                "compact cannot read pruning wrappers: call "
                "tfmot.sparsity.keras.strip_pruning first. Received: layer "
                f"{layer.name!r} of type PruneLowMagnitude")


class WeightedPlan:
    """The compacted kernel and bias of one Dense, SparseDense or convolution layer.

    Attributes:
        layer: the original layer.
        kept_inputs, kept_outputs: indices of the channels that stay.
        kernel: float64 array ``(*spatial, len(kept_inputs), len(kept_outputs))``.
        bias: float64 array with removed constants folded in, or None.
    """

    def __init__(self, analysis, layer):
        source, out = analysis.info(layer.input), analysis.info(layer.output)
        self.layer = layer
        self.kept_inputs = np.flatnonzero(source.kept)
        self.kept_outputs = np.flatnonzero(out.kept)
        full = analysis.kernel(layer)[:, :, self.kept_outputs]
        removed = ~source.kept
        # A removed channel either is a constant, folded here, or is read by no kept output.
        if full[:, removed & source.varying].any():
            raise RuntimeError(f"tfsparse internal error: layer {layer.name!r} reads a "
                               "removed channel that varies; please report this.")
        constants = np.where(removed & ~source.varying, source.value, 0.0)
        bias = _graph.bias_of(layer, out.width)[self.kept_outputs] + constants @ full.sum(axis=0)
        self.bias = bias if layer.use_bias or np.any(bias) else None
        spatial = tuple(int(d) for d in layer.kernel.shape[:-2]) if is_convolution(layer) else ()
        self.kernel = full[:, self.kept_inputs].reshape(
            spatial + (self.kept_inputs.size, self.kept_outputs.size))

    def to_dense(self, dense_threshold):
        """Whether the new layer is a Dense (always for Dense, from the density for SparseDense)."""
        nonzeros = np.count_nonzero(self.kernel)
        # Without a nonzero left (all it read folded into its bias) a kernel
        # has no SparseDense form: a Dense of zeros computes the same.
        return (not isinstance(self.layer, SparseDense) or nonzeros == 0
                or nonzeros / self.kernel.size >= dense_threshold)

    def build(self, dense_threshold):
        """The new layer, built, its weights set (group lasso terms dropped)."""
        layer = self.layer
        if not is_convolution(layer):
            return _build.fully_connected(layer, scipy.sparse.csr_matrix(self.kernel), self.bias,
                                          self.to_dense(dense_threshold))
        new = _build.rebuilt(layer, lambda: {
            **_build.settings_without_group_lasso(layer),
            "filters": int(self.kept_outputs.size), "use_bias": self.bias is not None})
        new.build((None,) + (None,) * (self.kernel.ndim - 2) + (self.kernel.shape[-2],))
        new.kernel.assign(self.kernel.astype(layer.dtype))
        if self.bias is not None:
            new.bias.assign(self.bias.astype(layer.dtype))
        return new


def _clone(layer):
    """A copy of ``layer`` from its config, with its weights.

    Raises:
        ValueError: when the config cannot rebuild the layer (reusing the layer
            itself would share its weights with the original model).
    """
    new = _build.rebuilt(layer)
    if layer.weights:
        new.build(layer.input_shape)
        new.set_weights(layer.get_weights())
    return new


def _sliced_channelwise(layer, kept):
    new = _build.rebuilt(layer)
    if layer.weights:  # BatchNormalization: every weight is per channel
        new.build(layer.input_shape[:-1] + (int(kept.sum()),))
        new.set_weights([w[kept] for w in layer.get_weights()])
    return new


def compact_graph(model, dense_threshold):
    """The compacted functional model (see :func:`tfsparse.fssl.compact`)."""
    check_model(model)
    analysis = _graph.Analysis(model)
    built = {id(tensor): keras.Input(tensor.shape[1:], dtype=tensor.dtype,
                                     name=tensor.name.split(":")[0])
             for tensor in _graph.as_list(model.inputs)}

    def new(tensor):
        return built.get(id(tensor))

    for layer in analysis.order:
        _rebuild(analysis, layer, built, new, dense_threshold)
    if analysis.opaque:
        warnings.warn(
            "tfsparse.fssl.compact left these layers intact, with every channel around them "
            "kept: " + ", ".join(f"{l.name} ({type(l).__name__})" for l in analysis.opaque),
            stacklevel=3)
    # The model's own structures of inputs and outputs (a dict stays a dict).
    inputs, outputs = tf.nest.map_structure(new, nested_inputs_outputs(model))
    return keras.Model(inputs, outputs, name=f"{model.name}_compact")


def _rebuild(analysis, layer, built, new, dense_threshold):
    kind = analysis.kinds[layer.name]
    if kind == "opaque":
        inputs = [new(t) for t in _graph.as_list(layer.input)]
        outputs = _clone(layer)(inputs if isinstance(layer.input, list) else inputs[0])
        for tensor, output in zip(_graph.as_list(layer.output), _graph.as_list(outputs)):
            built[id(tensor)] = output
        return
    out = analysis.info(layer.output)
    if not out.kept.any():
        return  # every channel is a removed constant: consumers folded it
    inputs = [t for t in _graph.as_list(layer.input) if analysis.info(t).kept.any()]
    if not inputs:
        raise _everything_removed(layer)
    if kind == "weighted":
        new_layer = WeightedPlan(analysis, layer).build(dense_threshold)
    elif kind == "channelwise":
        new_layer = _sliced_channelwise(layer, out.kept)
    elif kind == "concatenate" and len(inputs) == 1:
        built[id(layer.output)] = new(inputs[0])
        return
    else:
        new_layer = _build.rebuilt(layer)
    arguments = [new(t) for t in inputs]
    built[id(layer.output)] = new_layer(arguments if len(arguments) > 1 else arguments[0])


def intact_layers(model):
    """The layers compaction leaves intact (custom layers, Lambda, ...), by name."""
    check_model(model)
    return [layer.name for layer in _graph.Analysis(model).opaque]


def report_rows(model, dense_threshold):
    """Rows of :func:`tfsparse.fssl.report` for a functional model, and the intact layers."""
    check_model(model)
    analysis = _graph.Analysis(model)
    rows = []
    for layer in analysis.order:
        if analysis.kinds[layer.name] != "weighted":
            continue
        before_type = type(layer).__name__
        kernel = analysis.kernel(layer)
        positions = _output_positions(layer)
        shape_before = tuple(int(d) for d in (
            layer.kernel.shape if not isinstance(layer, SparseDense)
            else (layer.input_dim, layer.units)))
        if analysis.info(layer.output).kept.any():
            plan = WeightedPlan(analysis, layer)
            after, dense_after = plan.kernel, plan.to_dense(dense_threshold)
        else:
            after, dense_after = np.zeros(shape_before[:-2] + (0, 0)), True
        after_type = (before_type if is_convolution(layer)
                      else "Dense" if dense_after else "SparseDense")
        nnz_before = int(np.count_nonzero(kernel))
        stored_before = layer.nnz if isinstance(layer, SparseDense) else kernel.size
        nnz_after = int(np.count_nonzero(after))
        rows.append({
            "layer": layer.name, "type": f"{before_type} -> {after_type}",
            "shape_before": shape_before, "shape_after": tuple(after.shape),
            "nnz_before": layer.nnz if isinstance(layer, SparseDense) else nnz_before,
            "nnz_after": nnz_after,
            "macs_before": None if positions is None else positions * stored_before,
            "macs_after": (None if positions is None
                           else positions * (after.size if dense_after else nnz_after)),
        })
    return rows, [layer.name for layer in analysis.opaque]


def _output_positions(layer):
    """Output positions per sample (the product of the output's non-channel axes), or
    None when one of them is not fixed (an image size left open)."""
    sizes = layer.output.shape[1:-1]
    if any(d is None for d in sizes):
        return None
    return int(np.prod(sizes or [1]))
