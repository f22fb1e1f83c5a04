"""compact(): remove the neurons and inputs that FSSL zeroed, physically.

The surgery is planned on NumPy/SciPy copies of the weights (``plan``), then
the smaller model is built from the plan (``compact``); ``report`` reads the
same plan. Only exact zeros are removed, so the compacted model computes the
same function (up to float rounding of a different summation order).
"""

import dataclasses

import numpy as np
import scipy.sparse

from tfsparse._keras import keras
import tensorflow as tf  # noqa: E402  (after tfsparse._keras selects Keras 2)

from tfsparse._validation import check_bool  # noqa: E402
from tfsparse._validation import check_unit_interval  # noqa: E402
from tfsparse._validation import invalid_value  # noqa: E402
from tfsparse.fssl import _build  # noqa: E402
from tfsparse.fssl import _graph  # noqa: E402
from tfsparse.fssl import functional  # noqa: E402
from tfsparse.fssl._layers import is_fully_connected  # noqa: E402
from tfsparse.fssl._layers import is_library_layer  # noqa: E402
from tfsparse.fssl.gather_inputs import GatherInputs  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse.ops.pattern import scipy_values  # noqa: E402

# A SparseDense whose compacted kernel is at least this dense becomes a Dense
# layer. Measured by benchmarks/fssl_crossover.py (forward pass, batch 256, on
# the project's 2-core CPU, with the 16-row AVX-512 SpMM kernel): SparseDense
# and Dense take the same time at densities of 0.35 for 256x256 kernels, 0.29
# for 512x512 and 0.30 for 1024x1024.
DEFAULT_DENSE_THRESHOLD = 0.3

_ELEMENTWISE = _graph.ELEMENTWISE


@dataclasses.dataclass
class LayerPlan:
    """What compaction does to one fully connected layer.

    Attributes:
        layer: the original layer.
        kept_inputs: indices of the layer's inputs that stay (sorted).
        kept_units: indices of its output units that stay (sorted).
        kernel: the compacted kernel, ``scipy.sparse.csr_matrix``
            ``(len(kept_inputs), len(kept_units))`` without stored zeros.
        bias: the compacted bias with constants of removed units folded in, or
            None when the layer has no bias and nothing was folded.
        to_dense: whether the compacted layer is a ``Dense``.
    """

    layer: object
    kept_inputs: np.ndarray
    kept_units: np.ndarray
    kernel: scipy.sparse.csr_matrix
    bias: object
    to_dense: bool

    @property
    def original_shape(self):
        """``(input_dim, units)`` of the original kernel."""
        return _kernel_shape(self.layer)


# Layers allowed after a Dense/SparseDense: they act unit by unit (Dropout is
# the identity at inference), so they carry over to the kept units unchanged.
_UNITWISE_LAYERS = (
    keras.layers.Dropout, keras.layers.Activation, keras.layers.ReLU,
    keras.layers.LeakyReLU, keras.layers.ELU,
)


def _unsupported(layer, reason):
    return invalid_value(
        "model", "a Sequential chain of Dense and SparseDense layers, with Flatten "
        "before the first of them and Dropout or elementwise activation layers "
        "(Activation, ReLU, LeakyReLU, ELU) after them",
        received=f"layer {layer.name!r} of type {type(layer).__name__} ({reason})",
    )


def _chain(model):
    """Splits a Sequential model into (Flatten or None, [fc and unit-wise layers])."""
    if not isinstance(model, keras.Sequential):
        raise invalid_value("model", "a built tf_keras Sequential model",
                            received=f"model of type {type(model).__name__}")
    if not model.built:
        raise invalid_value(
            "model", "a built tf_keras Sequential model (give it an Input or call it once)",
            received=f"the unbuilt model {model.name!r}",
        )
    flatten, chain = None, []
    for layer in model.layers:
        if type(layer).__name__ == "PruneLowMagnitude":
            raise _unsupported(layer, "call tfmot.sparsity.keras.strip_pruning first")
        if not is_library_layer(layer):
            raise _unsupported(layer, "a class of its own, which may compute otherwise")
        if isinstance(layer, keras.layers.Flatten) and not chain and flatten is None:
            flatten = layer
        elif isinstance(layer, _UNITWISE_LAYERS) and chain:
            chain.append(layer)
        elif is_fully_connected(layer):
            if not isinstance(layer, SparseDense) and len(layer.kernel.shape) != 2:
                raise _unsupported(layer, "a Dense kernel that is not 2-D")
            if not chain and flatten is None and len(model.input_shape) != 2:
                # It acts on the last axis of every position (the graph
                # analysis counts them): inputs of rank 2 or a Flatten first.
                raise _unsupported(layer, f"the first layer, on inputs of shape "
                                          f"{model.input_shape} without a Flatten")
            chain.append(layer)
        else:
            raise _unsupported(layer, "not supported")
    if not chain:
        raise invalid_value("model", "at least one Dense or SparseDense layer",
                            received=f"model {model.name!r} without one")
    return flatten, chain


def _kernel_and_bias(layer):
    if isinstance(layer, SparseDense):
        kernel = layer.to_scipy().tocsr()
    else:
        kernel = scipy.sparse.csr_matrix(scipy_values(layer.kernel.numpy()))
    kernel.eliminate_zeros()
    units = kernel.shape[1]
    bias = layer.bias.numpy().astype(np.float64) if layer.use_bias else np.zeros(units)
    return kernel, bias


def _kernel_shape(layer):
    if isinstance(layer, SparseDense):
        return (layer.input_dim, layer.units)
    return tuple(int(d) for d in layer.kernel.shape)


_activation_name = _graph.activation_name


def _nonzero_rows(kernel, columns):
    return np.flatnonzero(np.diff(kernel[:, columns].tocsr().indptr) > 0)


def _nonzero_columns(kernel, rows):
    sub = kernel[rows, :].tocsc()
    return np.flatnonzero(np.diff(sub.indptr) > 0)


def _split(chain):
    """``[(fc layer, [unit-wise layers after it])]`` from a chain."""
    groups = []
    for layer in chain:
        if is_fully_connected(layer):
            groups.append((layer, []))
        else:
            groups[-1][1].append(layer)
    return groups


def _unit_function_name(layer):
    """The elementwise function's name, or None when it is not elementwise."""
    if isinstance(layer, keras.layers.Activation) or is_fully_connected(layer):
        name = _activation_name(layer)
        return name if name in _ELEMENTWISE else None
    return type(layer).__name__


def _liveness(kernels):
    """Input rows and units on some path of nonzeros from the inputs to the outputs.

    Returns ``(needed inputs, needed units, varying units, kept units)``, the
    unit lists per layer: needed units feed the outputs, varying units depend
    on the inputs (the others are constants), kept units are both (all units
    of the last layer are kept).
    """
    count = len(kernels)
    needed = [None] * count
    needed[-1] = np.arange(kernels[-1].shape[1])
    for i in range(count - 1, 0, -1):
        needed[i - 1] = _nonzero_rows(kernels[i], needed[i])
    needed_inputs = _nonzero_rows(kernels[0], needed[0])
    varying, rows = [], np.arange(kernels[0].shape[0])
    for kernel in kernels:
        varying.append(_nonzero_columns(kernel, rows))
        rows = varying[-1]
    kept = [np.intersect1d(needed[i], varying[i]) for i in range(count - 1)] + [needed[-1]]
    return needed_inputs, needed, varying, kept


def _constants(layer, followers, pre_activation, varying):
    """The outputs of the units outside ``varying``: fixed values (0 for the others)."""
    is_constant = np.ones(pre_activation.size, bool)
    is_constant[varying] = False
    constants = np.zeros(pre_activation.size)
    if is_constant.any():
        activated = layer.activation(tf.constant(pre_activation[None, :]))
        for follower in followers:
            activated = follower(activated, training=False)
        constants[is_constant] = activated[0].numpy()[is_constant]
    return constants


def plan(model, dense_threshold=DEFAULT_DENSE_THRESHOLD):
    """Plans the compaction of ``model`` (see :func:`compact`); changes nothing.

    Returns:
        A list of :class:`LayerPlan`, one per Dense/SparseDense layer, in order.
    """
    _check_threshold(dense_threshold)
    groups = _split(_chain(model)[1])
    layers = [layer for layer, _ in groups]
    kernels, biases = zip(*(_kernel_and_bias(layer) for layer in layers))
    needed_inputs, needed, varying, kept = _liveness(kernels)
    _check_not_empty(layers, kernels, varying, needed)
    plans, constants = [], np.zeros(kernels[0].shape[0])
    for i, (layer, followers) in enumerate(groups):
        inputs = needed_inputs if i == 0 else kept[i - 1]
        pre_activation = biases[i] + kernels[i].T @ constants  # folds removed constants
        if i < len(layers) - 1:
            if kept[i].size < kernels[i].shape[1]:
                for unit_layer in [layer] + followers:
                    if _unit_function_name(unit_layer) is None:
                        raise _unsupported(
                            unit_layer, f"activation {_activation_name(unit_layer)!r} is "
                                        "not elementwise, so its units cannot be removed")
            constants = _constants(layer, followers, pre_activation, varying[i])
        kernel = kernels[i][inputs][:, kept[i]].tocsr()
        kernel.eliminate_zeros()
        bias = pre_activation[kept[i]]
        if not layer.use_bias and not np.any(bias):
            bias = None
        density = kernel.nnz / (inputs.size * kept[i].size)
        # A kernel without a nonzero left (all it read folded into its bias)
        # has no SparseDense form: a Dense of zeros computes the same.
        to_dense = (not isinstance(layer, SparseDense) or kernel.nnz == 0
                    or density >= dense_threshold)
        plans.append(LayerPlan(layer, inputs, kept[i], kernel, bias, to_dense))
    return plans


def _check_not_empty(layers, kernels, varying, needed):
    """Raises for the layer that disconnects the outputs from the inputs, if any."""
    inputs = [np.arange(kernels[0].shape[0])] + varying[:-1]
    for i in range(len(layers)):  # first layer whose varying inputs reach nothing
        if kernels[i][inputs[i]].nnz == 0:
            raise _everything_removed(layers[i])
    for i in reversed(range(len(layers))):  # last layer whose needed units read nothing
        if kernels[i][:, needed[i]].nnz == 0:
            raise _everything_removed(layers[i])
    for i in range(len(layers)):
        if kernels[i][inputs[i]][:, needed[i]].nnz == 0:
            raise _everything_removed(layers[i])


def _everything_removed(layer):
    return ValueError(
        f"Cannot compact: every weight of layer {layer.name!r} would be removed (none "
        "connects an input that still varies to a unit the outputs depend on), which "
        "would leave an empty layer; train with a weaker group penalty or a lower threshold."
    )


def _check_threshold(dense_threshold):
    return check_unit_interval("dense_threshold", dense_threshold)


def kept_inputs(model):
    """Indices of the (flattened) input features the compacted model still reads.

    Example:
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> kernel, bias = model.layers[0].get_weights()
        >>> kernel[1] = 0.0
        >>> model.layers[0].set_weights([kernel, bias])
        >>> kept_inputs(model).tolist()
        [0, 2]
    """
    return plan(model)[0].kept_inputs


def _build_layer(layer_plan):
    return _build.fully_connected(layer_plan.layer, layer_plan.kernel, layer_plan.bias,
                                  layer_plan.to_dense)


def uses_chain_path(model):
    """Whether :func:`compact` treats ``model`` as a Sequential Dense/SparseDense chain.

    Such chains (Flatten first, Dense/SparseDense layers with Dropout and
    elementwise activation layers after them) are compacted as before
    functional support existed, with input gathering and ``drop_inputs``;
    an unbuilt Sequential or one holding pruning wrappers gets the chain
    path's error. Every other model goes through the functional path.
    """
    if not isinstance(model, keras.Sequential):
        return False
    if not model.built or any(type(layer).__name__ == "PruneLowMagnitude"
                              for layer in model.layers):
        return True
    try:
        _chain(model)
    except ValueError:
        return False
    return True


def compact(model, dense_threshold=DEFAULT_DENSE_THRESHOLD, drop_inputs=False):
    """A new, smaller model in which the neurons and channels FSSL removed are gone.

    **Sequential chains of Dense/SparseDense layers** (optionally a Flatten
    first, and Dropout or elementwise activation layers after them): for each
    pair of consecutive layers, a hidden unit is removed when its kernel
    column is zero (it is then a constant, ``activation(bias)``, which is
    folded into the next layer's bias, so no activation is lost) or when its
    row in the next layer's kernel is zero (nothing reads it); this is
    repeated through the chain in both directions. Input features whose
    first-layer rows are zero are removed too. The output units all stay.

    **Functional models** (and Sequential models with other layers), such as
    CNNs and residual networks: every channel (last axis) of every tensor is
    removed when nothing reads it with a nonzero weight, or when it is a
    constant (a zero filter's ``activation(bias)``, through BatchNormalization,
    pooling, ...) that every reader can fold exactly into its bias (Dense, a
    convolution with "valid" padding or a 1x1 kernel; a nonzero constant read
    by a "same"-padded wider convolution stays, since the zero padding makes
    its contribution depend on the position). Conv1D/2D/3D lose filters and
    input channels, Dense/SparseDense units and inputs, BatchNormalization its
    statistics of removed channels. Layers acting channel by channel
    (activations, Dropout, pooling, BatchNormalization, ``Add`` and the other
    elementwise merges) keep the same channels on all inputs and the output:
    across a residual ``Add`` a channel goes only if it goes in every addend.
    ``Concatenate`` maps its channels to its inputs', ``Flatten`` its features
    to channels. Other layers (a custom layer, ``Lambda``, ``Reshape``,
    transposed or depthwise convolutions, ...) are left intact with every
    channel around them kept, and named in a warning (see also
    :func:`tfsparse.fssl.report`). The model's inputs and outputs keep their
    shapes.

    Only exact zeros count: after ``callbacks.FSSL`` the removed groups are
    exactly zero. The compacted model computes the same function at inference
    (``training=False``), up to float rounding of a different summation order.

    A SparseDense layer whose compacted kernel has density at least
    ``dense_threshold`` becomes a ``Dense`` layer; Dense layers stay Dense.
    Layers keep their names and settings (activation, initialisers,
    constraints, regularisers) except the ``GroupLasso`` terms of their kernel
    regularisers: the FSSL phase is over, so further training of the
    compacted model is not penalised (other terms, such as L2, stay).

    Constants are folded at inference: a Dropout after a removed constant unit
    no longer drops it, and a BatchNormalization no longer normalises it,
    when the compacted model is trained further.

    Inputs of a chain: by default the compacted model takes the same inputs as
    ``model``. If its compacted first layer is a Dense (a Dense, or a
    SparseDense at least ``dense_threshold`` dense) that lost input rows, a
    ``GatherInputs`` layer selects the kept features first (on CPU with the
    SpMM kernel). A first layer that stays SparseDense needs none: it keeps the
    original input width and its pattern, which holds only the kept nonzeros,
    reads the kept inputs where they are. With ``drop_inputs=True`` the
    compacted chain instead takes only the kept (flattened) features,
    ``x[:, kept_inputs(model)]``. Functional models keep their input width.

    Args:
        model: a built ``tf_keras`` Sequential or functional model.
        dense_threshold: density in [0, 1] from which a SparseDense becomes Dense.
        drop_inputs: take only the kept input features (chains only, see above).

    Returns:
        A new model (``keras.Sequential`` for a chain, functional otherwise);
        ``model`` is unchanged.

    Raises:
        ValueError: for unsupported models (unbuilt, subclassed, shared layers,
            pruning wrappers), or when every input of a layer that the outputs
            depend on would be removed.

    Example:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
        ...                           keras.layers.Dense(2)])
        >>> kernel, bias = model.layers[0].get_weights()
        >>> kernel[:, 1] = 0.0
        >>> model.layers[0].set_weights([kernel, bias])
        >>> [layer.units for layer in compact(model).layers]
        [2, 2]
        >>> inputs = keras.Input((6, 6, 1))
        >>> hidden = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
        >>> outputs = keras.layers.Conv2D(2, 1)(hidden)
        >>> cnn = keras.Model(inputs, outputs)
        >>> kernel, bias = cnn.layers[1].get_weights()
        >>> kernel[..., :3] = 0.0  # three zero filters: constants relu(bias), folded
        >>> cnn.layers[1].set_weights([kernel, bias])
        >>> compact(cnn).layers[1].filters
        1
    """
    dense_threshold = _check_threshold(dense_threshold)
    drop_inputs = check_bool("drop_inputs", drop_inputs)
    if not uses_chain_path(model):
        if drop_inputs:
            raise invalid_value(
                "drop_inputs", "False for a model that is not a Sequential chain of "
                "Dense/SparseDense layers", True)
        return functional.compact_graph(model, dense_threshold)
    flatten, chain = _chain(model)
    plans = plan(model, dense_threshold)
    first = plans[0]
    input_dim = first.original_shape[0]
    new_layers = []
    if drop_inputs:
        new_layers.append(keras.Input((first.kept_inputs.size,), dtype=model.input.dtype))
    else:
        new_layers.append(keras.Input(model.input_shape[1:], dtype=model.input.dtype))
        if flatten is not None:
            new_layers.append(_build.rebuilt(flatten))
        if first.kept_inputs.size < input_dim:
            if first.to_dense:
                # The first layer's dtype policy: the gather casts as that layer
                # would (selection and casting commute), float64 stays float64.
                first_layer = next(layer for layer in chain if is_fully_connected(layer))
                new_layers.append(GatherInputs(first.kept_inputs.tolist(), name="fssl_kept_inputs",
                                               dtype=first_layer.dtype_policy))
            else:  # the pattern skips the removed inputs: put its rows back in place
                coo = first.kernel.tocoo()
                first.kernel = scipy.sparse.csr_matrix(
                    (coo.data, (first.kept_inputs[coo.row], coo.col)),
                    shape=(input_dim, first.kernel.shape[1]))
    layer_plans = iter(plans)
    for layer in chain:
        if is_fully_connected(layer):
            new_layers.append(_build_layer(next(layer_plans)))
        else:
            new_layers.append(_build.rebuilt(layer))
    return keras.Sequential(new_layers, name=f"{model.name}_compact")
