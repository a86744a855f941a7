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
gathered by :func:`calibration_summary` and, for the estimators of the soft-calibration paper's
appendix, :func:`estimator_summary`; every column of the five papers' result tables
(:data:`TABLE_KEYS`, with the paper column each one reproduces) by :func:`table_summary`.
:class:`CalibrationMeter` accumulates the same metrics batch by batch in constant memory,
for outputs too large to hold (segmentation pixels).

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
"""

import math
import numbers
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "BINNINGS",
    "CALIBRATED_KEYS",
    "DENSE_KEYS",
    "CONFIDENCE_DEFINITIONS",
    "CalibrationMeter",
    "ESTIMATOR_KEYS",
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
    "ks_error",
    "marginal_ece",
    "mce",
    "nll",
    "overconfidence",
    "reliability_bins",
    "softmax",
    "sweep_ece",
    "table_summary",
    "underconfidence",
]

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

#: Binning schemes of :func:`ece`.
BINNINGS = ("equal_width", "equal_mass")
#: Norms of :func:`ece`: ``l1`` (ECE), ``l2`` (RMS calibration error), ``max`` (MCE).
NORMS = ("l1", "l2", "max")

#: Tolerance on probabilities slightly outside [0, 1] (float rounding of a softmax).
_PROB_TOLERANCE = 1e-6
#: Tolerance on row sums of ``probs``.
_ROW_SUM_TOLERANCE = 1e-3
#: Number of (N, K) entries the classwise ECE bins at a time (bounds its temporary memory).
_CHUNK_ENTRIES = 1 << 20
#: Entries per block of the checks and top-1 scan of ``probs`` (512 KiB of float32: in cache).
_BLOCK_ENTRIES = 1 << 17
#: Up to this many equal-mass cuts, bins are counted by comparisons (else a binary search).
_COMPARE_MAX_CUTS = 32


# --------------------------------------------------------------------------------------------
# Input conversion and validation
# --------------------------------------------------------------------------------------------


def _to_numpy(value: Any) -> np.ndarray:
    """Return a NumPy view/copy of a NumPy array, a PyTorch tensor or a nested sequence."""
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        tensor = value.detach().cpu()
        if tensor.is_floating_point() and tensor.element_size() < 4:
            tensor = tensor.float()  # float16/bfloat16: NumPy has no bfloat16
        return tensor.numpy()
    return np.asarray(value)


def _as_float_array(name: str, value: Any) -> np.ndarray:
    """Convert to a real floating array (ints and bools become float64, float16 float32)."""
    array = _to_numpy(value)
    if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
        return array.astype(np.float64)
    if array.dtype == np.float16:
        return array.astype(np.float32)
    if not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"`{name}` must hold real numbers, got dtype {array.dtype}")
    return array


def _check_n_bins(n_bins: object) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, numbers.Integral):
        raise TypeError(f"`n_bins` must be an integer, got {type(n_bins).__name__} {n_bins!r}")
    if n_bins < 1:
        raise ValueError(f"`n_bins` must be >= 1, got {n_bins}")
    return int(n_bins)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"`{name}` must be one of {listed}, got {value!r}")
    return value


def _probs_array(probs: Any) -> tuple[np.ndarray, float]:
    """Convert ``probs`` and check its shape; return it with the tolerance on its row sums."""
    # bfloat16 rounds each probability by up to 2**-8 relative: its rows may miss 1 by more than
    # 1e-3, so the row-sum tolerance grows to its epsilon 2**-7 (float16: 2**-10 < 1e-3).
    row_sum_tolerance = _ROW_SUM_TOLERANCE
    if str(getattr(probs, "dtype", "")) == "torch.bfloat16":
        row_sum_tolerance = max(_ROW_SUM_TOLERANCE, 2.0**-7)
    p = _as_float_array("probs", probs)
    if p.ndim != 2:
        raise ValueError(f"`probs` must be 2-D (N, K), got shape {tuple(p.shape)}")
    n, k = p.shape
    if n == 0 or k == 0:
        raise ValueError(f"`probs` must hold at least one sample and one class, got shape {(n, k)}")
    return p, row_sum_tolerance


def _check_probs_exact(p: np.ndarray, row_sum_tolerance: float) -> None:
    """The reference value checks of ``probs``: finite, in [0, 1], rows summing to 1.

    Raises the ``ValueError`` of the first failed condition. The fast checks of
    :func:`_check_probs` and :func:`_top1_scan` defer to this function whenever they cannot
    prove that all three conditions hold, so errors and the accepted inputs are exactly these.
    """
    # A NaN or inf anywhere in a row makes its sum NaN or inf: one pass checks both conditions.
    row_sums = p.sum(axis=1, dtype=np.float64)
    finite = np.isfinite(row_sums)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"`probs` must be finite; row {row} holds NaN or inf")
    low, high = float(p.min()), float(p.max())
    if low < -_PROB_TOLERANCE or high > 1.0 + _PROB_TOLERANCE:
        raise ValueError(
            f"`probs` must lie in [0, 1], got values in [{low:.6g}, {high:.6g}]; pass "
            "probabilities, not logits (see `softmax`)"
        )
    deviation = np.abs(row_sums - 1.0)
    worst = int(np.argmax(deviation))
    if deviation[worst] > row_sum_tolerance:
        raise ValueError(
            f"rows of `probs` must sum to 1 (within {row_sum_tolerance:g}); row {worst} sums "
            f"to {row_sums[worst]:.6g}"
        )


def _fast_bound(p: np.ndarray, row_sum_tolerance: float) -> float | None:
    r"""Tolerance on fast row sums that proves the exact check, or None (no fast path for ``p``).

    The fast checks take C-contiguous native float32/float64 arrays. A sum of K terms in any
    order with unit roundoff u errs by at most :math:`\gamma_{K-1} \sum_j |p_j|`,
    :math:`\gamma_m = m u / (1 - m u)`; with entries in [-1e-6, 1 + 1e-6] and a sum below 2,
    :math:`\sum_j |p_j| \le 2 + 2 K 10^{-6}`. The margin adds the errors of the fast sum (an
    ``einsum`` in the dtype of ``p``) and of the float64 sum of :func:`_check_probs_exact`, with
    a factor 2 to spare: a fast row sum within ``row_sum_tolerance - margin`` of 1 proves the
    exact row sum within the tolerance. (For float32 the margin reaches 1e-3 near K = 4000: no
    fast path beyond.)
    """
    if not (p.flags.c_contiguous and p.dtype.isnative and p.dtype in (np.float32, np.float64)):
        return None
    k = p.shape[1]
    eps = float(np.finfo(p.dtype).eps) + float(np.finfo(np.float64).eps)
    bound = row_sum_tolerance - k * eps * (2.0 + 2.0 * k * _PROB_TOLERANCE)
    return bound if bound > 0 else None


def _block_checks(block: np.ndarray) -> tuple[float, float]:
    """Minimum entry and largest |row sum - 1| of a block (NaN if it holds a NaN)."""
    # float sums in the dtype of the block; s - 1 is exact for s in [1/2, 2] (Sterbenz)
    return block.min(), np.max(np.abs(np.einsum("ij->i", block) - 1.0))


def _fast_checks_pass(low: float, high: float, deviation: float, bound: float) -> bool:
    """Whether all entries lie in [-1e-6, 1 + 1e-6] and all row sums within ``bound`` of 1.

    NaN anywhere makes these NaN, and NaN fails every comparison; entries in range are finite.
    """
    return low >= -_PROB_TOLERANCE and high <= 1.0 + _PROB_TOLERANCE and deviation <= bound


def _check_probs(p: np.ndarray, row_sum_tolerance: float) -> None:
    """Value checks of ``probs`` (see :func:`_check_probs_exact`), fast when they pass.

    One pass over blocks of about ``_BLOCK_ENTRIES`` entries (cache-sized): minimum, maximum
    and row sums of each block, the sums accepted within the bound of :func:`_fast_bound`.
    Anything else runs the exact checks, which raise the error.
    """
    bound = _fast_bound(p, row_sum_tolerance)
    if bound is not None:
        rows = max(1, _BLOCK_ENTRIES // p.shape[1])
        minima, maxima, deviations = [], [], []
        for start in range(0, p.shape[0], rows):
            block = p[start : start + rows]
            low, deviation = _block_checks(block)
            minima.append(low)
            deviations.append(deviation)
            maxima.append(block.max())
        if _fast_checks_pass(np.min(minima), np.max(maxima), np.max(deviations), bound):
            return
    _check_probs_exact(p, row_sum_tolerance)


def _validate_probs(probs: Any) -> np.ndarray:
    """Check ``probs`` (N, K) and return it as a NumPy array (the ``probs`` half of `_validate`).

    ``probs`` keeps its float32/float64 precision (no copy of a large float32 array; float16 and
    bfloat16 become float32). Rows must sum to 1 within 1e-3 (within 2**-7 for bfloat16 tensors,
    whose own rounding exceeds 1e-3).
    """
    p, row_sum_tolerance = _probs_array(probs)
    _check_probs(p, row_sum_tolerance)
    return p


def _top1_scan(p: np.ndarray, row_sum_tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """Check ``p`` (as :func:`_check_probs`) and return its argmax and top-1 confidence.

    One pass over blocks of about ``_BLOCK_ENTRIES`` entries: the checks of
    :func:`_check_probs` (the maximum entry is the largest confidence), ``np.argmax`` (first
    index on ties) and the confidence gathered at the argmax, all while the block is in cache.
    If the fast checks cannot prove ``p`` valid, the exact checks run and raise.

    Returns:
        ``(predictions, confidences)``: (N,) ``np.intp`` argmax and (N,) confidences in the dtype
        of ``p``, equal to ``p.argmax(axis=1)`` and ``p.max(axis=1)`` on valid input.
    """
    n, k = p.shape
    bound = _fast_bound(p, row_sum_tolerance)
    predictions = np.empty(n, dtype=np.intp)
    confidences = np.empty(n, dtype=p.dtype)
    minima, deviations = [], []
    rows = max(1, _BLOCK_ENTRIES // k)
    row_offsets = np.arange(min(rows, n), dtype=np.intp) * k  # row starts in a flat block
    for start in range(0, n, rows):
        block = p[start : start + rows]
        stop = start + block.shape[0]
        if bound is not None:
            low, deviation = _block_checks(block)
            minima.append(low)
            deviations.append(deviation)
        argmax = np.argmax(block, axis=1, out=predictions[start:stop])
        if p.flags.c_contiguous:  # gather from the flat view (take_along_axis is slower)
            flat_index = argmax + row_offsets[: stop - start]
            np.take(block.reshape(-1), flat_index, out=confidences[start:stop], mode="clip")
        else:
            confidences[start:stop] = np.take_along_axis(block, argmax[:, None], axis=1)[:, 0]
    if bound is not None:
        # argmax picks a NaN first, so a NaN entry makes the largest confidence NaN too
        high = np.max(confidences)
        if _fast_checks_pass(np.min(minima), high, np.max(deviations), bound):
            return predictions, confidences
    _check_probs_exact(p, row_sum_tolerance)
    return predictions, confidences


def _check_labels(labels: Any, n: int, k: int) -> np.ndarray:
    """Check ``labels`` (N,) against ``probs`` of shape (N, K); return it as ``np.intp``."""
    y = _to_numpy(labels)
    if y.shape != (n,):
        raise ValueError(
            f"`labels` must have shape ({n},) to match `probs` of shape {(n, k)}, "
            f"got {tuple(y.shape)}"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"`labels` must hold integer class indices, got dtype {y.dtype}")
    y_min, y_max = int(y.min()), int(y.max())
    if y_min < 0 or y_max >= k:
        raise ValueError(
            f"`labels` must lie in [0, {k}) for K={k} classes, got values in [{y_min}, {y_max}]"
        )
    return y.astype(np.intp, copy=False)


def _validate(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Check ``probs`` (N, K) and ``labels`` (N,) and return them as NumPy arrays.

    ``probs`` is checked by :func:`_validate_probs`; ``labels`` becomes ``np.intp``.
    """
    p = _validate_probs(probs)
    return p, _check_labels(labels, *p.shape)


def _validate_top1(
    probs: Any, labels: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_validate` fused with :func:`_confidences_and_hits` (one scan of ``probs``).

    Returns:
        ``(p, y, confidences, hits)`` as :func:`_validate` and :func:`_confidences_and_hits`.
    """
    p, row_sum_tolerance = _probs_array(probs)
    predictions, confidences = _top1_scan(p, row_sum_tolerance)
    y = _check_labels(labels, *p.shape)
    return p, y, confidences, predictions == y


# --------------------------------------------------------------------------------------------
# The shared binning helper and bin reductions
# --------------------------------------------------------------------------------------------


def _equal_width_edges(n_bins: int) -> np.ndarray:
    """Edges 0, 1/M, ..., 1 in float64, each the float nearest b / M (so 3/5 == 0.6)."""
    return np.arange(n_bins + 1, dtype=np.float64) / n_bins


def _equal_mass_bins(scores: np.ndarray, n_bins: int) -> np.ndarray:
    r"""Equal-mass bin of every score, equal to a stable argsort cut by ``np.array_split``.

    Group b of ``np.array_split`` holds the sorted positions from
    :math:`s_b = b q + \min(b, r)` on, :math:`(q, r) = \operatorname{divmod}(N, M)`, so the
    sample at sorted position j is in bin :math:`\#\{b \ge 1: s_b \le j\}`. Without sorting:
    ``np.partition`` gives the cut values :math:`v_b` (the scores at positions :math:`s_b`); a
    score x unequal to :math:`v_b` is past cut b iff :math:`x > v_b`; a score equal to
    :math:`v_b` sits at position L + rank (L scores are smaller, rank = its order among the
    equal scores by sample index, as in a stable sort), past cut b iff L + rank >= :math:`s_b`.
    """
    n = scores.shape[0]
    q, r = divmod(n, n_bins)
    b = np.arange(1, n_bins, dtype=np.intp)
    starts = b * q + np.minimum(b, r)
    starts = starts[starts < n]  # more bins than samples: the trailing groups are empty
    if starts.size == 0:
        return np.zeros(n, dtype=np.intp)
    cut_values = np.partition(scores, starts)[starts]  # non-decreasing
    # index = #{b: v_b < x}: the bin of every score that equals no cut value.
    if cut_values.size <= _COMPARE_MAX_CUTS:  # (< 256) one byte per score while counting
        below = np.zeros(n, dtype=np.uint8)
        for value in cut_values:
            below += (scores > value).view(np.uint8)
        index = below.astype(np.intp)
    else:
        index = np.searchsorted(cut_values, scores, side="left")
    # A score equal to a cut value v has index = f, the first cut with value v. Its position in
    # the stable sort is L(v) + rank (L(v) scores are smaller, rank = its order among the scores
    # equal to v), so it is past the cuts c >= f of value v with s_c - L(v) <= rank.
    tied = np.flatnonzero(cut_values[np.minimum(index, cut_values.size - 1)] == scores)
    first = index[tied]
    order = np.argsort(first, kind="stable")  # by value, then by sample index
    tied, first = tied[order], first[order]
    group_starts = np.flatnonzero(np.diff(first, prepend=-1))
    sizes = np.diff(group_starts, append=first.size)
    ranks = np.arange(first.size, dtype=np.intp) - np.repeat(group_starts, sizes)
    # at_most[f] = #{x: index(x) <= f} counts the scores < v and those == v:
    # L(v) = at_most[f] - #{x == v}.
    at_most = np.cumsum(np.bincount(index, minlength=cut_values.size + 1))
    equal = np.bincount(first, minlength=cut_values.size)
    cut_first = np.searchsorted(cut_values, cut_values, side="left")
    thresholds = starts - (at_most[cut_first] - equal[cut_first])  # in [0, N]
    # One binary search for all values: key (f, t) = f * (N + 1) + t sorts by f, then by t.
    cut_keys = cut_first * (n + 1) + thresholds
    passed = np.searchsorted(cut_keys, first * (n + 1) + ranks, side="right") - first
    index[tied] = first + passed
    return index


def _assign_bins(scores: np.ndarray, n_bins: int, binning: str = "equal_width") -> np.ndarray:
    """Bin index in [0, n_bins) of every score: THE binning rule of every metric here.

    ``equal_width``: bin b is :math:`(e_b, e_{b+1}]` with the edges of
    :func:`_equal_width_edges` cast to the dtype of ``scores``; 0.0 (and anything below the
    first edge) goes to bin 0, 1.0 (and anything above) to bin ``n_bins - 1``. Works on any shape.

    ``equal_mass``: ``scores`` must be 1-D (and hold no NaN); a stable sort followed by
    ``np.array_split`` into ``n_bins`` groups; group g is bin g (groups are empty when
    ``n_bins`` > N). Computed without sorting by :func:`_equal_mass_bins`.

    Args:
        scores: float array of confidences or class scores in [0, 1].
        n_bins: number of bins M >= 1.
        binning: ``"equal_width"`` or ``"equal_mass"``.

    Returns:
        ``np.intp`` array of the shape of ``scores``.
    """
    if binning == "equal_mass":
        return _equal_mass_bins(scores, n_bins)

    # Fast path: ceil(s * M) - 1 is the (lo, hi] bin except where rounding of s * M or of an
    # edge flips a comparison. Both roundings are below M * eps in units of s * M, so only
    # scores within 2 * M * eps of an interior integer are re-binned exactly by searchsorted.
    # (np.searchsorted on every entry is ~10x slower on (1e6, 100) class scores.)
    scaled = scores * n_bins
    index = np.ceil(scaled).astype(np.intp)
    index -= 1
    np.clip(index, 0, n_bins - 1, out=index)
    if n_bins > 1:
        nearest = np.rint(scaled)
        tolerance = 2.0 * n_bins * np.finfo(scores.dtype).eps
        near_edge = np.abs(scaled - nearest) <= tolerance
        near_edge &= nearest >= 1
        near_edge &= nearest <= n_bins - 1
        candidates = np.flatnonzero(near_edge)
        if candidates.size:
            edges = _equal_width_edges(n_bins).astype(scores.dtype)
            exact = np.searchsorted(edges, scores.reshape(-1)[candidates], side="left") - 1
            index.reshape(-1)[candidates] = np.clip(exact, 0, n_bins - 1)
    return index


def _bin_sums(
    scores: np.ndarray, hits: np.ndarray, n_bins: int, binning: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin count, sum of scores and sum of hits (float64), binned by :func:`_assign_bins`.

    ``hits`` is boolean; its per-bin sums are counts, exact in float64.
    """
    index = _assign_bins(scores, n_bins, binning)
    score_sums = np.bincount(index, weights=scores, minlength=n_bins)
    # counts and hits in one pass: slot 2b + a_i counts the misses (a_i = 0) and hits of bin b
    pairs = np.bincount(2 * index + hits, minlength=2 * n_bins).reshape(n_bins, 2)
    counts = pairs.sum(axis=1)
    hit_sums = pairs[:, 1].astype(np.float64)
    return counts, score_sums, hit_sums


def _bin_means(
    counts: np.ndarray, score_sums: np.ndarray, hit_sums: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin accuracy and mean score, NaN for empty bins."""
    accuracy_b = np.full(counts.shape, np.nan)
    confidence_b = np.full(counts.shape, np.nan)
    filled = counts > 0
    accuracy_b[filled] = hit_sums[filled] / counts[filled]
    confidence_b[filled] = score_sums[filled] / counts[filled]
    return accuracy_b, confidence_b


def _reduce_gaps(
    counts: np.ndarray, accuracy_b: np.ndarray, confidence_b: np.ndarray, norm: str
) -> float:
    """Weighted l1 / l2 / max of the per-bin gaps |acc_b - conf_b| over non-empty bins."""
    filled = counts > 0
    if not filled.any():
        return float("nan")
    weights = counts[filled] / counts.sum()
    gaps = np.abs(accuracy_b[filled] - confidence_b[filled])
    if norm == "l1":
        return float(np.sum(weights * gaps))
    if norm == "l2":
        return float(math.sqrt(np.sum(weights * gaps**2)))
    return float(gaps.max())


def _confidences_and_hits(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 confidence c_i (dtype of ``p``) and hit a_i (bool) of every sample."""
    predictions = p.argmax(axis=1)
    confidences = np.take_along_axis(p, predictions[:, None], axis=1)[:, 0]
    return confidences, predictions == y


def _ece(conf: np.ndarray, hits: np.ndarray, n_bins: int, binning: str, norm: str) -> float:
    counts, conf_sums, hit_sums = _bin_sums(conf, hits, n_bins, binning)
    return _reduce_gaps(counts, *_bin_means(counts, conf_sums, hit_sums), norm)


def _classwise_block(
    block: np.ndarray, labels: np.ndarray, n_bins: int, first_edge: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-slot sums of one block of rows for :func:`_classwise_ece` (class c owns slots c*M ...).

    Returns the counts and hit counts of every slot, the score sums of the slots of bins >= 1
    (``np.bincount``, in row order) and the score sums of bin 0 per class. Bin 0 (scores <=
    ``first_edge``) holds most entries when K is large; its sums are column sums of the block
    with the other entries zeroed: ``np.add.reduce`` along axis 0 adds the rows in order and
    adding 0.0 leaves a float64 sum unchanged, so they equal the in-order ``np.bincount`` sums
    bit for bit, at a fraction of the cost.
    """
    m, k = block.shape
    size = k * n_bins
    flat = np.ascontiguousarray(block).reshape(-1)
    upper = np.flatnonzero(flat > first_edge)  # flat positions of the entries in bins >= 1
    values = flat[upper]
    slots = _assign_bins(values, n_bins)
    slots += (upper % k) * n_bins
    counts = np.bincount(slots, minlength=size)
    counts[::n_bins] = m - counts.reshape(k, n_bins).sum(axis=1)
    upper_sums = np.bincount(slots, weights=values, minlength=size)
    zeroed = flat.copy()
    zeroed[upper] = 0
    zero_sums = np.add.reduce(zeroed.reshape(m, k), axis=0, dtype=np.float64)
    # The indicator 1[y_i = k] is 1 only at (i, y_i): one hit per row.
    true_scores = flat[np.arange(m, dtype=np.intp) * k + labels]
    hits = np.bincount(_assign_bins(true_scores, n_bins) + labels * n_bins, minlength=size)
    return counts, upper_sums, zero_sums, hits


def _classwise_ece(p: np.ndarray, y: np.ndarray, n_bins: int) -> float:
    n, k = p.shape
    counts = np.zeros(k * n_bins, dtype=np.int64)
    score_sums = np.zeros(k * n_bins)
    hit_sums = np.zeros(k * n_bins)
    first_edge = _equal_width_edges(n_bins).astype(p.dtype)[1] if n_bins > 1 else np.inf
    rows = max(1, _CHUNK_ENTRIES // k)
    starts = range(0, n, rows)

    def block_sums(start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return _classwise_block(
            p[start : start + rows], y[start : start + rows], n_bins, first_edge
        )

    def add(parts: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
        # Blocks are added in row order, as one loop over blocks would: the same float64 sums.
        block_counts, upper_sums, zero_sums, hits = parts
        counts[:] += block_counts
        score_sums[:] += upper_sums
        score_sums[::n_bins] += zero_sums
        hit_sums[:] += hits

    # NumPy releases the GIL in these loops: blocks run on as many threads as torch may use.
    workers = min(torch.get_num_threads(), len(starts))
    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="raysearch-metrics") as pool:
            for parts in pool.map(block_sums, starts):
                add(parts)
    else:
        for start in starts:
            add(block_sums(start))
    counts = counts.reshape(k, n_bins)
    accuracy_b, confidence_b = _bin_means(
        counts, score_sums.reshape(k, n_bins), hit_sums.reshape(k, n_bins)
    )
    per_class = [_reduce_gaps(counts[c], accuracy_b[c], confidence_b[c], "l1") for c in range(k)]
    return float(np.mean(per_class))


def _nll(p: np.ndarray, y: np.ndarray, eps: float) -> float:
    true_probs = p[np.arange(p.shape[0]), y].astype(np.float64)
    return float(-np.mean(np.log(np.maximum(true_probs, eps))))


def _brier(p: np.ndarray, y: np.ndarray) -> float:
    # sum_k (p_k - 1[k = y])^2 = sum_k p_k^2 - 2 p_y + 1, without building the one-hot matrix.
    squares = np.einsum("ij,ij->i", p, p, dtype=np.float64)
    true_probs = p[np.arange(p.shape[0]), y].astype(np.float64)
    return float(max(0.0, np.mean(squares - 2.0 * true_probs + 1.0)))


# --------------------------------------------------------------------------------------------
# Public metrics
# --------------------------------------------------------------------------------------------


def softmax(logits: Any, axis: int = -1) -> np.ndarray:
    r"""Numerically stable softmax, for turning stored logits into ``probs``.

    Computes :math:`\exp(z_k - \max_j z_j) / \sum_l \exp(z_l - \max_j z_j)` in float64.

    Args:
        logits: real array or tensor (e.g. (N, K) float); ``-inf`` entries get probability 0.
        axis: axis holding the classes. Defaults to ``-1``.

    Returns:
        float64 NumPy array of the shape of ``logits`` whose slices along ``axis`` sum to 1.

    Raises:
        TypeError: if ``logits`` does not hold real numbers.
        ValueError: if ``logits`` is a scalar, or holds NaN, ``+inf`` or a slice that is ``-inf``
            everywhere.
    """
    z = _as_float_array("logits", logits).astype(np.float64)
    if z.ndim == 0:
        raise ValueError("`logits` must have at least one dimension, got a scalar")
    top = z.max(axis=axis, keepdims=True)
    if not np.isfinite(top).all():
        raise ValueError(
            "`logits` must be finite (-inf is allowed where a slice has a finite entry); found "
            "NaN, +inf or an all -inf slice"
        )
    e = np.exp(z - top)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def accuracy(probs: Any, labels: Any) -> float:
    """Top-1 accuracy: fraction of samples whose argmax class (first on ties) is the label.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).

    Returns:
        Accuracy in [0, 1].

    Raises:
        ValueError: if ``probs`` is not 2-D, not finite, outside [0, 1] or has rows not summing
            to 1 within 1e-3; if ``labels`` has the wrong shape, is not integer or is outside
            [0, K).
        TypeError: if ``probs`` does not hold real numbers.
    """
    _, _, _, hits = _validate_top1(probs, labels)
    return float(np.mean(hits))


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
    n_bins = _check_n_bins(n_bins)
    _check_choice("binning", binning, BINNINGS)
    _check_choice("norm", norm, NORMS)
    _, _, conf, hits = _validate_top1(probs, labels)
    return _ece(conf, hits, n_bins, binning, norm)


def adaptive_ece(probs: Any, labels: Any, n_bins: int = 15) -> float:
    """Adaptive ECE (AECE): :func:`ece` with ``binning="equal_mass"`` and ``norm="l1"``.

    The N confidences are sorted and split into M bins of N // M or N // M + 1 samples
    (``np.array_split``), each sample counted once (Nixon et al., CVPR-W 2019; the AECE of the
    ACLS and MbLS papers).

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1. Defaults to ``15``.

    Returns:
        Calibration error in [0, 1].

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, or for invalid ``probs`` / ``labels``.
    """
    return ece(probs, labels, n_bins=n_bins, binning="equal_mass", norm="l1")


def classwise_ece(probs: Any, labels: Any, n_bins: int = 15) -> float:
    r"""Classwise ECE: the equal-width ECE of every class score, averaged over the K classes.

    .. math::

        \mathrm{cECE} = \frac{1}{K} \sum_{k=1}^{K} \sum_b \frac{|B_{kb}|}{N}
        |\mathrm{freq}_{kb} - \mathrm{conf}_{kb}|

    where :math:`B_{kb}` holds the samples whose score :math:`p_{ik}` (all N samples, not only
    those predicted as k) falls in equal-width bin b, :math:`\mathrm{freq}_{kb}` is the fraction
    of them with label k and :math:`\mathrm{conf}_{kb}` their mean :math:`p_{ik}` (Kull et al.,
    NeurIPS 2019; the static calibration error of Nixon et al., CVPR-W 2019). K comes from the
    width of ``probs``, never from the labels.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1. Defaults to ``15``.

    Returns:
        Calibration error in [0, 1].

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, or for invalid ``probs`` / ``labels``.
    """
    n_bins = _check_n_bins(n_bins)
    p, y = _validate(probs, labels)
    return _classwise_ece(p, y, n_bins)


def mce(probs: Any, labels: Any, n_bins: int = 15) -> float:
    """Maximum calibration error: the largest |acc_b - conf_b| over non-empty equal-width bins.

    Same as ``ece(probs, labels, n_bins, norm="max")`` (Naeini et al., AAAI 2015).

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1. Defaults to ``15``.

    Returns:
        Calibration error in [0, 1].

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, or for invalid ``probs`` / ``labels``.
    """
    return ece(probs, labels, n_bins=n_bins, binning="equal_width", norm="max")


def nll(probs: Any, labels: Any, eps: float = 1e-12) -> float:
    r"""Negative log-likelihood: mean over samples of :math:`-\log \max(p_{i y_i}, \epsilon)`.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        eps: floor on the probability of the true class, in (0, 1). Defaults to ``1e-12``
            (a zero probability costs -log(1e-12) ~ 27.6 instead of infinity).

    Returns:
        NLL in nats, in [0, -log(eps)].

    Raises:
        TypeError: if ``eps`` is not a real number or ``probs`` does not hold real numbers.
        ValueError: if ``eps`` is not in (0, 1), or for invalid ``probs`` / ``labels``.
    """
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"`eps` must be a real number, got {type(eps).__name__} {eps!r}")
    if not 0.0 < eps < 1.0:
        raise ValueError(f"`eps` must be in (0, 1), got {eps}")
    p, y = _validate(probs, labels)
    return _nll(p, y, float(eps))


def brier(probs: Any, labels: Any) -> float:
    r"""Multi-class Brier score: mean over samples of :math:`\sum_k (p_{ik} - 1[k = y_i])^2`.

    Not divided by K (Brier 1950), so it lies in [0, 2]: 0 for a confident correct prediction,
    2 for a confident wrong one.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).

    Returns:
        Brier score in [0, 2].

    Raises:
        TypeError: if ``probs`` does not hold real numbers.
        ValueError: for invalid ``probs`` / ``labels`` (see :func:`accuracy`).
    """
    p, y = _validate(probs, labels)
    return _brier(p, y)


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
    n_bins = _check_n_bins(n_bins)
    _, _, conf, hits = _validate_top1(probs, labels)
    counts, conf_sums, hit_sums = _bin_sums(conf, hits, n_bins, "equal_width")
    accuracy_b, confidence_b = _bin_means(counts, conf_sums, hit_sums)
    return ReliabilityBins(_equal_width_edges(n_bins), counts, accuracy_b, confidence_b)


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
    n_bins = _check_n_bins(n_bins)
    p, y, conf, hits = _validate_top1(probs, labels)
    counts, conf_sums, hit_sums = _bin_sums(conf, hits, n_bins, "equal_width")
    accuracy_b, confidence_b = _bin_means(counts, conf_sums, hit_sums)
    return {
        "accuracy": float(np.mean(hits)),
        "ece": _reduce_gaps(counts, accuracy_b, confidence_b, "l1"),
        "aece": _ece(conf, hits, n_bins, "equal_mass", "l1"),
        "cece": _classwise_ece(p, y, n_bins),
        "mce": _reduce_gaps(counts, accuracy_b, confidence_b, "max"),
        "nll": _nll(p, y, 1e-12),
        "brier": _brier(p, y),
    }


# --------------------------------------------------------------------------------------------
# Additional metrics: KS error, over-/under-confidence, average confidence, ECE interval
# --------------------------------------------------------------------------------------------

#: Definitions of :func:`overconfidence` and :func:`underconfidence`.
CONFIDENCE_DEFINITIONS = ("conditional", "binned")


def _ks(conf: np.ndarray, hits: np.ndarray) -> float:
    n = conf.shape[0]
    order = np.argsort(conf, kind="stable")
    sorted_conf = conf[order]
    gaps = np.cumsum(sorted_conf.astype(np.float64) - hits[order])
    # Read the cumulative gap only at the last sample of every run of tied confidences: the
    # empirical curves are step functions of the confidence, so the order within a tie must
    # not matter (a per-sample maximum would depend on how the sort breaks ties).
    run_ends = np.flatnonzero(np.diff(sorted_conf, append=np.inf) != 0)
    return float(np.max(np.abs(gaps[run_ends])) / n)


def ks_error(probs: Any, labels: Any) -> float:
    r"""Kolmogorov-Smirnov calibration error of the top-1 confidence (binning-free).

    With the samples sorted by increasing confidence :math:`c_{(1)} \le \dots \le c_{(N)}` and
    :math:`a_{(i)}` their hits,

    .. math::

        \mathrm{KS} = \max_i \Big| \frac{1}{N} \sum_{j \le i} c_{(j)}
        - \frac{1}{N} \sum_{j \le i} a_{(j)} \Big|

    the largest gap between the cumulative confidence and the cumulative accuracy (Gupta et al.,
    ICLR 2021, Sec. 4, "KS error"). The maximum runs over the last index of every group of tied
    confidences, so the value does not depend on how ties are ordered; without ties this is
    exactly the released code (``argsort`` then ``cumsum``). Example: two samples at
    confidence 0.5, one right and one wrong, are perfectly calibrated: KS = 0 here, while a
    per-sample maximum would give 0.25 whichever order the sort picks.

    References:
        Gupta, Rahimi, Ajanthan, Mensink, Sminchisescu and Hartley, "Calibration of Neural
        Networks using Splines", ICLR 2021, arXiv:2006.12800.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).

    Returns:
        KS error in [0, 1].

    Raises:
        TypeError: if ``probs`` does not hold real numbers.
        ValueError: for invalid ``probs`` / ``labels`` (see :func:`accuracy`).
    """
    _, _, conf, hits = _validate_top1(probs, labels)
    return _ks(conf, hits)


def _conditional_confidence(conf: np.ndarray, hits: np.ndarray, over: bool) -> float:
    """Mean confidence of the misses (`over`) or mean uncertainty of the hits; NaN if none."""
    selected = ~hits if over else hits
    if not selected.any():
        return float("nan")
    values = conf[selected].astype(np.float64)
    return float(np.mean(values if over else 1.0 - values))


def _confidence_error(probs: Any, labels: Any, n_bins: int, definition: str, over: bool) -> float:
    n_bins = _check_n_bins(n_bins)
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

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of equal-width bins M >= 1 of ``definition="binned"``. Defaults to
            ``15``.
        definition: ``"conditional"`` (the paper's) or ``"binned"``. Defaults to
            ``"conditional"``.

    Returns:
        Underconfidence in [0, 1] (NaN for ``"conditional"`` when every prediction is wrong).

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, if ``definition`` is unknown, or for invalid ``probs`` /
            ``labels``.
    """
    return _confidence_error(probs, labels, n_bins, definition, over=False)


def average_confidence(probs: Any) -> float:
    r"""Average top-1 confidence :math:`\frac{1}{N} \sum_i \max_k p_{ik}` ("A.conf").

    The "average confidence" of the adaptive-label-smoothing paper (Krothapalli and Abbott,
    Table 1 and App. A.7); needs no labels. Compare it with :func:`accuracy`: their difference
    is the ECE with a single bin.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.

    Returns:
        Average confidence in [1/K, 1].

    Raises:
        TypeError: if ``probs`` does not hold real numbers.
        ValueError: if ``probs`` is not 2-D, not finite, outside [0, 1] or has rows not summing
            to 1 within 1e-3.
    """
    p, row_sum_tolerance = _probs_array(probs)
    _, confidences = _top1_scan(p, row_sum_tolerance)
    return float(np.mean(confidences, dtype=np.float64))


def _equal_mass_positions(n: int, n_bins: int) -> np.ndarray:
    """Bin of every position 0..n-1 of a sorted sample under ``np.array_split(n, n_bins)``."""
    index = np.empty(n, dtype=np.intp)
    for b, group in enumerate(np.array_split(np.arange(n), n_bins)):
        index[group] = b
    return index


def _ece_replicates(
    conf: np.ndarray,
    hits: np.ndarray,
    samples: np.ndarray,
    n_bins: int,
    binning: str,
    norm: str,
) -> np.ndarray:
    """ECE of every bootstrap replicate, no Python loop over replicates or samples.

    Args:
        conf: (N,) top-1 confidences.
        hits: (N,) bool hits.
        samples: (R, N) int indices into ``conf``; row r is replicate r.
        n_bins: number of bins M.
        binning: ``"equal_width"`` or ``"equal_mass"``.
        norm: ``"l1"``, ``"l2"`` or ``"max"``.

    Returns:
        (R,) float64: ``ece(probs[samples[r]], labels[samples[r]], ...)`` for every r.
    """
    replicates, n = samples.shape
    scores = conf[samples]
    correct = hits[samples]
    if binning == "equal_width":
        slots = _assign_bins(scores, n_bins)
    else:
        # Sort every replicate (stable, as _assign_bins does), then position j of the sorted
        # row belongs to array_split group _equal_mass_positions[j] in every replicate.
        order = np.argsort(scores, axis=1, kind="stable")
        scores = np.take_along_axis(scores, order, axis=1)
        correct = np.take_along_axis(correct, order, axis=1)
        slots = np.broadcast_to(_equal_mass_positions(n, n_bins), (replicates, n)).copy()
    # Replicate r owns slots r*M ... r*M + M - 1: one bincount bins every replicate at once.
    slots += (np.arange(replicates, dtype=np.intp) * n_bins)[:, None]
    flat = slots.reshape(-1)
    size = replicates * n_bins
    counts = np.bincount(flat, minlength=size).reshape(replicates, n_bins)
    score_sums = np.bincount(flat, weights=scores.reshape(-1), minlength=size)
    hit_sums = np.bincount(flat, weights=correct.reshape(-1), minlength=size)
    filled = counts > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy_b = hit_sums.reshape(replicates, n_bins) / counts
        confidence_b = score_sums.reshape(replicates, n_bins) / counts
    gaps = np.where(filled, np.abs(accuracy_b - confidence_b), 0.0)
    if norm == "max":
        return gaps.max(axis=1)
    weights = counts / n
    if norm == "l2":
        return np.sqrt(np.sum(weights * gaps**2, axis=1))
    return np.sum(weights * gaps, axis=1)


def ece_ci(
    probs: Any,
    labels: Any,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int | None = 0,
    n_bins: int = 15,
    *,
    binning: str = "equal_width",
    norm: str = "l1",
) -> tuple[float, float, float]:
    r"""ECE with a bootstrap percentile confidence interval.

    Draws ``n_boot`` replicates of N samples with replacement (``numpy.random.Generator``
    seeded by ``seed``), computes the :func:`ece` of each with the same ``n_bins``, ``binning``
    and ``norm`` (equal-mass bins are recomputed per replicate), and returns the point estimate
    on all samples with the :math:`\alpha/2` and :math:`1 - \alpha/2` quantiles of the
    replicates (``np.quantile``, linear interpolation). Replicates are binned together with one
    ``np.bincount`` on replicate-offset bin ids, in chunks of about 2**20 sample draws.

    ECE is biased upwards on finite samples and a replicate holds only ~63% distinct samples,
    so the replicates sit slightly above the point estimate; for a nearly calibrated classifier
    on few samples the point estimate can even fall below ``low``. The interval measures the
    sampling spread of the estimate, not a test of perfect calibration.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_boot: number of bootstrap replicates, >= 2. Defaults to ``1000``.
        alpha: miscoverage in (0, 1); the interval has level 1 - alpha. Defaults to ``0.05``.
        seed: seed of ``np.random.default_rng`` (>= 0), or None for fresh entropy. The same
            seed gives the same interval. Defaults to ``0``.
        n_bins: number of bins M >= 1. Defaults to ``15``.
        binning: ``"equal_width"`` or ``"equal_mass"``, as in :func:`ece`. Defaults to
            ``"equal_width"``.
        norm: ``"l1"``, ``"l2"`` or ``"max"``, as in :func:`ece`. Defaults to ``"l1"``.

    Returns:
        ``(point, low, high)``: the ECE of all samples and the bounds of the percentile
        interval, Python floats in [0, 1].

    Raises:
        TypeError: if ``n_boot``, ``n_bins`` or ``seed`` is not an integer, ``alpha`` not a real
            number, or ``probs`` does not hold real numbers.
        ValueError: if ``n_boot`` < 2, ``alpha`` not in (0, 1), ``seed`` < 0, ``n_bins`` < 1,
            ``binning`` or ``norm`` unknown, or for invalid ``probs`` / ``labels``.
    """
    if isinstance(n_boot, bool) or not isinstance(n_boot, numbers.Integral):
        raise TypeError(f"`n_boot` must be an integer, got {type(n_boot).__name__} {n_boot!r}")
    if n_boot < 2:
        raise ValueError(f"`n_boot` must be >= 2 (an interval needs replicates), got {n_boot}")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"`alpha` must be a real number, got {type(alpha).__name__} {alpha!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"`alpha` must be in (0, 1), got {alpha}")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"`seed` must be an integer or None, got {type(seed).__name__}")
        if seed < 0:
            raise ValueError(f"`seed` must be >= 0, got {seed}")
    n_bins = _check_n_bins(n_bins)
    _check_choice("binning", binning, BINNINGS)
    _check_choice("norm", norm, NORMS)
    p, y, conf, hits = _validate_top1(probs, labels)
    point = _ece(conf, hits, n_bins, binning, norm)

    n = conf.shape[0]
    rng = np.random.default_rng(seed)
    per_chunk = max(1, _CHUNK_ENTRIES // n)
    replicates = np.empty(int(n_boot))
    for start in range(0, int(n_boot), per_chunk):
        stop = min(start + per_chunk, int(n_boot))
        samples = rng.integers(0, n, size=(stop - start, n))
        replicates[start:stop] = _ece_replicates(conf, hits, samples, n_bins, binning, norm)
    low, high = np.quantile(replicates, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(point), float(low), float(high)


# --------------------------------------------------------------------------------------------
# Estimators with less bias: debiased l2 CE, monotonic-sweep CE, marginal CE, their summary
# --------------------------------------------------------------------------------------------

#: Keys of :func:`estimator_summary`, in order (logged as ``{split}_{key}``).
ESTIMATOR_KEYS = ("ece_l2em", "debiased_ce", "sweep_ce", "marginal_ece", "ks")


def _debiased_ce(conf: np.ndarray, hits: np.ndarray, n_bins: int) -> float:
    counts, conf_sums, hit_sums = _bin_sums(conf, hits, n_bins, "equal_mass")
    # Bins with fewer than 2 samples contribute 0 (no variance estimate), but their samples
    # stay in N: the weights are |B_b| / N over all samples, as in the released code.
    multi = counts >= 2
    sizes = counts[multi].astype(np.float64)
    accuracy_b = hit_sums[multi] / sizes
    gaps = conf_sums[multi] / sizes - accuracy_b
    variances = accuracy_b * (1.0 - accuracy_b) / (sizes - 1.0)
    total = float(np.sum(sizes / conf.shape[0] * (gaps**2 - variances)))
    return math.sqrt(max(total, 0.0))


def _equal_width_index(scores: Any, n_bins: Any, dtype: np.dtype) -> np.ndarray:
    """Equal-width bin of ``scores`` under ``n_bins`` bins, broadcast over both arguments.

    The rule of :func:`_assign_bins` (bin g is (e_g, e_{g+1}], edges ``g / M`` in float64 cast
    to ``dtype``, clipped to [0, M - 1]) for many bin counts at once: ``ceil(s * M) - 1``,
    moved by one where a comparison with the exact edges disagrees (rounding of ``s * M``
    shifts it by at most one bin).
    """
    scores = np.asarray(scores, dtype=dtype)
    n_bins = np.asarray(n_bins, dtype=np.int64)
    index = np.clip(np.ceil(scores * n_bins).astype(np.int64) - 1, 0, n_bins - 1)

    def edge(g: np.ndarray) -> np.ndarray:
        return (g.astype(np.float64) / n_bins).astype(dtype)

    index = index - ((index >= 1) & (edge(index) >= scores))
    above = np.minimum(index + 1, n_bins - 1)
    return index + ((index + 1 <= n_bins - 1) & (edge(above) < scores))


def _sweep_n_bins(conf: np.ndarray, hits: np.ndarray, binning: str) -> int:
    """Bin count b* of the monotonic sweep (see :func:`sweep_ece`), 1 <= b* <= max(1, N - 1).

    Tries b = 2, 3, ..., N - 1 and stops at the first b whose non-empty bins, in order of
    confidence, have a decreasing accuracy; b* is the last b before it (1 if b = 2 fails).
    Every bin is a run of the stable sort of ``conf`` (``equal_mass``: the runs
    ``np.array_split`` cuts; ``equal_width``: the runs between the (lo, hi] edges), exactly the
    bins of :func:`_assign_bins`.

    Only part of the sorted order can break monotonicity: before the first hit every sample is
    a miss and after the last miss every sample is a hit, so bins lying wholly there have
    accuracy 0 and 1, which precede and follow any accuracy in [0, 1]. A bin count is checked
    only on the bins meeting that region (positions ``start`` to ``stop``); when the region
    lies in one bin, b is monotone without a check. Hit counts come from prefix sums of the
    sorted hits, so a b costs O(min(bins in the region, region size)), not O(N).
    """
    n = conf.shape[0]
    if n < 3:
        return 1
    order = np.argsort(conf, kind="stable")
    sorted_hits = hits[order]
    misses = np.flatnonzero(~sorted_hits)
    start = int(np.argmax(sorted_hits))  # the first hit (0 if there is none)
    if misses.size == 0 or not sorted_hits[start] or misses[-1] < start:
        return n - 1  # no hit precedes a miss: every b is monotone
    stop = int(misses[-1])
    cumulative = np.concatenate(([0], np.cumsum(sorted_hits, dtype=np.int64)))
    sorted_conf = conf[order]
    counts_b = np.arange(2, n, dtype=np.int64)
    if binning == "equal_mass":
        q, r = np.divmod(n, counts_b)  # q >= 1 as b < N

        def position_bin(j: int) -> np.ndarray:
            split = r * (q + 1)  # the first r groups hold q + 1 samples
            return np.where(j < split, j // (q + 1), r + (j - split) // q)

        low, high = position_bin(start), position_bin(stop)
    else:
        low = _equal_width_index(sorted_conf[start], counts_b, conf.dtype)
        high = _equal_width_index(sorted_conf[stop], counts_b, conf.dtype)
    region = stop - start + 1
    for i in np.flatnonzero(high > low):
        b, g_low, g_high = int(counts_b[i]), int(low[i]), int(high[i])
        if binning == "equal_mass":
            groups = np.arange(g_low, g_high + 2, dtype=np.int64)
            bounds = groups * q[i] + np.minimum(groups, r[i])
        else:

            def cut(g: int, b: int = b) -> int:
                # first sorted position past edge g: scores <= e_g are in bins < g
                edge = np.asarray(g / b, dtype=np.float64).astype(conf.dtype)
                return int(np.searchsorted(sorted_conf, edge, side="right"))

            left = 0 if g_low == 0 else cut(g_low)
            right = n if g_high == b - 1 else cut(g_high + 1)
            if g_high - g_low <= region:
                edges = (np.arange(g_low + 1, g_high + 1) / b).astype(conf.dtype)
                inner = np.searchsorted(sorted_conf, edges, side="right")
            else:  # more bins than samples in the region: bin the region's samples
                index = _equal_width_index(sorted_conf[start : stop + 1], b, conf.dtype)
                inner = start + 1 + np.flatnonzero(np.diff(index))
            bounds = np.concatenate(([left], inner, [right]))
        sizes = np.diff(bounds)
        filled = sizes > 0
        # the accuracy of a bin is its hit count / its size in float64, as in _bin_means
        accuracy_b = np.diff(cumulative[bounds])[filled] / sizes[filled]
        if np.any(accuracy_b[1:] < accuracy_b[:-1]):
            return b - 1
    return n - 1


def _marginal_ece(p: np.ndarray, y: np.ndarray, n_bins: int, binning: str, norm: str) -> float:
    per_class = np.empty(p.shape[1])
    for c in range(p.shape[1]):
        scores = np.ascontiguousarray(p[:, c])
        counts, score_sums, hit_sums = _bin_sums(scores, y == c, n_bins, binning)
        per_class[c] = _reduce_gaps(counts, *_bin_means(counts, score_sums, hit_sums), norm)
    if norm == "l1":
        return float(np.mean(per_class))
    if norm == "l2":
        return float(math.sqrt(np.mean(per_class**2)))
    return float(np.max(per_class))


def debiased_ece(probs: Any, labels: Any, n_bins: int = 15) -> float:
    r"""Debiased l2 top-label calibration error on equal-mass bins (Kumar et al., 2019).

    The plug-in estimate of the squared l2 calibration error is biased upwards: even for a
    calibrated model, the empirical accuracy of a bin scatters around its mean confidence
    with variance :math:`\mathrm{acc}_b (1 - \mathrm{acc}_b) / |B_b|`. This estimator
    subtracts an unbiased estimate of that variance in every bin, clips the weighted sum at 0
    and takes the square root:

    .. math::

        \widehat{\mathrm{CE}}^2 = \sum_{b:\,|B_b| \ge 2} \frac{|B_b|}{N}
        \Big[ (\mathrm{conf}_b - \mathrm{acc}_b)^2
        - \frac{\mathrm{acc}_b (1 - \mathrm{acc}_b)}{|B_b| - 1} \Big], \qquad
        \mathrm{debiased\ CE} = \sqrt{\max(\widehat{\mathrm{CE}}^2, 0)}

    over the ``n_bins`` equal-mass bins of the top-1 confidence (module docstring). The clip
    is on the weighted sum, not per bin: a bin whose gap is below its noise level lowers the
    estimate. A bin with a single sample contributes nothing (neither its squared gap nor a
    variance term) but its sample still counts in N; with ``n_bins`` >= N every bin has at
    most one sample and the estimate is 0. Always <= ``ece(probs, labels, n_bins,
    binning="equal_mass", norm="l2")`` (the plug-in value on the same bins).

    This is the estimator of Kumar, Liang and Ma (NeurIPS 2019, Sec. 5, "Verified Uncertainty
    Calibration", after Bröcker 2012 and Ferro and Fricker 2012), as the authors' library
    computes it by default for the top label of a model with continuous outputs:
    ``calibration.get_top_calibration_error(probs, labels, p=2)`` (``debias=True``) runs
    ``lower_bound_scaling_ce(..., p=2, debias=True, num_bins=15,
    binning_scheme=get_equal_bins, mode="top-label")``, i.e. ``unbiased_l2_ce`` (file
    ``calibration/utils.py`` of github.com/p-lambda/verified_calibration), whose
    ``unbiased_square_ce`` returns 0 for bins with fewer than 2 samples. Not implemented:
    the library's ``normal_debiased_ce`` (p != 2, Monte Carlo resampling) and its switch to
    one bin per distinct value when there are fewer than N / 4 distinct confidences
    (``is_discrete``). Equal-mass bins agree with the library's ``get_equal_bins`` (edges
    half-way between the ``np.array_split`` groups of the sorted confidences) when no
    confidence is tied across a cut; a tied run that straddles a cut is split here by the
    shared rule of the module, while the library puts the whole run in the lower bin.

    References:
        Kumar, Liang and Ma, "Verified Uncertainty Calibration", NeurIPS 2019,
        arXiv:1909.10155, Sec. 5 (debiased estimator of the squared l2 calibration error).
        Bröcker, "Estimating reliability and resolution of probability forecasts through
        decomposition of the empirical score", Climate Dynamics 2012.
        Ferro and Fricker, "A bias-corrected decomposition of the Brier score", QJRMS 2012.
        Roelofs, Cain, Shlens and Mozer, "Mitigating Bias in Calibration Error Estimation",
        AISTATS 2022, arXiv:2012.08668 (the equal-mass variant recommended there).

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of equal-mass bins M >= 1. Defaults to ``15`` (the library's default).

    Returns:
        Debiased l2 calibration error in [0, 1] (a fraction), 0 when the bias correction
        exceeds the plug-in estimate.

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, or for invalid ``probs`` / ``labels`` (see
            :func:`accuracy`).
    """
    n_bins = _check_n_bins(n_bins)
    _, _, conf, hits = _validate_top1(probs, labels)
    return _debiased_ce(conf, hits, n_bins)


def sweep_ece(probs: Any, labels: Any, norm: str = "l2", binning: str = "equal_mass") -> float:
    r"""Monotonic-sweep calibration error ECE_sweep (Roelofs et al., AISTATS 2022).

    Chooses the number of bins from the data: the largest b* such that for every
    :math:`b \le b^*` the accuracies of the non-empty bins, in order of confidence, are
    non-decreasing (ties allowed), then returns :func:`ece` with b* bins:

    .. math::

        b^* = \max\{b \le N - 1 : \forall b' \le b,\
        \mathrm{acc}^{(b')}_1 \le \dots \le \mathrm{acc}^{(b')}_{b'}\}, \qquad
        \mathrm{ECE}_{sweep} = \mathrm{ECE}(b^*)

    Computed as the authors' released code does (``CalibrationMetric`` with
    ``ce_type="em_ece_sweep"`` / ``"ew_ece_sweep"``, ``_compute_error_monotonic_sweep``,
    file ``caltrain/calibration_metrics.py`` of github.com/google-research/google-research):
    b = 2, 3, ..., N - 1 in turn, stopping at the first b that is not monotone (so b* is the
    last b of the unbroken run from 2, not the largest monotone b overall, and never N); b* = 1
    when b = 2 already fails or N <= 2; empty bins are skipped in the check. If every b up to
    N - 1 is monotone (e.g. all predictions right), b* = N - 1.

    Bins follow the shared rule of the module (so ``sweep_ece(p, y, norm, binning) ==
    ece(p, y, b*, binning, norm)``), which differs from the released code in two ways:
    its equal-mass bins put sorted position j in bin :math:`\lfloor j b / N \rfloor` where
    ``np.array_split`` gives the first N mod b bins the extra sample (the same bins whenever b
    divides N, else bins of the same sizes in another order, which can change b*); its
    equal-width bins are [lo, hi) (``np.floor(fx * b)``) where ours are (lo, hi]. Ties are
    ordered by a stable sort here and by ``np.argsort``'s default (unstable) sort there.

    The "mean-sweep CE" of the soft-calibration paper (Karandikar et al., NeurIPS 2021, App.
    E, Table 4: "computed with the l2 norm and equal-mass binning") cites Roelofs et al. 2020
    (arXiv:2012.08668), whose only sweep estimator is this one; we read "mean" as the mean
    over runs that the table reports (its ECE column is an "average ECE" too), so the
    defaults ``norm="l2"``, ``binning="equal_mass"`` reproduce that column and there is no
    separate mean-sweep function.

    References:
        Roelofs, Cain, Shlens and Mozer, "Mitigating Bias in Calibration Error Estimation",
        AISTATS 2022, arXiv:2012.08668 (ECE_sweep, "monotonic sweep calibration error").
        Karandikar et al., "Soft Calibration Objectives for Neural Networks", NeurIPS 2021,
        arXiv:2108.00106, App. E, Table 4.

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        norm: ``"l1"``, ``"l2"`` or ``"max"``, as in :func:`ece`. Defaults to ``"l2"``.
        binning: ``"equal_mass"`` (ECE_sweep^EM, the paper's recommendation) or
            ``"equal_width"`` (ECE_sweep^EW). Defaults to ``"equal_mass"``.

    Returns:
        Calibration error in [0, 1] (a fraction). The sweep sorts once (O(N log N)); each
        bin count tried then checks only the bins where hits and misses interleave.

    Raises:
        TypeError: if ``probs`` does not hold real numbers.
        ValueError: if ``norm`` or ``binning`` is unknown, or for invalid ``probs`` /
            ``labels`` (see :func:`accuracy`).
    """
    _check_choice("binning", binning, BINNINGS)
    _check_choice("norm", norm, NORMS)
    _, _, conf, hits = _validate_top1(probs, labels)
    return _ece(conf, hits, _sweep_n_bins(conf, hits, binning), binning, norm)


def marginal_ece(
    probs: Any,
    labels: Any,
    n_bins: int = 15,
    norm: str = "l2",
    binning: str = "equal_mass",
) -> float:
    r"""Marginal calibration error: every class score against its indicator, over all samples.

    For every class k, :math:`\mathrm{CE}_k` is the calibration error of the scores
    :math:`p_{ik}` of all N samples against :math:`1[y_i = k]`, with ``n_bins`` bins of the
    given ``binning`` (module docstring) and the l_p ``norm``; the K errors are combined by
    the power mean of the same order, as Kumar et al.'s library does:

    .. math::

        \mathrm{CE}_k^p = \sum_b \frac{|B_{kb}|}{N} |\mathrm{freq}_{kb} - \mathrm{conf}_{kb}|^p,
        \qquad \mathrm{marginal\ CE} = \Big(\frac{1}{K} \sum_k \mathrm{CE}_k^p\Big)^{1/p}

    i.e. for ``l2`` the root of the mean of the squared per-class errors (not the mean of the
    per-class l2 errors), for ``l1`` their mean, and for ``max`` (p -> infinity) the largest
    per-bin gap over all classes. Here :math:`B_{kb}` holds the samples whose score for class
    k is in bin b, :math:`\mathrm{freq}_{kb}` the fraction of them labelled k and
    :math:`\mathrm{conf}_{kb}` their mean score.

    This is the marginal calibration error of Kumar, Liang and Ma (NeurIPS 2019, Sec. 2,
    "marginal calibration"; library ``calibration/utils.py``, ``_get_ce(..., mode="marginal")``:
    ``np.mean([ce_1d(probs[:, k], labels_one_hot[:, k]) ** p ...]) ** (1.0 / p)``) computed
    with the plug-in per-class error (their ``debias=False``; their ``get_calibration_error``
    defaults to the debiased one). With ``norm="l1"`` and ``binning="equal_width"`` it is
    :func:`classwise_ece`. For K = 2 the two classes have the same error whenever the bins
    mirror (equal-width bins with no score on an edge, equal-mass bins with ``n_bins``
    dividing N and no ties), so the marginal error is then the calibration error of
    :math:`p_{i0}`.

    References:
        Kumar, Liang and Ma, "Verified Uncertainty Calibration", NeurIPS 2019,
        arXiv:1909.10155 (marginal calibration error).
        Kull et al., NeurIPS 2019, arXiv:1910.12656; Nixon et al., CVPR-W 2019,
        arXiv:1904.01685 (classwise ECE / static calibration error, the l1 equal-width case).

    Args:
        probs: (N, K) float probabilities, NumPy array or torch tensor; rows sum to 1.
        labels: (N,) integer class indices in [0, K).
        n_bins: number of bins M >= 1 per class. Defaults to ``15``.
        norm: ``"l1"``, ``"l2"`` or ``"max"``. Defaults to ``"l2"``.
        binning: ``"equal_mass"`` or ``"equal_width"``. Defaults to ``"equal_mass"``.

    Returns:
        Marginal calibration error in [0, 1] (a fraction).

    Raises:
        TypeError: if ``n_bins`` is not an integer or ``probs`` does not hold real numbers.
        ValueError: if ``n_bins`` < 1, if ``norm`` or ``binning`` is unknown, or for invalid
            ``probs`` / ``labels`` (see :func:`accuracy`).
    """
    n_bins = _check_n_bins(n_bins)
    _check_choice("binning", binning, BINNINGS)
    _check_choice("norm", norm, NORMS)
    p, y = _validate(probs, labels)
    return _marginal_ece(p, y, n_bins, binning, norm)


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
    n_bins = _check_n_bins(n_bins)
    p, y, conf, hits = _validate_top1(probs, labels)
    return {
        "ece_l2em": _ece(conf, hits, n_bins, "equal_mass", "l2"),
        "debiased_ce": _debiased_ce(conf, hits, n_bins),
        "sweep_ce": _ece(conf, hits, _sweep_n_bins(conf, hits, "equal_mass"), "equal_mass", "l2"),
        "marginal_ece": _marginal_ece(p, y, n_bins, "equal_mass", "l2"),
        "ks": _ks(conf, hits),
    }


#: Number of equal-width bins of ``ece_100`` (the "ECE 100" column of the objectness paper).
_ECE_100_BINS = 100


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
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    unknown = [key for key in keys if key not in CALIBRATED_KEYS]
    if unknown:
        raise ValueError(
            f"unknown table metric(s) {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(CALIBRATED_KEYS)}"
        )
    p, y, conf, hits = _validate_top1(probs, labels)
    compute = {
        "accuracy": lambda: float(np.mean(hits)),
        "ece": lambda: _ece(conf, hits, n_bins, "equal_width", "l1"),
        "ece_100": lambda: _ece(conf, hits, _ECE_100_BINS, "equal_width", "l1"),
        "aece": lambda: _ece(conf, hits, n_bins, "equal_mass", "l1"),
        "cece": lambda: _classwise_ece(p, y, n_bins),
        "mce": lambda: _ece(conf, hits, n_bins, "equal_width", "max"),
        "nll": lambda: _nll(p, y, 1e-12),
        "brier": lambda: _brier(p, y),
        "overconfidence": lambda: _conditional_confidence(conf, hits, over=True),
        "underconfidence": lambda: _conditional_confidence(conf, hits, over=False),
        "average_confidence": lambda: float(np.mean(conf, dtype=np.float64)),
        "ece_l2em": lambda: _ece(conf, hits, n_bins, "equal_mass", "l2"),
        "marginal_ece": lambda: _marginal_ece(p, y, n_bins, "equal_mass", "l2"),
        "ks": lambda: _ks(conf, hits),
        "sweep_ce": lambda: _ece(
            conf, hits, _sweep_n_bins(conf, hits, "equal_mass"), "equal_mass", "l2"
        ),
    }
    return {key: compute[key]() for key in keys}


# --------------------------------------------------------------------------------------------
# Streaming metrics: CalibrationMeter (segmentation pixels or classification samples)
# --------------------------------------------------------------------------------------------

#: Entries of ``probs`` per block of :meth:`CalibrationMeter.update` on the CPU (in cache) and
#: on accelerators (fewer kernel launches); its temporaries take ~40 bytes per entry.
_METER_BLOCK_ENTRIES = {"cpu": 1 << 20, "accelerator": 1 << 22}
#: Floor on the probability of the true class in the meter's NLL, as in :func:`nll`.
_METER_NLL_EPS = 1e-12
#: Floating dtypes the meter works in; float16 and bfloat16 become float32, as in the functions.
_METER_WORK_DTYPES = (torch.float32, torch.float64)


def _meter_tensor(name: str, value: Any) -> torch.Tensor:
    """A torch view of a tensor (detached) or a NumPy array / sequence (on the CPU)."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    array = np.asarray(value)
    if array.dtype == object or not (
        array.dtype == np.bool_ or np.issubdtype(array.dtype, np.number)
    ):
        raise TypeError(f"`{name}` must hold numbers, got dtype {array.dtype}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return torch.from_numpy(np.ascontiguousarray(array))


def _torch_equal_width_bins(scores: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Equal-width bin (int64, shape of ``scores``) by the rule of :func:`_assign_bins`.

    ``edges`` holds the M + 1 edges of :func:`_equal_width_edges` cast to the dtype of
    ``scores``. ``ceil(s * M) - 1`` is the (lo, hi] bin up to the rounding of ``s * M``, which
    moves it by at most one bin; one comparison with the exact lower and upper edge of the
    guessed bin moves it back, so the result equals ``np.searchsorted(edges, s) - 1`` clipped
    to [0, M - 1] (0.0 in the first bin, 1.0 in the last) without a binary search.
    """
    m = edges.numel() - 1
    index = torch.ceil(scores * m).to(torch.int64)
    index.sub_(1).clamp_(0, m - 1)
    if m > 1:
        # uint8 views: int64 arithmetic with bool tensors is refused by torch
        index.sub_((scores <= torch.take(edges, index)).view(torch.uint8)).clamp_(min=0)
        index.add_((scores > torch.take(edges[1:], index)).view(torch.uint8))
        index.clamp_(max=m - 1)
    return index


def _index_add_ones(out: torch.Tensor, index: torch.Tensor) -> None:
    """``out[i] += 1`` for every entry i of ``index`` (int64 ``out``, repeated indices add up).

    ``index_add_`` rather than ``torch.bincount``, which synchronises with the host on CUDA
    (it reads the largest index).
    """
    index = index.reshape(-1)
    ones = torch.ones(1, dtype=torch.int64, device=index.device)
    out.index_add_(0, index, ones.expand(index.numel()))


class _UpdateSums:
    """The sums of one :meth:`CalibrationMeter.update`, added block by block.

    Histograms hold one more slot than the state: pixels to drop (ignored labels) are sent to
    that last slot instead of being removed, so that no step depends on how many pixels are
    valid (no host synchronisation on CUDA). They are added to the state only after the
    checks have passed.
    """

    def __init__(
        self,
        num_classes: int,
        edges: torch.Tensor,
        ignore_index: int | None,
        background: int | None,
    ) -> None:
        k, m = num_classes, edges.numel() - 1
        self.k, self.m, self.edges = k, m, edges
        self.ignore_index, self.background = ignore_index, background
        device = edges.device

        def zeros(size: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        self.top_pairs = zeros(2 * m + 1, torch.int64)  # slot 2b + hit of confidence bin b
        self.top_conf = zeros(m + 1, torch.float64)
        self.class_counts = zeros(k * m + 1, torch.int64)  # slot c*M + b of score p_c
        self.class_scores = zeros(k * m + 1, torch.float64)
        self.class_hits = zeros(k * m + 1, torch.int64)  # slot y*M + b of score p_y
        self.confusion = zeros(k * k + 1, torch.int64)  # slot y*K + argmax
        self.released = zeros(m, torch.float64)  # per bin: sum of hit - confidence
        # sum of -log max(p_y, eps), sum of 1 - 2 p_y + sum_k p_k^2, released pixels
        self.sums = zeros(3, torch.float64)
        # lowest and highest valid label, lowest valid entry, highest valid confidence, largest
        # |row sum - 1| of a valid pixel
        self.checks = torch.tensor(
            [math.inf, -math.inf, math.inf, -math.inf, 0.0], dtype=torch.float64, device=device
        )
        self.take_min = torch.tensor([True, False, True, False, False], device=device)
        self.offsets = (torch.arange(k, device=device) * m).view(1, k, 1)

    def add(
        self, x: torch.Tensor, y: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add a block; return its pixels' confidence (float64) and hit, and mask its keys.

        Args:
            x: (B, K, S) probabilities, any float dtype.
            y: (B, S) integer labels.
            keys: (B, S) float64 sample keys of these pixels, set to inf where dropped.
        """
        k, m, edges = self.k, self.m, self.edges
        x = x.to(edges.dtype)
        y = y.to(torch.int64)
        valid = None if self.ignore_index is None else y != self.ignore_index
        released = valid
        if self.background is not None:
            foreground = y != self.background
            released = foreground if valid is None else valid & foreground

        def drop(index: torch.Tensor, size: int, mask: torch.Tensor | None) -> torch.Tensor:
            return index if mask is None else index.masked_fill_(~mask, size)

        def zero(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            return values if mask is None else values.masked_fill_(~mask, 0)

        # Labels: checked over valid pixels, clamped so that gathers stay in range (a bad label
        # raises after the loop, before the state changes).
        checked = y if valid is None else y.masked_fill(~valid, 0)
        low_label, high_label = torch.aminmax(checked)
        labels = checked.clamp(0, k - 1)  # not in place: `checked` may be the caller's labels

        # Top-1 per pixel: confidence bins, hits, confusion.
        conf, pred = x.max(dim=1)  # first index on ties, as np.argmax
        hits = pred == labels
        bins = _torch_equal_width_bins(conf, edges)
        conf64 = conf.to(torch.float64)
        _index_add_ones(self.top_pairs, drop(2 * bins + hits, 2 * m, valid))
        self.top_conf.index_add_(0, drop(bins.clone(), m, valid).reshape(-1), conf64.reshape(-1))
        _index_add_ones(self.confusion, drop(labels * k + pred, k * k, valid))
        # The released evaluator's n_b * ECE_b = sum over bins of |hits - confidences|.
        gaps = zero(hits.to(torch.float64) - conf64, released)
        self.released.index_add_(0, bins.reshape(-1), gaps.reshape(-1))

        # True class: NLL (-log max(p_y, eps), as `nll`), Brier (1 - 2 p_y + sum_k p_k^2, as
        # `brier`) and the class-wise hits (slot y*M + bin of p_y).
        true_prob = x.gather(1, labels.unsqueeze(1)).squeeze(1)
        true_slots = _torch_equal_width_bins(true_prob, edges).add_(labels * m)
        _index_add_ones(self.class_hits, drop(true_slots, k * m, valid))
        true_prob = true_prob.to(torch.float64)

        # All K scores: class-wise counts and sums (class c owns slots c*M ... c*M + M - 1),
        # squares for the Brier score, row sums and the lowest entry for the checks.
        slots = _torch_equal_width_bins(x, edges).add_(self.offsets)
        dropped = None if valid is None else ~valid.unsqueeze(1)  # (B, 1, S)
        if dropped is not None:
            slots.masked_fill_(dropped, k * m)
        _index_add_ones(self.class_counts, slots)
        x64 = x.to(torch.float64)
        self.class_scores.index_add_(0, slots.reshape(-1), x64.reshape(-1))
        row_sums = x64.sum(dim=1)
        squares = torch.linalg.vecdot(x64, x64, dim=1)
        del slots, x64
        low = x.amin(dim=1)
        high = conf
        if valid is not None:
            row_sums.masked_fill_(~valid, 1.0)
            low = low.masked_fill_(~valid, math.inf)
            high = conf.masked_fill(~valid, -math.inf)
        brier = 1.0 - 2.0 * true_prob + squares
        nll = -torch.log(true_prob.clamp_(min=_METER_NLL_EPS))
        if released is None:  # a fill, not a host-to-device copy (no stream synchronisation)
            n_released = torch.full((), hits.numel(), dtype=torch.float64, device=x.device)
        else:
            n_released = released.sum().to(torch.float64)
        self.sums += torch.stack([zero(nll, valid).sum(), zero(brier, valid).sum(), n_released])
        block = torch.stack(
            [
                low_label.to(torch.float64),
                high_label.to(torch.float64),
                low.min().to(torch.float64),
                high.max().to(torch.float64),
                (row_sums - 1.0).abs().max(),
            ]
        )
        self.checks = torch.where(
            self.take_min,
            torch.minimum(self.checks, block),
            torch.maximum(self.checks, block),
        )
        if valid is not None:
            keys.masked_fill_(~valid, math.inf)
        return conf64, hits


def _check_meter_int(name: str, value: object, low: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {type(value).__name__} {value!r}")
    if low is not None and value < low:
        raise ValueError(f"`{name}` must be >= {low}, got {value}")
    return int(value)


class CalibrationMeter:
    r"""Streaming accuracy, calibration and mIoU over pixels (or samples), in constant memory.

    Feed it batches with :meth:`update` and read the metrics with :meth:`compute`. The state
    holds sums and counts only (its size depends on K, ``n_bins`` and ``aece_samples``, never on
    the number of pixels), so a whole validation set can be scored without keeping its
    probabilities: PASCAL VOC val, 1,449 images of ~500 x 500 with K = 21, would need ~30 GB.
    The same meter scores plain (N, K) classification batches.

    Each valid pixel (label != ``ignore_index``) is one sample of the functions of this module.
    On the concatenation of all valid pixels of all updates, :meth:`compute` gives, to float
    rounding (float64 accumulators; a different summation order than the functions):

    * ``accuracy``, ``ece``, ``mce``: :func:`accuracy`, :func:`ece` (equal-width, l1; Guo et
      al., ICML 2017; Naeini et al., AAAI 2015) and :func:`mce` from per-bin counts, hit
      counts and confidence sums, binned by the rule of :func:`ece`: bins (b/M, (b+1)/M] with
      edges in the dtype of ``probs``, 0.0 in the first bin, 1.0 in the last;
    * ``cece``: :func:`classwise_ece` (all K class scores of every pixel, equal-width, mean of
      the K per-class errors; Kull et al., NeurIPS 2019; the SCE of Nixon et al., CVPR-W 2019)
      from (K, M) counts, label counts and score sums;
    * ``nll``: :func:`nll` with ``eps`` = 1e-12 (nats); ``brier``: :func:`brier` (summed over
      the K classes, in [0, 2]);
    * ``miou``: mean over classes of :math:`\mathrm{IoU}_c = TP_c / (TP_c + FP_c + FN_c)` from
      the K x K confusion matrix (:attr:`confusion`), over the classes whose union
      :math:`TP_c + FP_c + FN_c` is non-zero (:meth:`iou` gives NaN for the others). The
      prediction is the argmax (first index on ties), as for ``accuracy``.

    ``aece`` (:func:`adaptive_ece`, equal-mass bins, Nixon et al., CVPR-W 2019) needs quantiles
    of all confidences, which no fixed-size sum gives. It is computed on a uniform sample
    without replacement of at most ``aece_samples`` valid pixels: every pixel draws a key from
    a ``torch.Generator`` seeded with ``seed`` (on the device of the state) and the pixels of
    the ``aece_samples`` smallest keys are kept (their confidence, hit and arrival position).
    While no more than ``aece_samples`` valid pixels have been seen, the sample is all of them
    and ``aece`` equals :func:`adaptive_ece` on the concatenation (the pixels are put back in
    arrival order, so tied confidences split as in the function). Beyond, it is an estimate.
    Measured on 20M synthetic pixels (K = 21, softmax outputs, a sample of 1M, 10 seeds), the
    absolute error |sampled - exact AECE| was at most 7e-4 (mean 2e-4 to 3e-4) for
    miscalibrated outputs (exact AECE 0.08, 0.10 and 0.17), and at most 1.5e-3 (mean 1e-3)
    for calibrated ones (exact AECE 4e-4), where the sample's own binning noise, an upward
    bias of any ECE on fewer samples, dominates. The sample depends on ``seed``, on the device
    (CPU and CUDA generators differ) and on the batch shapes (keys are drawn per update).

    ``ece_released`` is the number of the released evaluator of MbLS (Liu et al., CVPR 2022,
    Table 5; ``SegmentCalibrateEvaluator`` of github.com/by-liu/MbLS), whose protocol ACLS
    (Park et al., ICCV 2023, Table 4) follows for pixel ECE on PASCAL VOC: each update drops
    the pixels labelled ``ignore_index`` or ``background``, takes the equal-width ECE of the
    rest (``n_bins`` bins, the rule of :func:`ece`), and the result is the mean of these
    per-batch ECEs weighted by their pixel counts. It depends on how the pixels are batched
    (ECE is not additive over batches) and leaves out the background class; it is reported to
    compare with those papers' tables, not as a calibration error of the whole set (``ece``).
    The released code applies a softmax to logits and bins with ``torch.linspace`` edges; here
    ``probs`` are given and the edges are those of :func:`ece`.

    References:
        Guo, Pleiss, Sun and Weinberger, "On Calibration of Modern Neural Networks", ICML 2017,
        arXiv:1706.04599 (ECE with 15 equal-width bins).
        Nixon et al., "Measuring Calibration in Deep Learning", CVPR Workshops 2019,
        arXiv:1904.01685 (adaptive ECE, static/classwise calibration error).
        Kull et al., "Beyond temperature scaling", NeurIPS 2019, arXiv:1910.12656 (classwise
        ECE).
        Liu, Ben Ayed, Galdran and Dolz, "The Devil is in the Margin: Margin-based Label
        Smoothing for Network Calibration", CVPR 2022, arXiv:2111.15430, Table 5 (pixel ECE
        on PASCAL VOC, DeepLabV3).
        Park, Noh, Oh, Baek and Ham, "ACLS: Adaptive and Conditional Label Smoothing for Network
        Calibration", ICCV 2023, arXiv:2308.11911, Table 4.

    Args:
        num_classes: number of classes K >= 1 (the width of dim 1 of ``probs``).
        n_bins: number of bins M >= 1 of every binned metric. Defaults to ``15``.
        ignore_index: label of pixels to drop (e.g. ``255`` for VOC), or None to keep all.
            Defaults to ``None``.
        aece_samples: size of the uniform sample of pixels behind ``aece``, >= 1. Defaults to
            ``1_000_000`` (21 MiB of state: float64 key and confidence, int64 position, bool hit).
        seed: seed (>= 0) of the sample's generator. Defaults to ``0``.
        background: label dropped by ``ece_released`` (the VOC background class), or None to
            drop only ``ignore_index``. Defaults to ``0``.

    Shape:
        probs: (N, K) or (N, K, d1, d2, ...) probabilities (not logits), float16, bfloat16,
        float32 or float64, NumPy array or torch tensor on any device; every pixel's K
        probabilities lie in [0, 1] and sum to 1 (within 1e-3; 2**-7 for bfloat16).
        labels: (N,) or (N, d1, d2, ...) integer class indices in [0, K) or ``ignore_index``.

    Raises:
        TypeError: if an argument is not an integer (None allowed for ``ignore_index`` and
            ``background``).
        ValueError: if ``num_classes`` < 1, ``n_bins`` < 1, ``aece_samples`` < 1 or ``seed`` < 0.

    Example::

        meter = CalibrationMeter(21, ignore_index=255)
        for images, masks in loader:
            meter.update(model(images)["out"].softmax(dim=1), masks)
        metrics = meter.compute()  # {"accuracy": ..., "ece": ..., "miou": ..., ...}
    """

    #: Keys of :meth:`compute`, in order.
    KEYS = (
        "accuracy",
        "ece",
        "aece",
        "cece",
        "mce",
        "nll",
        "brier",
        "miou",
        "ece_released",
        "n",
        "n_aece",
        "n_released",
    )
    _COUNT_KEYS = ("n", "n_aece", "n_released")

    def __init__(
        self,
        num_classes: int,
        n_bins: int = 15,
        ignore_index: int | None = None,
        *,
        aece_samples: int = 1_000_000,
        seed: int = 0,
        background: int | None = 0,
    ) -> None:
        self.num_classes = _check_meter_int("num_classes", num_classes, 1)
        self.n_bins = _check_n_bins(n_bins)
        self.ignore_index = (
            None if ignore_index is None else _check_meter_int("ignore_index", ignore_index, None)
        )
        self.aece_samples = _check_meter_int("aece_samples", aece_samples, 1)
        self.seed = _check_meter_int("seed", seed, 0)
        self.background = (
            None if background is None else _check_meter_int("background", background, None)
        )
        self.reset()

    # ----------------------------------------------------------------------------- state

    def reset(self) -> None:
        """Forget every update (the next update allocates the state on its device)."""
        self._state: dict[str, torch.Tensor] | None = None
        self._generator: torch.Generator | None = None
        self._fill = 0  # pixels in the aece sample
        self._seen = 0  # pixels seen, ignored ones included: arrival positions of the sample
        self._threshold = 1.0  # keys below it enter the sample (keys lie in [0, 1))

    @property
    def device(self) -> torch.device | None:
        """Device of the state: that of the first update's ``probs`` (None before it)."""
        return None if self._state is None else self._state["top_counts"].device

    def _allocate(self, device: torch.device) -> None:
        # Normal tensors even under torch.inference_mode(): inference tensors could not be
        # updated in place by a later update or merge outside it.
        with torch.inference_mode(False):
            self._allocate_state(device)
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(self.seed)

    def _allocate_state(self, device: torch.device) -> None:
        k, m, cap = self.num_classes, self.n_bins, self.aece_samples

        def zeros(size: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        self._state = {
            "top_counts": zeros(m, torch.int64),  # valid pixels per confidence bin
            "top_hits": zeros(m, torch.int64),  # of which the argmax is the label
            "top_conf": zeros(m, torch.float64),  # sum of their confidences
            "class_counts": zeros(k * m, torch.int64),  # (K, M): pixels whose p_k is in bin b
            "class_hits": zeros(k * m, torch.int64),  # of which the label is k
            "class_scores": zeros(k * m, torch.float64),  # sum of their p_k
            "confusion": zeros(k * k, torch.int64),  # (K, K): row = label, column = argmax
            # sum of -log max(p_y, eps), sum of the Brier terms, sum over updates of
            # n_b * ECE_b of the released evaluator (sum over bins of |hits - confidences|)
            "sums": zeros(3, torch.float64),
            "released_n": zeros(1, torch.int64),  # pixels behind ece_released
            "sample_keys": torch.full((cap,), 2.0, dtype=torch.float64, device=device),
            "sample_conf": zeros(cap, torch.float64),
            "sample_hits": zeros(cap, torch.bool),
            "sample_pos": zeros(cap, torch.int64),
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of the state tensors (empty before the first update), e.g. for a checkpoint.

        Besides the sums, holds ``fill``, ``seen`` (0-d int64) and ``generator`` (the uint8
        state of the sample's generator). Its size does not depend on the number of pixels.
        """
        if self._state is None:
            return {}
        out = {name: tensor.clone() for name, tensor in self._state.items()}
        out["fill"] = torch.tensor(self._fill)
        out["seen"] = torch.tensor(self._seen)
        out["generator"] = self._generator.get_state()
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a :meth:`state_dict` of a meter with the same settings (on its device).

        Raises:
            ValueError: if an entry is missing or a tensor's shape does not match this meter;
                the meter is then unchanged.
        """
        if not state:
            self.reset()
            return
        k, m, cap = self.num_classes, self.n_bins, self.aece_samples
        sizes = {"top_counts": m, "top_hits": m, "top_conf": m, "class_counts": k * m}
        sizes.update(class_hits=k * m, class_scores=k * m, confusion=k * k, sums=3)
        sizes.update(released_n=1, sample_keys=cap, sample_conf=cap, sample_hits=cap)
        sizes.update(sample_pos=cap)
        for name in (*sizes, "fill", "seen", "generator"):
            if name not in state:
                raise ValueError(f"state entry `{name}` is missing")
        for name, size in sizes.items():
            if tuple(state[name].shape) != (size,):
                raise ValueError(
                    f"state `{name}` must have shape {(size,)} for this meter (num_classes={k}, "
                    f"n_bins={m}, aece_samples={cap}), got {tuple(state[name].shape)}"
                )
        self.reset()
        self._allocate(state["top_counts"].device)
        for name, tensor in self._state.items():
            tensor.copy_(state[name])
        self._fill = int(state["fill"])
        self._seen = int(state["seen"])
        self._generator.set_state(state["generator"])
        self._update_threshold()

    def _update_threshold(self) -> None:
        if self._fill == self.aece_samples:
            self._threshold = float(self._state["sample_keys"].max())

    # ----------------------------------------------------------------------------- update

    def _check_inputs(self, probs: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        p = _meter_tensor("probs", probs)
        y = _meter_tensor("labels", labels)
        if not p.is_floating_point():
            raise TypeError(f"`probs` must hold floating-point probabilities, got dtype {p.dtype}")
        if p.ndim < 2:
            raise ValueError(f"`probs` must have shape (N, K) or (N, K, *), got {tuple(p.shape)}")
        if p.shape[1] != self.num_classes:
            raise ValueError(
                f"`probs` must have K={self.num_classes} classes in dim 1 (num_classes), got "
                f"shape {tuple(p.shape)}"
            )
        expected = (p.shape[0], *p.shape[2:])
        if tuple(y.shape) != expected:
            raise ValueError(
                f"`labels` must have shape {expected} to match `probs` of shape "
                f"{tuple(p.shape)}, got {tuple(y.shape)}"
            )
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ValueError(f"`labels` must hold integer class indices, got dtype {y.dtype}")
        device = self.device if self._state is not None else p.device
        return p.to(device), y.to(device)

    def update(self, probs: Any, labels: Any) -> None:
        """Add a batch of probabilities and labels to the sums.

        The state lives on the device of the first update's ``probs`` (NumPy input: the CPU);
        later inputs and ``labels`` are moved there. Pixels labelled ``ignore_index`` are
        dropped (their probabilities are not checked). A batch that fails a check leaves the
        state unchanged. The work runs in blocks of about 2**20 entries of ``probs`` (2**22 on
        accelerators), whose temporaries take ~40 bytes per entry; across blocks it keeps 17
        bytes per pixel of the batch for the ``aece`` sample. Two host synchronisations: the
        checks and the sample.

        Args:
            probs: (N, K) or (N, K, *) float probabilities (see the class docstring).
            labels: (N,) or (N, *) integer labels in [0, K) or ``ignore_index``.

        Raises:
            TypeError: if ``probs`` is not floating point or an input does not hold numbers.
            ValueError: if ``probs`` has fewer than 2 dimensions or not K entries in dim 1; if
                ``labels`` has another shape than ``probs`` without dim 1 or is not integer;
                if a label other than ``ignore_index`` lies outside [0, K); if a valid pixel's
                probabilities are not finite, lie outside [0, 1] or do not sum to 1.
        """
        p, y = self._check_inputs(probs, labels)
        if p.numel() == 0:
            return
        if self._state is None:
            self._allocate(p.device)
        n, k = p.shape[:2]
        p3 = p.reshape(n, k, -1)  # (N, K, S): a view of contiguous input
        y2 = y.reshape(n, -1)  # (N, S)
        s = p3.shape[2]
        work = p.dtype if p.dtype in _METER_WORK_DTYPES else torch.float32
        edges = torch.from_numpy(_equal_width_edges(self.n_bins)).to(p.device, work)
        sums = _UpdateSums(k, edges, self.ignore_index, self.background)
        keys = torch.rand((n, s), generator=self._generator, dtype=torch.float64, device=p.device)
        conf = torch.empty((n, s), dtype=torch.float64, device=p.device)
        hits = torch.empty((n, s), dtype=torch.bool, device=p.device)
        entries = _METER_BLOCK_ENTRIES["cpu" if p.device.type == "cpu" else "accelerator"]
        per_block = max(1, entries // k)  # pixels per block
        images, width = (1, per_block) if s >= per_block else (max(1, per_block // s), s)
        for i in range(0, n, images):
            for j in range(0, s, width):
                rows, cols = slice(i, i + images), slice(j, j + width)
                conf[rows, cols], hits[rows, cols] = sums.add(
                    p3[rows, :, cols], y2[rows, cols], keys[rows, cols]
                )
        row_tolerance = 2.0**-7 if p.dtype == torch.bfloat16 else _ROW_SUM_TOLERANCE
        self._check_values(sums.checks, row_tolerance)

        state, m = self._state, self.n_bins
        pairs = sums.top_pairs[: 2 * m].view(m, 2)  # (misses, hits) per bin
        state["top_counts"] += pairs.sum(dim=1)
        state["top_hits"] += pairs[:, 1]
        state["top_conf"] += sums.top_conf[:m]
        state["class_counts"] += sums.class_counts[: k * m]
        state["class_hits"] += sums.class_hits[: k * m]
        state["class_scores"] += sums.class_scores[: k * m]
        state["confusion"] += sums.confusion[: k * k]
        state["sums"] += torch.stack([sums.sums[0], sums.sums[1], sums.released.abs().sum()])
        state["released_n"] += sums.sums[2].to(torch.int64)
        self._add_to_sample(keys.reshape(-1), conf.reshape(-1), hits.reshape(-1))

    def _check_values(self, checks: torch.Tensor, row_tolerance: float) -> None:
        """Raise the ValueError of the first failed check (one host synchronisation).

        ``checks``: lowest and highest valid label, lowest valid entry, highest valid
        confidence, largest |row sum - 1| of a valid pixel. With no valid pixel the labels and
        entries are +-inf in the order that passes.
        """
        label_low, label_high, low, high, deviation = checks.tolist()
        k = self.num_classes
        if label_low < 0 or label_high >= k:
            ignored = "" if self.ignore_index is None else f" or ignore_index={self.ignore_index}"
            raise ValueError(
                f"`labels` must lie in [0, {k}) for K={k} classes{ignored}, got values in "
                f"[{int(label_low)}, {int(label_high)}]"
            )
        not_finite = any(map(math.isnan, (low, high, deviation)))
        if not_finite or low == -math.inf or high == math.inf or deviation == math.inf:
            raise ValueError("`probs` must be finite; a valid pixel holds NaN or inf")
        if low < -_PROB_TOLERANCE or high > 1.0 + _PROB_TOLERANCE:
            raise ValueError(
                f"`probs` must lie in [0, 1], got values in [{low:.6g}, {high:.6g}]; pass "
                "probabilities, not logits (see `softmax`)"
            )
        if deviation > row_tolerance:
            raise ValueError(
                f"the K probabilities of every pixel must sum to 1 (within {row_tolerance:g}); "
                f"one sum is {deviation:.6g} away from 1"
            )

    def _add_to_sample(self, keys: torch.Tensor, conf: torch.Tensor, hits: torch.Tensor) -> None:
        """Keep the pixels of the ``aece_samples`` smallest keys seen so far (inf: dropped)."""
        chosen = torch.nonzero(keys < self._threshold).squeeze(1)
        self._merge_sample(keys[chosen], conf[chosen], hits[chosen], chosen + self._seen)
        self._seen += keys.numel()

    def _merge_sample(
        self, keys: torch.Tensor, conf: torch.Tensor, hits: torch.Tensor, pos: torch.Tensor
    ) -> None:
        state, fill, cap = self._state, self._fill, self.aece_samples
        count = keys.numel()
        if count == 0:
            return
        names = ("sample_keys", "sample_conf", "sample_hits", "sample_pos")
        if fill + count <= cap:
            for name, values in zip(names, (keys, conf, hits, pos), strict=True):
                state[name][fill : fill + count] = values
            self._fill = fill + count
        else:
            merged = [
                torch.cat((state[name][:fill], values))
                for name, values in zip(names, (keys, conf, hits, pos), strict=True)
            ]
            keep = torch.topk(merged[0], cap, largest=False, sorted=False).indices
            for name, values in zip(names, merged, strict=True):
                state[name].copy_(values[keep])
            self._fill = cap
        self._update_threshold()

    def merge(self, other: "CalibrationMeter") -> "CalibrationMeter":
        """Add the state of ``other`` (e.g. another process's meter) to this one, in place.

        The result is the meter that would have seen this meter's updates, then ``other``'s:
        sums add up and the ``aece`` samples merge by their keys. Give the meters different
        seeds (e.g. ``seed + rank``): equal seeds draw equal keys, so the merged sample is no
        longer uniform. ``other``'s state is moved to this meter's device.

        Returns:
            This meter.

        Raises:
            TypeError: if ``other`` is not a :class:`CalibrationMeter`.
            ValueError: if the meters differ in ``num_classes``, ``n_bins``, ``ignore_index``,
                ``aece_samples`` or ``background``.
        """
        if not isinstance(other, CalibrationMeter):
            raise TypeError(f"`other` must be a CalibrationMeter, got {type(other).__name__}")
        for name in ("num_classes", "n_bins", "ignore_index", "aece_samples", "background"):
            if getattr(self, name) != getattr(other, name):
                raise ValueError(
                    f"cannot merge meters with different `{name}`: {getattr(self, name)!r} "
                    f"and {getattr(other, name)!r}"
                )
        if other._state is None:
            return self
        if self._state is None:
            self._allocate(other.device)
        theirs = {name: tensor.to(self.device) for name, tensor in other._state.items()}
        for name, tensor in self._state.items():
            if not name.startswith("sample_"):
                tensor += theirs[name]
        fill = other._fill
        self._merge_sample(
            theirs["sample_keys"][:fill],
            theirs["sample_conf"][:fill],
            theirs["sample_hits"][:fill],
            theirs["sample_pos"][:fill] + self._seen,
        )
        self._seen += other._seen
        return self

    # ----------------------------------------------------------------------------- results

    @property
    def confusion(self) -> np.ndarray:
        """(K, K) int64 confusion matrix: entry (i, j) counts valid pixels of label i, argmax j."""
        k = self.num_classes
        if self._state is None:
            return np.zeros((k, k), dtype=np.int64)
        return self._state["confusion"].cpu().numpy().reshape(k, k).copy()

    def reliability_bins(self) -> ReliabilityBins:
        """Equal-width reliability-diagram bins of all valid pixels so far.

        The bins of :func:`reliability_bins` on the concatenated valid pixels (``n_bins``
        bins, the rule of :func:`ece`), so ``meter.reliability_bins().ece`` is
        ``compute()["ece"]``; counts are 0 and means NaN before any valid pixel.
        """
        m = self.n_bins
        if self._state is None:
            counts, conf_sums, hit_sums = np.zeros(m, np.int64), np.zeros(m), np.zeros(m)
        else:
            counts = self._state["top_counts"].cpu().numpy()
            conf_sums = self._state["top_conf"].cpu().numpy()
            hit_sums = self._state["top_hits"].cpu().numpy().astype(np.float64)
        accuracy_b, confidence_b = _bin_means(counts, conf_sums, hit_sums)
        return ReliabilityBins(_equal_width_edges(m), counts, accuracy_b, confidence_b)

    def iou(self) -> np.ndarray:
        r"""(K,) float64 IoU of every class, :math:`TP_c / (TP_c + FP_c + FN_c)`.

        NaN for a class absent from both the labels and the predictions (empty union).
        """
        confusion = self.confusion
        tp = np.diag(confusion).astype(np.float64)
        union = confusion.sum(axis=0) + confusion.sum(axis=1) - tp
        out = np.full(self.num_classes, np.nan)
        np.divide(tp, union, out=out, where=union > 0)
        return out

    def compute(self) -> dict[str, float]:
        """The metrics of all valid pixels so far (see the class docstring).

        Returns:
            Dict of Python floats with the keys of :data:`KEYS`, in that order: ``accuracy``,
            ``ece``, ``aece``, ``cece``, ``mce``, ``nll`` (nats), ``brier`` (in [0, 2]),
            ``miou`` and ``ece_released`` (fractions in [0, 1]), then ``n`` (valid pixels),
            ``n_aece`` (pixels in the ``aece`` sample) and ``n_released`` (pixels behind
            ``ece_released``) as floats. With no valid pixel every metric is NaN
            (``ece_released`` is NaN too when every valid pixel is background).
        """
        k, m = self.num_classes, self.n_bins
        if self._state is None:
            return {key: (0.0 if key in self._COUNT_KEYS else math.nan) for key in self.KEYS}
        state = {name: tensor.cpu().numpy() for name, tensor in self._state.items()}
        counts = state["top_counts"]
        n = int(counts.sum())
        sums = state["sums"]
        released_n = int(state["released_n"][0])
        ece_released = float(sums[2] / released_n) if released_n else math.nan
        if n == 0:
            return {key: (0.0 if key in self._COUNT_KEYS else math.nan) for key in self.KEYS}
        accuracy_b, confidence_b = _bin_means(
            counts, state["top_conf"], state["top_hits"].astype(np.float64)
        )
        class_counts = state["class_counts"].reshape(k, m)
        class_acc, class_conf = _bin_means(
            class_counts,
            state["class_scores"].reshape(k, m),
            state["class_hits"].reshape(k, m).astype(np.float64),
        )
        per_class = [
            _reduce_gaps(class_counts[c], class_acc[c], class_conf[c], "l1") for c in range(k)
        ]
        fill = self._fill
        order = np.argsort(state["sample_pos"][:fill], kind="stable")  # arrival order
        aece = _ece(
            state["sample_conf"][:fill][order],
            state["sample_hits"][:fill][order],
            m,
            "equal_mass",
            "l1",
        )
        iou = self.iou()
        return {
            "accuracy": float(state["top_hits"].sum() / n),
            "ece": _reduce_gaps(counts, accuracy_b, confidence_b, "l1"),
            "aece": aece,
            "cece": float(np.mean(per_class)),
            "mce": _reduce_gaps(counts, accuracy_b, confidence_b, "max"),
            "nll": float(sums[0] / n),
            "brier": float(max(0.0, sums[1] / n)),
            "miou": float(np.nanmean(iou)) if np.isfinite(iou).any() else math.nan,
            "ece_released": ece_released,
            "n": float(n),
            "n_aece": float(fill),
            "n_released": float(released_n),
        }


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
