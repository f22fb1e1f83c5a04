"""Keras-style argument errors shared by the pipeline modules."""

import numbers


def invalid(name, expected, received):
    """A ``ValueError`` naming the argument, what was expected and what came."""
    return ValueError(
        f'Received an invalid value for "{name}", expected {expected}. '
        f"Received: {name}={received!r}"
    )


def check_positive_int(name, value, minimum=1):
    """Returns ``int(value)`` or raises ``invalid`` for a non-integer or one < minimum."""
    if (
        not isinstance(value, numbers.Integral)
        or isinstance(value, bool)
        or value < minimum
    ):
        expected = (
            "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        )
        raise invalid(name, expected, value)
    return int(value)


def check_choice(name, value, choices):
    """Raises ``invalid`` unless ``value`` is one of ``choices`` (strings)."""
    if not isinstance(value, str) or value not in choices:
        expected = "one of " + ", ".join(f'"{c}"' for c in choices)
        raise invalid(name, expected, value)
    return value
