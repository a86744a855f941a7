"""Dataset-shift evaluation: corruptions (real imagecorruptions), shift sets, reports, the plot."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import imagecorruptions
import numpy as np
import pandas as pd
import pytest

from raysearch.calibration import fit_calibrator
from raysearch.metrics import ece, softmax
from raysearch.metrics.shift import (
    CLEAN,
    DEFAULT_CORRUPTIONS,
    SEVERITIES,
    ShiftReport,
    ShiftSet,
    build_shift_set,
    corrupt_images,
    evaluate_shift,
)
from raysearch.metrics.shift import corruptions as corruptions_module


def smooth_images(n: int, channels: int = 3, size: int = 32, seed: int = 0) -> np.ndarray:
    """uint8 (n, size, size, channels) images: 8x8 random blocks upsampled, plus mild noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(40, 215, size=(n, size // 4, size // 4, channels))
    images = np.repeat(np.repeat(coarse, 4, axis=1), 4, axis=2)
    return np.clip(images + rng.normal(0, 5, images.shape), 0, 255).astype(np.uint8)


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


# --------------------------------------------------------------------------------------------
# corrupt_images
# --------------------------------------------------------------------------------------------


def test_default_corruptions_are_the_library_benchmark_list():
    assert DEFAULT_CORRUPTIONS == tuple(imagecorruptions.get_corruption_names("common"))
    assert len(DEFAULT_CORRUPTIONS) == 15
    assert SEVERITIES == (1, 2, 3, 4, 5)


@pytest.mark.parametrize("corruption", ["gaussian_noise", "impulse_noise", "glass_blur", "snow"])
def test_same_seed_same_output_other_seed_differs(corruption):
    images = smooth_images(3)
    first = corrupt_images(images, corruption, 3, seed=7)
    again = corrupt_images(images, corruption, 3, seed=7)
    other = corrupt_images(images, corruption, 3, seed=8)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize("corruption", DEFAULT_CORRUPTIONS)
def test_shape_and_dtype_kept_for_rgb_and_grey(corruption):
    rgb = smooth_images(2, channels=3)
    grey = smooth_images(2, channels=1)
    for images in (rgb, grey):
        out = corrupt_images(images, corruption, 2, seed=0)
        assert out.dtype == np.uint8
        assert out.shape == images.shape
    # input untouched
    np.testing.assert_array_equal(rgb, smooth_images(2, channels=3))


def test_non_square_images_keep_their_shape():
    images = smooth_images(2, size=48)[:, :40]  # 40 x 48
    for corruption in ("zoom_blur", "frost", "fog", "elastic_transform", "pixelate"):
        assert corrupt_images(images, corruption, 5, seed=0).shape == (2, 40, 48, 3)


@pytest.mark.parametrize("corruption", ["gaussian_noise", "contrast", "frost"])
def test_grey_is_the_rounded_channel_mean_of_the_replicated_image(corruption):
    grey = smooth_images(3, channels=1)
    replicated = np.repeat(grey, 3, axis=3)
    out_grey = corrupt_images(grey, corruption, 4, seed=5)
    out_rgb = corrupt_images(replicated, corruption, 4, seed=5)
    expected = np.rint(out_rgb.astype(np.float64).mean(axis=3, keepdims=True)).astype(np.uint8)
    np.testing.assert_array_equal(out_grey, expected)


@pytest.mark.parametrize("corruption", ["gaussian_noise", "contrast"])
def test_severity_5_changes_images_more_than_severity_1(corruption):
    images = smooth_images(4)
    mild = mean_abs_diff(corrupt_images(images, corruption, 1, seed=0), images)
    strong = mean_abs_diff(corrupt_images(images, corruption, 5, seed=0), images)
    assert 0 < mild < strong


@pytest.mark.parametrize("corruption", ["gaussian_noise", "frost", "impulse_noise"])
def test_matches_the_plain_library_call_with_the_derived_seed(corruption):
    # The wrapper = the library with the global RNG seeded from (seed, corruption, severity).
    images = smooth_images(3)
    global_seed, image_seeds = corruptions_module._rng_seeds(11, corruption, 2, len(images))
    state = np.random.get_state()
    np.random.seed(global_seed)
    keywords = [{"seed": int(s)} if corruption == "impulse_noise" else {} for s in image_seeds]
    expected = np.stack(
        [
            imagecorruptions.corrupt(im, corruption_name=corruption, severity=2, **kw)
            for im, kw in zip(images, keywords, strict=True)
        ]
    )
    np.random.set_state(state)
    np.testing.assert_array_equal(corrupt_images(images, corruption, 2, seed=11), expected)


def test_global_numpy_rng_state_is_restored():
    np.random.seed(123)
    before = np.random.get_state()
    for corruption in ("gaussian_noise", "motion_blur", "frost", "elastic_transform"):
        corrupt_images(smooth_images(2), corruption, 3, seed=1)
    after = np.random.get_state()
    assert before[0] == after[0]
    np.testing.assert_array_equal(before[1], after[1])
    assert before[2:] == after[2:]
    # and the stream continues where it was
    np.random.seed(123)
    expected = np.random.random(3)
    np.random.set_state(after)
    np.testing.assert_array_equal(np.random.random(3), expected)


def test_corrupt_images_errors():
    images = smooth_images(1)
    with pytest.raises(ValueError, match=r"Unknown corruption 'fuzz'; available: gaussian_noise"):
        corrupt_images(images, "fuzz", 1, seed=0)
    for bad in (0, 6):
        with pytest.raises(ValueError, match=rf"`severity` must be in \[1, 5\], got {bad}"):
            corrupt_images(images, "contrast", bad, seed=0)
    with pytest.raises(TypeError, match="`severity` must be an integer"):
        corrupt_images(images, "contrast", 2.0, seed=0)
    with pytest.raises(ValueError, match="`seed` must be >= 0, got -1"):
        corrupt_images(images, "contrast", 1, seed=-1)
    with pytest.raises(ValueError, match=r"'gaussian_noise' needs images of at least 32x32.*8x8"):
        corrupt_images(np.zeros((2, 8, 8, 1), np.uint8), "gaussian_noise", 1, seed=0)
    with pytest.raises(ValueError, match=r"dtype uint8 \(pixels 0-255\), got float32"):
        corrupt_images(images.astype(np.float32), "contrast", 1, seed=0)
    with pytest.raises(ValueError, match=r"\(N, H, W, C\) with C in \{1, 3\}, got \(32, 32, 3\)"):
        corrupt_images(images[0], "contrast", 1, seed=0)


# --------------------------------------------------------------------------------------------
# build_shift_set and ShiftSet
# --------------------------------------------------------------------------------------------


def imbalanced_set() -> tuple[np.ndarray, np.ndarray]:
    labels = np.repeat([0, 1, 2], [60, 30, 10])
    labels = np.random.default_rng(3).permutation(labels)
    return smooth_images(len(labels), seed=1), labels


def test_build_shift_set_is_stratified_and_consistent():
    images, labels = imbalanced_set()
    lines = []
    shift_set = build_shift_set(
        images,
        labels,
        corruptions=("gaussian_noise", "contrast"),
        max_samples=20,
        seed=4,
        progress=lines.append,
    )
    # 20 of 100 in proportion 60:30:10 -> 12, 6, 2
    np.testing.assert_array_equal(np.bincount(shift_set.labels), [12, 6, 2])
    assert shift_set.labels.dtype == np.int64
    assert shift_set.index.dtype == np.int64
    assert np.all(np.diff(shift_set.index) > 0)  # sorted, no repeats
    np.testing.assert_array_equal(shift_set.labels, labels[shift_set.index])
    np.testing.assert_array_equal(shift_set.images[CLEAN], images[shift_set.index])
    keys = list(shift_set.images)
    assert keys[0] == CLEAN
    assert keys[1:] == [(c, s) for c in ("gaussian_noise", "contrast") for s in SEVERITIES]
    for key, array in shift_set.images.items():
        assert array.shape == (20, 32, 32, 3), key
        assert array.dtype == np.uint8, key
    # each entry is corrupt_images of the subsample with the same seed
    np.testing.assert_array_equal(
        shift_set.images[("gaussian_noise", 3)],
        corrupt_images(images[shift_set.index], "gaussian_noise", 3, seed=4),
    )
    assert len(lines) == 2
    assert re.fullmatch(
        r"shift: corrupted 20 images with gaussian_noise at 5 severities "
        r"\(\d+\.\d s\)",
        lines[0],
    )
    assert shift_set.corruptions == ("gaussian_noise", "contrast")
    assert shift_set.severities == SEVERITIES


def test_build_shift_set_seeded_and_keeps_all_when_small():
    images, labels = imbalanced_set()
    kwargs = {"corruptions": ("contrast",), "severities": (1, 5)}
    a = build_shift_set(images, labels, max_samples=10, seed=1, **kwargs)
    b = build_shift_set(images, labels, max_samples=10, seed=1, **kwargs)
    c = build_shift_set(images, labels, max_samples=10, seed=2, **kwargs)
    np.testing.assert_array_equal(a.index, b.index)
    assert not np.array_equal(a.index, c.index)
    for max_samples in (None, 100, 500):
        full = build_shift_set(images, labels, max_samples=max_samples, **kwargs)
        np.testing.assert_array_equal(full.index, np.arange(100))
        assert list(full.images) == [CLEAN, ("contrast", 1), ("contrast", 5)]


def test_build_shift_set_errors():
    images, labels = imbalanced_set()
    with pytest.raises(ValueError, match="Unknown corruption 'blur'"):
        build_shift_set(images, labels, corruptions=("blur",))
    with pytest.raises(ValueError, match="`corruptions` must not repeat"):
        build_shift_set(images, labels, corruptions=("contrast", "contrast"))
    with pytest.raises(ValueError, match="`severity` must be in"):
        build_shift_set(images, labels, corruptions=("contrast",), severities=(0, 1))
    with pytest.raises(ValueError, match="`max_samples` must be >= 1, got 0"):
        build_shift_set(images, labels, corruptions=("contrast",), max_samples=0)
    with pytest.raises(ValueError, match=r"`labels` must have shape \(100,\)"):
        build_shift_set(images, labels[:5], corruptions=("contrast",))
    with pytest.raises(ValueError, match="'contrast' needs images of at least 32x32.*16x16"):
        build_shift_set(images[:, :16, :16], labels, corruptions=("contrast",))


def test_build_shift_set_processes_give_the_same_arrays():
    images, labels = imbalanced_set()
    kwargs = {
        "corruptions": ("gaussian_noise", "contrast"),
        "severities": (2,),
        "seed": 3,
        "max_samples": 12,
    }
    serial = build_shift_set(images, labels, **kwargs)
    lines = []
    parallel = build_shift_set(images, labels, processes=2, progress=lines.append, **kwargs)
    assert list(parallel.images) == list(serial.images)
    for key in serial.images:
        np.testing.assert_array_equal(parallel.images[key], serial.images[key])
    assert len(lines) == 2


def test_shift_set_save_load_round_trip(tmp_path):
    images, labels = imbalanced_set()
    shift_set = build_shift_set(
        images,
        labels,
        corruptions=("gaussian_noise", "pixelate"),
        severities=(1, 4),
        max_samples=9,
        seed=0,
    )
    path = tmp_path / "shift_set"  # no suffix: written as given
    shift_set.save(path)
    assert path.exists()
    with np.load(path, allow_pickle=False) as data:  # plain arrays, no pickle
        assert "labels" in data.files
    loaded = ShiftSet.load(path)
    assert list(loaded.images) == list(shift_set.images)
    for key, array in shift_set.images.items():
        np.testing.assert_array_equal(loaded.images[key], array)
    np.testing.assert_array_equal(loaded.labels, shift_set.labels)
    np.testing.assert_array_equal(loaded.index, shift_set.index)
    assert loaded.labels.dtype == np.int64
    assert loaded.index.dtype == np.int64


def test_shift_set_requires_the_clean_subsample():
    images = smooth_images(2)
    with pytest.raises(ValueError, match="clean subsample"):
        ShiftSet(images={("contrast", 1): images}, labels=np.zeros(2, int), index=np.arange(2))
    with pytest.raises(ValueError, match=r"`labels` must have shape \(2,\)"):
        ShiftSet(images={CLEAN: images}, labels=np.zeros(3, int), index=np.arange(2))


# --------------------------------------------------------------------------------------------
# evaluate_shift and ShiftReport
# --------------------------------------------------------------------------------------------


def lookup_set() -> tuple[ShiftSet, dict[int, int]]:
    """10 clean images whose first red pixel (10 * i) identifies them; labels 0/1 alternating.

    The "model" looks the first pixel up: known pixels give its class with probability 0.9,
    where the lookup is right for 8 images and wrong for images 3 and 7.
    """
    images = smooth_images(10)
    images[:, 0, 0, 0] = 10 * np.arange(10)
    labels = np.arange(10) % 2
    lookup = {10 * i: int(labels[i]) if i not in (3, 7) else 1 - int(labels[i]) for i in range(10)}
    shift_set = build_shift_set(
        images, labels, corruptions=("gaussian_noise", "contrast"), max_samples=None, seed=0
    )
    np.testing.assert_array_equal(shift_set.images[CLEAN], images)
    return shift_set, lookup


def lookup_model(lookup: dict[int, int]):
    calls = []

    def predict_logits(images: np.ndarray) -> np.ndarray:
        calls.append(images)
        probs = np.full((len(images), 2), 0.5)
        for i, pixel in enumerate(images[:, 0, 0, 0]):
            if int(pixel) in lookup:
                probs[i] = [0.1, 0.1]
                probs[i, lookup[int(pixel)]] = 0.9
        return np.log(probs).astype(np.float32)

    return predict_logits, calls


def fitted_ts():
    """TS fitted on synthetic overconfident validation logits (70% right, confidence ~0.98)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=300)
    predicted = np.where(rng.random(300) < 0.7, labels, 1 - labels)
    logits = rng.normal(0, 0.5, size=(300, 2)) + 4.0 * np.eye(2)[predicted]
    cal = fit_calibrator("ts", logits, labels)
    assert cal.temperature > 1.5  # softens the overconfident logits
    return cal


def test_clean_row_by_hand():
    shift_set, lookup = lookup_set()
    predict_logits, calls = lookup_model(lookup)
    report = evaluate_shift(predict_logits, shift_set)
    clean = report.rows[0]
    assert (clean["corruption"], clean["severity"]) == ("clean", 0)
    # 8 of 10 right, every confidence 0.9 (one bin (0.867, 0.933]): ECE = |0.8 - 0.9| = 0.1;
    # NLL = -(8 log 0.9 + 2 log 0.1) / 10
    assert clean["accuracy"] == pytest.approx(0.8)
    assert clean["ece"] == pytest.approx(0.1, abs=1e-6)
    assert clean["nll"] == pytest.approx(-(8 * math.log(0.9) + 2 * math.log(0.1)) / 10, rel=1e-6)
    assert "ece_cal" not in clean
    assert report.calibrator is None
    assert len(report.rows) == 1 + 2 * 5
    assert len(calls) == 11
    for row in report.rows:
        assert 0 <= row["accuracy"] <= 1
        assert 0 <= row["ece"] <= 1


def test_clean_logits_replace_the_clean_forward_pass():
    shift_set, lookup = lookup_set()
    predict_logits, calls = lookup_model(lookup)
    clean_logits = predict_logits(shift_set.images[CLEAN])
    calls.clear()
    with_logits = evaluate_shift(predict_logits, shift_set, clean_logits=clean_logits)
    assert len(calls) == 10  # only the corrupted entries
    assert with_logits.rows == evaluate_shift(lookup_model(lookup)[0], shift_set).rows


def test_calibrated_metrics_and_metric_names():
    shift_set, lookup = lookup_set()
    predict_logits, _ = lookup_model(lookup)
    cal = fitted_ts()
    report = evaluate_shift(predict_logits, shift_set, calibrator=cal)
    assert report.calibrator == "ts"
    row = next(r for r in report.rows if (r["corruption"], r["severity"]) == ("gaussian_noise", 3))
    logits = predict_logits(shift_set.images[("gaussian_noise", 3)])
    assert row["calibrator"] == "ts"
    assert row["ece_cal"] == ece(cal.predict_proba(logits), shift_set.labels)
    assert row["ece"] == ece(softmax(logits), shift_set.labels)

    metrics = report.as_metrics()
    assert metrics["shift_gaussian_noise_3_ece_ts"] == row["ece_cal"]
    assert metrics["shift_gaussian_noise_3_ece"] == row["ece"]
    assert metrics["shift_mean_0_accuracy"] == pytest.approx(0.8)
    assert metrics["shift_clean_0_nll_ts"] == report.rows[0]["nll_cal"]
    contrast_3 = next(r for r in report.rows if (r["corruption"], r["severity"]) == ("contrast", 3))
    mean_3 = (row["ece_cal"] + contrast_3["ece_cal"]) / 2
    assert metrics["shift_mean_3_ece_ts"] == pytest.approx(mean_3)
    for name in ("shift_contrast_5_accuracy_ts", "shift_mean_5_nll", "shift_mean_1_ece_ts"):
        assert name in metrics
    # 11 rows x 6 metrics + 6 severities x 6 means
    assert len(metrics) == 11 * 6 + 6 * 6
    assert all(isinstance(v, float) for v in metrics.values())

    frame = report.to_frame()
    assert list(frame.columns) == [
        "corruption",
        "severity",
        "calibrator",
        "accuracy",
        "ece",
        "nll",
        "accuracy_cal",
        "ece_cal",
        "nll_cal",
    ]
    assert len(frame) == 11

    lines = report.summary().splitlines()
    assert lines[0].split() == ["severity", "accuracy", "(%)", "ECE", "(%)", "ECE", "ts", "(%)"]
    assert len(lines) == 7
    assert lines[1].split()[:4] == ["0", "(clean)", "80.00", "10.00"]


def test_metric_names_without_calibrator():
    shift_set, lookup = lookup_set()
    report = evaluate_shift(lookup_model(lookup)[0], shift_set, calibrator_name=None)
    metrics = report.as_metrics()
    assert "shift_gaussian_noise_3_ece" in metrics
    assert "shift_mean_0_accuracy" in metrics
    assert not any(name.endswith("_ts") for name in metrics)
    assert len(metrics) == 11 * 3 + 6 * 3
    assert len(report.summary().splitlines()[0].split()) == 5  # no calibrated column


def test_evaluate_shift_errors():
    shift_set, lookup = lookup_set()
    predict_logits, _ = lookup_model(lookup)
    with pytest.raises(ValueError, match="`calibrator_name` was given"):
        evaluate_shift(predict_logits, shift_set, calibrator_name="ts")
    with pytest.raises(ValueError, match=r"`clean_logits` must have shape \(10, K\), got \(9, 2\)"):
        evaluate_shift(predict_logits, shift_set, clean_logits=np.zeros((9, 2)))
    with pytest.raises(ValueError, match="predict_logits output"):
        evaluate_shift(lambda images: np.zeros((3, 2)), shift_set)
    cal = fitted_ts()
    with pytest.raises(ValueError, match="`calibrator_name` must be a non-empty name"):
        evaluate_shift(predict_logits, shift_set, calibrator=cal, calibrator_name="t s")


def test_report_frame_from_plain_rows():
    rows = [{"corruption": "clean", "severity": 0, "accuracy": 0.9, "ece": 0.05, "nll": 0.3}]
    frame = ShiftReport(rows=rows).to_frame()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == ["corruption", "severity", "accuracy", "ece", "nll"]


# --------------------------------------------------------------------------------------------
# Plot and module boundaries
# --------------------------------------------------------------------------------------------


def test_shift_plot_writes_a_png(tmp_path):
    import matplotlib

    from raysearch.training.plots import shift_plot

    shift_set, lookup = lookup_set()
    predict_logits, _ = lookup_model(lookup)
    cal = fitted_ts()
    for calibrator in (None, cal):
        frame = evaluate_shift(predict_logits, shift_set, calibrator=calibrator).to_frame()
        path = shift_plot(frame, tmp_path / f"shift_{calibrator is None}.png", title="trial 0")
        assert path.stat().st_size > 1000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.get_backend().lower() == "agg"
    with pytest.raises(ValueError, match="lacks column"):
        shift_plot(frame.drop(columns=["ece"]), tmp_path / "bad.png")


def test_shift_module_imports_no_infrastructure_or_library():
    code = (
        "import sys, raysearch.metrics.shift\n"
        "bad = [m for m in ('ray', 'mlflow', 'optuna', 'matplotlib', 'imagecorruptions')"
        " if m in sys.modules]\nprint(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""
