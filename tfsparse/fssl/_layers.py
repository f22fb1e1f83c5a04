"""Thin adapters from Keras layers to the group-norm math (Dense and SparseDense)."""

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.regularizers import group_lasso_terms
from tfsparse.regularizers import group_norms


def is_fully_connected(layer):
    """True for a ``Dense`` (2-D kernel) or ``SparseDense`` layer."""
    return isinstance(layer, SparseDense) or isinstance(layer, keras.layers.Dense)


def kernel_variable(layer):
    """The variable holding the kernel: ``values`` of a SparseDense, ``kernel`` of a Dense."""
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
    return group_norms.dense_group_norms(layer.kernel, kind, block_shape)


def keep_mask_of(layer, kinds, threshold, block_shape=None):
    """The 0/1 mask (shape of :func:`kernel_variable`) keeping groups over ``threshold``."""
    if isinstance(layer, SparseDense):
        pattern = layer.pattern_tensors()
        return group_norms.sparse_keep_mask(
            layer.values, pattern.rows, pattern.cols, pattern.shape, kinds, threshold,
            block_shape)
    return group_norms.dense_keep_mask(layer.kernel, kinds, threshold, block_shape)


def regularized_layers(model):
    """The fully connected layers of ``model`` with a GroupLasso, in layer order.

    Layers of nested models are included.
    """
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found.extend(regularized_layers(layer))
        elif is_fully_connected(layer) and group_settings(layer)[0]:
            found.append(layer)
    return found
