"""Leaf helpers of the post-hoc calibrators: parameter validation and row-wise softmax.

Shared by :mod:`raysearch.calibration.base` (which re-exports them) and
:mod:`raysearch.calibration.objectives`; this module imports nothing from the package, so neither
of them has to import the other at module level.
"""

import math
import numbers

import numpy as np

__all__ = [
    "log_softmax",
    "softmax",
    "validate_choice",
    "validate_int",
    "validate_number",
]


# --------------------------------------------------------------------------------------------
# Parameter validation
# --------------------------------------------------------------------------------------------


def validate_number(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    minimum_inclusive: bool = True,
) -> float:
    """Check that a parameter is a real number in a range and return it as a float.

    Args:
        name: parameter name, quoted in the error message.
        value: the value to check (``bool`` is rejected).
        minimum: lower bound or None.
        maximum: inclusive upper bound or None.
        minimum_inclusive: whether ``value == minimum`` is allowed.

    Returns:
        ``float(value)``.

    Raises:
        TypeError: if ``value`` is not a real number.
        ValueError: if ``value`` is NaN or out of range ("`gamma` must be >= 0, got -1.0").
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    low_op = ">=" if minimum_inclusive else ">"
    if minimum is not None and maximum is not None:
        condition = f"{low_op} {minimum:g} and <= {maximum:g}"
    elif minimum is not None:
        condition = f"{low_op} {minimum:g}"
    elif maximum is not None:
        condition = f"<= {maximum:g}"
    else:
        condition = "a number (not NaN)"
    too_low = minimum is not None and not (
        number >= minimum if minimum_inclusive else number > minimum
    )
    too_high = maximum is not None and number > maximum
    if math.isnan(number) or too_low or too_high:
        raise ValueError(f"`{name}` must be {condition}, got {value}")
    return number


def validate_int(name: str, value: object, *, minimum: int) -> int:
    """Check that a parameter is an integer >= ``minimum`` and return it.

    Raises:
        TypeError: if ``value`` is not an integer (``bool`` is rejected).
        ValueError: if ``value`` < ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}")
    return int(value)


def validate_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Check that a string parameter is one of ``choices`` and return it.

    Raises:
        ValueError: if ``value`` is not one of ``choices`` (the message lists them).
    """
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"`{name}` must be one of {listed}, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# Softmax helpers
# --------------------------------------------------------------------------------------------


def log_softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of a float64 (N, K) array (a new array)."""
    out = z - z.max(axis=1, keepdims=True)
    out -= np.log(np.exp(out).sum(axis=1, keepdims=True))
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of a float64 (N, K) array (a new array)."""
    out = z - z.max(axis=1, keepdims=True)
    np.exp(out, out=out)
    out /= out.sum(axis=1, keepdims=True)
    return out
