"""The one place where tfsparse touches TensorFlow's non-public modules.

TensorFlow's CSR sparse-matrix ops (``tf.raw_ops.SparseMatrixMatMul`` and
friends) are the fast sparse product on CPU and GPU, but their Python module is
not public API. Everything tfsparse needs from it, and from the SavedModel
internals, goes through this file, so a TensorFlow upgrade that moves them
breaks here, loudly, and ``tests/ops/test_tf_internal.py`` says so.
"""

import tensorflow as tf
from tensorflow.python.ops.linalg.sparse import (
    gen_sparse_csr_matrix_ops as _csr_ops,
)
from tensorflow.python.eager import record as _record
from tensorflow.python.ops import control_flow_util as _control_flow_util
from tensorflow.python.ops import gen_resource_variable_ops as _gen_resource_variable_ops
from tensorflow.python.ops import gradients_util as _gradients_util
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops
from tensorflow.python.saved_model import save_context as _save_context


def csr_from_sorted_coo(indices, values, dense_shape):
    """Builds a CSR matrix (a variant tensor) from row-major sorted COO parts.

    Args:
      indices: int64 tensor [nnz, 2] of (row, column), sorted row-major.
      values: tensor [nnz].
      dense_shape: int64 tensor [2].
    """
    return _csr_ops.sparse_tensor_to_csr_sparse_matrix(
        indices, values, dense_shape
    )


def csr_matmul(csr, dense, transpose_b=False, transpose_output=False):
    """``csr @ op(dense)``, optionally transposed on output."""
    return _csr_ops.sparse_matrix_mat_mul(
        csr,
        dense,
        transpose_b=transpose_b,
        transpose_output=transpose_output,
    )


def in_saved_model_export():
    """True while ``tf.saved_model.save`` traces functions for export."""
    return _save_context.in_save_context()


def gpu_visible():
    """True when TensorFlow sees a GPU (the compiled kernels are CPU only)."""
    return bool(tf.config.list_logical_devices("GPU"))


def in_xla_context():
    """True while tracing a function that XLA compiles (``jit_compile=True``)."""
    return _control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def gradient_may_be_recorded(tensors):
    """True when a gradient tape or forward accumulator watches any of ``tensors``.

    In eager execution an op whose inputs no tape watches can never be
    differentiated, so it needs no gradient function.
    """
    return _gradients_util.PossibleTapeGradientTypes(tensors) != 0


def read_untaped(variable):
    """``variable``'s value by one ``ReadVariableOp`` where nothing can record the read.

    That is: executing eagerly, with no gradient tape or forward accumulator
    active, and ``variable`` a plain ``tf.Variable`` read where it lives (not
    a Keras mixed-precision ``AutoCastVariable``, a distributed variable, or
    one with a caching device). Anywhere else ``variable`` itself is returned,
    to be read as usual. ``tf.convert_to_tensor(variable)`` runs the same op
    plus a tape's bookkeeping: about 30 us per variable in an eager call here,
    more than the sparse product itself at small batches.
    """
    if (type(variable) is _resource_variable_ops.ResourceVariable
            and variable._cached_value is None  # noqa: SLF001
            and variable._caching_device is None  # noqa: SLF001
            and tf.executing_eagerly() and not _record.could_possibly_record()):
        return _gen_resource_variable_ops.read_variable_op(variable.handle, variable.dtype)
    return variable
