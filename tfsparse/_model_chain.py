"""The layers of a Keras model that is a chain: each layer, once, consumes the
previous layer's output; the model's only input feeds the first, the last
one's output is the model's only output.

What runs a model layer by layer (PipelineStrategy's stages,
``tfsparse.partition.distribute``) computes that model exactly only then.
"""

from tfsparse._keras import keras
from tfsparse._validation import invalid_value


def chain_layers(model):
    """The layers of a Sequential model or a functional chain, in order.

    Raises:
      ValueError: naming ``model``, when it is not a chain (a subclassed
        model, whose computation its layers do not show, is not one).

    Example:
      >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
      ...                           keras.layers.Dense(1)])
      >>> [layer.units for layer in chain_layers(model)]
      [2, 1]
      >>> inputs = keras.Input((3,))
      >>> dense = keras.layers.Dense(3)
      >>> twice = keras.Model(inputs, dense(dense(inputs)))
      >>> chain_layers(twice)
      Traceback (most recent call last):
      ...
      ValueError: Received an invalid value for "model", expected a chain of ...
    """
    if not isinstance(model, keras.Model):
        raise invalid_value("model", "a tf_keras Model (Sequential or a functional "
                            "chain of layers)", type(model).__name__)
    layers = [layer for layer in model.layers
              if not isinstance(layer, keras.layers.InputLayer)]
    if not layers:
        raise invalid_value("model", "a model with at least one layer", model.name)
    chained = len({id(layer) for layer in layers}) == len(layers)
    if chained and not isinstance(model, keras.Sequential):
        try:
            inputs = [layer.input for layer in layers]
            outputs = [layer.output for layer in layers]
        except (AttributeError, ValueError, RuntimeError):  # several calls, or none
            inputs = outputs = None
        chained = (inputs is not None and len(model.inputs) == 1
                   and len(model.outputs) == 1
                   and inputs[0] is model.inputs[0]
                   and all(a is b for a, b in zip(inputs[1:], outputs[:-1]))
                   and outputs[-1] is model.outputs[0])
    if not chained:
        raise invalid_value("model", "a chain of single-input layers (each layer, called "
                            "once, consumes the previous layer's output; the last one's "
                            "is the model's only output)", model.name)
    return layers
