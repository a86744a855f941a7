r"""Post-hoc calibration of stored network outputs: fit, evaluate, tabulate.

The science behind ``raysearch calibrate FILE``: :func:`calibrate_outputs` fits each post-hoc
calibrator of :mod:`raysearch.calibration` on the calibration part of stored outputs
(:mod:`raysearch.calibration.outputs`: :func:`load_outputs` reads them from ``.npz``,
``.parquet`` or pickle files, :func:`split_outputs` cuts them in two) and measures it on the
evaluation part, next to the uncalibrated outputs: every metric a trial logs after a calibrator
(:func:`raysearch.metrics.group_keys`, ``"calibrated"``) and a user's metric functions. Nothing
here imports Ray, MLflow or matplotlib; :mod:`raysearch.calibration` (and with it torch) is
imported only when calibrators are fitted.
"""

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from raysearch.calibration.outputs import (
    PROB_FLOOR,
    SPLITS,
    Outputs,
    OutputsSplit,
    load_outputs,
    split_outputs,
    write_outputs_parquet,
)
from raysearch.metrics import (
    CALIBRATED_KEYS,
    ReliabilityBins,
    reliability_bins,
    softmax,
    table_summary,
)
from raysearch.metrics.catalog import group_keys, user_metric_values
from raysearch.metrics.checks import check_n_bins
from raysearch.registry import did_you_mean, is_import_string

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CLASSWISE_MODES",
    "METRIC_COLUMNS",
    "PROB_FLOOR",
    "SPLITS",
    "CalibrationReport",
    "CalibrationRow",
    "Outputs",
    "OutputsSplit",
    "calibrate_outputs",
    "load_outputs",
    "split_outputs",
    "write_outputs_parquet",
]

logger = logging.getLogger(__name__)

#: Values of ``classwise_scaling`` in :func:`calibrate_outputs`.
CLASSWISE_MODES = ("off", "on", "both")
#: Metric columns of a :class:`CalibrationReport` (fractions; ``nll`` in nats): the summary
#: metrics and every column of the papers' tables, :data:`raysearch.metrics.CALIBRATED_KEYS`.
METRIC_COLUMNS = CALIBRATED_KEYS
#: Failures of a calibrator that become an error row instead of a crash (numerical or input
#: trouble); TypeError, AttributeError, KeyError (programming errors) still propagate.
_CALIBRATOR_FAILURES = (ValueError, RuntimeError, ArithmeticError, np.linalg.LinAlgError)
#: Metrics shown as percentages by :meth:`CalibrationReport.format_table`.
_PERCENT_METRICS = ("accuracy", "ece", "aece", "cece", "mce", "ks")


# --------------------------------------------------------------------------------------------
# Calibrating and reporting
# --------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """JSON-friendly copy of calibrator parameters (arrays and tensors become lists)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "detach"):  # torch tensor, without importing torch
        value = value.detach().cpu().numpy()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


@dataclass(frozen=True, eq=False)
class CalibrationRow:
    """One line of a :class:`CalibrationReport`: a calibrator (or none) on the evaluation part.

    Attributes:
        method: ``"uncalibrated"`` or the calibrator's name (``"ts"``, ``"ets"``, ...).
        classwise_scaling: whether the calibrator was wrapped in the class-wise loss scaling
            of Jung et al. (always False for ``"uncalibrated"``).
        metrics: the :data:`METRIC_COLUMNS` as floats (fractions; ``nll`` in nats); empty if
            the calibrator failed.
        reliability: equal-width reliability-diagram bins of the evaluation part, or None if
            the calibrator failed.
        params: the fitted calibrator's ``params_`` as plain Python values (empty if none).
        fit_seconds: wall time of the fit, None for ``"uncalibrated"``.
        error: ``"ExceptionType: message"`` if the calibrator failed, else None.
        degenerate: whether the fit had no finite optimum (the calibration part is perfectly
            classified; the calibrator's ``degenerate``, see
            :class:`~raysearch.calibration.base.Calibrator`).
    """

    method: str
    classwise_scaling: bool
    metrics: dict[str, float] = field(default_factory=dict)
    reliability: ReliabilityBins | None = None
    params: dict[str, Any] = field(default_factory=dict)
    fit_seconds: float | None = None
    error: str | None = None
    degenerate: bool = False

    @property
    def name(self) -> str:
        """Display name: the method, with ``+cw`` for class-wise scaling (``"ts+cw"``)."""
        return f"{self.method}+cw" if self.classwise_scaling else self.method

    @property
    def ok(self) -> bool:
        """Whether the metrics were computed (the calibrator did not fail)."""
        return self.error is None


@dataclass(frozen=True, eq=False)
class CalibrationReport:
    """Metrics of the uncalibrated outputs and of every fitted calibrator on held-out samples.

    Attributes:
        rows: ``"uncalibrated"`` first (unless :func:`calibrate_outputs` left it out), then
            one row per (method, class-wise flag) in the order asked.
        n_calibration: samples the calibrators were fitted on.
        n_evaluation: samples the metrics were computed on.
        n_classes: number of classes K.
        from_probs: whether the file held probabilities (logits are their logs).
        split_description: how the two parts were made.
        n_bins: number of bins of the binned metrics and reliability bins.
    """

    rows: tuple[CalibrationRow, ...]
    n_calibration: int
    n_evaluation: int
    n_classes: int
    from_probs: bool
    split_description: str
    n_bins: int

    def row(self, method: str, classwise_scaling: bool = False) -> CalibrationRow:
        """The row of ``method`` (``"uncalibrated"`` or a calibrator name) and flag.

        Raises:
            KeyError: if the report has no such row.
        """
        for row in self.rows:
            if row.method == method and row.classwise_scaling == classwise_scaling:
                return row
        raise KeyError(f"no row for method {method!r} with classwise_scaling={classwise_scaling}")

    def to_frame(self) -> "pd.DataFrame":
        """A pandas DataFrame, one row per :class:`CalibrationRow`.

        Columns: ``method``, ``classwise_scaling``, the :data:`METRIC_COLUMNS` (fractions, NaN
        for failed rows), ``fit_seconds``, ``params`` (JSON string) and ``error``.
        """
        import pandas as pd

        records = []
        for row in self.rows:
            record: dict[str, Any] = {
                "method": row.method,
                "classwise_scaling": row.classwise_scaling,
            }
            for name in self.metric_columns():
                record[name] = row.metrics.get(name, float("nan"))
            record["fit_seconds"] = row.fit_seconds
            record["params"] = json.dumps(row.params, sort_keys=True)
            record["error"] = row.error
            records.append(record)
        return pd.DataFrame.from_records(records)

    @property
    def degenerate(self) -> tuple[str, ...]:
        """Display names (``"ts"``, ``"ts+cw"``) of the calibrators whose fit was degenerate."""
        return tuple(row.name for row in self.rows if row.degenerate)

    def metric_columns(self) -> tuple[str, ...]:
        """The :data:`METRIC_COLUMNS`, then the other metrics of the rows (a user's metrics)."""
        names = dict.fromkeys(METRIC_COLUMNS)
        for row in self.rows:
            names.update(dict.fromkeys(row.metrics))
        return tuple(names)

    def as_metrics(self, split: str = "test", *, calibrated_only: bool = False) -> dict[str, float]:
        """Flat metric names of the design: ``{split}_{metric}`` and ``{split}_{metric}_{name}``.

        The uncalibrated row gives ``test_ece``, ``test_ece_100`` etc., a calibrator
        ``test_ece_ts``, ``test_ece_l2em_ts`` (class-wise scaling: ``test_ece_ts_cw``). Failed
        rows are left out.

        Args:
            split: the split prefix. Defaults to ``"test"``.
            calibrated_only: leave out the uncalibrated row. Defaults to ``False``.

        Returns:
            Dict of floats.
        """
        out: dict[str, float] = {}
        for row in self.rows:
            if calibrated_only and row.method == "uncalibrated":
                continue
            suffix = "" if row.method == "uncalibrated" else "_" + row.name.replace("+", "_")
            for name, value in row.metrics.items():
                out[f"{split}_{name}{suffix}"] = value
        return out

    def format_table(self) -> str:
        """A fixed-width text table: calibration metrics in percent, NLL and Brier as numbers.

        Failed calibrators show their error in place of the metrics.
        """
        headers = {
            "accuracy": "acc %",
            "ece": "ECE %",
            "aece": "AECE %",
            "cece": "cECE %",
            "mce": "MCE %",
            "ks": "KS %",
            "nll": "NLL",
            "brier": "Brier",
        }
        order = ("accuracy", "ece", "aece", "cece", "mce", "ks", "nll", "brier")
        width = 8
        name_width = max(len("method"), *(len(row.name) for row in self.rows))
        head = f"{'method':<{name_width}}" + "".join(f"{headers[m]:>{width}}" for m in order)
        head += f"{'fit s':>{width}}"
        lines = [
            f"Post-hoc calibration on {self.n_evaluation} evaluation samples, K={self.n_classes} "
            f"classes ({'log-probabilities' if self.from_probs else 'logits'}); calibrators "
            f"fitted on {self.n_calibration} samples.",
            f"Split: {self.split_description}. Binned metrics: {self.n_bins} bins.",
            "",
            head,
            "-" * len(head),
        ]
        for row in self.rows:
            text = f"{row.name:<{name_width}}"
            if not row.ok:
                lines.append(f"{text}  FAILED: {row.error}")
                continue
            for metric in order:
                value = row.metrics[metric]
                if metric in _PERCENT_METRICS:
                    text += f"{100.0 * value:>{width}.2f}"
                else:
                    text += f"{value:>{width}.4f}"
            seconds = "-" if row.fit_seconds is None else f"{row.fit_seconds:.2f}"
            lines.append(f"{text}{seconds:>{width}}")
        return "\n".join(lines)


MetricFn = Callable[[np.ndarray, np.ndarray], float]


def _evaluated_row(
    method: str,
    classwise: bool,
    probs: Any,
    labels: np.ndarray,
    n_bins: int,
    params: dict[str, Any],
    fit_seconds: float | None,
    *,
    degenerate: bool = False,
) -> CalibrationRow:
    return CalibrationRow(
        method=method,
        classwise_scaling=classwise,
        metrics=table_summary(probs, labels, n_bins=n_bins, keys=group_keys("calibrated")),
        reliability=reliability_bins(probs, labels, n_bins=n_bins),
        params=params,
        fit_seconds=fit_seconds,
        degenerate=degenerate,
    )


def _add_user_metrics(row: CalibrationRow, metrics: Mapping[str, MetricFn], probs: Any,
                      labels: np.ndarray, logits: np.ndarray | None = None) -> CalibrationRow:
    """`row` with a user's metrics added to its metrics (a metric that raises propagates)."""
    if metrics:
        where = ("the evaluation part" if row.method == "uncalibrated" else
                 f"the evaluation part after calibrator {row.name!r}")
        row.metrics.update(user_metric_values(metrics, np.asarray(probs, dtype=np.float64),
                                              labels, logits=logits, where=where))
    return row


def _calibrated_row(name: str, flag: bool, cal: Outputs, ev: Outputs, n_bins: int,
                    metrics: Mapping[str, MetricFn]) -> CalibrationRow:
    """Fit calibrator `name` on `cal` and measure it on `ev` (its failure: an error row)."""
    from raysearch import calibration

    start = time.perf_counter()
    try:
        calibrator = calibration.fit_calibrator(name, cal.logits, cal.labels,
                                                classwise_scaling=flag)
        fit_seconds = time.perf_counter() - start
        probs = calibrator.predict_proba(ev.logits)
        params = _plain(dict(getattr(calibrator, "params_", {}) or {}))
        row = _evaluated_row(name, flag, probs, ev.labels, n_bins, params, fit_seconds,
                             degenerate=bool(getattr(calibrator, "degenerate", False)))
    except _CALIBRATOR_FAILURES as exc:
        message = f"{type(exc).__name__}: {exc}"
        logger.warning("calibrator %s (classwise_scaling=%s) failed: %s", name, flag, message)
        return CalibrationRow(name, flag, error=message)
    return _add_user_metrics(row, metrics, probs, ev.labels)


def _check_methods(methods: Sequence[str] | str) -> tuple[str, ...]:
    """The calibrator names of `methods` (one name may be a string).

    Raises:
        ValueError: if a method is unknown, `methods` is empty or repeats a name.
    """
    from raysearch import calibration

    names = (methods,) if isinstance(methods, str) else tuple(methods)
    available = list(calibration.available_calibrators())
    if not names:
        raise ValueError(
            f"`methods` must name at least one calibrator; available: {', '.join(available)}"
        )
    for name in names:
        if name not in available and not is_import_string(name):
            raise ValueError(f"Unknown calibrator {name!r}{did_you_mean(name, available)}; "
                             f"available: {', '.join(available)}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"`methods` repeats {repeated}")
    return names


def calibrate_outputs(
    outputs: Outputs,
    methods: Sequence[str] | str = ("ts",),
    *,
    classwise_scaling: str = "off",
    fraction: float = 0.5,
    seed: int = 0,
    n_bins: int = 15,
    uncalibrated: bool = True,
    metrics: Mapping[str, MetricFn] | None = None,
) -> CalibrationReport:
    """Fit post-hoc calibrators on a calibration part and measure them on an evaluation part.

    The outputs are split by :func:`split_outputs` (the file's own split if it has one, else a
    stratified split with ``fraction`` for calibration). Each method is fitted with
    ``raysearch.calibration.fit_calibrator(method, cal_logits, cal_labels,
    classwise_scaling=flag)`` (default objective) and its ``predict_proba`` of the evaluation
    logits is measured with :func:`raysearch.metrics.table_summary` (one
    :class:`~raysearch.metrics.CalibrationMeter`, the evaluator of every split; the
    :data:`METRIC_COLUMNS`: the summary metrics and every column of the papers' tables, e.g.
    ``ece_100``, ``ece_l2em``, ``sweep_ce``, ``overconfidence``) and a user's `metrics`, along
    with reliability bins. The uncalibrated row is the softmax of the evaluation logits. A
    calibrator that raises ValueError, RuntimeError, ArithmeticError or LinAlgError becomes a
    row carrying the error (logged as a warning); the other rows are kept.

    Args:
        outputs: loaded outputs (see :func:`load_outputs`).
        methods: calibrator names from ``raysearch.calibration.available_calibrators()``, or a
            single name. Defaults to ``("ts",)``.
        classwise_scaling: ``"off"`` (plain calibrators), ``"on"`` (each wrapped in the
            class-wise loss scaling of Jung et al.) or ``"both"`` (a row for each). Defaults to
            ``"off"``.
        fraction: calibration share of a random split, in (0, 1). Defaults to ``0.5``.
        seed: seed of a random split, >= 0. Defaults to ``0``.
        n_bins: number of bins of the binned metrics. Defaults to ``15``.
        uncalibrated: also measure the uncalibrated row. ``False`` leaves it out (the report
            holds the calibrators' rows only), for a caller that has those numbers already: a
            sweep trial measured its test split in :func:`raysearch.training.run.fit`.
            Defaults to ``True``.
        metrics: a user's metric functions by name, ``fn(probs (N, K) float64, labels (N,)
            int64) -> float`` (:func:`raysearch.metrics.metric` may declare
            ``reads="logits"``); each row holds them under their names after the table
            metrics (``as_metrics``: ``test_<name>_<calibrator>``). Defaults to none.

    Returns:
        A :class:`CalibrationReport`.

    Raises:
        ValueError: if a method is unknown (the message lists the available ones), ``methods``
            is empty or repeats a name, ``classwise_scaling`` is not off/on/both, ``n_bins`` < 1,
            for the conditions of :func:`split_outputs`, or when one of `metrics` raises (one
            line naming it).
        TypeError: if ``n_bins``, ``fraction`` or ``seed`` has the wrong type.
    """
    names = _check_methods(methods)
    if classwise_scaling not in CLASSWISE_MODES:
        raise ValueError(
            f"`classwise_scaling` must be one of {', '.join(CLASSWISE_MODES)}, got "
            f"{classwise_scaling!r}"
        )
    n_bins = check_n_bins(n_bins)
    metrics = dict(metrics or {})
    flags = {"off": (False,), "on": (True,), "both": (False, True)}[classwise_scaling]

    parts = split_outputs(outputs, fraction=fraction, seed=seed)
    cal, ev = parts.calibration, parts.evaluation
    rows = []
    if uncalibrated:
        probs = softmax(ev.logits)
        row = _evaluated_row("uncalibrated", False, probs, ev.labels, n_bins, {}, None)
        rows.append(_add_user_metrics(row, metrics, probs, ev.labels, ev.logits))
    rows += [_calibrated_row(name, flag, cal, ev, n_bins, metrics)
             for name in names for flag in flags]
    return CalibrationReport(
        rows=tuple(rows),
        n_calibration=cal.n_samples,
        n_evaluation=ev.n_samples,
        n_classes=outputs.n_classes,
        from_probs=outputs.from_probs,
        split_description=parts.description,
        n_bins=n_bins,
    )
