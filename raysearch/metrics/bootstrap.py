"""Bootstrap percentile confidence interval of the ECE (:func:`ece_ci`).

Imports only :mod:`raysearch.metrics.checks`, :mod:`raysearch.metrics.binning` and the chunk
size of :mod:`raysearch.metrics.classwise`.
"""

import numbers
from typing import Any

import numpy as np

from raysearch.metrics.binning import (
    BINNINGS,
    NORMS,
    _assign_bins,
    _equal_mass_positions,
    binned_ece,
)
from raysearch.metrics.checks import _check_choice, _validate_top1, check_n_bins
from raysearch.metrics.classwise import _CHUNK_ENTRIES


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
    n_bins = check_n_bins(n_bins)
    _check_choice("binning", binning, BINNINGS)
    _check_choice("norm", norm, NORMS)
    p, y, conf, hits = _validate_top1(probs, labels)
    point = binned_ece(conf, hits, n_bins, binning, norm)

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
