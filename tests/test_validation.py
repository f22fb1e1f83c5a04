"""The one builder of argument errors, and the checks made with it."""

import ast
import pathlib

import numpy as np
import pytest

from tfsparse import _validation

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _message(name, expected, received):
    return f'Received an invalid value for "{name}", expected {expected}. Received: {received}'


def test_message_shows_the_value_as_python_shows_it():
    assert str(_validation.invalid_value("units", "a positive integer", 0)) == _message(
        "units", "a positive integer", "units=0")
    assert str(_validation.invalid_value("groups", "a kind", "rows")) == _message(
        "groups", "a kind", "groups='rows'")
    assert str(_validation.invalid_value("block_shape", "a pair", None)) == _message(
        "block_shape", "a pair", "block_shape=None")


def test_message_can_describe_what_was_received_instead():
    error = _validation.invalid_value("kernel", "a 2-D tensor", received="kernel with shape (4,)")
    assert isinstance(error, ValueError)
    assert str(error) == _message("kernel", "a 2-D tensor", "kernel with shape (4,)")


@pytest.mark.parametrize("kwargs", [{}, {"value": 1, "received": "one"}])
def test_builder_takes_exactly_one_of_value_and_description(kwargs):
    with pytest.raises(TypeError, match="exactly one of `value` and `received`"):
        _validation.invalid_value("units", "a positive integer", **kwargs)


@pytest.mark.parametrize("check,good,bad,expected", [
    (_validation.check_positive_int, [1, np.int64(7)], [0, -1, 1.0, True, "2", None],
     "a positive integer"),
    (_validation.check_non_negative_int, [0, np.int32(3)], [-1, 0.5, False, None],
     "a non-negative integer"),
    (_validation.check_fraction, [1, 0.25, np.float32(0.5)], [0, 1.5, float("nan"), True, "0.5"],
     "a float in (0, 1]"),
    (_validation.check_non_negative_float, [0, 2.5], [-0.1, float("inf"), float("nan"), True, None],
     "a finite non-negative float"),
    (_validation.check_bool, [True, False, np.True_], [1, 0, None, "yes"], "a bool"),
])
def test_checks_accept_good_values_and_name_bad_ones(check, good, bad, expected):
    for value in good:
        assert check("x", value) == value
    for value in bad:
        with pytest.raises(ValueError) as info:
            check("x", value)
        assert str(info.value) == _message("x", expected, f"x={value!r}")


def test_checks_return_the_plain_python_type():
    assert type(_validation.check_positive_int("n", np.int64(3))) is int
    assert type(_validation.check_fraction("r", 1)) is float
    assert type(_validation.check_non_negative_float("l", 2)) is float


def test_choice_lists_the_choices_and_requires_their_type():
    choices = ("gpipe", "1f1b")
    assert _validation.check_choice("schedule", "1f1b", choices) == "1f1b"
    assert _validation.check_choice("verbose", 1, (0, 1)) == 1
    for bad in ("zb-v", None, ["gpipe"]):
        with pytest.raises(ValueError) as info:
            _validation.check_choice("schedule", bad, choices)
        assert str(info.value) == _message(
            "schedule", "one of 'gpipe', '1f1b'", f"schedule={bad!r}")
    with pytest.raises(ValueError, match=r"Received: verbose=True$"):
        _validation.check_choice("verbose", True, (0, 1))  # True == 1, but not an int choice


def _raised_value_errors_with_keras_wording(path):
    """(line, text) of the string constants in `path` that start a Keras-style message."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("Received an invalid value"):
                yield node.lineno, node.value


def test_no_module_writes_the_message_itself():
    # One builder, one format: a message written by hand elsewhere drifts apart.
    sources = [path for folder in ("tfsparse", "callbacks")
               for path in sorted((ROOT / folder).rglob("*.py"))]
    assert len(sources) > 50
    builder = ROOT / "tfsparse" / "_validation.py"
    handwritten = [f"{path.relative_to(ROOT)}:{line}"
                   for path in sources if path != builder
                   for line, _ in _raised_value_errors_with_keras_wording(path)]
    assert handwritten == []
