"""Dynamic sparse training: patterns that move during training (SET, RigL).

The math is here, in plain functions; ``callbacks.DynamicSparsity`` drives
it from ``model.fit``.

Example:
    >>> from tfsparse import dynamic
    >>> round(dynamic.drop_fraction_at(25, 0.3, 100), 4)
    0.2561
"""

from tfsparse.dynamic.gradient import largest_conv_gradient_keys
from tfsparse.dynamic.gradient import largest_gradient_keys
from tfsparse.dynamic.gradient import layer_gradients
from tfsparse.dynamic.schedule import drop_fraction_at
from tfsparse.dynamic.schedule import erk_densities
from tfsparse.dynamic.step_gradients import StepGradients
from tfsparse.dynamic.update import drop_and_grow

__all__ = [
    "StepGradients",
    "drop_and_grow",
    "drop_fraction_at",
    "erk_densities",
    "largest_conv_gradient_keys",
    "largest_gradient_keys",
    "layer_gradients",
]
