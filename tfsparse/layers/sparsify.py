"""sparsify(): a trained model's Dense and Conv2D layers as SparseDense and SparseConv2D."""

import math
import numbers

from tfsparse._framework_internal import is_graph_network
from tfsparse._keras import keras
from tfsparse._validation import check_bool
from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value
from tfsparse.layers import _conversion
from tfsparse.layers import _measured_rule
from tfsparse.layers.sparsify_report import SparsifyReport
from tfsparse.layers.sparsify_report import SparsifyRow


def sparsify(model, max_density=None, *, measure=None, batch_size=32, report=False):
    """Returns a copy of ``model`` whose sparse ``Dense``/``Conv2D`` layers are sparse layers.

    A ``Dense`` becomes a ``SparseDense`` and a channels-last ``Conv2D`` a
    ``SparseConv2D`` holding exactly the kernel's nonzeros as its pattern and
    values, with the layer's bias, activation, name and other settings, so the
    new model's outputs equal the original's (up to float rounding of another
    summation order). This is the bridge from tensorflow-model-optimization:
    prune with ``prune_low_magnitude``, call ``strip_pruning``, then
    ``sparsify``. Every other layer (BatchNormalization, Add, Concatenate,
    nested models, whose own layers are converted too) is copied with its
    weights, and the new model trains with ``fit`` and saves as ``.keras``.

    A layer converts only where the rule says sparse is faster:

    - by density (the default): its kernel's fraction of nonzeros is at most
      ``max_density`` for its kind, to the nearest whole weight (a layer
      pruned to 90% is at the 0.1 level whatever tfmot's rounding). The default, ``DEFAULT_MAX_DENSITY``, is
      for a ``Conv2D`` the measured crossover of its geometry (k x k at
      stride 1, strided, or 1 x 1: ``CONV2D_CROSSOVER_DENSITY`` in
      ``tfsparse/layers/_conversion.py``, from
      ``benchmarks/sparse_conv_speed.py``) and 1.0 for ``Dense`` (every Dense
      layer, as sparsify always did; ``CROSSOVER_DENSITY`` holds Dense's
      measured crossover, 0.3, and Conv2D's at stride 1, for
      ``max_density=CROSSOVER_DENSITY``).
    - measured (``measure="inference"`` or ``"training"``), as SparseProp
      does: the layer and its sparse twin are timed on the layer's own input
      shape with ``batch_size`` random examples (medians of interleaved runs:
      a forward pass, or a forward pass and the gradients), and the faster
      one is kept. ``max_density`` still caps which layers are timed; here
      ``None`` times every convertible layer. Timing is not deterministic.

    Layers the sparse layers cannot represent exactly stay as they are, with
    the reason in the report: channels-first or grouped convolutions, other
    convolution types, all-zero kernels, kernel constraints or regularizers
    that act across kernel axes.

    Args:
      model: a built ``tf_keras`` Sequential or functional model (not still
        wrapped by ``prune_low_magnitude``: call ``strip_pruning`` first).
      max_density: ``None``, a float in (0, 1] for every kind, or a mapping
        ``{"Dense": float, "Conv2D": float}`` (missing kinds, and kinds
        mapped to None, keep their default: ``DEFAULT_MAX_DENSITY`` itself
        is such a mapping).
      measure: ``None``, ``"inference"`` or ``"training"``.
      batch_size: positive int, the batch of the measured rule.
      report: also return a ``SparsifyReport``: one row per kernel layer
        (name, kind, kernel shape, density, converted, reason);
        ``print(report)`` shows it as a table.

    Returns:
      A new model with the same weights (``model`` is unchanged), or
      ``(new model, report)`` with ``report=True``.

    Example:
      >>> import numpy as np
      >>> from tfsparse._keras import keras
      >>> model = keras.Sequential([keras.Input((8, 8, 4)),
      ...                           keras.layers.Conv2D(4, 3, name="conv"),
      ...                           keras.layers.Flatten(),
      ...                           keras.layers.Dense(2, name="out")])
      >>> kernel, bias = model.get_layer("conv").get_weights()
      >>> kernel[1:] = 0
      >>> model.get_layer("conv").set_weights([kernel, bias])
      >>> sparse, report = sparsify(model, max_density=0.5, report=True)
      >>> [type(layer).__name__ for layer in sparse.layers]
      ['SparseConv2D', 'Flatten', 'Dense']
      >>> report["conv"].converted, report["conv"].density
      (True, 0.3333333333333333)
      >>> report["out"].reason
      'density 1.000 > max_density 0.500'
    """
    limits = _check_arguments(model, max_density, measure, batch_size, report)
    rows = []
    new_model = _sparsify_graph(model, _Rule(limits, measure, batch_size), rows, prefix="")
    return (new_model, SparsifyReport(tuple(rows))) if report else new_model


class _Rule:
    """Decides one layer: ``(converted layer or None, report row or None)``."""

    def __init__(self, limits, measure, batch_size):
        self.limits, self.measure, self.batch_size = limits, measure, batch_size

    def __call__(self, layer, name):
        if not _conversion.has_kernel(layer):
            return None, None
        shape, density = _conversion.kernel_summary(layer)
        kind = type(layer).__name__

        def row(converted, reason):
            return SparsifyRow(name, kind, tuple(shape), density, converted, reason)

        reason = _conversion.blocker(layer)
        if reason is not None:
            return None, row(False, reason)
        limit, source = self.limits[kind], ""
        if limit is None:  # the default for Conv2D: its geometry's measured crossover
            geometry = _conversion.conv2d_geometry(layer)
            limit = _conversion.CONV2D_CROSSOVER_DENSITY[geometry]
            source = f" (the measured crossover of a {geometry} Conv2D)"
        if not _within(density, limit, shape):
            return None, row(False, _comparison(density, ">", limit) + source)
        within = _comparison(density, "<=", limit) + _whole_weights(density, limit, shape)
        if self.measure is None:
            return _conversion.to_sparse(layer), row(True, within + source)
        return self._measured(layer, row)

    def _measured(self, layer, row):
        shape, reason = _measured_rule.input_shape(layer)
        if reason is not None:
            return None, row(False, reason)
        sparse = _conversion.to_sparse(layer)
        dense_s, sparse_s = _measured_rule.time_pair(
            layer, sparse, shape, self.batch_size, self.measure)
        timing = (f"{self.measure}, batch {self.batch_size}: sparse {sparse_s * 1e3:.2f} ms, "
                  f"dense {dense_s * 1e3:.2f} ms")
        if sparse_s < dense_s:
            return sparse, row(True, "faster sparse: " + timing)
        return None, row(False, "faster dense: " + timing)


def _within(density, limit, shape):
    """Whether a kernel of ``shape`` at ``density`` holds at most ``limit`` of
    its weights, to the nearest whole weight: a layer pruned to 90% of 9,216
    weights keeps 922 (density 0.10004), which is the 90% level."""
    size = math.prod(int(extent) for extent in shape)
    return round(density * size) <= round(limit * size)


def _whole_weights(density, limit, shape):
    """For a density over ``limit`` that is within it to the nearest whole weight, the
    counts that make it so (``_within``); else ``""``."""
    if density <= limit:
        return ""
    size = math.prod(int(extent) for extent in shape)
    return (f" to the nearest whole weight ({round(density * size):,} of {size:,}: "
            f"{limit:g} of them is {limit * size:.4g}, {round(limit * size):,} as tfmot "
            "rounds a pruned layer's count)")


def _comparison(density, sign, limit):
    """``"density 0.1004 > max_density 0.1000"``, with the digits that tell them apart."""
    digits = 3
    while digits < 6 and f"{density:.{digits}f}" == f"{limit:.{digits}f}":
        digits += 1
    return f"density {density:.{digits}f} {sign} max_density {limit:.{digits}f}"


def _sparsify_graph(model, rule, rows, prefix):
    """``model`` cloned with the layers ``rule`` converts; appends the report rows."""
    copies = []  # (layer, its copy from the config), whose weights are set below

    def clone(layer):
        name = prefix + layer.name
        if isinstance(layer, keras.Model) and _is_graph_model(layer):
            return _sparsify_graph(layer, rule, rows, prefix=name + "/")
        sparse, row = rule(layer, name)
        if row is not None:
            rows.append(row)
        if sparse is not None:
            return sparse
        copy = layer.__class__.from_config(layer.get_config())
        copies.append((layer, copy))
        return copy

    new_model = keras.models.clone_model(model, clone_function=clone)
    # By the copy itself, not by name: a subclassed model's config may not
    # keep its name.
    for layer, copy in copies:
        if layer.weights:
            copy.set_weights(layer.get_weights())
    return new_model


def _is_graph_model(model):
    return isinstance(model, keras.Sequential) or is_graph_network(model)


def _check_arguments(model, max_density, measure, batch_size, report):
    """Validates the arguments; returns the density limit per kind."""
    if not isinstance(model, keras.Model):
        raise invalid_value("model", "a tf_keras Model",
                            received=f"model of type {type(model).__name__}")
    if measure is not None and measure not in _measured_rule.MODES:
        raise invalid_value("measure", "None, 'inference' or 'training'", measure)
    check_positive_int("batch_size", batch_size)
    check_bool("report", report)
    limits = _limits(max_density, measure)
    if not _is_graph_model(model):
        # Keras clones only these: a subclassed model's call() is code.
        raise invalid_value(
            "model", "a Sequential or functional model (a subclassed model's layers "
            "cannot be rewired: build it with SparseDense layers instead)",
            received=f"model of class {type(model).__name__}",
        )
    if not model.built:
        raise invalid_value(
            "model", "a built model (call it on data or give it an Input first)",
            received=f"an unbuilt model {model.name!r}",
        )
    _refuse_pruning_wrappers(model)
    return limits


def _limits(max_density, measure):
    def fraction(value, shown):
        if (not isinstance(value, numbers.Real) or isinstance(value, bool)
                or not 0 < value <= 1):
            raise invalid_value("max_density", "None, a float in (0, 1] or a mapping from "
                                f"{' and '.join(_conversion.KINDS)} to such floats",
                                received=f"max_density={shown!r}")
        return float(value)

    if max_density is None:
        return (dict.fromkeys(_conversion.KINDS, 1.0) if measure is not None
                else dict(_conversion.DEFAULT_MAX_DENSITY))
    if not hasattr(max_density, "items"):
        return dict.fromkeys(_conversion.KINDS, fraction(max_density, max_density))
    unknown = sorted(set(max_density) - set(_conversion.KINDS))
    if unknown:
        fraction(None, dict(max_density))  # raises, naming what was received
    limits = dict(_conversion.DEFAULT_MAX_DENSITY)
    # None for a kind is its default (DEFAULT_MAX_DENSITY itself holds one).
    limits.update({kind: fraction(value, dict(max_density))
                   for kind, value in max_density.items() if value is not None})
    return limits


def _refuse_pruning_wrappers(model):
    for layer in model.layers:
        if type(layer).__name__ == "PruneLowMagnitude":
            raise ValueError(
                f"Layer {layer.name!r} is still wrapped for pruning: call "
                "tfmot.sparsity.keras.strip_pruning(model) before sparsify(model)."
            )
        if isinstance(layer, keras.Model):
            _refuse_pruning_wrappers(layer)
