"""Builds a compacted Dense or SparseDense layer from the original and its new kernel."""

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.regularizers import without_group_lasso

_SETTINGS = (
    "name", "dtype", "trainable", "activation", "kernel_initializer", "bias_initializer",
    "kernel_regularizer", "bias_regularizer", "activity_regularizer", "kernel_constraint",
    "bias_constraint",
)


def settings_without_group_lasso(layer):
    """The layer's config with the GroupLasso terms of its kernel regulariser dropped.

    The FSSL phase is over: the compacted layer keeps its other regularisers only.
    """
    config = layer.get_config()
    config["kernel_regularizer"] = keras.regularizers.serialize(
        without_group_lasso(layer.kernel_regularizer))
    return config


def fully_connected(layer, kernel, bias, to_dense):
    """A built ``Dense`` (``to_dense``) or ``SparseDense`` with ``layer``'s settings.

    Args:
        layer: the original Dense or SparseDense layer.
        kernel: the new kernel, a ``scipy.sparse`` matrix ``(inputs, units)``.
        bias: the new bias (array) or None for no bias.
        to_dense: build a Dense layer rather than a SparseDense.
    """
    config = settings_without_group_lasso(layer)
    settings = {key: config[key] for key in _SETTINGS if key in config}
    units, use_bias, dtype = int(kernel.shape[1]), bias is not None, layer.dtype
    if to_dense:
        new = keras.layers.Dense.from_config({**settings, "units": units, "use_bias": use_bias})
        new.build((None, kernel.shape[0]))
        new.kernel.assign(kernel.toarray().astype(dtype))
    else:
        new = SparseDense(units, pattern=kernel.astype(dtype), use_bias=use_bias, **settings)
        new.build((None, kernel.shape[0]))
    if use_bias:
        new.bias.assign(bias.astype(dtype))
    return new
