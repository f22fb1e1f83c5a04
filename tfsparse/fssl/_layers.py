"""Thin adapters from Keras layers to the group-norm math (Dense, SparseDense, Conv)."""

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.regularizers import conv_norms
from tfsparse.regularizers import group_lasso_terms
from tfsparse.regularizers import group_norms

_CONVOLUTIONS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)
# Convolutions (subclasses of the above in Keras) whose kernel is not (*spatial, in_channels, filters): their
# group lasso would group the wrong axes.
_OTHER_LAYOUTS = (
    keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose, keras.layers.Conv3DTranspose,
    keras.layers.DepthwiseConv1D, keras.layers.DepthwiseConv2D,
    keras.layers.SeparableConv1D, keras.layers.SeparableConv2D,
)


def is_fully_connected(layer):
    """True for a ``Dense`` (2-D kernel) or ``SparseDense`` layer."""
    return isinstance(layer, SparseDense) or isinstance(layer, keras.layers.Dense)


def is_convolution(layer):
    """True for a ``Conv1D``/``Conv2D``/``Conv3D`` (kernel ``(*spatial, in, filters)``)."""
    return isinstance(layer, _CONVOLUTIONS) and not isinstance(layer, _OTHER_LAYOUTS)


def is_library_layer(layer):
    """True when ``type(layer)`` is Keras's or tfsparse's own class, not a subclass of one.

    Compaction rebuilds and folds layers by what their class computes; a
    subclass may compute otherwise (its own ``call``), so compaction leaves
    it as it is (opaque: cloned, its inputs and outputs kept whole).
    """
    return type(layer).__module__.split(".")[0] in ("tf_keras", "keras", "tfsparse")


def kernel_variable(layer):
    """The variable holding the kernel: ``values`` of a SparseDense, ``kernel`` otherwise."""
    return layer.values if isinstance(layer, SparseDense) else layer.kernel


def group_settings(layer):
    """``(kinds, block_shape)`` of the GroupLasso terms of the layer's kernel regulariser.

    Returns ``((), None)`` when the layer has no GroupLasso.
    """
    kinds, block_shape = [], None
    for term in group_lasso_terms(getattr(layer, "kernel_regularizer", None)):
        for kind in term.kinds:
            if kind not in kinds:
                kinds.append(kind)
        if term.block_shape is not None:
            block_shape = term.block_shape
    return tuple(kinds), block_shape


def group_norms_of(layer, kind, block_shape=None):
    """The group norms (a tensor) of the layer's kernel for one kind of group."""
    if isinstance(layer, SparseDense):
        pattern = layer.pattern_tensors()
        return group_norms.sparse_group_norms(
            layer.values, pattern.rows, pattern.cols, pattern.shape, kind, block_shape)
    if is_convolution(layer):
        return conv_norms.conv_group_norms(layer.kernel, kind, block_shape)
    return group_norms.dense_group_norms(layer.kernel, kind, block_shape)


def keep_mask_of(layer, kinds, threshold, block_shape=None):
    """The 0/1 mask (shape of :func:`kernel_variable`) keeping groups over ``threshold``."""
    if isinstance(layer, SparseDense):
        pattern = layer.pattern_tensors()
        return group_norms.sparse_keep_mask(
            layer.values, pattern.rows, pattern.cols, pattern.shape, kinds, threshold,
            block_shape)
    if is_convolution(layer):
        return conv_norms.conv_keep_mask(layer.kernel, kinds, threshold, block_shape)
    return group_norms.dense_keep_mask(layer.kernel, kinds, threshold, block_shape)


def regularized_layers(model):
    """The Dense, SparseDense and convolution layers of ``model`` with a GroupLasso.

    In layer order; layers of nested models are included. A GroupLasso on
    another kind of layer (a transposed or depthwise convolution, ...) is an
    error: its groups would not be what they say.
    """
    found = _layers_of(model)
    # A GroupLasso on a layer inside another layer (TimeDistributed,
    # Bidirectional, a custom layer's sublayers) would stay in the loss
    # with its groups never masked: refused, not skipped.
    handled = {id(layer) for layer in found}
    for layer in model.submodules:
        if (isinstance(layer, keras.layers.Layer) and id(layer) not in handled
                and group_settings(layer)[0]):
            raise ValueError(
                "FSSL supports GroupLasso on Dense, SparseDense and convolution layers that "
                "are layers of the model (or of a model nested in it). Received: layer "
                f"{layer.name!r} of type {type(layer).__name__} with a GroupLasso "
                "kernel_regularizer inside another layer (TimeDistributed, Bidirectional or "
                "a layer of its own)")
    return found


def _layers_of(model):
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found.extend(_layers_of(layer))
        elif not group_settings(layer)[0]:
            continue
        elif (is_fully_connected(layer) or is_convolution(layer)) and getattr(
                layer, "groups", 1) == 1:
            found.append(layer)
        else:
            grouped = (f", groups={layer.groups} (each filter reads its group's channels: "
                       "the channel groups would mix channels of different groups)"
                       if is_convolution(layer) else "")
            raise ValueError(
                "FSSL supports GroupLasso on Dense, SparseDense, Conv1D, Conv2D and Conv3D "
                "kernels (convolutions with groups=1). Received: layer "
                f"{layer.name!r} of type {type(layer).__name__}{grouped} with a GroupLasso "
                "kernel_regularizer")
    return found
