"""Sparse Keras layers and the Dense/Conv2D-to-sparse converter.

Example:
  >>> import numpy as np
  >>> from tfsparse._keras import keras
  >>> from tfsparse.layers import sparsify
  >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
  >>> kernel, bias = model.layers[0].get_weights()
  >>> kernel[np.abs(kernel) < 0.3] = 0
  >>> model.layers[0].set_weights([kernel, bias])
  >>> sparse = sparsify(model)
  >>> x = np.ones((2, 8), "float32")
  >>> np.allclose(sparse(x), model(x), atol=1e-6)
  True
"""

from tfsparse.layers._conversion import CROSSOVER_DENSITY
from tfsparse.layers._conversion import DEFAULT_MAX_DENSITY
from tfsparse.layers.sparse_conv import SparseConv2D
from tfsparse.layers.sparse_dense import PatternTensors
from tfsparse.layers.sparse_dense import SparseDense
from tfsparse.layers.sparsify import sparsify
from tfsparse.layers.sparsify_report import SparsifyReport
from tfsparse.layers.sparsify_report import SparsifyRow

__all__ = [
    "CROSSOVER_DENSITY",
    "DEFAULT_MAX_DENSITY",
    "PatternTensors",
    "SparseConv2D",
    "SparseDense",
    "SparsifyReport",
    "SparsifyRow",
    "sparsify",
]
