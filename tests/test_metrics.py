import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from raysearch import metrics
from raysearch.metrics import (
    ReliabilityBins,
    accuracy,
    adaptive_ece,
    brier,
    calibration_summary,
    classwise_ece,
    ece,
    mce,
    nll,
    reliability_bins,
    softmax,
)
from raysearch.metrics import binning as binning_module

# ---------------------------------------------------------------------------------------------
# Hand-built table: K = 5 classes, n_bins = 5, edges 0, .2, .4, .6, .8, 1, bins (lo, hi].
#
#  row  probs                          label  conf  pred  hit  bin
#  r0   [.2, .2, .2, .2, .2]           0      0.2   0     1    0   (0.2 is ON the edge -> (0, .2])
#  r1   [.2, .2, .2, .2, .2]           3      0.2   0     0    0
#  r2   [.3, .25, .15, .15, .15]       1      0.3   0     0    1
#  r3   [1, 0, 0, 0, 0]                2      1.0   0     0    4   (1.0 -> LAST bin, no extra bin)
#  r4   [.05, .85, .1, 0, 0]           1      0.85  1     1    4
#  r5   [0, .1, .85, .05, 0]           2      0.85  2     1    4
#  r6   [.6, .4, 0, 0, 0]              0      0.6   0     1    2   (0.6 on the edge -> (.4, .6])
#  r7   [.3, .7, 0, 0, 0]              0      0.7   1     0    3
#
#  bin  count  conf               acc    |gap|
#  0    2      (.2+.2)/2 = .2     1/2    .3
#  1    1      .3                 0      .3
#  2    1      .6                 1      .4
#  3    1      .7                 0      .7
#  4    3      (1+.85+.85)/3 = .9 2/3    .9 - 2/3 = .7/3
#
#  ECE_l1 = (2*.3 + .3 + .4 + .7 + 3*(.7/3)) / 8 = 2.7 / 8 = 0.3375
#  ECE_l2 = sqrt((2*.09 + .09 + .16 + .49 + 3*(.49/9)) / 8) = sqrt((13/12) / 8) = sqrt(13/96)
#  MCE    = .7 ; accuracy = 4/8 = .5
#  Had 0.2 gone to bin 1: bin 0 empty, bin 1 = {r0,r1,r2} conf .7/3, acc 1/3, 3*|gap| = .1
#  -> ECE (.1+.4+.7+.7)/8 = .2375. Had 1.0 gone to an extra bin: bin 4 = {r4,r5} gap .15 (x2)
#  and {r3} gap 1 -> ECE (.6+.3+.4+.7+.3+1)/8 = .4125. Both differ from .3375.
# ---------------------------------------------------------------------------------------------

TABLE_PROBS = np.array(
    [
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.3, 0.25, 0.15, 0.15, 0.15],
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [0.05, 0.85, 0.1, 0.0, 0.0],
        [0.0, 0.1, 0.85, 0.05, 0.0],
        [0.6, 0.4, 0.0, 0.0, 0.0],
        [0.3, 0.7, 0.0, 0.0, 0.0],
    ]
)
TABLE_LABELS = np.array([0, 3, 1, 2, 1, 2, 0, 0])


def test_reliability_bins_hand_table():
    bins = reliability_bins(TABLE_PROBS, TABLE_LABELS, n_bins=5)
    assert isinstance(bins, ReliabilityBins)
    np.testing.assert_allclose(bins.edges, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_array_equal(bins.counts, [2, 1, 1, 1, 3])
    np.testing.assert_allclose(bins.accuracy, [0.5, 0.0, 1.0, 0.0, 2 / 3])
    np.testing.assert_allclose(bins.confidence, [0.2, 0.3, 0.6, 0.7, 0.9])
    assert bins.n_bins == 5
    assert bins.ece == pytest.approx(0.3375)
    assert bins.ece == ece(TABLE_PROBS, TABLE_LABELS, n_bins=5)


def test_ece_hand_table_norms():
    assert ece(TABLE_PROBS, TABLE_LABELS, n_bins=5) == pytest.approx(0.3375)
    assert ece(TABLE_PROBS, TABLE_LABELS, n_bins=5, norm="l2") == pytest.approx(math.sqrt(13 / 96))
    assert ece(TABLE_PROBS, TABLE_LABELS, n_bins=5, norm="max") == pytest.approx(0.7)
    assert mce(TABLE_PROBS, TABLE_LABELS, n_bins=5) == pytest.approx(0.7)
    assert accuracy(TABLE_PROBS, TABLE_LABELS) == pytest.approx(0.5)


def test_ece_l2_vs_l1_hand_case():
    # K = 2, n_bins = 2 (bins (0, .5], (.5, 1]); every confidence is in bin 1.
    # bin 1 only: 4 samples conf .9, 2 correct -> gap .4; l1 = .4, l2 = sqrt(.4^2) = .4.
    # Now two bins (n_bins = 10): conf .6 (1 hit of 2) in bin 5 -> gap .1;
    #                             conf 1.0 (0 hits of 2) in bin 9 -> gap 1.
    # l1 = (2*.1 + 2*1) / 4 = .55 ; l2 = sqrt((2*.01 + 2*1) / 4) = sqrt(.505) ~ .7106
    probs = np.array([[0.6, 0.4], [0.6, 0.4], [1.0, 0.0], [1.0, 0.0]])
    labels = np.array([0, 1, 1, 1])
    assert ece(probs, labels, n_bins=10, norm="l1") == pytest.approx(0.55)
    assert ece(probs, labels, n_bins=10, norm="l2") == pytest.approx(math.sqrt(0.505))
    single = np.array([[0.9, 0.1]] * 4)
    assert ece(single, np.array([0, 0, 1, 1]), n_bins=2, norm="l1") == pytest.approx(0.4)
    assert ece(single, np.array([0, 0, 1, 1]), n_bins=2, norm="l2") == pytest.approx(0.4)


def test_assign_bins_edges():
    # (lo, hi] with n_bins = 5: 0.0 -> first bin, 0.2 -> bin 0, just above 0.2 -> bin 1,
    # 0.6 (= 3/5) -> bin 2, 1.0 -> last bin 4; same in float32 (edges cast to the score dtype).
    for dtype in (np.float32, np.float64):
        scores = np.array([0.0, 0.2, np.nextafter(dtype(0.2), dtype(1)), 0.6, 0.61, 1.0], dtype)
        np.testing.assert_array_equal(binning_module._assign_bins(scores, 5), [0, 0, 1, 2, 3, 4])


def test_assign_bins_fast_path_matches_searchsorted():
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for n_bins in (1, 3, 7, 10, 15, 100):
            edges = np.arange(n_bins + 1) / n_bins
            scores = np.concatenate(
                [rng.random(5000), edges, np.nextafter(edges, 2.0), np.nextafter(edges, -1.0)]
            )
            scores = np.clip(scores, 0.0, 1.0).astype(dtype)
            expected = np.searchsorted(edges.astype(dtype), scores, side="left") - 1
            expected = np.clip(expected, 0, n_bins - 1)
            np.testing.assert_array_equal(binning_module._assign_bins(scores, n_bins), expected)


def _naive_ece(conf, hits, n_bins):
    # Independent reference: explicit (lo, hi] comparisons, Python loop over bins.
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        mask = (conf > lo) & (conf <= hi)
        if b == 0:
            mask |= conf <= lo
        if mask.any():
            total += mask.sum() / len(conf) * abs(hits[mask].mean() - conf[mask].mean())
    return total


def test_ece_matches_naive_reference():
    rng = np.random.default_rng(1)
    probs = softmax(rng.normal(size=(3000, 7)) * 2)
    labels = rng.integers(0, 7, 3000)
    conf = probs.max(axis=1)
    hits = probs.argmax(axis=1) == labels
    for n_bins in (1, 5, 15):
        assert ece(probs, labels, n_bins=n_bins) == pytest.approx(_naive_ece(conf, hits, n_bins))


def test_perfectly_calibrated_toy_case_is_zero():
    # conf .8 with 4 of 5 correct, conf .6 with 3 of 5 correct: acc_b == conf_b in every bin.
    probs = np.array([[0.8, 0.2]] * 5 + [[0.4, 0.6]] * 5)
    labels = np.array([0, 0, 0, 0, 1] + [1, 1, 1, 0, 0])
    assert ece(probs, labels) == pytest.approx(0.0, abs=1e-12)
    assert ece(probs, labels, norm="l2") == pytest.approx(0.0, abs=1e-12)
    assert mce(probs, labels) == pytest.approx(0.0, abs=1e-12)
    # equal-mass with 2 bins: groups {.6 x5} and {.8 x5} (sorted), the same two calibrated bins
    assert adaptive_ece(probs, labels, n_bins=2) == pytest.approx(0.0, abs=1e-12)


def test_uniform_predictor_on_balanced_classes_has_zero_ece():
    # Constant p = 1/4: conf .25, argmax class 0 always, correct on the 1/4 of samples of class 0
    # -> acc .25 == conf .25: ECE 0. This is why the sweep never optimises ECE alone;
    # NLL = log 4 and Brier = 4 * 1/16 - 2/4 + 1 = .75 do see the useless predictor.
    probs = np.full((8, 4), 0.25)
    labels = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    assert ece(probs, labels) == pytest.approx(0.0, abs=1e-12)
    # equal-mass, 2 bins: the stable sort keeps the tied samples in order, so each group of 4
    # holds one sample of class 0 -> acc .25 == conf .25 (with 15 bins of one sample each,
    # AECE would be mean |a_i - c_i| = (2*.75 + 6*.25)/8 = .375: tiny bins are not calibrated)
    assert adaptive_ece(probs, labels, n_bins=2) == pytest.approx(0.0, abs=1e-12)
    assert adaptive_ece(probs, labels) == pytest.approx(0.375)
    assert classwise_ece(probs, labels) == pytest.approx(0.0, abs=1e-12)
    assert accuracy(probs, labels) == pytest.approx(0.25)
    assert nll(probs, labels) == pytest.approx(math.log(4))
    assert brier(probs, labels) == pytest.approx(0.75)


def test_adaptive_ece_with_ties():
    # 6 samples, n_bins = 3 -> np.array_split into groups of 2 after sorting by confidence.
    # conf .6 x3 (all correct), conf .9 x3 (all wrong); the tie at .6 straddles groups 0 and 1.
    #   group 0: {.6, .6}  conf .6,  acc 1   -> gap .4
    #   group 1: {.6, .9}  conf .75, acc .5  -> gap .25
    #   group 2: {.9, .9}  conf .9,  acc 0   -> gap .9
    # AECE = (2*.4 + 2*.25 + 2*.9) / 6 = 3.1 / 6.  (Binning by quantile VALUES would put all
    # three .6 in one bin: (3*.4 + 3*.9)/6 = .65; dropping the lowest sample changes it too.)
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.9, 0.1], [0.6, 0.4], [0.9, 0.1], [0.6, 0.4]])
    labels = np.array([1, 0, 1, 0, 1, 0])
    assert adaptive_ece(probs, labels, n_bins=3) == pytest.approx(3.1 / 6)
    assert ece(probs, labels, n_bins=3, binning="equal_mass") == pytest.approx(3.1 / 6)
    # More bins than samples: one sample per non-empty bin -> mean |a_i - c_i| = 3.9 / 6 = .65
    assert adaptive_ece(probs, labels, n_bins=10) == pytest.approx(0.65)


def test_adaptive_ece_counts_every_sample_once():
    rng = np.random.default_rng(2)
    conf = np.round(rng.random(1001) * 4) / 8 + 0.5  # heavy ties: 5 distinct values
    index = binning_module._assign_bins(conf, 15, "equal_mass")
    counts = np.bincount(index, minlength=15)
    assert counts.sum() == 1001
    assert set(counts.tolist()) == {66, 67}  # 1001 = 11 * 67 + 4 * 66 (np.array_split sizes)


def test_classwise_ece_hand_three_classes():
    # n_bins = 5, edges 0, .2, .4, .6, .8, 1; per class, sum_b |B_b|/N |freq_b - conf_b|
    # = sum_b |sum of indicators - sum of scores| / N, with N = 4.
    #   row  probs            label
    #   r0   [1.0, 0.0, 0.0]  0
    #   r1   [0.2, 0.8, 0.0]  1
    #   r2   [0.2, 0.2, 0.6]  0
    #   r3   [0.5, 0.3, 0.2]  2
    # class 0: scores 1, .2, .2, .5; labels==0: 1, 0, 1, 0
    #   bin0 {.2,.2} ind 1 -> |1 - .4| = .6 ; bin2 {.5} -> .5 ; bin4 {1.0} ind 1 -> 0 ; 1.1/4
    # class 1: scores 0, .8, .2, .3; ind 0, 1, 0, 0
    #   bin0 {0.0 (first bin), .2} -> .2 ; bin1 {.3} -> .3 ; bin3 {.8} ind 1 -> .2 ; .7/4
    # class 2: scores 0, 0, .6, .2; ind 0, 0, 0, 1
    #   bin0 {0, 0, .2} ind 1 -> |1 - .2| = .8 ; bin2 {.6} -> .6 ; 1.4/4
    # cECE = (1.1 + .7 + 1.4) / 4 / 3 = 3.2 / 12
    probs = np.array([[1.0, 0.0, 0.0], [0.2, 0.8, 0.0], [0.2, 0.2, 0.6], [0.5, 0.3, 0.2]])
    labels = np.array([0, 1, 0, 2])
    assert classwise_ece(probs, labels, n_bins=5) == pytest.approx(3.2 / 12)


def test_classwise_ece_chunking_does_not_change_value(monkeypatch):
    rng = np.random.default_rng(3)
    probs = softmax(rng.normal(size=(500, 6)))
    labels = rng.integers(0, 6, 500)
    whole = classwise_ece(probs, labels)
    monkeypatch.setattr(metrics.classwise, "_CHUNK_ENTRIES", 7)  # 1 row per chunk
    assert classwise_ece(probs, labels) == pytest.approx(whole, abs=1e-14)


def test_brier_and_nll_hand_values():
    # r0 [.7, .2, .1] y=0: (.7-1)^2 + .2^2 + .1^2 = .09 + .04 + .01 = .14
    # r1 [.2, .5, .3] y=2: .2^2 + .5^2 + (.3-1)^2 = .04 + .25 + .49 = .78   -> Brier .46
    # NLL = -(log .7 + log .3) / 2
    probs = np.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3]])
    labels = np.array([0, 2])
    assert brier(probs, labels) == pytest.approx(0.46)
    assert nll(probs, labels) == pytest.approx(-(math.log(0.7) + math.log(0.3)) / 2)
    # A confident wrong prediction: Brier 2, NLL capped at -log(eps).
    wrong = np.array([[1.0, 0.0]])
    assert brier(wrong, np.array([1])) == pytest.approx(2.0)
    assert nll(wrong, np.array([1])) == pytest.approx(-math.log(1e-12))
    assert nll(wrong, np.array([1]), eps=1e-3) == pytest.approx(-math.log(1e-3))


def test_numpy_and_torch_inputs_give_identical_values():
    rng = np.random.default_rng(4)
    for dtype in (np.float32, np.float64):
        probs = softmax(rng.normal(size=(400, 5)) * 3).astype(dtype)
        labels = rng.integers(0, 5, 400)
        from_numpy = calibration_summary(probs, labels)
        from_torch = calibration_summary(torch.from_numpy(probs), torch.from_numpy(labels))
        assert from_numpy == from_torch
        assert ece(probs, labels, norm="l2") == ece(
            torch.from_numpy(probs), torch.from_numpy(labels), norm="l2"
        )
    # float32 tensors: edge confidences are binned on float32 edges (0.2f on the 0.2 edge)
    t_probs = torch.tensor(TABLE_PROBS, dtype=torch.float32)
    bins = reliability_bins(t_probs, torch.tensor(TABLE_LABELS), n_bins=5)
    np.testing.assert_array_equal(bins.counts, [2, 1, 1, 1, 3])
    assert ece(t_probs, torch.tensor(TABLE_LABELS), n_bins=5) == pytest.approx(0.3375, abs=1e-6)


def test_torch_half_and_requires_grad_inputs():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 4, generator=generator, requires_grad=True)
    probs = torch.softmax(logits, dim=1)
    labels = torch.randint(0, 4, (64,), generator=generator)
    value = ece(probs, labels)
    assert isinstance(value, float)
    assert value == ece(probs.detach().numpy(), labels.numpy())
    # float16 / bfloat16 are computed in float32 (NumPy has no bfloat16)
    half = probs.to(torch.float16)
    assert ece(half, labels) == ece(half.float(), labels)
    # bfloat16 rows miss 1 by up to ~2**-8 (here 1.0026): accepted for bfloat16 (tolerance 2**-7)
    # but the same values as float32 fail the 1e-3 row-sum check.
    bf16 = probs.to(torch.bfloat16)
    assert 0.0 <= ece(bf16, labels) <= 1.0
    with pytest.raises(ValueError, match="sum to 1"):
        ece(bf16.float(), labels)


def test_batched_vs_whole():
    # Bin statistics of batches add up: merged counts and count-weighted per-bin means give the
    # whole-set reliability table and ECE; mean metrics are count-weighted batch means.
    rng = np.random.default_rng(5)
    probs = softmax(rng.normal(size=(1000, 10)) * 2)
    labels = rng.integers(0, 10, 1000)
    whole = reliability_bins(probs, labels)
    counts = np.zeros(15, dtype=np.int64)
    hit_sums = np.zeros(15)
    conf_sums = np.zeros(15)
    summaries = []
    for start, stop in ((0, 123), (123, 600), (600, 1000)):
        part = reliability_bins(probs[start:stop], labels[start:stop])
        counts += part.counts
        hit_sums += np.nan_to_num(part.accuracy) * part.counts
        conf_sums += np.nan_to_num(part.confidence) * part.counts
        summaries.append((stop - start, calibration_summary(probs[start:stop], labels[start:stop])))
    np.testing.assert_array_equal(counts, whole.counts)
    merged = ReliabilityBins(
        whole.edges,
        counts,
        np.where(counts > 0, hit_sums / np.maximum(counts, 1), np.nan),
        np.where(counts > 0, conf_sums / np.maximum(counts, 1), np.nan),
    )
    assert merged.ece == pytest.approx(ece(probs, labels), abs=1e-12)
    full = calibration_summary(probs, labels)
    for key in ("accuracy", "nll", "brier"):
        weighted = sum(n * summary[key] for n, summary in summaries) / 1000
        assert weighted == pytest.approx(full[key], abs=1e-12)


def test_calibration_summary_keys_and_consistency():
    rng = np.random.default_rng(6)
    probs = softmax(rng.normal(size=(300, 4)) * 2)
    labels = rng.integers(0, 4, 300)
    summary = calibration_summary(probs, labels, n_bins=10)
    assert list(summary) == ["accuracy", "ece", "aece", "cece", "mce", "nll", "brier"]
    assert all(type(value) is float for value in summary.values())
    assert summary["accuracy"] == accuracy(probs, labels)
    assert summary["ece"] == ece(probs, labels, n_bins=10)
    assert summary["aece"] == adaptive_ece(probs, labels, n_bins=10)
    assert summary["cece"] == classwise_ece(probs, labels, n_bins=10)
    assert summary["mce"] == mce(probs, labels, n_bins=10)
    assert summary["nll"] == nll(probs, labels)
    assert summary["brier"] == brier(probs, labels)


@pytest.mark.parametrize("binning", ["equal_width", "equal_mass"])
@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
@pytest.mark.parametrize("n_bins", [1, 2, 15, 50])
def test_calibration_errors_are_fractions(binning, norm, n_bins):
    rng = np.random.default_rng(n_bins)
    probs = softmax(rng.normal(size=(200, 3)) * 4)
    labels = rng.integers(0, 3, 200)
    assert 0.0 <= ece(probs, labels, n_bins=n_bins, binning=binning, norm=norm) <= 1.0
    assert 0.0 <= classwise_ece(probs, labels, n_bins=n_bins) <= 1.0


def test_softmax_stable_and_accepts_torch():
    logits = np.array([[1000.0, 1000.0, -np.inf], [0.0, np.log(3.0), -1e9]])
    probs = softmax(logits)
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, [[0.5, 0.5, 0.0], [0.25, 0.75, 0.0]])
    from_torch = softmax(torch.tensor(logits[1:], dtype=torch.float32))
    np.testing.assert_allclose(from_torch, probs[1:], rtol=1e-6)
    with pytest.raises(ValueError, match="logits"):
        softmax(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match="logits"):
        softmax(np.array([[-np.inf, -np.inf]]))


def test_reliability_bins_is_frozen_and_read_only():
    bins = reliability_bins(TABLE_PROBS, TABLE_LABELS, n_bins=5)
    with pytest.raises(AttributeError):
        bins.counts = np.zeros(5)
    with pytest.raises(ValueError, match="read-only"):
        bins.counts[0] = 7
    with pytest.raises(ValueError, match="edges"):
        ReliabilityBins(np.zeros(3), np.zeros(5), np.zeros(5), np.zeros(5))


def test_validation_errors():
    good = np.array([[0.5, 0.5], [0.9, 0.1]])
    labels = np.array([0, 1])
    with pytest.raises(ValueError, match=r"`probs` must be 2-D \(N, K\), got shape \(2,\)"):
        ece(np.array([0.5, 0.5]), labels)
    with pytest.raises(ValueError, match="finite; row 1"):
        ece(np.array([[0.5, 0.5], [np.nan, 0.5]]), labels)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        ece(np.array([[1.5, -0.5], [0.5, 0.5]]), labels)
    with pytest.raises(ValueError, match="row 1 sums to 1.8"):
        ece(np.array([[0.5, 0.5], [0.9, 0.9]]), labels)
    with pytest.raises(ValueError, match=r"sum to 1 \(within 0.001\); row 0 sums to 0.8"):
        ece(np.array([[0.4, 0.4], [0.5, 0.5]]), labels)
    with pytest.raises(
        ValueError, match=r"`labels` must have shape \(2,\) to match `probs` of shape \(2, 2\)"
    ):
        ece(good, np.array([0, 1, 1]))
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 2\)"):
        accuracy(good, np.array([0, 2]))
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 2\)"):
        nll(good, np.array([-1, 0]))
    with pytest.raises(ValueError, match="integer class indices"):
        brier(good, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="at least one sample"):
        ece(np.zeros((0, 3)), np.zeros(0, dtype=np.int64))
    with pytest.raises(TypeError, match="`probs` must hold real numbers"):
        ece(np.array([["a", "b"]]), np.array([0]))


def test_argument_errors():
    probs = np.array([[0.5, 0.5]])
    labels = np.array([0])
    with pytest.raises(ValueError, match="`n_bins` must be >= 1, got 0"):
        ece(probs, labels, n_bins=0)
    with pytest.raises(ValueError, match="`n_bins` must be >= 1, got -3"):
        classwise_ece(probs, labels, n_bins=-3)
    with pytest.raises(TypeError, match="`n_bins` must be an integer"):
        reliability_bins(probs, labels, n_bins=2.5)
    with pytest.raises(
        ValueError, match="`binning` must be one of 'equal_width', 'equal_mass', got 'quantile'"
    ):
        ece(probs, labels, binning="quantile")
    with pytest.raises(ValueError, match="`norm` must be one of 'l1', 'l2', 'max', got 'l3'"):
        ece(probs, labels, norm="l3")
    with pytest.raises(ValueError, match=r"`eps` must be in \(0, 1\), got 0"):
        nll(probs, labels, eps=0)


def test_large_input_is_vectorised():
    # 2e5 x 100 in well under a second per metric if vectorised (no timing asserted here; see
    # benchmarks/ for speed). The check is that values stay valid fractions on a large input.
    rng = np.random.default_rng(7)
    probs = softmax(rng.normal(size=(200_000, 100)).astype(np.float32) * 3).astype(np.float32)
    labels = rng.integers(0, 100, 200_000)
    summary = calibration_summary(probs, labels)
    for key in ("ece", "aece", "cece", "mce"):
        assert 0.0 <= summary[key] <= 1.0


def test_metrics_import_no_ray_mlflow_optuna_matplotlib():
    code = (
        "import sys, raysearch.metrics\n"
        "bad = [m for m in ('ray', 'mlflow', 'optuna', 'matplotlib') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
