"""Constructor argument checks: a value outside its domain is a ValueError that names the
layer, the argument and what it expects, before any weight exists."""

import numbers


def _fail(layer, name, expected, value):
    raise ValueError(f"{layer}: expected `{name}` to be {expected}. Received: {name}={value!r}")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def int_at_least(layer, name, value, minimum, expected=None):
    if not _is_int(value) or value < minimum:
        _fail(layer, name, expected or f"an integer >= {minimum}", value)
    return int(value)


def int_in_range(layer, name, value, low, high, expected=None):
    if not _is_int(value) or not low <= value <= high:
        _fail(layer, name, expected or f"an integer in [{low}, {high}]", value)
    return int(value)


def positive_int(layer, name, value):
    return int_at_least(layer, name, value, 1, "a positive integer")


def non_negative_int(layer, name, value):
    return int_at_least(layer, name, value, 0, "a non-negative integer")


def positive_even_int(layer, name, value):
    if not _is_int(value) or value < 2 or value % 2:
        _fail(layer, name, "a positive even integer", value)
    return int(value)


def rate(layer, name, value):
    """A dropout rate: a number in [0, 1)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0 <= value < 1:
        _fail(layer, name, "a dropout rate, a number in [0, 1)", value)
    return float(value)


def positive_float(layer, name, value):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value > 0:
        _fail(layer, name, "a positive number", value)
    return float(value)


def boolean(layer, name, value, allow_none=False):
    if not (isinstance(value, bool) or type(value).__name__ == "bool_" or (allow_none and value is None)):
        _fail(layer, name, "True or False" + (" (or None)" if allow_none else ""), value)
    return None if value is None else bool(value)


def count(name, value, low):
    """A call's count (`batch_size`, `epochs`, ...) checked as an integer >= `low`, numpy
    integers too: the error names the argument."""
    if not _is_int(value) or value < low:
        raise ValueError(f"Expected `{name}` to be an integer >= {low}. Received: {name}={value!r}")
    return int(value)
