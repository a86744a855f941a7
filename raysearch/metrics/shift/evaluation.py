"""Evaluation of a model on a shift set: accuracy, ECE and NLL per (corruption, severity).

:func:`evaluate_shift` runs a model's logits function on every entry of a
:class:`~raysearch.metrics.shift.sets.ShiftSet` (one entry in memory at a time), before and after a
post-hoc calibrator, and returns a :class:`ShiftReport` (rows, flat MLflow metric names, a text
summary per severity). Metrics are those of :mod:`raysearch.metrics`: fractions or nats, never
percent.

Imports :mod:`raysearch.metrics.shift.corruptions` and :mod:`raysearch.metrics.shift.sets` at module
level; :mod:`raysearch.metrics` (torch) and pandas only inside the functions that use them, so that
``import raysearch.metrics.shift`` stays light. :mod:`raysearch.metrics.shift` gathers its public
names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raysearch.metrics.shift.corruptions import _NAME_PATTERN, _check_int
from raysearch.metrics.shift.sets import CLEAN, ShiftSet

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ShiftReport", "evaluate_shift"]

#: Metrics of every row, before (``name``) and after (``name_cal``) the calibrator.
_METRICS = ("accuracy", "ece", "nll")


@dataclass
class ShiftReport:
    """Metrics of a model on a :class:`ShiftSet`.

    Attributes:
        rows: one dict per (corruption, severity), the clean row first (``corruption="clean"``,
            ``severity=0``); keys ``corruption``, ``severity``, ``accuracy``, ``ece``, ``nll``
            and, when a calibrator was given, ``calibrator`` (its name), ``accuracy_cal``,
            ``ece_cal``, ``nll_cal``. Accuracy and ECE are fractions in [0, 1], NLL in nats.
        calibrator: name of the calibrator, or None.
        held_out: corruptions whose rows are reported but left out of the means over
            corruptions (:attr:`ShiftSet.held_out`: a released folder's four extra ones).
    """

    rows: list[dict[str, Any]]
    calibrator: str | None = None
    held_out: tuple[str, ...] = ()

    def _metric_names(self) -> list[str]:
        names = list(_METRICS)
        if self.calibrator is not None:
            names += [f"{m}_cal" for m in _METRICS]
        return names

    def to_frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (one row per (corruption, severity), clean first).

        Returns:
            Columns ``corruption``, ``severity``, ``accuracy``, ``ece``, ``nll`` and, with a
            calibrator, ``calibrator``, ``accuracy_cal``, ``ece_cal``, ``nll_cal``.
        """
        import pandas as pd

        columns = ["corruption", "severity"]
        if self.calibrator is not None:
            columns.append("calibrator")
        return pd.DataFrame(self.rows, columns=columns + self._metric_names())

    def _means(self) -> dict[int, dict[str, float]]:
        """Per severity (sorted), the mean of every metric over its rows but the held-out ones."""
        by_severity: dict[int, list[dict[str, Any]]] = {}
        for row in self.rows:
            if row["corruption"] not in self.held_out:
                by_severity.setdefault(int(row["severity"]), []).append(row)
        return {
            severity: {
                name: float(np.mean([row[name] for row in by_severity[severity]]))
                for name in self._metric_names()
            }
            for severity in sorted(by_severity)
        }

    def as_metrics(self) -> dict[str, float]:
        """Flat metric names for MLflow.

        ``shift_{corruption}_{severity}_{metric}`` for metric in accuracy, ece, nll (the clean
        row is ``shift_clean_0_{metric}``) and, after the calibrator,
        ``shift_{corruption}_{severity}_{metric}_{calibrator}`` (e.g.
        ``shift_gaussian_noise_3_ece_ts``); then the means over corruptions per severity,
        ``shift_mean_{severity}_{metric}[_{calibrator}]`` (``shift_mean_0_*`` is the clean row),
        which leave out the :attr:`held_out` corruptions (they have their rows only).

        Returns:
            Dict of Python floats (fractions; NLL in nats).
        """
        suffix = {m: m for m in _METRICS}
        if self.calibrator is not None:
            suffix |= {f"{m}_cal": f"{m}_{self.calibrator}" for m in _METRICS}
        metrics: dict[str, float] = {}
        for row in self.rows:
            prefix = f"shift_{row['corruption']}_{row['severity']}"
            for key, name in suffix.items():
                metrics[f"{prefix}_{name}"] = float(row[key])
        for severity, means in self._means().items():
            for key, name in suffix.items():
                metrics[f"shift_mean_{severity}_{name}"] = means[key]
        return metrics

    def summary(self) -> str:
        """A small text table of the means over corruptions per severity, in percent.

        Returns:
            Lines ``severity | accuracy (%) | ECE (%) [| ECE {calibrator} (%)]``, one per
            severity (0 = clean), values with 2 decimals; with :attr:`held_out` corruptions a
            last line naming them (not in the means).
        """
        headers = ["severity", "accuracy (%)", "ECE (%)"]
        keys = ["accuracy", "ece"]
        if self.calibrator is not None:
            headers.append(f"ECE {self.calibrator} (%)")
            keys.append("ece_cal")
        table = [
            ["0 (clean)" if s == 0 else str(s)] + [f"{100 * means[k]:.2f}" for k in keys]
            for s, means in self._means().items()
        ]
        widths = [max(len(r[i]) for r in [headers, *table]) for i in range(len(headers))]

        def line(cells: list[str]) -> str:
            rest = [cell.rjust(widths[i]) for i, cell in enumerate(cells) if i > 0]
            return "  ".join([cells[0].ljust(widths[0]), *rest])

        held = [f"held out of the means: {', '.join(self.held_out)}"] if self.held_out else []
        return "\n".join([line(headers)] + [line(r) for r in table] + held)


def _logits_array(value: Any, n: int, name: str) -> np.ndarray:
    """Check (N, K) finite float logits; accepts NumPy arrays and (any-device) torch tensors."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().float().numpy()
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"`{name}` must be float logits, got dtype {array.dtype}")
    if array.ndim != 2 or array.shape[0] != n:
        raise ValueError(f"`{name}` must have shape ({n}, K), got {array.shape}")
    return array


def _calibrator_label(calibrator: Any, calibrator_name: str | None) -> str | None:
    if calibrator is None:
        if calibrator_name is not None:
            raise ValueError(
                f"`calibrator_name` was given ({calibrator_name!r}) without a `calibrator`"
            )
        return None
    if not callable(getattr(calibrator, "predict_proba", None)):
        raise TypeError(
            f"`calibrator` must have a predict_proba(logits) method, got "
            f"{type(calibrator).__name__}"
        )
    name = calibrator_name if calibrator_name is not None else getattr(calibrator, "name", None)
    if not isinstance(name, str) or not _NAME_PATTERN.match(name):
        raise ValueError(
            "`calibrator_name` must be a non-empty name of letters, digits, '_', '.' or '-' "
            f"(used in metric names), got {name!r}"
        )
    return name


def _row_metrics(
    probs: np.ndarray, labels: np.ndarray, n_bins: int, suffix: str = ""
) -> dict[str, float]:
    """Accuracy, ECE and NLL of one entry under the keys ``{metric}{suffix}``."""
    from raysearch.metrics import accuracy, ece, nll

    return {
        f"accuracy{suffix}": accuracy(probs, labels),
        f"ece{suffix}": ece(probs, labels, n_bins=n_bins),
        f"nll{suffix}": nll(probs, labels),
    }


def evaluate_shift(
    predict_logits: Callable[[np.ndarray], np.ndarray],
    shift_set: ShiftSet,
    *,
    clean_logits: np.ndarray | None = None,
    calibrator: Any | None = None,
    calibrator_name: str | None = None,
    n_bins: int = 15,
) -> ShiftReport:
    """Accuracy, ECE and NLL on every entry of a shift set, before and after a calibrator.

    Args:
        predict_logits: maps uint8 (N, H, W, C) images to (N, K) float logits (the caller
            normalises and runs the model, batching as it needs); called once per entry of
            ``shift_set.images`` (except the clean one when ``clean_logits`` is given).
        shift_set: from :func:`build_shift_set`, :func:`load_released_shift_set` or
            :meth:`ShiftSet.load`; its entries are read one at a time (:meth:`ShiftSet.read`).
        clean_logits: (N, K) float logits of the uncorrupted subsample, in its order (e.g.
            ``test_logits[shift_set.index]``); None computes them with ``predict_logits``.
        calibrator: a fitted raysearch calibrator (``predict_proba``); it gets the logits, or
            their softmax if it was fitted with ``inputs="probs"``. Defaults to None.
        calibrator_name: its name in the metrics (letters, digits, ``_ . -``); defaults to
            ``calibrator.name`` (e.g. ``"ts"``).
        n_bins: equal-width bins of the ECE. Defaults to ``15``.

    Returns:
        A :class:`ShiftReport`, the clean row (severity 0) first, with the set's
        :attr:`~ShiftSet.held_out` corruptions (rows, not in the means).

    Raises:
        ValueError: if ``clean_logits`` or an output of ``predict_logits`` is not float
            (N, K), K varies between entries, labels fall outside [0, K),
            ``calibrator_name`` is given without a calibrator or is not a valid name,
            ``n_bins`` < 1, or a lazy entry cannot be read (see :meth:`ShiftSet.read`).
        TypeError: if ``predict_logits`` is not callable, ``shift_set`` is not a
            :class:`ShiftSet` or ``calibrator`` has no ``predict_proba``.
    """
    from raysearch.metrics import softmax

    if not callable(predict_logits):
        raise TypeError(f"`predict_logits` must be callable, got {type(predict_logits).__name__}")
    if not isinstance(shift_set, ShiftSet):
        raise TypeError(f"`shift_set` must be a ShiftSet, got {type(shift_set).__name__}")
    name = _calibrator_label(calibrator, calibrator_name)
    n_bins = _check_int("n_bins", n_bins, minimum=1)
    n = shift_set.labels.shape[0]
    labels = shift_set.labels
    use_probs = getattr(calibrator, "inputs", "logits") == "probs"
    n_classes = None
    rows = []
    for key in shift_set.images:
        if key == CLEAN and clean_logits is not None:
            logits = _logits_array(clean_logits, n, "clean_logits")
        else:
            # one entry in memory at a time: a lazy entry is read here and dropped after use
            logits = _logits_array(
                predict_logits(shift_set.read(key)), n, f"predict_logits output for {key}"
            )
        if n_classes is None:
            n_classes = logits.shape[1]
        elif logits.shape[1] != n_classes:
            raise ValueError(
                f"logits for {key} have K={logits.shape[1]} classes, the clean ones K={n_classes}"
            )
        probs = softmax(logits)
        row: dict[str, Any] = {"corruption": key[0], "severity": key[1]}
        row |= _row_metrics(probs, labels, n_bins)
        if calibrator is not None:
            calibrated = calibrator.predict_proba(probs if use_probs else logits)
            row["calibrator"] = name
            row |= _row_metrics(calibrated, labels, n_bins, suffix="_cal")
        rows.append(row)
    return ShiftReport(rows=rows, calibrator=name, held_out=shift_set.held_out)
