"""KS error, over-/underconfidence, average confidence and the bootstrap ECE interval."""

import math
import warnings

import numpy as np
import pytest
import torch

from raysearch import metrics
from raysearch.metrics import (
    average_confidence,
    ece,
    ece_ci,
    ks_error,
    overconfidence,
    softmax,
    underconfidence,
)
from raysearch.metrics import binning as binning_module
from raysearch.metrics import bootstrap as bootstrap_module
from raysearch.metrics import checks as checks_module

# The hand table of tests/test_metrics.py (K = 5, n_bins = 5, bins (lo, hi], 0.2 in bin 0 and
# 1.0 in bin 4):
#
#  row  conf  hit  bin        bin  count  conf  acc   conf - acc
#  r0   0.2   1    0          0    2      .2    1/2   -.3   (under)
#  r1   0.2   0    0          1    1      .3    0     +.3   (over)
#  r2   0.3   0    1          2    1      .6    1     -.4   (under)
#  r3   1.0   0    4          3    1      .7    0     +.7   (over)
#  r4   0.85  1    4          4    3      .9    2/3   +.7/3 (over)
#  r5   0.85  1    4
#  r6   0.6   1    2
#  r7   0.7   0    3
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


def _gupta_ks(conf, hits):
    # The released code of Gupta et al. (argsort, cumsum, max over every index).
    order = np.argsort(conf)
    n = conf.size
    return np.max(np.abs(np.cumsum(conf[order]) / n - np.cumsum(hits[order]) / n))


# ---------------------------------------------------------------------------------------------
# KS error
# ---------------------------------------------------------------------------------------------


def test_ks_error_four_sample_hand_case():
    # conf / hit: .9 wrong, .6 right, .8 right, .7 right. Sorted by confidence:
    #   conf  .6   .7   .8   .9
    #   hit   1    1    1    0
    #   cum conf  .6  1.3  2.1  3.0
    #   cum hits  1   2    3    3
    #   diff     -.4 -.7  -.9   0     -> KS = .9 / 4 = .225
    probs = np.array([[0.9, 0.1], [0.4, 0.6], [0.8, 0.2], [0.3, 0.7]])
    labels = np.array([1, 1, 0, 1])
    assert ks_error(probs, labels) == pytest.approx(0.225)
    conf, hits = probs.max(axis=1), probs.argmax(axis=1) == labels
    assert _gupta_ks(conf, hits) == pytest.approx(0.225)  # no ties: same as the released code
    assert ks_error(torch.tensor(probs), torch.tensor(labels)) == pytest.approx(0.225)


def test_ks_error_ties_do_not_depend_on_order():
    # Two samples at conf .5 (argmax class 0), one right, one wrong: calibrated, KS = 0 in
    # either order (a per-sample max would read |.5 - 1| / 2 or |.5 - 0| / 2 = .25 mid-tie).
    # Adding conf .9 wrong: ends of the tie runs: after the pair 1 - 1 = 0, after .9:
    # 1.9 - 1 = .9 -> KS = .9 / 3 = .3.
    pair = np.array([[0.5, 0.5], [0.5, 0.5]])
    assert ks_error(pair, np.array([0, 1])) == 0.0
    assert ks_error(pair, np.array([1, 0])) == 0.0
    probs = np.array([[0.5, 0.5], [0.9, 0.1], [0.5, 0.5]])
    assert ks_error(probs, np.array([0, 1, 1])) == pytest.approx(0.3)
    assert ks_error(probs, np.array([1, 1, 0])) == pytest.approx(0.3)


def test_ks_error_limits_and_released_code_agreement():
    # Confident and always wrong: cum conf - cum hits = N at the end -> KS = 1.
    assert ks_error(np.array([[1.0, 0.0]] * 3), np.array([1, 1, 1])) == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    probs = softmax(rng.normal(size=(2000, 6)) * 2)
    labels = rng.integers(0, 6, 2000)
    conf, hits = probs.max(axis=1), probs.argmax(axis=1) == labels
    assert ks_error(probs, labels) == pytest.approx(_gupta_ks(conf, hits))


# ---------------------------------------------------------------------------------------------
# Over- and underconfidence, average confidence
# ---------------------------------------------------------------------------------------------


def test_conditional_over_underconfidence_hand_table():
    # Paper (Sec. 4.2): o = mean conf of wrong rows, u = mean (1 - conf) of right rows.
    #   wrong: r1 .2, r2 .3, r3 1.0, r7 .7 -> o = 2.2 / 4 = .55
    #   right: r0 .2, r4 .85, r5 .85, r6 .6 -> u = (.8 + .15 + .15 + .4) / 4 = 1.5 / 4 = .375
    assert overconfidence(TABLE_PROBS, TABLE_LABELS) == pytest.approx(0.55)
    assert underconfidence(TABLE_PROBS, TABLE_LABELS) == pytest.approx(0.375)
    # n_bins plays no part in the conditional definition
    assert overconfidence(TABLE_PROBS, TABLE_LABELS, n_bins=3) == pytest.approx(0.55)


def test_binned_over_underconfidence_hand_table():
    # OE = sum_b |B_b|/N conf_b max(conf_b - acc_b, 0), over bins 1, 3, 4:
    #   (1 * .3 * .3 + 1 * .7 * .7 + 3 * .9 * .7/3) / 8 = (.09 + .49 + .63) / 8 = 1.21 / 8
    # UE = sum_b |B_b|/N (1 - conf_b) max(acc_b - conf_b, 0), over bins 0, 2:
    #   (2 * .8 * .3 + 1 * .4 * .4) / 8 = (.48 + .16) / 8 = .64 / 8 = .08
    oe = overconfidence(TABLE_PROBS, TABLE_LABELS, n_bins=5, definition="binned")
    ue = underconfidence(TABLE_PROBS, TABLE_LABELS, n_bins=5, definition="binned")
    assert oe == pytest.approx(1.21 / 8)
    assert ue == pytest.approx(0.08)
    # Without the conf_b / (1 - conf_b) weights the two parts add up to the ECE (1.7 + 1) / 8.
    assert ece(TABLE_PROBS, TABLE_LABELS, n_bins=5) == pytest.approx(2.7 / 8)


def test_over_underconfidence_empty_sets_and_calibrated_case():
    right = np.array([[0.9, 0.1], [0.2, 0.8]])
    labels = np.array([0, 1])
    assert math.isnan(overconfidence(right, labels))  # no wrong prediction
    assert underconfidence(right, labels) == pytest.approx((0.1 + 0.2) / 2)
    assert math.isnan(underconfidence(right, 1 - labels))  # no right prediction
    # conf .8 with 4 of 5 right (one bin, acc == conf): binned OE = UE = 0
    probs = np.array([[0.8, 0.2]] * 5)
    labels = np.array([0, 0, 0, 0, 1])
    assert overconfidence(probs, labels, definition="binned") == pytest.approx(0.0, abs=1e-12)
    assert underconfidence(probs, labels, definition="binned") == pytest.approx(0.0, abs=1e-12)


def test_average_confidence():
    # (.2 + .2 + .3 + 1 + .85 + .85 + .6 + .7) / 8 = 4.7 / 8
    assert average_confidence(TABLE_PROBS) == pytest.approx(4.7 / 8)
    assert average_confidence(torch.tensor(TABLE_PROBS, dtype=torch.float32)) == pytest.approx(
        4.7 / 8
    )
    assert average_confidence(np.full((3, 4), 0.25)) == pytest.approx(0.25)


def test_confidence_metric_errors():
    with pytest.raises(ValueError, match="definition"):
        overconfidence(TABLE_PROBS, TABLE_LABELS, definition="mund")
    with pytest.raises(ValueError, match="n_bins"):
        underconfidence(TABLE_PROBS, TABLE_LABELS, n_bins=0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        average_confidence(np.array([[2.0, -1.0]]))
    with pytest.raises(ValueError, match="2-D"):
        average_confidence(np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="labels"):
        ks_error(TABLE_PROBS, TABLE_LABELS[:3])


# ---------------------------------------------------------------------------------------------
# Bootstrap interval of the ECE
# ---------------------------------------------------------------------------------------------


def _overconfident(n, seed=0):
    # Confidence ~ .9 on 3 classes but accuracy ~ .7: ECE ~ .2, far from 0 (no floor effect).
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    pred = np.where(rng.random(n) < 0.7, labels, (labels + 1) % 3)
    conf = rng.uniform(0.8, 1.0, n)
    probs = np.tile(((1 - conf) / 2)[:, None], (1, 3))
    probs[np.arange(n), pred] = conf
    return probs, labels


def test_ece_ci_contains_point_and_narrows_with_n():
    probs, labels = _overconfident(4000)
    point, low, high = ece_ci(probs, labels, n_boot=400)
    assert point == pytest.approx(ece(probs, labels))
    assert 0.0 <= low <= point <= high <= 1.0
    small = ece_ci(*_overconfident(250), n_boot=400)
    large = ece_ci(*_overconfident(16000), n_boot=400)
    # the width scales like 1 / sqrt(N): 8x narrower for 64x the samples; ask for 4x
    assert (large[2] - large[1]) * 4 < small[2] - small[1]


def test_ece_ci_deterministic_per_seed():
    probs, labels = _overconfident(500)
    assert ece_ci(probs, labels, n_boot=200, seed=3) == ece_ci(probs, labels, n_boot=200, seed=3)
    assert ece_ci(probs, labels, n_boot=200, seed=3) != ece_ci(probs, labels, n_boot=200, seed=4)
    point, low, high = ece_ci(probs, labels, n_boot=200, alpha=0.5, seed=3)
    _, low95, high95 = ece_ci(probs, labels, n_boot=200, alpha=0.05, seed=3)
    assert low95 <= low <= high <= high95  # the same replicates, a wider quantile range


@pytest.mark.parametrize("binning", ["equal_width", "equal_mass"])
@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_ece_ci_matches_a_loop_over_replicates(binning, norm):
    # One chunk (50 x 300 draws < 2**20): ece_ci draws the same (n_boot, N) index matrix as
    # this reference, which loops over replicates calling ece on the resampled arrays.
    probs, labels = _overconfident(300, seed=1)
    probs = np.round(probs, 2)  # ties, to exercise the stable sort of equal-mass bins
    probs /= probs.sum(axis=1, keepdims=True)
    samples = np.random.default_rng(7).integers(0, 300, size=(50, 300))
    reference = [ece(probs[s], labels[s], 15, binning, norm) for s in samples]
    low, high = np.quantile(reference, [0.05, 0.95])
    point, got_low, got_high = ece_ci(
        probs, labels, n_boot=50, alpha=0.1, seed=7, binning=binning, norm=norm
    )
    assert point == pytest.approx(ece(probs, labels, 15, binning, norm))
    assert got_low == pytest.approx(low, abs=1e-12)
    assert got_high == pytest.approx(high, abs=1e-12)


def test_ece_replicates_across_chunks():
    # Many replicates of a tiny sample: several chunks of the vectorised path, each replicate
    # equal to ece on its resample.
    probs, labels = _overconfident(40, seed=2)
    conf, hits = checks_module._confidences_and_hits(probs, labels)
    samples = np.random.default_rng(0).integers(0, 40, size=(30, 40))
    got = bootstrap_module._ece_replicates(conf, hits, samples, 15, "equal_mass", "l1")
    expected = [ece(probs[s], labels[s], binning="equal_mass") for s in samples]
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_ece_ci_validation():
    probs, labels = _overconfident(50)
    with pytest.raises(ValueError, match="n_boot"):
        ece_ci(probs, labels, n_boot=1)
    with pytest.raises(TypeError, match="n_boot"):
        ece_ci(probs, labels, n_boot=10.0)
    for alpha in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="alpha"):
            ece_ci(probs, labels, alpha=alpha)
    with pytest.raises(TypeError, match="alpha"):
        ece_ci(probs, labels, alpha="0.05")
    with pytest.raises(ValueError, match="seed"):
        ece_ci(probs, labels, seed=-1)
    with pytest.raises(ValueError, match="binning"):
        ece_ci(probs, labels, binning="quantile")
    with pytest.raises(ValueError, match="n_bins"):
        ece_ci(probs, labels, n_bins=0)
    # seed=None: fresh entropy, still a valid interval
    point, low, high = ece_ci(probs, labels, n_boot=20, seed=None)
    assert 0.0 <= low <= high <= 1.0


# ---------------------------------------------------------------------------------------------
# Fast paths: the same values and errors as the reference algorithms
# ---------------------------------------------------------------------------------------------


def _array_split_bins(scores, n_bins):
    # Reference of equal-mass binning: stable argsort, then np.array_split into n_bins groups.
    index = np.empty(scores.shape[0], dtype=np.intp)
    for b, group in enumerate(np.array_split(np.argsort(scores, kind="stable"), n_bins)):
        index[group] = b
    return index


def _reference_ece(probs, labels, n_bins, binning):
    # The ECE pipeline without the fast paths: argmax pass, bincount with float weights.
    conf = probs.max(axis=1)
    hits = probs.argmax(axis=1) == labels
    if binning == "equal_mass":
        index = _array_split_bins(conf, n_bins)
    else:
        index = binning_module._assign_bins(conf, n_bins)
    counts = np.bincount(index, minlength=n_bins)
    conf_sums = np.bincount(index, weights=conf, minlength=n_bins)
    hit_sums = np.bincount(index, weights=hits, minlength=n_bins)
    means = binning_module._bin_means(counts, conf_sums, hit_sums)
    return binning_module._reduce_gaps(counts, *means, "l1")


def _reference_classwise_ece(probs, labels, n_bins):
    # Every (sample, class) entry through np.bincount, in row order, one block at a time.
    n, k = probs.shape
    counts = np.zeros(k * n_bins, dtype=np.int64)
    score_sums = np.zeros(k * n_bins)
    hit_sums = np.zeros(k * n_bins)
    rows = max(1, metrics.classwise._CHUNK_ENTRIES // k)
    for start in range(0, n, rows):
        block = probs[start : start + rows]
        slots = binning_module._assign_bins(block, n_bins) + np.arange(k) * n_bins
        counts += np.bincount(slots.reshape(-1), minlength=k * n_bins)
        score_sums += np.bincount(
            slots.reshape(-1), weights=block.reshape(-1), minlength=k * n_bins
        )
        hit_slots = slots[np.arange(block.shape[0]), labels[start : start + rows]]
        hit_sums += np.bincount(hit_slots, minlength=k * n_bins)
    counts = counts.reshape(k, n_bins)
    acc, conf = binning_module._bin_means(
        counts, score_sums.reshape(k, n_bins), hit_sums.reshape(k, n_bins)
    )
    return float(
        np.mean([binning_module._reduce_gaps(counts[c], acc[c], conf[c], "l1") for c in range(k)])
    )


def _edge_probs(n, k, dtype, seed):
    # Softmax rows mixed with rows whose confidence sits exactly on an edge of 5 or 15 bins,
    # one-hot rows (confidence 1.0, zeros elsewhere) and uniform rows (tied argmax).
    rng = np.random.default_rng(seed)
    probs = softmax(rng.normal(size=(n, k)) * rng.uniform(1, 6, size=(n, 1)))
    kind = rng.integers(0, 4, n)
    edge = rng.choice([0.2, 0.4, 0.6, 0.8, 1 / 3, 2 / 3, 14 / 15], size=n)
    edge = np.maximum(edge, 1 / k)
    top = rng.integers(0, k, n)
    for i in np.flatnonzero(kind == 1):
        probs[i] = (1 - edge[i]) / (k - 1)
        probs[i, top[i]] = edge[i]
    probs[kind == 2] = 0.0
    probs[kind == 2, top[kind == 2]] = 1.0
    probs[kind == 3] = 1.0 / k
    return probs.astype(dtype), rng.integers(0, k, n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equal_mass_bins_match_stable_argsort(dtype):
    rng = np.random.default_rng(3)
    cases = [
        rng.random(1000),
        np.round(rng.random(1000) * 4) / 4,  # 5 distinct values: long ties across cuts
        np.full(37, 0.5),  # one value: every cut is a tie
        np.concatenate([np.ones(500), rng.random(300)]),  # saturated confidences at 1.0
        rng.random(7),  # fewer samples than bins: empty trailing groups
        rng.random(15),
    ]
    for scores in cases:
        scores = scores.astype(dtype)
        # 1 bin, up to _COMPARE_MAX_CUTS cuts (comparisons) and more (binary search)
        for n_bins in (1, 2, 3, 15, 33, 50, 2000):
            expected = _array_split_bins(scores, n_bins)
            got = binning_module._assign_bins(scores, n_bins, "equal_mass")
            np.testing.assert_array_equal(got, expected, err_msg=f"{scores.size=} {n_bins=}")


@pytest.fixture
def torch_threads():
    """Set torch's real thread count for one test, restored afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_top1_scan_matches_argmax_and_max(monkeypatch, dtype):
    # Small blocks: several per call, a shorter last one. C order takes the fast checks and
    # the flat gather; F order and a reversed view the exact checks and take_along_axis.
    monkeypatch.setattr(checks_module, "_BLOCK_ENTRIES", 64)
    probs, _ = _edge_probs(203, 7, dtype, seed=4)
    for layout in (probs, np.asfortranarray(probs), probs[::-1]):
        predictions, confidences = checks_module._top1_scan(layout, 1e-3)
        np.testing.assert_array_equal(predictions, layout.argmax(axis=1))  # first on ties
        np.testing.assert_array_equal(confidences, layout.max(axis=1))
        assert confidences.dtype == dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_checks_accept_and_raise_exactly_as_the_exact_checks(monkeypatch, dtype):
    monkeypatch.setattr(checks_module, "_BLOCK_ENTRIES", 64)  # several blocks, a shorter last one
    base = softmax(np.random.default_rng(5).normal(size=(40, 6)) * 2).astype(dtype)
    tol = dtype(1e-6)
    edits = {
        "valid": lambda p: None,
        "nan": lambda p: p.__setitem__((17, 3), np.nan),
        "nan first": lambda p: p.__setitem__((0, 0), np.nan),
        "inf": lambda p: p.__setitem__((5, 1), np.inf),
        "-inf": lambda p: p.__setitem__((39, 5), -np.inf),
        "inf - inf": lambda p: p.__setitem__((8, slice(0, 2)), [np.inf, -np.inf]),
        "huge": lambda p: p.__setitem__(9, np.finfo(dtype).max / 2),
        "above 1": lambda p: p.__setitem__((3, 0), 1.5),
        "-1e-6": lambda p: p.__setitem__((4, 2), -tol),  # on the tolerance: accepted
        "-2e-6": lambda p: p.__setitem__((4, 2), -2 * tol),
        "one-hot 1+1e-6": lambda p: p.__setitem__(6, [1 + tol, 0, 0, 0, 0, 0]),
        "one-hot 1+2e-6": lambda p: p.__setitem__(6, [1 + 2 * tol, 0, 0, 0, 0, 0]),
    }
    # Row sums on both sides of 1 +- 1e-3, closer than the fast path's margin: the exact
    # float64 check decides.
    for sign in (1, -1):
        for offset in (-1e-4, -1e-5, -1e-6, 0.0, 1e-6, 1e-5, 1e-4):
            factor = dtype(1 + sign * (1e-3 + offset))
            edits[f"sum {sign} {offset}"] = lambda p, f=factor: p.__setitem__(11, p[11] * f)

    def outcome(fn, probs):
        try:
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, float64 overflow
                fn(probs)
        except ValueError as exc:
            return str(exc)
        return "ok"

    for name, edit in edits.items():
        probs = base.copy()
        edit(probs)
        expected = outcome(lambda p: checks_module._check_probs_exact(p, 1e-3), probs)
        assert outcome(lambda p: checks_module._check_probs(p, 1e-3), probs) == expected, name
        assert outcome(lambda p: checks_module._top1_scan(p, 1e-3), probs) == expected, name
    assert outcome(lambda p: checks_module._check_probs_exact(p, 1e-3), base) == "ok"


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_classwise_ece_matches_bincount_reference_bit_for_bit(
    monkeypatch, torch_threads, workers, dtype
):
    # Blocks of 100 entries (12 rows of 8 classes, a shorter last block), serial and threaded.
    monkeypatch.setattr(metrics.classwise, "_CHUNK_ENTRIES", 100)
    torch_threads(workers)
    probs, labels = _edge_probs(301, 8, dtype, seed=6)
    probs[0, :2] += [-1e-7, 1e-7]  # a slightly negative entry (within the 1e-6 tolerance)
    for n_bins in (1, 2, 5, 15):
        expected = _reference_classwise_ece(probs, labels, n_bins)
        assert metrics.classwise_ece(probs, labels, n_bins) == expected


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ece_and_adaptive_ece_match_reference_bit_for_bit(monkeypatch, dtype):
    monkeypatch.setattr(checks_module, "_BLOCK_ENTRIES", 64)
    probs, labels = _edge_probs(257, 5, dtype, seed=7)
    for n_bins in (1, 5, 15, 40):
        assert ece(probs, labels, n_bins) == _reference_ece(probs, labels, n_bins, "equal_width")
        expected = _reference_ece(probs, labels, n_bins, "equal_mass")
        assert metrics.adaptive_ece(probs, labels, n_bins) == expected


def test_read_only_and_tensor_inputs_give_the_same_values_without_warnings():
    probs, labels = _edge_probs(50, 4, np.float32, seed=8)
    read_only = probs.copy()
    read_only.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ece(read_only, labels) == ece(probs, labels)
        assert metrics.classwise_ece(read_only, labels) == metrics.classwise_ece(probs, labels)
    assert ece(torch.from_numpy(probs), torch.from_numpy(labels)) == ece(probs, labels)
