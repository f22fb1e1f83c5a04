"""GatherInputs: a fixed selection of input features (the inputs FSSL kept)."""

import numbers

import numpy as np
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse._keras import serializable
from tfsparse._validation import invalid_value
from tfsparse.ops import SparsityPattern
from tfsparse.ops import sparse_matmul
from tfsparse.ops.sddmm import use_compiled_kernels

_KERNEL_DTYPES = (tf.float32, tf.float64)


@serializable
class GatherInputs(keras.layers.Layer):
    """Keeps the input features at fixed ``indices``: ``x[:, indices]``.

    ``tfsparse.fssl.compact`` puts it in front of a compacted first ``Dense``
    layer whose kernel lost rows, so the compacted model still takes the
    original inputs.

    On CPU with tfsparse's compiled kernels, a 2-D float32/float64 input is
    selected by the SpMM kernel, as ``x @ S`` with ``S`` the 0/1 matrix that
    has one nonzero per column (at row ``indices[j]`` of column ``j``): the
    kernel reads ``x`` at those rows only, and one product by 1.0 is exact
    (except that ``-0.0`` comes out as ``0.0``). ``tf.gather`` along the last
    axis copies one float at a time and took 7x to 17x as long for 402 of 784
    inputs at batch 256 (``python benchmarks/fssl_gather.py``). Elsewhere (GPU,
    other dtypes or ranks, exported SavedModels, kernels not built) it is
    ``tf.gather``, so a SavedModel holds core TensorFlow ops only.

    Args:
        indices: non-empty sequence of distinct, non-negative ints.

    Example:
        >>> GatherInputs([2, 0])(np.array([[1.0, 2.0, 3.0]], "float32")).numpy()
        array([[3., 1.]], dtype=float32)
    """

    def __init__(self, indices, **kwargs):
        super().__init__(**kwargs)
        array = np.asarray(indices)
        # np.asarray([True, 0]) is [1, 0]: the booleans are looked for in
        # the sequence itself.
        booleans = array.dtype == bool or (
            isinstance(indices, (list, tuple))
            and any(isinstance(i, (bool, np.bool_)) for i in indices))
        if (
            booleans
            or array.ndim != 1
            or array.size == 0
            or not all(isinstance(i, numbers.Integral) for i in array.tolist())
            or array.min() < 0
            or np.unique(array).size != array.size
        ):
            raise invalid_value(
                "indices", "a non-empty 1-D sequence of distinct non-negative integers",
                indices,
            )
        self.indices = [int(i) for i in array]
        self._selection = None

    def build(self, input_shape):
        input_dim = tf.TensorShape(input_shape)[-1]
        if input_dim is not None and max(self.indices) >= input_dim:
            raise invalid_value(
                "indices", f"indices below the input dimension {input_dim}",
                received=f"max index {max(self.indices)}",
            )
        if input_dim is not None:
            # Column j of S holds its one nonzero at row indices[j]: sorted by column.
            self._selection = SparsityPattern(
                self.indices, np.arange(len(self.indices)), (input_dim, len(self.indices)))
        super().build(input_shape)

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if (
            self._selection is not None
            and inputs.shape.rank == 2
            and inputs.dtype in _KERNEL_DTYPES
            and use_compiled_kernels()
        ):
            ones = tf.ones([len(self.indices)], inputs.dtype)
            return sparse_matmul(inputs, ones, self._selection, use_kernel=True)
        return tf.gather(inputs, self.indices, axis=-1)

    def compute_output_shape(self, input_shape):
        return tf.TensorShape(input_shape)[:-1].concatenate(len(self.indices))

    def get_config(self):
        return {**super().get_config(), "indices": list(self.indices)}
