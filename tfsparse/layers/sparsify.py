"""sparsify(): turn a trained model's Dense layers into SparseDense layers."""

import scipy.sparse

from tfsparse._framework_internal import is_graph_network
from tfsparse._keras import keras
from tfsparse._validation import invalid_value
from tfsparse.layers.sparse_dense import SparseDense

_DENSE_SETTINGS = (
    "activation",
    "use_bias",
    "kernel_initializer",
    "bias_initializer",
    "kernel_regularizer",
    "bias_regularizer",
    "activity_regularizer",
    "kernel_constraint",
    "bias_constraint",
    "name",
    "dtype",
    "trainable",
)


def _is_pruning_wrapper(layer):
    return type(layer).__name__ == "PruneLowMagnitude"


def sparsify(model, max_density=None):
    """Returns a copy of ``model`` whose ``Dense`` layers are ``SparseDense``.

    Each converted layer keeps exactly the nonzero weights of the ``Dense``
    kernel as its pattern and values, and the layer's other settings, so the
    new model's outputs equal the original's. This is the bridge from
    tensorflow-model-optimization: prune with ``prune_low_magnitude``, call
    ``strip_pruning``, then ``sparsify``.

    Args:
      model: a built ``tf_keras`` Sequential or functional model.
      max_density: convert only Dense layers whose kernel density is at most
        this (others stay Dense). ``None`` converts every Dense layer.

    Returns:
      A new model with the same weights; ``model`` is unchanged.

    Example:
      >>> import numpy as np
      >>> from tfsparse._keras import keras
      >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
      >>> kernel, bias = model.layers[0].get_weights()
      >>> kernel[np.abs(kernel) < 0.3] = 0
      >>> model.layers[0].set_weights([kernel, bias])
      >>> type(sparsify(model).layers[0]).__name__
      'SparseDense'
    """
    if not isinstance(model, keras.Model):
        raise invalid_value("model", "a tf_keras Model",
                            received=f"model of type {type(model).__name__}")
    if max_density is not None and not 0 < max_density <= 1:
        raise invalid_value("max_density", "None or a float in (0, 1]", max_density)
    if not (isinstance(model, keras.Sequential) or is_graph_network(model)):
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
    for layer in model.layers:
        if _is_pruning_wrapper(layer):
            raise ValueError(
                f"Layer {layer.name!r} is still wrapped for pruning: call "
                "tfmot.sparsity.keras.strip_pruning(model) before sparsify(model)."
            )
    converted = {}

    def clone(layer):
        if type(layer) is keras.layers.Dense and _should_convert(layer, max_density):
            sparse = _to_sparse_dense(layer)
            converted[layer.name] = sparse
            return sparse
        return layer.__class__.from_config(layer.get_config())

    new_model = keras.models.clone_model(model, clone_function=clone)
    for layer in model.layers:
        if layer.name in converted or not layer.weights:
            continue
        new_model.get_layer(layer.name).set_weights(layer.get_weights())
    return new_model


def _should_convert(layer, max_density):
    if max_density is None:
        return True
    kernel = layer.kernel.numpy()
    return (kernel != 0).mean() <= max_density


def _to_sparse_dense(layer):
    kernel = layer.kernel.numpy()
    if kernel.ndim != 2:
        raise ValueError(
            f"Dense layer {layer.name!r} has a kernel of shape {kernel.shape}; "
            "only 2-D kernels convert."
        )
    config = layer.get_config()
    settings = {key: config[key] for key in _DENSE_SETTINGS if key in config}
    sparse = SparseDense(
        config["units"], pattern=scipy.sparse.csr_matrix(kernel), **settings
    )
    sparse.build((None, kernel.shape[0]))
    if layer.use_bias:
        sparse.bias.assign(layer.bias)
    return sparse
