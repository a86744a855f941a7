"""CalibrationMeter: streaming sums equal the batch metrics on the concatenated valid pixels."""

import math

import numpy as np
import pytest
import torch

from raysearch.metrics import (
    CalibrationMeter,
    accuracy,
    adaptive_ece,
    brier,
    calibration_summary,
    classwise_ece,
    ece,
    mce,
    nll,
    reliability_bins,
)
from raysearch.metrics import binning as binning_module

IGNORE = 255


def _segmentation_batch(rng, n, k, h, w, dtype, ignored=0.1):
    """Softmax probabilities (N, K, H, W); labels drawn from them (85%) or uniformly (15%).

    Mixed calibration (so equal-width and equal-mass ECE differ) plus edge pixels: a one-hot
    pixel (confidence 1.0), a uniform one (1/K on every class) and one at 0.6 / 0.4 (bin edges
    for 5 and 15 bins).
    """
    z = 2.0 * rng.normal(size=(n, k, h, w))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p = p.astype(dtype)
    drawn = (rng.random((n, 1, h, w)) < np.cumsum(p, axis=1)).argmax(axis=1)
    labels = np.where(rng.random((n, h, w)) < 0.85, drawn, rng.integers(0, k, (n, h, w)))
    labels[rng.random((n, h, w)) < ignored] = IGNORE
    p[0, :, 0, 0] = 0.0
    p[0, 0, 0, 0] = 1.0
    p[0, :, 0, 1] = 1.0 / k
    p[0, :, 0, 2] = 0.0
    p[0, 0, 0, 2], p[0, 1, 0, 2] = 0.6, 0.4
    return p, labels


def _valid_pixels(p, labels):
    """(P, K) probabilities and (P,) labels of the non-ignored pixels, in arrival order."""
    k = p.shape[1]
    flat = np.moveaxis(p, 1, -1).reshape(-1, k)
    y = labels.reshape(-1)
    keep = y != IGNORE
    return flat[keep], y[keep]


def _total_numel(meter):
    return sum(t.numel() for t in meter.state_dict().values())


# ---------------------------------------------------------------------------------------------
# Agreement with the batch functions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_bins", [1, 3, 7, 10, 15])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bins_match_assign_bins(n_bins, dtype):
    rng = np.random.default_rng(n_bins)
    edges64 = binning_module._equal_width_edges(n_bins)
    values = np.concatenate(
        [rng.random(5000), edges64, np.nextafter(edges64, 2.0), np.nextafter(edges64, -1.0)]
    )
    values = np.clip(values, -1e-7, 1.0 + 1e-7)
    scores = torch.from_numpy(values).to(dtype)
    edges = torch.from_numpy(edges64).to(dtype)
    expected = binning_module._assign_bins(scores.numpy(), n_bins)
    np.testing.assert_array_equal(
        binning_module._torch_equal_width_bins(scores, edges).numpy(), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_bins", [5, 15])
def test_dense_batches_equal_batch_metrics(dtype, n_bins):
    rng = np.random.default_rng(0)
    k = 5
    meter = CalibrationMeter(k, n_bins=n_bins, ignore_index=IGNORE)
    probs, labels = [], []
    shapes = [(3, 17, 9), (1, 4, 4), (2, 8, 30), (4, 5, 5)]
    for i, (n, h, w) in enumerate(shapes):
        p, y = _segmentation_batch(rng, n, k, h, w, dtype)
        if i % 2:  # torch inputs (uint8 labels), NumPy otherwise
            meter.update(torch.from_numpy(p), torch.from_numpy(y.astype(np.uint8)))
        else:
            meter.update(p, y)
        p_valid, y_valid = _valid_pixels(p, y)
        probs.append(p_valid)
        labels.append(y_valid)
    p, y = np.concatenate(probs), np.concatenate(labels)
    got = meter.compute()
    expected = {
        "accuracy": accuracy(p, y),
        "ece": ece(p, y, n_bins),
        "mce": mce(p, y, n_bins),
        "cece": classwise_ece(p, y, n_bins),
        "nll": nll(p, y),
        "brier": brier(p, y),
        "aece": adaptive_ece(p, y, n_bins),  # every pixel is in the sample (< aece_samples)
    }
    assert abs(expected["aece"] - expected["ece"]) > 1e-4  # the two binnings differ here
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-9), key
    assert got["n"] == got["n_aece"] == len(y)
    bins, expected_bins = meter.reliability_bins(), reliability_bins(p, y, n_bins)
    np.testing.assert_array_equal(bins.counts, expected_bins.counts)
    np.testing.assert_allclose(bins.accuracy, expected_bins.accuracy, atol=1e-12)
    np.testing.assert_allclose(bins.confidence, expected_bins.confidence, atol=1e-12)
    assert bins.ece == pytest.approx(got["ece"], abs=1e-12)
    assert set(CalibrationMeter.KEYS) == set(got)
    assert all(isinstance(value, float) for value in got.values())


@pytest.mark.parametrize("background", [0, None])
def test_histogram_copies_and_blocks_give_the_same_state(monkeypatch, background):
    # The accelerator settings (R copies of each histogram, pixel i adding to copy i % R;
    # large blocks) run here on the CPU: every count equals the one-copy state, float sums to
    # the last bits, whatever the block size (several blocks, a shorter last one).
    from raysearch.metrics import meter_sums

    rng = np.random.default_rng(3)
    batches = [_segmentation_batch(rng, n, 6, h, w, np.float32) for n, h, w in
               [(3, 17, 9), (2, 8, 30)]]
    flat, labels = _valid_pixels(*batches[0])  # a (N, K) classification batch: one pixel each
    batches.append((np.ascontiguousarray(flat[:70]), labels[:70]))

    def state(replicas: int, entries: int, cap: int = 1 << 20) -> dict:
        monkeypatch.setitem(meter_sums._METER_REPLICAS, "cpu", replicas)
        monkeypatch.setitem(meter_sums._METER_BLOCK_ENTRIES, "cpu", entries)
        monkeypatch.setattr(meter_sums, "_METER_REPLICA_SLOTS", cap)
        meter = CalibrationMeter(6, ignore_index=IGNORE, background=background)
        for p, y in batches:
            meter.update(torch.from_numpy(p), torch.from_numpy(y))
        return meter.state_dict()

    monkeypatch.setattr(meter_sums, "_METER_REPLICA_SLOTS", 100)
    edges = torch.from_numpy(binning_module._equal_width_edges(15))
    copies = meter_sums._UpdateSums(6, edges, IGNORE, background, replicas=512).copies
    assert copies == {31: 3, 16: 6, 91: 1, 37: 2, 15: 6}  # by slots: pairs, conf, class, ...
    one = state(1, 1 << 20)
    assert one["class_counts"].sum() == 6 * one["top_counts"].sum() > 0
    # (copies, block entries, slots cap): with a cap of 100 slots the 91-slot class-wise
    # histograms keep 1 copy, the 31-slot confidence pairs 3, the 15-slot gaps 6
    for replicas, entries, cap in [(5, 1 << 20, 1 << 20), (128, 1 << 20, 1 << 20),
                                   (7, 6 * 40, 1 << 20), (3, 6 * 7, 1 << 20), (512, 6 * 50, 100)]:
        got = state(replicas, entries, cap)
        assert set(got) == set(one)
        for name, tensor in one.items():
            if tensor.is_floating_point():
                torch.testing.assert_close(got[name], tensor, rtol=1e-12, atol=1e-12, msg=name)
            else:
                assert torch.equal(got[name], tensor), (name, replicas, entries, cap)


def test_classification_batches_equal_calibration_summary():
    rng = np.random.default_rng(1)
    k = 10
    z = 3.0 * rng.normal(size=(700, k))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = rng.integers(0, k, 700)
    meter = CalibrationMeter(k)
    for start in (0, 1, 300):  # batches of 1, 299 and 400 rows, numpy then torch
        stop = {0: 1, 1: 300, 300: 700}[start]
        chunk = p[start:stop] if start < 300 else torch.from_numpy(p[start:stop])
        meter.update(chunk, y[start:stop])
    got = meter.compute()
    for key, value in calibration_summary(p, y).items():
        assert got[key] == pytest.approx(value, abs=1e-9), key
    assert got["n"] == 700


def test_bfloat16_probs_equal_batch_metrics():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(64, 7, 3), dim=1).to(torch.bfloat16)
    y = torch.randint(0, 7, (64, 3))
    meter = CalibrationMeter(7)
    meter.update(p[:20], y[:20])
    meter.update(p[20:], y[20:])
    flat_p = p.permute(0, 2, 1).reshape(-1, 7)
    flat_y = y.reshape(-1)
    got = meter.compute()
    assert got["ece"] == pytest.approx(ece(flat_p, flat_y), abs=1e-9)
    assert got["cece"] == pytest.approx(classwise_ece(flat_p, flat_y), abs=1e-9)
    assert got["brier"] == pytest.approx(brier(flat_p, flat_y), abs=1e-9)


# ---------------------------------------------------------------------------------------------
# mIoU on a hand-made confusion matrix
# ---------------------------------------------------------------------------------------------


def test_miou_hand_computed():
    # K = 3, one image of 2 x 4 pixels, the last pixel ignored (its argmax 2 must not count):
    #   labels      0  0  0  0 | 0  1  1  255
    #   predicted   0  0  0  1 | 1  1  0  (2)
    # confusion (row = label, column = prediction):
    #   [[3, 2, 0],
    #    [1, 1, 0],
    #    [0, 0, 0]]
    # IoU_0 = 3 / (3 + FP 1 + FN 2) = 1/2; IoU_1 = 1 / (1 + FP 2 + FN 1) = 1/4;
    # class 2: union 0 -> NaN, left out of the mean: mIoU = (1/2 + 1/4) / 2 = 0.375.
    labels = np.array([[[0, 0, 0, 0], [0, 1, 1, IGNORE]]])
    predicted = np.array([[[0, 0, 0, 1], [1, 1, 0, 2]]])
    probs = np.full((1, 3, 2, 4), 0.1)
    np.put_along_axis(probs, predicted[:, None], 0.8, axis=1)
    meter = CalibrationMeter(3, ignore_index=IGNORE)
    meter.update(probs, labels)
    np.testing.assert_array_equal(meter.confusion, [[3, 2, 0], [1, 1, 0], [0, 0, 0]])
    iou = meter.iou()
    np.testing.assert_allclose(iou[:2], [0.5, 0.25])
    assert math.isnan(iou[2])
    result = meter.compute()
    assert result["miou"] == pytest.approx(0.375)
    assert result["accuracy"] == pytest.approx(4 / 7)


# ---------------------------------------------------------------------------------------------
# ece_released: per-batch ECE without background, weighted by pixel counts
# ---------------------------------------------------------------------------------------------


def test_ece_released_is_count_weighted_mean_of_batch_eces():
    # K = 3, n_bins = 5 (bins (0, .2], (.2, .4], (.4, .6], (.6, .8], (.8, 1]); label 0 is the
    # background, 255 ignored; only foreground pixels enter a batch's ECE.
    # Batch A: fg pixels conf .7 (hit, bin 3) and .6 (miss, bin 2):
    #   ECE_A = 1/2 |1 - .7| + 1/2 |0 - .6| = .15 + .3 = .45, n_A = 2.
    # Batch B: fg pixels .8 hit, .8 hit (bin 3, 0.8 on the edge), .6 hit, .5 miss (bin 2):
    #   bin 3: acc 1, conf .8, gap .2; bin 2: acc 1/2, conf .55, gap .05;
    #   ECE_B = 2/4 * .2 + 2/4 * .05 = .125, n_B = 4.
    # ece_released = (2 * .45 + 4 * .125) / 6 = 1.4 / 6.
    a_probs = np.array([[0.9, 0.05, 0.05], [0.1, 0.7, 0.2], [0.3, 0.6, 0.1], [0.2, 0.3, 0.5]])
    a_labels = np.array([0, 1, 2, IGNORE])
    b_probs = np.array(
        [
            [0.1, 0.8, 0.1],
            [0.1, 0.8, 0.1],
            [0.2, 0.2, 0.6],
            [0.7, 0.2, 0.1],
            [0.3, 0.6, 0.1],
            [0.5, 0.4, 0.1],
        ]
    )
    b_labels = np.array([1, 1, 2, 0, 0, 2])

    def as_image(probs, labels):  # (1, K, 1, W) and (1, 1, W)
        return probs.T[None, :, None, :], labels[None, None, :]

    meter = CalibrationMeter(3, n_bins=5, ignore_index=IGNORE, background=0)
    meter.update(*as_image(a_probs, a_labels))
    meter.update(*as_image(b_probs, b_labels))
    ece_a = ece(a_probs[1:3], a_labels[1:3], n_bins=5)
    ece_b = ece(b_probs[[0, 1, 2, 5]], b_labels[[0, 1, 2, 5]], n_bins=5)
    assert ece_a == pytest.approx(0.45)
    assert ece_b == pytest.approx(0.125)
    result = meter.compute()
    assert result["ece_released"] == pytest.approx((2 * ece_a + 4 * ece_b) / 6, abs=1e-12)
    assert result["ece_released"] == pytest.approx(1.4 / 6)
    assert result["n_released"] == 6
    # the whole-set ECE keeps the background and pools the batches: another number
    all_probs = np.concatenate([a_probs[:3], b_probs])
    all_labels = np.concatenate([a_labels[:3], b_labels])
    assert result["ece"] == pytest.approx(ece(all_probs, all_labels, n_bins=5), abs=1e-12)
    assert abs(result["ece"] - result["ece_released"]) > 0.01


# ---------------------------------------------------------------------------------------------
# The aece sample, merge, state
# ---------------------------------------------------------------------------------------------


def test_aece_sample_is_capped_seeded_and_close():
    rng = np.random.default_rng(2)
    p, y = _segmentation_batch(rng, 4, 6, 50, 50, np.float32, ignored=0.05)
    p_valid, y_valid = _valid_pixels(p, y)
    results = []
    for seed in (0, 0, 1):
        meter = CalibrationMeter(6, ignore_index=IGNORE, aece_samples=4000, seed=seed)
        meter.update(p[:2], y[:2])
        meter.update(p[2:], y[2:])
        results.append(meter.compute())
    assert results[0]["n_aece"] == 4000 < results[0]["n"] == len(y_valid)
    assert results[0]["aece"] == results[1]["aece"]  # same seed, same sample
    assert results[0]["aece"] != results[2]["aece"]
    exact = adaptive_ece(p_valid, y_valid)
    assert all(abs(r["aece"] - exact) < 0.03 for r in results)  # 4000 of 9500 pixels
    assert results[0]["ece"] == pytest.approx(ece(p_valid, y_valid), abs=1e-9)  # not sampled


def test_state_size_does_not_grow_with_pixels():
    rng = np.random.default_rng(3)
    p, y = _segmentation_batch(rng, 2, 21, 64, 64, np.float32)
    p, y = torch.from_numpy(p), torch.from_numpy(y)
    meter = CalibrationMeter(21, ignore_index=IGNORE, aece_samples=1000)
    meter.update(p, y)
    after_one = _total_numel(meter)
    for _ in range(9):
        meter.update(p, y)
    assert _total_numel(meter) == after_one
    assert meter.compute()["n_aece"] == 1000
    # K x M sums, K x K confusion and the sample of 1000: nothing scales with the 8192 pixels
    assert after_one < 21 * 15 * 3 + 21 * 21 + 4 * 1000 + 200 + 10_000


def test_merge_equals_one_meter_and_state_dict_round_trip():
    rng = np.random.default_rng(4)
    batches = [_segmentation_batch(rng, 2, 4, 9, 11, np.float64) for _ in range(4)]
    whole = CalibrationMeter(4, ignore_index=IGNORE)
    first = CalibrationMeter(4, ignore_index=IGNORE, seed=1)
    second = CalibrationMeter(4, ignore_index=IGNORE, seed=2)
    for i, (p, y) in enumerate(batches):
        whole.update(p, y)
        (first if i < 2 else second).update(p, y)
    merged = first.merge(second).compute()
    for key, value in whole.compute().items():
        if key != "ece_released":  # per batch: same batches, same value
            assert merged[key] == pytest.approx(value, abs=1e-12, nan_ok=True), key
    assert merged["ece_released"] == pytest.approx(whole.compute()["ece_released"], abs=1e-12)
    restored = CalibrationMeter(4, ignore_index=IGNORE)
    restored.load_state_dict(whole.state_dict())
    assert restored.compute() == pytest.approx(whole.compute())
    whole.reset()
    assert whole.compute()["n"] == 0
    assert math.isnan(whole.compute()["ece"])
    with pytest.raises(ValueError, match="n_bins"):
        CalibrationMeter(4, n_bins=10, ignore_index=IGNORE).merge(first)


def test_all_pixels_ignored_gives_nan():
    meter = CalibrationMeter(3, ignore_index=IGNORE)
    meter.update(np.full((1, 3, 2, 2), 1 / 3), np.full((1, 2, 2), IGNORE))
    result = meter.compute()
    assert result["n"] == 0
    assert math.isnan(result["ece"])
    assert math.isnan(result["miou"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_equals_cpu():
    rng = np.random.default_rng(5)
    p, y = _segmentation_batch(rng, 2, 21, 40, 40, np.float32)
    cpu, gpu = CalibrationMeter(21, ignore_index=IGNORE), CalibrationMeter(21, ignore_index=IGNORE)
    cpu.update(torch.from_numpy(p), torch.from_numpy(y))
    gpu.update(torch.from_numpy(p).cuda(), torch.from_numpy(y).cuda())
    assert gpu.device.type == "cuda"
    assert gpu.compute() == pytest.approx(cpu.compute(), abs=1e-9)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_input_errors_leave_state_unchanged():
    meter = CalibrationMeter(3, ignore_index=IGNORE)
    good = np.full((2, 3, 2, 2), 1 / 3)
    labels = np.zeros((2, 2, 2), dtype=np.int64)
    meter.update(good, labels)
    before = meter.compute()
    bad_labels = labels.copy()
    bad_labels[1, 1, 1] = 3
    cases = [
        ((np.full((2, 4, 2, 2), 0.25), labels), "K=3"),
        ((good, bad_labels), r"labels.*\[0, 3\)"),
        ((good, np.full((2, 2, 2), -1)), "labels"),
        ((good, np.zeros((2, 2, 3), dtype=np.int64)), "shape"),
        ((good, labels.astype(np.float32)), "integer"),
        ((np.full((2, 3, 2, 2), 2.0), labels), "not logits"),
        ((np.full((2, 3, 2, 2), 0.5), labels), "sum to 1"),
        ((np.full((3,), 1.0), np.zeros(3, dtype=np.int64)), "shape"),
    ]
    for (probs, y), match in cases:
        with pytest.raises(ValueError, match=match) as info:
            meter.update(probs, y)
        assert "\n" not in str(info.value)
    nan_probs = good.copy()
    nan_probs[0, :, 0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        meter.update(nan_probs, labels)
    assert meter.compute() == before
    # ignored pixels may hold anything
    junk = good.copy()
    junk[0, :, 0, 0] = 7.0
    ignored = labels.copy()
    ignored[0, 0, 0] = IGNORE
    meter.update(junk, ignored)
    assert meter.compute()["n"] == before["n"] + 7


def test_constructor_errors():
    with pytest.raises(ValueError, match="num_classes"):
        CalibrationMeter(0)
    with pytest.raises(ValueError, match="n_bins"):
        CalibrationMeter(3, n_bins=0)
    with pytest.raises(ValueError, match="aece_samples"):
        CalibrationMeter(3, aece_samples=0)
    with pytest.raises(ValueError, match="seed"):
        CalibrationMeter(3, seed=-1)
    with pytest.raises(TypeError, match="ignore_index"):
        CalibrationMeter(3, ignore_index=2.5)
    with pytest.raises(TypeError, match="probs"):
        CalibrationMeter(3).update(np.zeros((2, 3), dtype=np.int64), np.zeros(2, dtype=np.int64))


def test_compute_before_any_update():
    result = CalibrationMeter(3).compute()
    assert list(result) == list(CalibrationMeter.KEYS)
    assert result["n"] == result["n_aece"] == result["n_released"] == 0.0
    assert all(math.isnan(result[key]) for key in ("accuracy", "ece", "nll", "miou"))


@pytest.mark.parametrize("ignore_index", [None, IGNORE])
def test_inputs_are_not_modified(ignore_index):
    probs = torch.softmax(torch.randn(2, 4, 3, 3, dtype=torch.float64), dim=1)
    labels = torch.randint(0, 4, (2, 3, 3))
    labels[0, 0, 0] = 7  # out of range: rejected, and not clamped in the caller's tensor
    probs_before, labels_before = probs.clone(), labels.clone()
    meter = CalibrationMeter(4, ignore_index=ignore_index)
    with pytest.raises(ValueError, match="labels"):
        meter.update(probs, labels)
    assert torch.equal(labels, labels_before)
    labels[0, 0, 0] = 1
    labels_before[0, 0, 0] = 1
    meter.update(probs, labels)
    assert torch.equal(probs, probs_before)
    assert torch.equal(labels, labels_before)


def test_updates_inside_and_outside_inference_mode():
    probs = torch.softmax(torch.randn(2, 3, 4, 4), dim=1)
    labels = torch.randint(0, 3, (2, 4, 4))
    first, second = CalibrationMeter(3), CalibrationMeter(3, seed=1)
    with torch.inference_mode():
        first.update(probs, labels)  # e.g. an evaluation loop under inference_mode
        second.update(probs, labels)
    first.update(probs, labels)
    first.merge(second)
    assert first.compute()["n"] == 3 * 32
