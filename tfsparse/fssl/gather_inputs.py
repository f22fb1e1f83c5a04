"""GatherInputs: a fixed selection of input features (the inputs FSSL kept)."""

import numbers

import numpy as np
import tensorflow as tf

from tfsparse._keras import keras


@keras.saving.register_keras_serializable(package="tfsparse")
class GatherInputs(keras.layers.Layer):
    """Keeps the input features at fixed ``indices``: ``x[:, indices]``.

    ``tfsparse.fssl.compact`` puts it in front of a compacted first ``Dense``
    layer whose kernel lost rows, so the compacted model still takes the
    original inputs.

    Args:
        indices: non-empty sequence of distinct, non-negative ints.

    Example:
        >>> GatherInputs([2, 0])(np.array([[1.0, 2.0, 3.0]], "float32")).numpy()
        array([[3., 1.]], dtype=float32)
    """

    def __init__(self, indices, **kwargs):
        super().__init__(**kwargs)
        array = np.asarray(indices)
        if (
            array.ndim != 1
            or array.size == 0
            or not all(isinstance(i, numbers.Integral) for i in array.tolist())
            or array.min() < 0
            or np.unique(array).size != array.size
        ):
            raise ValueError(
                'Received an invalid value for "indices", expected a non-empty 1-D '
                f"sequence of distinct non-negative integers. Received: indices={indices!r}"
            )
        self.indices = [int(i) for i in array]

    def build(self, input_shape):
        input_dim = tf.TensorShape(input_shape)[-1]
        if input_dim is not None and max(self.indices) >= input_dim:
            raise ValueError(
                'Received an invalid value for "indices", expected indices below the '
                f"input dimension {input_dim}. Received: max index {max(self.indices)}"
            )
        super().build(input_shape)

    def call(self, inputs):
        return tf.gather(inputs, self.indices, axis=-1)

    def compute_output_shape(self, input_shape):
        return tf.TensorShape(input_shape)[:-1].concatenate(len(self.indices))

    def get_config(self):
        return {**super().get_config(), "indices": list(self.indices)}
