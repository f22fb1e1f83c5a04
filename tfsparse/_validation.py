"""The one builder of tfsparse's argument errors, and the checks made with it.

Every invalid argument in tfsparse is reported in Keras's words, naming the
argument, what was expected and what was received::

    Received an invalid value for "units", expected a positive integer. Received: units=0

The received value is shown as Python shows it (``repr``), so a string and a
number cannot be confused. When the value itself would not be readable (a
model, a large array), the message describes it instead (``received=...``).
"""

import math
import numbers

import numpy as np

_NOT_GIVEN = object()


def invalid_value(name, expected, value=_NOT_GIVEN, *, received=None):
    """Returns the ``ValueError`` for argument ``name`` that should be ``expected``.

    Args:
      name: the argument's name.
      expected: what it should be, worded to follow "expected"
        (``"a positive integer"``).
      value: the value received, shown as ``name=repr(value)``.
      received: instead of ``value``, a description of what was received
        (``"kernel with shape (6,)"``), for values whose repr is unreadable.

    Returns:
      The ``ValueError`` to raise.

    Example:
      >>> print(invalid_value("units", "a positive integer", 0))
      Received an invalid value for "units", expected a positive integer. Received: units=0
      >>> print(invalid_value("model", "a built model", received="an unbuilt model"))
      Received an invalid value for "model", expected a built model. Received: an unbuilt model
    """
    if (value is _NOT_GIVEN) == (received is None):
        raise TypeError("invalid_value takes exactly one of `value` and `received`.")
    shown = f"{name}={value!r}" if received is None else received
    return ValueError(
        f'Received an invalid value for "{name}", expected {expected}. Received: {shown}'
    )


def _is_integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and not math.isnan(value)
    )


def _checked(name, value, valid, expected, convert):
    if not valid:
        raise invalid_value(name, expected, value)
    return convert(value)


def check_positive_int(name, value):
    """Returns ``int(value)`` if it is an integer >= 1, else raises.

    Example:
      >>> check_positive_int("units", 8)
      8
    """
    return _checked(name, value, _is_integer(value) and value >= 1, "a positive integer", int)


def check_positive_pair(name, value):
    """``(a, b)`` of positive ints from an int or a pair of them (as Conv2D's
    ``kernel_size``, ``strides``, ``dilation_rate``), else raises.

    Example:
      >>> check_positive_pair("strides", 2)
      (2, 2)
    """
    pair = (value, value) if not isinstance(value, (tuple, list)) else tuple(value)
    if len(pair) != 2:
        raise invalid_value(name, "a positive integer or a pair of them", value)
    try:
        return tuple(check_positive_int(name, v) for v in pair)
    except ValueError:
        raise invalid_value(name, "a positive integer or a pair of them", value) from None


def check_non_negative_int(name, value):
    """Returns ``int(value)`` if it is an integer >= 0, else raises.

    Example:
      >>> check_non_negative_int("seed", 0)
      0
    """
    return _checked(name, value, _is_integer(value) and value >= 0, "a non-negative integer",
                    int)


def check_fraction(name, value):
    """Returns ``float(value)`` if it is a real number in (0, 1], else raises.

    Example:
      >>> check_fraction("ratio", 1)
      1.0
    """
    return _checked(name, value, _is_real(value) and 0 < value <= 1, "a float in (0, 1]", float)


def check_unit_interval(name, value):
    """Returns ``float(value)`` if it is a real number in [0, 1], else raises.

    Example:
      >>> check_unit_interval("drop_fraction", 0)
      0.0
    """
    return _checked(name, value, _is_real(value) and 0 <= value <= 1, "a float in [0, 1]", float)


def check_non_negative_float(name, value):
    """Returns ``float(value)`` if it is a finite real number >= 0, else raises.

    Example:
      >>> check_non_negative_float("threshold", 0)
      0.0
    """
    return _checked(name, value, _is_real(value) and 0 <= value < math.inf,
                    "a finite non-negative float", float)


def check_positive_float(name, value):
    """Returns ``float(value)`` if it is a finite real number > 0, else raises.

    Example:
      >>> check_positive_float("learning_rate", 1e-3)
      0.001
    """
    return _checked(name, value, _is_real(value) and 0 < value < math.inf,
                    "a finite positive float", float)


def check_open_fraction(name, value):
    """Returns ``float(value)`` if it is a real number in (0, 1), else raises.

    Example:
      >>> check_open_fraction("sparsity", 0.9)
      0.9
    """
    return _checked(name, value, _is_real(value) and 0 < value < 1, "a float in (0, 1)",
                    float)


def check_command_line(parser, args, checks):
    """Checks parsed options; a bad one ends the program with ``parser.error``.

    Args:
      parser: the ``argparse.ArgumentParser``.
      args: its parsed namespace.
      checks: ``{dest: check}``, each ``check(name, value)`` one of this
        module's ``check_*`` functions (None values are skipped: defaults
        the program fills in itself).

    Example:
      >>> import argparse
      >>> parser = argparse.ArgumentParser()
      >>> _ = parser.add_argument("--epochs", type=int, default=2)
      >>> check_command_line(parser, parser.parse_args([]), {"epochs": check_positive_int})
    """
    for name, check in checks.items():
        value = getattr(args, name)
        if value is None:
            continue
        try:
            check(name, value)
        except ValueError as error:
            parser.error(f"--{name.replace('_', '-')}: {error}")


def one_of(choices):
    """The expectation "one of" ``choices``, each shown as Python shows it.

    Example:
      >>> one_of(("rows", "columns"))
      "one of 'rows', 'columns'"
    """
    return "one of " + ", ".join(repr(choice) for choice in choices)


def check_choice(name, value, choices):
    """Returns ``value`` if it is one of ``choices`` (of the same type), else raises.

    Example:
      >>> check_choice("schedule", "gpipe", ("gpipe", "1f1b"))
      'gpipe'
    """
    choices = tuple(choices)
    if not any(type(value) is type(choice) and value == choice for choice in choices):
        raise invalid_value(name, one_of(choices), value)
    return value


def check_bool(name, value):
    """Returns ``value`` as a Python bool if it is a bool or NumPy's, else raises.

    Example:
      >>> check_bool("fused", True)
      True
    """
    return _checked(name, value, isinstance(value, (bool, np.bool_)), "a bool", bool)
