"""Pareto front of (accuracy, ECE) and the rule that picks one trial of a sweep.

The selection rule: among the trials whose validation accuracy is within ``tolerance``
(absolute, 0.01 = one percentage point) of the best validation accuracy, the one with the lowest
validation ECE wins; ties on ECE go to the higher accuracy, then to the earlier trial. It is
chosen on validation data; never select on test data (report the winner's test metrics beside).
Accuracy alone ignores calibration and ECE alone is gamed by a constant predictor (a uniform
prediction on balanced classes has ECE 0), hence the constrained rule.

The caller passes only trials that ran all their epochs: a trial stopped early by a scheduler
(ASHA) reports metrics of a shorter training and is not comparable.

The winner is always on the Pareto front: a trial dominating it would be inside the tolerance
too and have a lower ECE, or the same ECE with a higher accuracy.

``trials`` is a list of mappings (e.g. Tune result dicts) or a pandas DataFrame (e.g.
``ResultGrid.get_dataframe()`` or ``trials.parquet``); positions are 0-based in the order of
``trials`` (row order, not index labels, for a DataFrame). Trials whose accuracy or ECE is
missing, None, NaN or infinite are ignored.
"""

import logging
import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

__all__ = ["pareto_front", "select_best", "selection_table"]

logger = logging.getLogger(__name__)

#: Absolute slack on the accuracy threshold for float rounding (0.95 - 0.01 vs 0.94).
_ROUNDING_SLACK = 1e-12

Trials = Sequence[Mapping[str, Any]] | pd.DataFrame


def _metric_value(value: Any, position: int, key: str) -> float | None:
    """Return a finite float, or None when the value is missing, None, NaN or infinite."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"trial {position}: `{key}` must be a number, got bool {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        if not isinstance(value, (str, bytes)) and pd.api.types.is_scalar(value) and pd.isna(value):
            return None  # pd.NA, pd.NaT
        raise TypeError(
            f"trial {position}: `{key}` must be a number, got {type(value).__name__} {value!r}"
        ) from None
    return number if math.isfinite(number) else None


def _columns(trials: Any, accuracy: str, ece: str) -> tuple[list[Any], list[Any]]:
    """Raw values of the two metrics, one per trial in positional order (None where absent)."""
    if isinstance(trials, pd.DataFrame):
        n = len(trials)
        acc = trials[accuracy].tolist() if accuracy in trials.columns else [None] * n
        cal = trials[ece].tolist() if ece in trials.columns else [None] * n
        return acc, cal
    if isinstance(trials, (str, bytes, Mapping)) or not isinstance(trials, Sequence):
        raise TypeError(
            "`trials` must be a list of mappings or a pandas DataFrame, got "
            f"{type(trials).__name__}"
        )
    for position, trial in enumerate(trials):
        if not isinstance(trial, Mapping):
            raise TypeError(
                f"`trials` must be a list of mappings; trial {position} is {type(trial).__name__}"
            )
    return [trial.get(accuracy) for trial in trials], [trial.get(ece) for trial in trials]


def _eligible(trials: Any, accuracy: str, ece: str) -> list[tuple[int, float, float]]:
    """(position, accuracy, ece) of every trial with both metrics finite."""
    for name, key in (("accuracy", accuracy), ("ece", ece)):
        if not isinstance(key, str):
            raise TypeError(f"`{name}` must be a metric name (str), got {key!r}")
        if key.startswith("test_"):
            warnings.warn(
                f"selecting on `{key}`: select on validation metrics, never on test data",
                UserWarning,
                stacklevel=3,
            )
    acc_values, ece_values = _columns(trials, accuracy, ece)
    points = []
    for position, (raw_acc, raw_ece) in enumerate(zip(acc_values, ece_values, strict=True)):
        acc = _metric_value(raw_acc, position, accuracy)
        cal = _metric_value(raw_ece, position, ece)
        if acc is not None and cal is not None:
            points.append((position, acc, cal))
    skipped = len(acc_values) - len(points)
    if skipped:
        logger.debug("ignoring %d trial(s) without finite `%s` and `%s`", skipped, accuracy, ece)
    return points


def _check_tolerance(tolerance: object) -> float:
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real):
        raise TypeError(
            f"`tolerance` must be a real number, got {type(tolerance).__name__} {tolerance!r}"
        )
    value = float(tolerance)
    if not value >= 0.0 or math.isinf(value):
        raise ValueError(f"`tolerance` must be >= 0 and finite, got {tolerance}")
    return value


def _front(points: list[tuple[int, float, float]]) -> list[int]:
    """Positions of the non-dominated points, by accuracy descending, ECE ascending, position."""
    ordered = sorted(points, key=lambda point: (-point[1], point[2], point[0]))
    front = []
    best_ece_above = math.inf  # lowest ECE among points of strictly higher accuracy
    i = 0
    while i < len(ordered):
        j = i
        while j < len(ordered) and ordered[j][1] == ordered[i][1]:
            j += 1
        group = ordered[i:j]  # same accuracy, sorted by ECE: group[0] has the group's lowest ECE
        lowest = group[0][2]
        if lowest < best_ece_above:
            front.extend(position for position, _, cal in group if cal == lowest)
        best_ece_above = min(best_ece_above, lowest)
        i = j
    return front


def _select(points: list[tuple[int, float, float]], tolerance: float) -> int | None:
    if not points:
        return None
    best_accuracy = max(acc for _, acc, _ in points)
    threshold = best_accuracy - tolerance - _ROUNDING_SLACK
    candidates = [point for point in points if point[1] >= threshold]
    position, _, _ = min(candidates, key=lambda point: (point[2], -point[1], point[0]))
    return position


def pareto_front(trials: Trials, accuracy: str = "val_accuracy", ece: str = "val_ece") -> list[int]:
    """Trials not dominated on (accuracy, maximised; ECE, minimised).

    Trial A dominates trial B if ``acc_A >= acc_B`` and ``ece_A <= ece_B`` with at least one
    strict inequality; identical points do not dominate each other, so duplicates are all on
    the front. Use validation metrics; never select on test data.

    Args:
        trials: list of mappings or a pandas DataFrame, one entry/row per trial that ran all
            its epochs.
        accuracy: key/column of the accuracy (higher is better). Defaults to
            ``"val_accuracy"``.
        ece: key/column of the calibration error (lower is better). Defaults to ``"val_ece"``.

    Returns:
        0-based positions in ``trials`` of the front, sorted by accuracy descending, then ECE
        ascending, then position. Trials with a missing, None, NaN or infinite value of either
        metric are ignored; no eligible trial gives ``[]``.

    Raises:
        TypeError: if ``trials`` is neither a DataFrame nor a sequence of mappings, or a metric
            value is not a number.
    """
    return _front(_eligible(trials, accuracy, ece))


def select_best(
    trials: Trials,
    accuracy: str = "val_accuracy",
    ece: str = "val_ece",
    tolerance: float = 0.01,
) -> int:
    """Position of the trial with the lowest ECE within ``tolerance`` of the best accuracy.

    The rule (DESIGN.md "Selection"): let ``best`` be the highest accuracy of the eligible trials;
    among those with ``accuracy >= best - tolerance`` (with a 1e-12 slack for float rounding),
    the lowest ECE wins; ties on ECE go to the higher accuracy, further ties to the earlier
    position. It is chosen on validation data; never select on test data, report the winner's
    test metrics beside. The caller passes only trials that ran all their epochs. The winner is
    always on :func:`pareto_front`. ``tolerance=0`` selects the most accurate trial (the best
    calibrated one among equally accurate trials).

    Args:
        trials: list of mappings or a pandas DataFrame, one entry/row per trial that ran all
            its epochs.
        accuracy: key/column of the validation accuracy. Defaults to ``"val_accuracy"``.
        ece: key/column of the validation calibration error. Defaults to ``"val_ece"``.
        tolerance: absolute accuracy tolerance, >= 0 (0.01 = one percentage point on accuracies
            that are fractions). Defaults to ``0.01``.

    Returns:
        0-based position of the selected trial in ``trials``.

    Raises:
        TypeError: if ``trials`` is neither a DataFrame nor a sequence of mappings, a metric
            value is not a number, or ``tolerance`` is not a real number.
        ValueError: if ``tolerance`` < 0 (or NaN/inf); if no trial has finite values of both
            metrics ("no trial has both val_accuracy and val_ece").
    """
    tolerance = _check_tolerance(tolerance)
    selected = _select(_eligible(trials, accuracy, ece), tolerance)
    if selected is None:
        raise ValueError(f"no trial has both {accuracy} and {ece}")
    return selected


def selection_table(
    trials: Trials,
    accuracy: str = "val_accuracy",
    ece: str = "val_ece",
    tolerance: float = 0.01,
) -> pd.DataFrame:
    """A copy of ``trials`` with boolean columns ``on_front`` and ``selected`` added.

    ``on_front`` marks :func:`pareto_front`, ``selected`` the single trial of
    :func:`select_best` (the same rule: lowest validation ECE within ``tolerance`` of the best
    validation accuracy; never select on test data; pass only trials that ran all their epochs).
    Unlike :func:`select_best`, a table without any eligible trial is returned with both columns
    all False instead of raising, so that a report can still show it.

    Args:
        trials: list of mappings or a pandas DataFrame, one entry/row per trial.
        accuracy: key/column of the validation accuracy. Defaults to ``"val_accuracy"``.
        ece: key/column of the validation calibration error. Defaults to ``"val_ece"``.
        tolerance: absolute accuracy tolerance, >= 0. Defaults to ``0.01``.

    Returns:
        A new DataFrame (a DataFrame input keeps its index and columns; existing ``on_front`` /
        ``selected`` columns are overwritten in the copy), rows in the order of ``trials``.

    Raises:
        TypeError: as :func:`select_best`.
        ValueError: if ``tolerance`` < 0 (or NaN/inf).
    """
    tolerance = _check_tolerance(tolerance)
    points = _eligible(trials, accuracy, ece)
    if isinstance(trials, pd.DataFrame):
        table = trials.copy()
    else:
        table = pd.DataFrame([dict(trial) for trial in trials])
    on_front = [False] * len(table)
    for position in _front(points):
        on_front[position] = True
    selected = [False] * len(table)
    chosen = _select(points, tolerance)
    if chosen is not None:
        selected[chosen] = True
    table["on_front"] = on_front
    table["selected"] = selected
    return table
