"""Metric names logged by trials and the summaries that compute them with one validation.

The key tuples (:data:`SUMMARY_KEYS`, :data:`DENSE_KEYS`, :data:`TABLE_KEYS` with the paper
column each key reproduces, :data:`CALIBRATED_KEYS`, :data:`ESTIMATOR_KEYS`) and
:func:`calibration_summary`, :func:`estimator_summary`, :func:`table_summary` and
:func:`calibration_report`. The three summaries are thin wrappers: each feeds the whole split
to one :class:`~raysearch.metrics.meter.CalibrationMeter` with ``keep_samples=True`` (which
validates ``probs`` / ``labels`` once) and reads :meth:`~raysearch.metrics.meter.
CalibrationMeter.table`, the one code path of every table metric.

Imports :mod:`raysearch.metrics._checks` and :mod:`raysearch.metrics.meter`; no module of the
package imports this one.
"""

from typing import Any

import numpy as np

from raysearch.metrics._checks import _ROW_SUM_TOLERANCE, _check_n_bins, softmax
from raysearch.metrics.meter import (  # noqa: F401
    _ECE_100_BINS,
    CalibrationMeter,
    _check_table_keys,
)

#: Metric names of :func:`calibration_summary`, reported by a trial as ``val_*``/``test_*``.
SUMMARY_KEYS = ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier")
#: Metrics of a segmentation split (:class:`CalibrationMeter`), logged as ``{split}_{key}``;
#: the temperature-scaled ones (:data:`SUMMARY_KEYS`) as ``test_{key}_ts``.
DENSE_KEYS = ("accuracy", "miou", "ece", "aece", "cece", "mce", "nll", "brier", "ece_released")
#: Metrics behind every column of the five papers' result tables (:func:`table_summary`), logged
#: by every classification trial on the final model as ``{split}_{key}`` and after each post-hoc
#: calibrator as ``{split}_{key}_{calibrator}``.
TABLE_KEYS = (
    "accuracy",
    "ece",
    "ece_100",
    "aece",
    "cece",
    "mce",
    "nll",
    "overconfidence",
    "underconfidence",
    "average_confidence",
    "ece_l2em",
    "marginal_ece",
    "ks",
    "sweep_ce",
)
r"""Paper table column -> metric name -> definition.

``M`` is the trial's ``ece_bins`` (15 by default, the papers' 15 bins); every value is a fraction
in [0, 1] except ``nll`` (nats). docs/metrics.md holds the same table.

* ``accuracy``: "ACC" / "Acc." / "Accuracy" (ACLS Tables 3, B; MbLS Table 2; ALS Tables 1-3, 5, 6;
  SC Tables 4-6; SCTL Tables 1, 2, in parentheses): top-1 accuracy, :func:`accuracy`.
* ``ece``: "ECE" with 15 bins (ACLS Tables 3-6, A, B; MbLS Tables 1, 3, 7; SCTL Tables 1-3),
  "ECE 15" (ALS Tables 2, 3, 5, 6): :func:`ece`, M equal-width bins, l1.
* ``ece_100``: "ECE 100" (ALS Tables 2, 3, 5, 6): :func:`ece`, 100 equal-width bins, l1.
* ``aece``: "AECE" with 15 bins (ACLS Tables 3-6, B; MbLS Tables 1, 3): :func:`adaptive_ece`,
  M equal-mass bins, l1.
* ``cece``: no table column of the five papers (SCTL reports ECE and accuracy only); the
  class-wise ECE of Kull et al. (NeurIPS 2019) that SCTL's per-class losses aim at:
  :func:`classwise_ece`, M equal-width bins.
* ``mce``: "MCE" (ALS Tables 2, 3, 5, 6): :func:`mce`, M equal-width bins.
* ``nll``: "Log-loss" (ALS Tables 5, 6): :func:`nll`, eps 1e-12.
* ``overconfidence``: "O.conf" (ALS Tables 1-3, 5, 6; Sec. 4.2, o(f) = E[c | wrong]):
  :func:`overconfidence`, ``definition="conditional"`` (NaN if no prediction is wrong).
* ``underconfidence``: "U.conf" (ALS Tables 1-3, 5, 6; Sec. 4.2, u(f) = E[1 - c | right]):
  :func:`underconfidence`, ``definition="conditional"`` (NaN if no prediction is right).
* ``average_confidence``: "A.conf" (ALS Tables 1, 5, 6): :func:`average_confidence`.
* ``ece_l2em``: "ECE" (SC Tables 1, 2, 4-6; l2 norm, equal-mass bins, 15 bins): :func:`ece`,
  M equal-mass bins, l2.
* ``marginal_ece``: "Marginal ECE" (SC Table 6; l2 norm, equal-mass bins): :func:`marginal_ece`,
  M equal-mass bins, l2.
* ``ks``: "KS-Error" (SC Table 4): :func:`ks_error`.
* ``sweep_ce``: "mean-sweep CE" (SC Table 4; l2 norm, equal-mass bins): :func:`sweep_ece`,
  l2, equal-mass.

Papers: ACLS (Park et al., ICCV 2023), MbLS (Liu et al., CVPR 2022), ALS (Krothapalli and
Abbott, "Adaptive Label Smoothing", arXiv:2009.06432), SC (Karandikar et al., "Soft Calibration
Objectives for Neural Networks", NeurIPS 2021), SCTL (Jung et al., "Scaling of Class-wise
Training Losses for Post-hoc Calibration", ICML 2023). A column measured after post-hoc
calibration (MbLS Table 7 "PosT"; SC Tables 1, 2 "TS" and "TS-SB-ECE"; SCTL Tables 1, 2 TS,
ETS, CTS, PTS) is the same name with the calibrator's suffix: ``test_ece_ts``,
``test_ece_l2em_ts``, ``test_ece_l2em_ts_sbece``. SC Table 3's train-set ECE (l1,
equal-width) is ``ece`` of training outputs, which trials do not log.
"""
#: Metrics a trial also logs after each post-hoc calibrator, as ``{split}_{key}_{calibrator}``:
#: :data:`SUMMARY_KEYS`, then the rest of :data:`TABLE_KEYS`.
CALIBRATED_KEYS = (*SUMMARY_KEYS, *(key for key in TABLE_KEYS if key not in SUMMARY_KEYS))
#: Keys of :func:`estimator_summary`, in order (logged as ``{split}_{key}``).
ESTIMATOR_KEYS = ("ece_l2em", "debiased_ce", "sweep_ce", "marginal_ece", "ks")


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

    Every value equals the public function the docstring of :data:`TABLE_KEYS` names, called on
    the same inputs with ``n_bins`` where it bins (``ece_100``: 100 bins whatever ``n_bins``).
    Only the asked ``keys`` are computed, so a caller that already has some (e.g. from
    :func:`calibration_summary`) pays only for the rest. ``brier`` may be asked for too (all
    of :data:`CALIBRATED_KEYS` are accepted).

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1 of the binned metrics other than ``ece_100``. Defaults to
            ``15`` (the papers' 15 bins).
        keys: names from :data:`CALIBRATED_KEYS`, in the order wanted. Defaults to
            :data:`TABLE_KEYS`.

    Returns:
        Dict ``{key: float}`` in the order of ``keys``: fractions in [0, 1] (``nll`` in nats,
        ``brier`` in [0, 2]); ``overconfidence`` / ``underconfidence`` are NaN when no
        prediction is wrong / right.

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, if a key is unknown, or for invalid ``probs`` /
            ``labels`` (see :func:`accuracy`).
    """
    n_bins = _check_n_bins(n_bins)
    return _meter_table(probs, labels, n_bins, _check_table_keys(keys, CALIBRATED_KEYS))


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
