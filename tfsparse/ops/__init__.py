"""Sparse kernels: the pattern type, the sparse product and its gradient.

``tfsparse.ops._tf_internal`` is the only module that touches TensorFlow's
non-public CSR module; ``tfsparse.ops.kernels`` loads the optional compiled
kernels built by ``python -m tfsparse.ops.build``.
"""

from tfsparse.ops.matmul import sparse_matmul
from tfsparse.ops.pattern import SparsityPattern
from tfsparse.ops.sddmm import sddmm
from tfsparse.ops.kernels import available as kernels_available

__all__ = [
    "SparsityPattern",
    "kernels_available",
    "sddmm",
    "sparse_matmul",
]
