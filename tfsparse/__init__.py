"""tfsparse: fast training of sparse deep neural networks with Keras.

Importing tfsparse makes Keras 2 (``tf_keras``) the Keras in use (see
``tfsparse._keras``). The public API, one name per line:
"""

from tfsparse._keras import keras  # noqa: F401  (selects tf_keras first)

from tfsparse import data
from tfsparse import fssl
from tfsparse import graphchallenge
from tfsparse import layers
from tfsparse import ops
from tfsparse import regularizers
from tfsparse.layers import SparseDense
from tfsparse.layers import sparsify

__version__ = "0.1.0"

__all__ = [
    "SparseDense",
    "data",
    "fssl",
    "graphchallenge",
    "keras",
    "layers",
    "ops",
    "regularizers",
    "sparsify",
]
