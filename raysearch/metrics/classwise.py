"""Classwise ECE (Kull et al., NeurIPS 2019): blocked, threaded binning of all K class scores.

Imports only :mod:`raysearch.metrics.checks` and :mod:`raysearch.metrics.binning`.
"""

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from raysearch.metrics.binning import (
    _assign_bins,
    _bin_means,
    _first_bin_edge,
    _reduce_gaps,
)
from raysearch.metrics.checks import _validate, check_n_bins

#: Number of (N, K) entries the classwise ECE bins at a time (bounds its temporary memory).
_CHUNK_ENTRIES = 1 << 20


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
    first_edge = _first_bin_edge(n_bins, p.dtype)
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

    Args, Returns and Raises: as :func:`~raysearch.metrics.binned.ece` (no ``binning`` or
    ``norm``: equal-width bins, l1).
    """
    n_bins = check_n_bins(n_bins)
    p, y = _validate(probs, labels)
    return _classwise_ece(p, y, n_bins)
