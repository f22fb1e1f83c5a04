"""FSSL structure surgery: remove the neurons group lasso zeroed, and report it.

Example:
  >>> from tfsparse._keras import keras
  >>> from tfsparse.fssl import compact
  >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
  ...                           keras.layers.Dense(2)])
  >>> kernel, bias = model.layers[0].get_weights()
  >>> kernel[:, 1] = 0.0  # neuron 1 of the first layer takes no input: removable
  >>> model.layers[0].set_weights([kernel, bias])
  >>> [layer.units for layer in compact(model).layers]
  [2, 2]
"""

from tfsparse.fssl.compact import DEFAULT_DENSE_THRESHOLD
from tfsparse.fssl.compact import LayerPlan
from tfsparse.fssl.compact import compact
from tfsparse.fssl.compact import kept_inputs
from tfsparse.fssl.compact import plan
from tfsparse.fssl.gather_inputs import GatherInputs
from tfsparse.fssl.report import format_table
from tfsparse.fssl.report import report

__all__ = [
    "DEFAULT_DENSE_THRESHOLD",
    "GatherInputs",
    "LayerPlan",
    "compact",
    "format_table",
    "kept_inputs",
    "plan",
    "report",
]
