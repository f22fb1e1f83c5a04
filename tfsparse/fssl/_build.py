"""Builds a compacted Dense or SparseDense layer from the original and its new kernel."""

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.regularizers import without_group_lasso

_SETTINGS = (
    "name", "dtype", "trainable", "activation", "kernel_initializer", "bias_initializer",
    "kernel_regularizer", "bias_regularizer", "activity_regularizer", "kernel_constraint",
    "bias_constraint",
)


def rebuilt(layer, configure=None, layer_type=None):
    """A new layer from ``layer``'s config, or a ValueError naming ``layer``.

    compact builds every layer of the new model from a config; a layer that
    cannot be rebuilt so (a custom layer without ``get_config``, an
    activation given as a lambda or an unregistered function) is refused by
    name.

    Args:
        layer: the original layer.
        configure: returns the config to build from (default: ``layer.get_config()``).
        layer_type: the class to build (default: ``layer``'s).
    """
    try:
        config = layer.get_config() if configure is None else configure()
        return (layer_type or type(layer)).from_config(config)
    except (NotImplementedError, TypeError, ValueError) as error:
        text = str(error).strip()
        # Keras's text starts with the whole config: its cause is what helps.
        text = text.split("Exception encountered:")[-1].strip()
        text = text.splitlines()[0] if text else ""
        raise ValueError(
            "compact rebuilds every layer of the new model from its config. Received: "
            f"layer {layer.name!r} of type {type(layer).__name__}, whose get_config/"
            f"from_config fails ({type(error).__name__}: "
            f"{text[:160] + ' ...' if len(text) > 160 else text}); give it a get_config, "
            "and register the custom objects it uses (an activation given as a lambda "
            "cannot be rebuilt: use a function registered with "
            "keras.saving.register_keras_serializable)"
        ) from None


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
    settings = {key: value for key, value in settings_without_group_lasso(layer).items()
                if key in _SETTINGS}
    units, use_bias, dtype = int(kernel.shape[1]), bias is not None, layer.dtype
    if to_dense:
        new = rebuilt(layer, lambda: {**settings, "units": units, "use_bias": use_bias},
                      keras.layers.Dense)
        new.build((None, kernel.shape[0]))
        new.kernel.assign(kernel.toarray().astype(dtype))
    else:
        new = rebuilt(layer, lambda: {**settings, "units": units, "use_bias": use_bias,
                                      "pattern": kernel.astype(dtype)}, SparseDense)
        new.build((None, kernel.shape[0]))
    if use_bias:
        new.bias.assign(bias.astype(dtype))
    return new
