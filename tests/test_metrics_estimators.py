"""Debiased l2 CE, monotonic-sweep CE, marginal CE and their summary (raysearch.metrics)."""

import math

import numpy as np
import pytest
import torch

from raysearch.metrics import (
    ESTIMATOR_KEYS,
    classwise_ece,
    debiased_ece,
    ece,
    estimator_summary,
    ks_error,
    marginal_ece,
    softmax,
    sweep_ece,
)
from raysearch.metrics import binless as binless_module
from raysearch.metrics import binning as binning_module


def _binary(conf, hits):
    """(N, 2) probs whose top-1 confidence is ``conf`` (all > .5) and labels with those hits."""
    conf = np.asarray(conf, dtype=np.float64)
    probs = np.stack([conf, 1.0 - conf], axis=1)
    labels = np.where(np.asarray(hits, dtype=bool), 0, 1)
    return probs, labels


def _random(n, k, seed, temperature=2.0):
    """Continuous softmax outputs (no tied confidences) with labels drawn from them."""
    rng = np.random.default_rng(seed)
    probs = softmax(rng.normal(size=(n, k)) * temperature)
    cumulative = probs.cumsum(axis=1)
    labels = (rng.random(n)[:, None] > cumulative).sum(axis=1).clip(0, k - 1)
    return probs, labels


def _overconfident(n, seed):
    """Confidence spread over (.5, 1) but accuracy flat at .8: miscalibrated, sweeps stop early."""
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.5, 1.0, n)
    return _binary(conf, rng.random(n) < 0.8)


# ---------------------------------------------------------------------------------------------
# Re-implementations of the authors' released code (transcribed step by step, for comparison)
# ---------------------------------------------------------------------------------------------


def _kumar_equal_bins(scores, num_bins):
    # p-lambda/verified_calibration, calibration/utils.py, get_equal_bins: sort, at most N bins,
    # np.array_split of the sorted scores, an edge half-way between consecutive groups, last edge
    # 1.0, duplicate edges dropped.
    ordered = np.sort(scores)
    num_bins = min(num_bins, ordered.size)
    groups = np.array_split(ordered, num_bins)
    edges = [(groups[i][-1] + groups[i + 1][0]) / 2.0 for i in range(num_bins - 1)]
    return sorted(set([*edges, 1.0]))


def _kumar_bins(scores, labels, edges):
    # fast_bin: np.searchsorted(edges, score) with side="left" (a score on an edge is binned low).
    index = np.searchsorted(edges, scores)
    return [(scores[index == b], labels[index == b]) for b in range(len(edges))]


def _kumar_plugin(binned, power):
    # plugin_ce: sum_b |B_b|/N |mean score - mean label|^p, then the p-th root.
    n = sum(s.size for s, _ in binned)
    total = sum(s.size / n * abs(s.mean() - y.mean()) ** power for s, y in binned if s.size)
    return total ** (1.0 / power)


def _kumar_unbiased_l2(binned):
    # unbiased_square_ce + unbiased_l2_ce: bins with < 2 points give 0 (their weight stays in
    # N); else (mean score - mean label)^2 - mean label (1 - mean label) / (|B| - 1); the
    # weighted sum is clipped at 0 before the square root.
    n = sum(s.size for s, _ in binned)
    total = 0.0
    for s, y in binned:
        if s.size < 2:
            continue
        label_mean = y.mean()
        total += (
            s.size
            / n
            * ((s.mean() - label_mean) ** 2 - label_mean * (1 - label_mean) / (s.size - 1))
        )
    return max(total, 0.0) ** 0.5


def _kumar_top_debiased(probs, labels, num_bins=15):
    # get_top_calibration_error(probs, labels, p=2) on continuous outputs: lower_bound_scaling_ce
    # with debias=True, num_bins=15, get_equal_bins, mode="top-label".
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(probs.dtype)
    return _kumar_unbiased_l2(_kumar_bins(conf, correct, _kumar_equal_bins(conf, num_bins)))


def _kumar_marginal(probs, labels, p, num_bins=15):
    # _get_ce(..., debias=False, mode="marginal"): per class, the plug-in CE of probs[:, k]
    # against the one-hot column on get_equal_bins; then mean of CE_k ** p, to the power 1/p.
    one_hot = np.eye(probs.shape[1])[labels]
    per_class = []
    for k in range(probs.shape[1]):
        scores, column = probs[:, k], one_hot[:, k]
        binned = _kumar_bins(scores, column, _kumar_equal_bins(scores, num_bins))
        per_class.append(_kumar_plugin(binned, p) ** p)
    return np.mean(per_class) ** (1.0 / p)


def _caltrain_postbin(n_bins, bins, fx, y, norm):
    # google-research/caltrain/calibration_metrics.py, _calc_ece_postbin: the l_p ECE of the
    # given bins, and whether the accuracies of the non-empty bins never decrease.
    total, monotonic, last = 0.0, True, -1000.0
    for i in range(n_bins):
        cur = bins == i
        if cur.any():
            fxm, ym = fx[cur].mean(), y[cur].mean()
            if ym < last:
                monotonic = False
            last = ym
            total += cur.sum() * abs(ym - fxm) ** norm
    return (total / fx.shape[0]) ** (1.0 / norm), monotonic


def _caltrain_sweep(fx, y, norm, binning, assign=None):
    # em_monotonic_sweep / ew_monotonic_sweep + _compute_error_monotonic_sweep: b = 2 .. N - 1,
    # keep the bins of the last b before the first non-monotone one, then their ECE. Equal
    # mass: sorted position j -> floor(j / N * b); equal width: floor(fx * b), both capped at
    # b - 1. ``assign(b)`` replaces the bin rule (to compare the sweep logic alone).
    n = fx.shape[0]
    bins = np.zeros(n, dtype=int)
    prev = np.zeros(n, dtype=int)
    sort_ix = np.argsort(fx)
    for b in range(2, n):
        if assign is not None:
            bins = assign(b)
        elif binning == "equal_mass":
            bins[sort_ix] = np.minimum(b - 1, np.floor(np.arange(n) / n * b)).astype(int)
        else:
            bins = np.minimum(b - 1, np.floor(fx * b)).astype(int)
        if not _caltrain_postbin(b, bins, fx, y, norm)[1]:
            bins = prev
            break
        prev = np.copy(bins)
    b_star = int(bins.max()) + 1
    return _caltrain_postbin(b_star, bins, fx, y, norm)[0], b_star


def _array_split_assign(fx):
    order = np.argsort(fx, kind="stable")

    def assign(b):
        index = np.empty(fx.shape[0], dtype=int)
        for g, group in enumerate(np.array_split(order, b)):
            index[group] = g
        return index

    return assign


def _top1(probs, labels):
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Debiased l2 calibration error (Kumar et al. 2019)
# ---------------------------------------------------------------------------------------------

# Six samples, n_bins = 2 (equal mass: the 3 lowest and the 3 highest confidences):
#
#  bin  conf            mean conf     hits   acc   gap = conf - acc   acc(1-acc)/(|B|-1)
#  0    .6, .7, .8      .7            1 0 1  2/3   1/30               (2/9)/2 = 1/9
#  1    .9, .9, 1.0     2.8/3         0 0 1  1/3   .6                 1/9
#
#  debiased^2 = 1/2 (1/900 - 1/9) + 1/2 (.36 - 1/9) = 1/2 (-99/900 + 224/900) = 5/72
#  plug-in l2 = sqrt(1/2 (1/900) + 1/2 (.36)) = sqrt(.180556)
#  One bin: gap = 4.9/6 - 3/6 = 19/60, variance .25/5 = 1/20 -> sqrt(361/3600 - 180/3600)
TABLE_CONF = [0.6, 0.7, 0.8, 0.9, 0.9, 1.0]
TABLE_HITS = [1, 0, 1, 0, 0, 1]


def test_debiased_ece_six_sample_hand_case():
    probs, labels = _binary(TABLE_CONF, TABLE_HITS)
    assert debiased_ece(probs, labels, n_bins=2) == pytest.approx(math.sqrt(5 / 72))
    plugin = ece(probs, labels, n_bins=2, binning="equal_mass", norm="l2")
    assert plugin == pytest.approx(math.sqrt(0.5 / 900 + 0.5 * 0.36))
    assert debiased_ece(probs, labels, n_bins=1) == pytest.approx(math.sqrt(181) / 60)
    assert debiased_ece(probs, labels, n_bins=2) == pytest.approx(
        _kumar_top_debiased(probs, labels, 2)
    )


def test_debiased_ece_singleton_bins_count_in_n_but_add_nothing():
    # Sorted conf / hit: .9 miss, .9 miss | 1.0 hit; n_bins = 2 -> sizes 2, 1 (array_split).
    #   bin 0: gap .9, variance 0 -> .81; bin 1 (one sample) adds 0 but stays in N = 3:
    #   debiased = sqrt(2/3 * .81) = sqrt(.54) (sqrt(.81) = .9 had the singleton left N).
    probs, labels = _binary([0.9, 1.0, 0.9], [0, 1, 0])
    assert debiased_ece(probs, labels, n_bins=2) == pytest.approx(math.sqrt(0.54))
    assert _kumar_top_debiased(probs, labels, 2) == pytest.approx(math.sqrt(0.54))
    # n_bins >= N: every bin holds at most one sample -> 0, whatever the plug-in error.
    assert ece(probs, labels, n_bins=3, binning="equal_mass", norm="l2") > 0.5
    assert debiased_ece(probs, labels, n_bins=3) == 0.0
    assert debiased_ece(probs, labels, n_bins=15) == 0.0


def test_debiased_ece_clips_the_sum_at_zero():
    # One bin, conf .5 (a tie), one right one wrong: gap 0, variance .25 / 1 -> -.25 -> 0.
    probs = np.array([[0.5, 0.5], [0.5, 0.5]])
    assert debiased_ece(probs, np.array([0, 1]), n_bins=1) == 0.0
    # Calibrated by construction: 8 samples at conf .75, 6 right (one bin): plug-in 0,
    # debiased sqrt(max(0 - .1875 / 7, 0)) = 0.
    probs, labels = _binary([0.75] * 8, [1, 1, 0, 1, 1, 1, 0, 1])
    assert ece(probs, labels, n_bins=1, binning="equal_mass", norm="l2") == pytest.approx(0.0)
    assert debiased_ece(probs, labels, n_bins=1) == 0.0
    # The clip is on the weighted sum, not per bin: bin 0 below (-.11) lowers the table's
    # estimate; per-bin clipping would give sqrt(1/2 * 56/225) = .3528 instead of .2635.
    probs, labels = _binary(TABLE_CONF, TABLE_HITS)
    assert debiased_ece(probs, labels, n_bins=2) < math.sqrt(0.5 * 56 / 225) - 0.05


def test_debiased_ece_near_zero_for_a_calibrated_sampler_and_below_plugin():
    rng = np.random.default_rng(3)
    conf = rng.uniform(0.5, 1.0, 20000)
    probs, labels = _binary(conf, rng.random(conf.size) < conf)  # P(hit | conf) = conf
    plugin = ece(probs, labels, binning="equal_mass", norm="l2")
    debiased = debiased_ece(probs, labels)
    assert debiased < 0.01
    assert debiased < plugin
    for seed in range(5):
        probs, labels = _random(500, 4, seed)
        assert (
            0.0
            <= debiased_ece(probs, labels)
            <= ece(probs, labels, binning="equal_mass", norm="l2")
        )


@pytest.mark.parametrize("n_bins", [1, 2, 10, 15, 40])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_debiased_ece_matches_the_released_code(n_bins, seed):
    probs, labels = _random(700, 5, seed)
    expected = _kumar_top_debiased(probs, labels, n_bins)
    assert debiased_ece(probs, labels, n_bins=n_bins) == pytest.approx(
        expected, rel=1e-12, abs=1e-15
    )


def test_debiased_ece_ties_across_a_cut_follow_the_shared_bins():
    # Four samples at conf .6, hits 1 1 0 0 (sample order), n_bins = 2. The module's equal-mass
    # rule splits the tie by sample order: {1, 1} gap .4, {0, 0} gap .6, variances 0 ->
    # sqrt(1/2 (.16 + .36)) = sqrt(.26). The library puts the whole tied run in one bin
    # (edge (.6 + .6) / 2 = .6, searchsorted left): acc .5, gap .1 -> .01 - .25/3 < 0 -> 0.
    probs, labels = _binary([0.6] * 4, [1, 1, 0, 0])
    assert debiased_ece(probs, labels, n_bins=2) == pytest.approx(math.sqrt(0.26))
    assert _kumar_top_debiased(probs, labels, 2) == 0.0


# ---------------------------------------------------------------------------------------------
# Monotonic-sweep calibration error (Roelofs et al. 2022)
# ---------------------------------------------------------------------------------------------

# Six samples sorted by confidence, hits 0 1 0 1 1 1; array_split sizes per b:
#
#  b  sizes       bin accuracies          monotone
#  2  3 3         1/3, 1                  yes
#  3  2 2 2       .5, .5, 1               yes (ties allowed)
#  4  2 2 1 1     .5, .5, 1, 1            yes
#  5  2 1 1 1 1   .5, 0, ...              no  -> b* = 4 (b <= N - 1 = 5 anyway)
#
#  b* = 4 bins: conf (.55 .6) (.65 .7) (.8) (.9), acc .5 .5 1 1, gaps .075 .175 .2 .1
#  l2 = sqrt((2 * .075^2 + 2 * .175^2 + .2^2 + .1^2) / 6) = sqrt(.1225 / 6)
#  l1 = (2 * .075 + 2 * .175 + .2 + .1) / 6 = .8 / 6
#  The released code's equal-mass rule floor(j b / N) gives b = 4 the sizes 2 1 2 1:
#  accuracies .5, 0 -> not monotone, so it stops at b* = 3.
SWEEP_CONF = [0.55, 0.6, 0.65, 0.7, 0.8, 0.9]
SWEEP_HITS = [0, 1, 0, 1, 1, 1]


def test_sweep_ece_six_sample_hand_case():
    probs, labels = _binary(SWEEP_CONF, SWEEP_HITS)
    conf, hits = probs.max(axis=1), probs.argmax(axis=1) == labels
    assert binless_module._sweep_n_bins(conf, hits, "equal_mass") == 4
    assert sweep_ece(probs, labels) == pytest.approx(math.sqrt(0.1225 / 6))
    assert sweep_ece(probs, labels, norm="l1") == pytest.approx(0.8 / 6)
    for norm in ("l1", "l2", "max"):
        assert sweep_ece(probs, labels, norm=norm) == ece(
            probs, labels, n_bins=4, binning="equal_mass", norm=norm
        )
    fx, y = _top1(probs, labels)
    assert _caltrain_sweep(fx, y, 2, "equal_mass")[1] == 3  # its floor(j b / N) bins
    value, b_star = _caltrain_sweep(fx, y, 2, "equal_mass", _array_split_assign(fx))
    assert b_star == 4
    assert value == pytest.approx(math.sqrt(0.1225 / 6))


def test_sweep_ece_stops_at_the_first_non_monotone_count():
    # Sorted hits 0 1 1 0 1: b = 2 (sizes 3 2): 2/3 then 1/2 -> not monotone, so b* = 1 even
    # though b = 3 (sizes 2 2 1: .5 .5 1) is monotone. One bin: conf 3.75 / 5 = .75, acc .6 ->
    # .15 in every norm. (b = 3 would give sqrt((2 * .1^2 + 2 * .3^2 + .05^2) / 5) = .2012.)
    probs, labels = _binary([0.55, 0.65, 0.75, 0.85, 0.95], [0, 1, 1, 0, 1])
    conf, hits = probs.max(axis=1), probs.argmax(axis=1) == labels
    assert binless_module._sweep_n_bins(conf, hits, "equal_mass") == 1
    assert sweep_ece(probs, labels) == pytest.approx(0.15)
    assert sweep_ece(probs, labels, norm="l1") == pytest.approx(0.15)
    fx, y = _top1(probs, labels)
    assert _caltrain_sweep(fx, y, 2, "equal_mass") == pytest.approx((0.15, 1))


def test_sweep_ece_limits():
    # All right (or all wrong): every b is monotone -> b* = N - 1 (the released code never
    # tries b = N).
    probs, _ = _binary(np.linspace(0.55, 0.95, 9), [1] * 9)
    conf = probs.max(axis=1)
    for hits in (np.ones(9, bool), np.zeros(9, bool)):
        labels = np.where(hits, 0, 1)
        assert binless_module._sweep_n_bins(conf, hits, "equal_mass") == 8
        assert binless_module._sweep_n_bins(conf, hits, "equal_width") == 8
        assert sweep_ece(probs, labels) == ece(probs, labels, 8, "equal_mass", "l2")
    # Confident and right: every bin has conf = acc = 1 -> 0.
    assert sweep_ece(np.array([[1.0, 0.0]] * 5), np.zeros(5, dtype=int)) == 0.0
    # N <= 2: a single bin.
    probs, labels = _binary([0.9, 0.7], [0, 1])
    assert sweep_ece(probs, labels, norm="l1") == pytest.approx(abs(0.8 - 0.5))
    assert sweep_ece(probs[:1], labels[:1], norm="l1") == pytest.approx(0.9)
    # Calibrated ties: six samples at conf .5, hits alternate -> b = 2 gives 2/3, 1/3 (fails),
    # b* = 1: conf .5, acc .5 -> 0.
    tied = np.full((6, 2), 0.5)
    assert sweep_ece(tied, np.array([0, 1, 0, 1, 0, 1])) == 0.0


def _brute_sweep(conf, hits, binning):
    # The definition on the shared bins, one full binning per b.
    best = 1
    for b in range(2, conf.shape[0]):
        counts, _, hit_sums = binning_module._bin_sums(conf, hits, b, binning)
        filled = counts > 0
        accuracy_b = hit_sums[filled] / counts[filled]
        if np.any(accuracy_b[1:] < accuracy_b[:-1]):
            break
        best = b
    return best


@pytest.mark.parametrize("binning", ["equal_mass", "equal_width"])
def test_sweep_n_bins_matches_a_full_binning_per_count(binning):
    # The fast sweep (prefix sums over the part of the sorted order that can break
    # monotonicity) against a full _bin_sums per b, on ties, edge scores and float32.
    rng = np.random.default_rng(11)
    grid = np.array([0.0, 0.2, 0.25, 1 / 3, 0.5, 0.6, 2 / 3, 0.75, 1.0])
    for trial in range(150):
        n = int(rng.integers(1, 50))
        if trial % 3 == 0:
            conf = rng.uniform(0.0, 1.0, n)
        elif trial % 3 == 1:
            conf = rng.choice(grid, n)
        else:
            conf = np.round(rng.uniform(0.0, 1.0, n), 1).astype(np.float32)
        hits = rng.random(n) < np.clip(conf + rng.uniform(-0.3, 0.3), 0.0, 1.0)
        if trial % 5 == 0:
            hits = np.sort(hits)  # nearly monotone: long sweeps
        expected = _brute_sweep(conf, hits, binning)
        assert binless_module._sweep_n_bins(conf, hits, binning) == expected


@pytest.mark.parametrize("norm", [1, 2])
def test_sweep_ece_matches_the_released_code(norm):
    name = {1: "l1", 2: "l2"}[norm]
    # Equal width: the released bins are [lo, hi), ours (lo, hi]; continuous scores never sit
    # on an edge, so both sweeps see the same bins. Calibrated data: long sweeps.
    for seed in range(3):
        rng = np.random.default_rng(seed)
        conf = rng.uniform(0.5, 1.0, 1500)
        probs, labels = _binary(conf, rng.random(conf.size) < conf)
        fx, y = _top1(probs, labels)
        value, b_star = _caltrain_sweep(fx, y, norm, "equal_width")
        assert binless_module._sweep_n_bins(fx, y.astype(bool), "equal_width") == b_star
        assert sweep_ece(probs, labels, norm=name, binning="equal_width") == pytest.approx(
            value, rel=1e-12
        )
        # Equal mass, the released sweep logic on the shared array_split bins.
        value, b_star = _caltrain_sweep(fx, y, norm, "equal_mass", _array_split_assign(fx))
        assert binless_module._sweep_n_bins(fx, y.astype(bool), "equal_mass") == b_star
        assert b_star > 5
        assert sweep_ece(probs, labels, norm=name) == pytest.approx(value, rel=1e-12)
    # Equal mass with the released floor(j b / N) bins: N = 2520 is divisible by 2 ... 10, so
    # both rules give the same bins for every b tried when the sweep stops by b = 10.
    compared = 0
    for seed in range(20):
        probs, labels = _overconfident(2520, seed)
        fx, y = _top1(probs, labels)
        value, b_star = _caltrain_sweep(fx, y, norm, "equal_mass")
        if b_star + 1 > 10:
            continue
        compared += 1
        assert binless_module._sweep_n_bins(fx, y.astype(bool), "equal_mass") == b_star
        assert sweep_ece(probs, labels, norm=name) == pytest.approx(value, rel=1e-12)
    assert compared >= 15


def test_sweep_ece_is_fast_on_nearly_sorted_hits():
    # Three misses among the five lowest of 50000 confidences: every b up to ~N/2 is monotone,
    # so the sweep runs to b* = N - 2; checking only the bins around the misses keeps it cheap.
    conf = np.linspace(0.5, 1.0, 50000)
    hits = np.ones(conf.size, dtype=bool)
    hits[[0, 1, 3]] = False
    assert binless_module._sweep_n_bins(conf, hits, "equal_mass") == conf.size - 2
    assert binless_module._sweep_n_bins(conf, hits, "equal_width") == conf.size - 1


# ---------------------------------------------------------------------------------------------
# Marginal calibration error (Kumar et al. 2019)
# ---------------------------------------------------------------------------------------------

# K = 3, N = 4, n_bins = 2 (equal mass: the 2 lowest and the 2 highest scores of each class).
MARGINAL_PROBS = np.array(
    [
        [0.7, 0.2, 0.1],
        [0.5, 0.4, 0.1],
        [0.2, 0.5, 0.3],
        [0.1, 0.1, 0.8],
    ]
)
MARGINAL_LABELS = np.array([0, 1, 2, 2])
#  class 0: scores .1 .2 | .5 .7, indicator 0 0 | 0 1: gaps .15, |.6 - .5| = .1
#           CE_0^2 = (.0225 + .01) / 2 = .01625, CE_0 (l1) = .125
#  class 1: scores .1 .2 | .4 .5, indicator 0 0 | 1 0: gaps .15, |.45 - .5| = .05
#           CE_1^2 = (.0225 + .0025) / 2 = .0125, CE_1 (l1) = .1
#  class 2: scores .1 .1 | .3 .8, indicator 0 0 | 1 1: gaps .1, |.55 - 1| = .45
#           CE_2^2 = (.01 + .2025) / 2 = .10625, CE_2 (l1) = .275
#  l2 (root of the mean of squares, the library's rule) = sqrt(.135 / 3) = sqrt(.045)
#  mean of the per-class l2 errors would be (.12748 + .11180 + .32596) / 3 = .18841 instead
#  l1 = (.125 + .1 + .275) / 3 = 1/6; max = .45
#  One bin: |mean score - freq| = |.375 - .25|, |.3 - .25|, |.325 - .5| = .125, .05, .175
#           -> l2 sqrt((.015625 + .0025 + .030625) / 3) = sqrt(.01625), l1 .35 / 3


def test_marginal_ece_hand_case():
    p, y = MARGINAL_PROBS, MARGINAL_LABELS
    assert marginal_ece(p, y, n_bins=2) == pytest.approx(math.sqrt(0.045))
    per_class_l2 = [math.sqrt(0.01625), math.sqrt(0.0125), math.sqrt(0.10625)]
    assert marginal_ece(p, y, n_bins=2) != pytest.approx(np.mean(per_class_l2))
    assert marginal_ece(p, y, n_bins=2, norm="l1") == pytest.approx(1 / 6)
    assert marginal_ece(p, y, n_bins=2, norm="max") == pytest.approx(0.45)
    assert marginal_ece(p, y, n_bins=1) == pytest.approx(math.sqrt(0.01625))
    assert marginal_ece(p, y, n_bins=1, norm="l1") == pytest.approx(0.35 / 3)
    assert _kumar_marginal(p, y, 2, num_bins=2) == pytest.approx(math.sqrt(0.045))


def test_marginal_ece_zero_when_calibrated_by_construction():
    # Class 0 score .75 on 4 rows (3 labelled 0) and .25 on 4 rows (1 labelled 0): with 2
    # equal-mass bins each bin is one group, freq = score -> 0 for both classes.
    probs = np.array([[0.75, 0.25]] * 4 + [[0.25, 0.75]] * 4)
    labels = np.array([0, 0, 0, 1, 0, 1, 1, 1])
    assert marginal_ece(probs, labels, n_bins=2) == pytest.approx(0.0, abs=1e-15)
    assert marginal_ece(probs, labels, n_bins=2, binning="equal_width") == pytest.approx(
        0.0, abs=1e-15
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_marginal_ece_l1_equal_width_is_classwise_ece(seed):
    probs, labels = _random(3000, 7, seed)
    for n_bins in (1, 10, 15):
        expected = classwise_ece(probs, labels, n_bins=n_bins)
        got = marginal_ece(probs, labels, n_bins=n_bins, norm="l1", binning="equal_width")
        assert got == pytest.approx(expected, rel=1e-12)


def test_marginal_ece_two_classes_is_the_ece_of_class_zero():
    # K = 2 and every p_0 > .5: the top-1 confidence is p_0 and a hit is y = 0, so the ECE is
    # class 0's error; class 1's scores 1 - p_0 fall in the mirrored bins (equal mass with
    # n_bins dividing N, equal width with no score on an edge) with the same |gaps|.
    rng = np.random.default_rng(5)
    conf = rng.uniform(0.5, 1.0, 600)
    probs, labels = _binary(conf, rng.random(conf.size) < conf**2)
    for binning in ("equal_mass", "equal_width"):
        for norm in ("l1", "l2", "max"):
            expected = ece(probs, labels, n_bins=15, binning=binning, norm=norm)
            got = marginal_ece(probs, labels, n_bins=15, norm=norm, binning=binning)
            assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marginal_ece_matches_the_released_code(seed):
    probs, labels = _random(800, 6, seed)
    for n_bins, norm, p in ((15, "l2", 2), (15, "l1", 1), (7, "l2", 2)):
        expected = _kumar_marginal(probs, labels, p, num_bins=n_bins)
        assert marginal_ece(probs, labels, n_bins=n_bins, norm=norm) == pytest.approx(
            expected, rel=1e-12
        )


# ---------------------------------------------------------------------------------------------
# Summary, input types, errors
# ---------------------------------------------------------------------------------------------


def test_estimator_summary_keys_and_values():
    assert ESTIMATOR_KEYS == ("ece_l2em", "debiased_ce", "sweep_ce", "marginal_ece", "ks")
    probs, labels = _random(1000, 5, 7)
    summary = estimator_summary(probs, labels)
    assert tuple(summary) == ESTIMATOR_KEYS
    assert all(type(value) is float and 0.0 <= value <= 1.0 for value in summary.values())
    assert summary == {
        "ece_l2em": ece(probs, labels, 15, binning="equal_mass", norm="l2"),
        "debiased_ce": debiased_ece(probs, labels),
        "sweep_ce": sweep_ece(probs, labels),
        "marginal_ece": marginal_ece(probs, labels),
        "ks": ks_error(probs, labels),
    }
    small = estimator_summary(probs, labels, n_bins=4)
    assert small["ece_l2em"] == ece(probs, labels, 4, binning="equal_mass", norm="l2")
    assert small["debiased_ce"] == debiased_ece(probs, labels, n_bins=4)
    assert small["marginal_ece"] == marginal_ece(probs, labels, n_bins=4)
    assert small["sweep_ce"] == summary["sweep_ce"]  # the sweep chooses its own bins
    # the table of test_debiased_ece_six_sample_hand_case
    table = estimator_summary(*_binary(TABLE_CONF, TABLE_HITS), n_bins=2)
    assert table["debiased_ce"] == pytest.approx(math.sqrt(5 / 72))


def _calls():
    return {
        "debiased_ece": lambda p, y: debiased_ece(p, y, n_bins=6),
        "sweep_ece": lambda p, y: sweep_ece(p, y),
        "sweep_ece_ew_l1": lambda p, y: sweep_ece(p, y, norm="l1", binning="equal_width"),
        "marginal_ece": lambda p, y: marginal_ece(p, y, n_bins=6),
        "marginal_ece_ew": lambda p, y: marginal_ece(p, y, n_bins=6, binning="equal_width"),
        "estimator_summary": lambda p, y: estimator_summary(p, y, n_bins=6),
    }


@pytest.mark.parametrize("name", sorted(_calls()))
def test_numpy_and_torch_inputs_agree(name):
    call = _calls()[name]
    probs, labels = _random(400, 4, 9)
    expected = call(probs, labels)
    assert call(torch.tensor(probs), torch.tensor(labels)) == expected
    probs32 = probs.astype(np.float32)
    assert call(torch.tensor(probs32), torch.tensor(labels)) == call(probs32, labels)
    # sample order does not matter when no confidence is tied
    order = np.random.default_rng(0).permutation(labels.size)
    assert call(probs[order], labels[order]) == pytest.approx(expected, rel=1e-12)


BAD_INPUTS = {
    "1-D probs": (np.array([0.5, 0.5]), np.array([0])),
    "out of range": (np.array([[2.0, -1.0]]), np.array([0])),
    "rows do not sum to 1": (np.array([[0.6, 0.6]]), np.array([0])),
    "NaN": (np.array([[np.nan, 0.5]]), np.array([0])),
    "label shape": (np.array([[0.5, 0.5]]), np.array([0, 1])),
    "label range": (np.array([[0.5, 0.5]]), np.array([2])),
    "float labels": (np.array([[0.5, 0.5]]), np.array([0.0])),
    "string probs": (np.array([["a", "b"]]), np.array([0])),
    "empty": (np.zeros((0, 2)), np.zeros(0, dtype=int)),
}


def _outcome(call, *args):
    try:
        call(*args)
    except (TypeError, ValueError) as error:
        return type(error), str(error)
    return None


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
@pytest.mark.parametrize("name", sorted(_calls()))
def test_bad_inputs_raise_the_errors_of_ece(name, case):
    probs, labels = BAD_INPUTS[case]
    expected = _outcome(ece, probs, labels)
    assert expected is not None
    assert _outcome(_calls()[name], probs, labels) == expected


def test_bad_arguments_raise_like_ece():
    p, y = MARGINAL_PROBS, MARGINAL_LABELS
    for call in (debiased_ece, marginal_ece, estimator_summary):
        with pytest.raises(ValueError, match="`n_bins` must be >= 1, got 0"):
            call(p, y, n_bins=0)
        with pytest.raises(TypeError, match="`n_bins` must be an integer"):
            call(p, y, n_bins=2.5)
        with pytest.raises(TypeError, match="`n_bins` must be an integer"):
            call(p, y, n_bins=True)
    for call in (sweep_ece, marginal_ece):
        with pytest.raises(ValueError, match="`norm` must be one of 'l1', 'l2', 'max', got 'l3'"):
            call(p, y, norm="l3")
        with pytest.raises(ValueError, match="`binning` must be one of"):
            call(p, y, binning="quantile")
    assert _outcome(lambda: sweep_ece(p, y, norm="l3")) == _outcome(lambda: ece(p, y, norm="l3"))
