"""Sparse kernels: the pattern type, the sparse product and its gradient.

``tfsparse.ops._tf_internal`` is the only module that touches TensorFlow's
non-public CSR module; ``tfsparse.ops.kernels`` loads the optional compiled
kernels built by ``python -m tfsparse.ops.build``.

Example:
  >>> import numpy as np
  >>> import scipy.sparse
  >>> from tfsparse.ops import SparsityPattern, sparse_matmul
  >>> kernel = scipy.sparse.random(5, 3, density=0.4, random_state=0, format="csr")
  >>> pattern, values = SparsityPattern.from_scipy(kernel)
  >>> x = np.ones((2, 5), "float32")
  >>> y = sparse_matmul(x, values.astype("float32"), pattern)
  >>> np.allclose(y, x @ kernel.toarray())
  True
"""

from tfsparse.ops import _second_order  # noqa: F401  (registers the ops' own gradients)
from tfsparse.ops.conv import sparse_conv2d
from tfsparse.ops.matmul import sparse_matmul
from tfsparse.ops.pattern import SparsityPattern
from tfsparse.ops.sddmm import sddmm
from tfsparse.ops.kernels import available as kernels_available

__all__ = [
    "SparsityPattern",
    "kernels_available",
    "sddmm",
    "sparse_conv2d",
    "sparse_matmul",
]
