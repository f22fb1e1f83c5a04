"""Argument checks shared by the compressors, with Keras-style messages."""

import math
import numbers


def invalid_value(name, expected, value):
    """Returns the ValueError for argument `name` that should be `expected`."""
    return ValueError(
        f'Received an invalid value for "{name}", expected {expected}. '
        f"Received: {name}={value!r}"
    )


def check_fraction(name, value):
    """Checks that `value` is a real number in (0, 1] and returns it as a float."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or math.isnan(value)
        or not 0 < value <= 1
    ):
        raise invalid_value(name, "a float in (0, 1]", value)
    return float(value)


def check_positive_int(name, value, minimum=1):
    """Checks that `value` is an integer >= `minimum` and returns it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
    ):
        raise invalid_value(name, f"an integer >= {minimum}", value)
    return int(value)


def check_choice(name, value, choices):
    """Checks that `value` is one of `choices` and returns it."""
    if value not in choices:
        expected = "one of " + ", ".join(repr(c) for c in choices)
        raise invalid_value(name, expected, value)
    return value


def check_bool(name, value):
    """Checks that `value` is a Python bool and returns it."""
    if not isinstance(value, bool):
        raise invalid_value(name, "a bool", value)
    return value
