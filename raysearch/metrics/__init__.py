r"""Accuracy and calibration metrics of classifier probabilities, and reliability-diagram bins.

Every metric takes ``probs``, an (N, K) array of class probabilities (rows sum to 1), and
``labels``, an (N,) array of integer class indices in [0, K), as NumPy arrays or PyTorch tensors
(any device), and returns a Python ``float``. Calibration errors are fractions in [0, 1], not
percents. The classwise ECE of large inputs runs on background threads (at most
``torch.get_num_threads()``, none when it is 1); values do not depend on the number of threads.

Notation: for sample i, the confidence is :math:`c_i = \max_k p_{ik}`, the prediction is
:math:`\hat y_i = \arg\max_k p_{ik}` (first index on ties) and the hit is
:math:`a_i = 1[\hat y_i = y_i]`. For a bin :math:`B_b` of samples, :math:`|B_b|` is its size,
:math:`\mathrm{acc}_b = \frac{1}{|B_b|}\sum_{i \in B_b} a_i` its accuracy and
:math:`\mathrm{conf}_b = \frac{1}{|B_b|}\sum_{i \in B_b} c_i` its mean confidence.

Binning rules (shared by every binned metric through one helper):

* ``equal_width``: M bins :math:`(e_b, e_{b+1}]` with edges :math:`e_b = b / M` (the float nearest
  b / M, in the dtype of the scores, so ``0.2`` typed by a user is on the edge whatever the
  precision). A score exactly 0.0 falls in the first bin and a score exactly 1.0 in the last bin;
  there is no extra bin for 1.0 (the ``np.digitize`` / torchmetrics#3510 pitfall).
* ``equal_mass`` (adaptive): samples are sorted by confidence (stable sort) and cut with
  ``np.array_split`` into M groups of nearly equal size; each sample is counted exactly once,
  tied confidences may straddle two bins.

Empty bins contribute nothing. Metrics with names used in Tune/MLflow (``{split}_{metric}``) are
the built-in metrics of :mod:`~raysearch.metrics.builtin`, one decorated kernel each, with
their direction and where they are computed (:mod:`~raysearch.metrics.catalog`); the key tuples
(:data:`SUMMARY_KEYS`, :data:`TABLE_KEYS`, ...) are read from there.
:func:`calibration_summary` gathers the per-epoch ones, :func:`estimator_summary` the
estimators of the soft-calibration paper's appendix, :func:`table_summary` every column of the
five papers' result tables. :class:`CalibrationMeter` is the one evaluator behind them: fed
batch by batch, it keeps per-bin sums in constant memory (segmentation pixels) and, with
``keep_samples=True``, the samples its :meth:`~CalibrationMeter.table` needs; the three
summaries are thin wrappers that feed it a whole split. A user's metric function declares its
direction with :func:`metric`.

References:
    Naeini, Cooper and Hauskrecht, "Obtaining Well Calibrated Probabilities Using Bayesian
    Binning", AAAI 2015 (ECE, MCE).
    Guo, Pleiss, Sun and Weinberger, "On Calibration of Modern Neural Networks", ICML 2017,
    arXiv:1706.04599 (ECE with 15 equal-width bins, reliability diagrams).
    Kull et al., "Beyond temperature scaling: Obtaining well-calibrated multiclass probabilities
    with Dirichlet calibration", NeurIPS 2019, arXiv:1910.12656 (classwise ECE).
    Nixon et al., "Measuring Calibration in Deep Learning", CVPR Workshops 2019,
    arXiv:1904.01685 (adaptive ECE, static calibration error).
    Karandikar et al., "Soft Calibration Objectives for Neural Networks", NeurIPS 2021,
    arXiv:2108.00106, Eq. 6 (ECE of order p).
    Brier, "Verification of forecasts expressed in terms of probability", Monthly Weather
    Review 1950.
    Gupta et al., "Calibration of Neural Networks using Splines", ICLR 2021, arXiv:2006.12800
    (KS error).
    Krothapalli and Abbott, "Adaptive Label Smoothing", arXiv:2009.06432, Sec. 4.2 (average
    confidence, over- and underconfidence after Mund et al., ICRA 2015, and Wenger et al.,
    AISTATS 2020); Thulasidasan et al., NeurIPS 2019, arXiv:1905.11001 (binned
    overconfidence error).
    Efron and Tibshirani, "An Introduction to the Bootstrap", 1993 (percentile interval of
    :func:`ece_ci`).
    Kumar, Liang and Ma, "Verified Uncertainty Calibration", NeurIPS 2019, arXiv:1909.10155
    (debiased l2 calibration error, marginal calibration error).
    Roelofs, Cain, Shlens and Mozer, "Mitigating Bias in Calibration Error Estimation",
    AISTATS 2022, arXiv:2012.08668 (monotonic-sweep calibration error ECE_sweep).

Modules (each imports only those above it; none imports this package):

* :mod:`~raysearch.metrics.checks`: conversion and validation of ``probs`` / ``labels``, the
  top-1 scan, :func:`softmax`;
* :mod:`~raysearch.metrics.binning`: the shared binning helper, bin sums and means, the l1 /
  l2 / max gap reduction (:func:`~raysearch.metrics.binning.binned_ece`), :data:`BINNINGS`,
  :data:`NORMS`;
* :mod:`~raysearch.metrics.classwise`: :func:`classwise_ece`;
* :mod:`~raysearch.metrics.binned`: :func:`ece`, :func:`adaptive_ece`, :func:`mce`,
  :func:`reliability_bins`, :func:`overconfidence`, :func:`underconfidence`;
* :mod:`~raysearch.metrics.binless`: :func:`accuracy`, :func:`nll`, :func:`brier`,
  :func:`ks_error`, :func:`average_confidence`, :func:`debiased_ece`, :func:`sweep_ece`,
  :func:`marginal_ece`;
* :mod:`~raysearch.metrics.bootstrap`: :func:`ece_ci`;
* :mod:`~raysearch.metrics.catalog`: :class:`MetricSpec`, the registration decorators,
  :func:`group_keys`, :func:`metric`, :func:`metric_direction`;
* :mod:`~raysearch.metrics.builtin`: the built-in metrics and :data:`METRIC_REGISTRY`;
* :mod:`~raysearch.metrics.meter`: :class:`CalibrationMeter` (torch, any device), with its
  per-batch sums in :mod:`~raysearch.metrics.meter_sums` and its fused GPU kernels in
  :mod:`~raysearch.metrics.meter_kernel`;
* :mod:`~raysearch.metrics.table`: the logged key tuples and :func:`calibration_summary`,
  :func:`estimator_summary`, :func:`table_summary` (through a meter),
  :func:`calibration_report`.

**Layer.** Science, the floor every other layer stands on besides the base: plain NumPy and
PyTorch (matplotlib never). Of the package it imports only :mod:`raysearch.registry` (a
calibrator reaches the shift evaluation as an object); no Ray, MLflow or Optuna. Besides the
metrics it holds the selection rule (:mod:`~raysearch.metrics.selection`), statistics over
seeds (:mod:`~raysearch.metrics.repeats`) and evaluation under dataset shift
(:mod:`~raysearch.metrics.shift`).
"""

from raysearch.metrics.binless import (
    accuracy,
    average_confidence,
    brier,
    debiased_ece,
    ks_error,
    marginal_ece,
    nll,
    sweep_ece,
)
from raysearch.metrics.binned import (
    CONFIDENCE_DEFINITIONS,
    ReliabilityBins,
    adaptive_ece,
    ece,
    mce,
    overconfidence,
    reliability_bins,
    underconfidence,
)
from raysearch.metrics.binning import BINNINGS, NORMS
from raysearch.metrics.bootstrap import ece_ci
from raysearch.metrics.builtin import METRIC_REGISTRY
from raysearch.metrics.catalog import (
    BUILTIN_METRICS,
    MetricSpec,
    group_keys,
    metric,
    metric_direction,
)
from raysearch.metrics.checks import softmax
from raysearch.metrics.classwise import classwise_ece
from raysearch.metrics.meter import CalibrationMeter
from raysearch.metrics.table import (
    CALIBRATED_KEYS,
    DENSE_KEYS,
    ESTIMATOR_KEYS,
    SUMMARY_KEYS,
    TABLE_KEYS,
    calibration_report,
    calibration_summary,
    estimator_summary,
    table_summary,
)

__all__ = [
    "BINNINGS",
    "BUILTIN_METRICS",
    "CALIBRATED_KEYS",
    "DENSE_KEYS",
    "CONFIDENCE_DEFINITIONS",
    "CalibrationMeter",
    "ESTIMATOR_KEYS",
    "METRIC_REGISTRY",
    "MetricSpec",
    "NORMS",
    "ReliabilityBins",
    "SUMMARY_KEYS",
    "TABLE_KEYS",
    "accuracy",
    "adaptive_ece",
    "average_confidence",
    "brier",
    "calibration_report",
    "calibration_summary",
    "classwise_ece",
    "debiased_ece",
    "ece",
    "ece_ci",
    "estimator_summary",
    "group_keys",
    "ks_error",
    "marginal_ece",
    "mce",
    "metric",
    "metric_direction",
    "nll",
    "overconfidence",
    "reliability_bins",
    "softmax",
    "sweep_ece",
    "table_summary",
    "underconfidence",
]
