"""Sparse Keras layers and the Dense-to-sparse converter."""

from tfsparse.layers.sparse_dense import PatternTensors
from tfsparse.layers.sparse_dense import SparseDense
from tfsparse.layers.sparsify import sparsify

__all__ = [
    "PatternTensors",
    "SparseDense",
    "sparsify",
]
