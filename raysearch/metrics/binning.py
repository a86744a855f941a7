r"""The shared binning helper and bin reductions of every NumPy calibration error.

:func:`_assign_bins` is THE bin rule of :mod:`raysearch.metrics` (equal-width bins
:math:`(e_b, e_{b+1}]` with edges the float nearest b / M, or equal-mass bins cut like
``np.array_split`` of the stable sort); :func:`_bin_sums`, :func:`_bin_means` and
:func:`_reduce_gaps` (weighted l1 / l2 / max of the per-bin gaps) turn bins into an ECE
(:func:`binned_ece`). The bootstrap bins sorted positions with it (:func:`_equal_mass_positions`);
the monotonic sweep tries many bin counts at once with :func:`_equal_width_index`, the
equal-width rule broadcast over M (for one M it uses :func:`_assign_bins`); the classwise ECE
sends the entries at or below :func:`_first_bin_edge` to bin 0 without binning them. The
streaming :class:`~raysearch.metrics.meter.CalibrationMeter` bins on its own device with the
torch form of the same rule, :func:`_torch_equal_width_bins`. Every bin of the package is
assigned here.

Imports nothing from the package (NumPy, and torch for :func:`_torch_equal_width_bins`).
"""

import math
from typing import Any

import numpy as np
import torch

#: Binning schemes of :func:`ece`.
BINNINGS = ("equal_width", "equal_mass")
#: Norms of :func:`ece`: ``l1`` (ECE), ``l2`` (RMS calibration error), ``max`` (MCE).
NORMS = ("l1", "l2", "max")
#: Up to this many equal-mass cuts, bins are counted by comparisons (else a binary search).
_COMPARE_MAX_CUTS = 32


def _equal_width_edges(n_bins: int) -> np.ndarray:
    """Edges 0, 1/M, ..., 1 in float64, each the float nearest b / M (so 3/5 == 0.6)."""
    return np.arange(n_bins + 1, dtype=np.float64) / n_bins


def _first_bin_edge(n_bins: int, dtype: np.dtype) -> float:
    """Upper edge of equal-width bin 0 in ``dtype``: a score <= it is in bin 0 (inf if M = 1)."""
    return _equal_width_edges(n_bins).astype(dtype)[1] if n_bins > 1 else np.inf


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


def binned_ece(conf: np.ndarray, hits: np.ndarray, n_bins: int, binning: str, norm: str) -> float:
    """The calibration error of scores against their 0/1 outcomes, on bins of the scores.

    The kernel of :func:`~raysearch.metrics.ece` (no input checks): the per-bin gaps between
    the mean outcome and the mean score, reduced by the weighted l1 / l2 norm or their maximum.

    Args:
        conf: (N,) float scores in [0, 1] (top-1 confidences, or one class's scores).
        hits: (N,) bool or 0/1 outcomes (the top-1 class is the label; the label is the class).
        n_bins: number of bins M >= 1.
        binning: ``"equal_width"`` or ``"equal_mass"`` (:data:`BINNINGS`).
        norm: ``"l1"``, ``"l2"`` or ``"max"`` (:data:`NORMS`).

    Returns:
        The calibration error in [0, 1].
    """
    counts, conf_sums, hit_sums = _bin_sums(conf, hits, n_bins, binning)
    return _reduce_gaps(counts, *_bin_means(counts, conf_sums, hit_sums), norm)


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


def _equal_mass_positions(n: int, n_bins: int) -> np.ndarray:
    """Bin of every position 0..n-1 of a sorted sample under ``np.array_split(n, n_bins)``.

    The equal-mass bins of :func:`_assign_bins` of N distinct sorted scores: those of the
    positions themselves.
    """
    return _equal_mass_bins(np.arange(n), n_bins)


def _torch_equal_width_bins(scores: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Equal-width bin (int64, shape of ``scores``) by the rule of :func:`_assign_bins`.

    ``edges`` holds the M + 1 edges of :func:`_equal_width_edges` cast to the dtype of
    ``scores``. The bin is the number of inner edges below the score
    (``torch.bucketize`` on the M - 1 inner edges: one kernel, exact comparisons), which is
    ``np.searchsorted(edges, s) - 1`` clipped to [0, M - 1]: the (lo, hi] bin, 0.0 in the
    first bin, 1.0 in the last, scores below 0 in the first and above 1 in the last.

    The device form of the equal-width rule of :func:`_assign_bins` (NumPy on the host): this
    one runs on the device of ``scores`` (a GPU for segmentation batches) with no host
    synchronisation. tests/test_meter.py checks that both give the same bins.
    """
    # contiguous: bucketize copies (and warns about) a strided tensor anyway
    return torch.bucketize(scores.contiguous(), edges[1:-1])
