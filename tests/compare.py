"""NaN-aware comparisons of metric dicts, for tests that hold on any CPU.

Several reported metrics are conditional means (the paper's over- and underconfidence average
over the wrong or the right predictions only), so they are NaN when the condition selects no
sample: a small run with no correct validation prediction on one CPU may have one on another.
Two runs that agree must then agree on *which* metrics are NaN, and on the value of the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def metric_differences(first: Mapping[str, Any], second: Mapping[str, Any], *,
                       rel: float = 0.0, abs: float = 0.0) -> dict[str, tuple[Any, Any]]:
    """``{key: (first, second)}`` of the entries that differ; NaN equals NaN.

    Keys present on one side only differ. Numbers differ when ``|a - b| > max(rel * max(|a|,
    |b|), abs)``; other values when ``a != b``.
    """
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(first) | set(second)):
        if key not in first or key not in second:
            out[key] = (first.get(key, "<missing>"), second.get(key, "<missing>"))
            continue
        a, b = first[key], second[key]
        if _is_nan(a) or _is_nan(b):
            if not (_is_nan(a) and _is_nan(b)):
                out[key] = (a, b)
        elif isinstance(a, (int, float)) and isinstance(b, (int, float)) \
                and not isinstance(a, bool) and not isinstance(b, bool):
            if math.isinf(a) or math.isinf(b):
                if a != b:
                    out[key] = (a, b)
            elif math.fabs(a - b) > max(rel * max(math.fabs(a), math.fabs(b)), abs):
                out[key] = (a, b)
        elif a != b:
            out[key] = (a, b)
    return out


def assert_same_metrics(first: Mapping[str, Any], second: Mapping[str, Any]) -> None:
    """Assert two metric dicts are equal to the bit, key by key, with NaN equal to NaN."""
    diff = metric_differences(first, second)
    assert not diff, f"metrics differ: {diff}"


def assert_metrics_close(first: Mapping[str, Any], second: Mapping[str, Any], *,
                         rel: float = 0.0, abs: float = 0.0,
                         keys: Any = None) -> None:
    """Assert two metric dicts agree within ``max(rel * magnitude, abs)``, NaN equal to NaN.

    Args:
        keys: only these keys (default: every key of either dict).
    """
    if keys is not None:
        keys = list(keys)
        first = {k: first.get(k, "<missing>") for k in keys}
        second = {k: second.get(k, "<missing>") for k in keys}
    diff = metric_differences(first, second, rel=rel, abs=abs)
    assert not diff, f"metrics differ beyond rel={rel}, abs={abs}: {diff}"
