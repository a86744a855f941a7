"""Metric names logged by trials and the summaries that compute them with one validation.

The key tuples (:data:`SUMMARY_KEYS`, :data:`DENSE_KEYS`, :data:`TABLE_KEYS`,
:data:`CALIBRATED_KEYS`, :data:`ESTIMATOR_KEYS`), read from the built-in metrics
(:mod:`raysearch.metrics.builtin`, :func:`~raysearch.metrics.catalog.group_keys`), and
:func:`calibration_summary`, :func:`estimator_summary`, :func:`table_summary` and
:func:`calibration_report`. The three summaries are thin wrappers: each feeds the whole split
to one :class:`~raysearch.metrics.meter.CalibrationMeter` with ``keep_samples=True`` (which
validates ``probs`` / ``labels`` once) and reads :meth:`~raysearch.metrics.meter.
CalibrationMeter.table`, the one code path of every table metric.

Imports :mod:`raysearch.metrics.checks`, :mod:`~raysearch.metrics.catalog` and
:mod:`raysearch.metrics.meter`; no module of the package imports this one.
"""

from typing import Any

import numpy as np

from raysearch.metrics.catalog import check_keys, group_keys
from raysearch.metrics.checks import _ROW_SUM_TOLERANCE, check_n_bins, softmax
from raysearch.metrics.meter import CalibrationMeter

#: Metric names of :func:`calibration_summary`, reported by a trial as ``val_*``/``test_*``
#: (every epoch): the built-in metrics that the meter's sums give and that have a kernel.
SUMMARY_KEYS = group_keys("summary")
#: Metrics of a segmentation split (:class:`CalibrationMeter`), logged as ``{split}_{key}``;
#: the temperature-scaled ones (:data:`SUMMARY_KEYS`) as ``test_{key}_ts``.
DENSE_KEYS = group_keys("dense")
#: The result-table metrics (``table=True`` in :mod:`raysearch.metrics.builtin`, which names the
#: papers' column each one reproduces, also in docs/metrics.md): every column of the five
#: papers' result tables (:func:`table_summary`), logged by every classification trial on the
#: final model as ``{split}_{key}`` and after each post-hoc calibrator as
#: ``{split}_{key}_{calibrator}``. A column measured after post-hoc calibration is the same
#: name with the calibrator's suffix (``test_ece_ts``, ``test_ece_l2em_ts_sbece``).
TABLE_KEYS = group_keys("table")
#: Metrics a trial also logs after each post-hoc calibrator, as ``{split}_{key}_{calibrator}``:
#: :data:`SUMMARY_KEYS`, then the rest of :data:`TABLE_KEYS`.
CALIBRATED_KEYS = group_keys("calibrated")
#: Keys of :func:`estimator_summary`, in order (logged as ``{split}_{key}``).
ESTIMATOR_KEYS = group_keys("estimator")


def calibration_summary(probs: Any, labels: Any, n_bins: int = 15) -> dict[str, float]:
    """All metrics of one split, validated once, under the names used in Tune and MLflow.

    Keys (logged as ``{split}_{key}``): ``accuracy``, ``ece`` (equal-width, l1), ``aece``
    (equal-mass, l1), ``cece`` (classwise), ``mce``, ``nll`` (eps 1e-12), ``brier``.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1 of the binned metrics. Defaults to ``15``.

    Returns:
        Dict of the seven metrics as Python floats, in the key order above.

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, or for invalid ``probs`` / ``labels``.
    """
    return _meter_table(probs, labels, n_bins, SUMMARY_KEYS)


def estimator_summary(probs: Any, labels: Any, n_bins: int = 15) -> dict[str, float]:
    """The calibration estimators of the soft-calibration paper, validated once.

    Keys (:data:`ESTIMATOR_KEYS`, logged as ``{split}_{key}``, e.g. ``val_debiased_ce``):

    * ``ece_l2em``: ``ece(probs, labels, n_bins, binning="equal_mass", norm="l2")``, the
      headline ECE of Karandikar et al. (NeurIPS 2021, Sec. 5 and Table 2: l2 norm,
      equal-mass bins, 15 bins);
    * ``debiased_ce``: :func:`debiased_ece` with ``n_bins`` (Kumar et al., 2019);
    * ``sweep_ce``: :func:`sweep_ece` with ``norm="l2"``, ``binning="equal_mass"`` (Roelofs
      et al.; the "mean-sweep CE" of Karandikar et al., App. E, Table 4); ``n_bins`` plays
      no part;
    * ``marginal_ece``: :func:`marginal_ece` with ``n_bins``, ``norm="l2"``,
      ``binning="equal_mass"``;
    * ``ks``: :func:`ks_error` (Gupta et al., ICLR 2021; binning-free).

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1 of the fixed-bin estimators. Defaults to ``15``.

    Returns:
        Dict of the five estimators as Python floats in [0, 1], in the key order above.

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, or for invalid ``probs`` / ``labels``.
    """
    return _meter_table(probs, labels, n_bins, ESTIMATOR_KEYS)


def _meter_table(probs: Any, labels: Any, n_bins: int, keys: tuple[str, ...]) -> dict[str, float]:
    """``keys`` of :meth:`CalibrationMeter.table` after one update with the whole split."""
    shape = tuple(getattr(probs, "shape", None) or np.shape(probs))
    # K of a 2-D input; anything else is refused by the update with the functions' error
    num_classes = int(shape[1]) if len(shape) == 2 and shape[1] > 0 else 1
    meter = CalibrationMeter(num_classes, n_bins=n_bins, aece_samples=1, keep_samples=True)
    meter.update(probs, labels)
    return meter.table(keys)


def table_summary(
    probs: Any, labels: Any, n_bins: int = 15, keys: tuple[str, ...] = TABLE_KEYS
) -> dict[str, float]:
    """The metrics of the papers' result tables (:data:`TABLE_KEYS`), validated once.

    Every value equals the public function its built-in metric names
    (:mod:`raysearch.metrics.builtin`), called on the same inputs with ``n_bins`` where it bins
    (``ece_100``: 100 bins whatever ``n_bins``). Only the asked ``keys`` are computed, so a
    caller that already has some (e.g. from :func:`calibration_summary`) pays only for the
    rest. ``brier`` may be asked for too (every metric logged after a post-hoc calibrator,
    ``group_keys("calibrated")``, is accepted).

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1 of the binned metrics other than ``ece_100``. Defaults to
            ``15`` (the papers' 15 bins).
        keys: names from ``group_keys("calibrated")`` (:data:`CALIBRATED_KEYS` and the table
            metrics registered since), in the order wanted. Defaults to :data:`TABLE_KEYS`.

    Returns:
        Dict ``{key: float}`` in the order of ``keys``: fractions in [0, 1] (``nll`` in nats,
        ``brier`` in [0, 2]); ``overconfidence`` / ``underconfidence`` are NaN when no
        prediction is wrong / right.

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, if a key is unknown, or for invalid ``probs`` /
            ``labels`` (see :func:`accuracy`).
    """
    n_bins = check_n_bins(n_bins)
    return _meter_table(probs, labels, n_bins, check_keys(keys, group_keys("calibrated")))


def calibration_report(scores: Any, labels: Any, *, n_bins: int = 15,
                       inputs: str = "auto", prefix: str = "") -> dict[str, float]:
    """Every metric a raysearch trial logs, from a split's logits or probabilities.

    For a Tune trainable of your own: report ``calibration_report(val_logits, val_labels,
    prefix="val_")`` and the selection rule, the Pareto front and the MLflow callback read the
    same names as a raysearch trial's (``val_accuracy``, ``val_ece``, ...).

    Keys: :func:`calibration_summary`'s (``accuracy``, ``ece``, ``aece``, ``cece``, ``mce``,
    ``nll``, ``brier``) then :func:`estimator_summary`'s (``ece_l2em``, ``debiased_ce``,
    ``sweep_ce``, ``marginal_ece``, ``ks``); calibration errors are fractions in [0, 1].

    Args:
        scores: (N, K) float logits or probabilities, NumPy array or torch tensor.
        labels: (N,) integer class indices in [0, K).
        n_bins: bins of the binned metrics (>= 1). Defaults to ``15``.
        inputs: ``"logits"``, ``"probs"``, or ``"auto"`` (default): probabilities when every
            entry is in [0, 1] and every row sums to 1 (within 1e-3), else logits (softmax).
        prefix: put before every key (``"val_"``). Defaults to ``""``.

    Returns:
        dict[str, float]: the twelve metrics.

    Raises:
        TypeError: if ``n_bins`` is not an integer.
        ValueError: for an unknown `inputs`, invalid `scores` / `labels` (shapes, NaN, labels
            outside [0, K)), or probabilities whose rows do not sum to 1.
    """
    if inputs not in ("auto", "logits", "probs"):
        raise ValueError(f"`inputs` must be 'auto', 'logits' or 'probs', got {inputs!r}")
    values = np.asarray(scores.detach().cpu() if hasattr(scores, "detach") else scores,
                        dtype=np.float64)
    if inputs == "auto":
        is_probs = (values.ndim == 2 and values.size > 0 and values.min() >= 0
                    and values.max() <= 1
                    and np.allclose(values.sum(axis=1), 1.0, atol=_ROW_SUM_TOLERANCE))
        inputs = "probs" if is_probs else "logits"
    probs = values if inputs == "probs" else softmax(values, axis=1)
    report = {**calibration_summary(probs, labels, n_bins=n_bins),
              **estimator_summary(probs, labels, n_bins=n_bins)}
    return {f"{prefix}{key}": value for key, value in report.items()}
