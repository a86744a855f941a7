"""Accuracy, proper scores (NLL, Brier), the KS error and the estimators with less bias.

Binning-free metrics (:func:`accuracy`, :func:`nll`, :func:`brier`, :func:`ks_error`,
:func:`average_confidence`) and the calibration estimators that choose or correct their bins:
:func:`debiased_ece` (Kumar et al., 2019), :func:`sweep_ece` (Roelofs et al., 2022) and
:func:`marginal_ece`; these bin through :mod:`raysearch.metrics.binning`.

Imports only :mod:`raysearch.metrics.checks` and :mod:`raysearch.metrics.binning`.
"""

import math
import numbers
from typing import Any

import numpy as np

from raysearch.metrics.binning import (
    BINNINGS,
    NORMS,
    _assign_bins,
    _bin_sums,
    _equal_width_index,
    binned_ece,
)
from raysearch.metrics.checks import (
    _check_choice,
    _probs_array,
    _top1_scan,
    _validate,
    _validate_top1,
    check_n_bins,
)


def _nll(p: np.ndarray, y: np.ndarray, eps: float) -> float:
    true_probs = p[np.arange(p.shape[0]), y].astype(np.float64)
    return float(-np.mean(np.log(np.maximum(true_probs, eps))))


def _brier(p: np.ndarray, y: np.ndarray) -> float:
    # sum_k (p_k - 1[k = y])^2 = sum_k p_k^2 - 2 p_y + 1, without building the one-hot matrix.
    squares = np.einsum("ij,ij->i", p, p, dtype=np.float64)
    true_probs = p[np.arange(p.shape[0]), y].astype(np.float64)
    return float(max(0.0, np.mean(squares - 2.0 * true_probs + 1.0)))


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

    Args and Raises: as :func:`brier`.

    Returns:
        KS error in [0, 1].
    """
    _, _, conf, hits = _validate_top1(probs, labels)
    return _ks(conf, hits)


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


# --------------------------------------------------------------------------------------------
# Estimators with less bias: debiased l2 CE, monotonic-sweep CE, marginal CE
# --------------------------------------------------------------------------------------------


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
                index = _assign_bins(sorted_conf[start : stop + 1], b)
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
        per_class[c] = binned_ece(scores, y == c, n_bins, binning, norm)
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
    n_bins = check_n_bins(n_bins)
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
    return binned_ece(conf, hits, _sweep_n_bins(conf, hits, binning), binning, norm)


def marginal_ece(
    probs: Any, labels: Any, n_bins: int = 15, norm: str = "l2", binning: str = "equal_mass"
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
    n_bins = check_n_bins(n_bins)
    _check_choice("binning", binning, BINNINGS)
    _check_choice("norm", norm, NORMS)
    p, y = _validate(probs, labels)
    return _marginal_ece(p, y, n_bins, binning, norm)
