"""Binned calibration errors of the top-1 confidence and reliability-diagram bins.

:func:`ece` (l1 / l2 / max norm, equal-width or equal-mass bins), :func:`adaptive_ece`,
:func:`mce`, :class:`ReliabilityBins` / :func:`reliability_bins`, and the over- and
underconfidence of the adaptive-label-smoothing paper (conditional or binned).

Imports only :mod:`raysearch.metrics.checks` and :mod:`raysearch.metrics.binning`.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from raysearch.metrics.binning import (
    BINNINGS,
    NORMS,
    _bin_means,
    _bin_sums,
    _equal_width_edges,
    _reduce_gaps,
    binned_ece,
)
from raysearch.metrics.checks import _check_choice, _validate_top1, check_n_bins


def ece(
    probs: Any,
    labels: Any,
    n_bins: int = 15,
    binning: str = "equal_width",
    norm: str = "l1",
) -> float:
    r"""Expected calibration error of the top-1 confidence.

    .. math::

        \mathrm{ECE}_{l1} = \sum_b \frac{|B_b|}{N} |\mathrm{acc}_b - \mathrm{conf}_b|, \quad
        \mathrm{ECE}_{l2} = \Big(\sum_b \frac{|B_b|}{N}
        (\mathrm{acc}_b - \mathrm{conf}_b)^2\Big)^{1/2}, \quad
        \mathrm{ECE}_{max} = \max_{b: |B_b| > 0} |\mathrm{acc}_b - \mathrm{conf}_b|

    over the M bins :math:`B_b` of the confidences :math:`c_i = \max_k p_{ik}`, with
    :math:`\mathrm{acc}_b` the fraction of :math:`B_b` whose argmax is the label and
    :math:`\mathrm{conf}_b` the mean confidence in :math:`B_b` (module docstring for the bin
    rules). ``l2`` is Karandikar et al. (NeurIPS 2021) Eq. 6 with p = 2, the root of the weighted
    mean of squared gaps; ``max`` is the MCE (Naeini et al., AAAI 2015). Empty bins contribute
    nothing. A constant predictor matching the class frequencies has ECE 0, so ECE is never
    optimised alone.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1. Defaults to ``15``.
        binning: ``"equal_width"`` (bins (b/M, (b+1)/M]) or ``"equal_mass"`` (adaptive, equal
            counts). Defaults to ``"equal_width"``.
        norm: ``"l1"``, ``"l2"`` or ``"max"``. Defaults to ``"l1"``.

    Returns:
        Calibration error in [0, 1].

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1; if ``binning`` or ``norm`` is unknown; for invalid
            ``probs`` / ``labels`` (see :func:`accuracy`).
    """
    n_bins = check_n_bins(n_bins)
    _check_choice("binning", binning, BINNINGS)
    _check_choice("norm", norm, NORMS)
    _, _, conf, hits = _validate_top1(probs, labels)
    return binned_ece(conf, hits, n_bins, binning, norm)


def adaptive_ece(probs: Any, labels: Any, n_bins: int = 15) -> float:
    """Adaptive ECE (AECE): :func:`ece` with ``binning="equal_mass"`` and ``norm="l1"``.

    The N confidences are sorted and split into M bins of N // M or N // M + 1 samples
    (``np.array_split``), each sample counted once (Nixon et al., CVPR-W 2019; the AECE of the
    ACLS and MbLS papers).

    Args, Returns and Raises: as :func:`ece` (``binning`` and ``norm`` fixed).
    """
    return ece(probs, labels, n_bins=n_bins, binning="equal_mass", norm="l1")


def mce(probs: Any, labels: Any, n_bins: int = 15) -> float:
    """Maximum calibration error: the largest |acc_b - conf_b| over non-empty equal-width bins.

    Same as ``ece(probs, labels, n_bins, norm="max")`` (Naeini et al., AAAI 2015).

    Args, Returns and Raises: as :func:`ece` (``binning`` and ``norm`` fixed).
    """
    return ece(probs, labels, n_bins=n_bins, binning="equal_width", norm="max")


@dataclass(frozen=True, eq=False)
class ReliabilityBins:
    """Equal-width bins of the top-1 confidence: what a reliability diagram plots.

    Bin b covers ``(edges[b], edges[b + 1]]`` (0.0 in the first bin, 1.0 in the last). The
    arrays are read-only copies.

    Attributes:
        edges: (M + 1,) float64 bin edges 0, 1/M, ..., 1.
        counts: (M,) int64 number of samples per bin.
        accuracy: (M,) float64 fraction of correct predictions per bin, NaN for empty bins.
        confidence: (M,) float64 mean top-1 confidence per bin, NaN for empty bins.
    """

    edges: np.ndarray
    counts: np.ndarray
    accuracy: np.ndarray
    confidence: np.ndarray

    def __post_init__(self) -> None:
        for name, dtype in (
            ("edges", np.float64),
            ("counts", np.int64),
            ("accuracy", np.float64),
            ("confidence", np.float64),
        ):
            array = np.array(getattr(self, name), dtype=dtype)  # a copy
            if array.ndim != 1:
                raise ValueError(f"`{name}` must be 1-D, got shape {array.shape}")
            array.setflags(write=False)
            object.__setattr__(self, name, array)
        m = self.counts.shape[0]
        shapes = {
            "edges": self.edges.shape,
            "accuracy": self.accuracy.shape,
            "confidence": self.confidence.shape,
        }
        expected = {"edges": (m + 1,), "accuracy": (m,), "confidence": (m,)}
        for name, shape in shapes.items():
            if shape != expected[name]:
                raise ValueError(
                    f"`{name}` must have shape {expected[name]} for counts of shape {(m,)}, "
                    f"got {shape}"
                )

    @property
    def n_bins(self) -> int:
        """Number of bins M."""
        return int(self.counts.shape[0])

    @property
    def ece(self) -> float:
        """ECE (l1) of these bins: sum_b counts_b / N * |accuracy_b - confidence_b|."""
        return _reduce_gaps(self.counts, self.accuracy, self.confidence, "l1")


def reliability_bins(probs: Any, labels: Any, n_bins: int = 15) -> ReliabilityBins:
    """Equal-width reliability-diagram bins of the top-1 confidence.

    Uses the same binning as :func:`ece`, so ``reliability_bins(p, y, m).ece == ece(p, y, m)``.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1. Defaults to ``15``.

    Returns:
        A :class:`ReliabilityBins` with edges, counts, per-bin accuracy and confidence.

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, or for invalid ``probs`` / ``labels``.
    """
    n_bins = check_n_bins(n_bins)
    _, _, conf, hits = _validate_top1(probs, labels)
    counts, conf_sums, hit_sums = _bin_sums(conf, hits, n_bins, "equal_width")
    accuracy_b, confidence_b = _bin_means(counts, conf_sums, hit_sums)
    return ReliabilityBins(_equal_width_edges(n_bins), counts, accuracy_b, confidence_b)


# --------------------------------------------------------------------------------------------
# Over- and underconfidence
# --------------------------------------------------------------------------------------------

#: Definitions of :func:`overconfidence` and :func:`underconfidence`.
CONFIDENCE_DEFINITIONS = ("conditional", "binned")


def _conditional_confidence(conf: np.ndarray, hits: np.ndarray, over: bool) -> float:
    """Mean confidence of the misses (`over`) or mean uncertainty of the hits; NaN if none."""
    selected = ~hits if over else hits
    if not selected.any():
        return float("nan")
    values = conf[selected].astype(np.float64)
    return float(np.mean(values if over else 1.0 - values))


def _confidence_error(probs: Any, labels: Any, n_bins: int, definition: str, over: bool) -> float:
    n_bins = check_n_bins(n_bins)
    _check_choice("definition", definition, CONFIDENCE_DEFINITIONS)
    p, y, conf, hits = _validate_top1(probs, labels)
    if definition == "conditional":
        return _conditional_confidence(conf, hits, over)
    counts, conf_sums, hit_sums = _bin_sums(conf, hits, n_bins, "equal_width")
    accuracy_b, confidence_b = _bin_means(counts, conf_sums, hit_sums)
    filled = counts > 0
    weights = counts[filled] / counts.sum()
    acc_f, conf_f = accuracy_b[filled], confidence_b[filled]
    if over:
        return float(np.sum(weights * conf_f * np.maximum(conf_f - acc_f, 0.0)))
    return float(np.sum(weights * (1.0 - conf_f) * np.maximum(acc_f - conf_f, 0.0)))


def overconfidence(
    probs: Any, labels: Any, n_bins: int = 15, definition: str = "conditional"
) -> float:
    r"""Overconfidence: how confident the classifier is where it is wrong.

    ``definition="conditional"`` (default) is the metric of the adaptive-label-smoothing paper
    (Krothapalli and Abbott, Sec. 4.2, "O.conf"; Mund et al., ICRA 2015), computed there with
    the implementation of Wenger et al. (AISTATS 2020, ``pycalib.scoring.overconfidence``):
    the mean confidence of the wrong predictions,

    .. math::

        o(f) = \mathbb{E}[c_i \mid \hat y_i \ne y_i]
        = \frac{\sum_i (1 - a_i)\, c_i}{\sum_i (1 - a_i)}

    It needs no bins (``n_bins`` is only checked) and is NaN when no prediction is wrong (a
    mean over an empty set). It is not a calibration error: a classifier that is wrong with
    confidence 0.3 has o = 0.3 even if its bins are calibrated.

    ``definition="binned"`` is the overconfidence error of Thulasidasan et al. (NeurIPS 2019,
    "On Mixup Training", Sec. 3), the part of the ECE where confidence exceeds accuracy, each
    bin weighted by its confidence:

    .. math::

        \mathrm{OE} = \sum_b \frac{|B_b|}{N}\, \mathrm{conf}_b
        \max(\mathrm{conf}_b - \mathrm{acc}_b, 0)

    over the equal-width bins of :func:`ece` (empty bins contribute nothing).

    References:
        Krothapalli and Abbott, "Adaptive Label Smoothing", arXiv:2009.06432 (objectness paper).
        Mund, Triebel and Cremers, "Active online confidence boosting for efficient object
        classification", ICRA 2015.
        Wenger, Kjellström and Triebel, "Non-Parametric Calibration for Classification",
        AISTATS 2020, arXiv:1906.04933 (``pycalib``).
        Thulasidasan et al., "On Mixup Training: Improved Calibration and Predictive
        Uncertainty for Deep Neural Networks", NeurIPS 2019, arXiv:1905.11001.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of equal-width bins M >= 1 of ``definition="binned"``. Defaults to
            ``15``.
        definition: ``"conditional"`` (the paper's) or ``"binned"``. Defaults to
            ``"conditional"``.

    Returns:
        Overconfidence in [0, 1] (NaN for ``"conditional"`` when every prediction is right).

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, if ``definition`` is unknown, or for invalid ``probs`` /
            ``labels``.
    """
    return _confidence_error(probs, labels, n_bins, definition, over=True)


def underconfidence(
    probs: Any, labels: Any, n_bins: int = 15, definition: str = "conditional"
) -> float:
    r"""Underconfidence: how uncertain the classifier is where it is right.

    ``definition="conditional"`` (default) is the metric of the adaptive-label-smoothing paper
    (Krothapalli and Abbott, Sec. 4.2, "U.conf"; Mund et al., ICRA 2015; Wenger et al.'s
    ``pycalib.scoring.underconfidence``): the mean uncertainty of the correct predictions,

    .. math::

        u(f) = \mathbb{E}[1 - c_i \mid \hat y_i = y_i]
        = \frac{\sum_i a_i (1 - c_i)}{\sum_i a_i}

    It needs no bins (``n_bins`` is only checked) and is NaN when no prediction is right.

    ``definition="binned"`` mirrors the binned overconfidence error of :func:`overconfidence`
    (Thulasidasan et al., NeurIPS 2019, define only OE): the part of the ECE where accuracy
    exceeds confidence, each bin weighted by its uncertainty,

    .. math::

        \mathrm{UE} = \sum_b \frac{|B_b|}{N}\, (1 - \mathrm{conf}_b)
        \max(\mathrm{acc}_b - \mathrm{conf}_b, 0)

    References:
        See :func:`overconfidence`.

    Args and Raises: as :func:`overconfidence`.

    Returns:
        Underconfidence in [0, 1] (NaN for ``"conditional"`` when every prediction is wrong).
    """
    return _confidence_error(probs, labels, n_bins, definition, over=False)
