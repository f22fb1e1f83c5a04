"""What travels between ranks: payload sizes, and row-sparse gradients rebuilt from payloads."""

import tensorflow as tf

from tfsparse.compression.base import INDEX_DTYPE

#: Bytes of one index of a compressed payload (int32).
INDEX_BYTES = 4


def count(tensor):
    """The number of elements of `tensor`, as a float64 scalar."""
    return tf.cast(tf.size(tensor), tf.float64)


def payload_bytes(values, indices):
    """Bytes of a compressed payload: its values and int32 indices."""
    return count(values) * values.dtype.size + count(indices) * INDEX_BYTES


def dense_payload_bytes(gradient):
    """Bytes of what `hvd.allreduce` takes: a tensor, or an IndexedSlices' values and indices."""
    if isinstance(gradient, tf.IndexedSlices):
        return (count(gradient.values) * gradient.values.dtype.size
                + count(gradient.indices) * gradient.indices.dtype.size)
    return count(gradient) * gradient.dtype.size


def slices_from_payload(values, indices, shape):
    """The ``tf.IndexedSlices`` of a scatter-add of ``values`` at flat int32 ``indices``.

    ``indices`` are positions in the flattened variable of `shape`; the result
    holds one row per distinct row they touch (duplicates add up), so it equals
    the dense scatter-add wherever it has rows and is zero elsewhere.

    Example:
        >>> import tensorflow as tf
        >>> slices = slices_from_payload(tf.constant([1.0, 2.0, 3.0]),
        ...                              tf.constant([5, 0, 4]), tf.TensorShape([3, 2]))
        >>> slices.indices.numpy().tolist(), slices.values.numpy().tolist()
        ([2, 0], [[3.0, 1.0], [2.0, 0.0]])
    """
    shape = tf.TensorShape(shape)
    row_size = shape[1:].num_elements()
    rows, slot = tf.unique(indices // row_size)
    within = tf.stack([slot, indices % row_size], axis=1)
    summed = tf.scatter_nd(within, values, tf.stack([tf.size(rows), row_size]))
    return tf.IndexedSlices(tf.reshape(summed, [-1] + shape[1:].as_list()), rows,
                            tf.constant(shape.as_list(), INDEX_DTYPE))
