"""Constructor arguments SparseDense and SparseConv2D share, checked once.

Both layers take Dense's and Conv2D's own arguments (activation, bias,
initializers, regularizers, constraints) plus a sparsity pattern given as a
``density`` with a ``seed``, or as explicit positions.
"""

import numpy as np

from tfsparse._keras import keras
from tfsparse._validation import check_fraction
from tfsparse._validation import check_non_negative_int
from tfsparse._validation import invalid_value

DEFAULT_DENSITY = 0.05


def density_setting(density, pattern):
    """Returns the density a random pattern is drawn at, or None with ``pattern``.

    Example:
      >>> density_setting(None, None)
      0.05
    """
    if pattern is not None:
        if density is not None:
            raise invalid_value(
                "density", "None when a pattern is given (the pattern sets it)", density)
        return None
    return check_fraction("density", DEFAULT_DENSITY if density is None else density)


def pattern_seed(seed):
    """Returns ``seed`` checked, or for None one drawn from NumPy's generator.

    NumPy's global generator is the one ``keras.utils.set_random_seed``
    seeds: seeded scripts build the same patterns, as Dense draws the same
    kernels.

    Example:
      >>> pattern_seed(7)
      7
    """
    if seed is None:
        seed = int(np.random.randint(0, 2**31 - 1))
    return check_non_negative_int("seed", seed)


_AXIS_CONSTRAINTS = (keras.constraints.MaxNorm, keras.constraints.MinMaxNorm,
                     keras.constraints.UnitNorm, keras.constraints.RadialConstraint)


def set_kernel_arguments(layer, activation, use_bias, kernel_initializer, bias_initializer,
                         kernel_regularizer, bias_regularizer, kernel_constraint,
                         bias_constraint):
    """Sets Dense's activation, bias, initializer, regularizer and constraint attributes.

    Example:
      >>> class Holder:
      ...     pass
      >>> holder = Holder()
      >>> set_kernel_arguments(holder, "relu", True, "zeros", "zeros", None, None, None, None)
      >>> holder.activation.__name__, holder.use_bias
      ('relu', True)
    """
    layer.activation = keras.activations.get(activation)
    layer.use_bias = bool(use_bias)
    layer.kernel_initializer = keras.initializers.get(kernel_initializer)
    layer.bias_initializer = keras.initializers.get(bias_initializer)
    layer.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
    layer.bias_regularizer = keras.regularizers.get(bias_regularizer)
    layer.kernel_constraint = keras.constraints.get(kernel_constraint)
    if isinstance(layer.kernel_constraint, _AXIS_CONSTRAINTS):
        # Applied to the vector of nonzeros, a norm over axes became one norm
        # over all of them (MaxNorm(1): column norms 0.26-0.73 where Dense's
        # are 0.66-1), or failed inside the optimizer for a conv's axes.
        raise invalid_value(
            "kernel_constraint",
            "a constraint of the nonzeros one by one (keras.constraints.NonNeg, or a "
            "callable on the vector of nonzeros): norm constraints over kernel axes "
            "(MaxNorm, MinMaxNorm, UnitNorm, RadialConstraint) are not computed over a "
            "sparse kernel's nonzeros",
            layer.kernel_constraint)
    layer.bias_constraint = keras.constraints.get(bias_constraint)
