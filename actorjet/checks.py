"""Field checks every validator shares: job configs, tree specs, study specs, HTTP bodies.

JSON and TOML give ``true`` where a number is expected, and Python's ``bool`` is an ``int``,
so "is this a whole number" is not ``isinstance(x, int)``.  Each validator keeps its own
message (it knows the field's name and where it is); these say only what a value is.
"""
from __future__ import annotations

import math


def is_int(value) -> bool:
    """A whole number (``True`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite int or float (not ``True``, not NaN, not infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def int_in(value, low: int, high: int | float = math.inf) -> bool:
    """A whole number from ``low`` to ``high``, both included."""
    return is_int(value) and low <= value <= high


def number_in(value, low: float, high: float = math.inf) -> bool:
    """A finite number from ``low`` to ``high``, both included."""
    return is_number(value) and low <= value <= high
