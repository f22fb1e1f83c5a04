"""Sparse products traced with TFLite builtin ops only, for TFLite conversion.

TFLite has no CSR op and cannot run tfsparse's compiled kernels, so
``tf.lite.TFLiteConverter`` rejects the graphs ``sparse_matmul`` normally
traces. Inside ``tflite_compatible()`` it traces a gather-and-sum form
(``tfsparse.ops._gather_products``) instead: TFLite builtins only, exact, and
with the layer's nonzeros stored as they are; or, with
``fully_connected=True``, a ``MatMul`` with the kernel as a dense constant.
"""

import contextlib
import threading

import numpy as np
import tensorflow as tf

from tfsparse._validation import check_bool
from tfsparse._validation import invalid_value
from tfsparse.ops import _gather_products

# The padded form computes units * fan_in products per input row against the
# segment sum's nnz, and runs several times faster per product in the TFLite
# interpreter (benchmarks/tflite_latency.py --forms): it wins while padding at
# most doubles the work.
_MAX_PADDING_FACTOR = 2.0

# The input widths TFLite's sparse FULLY_CONNECTED kernel computes exactly:
# multiples of it (_dense_constant_product).
_SPARSE_FULLY_CONNECTED_BLOCK = 4

# Protocol buffers (a GraphDef) and flatbuffers (a TFLite file) hold < 2 GiB.
_MAX_CONSTANT_BYTES = 2**31

_scope = threading.local()


@contextlib.contextmanager
def tflite_compatible(fully_connected=False):
    """Traces sparse products with TFLite builtin ops while the scope is open.

    Functions traced inside the scope, by ``tf.lite.TFLiteConverter`` (which
    saves Keras models as SavedModels first) or by ``tf.saved_model.save``,
    compute ``SparseDense`` products with ``GATHER``, ``RESHAPE``, ``MUL``,
    ``SUM`` and ``TRANSPOSE`` (or ``UNSORTED_SEGMENT_SUM`` for patterns whose
    units have very uneven fan-in), which TFLite runs without Flex ops. The
    pattern is read when the function is traced (it is fixed, as the
    converter's frozen weights are); the values stay variables, so gradients
    are exact too. Already traced functions are not changed.

    Args:
      fully_connected: ``True`` to trace each product as a ``MatMul`` with
        the kernel (zeros included) as a constant read at trace time instead,
        which TFLite converts to ``FULLY_CONNECTED``. The kernel must be under
        2 GiB dense, and the graph has no gradient with respect to the
        values. ``tfsparse.export.to_tflite(model, fully_connected=True)``
        also has the converter store the kernel sparse.

    Example:
      >>> import numpy as np, tensorflow as tf
      >>> from tfsparse.ops import SparsityPattern, sparse_matmul
      >>> pattern = SparsityPattern.random((6, 4), 0.5, seed=0)
      >>> values = np.ones(pattern.nnz, "float32")
      >>> f = tf.function(lambda x: sparse_matmul(x, values, pattern))
      >>> with tflite_compatible():
      ...     graph = f.get_concrete_function(tf.TensorSpec([None, 6])).graph
      >>> sorted({op.type for op in graph.get_operations()} & {"GatherV2", "Sum"})
      ['GatherV2', 'Sum']
    """
    fully_connected = check_bool("fully_connected", fully_connected)
    previous = (in_tflite_compatible_scope(), getattr(_scope, "fully_connected", False))
    _scope.active, _scope.fully_connected = True, fully_connected
    try:
        yield
    finally:
        _scope.active, _scope.fully_connected = previous


def in_tflite_compatible_scope():
    """True inside ``tflite_compatible()`` (in this thread)."""
    return getattr(_scope, "active", False)


def builtin_ops_product(x, values, pattern, bias=None):
    """``x @ W (+ bias)`` with TFLite builtin ops, for a pattern known at trace time.

    Args:
      x: float tensor ``[batch, input_dim]``.
      values: float tensor ``[nnz]``, the nonzeros in pattern order.
      pattern: a ``SparsityPattern``, or an object with ``rows``, ``cols``
        and ``shape`` whose index arrays are NumPy arrays, constants or
        variables (read now: the exported graph holds them as constants).
      bias: optional float tensor ``[units]``.
    """
    rows = _value_at_trace_time(pattern.rows, "pattern.rows")
    cols = _value_at_trace_time(pattern.cols, "pattern.cols")
    shape = tuple(int(s) for s in pattern.shape)
    if getattr(_scope, "fully_connected", False):
        return _dense_constant_product(x, values, rows, cols, shape, bias)
    layout = _gather_products.PaddedColumns(rows, cols, shape)
    if layout.slots <= _MAX_PADDING_FACTOR * max(1, rows.size):
        return _gather_products.padded_columns_product(x, values, layout, bias)
    return _gather_products.segment_sum_product(
        x, values, tf.constant(rows, tf.int32), tf.constant(cols, tf.int32), shape[1], bias
    )


def _dense_constant_product(x, values, rows, cols, shape, bias):
    size = shape[0] * shape[1] * x.dtype.size
    if size >= _MAX_CONSTANT_BYTES:
        raise invalid_value(
            "fully_connected", f"False for a layer whose dense kernel ({shape[0]} x {shape[1]} "
            f"{x.dtype.name}, {size / 2**30:.1f} GiB) does not fit the 2 GiB a graph or a TFLite "
            "file holds", True)
    # Input rows padded with zeros to a multiple of 4: TFLite's sparse
    # FULLY_CONNECTED kernel (the kernel stored sparse, `to_tflite`) gave
    # wrong sums for units reading the last inputs of a width that is not
    # one (TensorFlow 2.21: errors up to 61 on a 50 x 20 kernel); zero rows
    # and zero inputs add nothing, so the product is exact.
    padding = -shape[0] % _SPARSE_FULLY_CONNECTED_BLOCK
    kernel = np.zeros((shape[0] + padding, shape[1]), x.dtype.as_numpy_dtype)
    kernel[rows, cols] = _value_at_trace_time(values, "values")
    if padding:
        x = tf.pad(x, [[0, 0], [0, padding]])
    y = tf.matmul(x, kernel)
    return y if bias is None else tf.nn.bias_add(y, bias)


def _value_at_trace_time(array, name):
    if isinstance(array, tf.Variable):
        with tf.init_scope():  # out of the function being traced, to eager
            return array.numpy()
    if tf.is_tensor(array):
        value = tf.get_static_value(array)
        if value is None:
            raise invalid_value(
                name, "an array known when the function is traced (a NumPy array, a constant "
                "or a variable) inside tfsparse.export.tflite_compatible()", array)
        return np.asarray(value)
    return np.asarray(array)
