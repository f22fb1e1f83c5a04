"""``x @ K`` for a sparse ``K`` with gathers and sums only (XLA and TFLite builtins).

Two forms, both exact and built from ops that XLA compiles and that TFLite
has as builtins (``GATHER``, ``RESHAPE``, ``MUL``, ``SUM``, ``TRANSPOSE``,
``UNSORTED_SEGMENT_SUM``):

- ``segment_sum_product``: each nonzero's products, summed per output unit.
  Its work and memory are proportional to the number of nonzeros.
- ``padded_columns_product``: every output unit's inputs gathered into a
  ``[units, fan_in, batch]`` block and reduced over ``fan_in``. Units with
  fewer nonzeros than the largest fan-in read an appended zero row with a
  zero weight (``0 * 0``, so no input, not even ``inf``, leaks into them).
  Contiguous rows of ``x^T`` are gathered, which the TFLite interpreter does
  several times faster than the segment sum
  (``python benchmarks/tflite_latency.py --forms``).
"""

import numpy as np
import tensorflow as tf


def segment_sum_product(x, values, rows, cols, units, bias=None):
    """``x @ K (+ bias)`` for ``K`` with ``values`` at ``(rows, cols)``, ``units`` columns."""
    products = tf.gather(x, rows, axis=1) * values  # [batch, nnz]
    y = tf.transpose(tf.math.unsorted_segment_sum(tf.transpose(products), cols, units))
    return y if bias is None else tf.nn.bias_add(y, bias)


class PaddedColumns:
    """Where each nonzero sits in a ``[units, fan_in]`` block, one row per unit.

    Args:
      rows, cols: integer arrays ``[nnz]``, the input and output index of
        each nonzero, in any order.
      shape: ``(input_dim, units)``.

    Attributes:
      fan_in: the largest number of nonzeros of a unit (at least 1).
      input_rows: int32 ``[units * fan_in]``, the input each slot reads;
        ``input_dim`` (a zero row) for a padding slot.
      value_index: int32 ``[units * fan_in]``, the nonzero in each slot;
        ``nnz`` (a zero value) for a padding slot.
      padded: whether any slot is padding.

    Example:
      >>> layout = PaddedColumns([0, 2, 1], [0, 0, 1], (3, 2))
      >>> layout.fan_in, layout.input_rows.tolist(), layout.value_index.tolist()
      (2, [0, 2, 1, 3], [0, 1, 2, 3])
    """

    def __init__(self, rows, cols, shape):
        rows = np.asarray(rows, np.int64)
        cols = np.asarray(cols, np.int64)
        input_dim, units = (int(s) for s in shape)
        order = np.argsort(cols, kind="stable")
        counts = np.bincount(cols, minlength=units)
        self.fan_in = max(1, int(counts.max(initial=0)))
        starts = np.cumsum(counts) - counts
        slots = cols[order] * self.fan_in + (np.arange(rows.size) - starts[cols[order]])
        self.input_rows = np.full(units * self.fan_in, input_dim, np.int32)
        self.input_rows[slots] = rows[order]
        self.value_index = np.full(units * self.fan_in, rows.size, np.int32)
        self.value_index[slots] = order
        self.padded = bool(units * self.fan_in != rows.size)
        self.shape = (input_dim, units)

    @property
    def slots(self):
        """``units * fan_in``: the products computed per input row."""
        return self.shape[1] * self.fan_in


def padded_columns_product(x, values, layout, bias=None):
    """``x @ K (+ bias)`` on a ``PaddedColumns`` layout of ``K``'s nonzeros.

    Args:
      x: float tensor ``[batch, input_dim]``.
      values: float tensor ``[nnz]``, in the order of the ``rows`` and
        ``cols`` the layout was built from.
      layout: a ``PaddedColumns``.
      bias: optional float tensor ``[units]``.

    Returns:
      A tensor ``[batch, units]``.

    Example:
      >>> import numpy as np
      >>> layout = PaddedColumns([0, 2, 1], [0, 0, 1], (3, 2))
      >>> y = padded_columns_product(np.array([[1., 2., 3.]], "float32"),
      ...                            np.array([1., 10., 100.], "float32"), layout)
      >>> y.numpy().tolist()
      [[31.0, 200.0]]
    """
    x = tf.convert_to_tensor(x)
    values = tf.convert_to_tensor(values, dtype=x.dtype)
    input_dim, units = layout.shape
    x_t = tf.transpose(x)  # [input_dim, batch]: each gathered row is contiguous
    if layout.padded:
        x_t = tf.pad(x_t, [[0, 1], [0, 0]])  # row input_dim reads zeros
        values = tf.concat([values, tf.zeros([1], values.dtype)], axis=0)
        values = tf.gather(values, layout.value_index)
    elif not np.array_equal(layout.value_index, np.arange(layout.slots)):
        values = tf.gather(values, layout.value_index)
    gathered = tf.reshape(tf.gather(x_t, layout.input_rows), [units, layout.fan_in, -1])
    weights = tf.reshape(values, [units, layout.fan_in, 1])
    y = tf.transpose(tf.reduce_sum(gathered * weights, axis=1))  # [batch, units]
    return y if bias is None else tf.nn.bias_add(y, bias)
