"""tfsparse: fast training of sparse deep neural networks with Keras.

Importing tfsparse makes Keras 2 (``tf_keras``) the Keras in use (see
``tfsparse._keras``). Subpackages that need optional components are imported
explicitly: ``tfsparse.horovod`` (Horovod), ``tfsparse.partition``
(Mt-KaHyPar, and Horovod for the distributed part) and ``tfsparse.distribute``.

Example:
  >>> import numpy as np
  >>> import tfsparse
  >>> model = tfsparse.keras.Sequential([
  ...     tfsparse.keras.Input((784,)),
  ...     tfsparse.SparseDense(64, density=0.1, seed=0, activation="relu"),
  ...     tfsparse.keras.layers.Dense(10)])
  >>> model(np.zeros((2, 784), "float32")).shape
  TensorShape([2, 10])
"""

from tfsparse._keras import keras  # noqa: F401  (selects tf_keras first)

from tfsparse import compression
from tfsparse import data
from tfsparse import dynamic
from tfsparse import export
from tfsparse import fssl
from tfsparse import graphchallenge
from tfsparse import layers
from tfsparse import ops
from tfsparse import regularizers
from tfsparse.layers import SparseConv2D
from tfsparse.layers import SparseDense
from tfsparse.layers import sparsify

__version__ = "0.1.0"

__all__ = [
    "SparseConv2D",
    "SparseDense",
    "compression",
    "data",
    "dynamic",
    "export",
    "fssl",
    "graphchallenge",
    "keras",
    "layers",
    "ops",
    "regularizers",
    "sparsify",
]
