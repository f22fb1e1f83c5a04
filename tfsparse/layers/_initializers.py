"""Initializers for a sparse kernel's values vector."""

import tensorflow as tf

from tfsparse._keras import keras


def from_array(array):
    """An initializer that returns ``array`` (shape and all)."""

    def initializer(shape, dtype=None, **kwargs):
        return tf.constant(array, dtype=dtype, shape=shape)

    return initializer


def for_sparse_kernel(initializer, pattern):
    """Adapts a kernel initializer to the values vector of ``pattern``.

    Called with the 1-D shape ``(nnz,)``, a variance-scaling initializer
    (Glorot, He, LeCun, ...) would take ``nnz`` as both fan-in and fan-out.
    The variance it should have comes from the sparse fans: the mean number of
    nonzeros per unit (fan-in) and per input (fan-out). The scale is corrected
    so that the 1-D call gives exactly that variance. Other initializers are
    used as they are.
    """
    if not isinstance(initializer, keras.initializers.VarianceScaling):
        return initializer
    nnz = pattern.nnz
    input_dim, units = pattern.shape
    fan_in = nnz / units
    fan_out = nnz / input_dim
    mode = initializer.mode
    if mode == "fan_in":
        effective = fan_in
    elif mode == "fan_out":
        effective = fan_out
    else:
        effective = (fan_in + fan_out) / 2
    return keras.initializers.VarianceScaling(
        scale=initializer.scale * nnz / max(effective, 1e-12),
        mode=mode,
        distribution=initializer.distribution,
        seed=initializer.seed,
    )
