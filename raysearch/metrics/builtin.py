"""The built-in metrics, one decorated kernel each, and the registry of metric names.

Each function below is a built-in metric (:func:`~raysearch.metrics.catalog.builtin_metric`):
its name, direction, where it is computed, the options it is computed with and the papers'
table columns it reproduces. Its kernel reads the validated arrays of a split
(:class:`~raysearch.metrics.catalog.Scores`) with the same code as the public function of the
same value (named in each docstring), so the meter's :meth:`~raysearch.metrics.meter.
CalibrationMeter.table`, :func:`~raysearch.metrics.table_summary` and the public function agree
bit for bit. The order of the functions is the order of every list of names derived from them
(:func:`~raysearch.metrics.catalog.group_keys`): the order of the keys a trial logs.

To add a metric: one more decorated function here (``table=True`` to have every trial log it
on its final model and after each post-hoc calibrator) and its test; docs/extending.md shows
one.

Papers: ACLS (Park et al., ICCV 2023), MbLS (Liu et al., CVPR 2022), ALS (Krothapalli and
Abbott, "Adaptive Label Smoothing", arXiv:2009.06432), SC (Karandikar et al., "Soft
Calibration Objectives for Neural Networks", NeurIPS 2021), SCTL (Jung et al., ICML 2023).

Imports :mod:`~raysearch.metrics.catalog`, :mod:`~raysearch.metrics.binning`,
:mod:`~raysearch.metrics.binned`, :mod:`~raysearch.metrics.binless` and
:mod:`~raysearch.metrics.classwise`, and :mod:`raysearch.registry`.
"""

import numpy as np

from raysearch.metrics.binless import _brier, _debiased_ce, _ks, _marginal_ece, _nll, _sweep_n_bins
from raysearch.metrics.binned import _conditional_confidence
from raysearch.metrics.binning import binned_ece
from raysearch.metrics.catalog import BUILTIN_METRICS, Scores, builtin_metric, streamed_metric
from raysearch.metrics.classwise import _classwise_ece
from raysearch.registry import Registry

__all__ = ["METRIC_REGISTRY"]


@builtin_metric("accuracy", "max", streams=True, table=True,
                column='"ACC" / "Acc." / "Accuracy" (ACLS Tables 3, B; MbLS Table 2; ALS Tables '
                       '1-3, 5, 6; SC Tables 4-6; SCTL Tables 1, 2, in parentheses)')
def accuracy(s: Scores) -> float:
    """Top-1 accuracy; as raysearch.metrics.accuracy."""
    return float(np.mean(s.hits))


streamed_metric("miou", "max", description="Mean intersection over union of the classes, from "
                "the meter's confusion matrix (segmentation).")


@builtin_metric("ece", "min", streams=True, table=True, bins=None, binning="equal_width",
                norm="l1", column='"ECE" with 15 bins (ACLS Tables 3-6, A, B; MbLS Tables 1, 3, '
                                  '7; SCTL Tables 1-3), "ECE 15" (ALS Tables 2, 3, 5, 6)')
def ece(s: Scores, bins: int, binning: str, norm: str) -> float:
    """Expected calibration error of the top-1 confidence; as raysearch.metrics.ece."""
    return binned_ece(s.conf, s.hits, bins, binning, norm)


@builtin_metric("ece_100", "min", table=True, bins=100, binning="equal_width", norm="l1",
                column='"ECE 100" (ALS Tables 2, 3, 5, 6)')
def ece_100(s: Scores, bins: int, binning: str, norm: str) -> float:
    """ECE with 100 equal-width bins whatever the run's M; as raysearch.metrics.ece."""
    return binned_ece(s.conf, s.hits, bins, binning, norm)


@builtin_metric("aece", "min", streams=True, table=True, bins=None, binning="equal_mass",
                norm="l1", column='"AECE" with 15 bins (ACLS Tables 3-6, B; MbLS Tables 1, 3)')
def aece(s: Scores, bins: int, binning: str, norm: str) -> float:
    """Adaptive ECE, on equal-mass bins; as raysearch.metrics.adaptive_ece."""
    return binned_ece(s.conf, s.hits, bins, binning, norm)


@builtin_metric("cece", "min", streams=True, table=True, bins=None,
                column="no column of the five papers; the class-wise ECE of Kull et al. "
                       "(NeurIPS 2019) that SCTL's per-class losses aim at")
def cece(s: Scores, bins: int) -> float:
    """Class-wise equal-width ECE, mean over classes; as raysearch.metrics.classwise_ece."""
    return _classwise_ece(s.probs, s.labels, bins)


@builtin_metric("mce", "min", streams=True, table=True, bins=None, binning="equal_width",
                norm="max", column='"MCE" (ALS Tables 2, 3, 5, 6)')
def mce(s: Scores, bins: int, binning: str, norm: str) -> float:
    """Maximum calibration error over the non-empty bins; as raysearch.metrics.mce."""
    return binned_ece(s.conf, s.hits, bins, binning, norm)


@builtin_metric("nll", "min", streams=True, table=True, eps=1e-12,
                column='"Log-loss" (ALS Tables 5, 6)')
def nll(s: Scores, eps: float) -> float:
    """Negative log-likelihood in nats; as raysearch.metrics.nll."""
    return _nll(s.probs, s.labels, eps)


@builtin_metric("brier", "min", streams=True)
def brier(s: Scores) -> float:
    """Brier score summed over the K classes, in [0, 2]; as raysearch.metrics.brier."""
    return _brier(s.probs, s.labels)


streamed_metric("ece_released", "min", bins=None, binning="equal_width", norm="l1",
                description="Pixel ECE of the released MbLS evaluator: the mean of per-batch "
                "ECEs without background (segmentation).",
                column="MbLS Table 5, ACLS Table 4 (pixel ECE on PASCAL VOC)")


@builtin_metric("overconfidence", "min", table=True,
                column='"O.conf" (ALS Tables 1-3, 5, 6; Sec. 4.2, o(f) = E[c | wrong])')
def overconfidence(s: Scores) -> float:
    """Mean confidence of the wrong predictions; as raysearch.metrics.overconfidence."""
    return _conditional_confidence(s.conf, s.hits, over=True)


@builtin_metric("underconfidence", "min", table=True,
                column='"U.conf" (ALS Tables 1-3, 5, 6; Sec. 4.2, u(f) = E[1 - c | right])')
def underconfidence(s: Scores) -> float:
    """Mean 1 - confidence of the right ones; as raysearch.metrics.underconfidence."""
    return _conditional_confidence(s.conf, s.hits, over=False)


@builtin_metric("average_confidence", "min", table=True, column='"A.conf" (ALS Tables 1, 5, 6)')
def average_confidence(s: Scores) -> float:
    """Mean top-1 confidence; as raysearch.metrics.average_confidence."""
    return float(np.mean(s.conf, dtype=np.float64))


@builtin_metric("ece_l2em", "min", table=True, estimator=1, bins=None, binning="equal_mass",
                norm="l2", column='"ECE" (SC Tables 1, 2, 4-6; l2 norm, equal-mass bins, '
                                  '15 bins)')
def ece_l2em(s: Scores, bins: int, binning: str, norm: str) -> float:
    """ECE with the l2 norm on equal-mass bins; as raysearch.metrics.ece."""
    return binned_ece(s.conf, s.hits, bins, binning, norm)


@builtin_metric("debiased_ce", "min", estimator=2, bins=None)
def debiased_ce(s: Scores, bins: int) -> float:
    """Debiased l2 error on equal-mass bins; as raysearch.metrics.debiased_ece."""
    return _debiased_ce(s.conf, s.hits, bins)


@builtin_metric("marginal_ece", "min", table=True, estimator=4, bins=None, binning="equal_mass",
                norm="l2", column='"Marginal ECE" (SC Table 6; l2 norm, equal-mass bins)')
def marginal_ece(s: Scores, bins: int, binning: str, norm: str) -> float:
    """Marginal calibration error of every class score; as raysearch.metrics.marginal_ece."""
    return _marginal_ece(s.probs, s.labels, bins, binning, norm)


@builtin_metric("ks", "min", table=True, estimator=5, column='"KS-Error" (SC Table 4)')
def ks(s: Scores) -> float:
    """Kolmogorov-Smirnov calibration error, binning-free; as raysearch.metrics.ks_error."""
    return _ks(s.conf, s.hits)


@builtin_metric("sweep_ce", "min", table=True, estimator=3, binning="equal_mass", norm="l2",
                column='"mean-sweep CE" (SC Table 4; l2 norm, equal-mass bins)')
def sweep_ce(s: Scores, binning: str, norm: str) -> float:
    """ECE with the largest monotone bin count; as raysearch.metrics.sweep_ece."""
    return binned_ece(s.conf, s.hits, _sweep_n_bins(s.conf, s.hits, binning), binning, norm)


#: The built-in metrics above plus the installed plug-ins (entry-point group
#: ``raysearch.metrics``): a plug-in is a user's metric function ``fn(probs, labels)``.
METRIC_REGISTRY = Registry("metrics", BUILTIN_METRICS)
