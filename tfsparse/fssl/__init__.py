"""FSSL structure surgery: remove the neurons and channels group lasso zeroed, and report it."""

from tfsparse.fssl.compact import DEFAULT_DENSE_THRESHOLD
from tfsparse.fssl.compact import LayerPlan
from tfsparse.fssl.compact import compact
from tfsparse.fssl.compact import kept_inputs
from tfsparse.fssl.compact import plan
from tfsparse.fssl.functional import intact_layers
from tfsparse.fssl.gather_inputs import GatherInputs
from tfsparse.fssl.report import format_table
from tfsparse.fssl.report import report

__all__ = [
    "DEFAULT_DENSE_THRESHOLD",
    "GatherInputs",
    "LayerPlan",
    "compact",
    "format_table",
    "intact_layers",
    "kept_inputs",
    "plan",
    "report",
]
