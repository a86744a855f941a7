"""Released corrupted test sets (``--shift-data``): both layouts, their errors, one real sweep.

The folders are written by the tests in the released layouts: CIFAR-10-C
(``<corruption>.npy`` uint8 (5 N, H, W, 3) with severities 1-5 stacked + ``labels.npy``) and
ImageNet-C (``<corruption>/<severity>/<class>/<image>``).
"""

from __future__ import annotations

import math
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from formats import write_cifar10
from mlflow.tracking import MlflowClient
from PIL import Image

from raysearch.cli.commands import main
from raysearch.metrics.shift import (
    CLEAN,
    DEFAULT_CORRUPTIONS,
    HELD_OUT_CORRUPTIONS,
    SEVERITIES,
    LazyImages,
    ShiftSet,
    evaluate_shift,
    load_released_shift_set,
)
from raysearch.tune.settings import SweepSettings

LAYOUTS = "expected CIFAR-10-C (<corruption>.npy + labels.npy) or ImageNet-C"


def clean_images(n: int, size: int = 32, seed: int = 0) -> np.ndarray:
    """uint8 (n, size, size, 3), pixels in [1, 255] (never all zero), distinct images."""
    return np.random.default_rng(seed).integers(1, 256, (n, size, size, 3), dtype=np.uint8)


def marked(images: np.ndarray, j: int, severity: int) -> np.ndarray:
    """A stand-in corruption whose pixels tell the corruption ``j`` and the severity apart."""
    return ((images.astype(np.int64) + 7 * j + severity) % 256).astype(np.uint8)


def write_cifar_c(folder: Path, blocks: dict[str, list[np.ndarray]], labels: np.ndarray) -> Path:
    """``<name>.npy`` = the 5 severity blocks stacked, ``labels.npy`` = labels repeated 5 times."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "labels.npy", np.tile(labels, 5).astype(np.uint8))  # uint8 as released
    for name, per_severity in blocks.items():
        np.save(folder / f"{name}.npy", np.concatenate(per_severity))
    return folder


def write_imagenet_c(folder: Path, corruptions: list[str], files: dict[str, list[np.ndarray]],
                     severities=SEVERITIES, shift=0) -> Path:
    """``<c>/<s>/<class>/img<i>.png`` (PNG: lossless, so pixels compare exactly)."""
    for j, corruption in enumerate(corruptions):
        for severity in severities:
            for cls, images in files.items():
                target = folder / corruption / str(severity) / cls
                target.mkdir(parents=True)
                for i, image in enumerate(images):
                    pixels = marked(image[None], j + shift, severity)[0]
                    Image.fromarray(pixels).save(target / f"img{i}.png")
    return folder


@pytest.fixture
def cifar_c(tmp_path):
    """3 corruptions x 5 severities x 8 images (4 classes x 2), 32x32x3."""
    images = clean_images(8)
    labels = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    names = ["fog", "snow", "blur"]
    blocks = {n: [marked(images, j, s) for s in SEVERITIES] for j, n in enumerate(names)}
    return write_cifar_c(tmp_path / "CIFAR-10-C", blocks, labels), images, labels, names


# --------------------------------------------------------------------------------------------
# CIFAR-10-C layout
# --------------------------------------------------------------------------------------------


def test_cifar_c_layout_reads_every_severity_block(cifar_c):
    folder, images, labels, names = cifar_c
    shift_set = load_released_shift_set(folder, images, labels, num_classes=4)
    # the clean test set first, then the corruptions sorted by name, severities 1-5
    expected_keys = [CLEAN] + [(n, s) for n in sorted(names) for s in SEVERITIES]
    assert list(shift_set.images) == expected_keys
    assert shift_set.corruptions == ("blur", "fog", "snow")
    assert shift_set.severities == SEVERITIES
    np.testing.assert_array_equal(shift_set.images[CLEAN], images)
    np.testing.assert_array_equal(shift_set.labels, labels)
    np.testing.assert_array_equal(shift_set.index, np.arange(8))
    for j, name in enumerate(names):
        for severity in SEVERITIES:
            entry = shift_set.images[(name, severity)]
            assert isinstance(entry, LazyImages)  # read on demand, not held
            assert entry.shape == (8, 32, 32, 3)
            # rows [(s - 1) N, s N) of <name>.npy
            np.testing.assert_array_equal(shift_set.read((name, severity)),
                                          marked(images, j, severity))


def test_cifar_c_subsample_reads_only_its_rows(cifar_c):
    folder, images, labels, names = cifar_c
    shift_set = load_released_shift_set(folder, images, labels, num_classes=4, max_samples=4,
                                        seed=3)
    # 4 of 8 images over 4 classes of 2: one image per class (stratified)
    assert np.bincount(shift_set.labels, minlength=4).tolist() == [1, 1, 1, 1]
    np.testing.assert_array_equal(shift_set.labels, labels[shift_set.index])
    np.testing.assert_array_equal(shift_set.images[CLEAN], images[shift_set.index])
    np.testing.assert_array_equal(shift_set.read(("snow", 4)),
                                  marked(images[shift_set.index], 1, 4))
    # the entries hold row numbers, not pixels: the set ships small to every trial
    assert len(pickle.dumps(shift_set)) < 2 * shift_set.images[CLEAN].nbytes


def test_cifar_c_save_and_load_materialises_the_entries(cifar_c, tmp_path):
    folder, images, labels, _ = cifar_c
    shift_set = load_released_shift_set(folder, images, labels, num_classes=4, max_samples=4)
    shift_set.save(tmp_path / "set.npz")
    loaded = ShiftSet.load(tmp_path / "set.npz")
    assert list(loaded.images) == list(shift_set.images)
    np.testing.assert_array_equal(loaded.images[("blur", 5)], shift_set.read(("blur", 5)))
    np.testing.assert_array_equal(loaded.index, shift_set.index)


def _fixed_model(images, labels):
    """A fixed 4-class model: 0.7 on the true class of a test image (0.1 elsewhere); a black
    image -> 0.4 on class 0 (0.2 elsewhere). Returns its ``predict_logits``."""
    label_of = {image.tobytes(): int(y) for image, y in zip(images, labels, strict=True)}

    def predict_logits(batch: np.ndarray) -> np.ndarray:
        probs = np.full((len(batch), 4), 0.1)
        for i, image in enumerate(batch):
            if not image.any():
                probs[i] = [0.4, 0.2, 0.2, 0.2]
            else:
                probs[i, label_of[image.tobytes()]] = 0.7
        return np.log(probs)

    return predict_logits


def test_evaluate_shift_on_a_released_set(tmp_path):
    """Hand-derived metrics per (corruption, severity) and the means per severity.

    A fixed "model": on a test image it puts 0.7 on the true class and 0.1 on the 3 others; on
    an all-black image 0.4 on class 0 and 0.2 on the others. 8 images, 2 per class.
    - clean (and "same", the clean images at every severity): accuracy 1, ECE |0.7 - 1| = 0.3,
      NLL -ln 0.7 = 0.356675.
    - "dark" (black at every severity): predicts class 0, right for 2 of 8: accuracy 0.25;
      one confidence 0.4, so ECE |0.4 - 0.25| = 0.15; NLL (2 (-ln 0.4) + 6 (-ln 0.2)) / 8
      = (1.832581 + 9.656627) / 8 = 1.436151.
    - "fade": clean at severities 1-2, black at 3-5.
    Mean accuracy at severity 1: (0.25 + 1 + 1) / 3 = 0.75; at severity 5: (0.25 + 0.25 + 1) / 3
    = 0.5 (the severity blocks are read in order).
    """
    images = clean_images(8)
    labels = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    black = np.zeros_like(images)
    folder = write_cifar_c(tmp_path / "c", {
        "same": [images] * 5,
        "dark": [black] * 5,
        "fade": [images, images, black, black, black],
    }, labels)
    predict_logits = _fixed_model(images, labels)
    shift_set = load_released_shift_set(folder, images, labels, num_classes=4)
    metrics = evaluate_shift(predict_logits, shift_set).as_metrics()
    # 16 rows x 3 metrics + 6 severities (0-5) x 3 means
    assert len(metrics) == 16 * 3 + 6 * 3
    clean_nll, dark_nll = -math.log(0.7), (2 * -math.log(0.4) + 6 * -math.log(0.2)) / 8
    assert metrics["shift_clean_0_accuracy"] == 1.0
    assert metrics["shift_clean_0_ece"] == pytest.approx(0.3, abs=1e-6)
    assert metrics["shift_clean_0_nll"] == pytest.approx(clean_nll, abs=1e-6)
    for severity in SEVERITIES:
        assert metrics[f"shift_same_{severity}_accuracy"] == 1.0
        assert metrics[f"shift_dark_{severity}_accuracy"] == 0.25
        assert metrics[f"shift_dark_{severity}_ece"] == pytest.approx(0.15, abs=1e-6)
        assert metrics[f"shift_dark_{severity}_nll"] == pytest.approx(dark_nll, abs=1e-6)
    assert metrics["shift_fade_2_accuracy"] == 1.0
    assert metrics["shift_fade_3_accuracy"] == 0.25
    assert metrics["shift_mean_1_accuracy"] == pytest.approx(0.75)
    assert metrics["shift_mean_5_accuracy"] == pytest.approx(0.5)
    assert metrics["shift_mean_5_ece"] == pytest.approx((0.15 + 0.15 + 0.3) / 3, abs=1e-6)


def test_the_released_19_corruptions_average_over_the_benchmarks_15(tmp_path):
    """The released folders hold 15 + 4 corruptions; the means are over the 15 (the papers').

    The 15 benchmark corruptions are the clean images (accuracy 1, ECE 0.3) and the four extra
    ones black images (accuracy 0.25, ECE 0.15): the means stay those of the 15, and the extras
    have their own rows.
    """
    images = clean_images(8)
    labels = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    black = np.zeros_like(images)
    blocks = {name: [images] * 5 for name in DEFAULT_CORRUPTIONS}
    blocks |= {name: [black] * 5 for name in HELD_OUT_CORRUPTIONS}
    folder = write_cifar_c(tmp_path / "CIFAR-10-C", blocks, labels)
    shift_set = load_released_shift_set(folder, images, labels, num_classes=4)
    assert len(shift_set.corruptions) == 19
    assert shift_set.held_out == ("gaussian_blur", "saturate", "spatter", "speckle_noise")
    assert shift_set.benchmark == tuple(sorted(DEFAULT_CORRUPTIONS))
    report = evaluate_shift(_fixed_model(images, labels), shift_set)
    metrics = report.as_metrics()
    assert len(metrics) == (1 + 19 * 5) * 3 + 6 * 3  # every row, the means of the 15
    for severity in SEVERITIES:
        assert metrics[f"shift_mean_{severity}_accuracy"] == 1.0
        assert metrics[f"shift_mean_{severity}_ece"] == pytest.approx(0.3, abs=1e-6)
        for name in HELD_OUT_CORRUPTIONS:  # reported apart
            assert metrics[f"shift_{name}_{severity}_accuracy"] == 0.25
    assert report.summary().splitlines()[-1] == (
        "held out of the means: gaussian_blur, saturate, spatter, speckle_noise")
    frame = report.to_frame()
    assert len(frame) == 1 + 19 * 5
    # a saved set keeps which corruptions are held out
    shift_set.save(tmp_path / "set.npz")
    assert ShiftSet.load(tmp_path / "set.npz").held_out == shift_set.held_out


def test_imagenet_c_extras_are_held_out_too(tmp_path):
    images = clean_images(4, size=8)
    labels = np.array([0, 1, 0, 1])
    files = {"a": [images[0], images[2]], "b": [images[1], images[3]]}
    folder = write_imagenet_c(tmp_path / "ImageNet-C", ["fog", "spatter", "snow"], files,
                              severities=(1,))
    shift_set = load_released_shift_set(folder, images, labels, num_classes=2,
                                        class_names=["a", "b"])
    assert shift_set.corruptions == ("fog", "snow", "spatter")
    assert shift_set.held_out == ("spatter",)
    assert shift_set.benchmark == ("fog", "snow")


def test_a_folder_of_other_corruptions_holds_none_out(cifar_c):
    folder, images, labels, _ = cifar_c  # blur, fog, snow
    assert load_released_shift_set(folder, images, labels, num_classes=4).held_out == ()


def test_held_out_names_a_corruption_of_the_set():
    images = clean_images(2)
    with pytest.raises(ValueError, match="`held_out` names 'spatter', which has no entries; "
                                         "the corruptions are fog"):
        ShiftSet(images={CLEAN: images, ("fog", 1): images}, labels=[0, 1], index=[0, 1],
                 held_out=("spatter",))


# --------------------------------------------------------------------------------------------
# ImageNet-C layout
# --------------------------------------------------------------------------------------------


def test_imagenet_c_layout_maps_folders_by_the_dataset_class_names(tmp_path):
    # the test split, unsorted: labels 2, 0, 1, 0, 2, 1 (2 images per class)
    images = clean_images(6, size=8)
    labels = np.array([2, 0, 1, 0, 2, 1])
    class_names = ["cat", "ant", "bee"]  # not sorted: folder "cat" is class 0
    files = {name: [images[i] for i in np.flatnonzero(labels == k)]
             for k, name in enumerate(class_names)}
    folder = write_imagenet_c(tmp_path / "Tiny-C", ["fog", "snow", "blur"], files)
    shift_set = load_released_shift_set(folder, images, labels, num_classes=3,
                                        class_names=class_names)
    assert list(shift_set.images)[:3] == [CLEAN, ("blur", 1), ("blur", 2)]
    assert len(shift_set.images) == 1 + 3 * 5
    # rows in (class, file name) order; the clean rows are the test split sorted stably by
    # label: images 1, 3 (class 0), 2, 5 (class 1), 0, 4 (class 2)
    np.testing.assert_array_equal(shift_set.index, [1, 3, 2, 5, 0, 4])
    np.testing.assert_array_equal(shift_set.labels, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(shift_set.images[CLEAN], images[[1, 3, 2, 5, 0, 4]])
    # cat/img0, cat/img1, ant/img0, ...: "snow" is corruption 1 of the written list
    np.testing.assert_array_equal(shift_set.read(("snow", 2)),
                                  marked(images[[1, 3, 2, 5, 0, 4]], 1, 2))


def test_imagenet_c_layout_uses_sorted_folders_when_they_are_not_class_names(tmp_path):
    # Tiny-ImageNet's class_names are words, its folders wnids: sorted wnids = class order
    images = clean_images(4, size=8)
    labels = np.array([1, 0, 1, 0])
    files = {"n02": [images[0], images[2]], "n01": [images[1], images[3]]}
    folder = write_imagenet_c(tmp_path / "c", ["fog"], files, severities=(1, 3))
    shift_set = load_released_shift_set(folder, images, labels, num_classes=2,
                                        class_names=["goldfish", "toad"], max_samples=2)
    assert list(shift_set.images) == [CLEAN, ("fog", 1), ("fog", 3)]
    assert shift_set.labels.tolist() == [0, 1]  # n01 -> 0, n02 -> 1, one image each
    np.testing.assert_array_equal(shift_set.labels, labels[shift_set.index])
    read = shift_set.read(("fog", 3))
    assert read.shape == (2, 8, 8, 3)
    # the chosen class-0 image comes from n01/ (images 1 or 3), the class-1 one from n02/
    candidates = {0: [images[1], images[3]], 1: [images[0], images[2]]}
    for row, label in enumerate(shift_set.labels):
        assert any(np.array_equal(read[row], marked(c[None], 0, 3)[0])
                   for c in candidates[int(label)])


# --------------------------------------------------------------------------------------------
# Errors: one line naming what is wrong
# --------------------------------------------------------------------------------------------


def _cifar_error(tmp_path, blocks, labels_npy, images=None, labels=None, num_classes=4):
    images = clean_images(8) if images is None else images
    labels = np.array([0, 1, 2, 3] * 2) if labels is None else labels
    folder = tmp_path / "c"
    folder.mkdir()
    if labels_npy is not None:
        np.save(folder / "labels.npy", labels_npy)
    for name, array in blocks.items():
        np.save(folder / f"{name}.npy", array)
    with pytest.raises(ValueError, match=r"^\S+: |^\S+ ") as info:  # a path first
        load_released_shift_set(folder, images, labels, num_classes=num_classes)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_an_empty_folder_names_both_layouts(tmp_path):
    message = _cifar_error(tmp_path, {}, None)
    assert message == (f"{tmp_path / 'c'}: no labels.npy and no <corruption>/<severity>/ "
                       "folders; expected CIFAR-10-C (<corruption>.npy + labels.npy) or "
                       "ImageNet-C (<corruption>/<severity>/<class>/*.JPEG) layout")


def test_npy_files_without_labels(tmp_path):
    message = _cifar_error(tmp_path, {"fog": np.zeros((40, 32, 32, 3), np.uint8)}, None)
    assert "no labels.npy (1 .npy file(s), e.g. fog.npy)" in message
    assert LAYOUTS in message


def test_a_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="nowhere: not a folder; expected CIFAR-10-C"):
        load_released_shift_set(tmp_path / "nowhere", clean_images(2), [0, 1], num_classes=2)


def test_labels_for_another_test_split_size(tmp_path):
    message = _cifar_error(tmp_path, {}, np.tile(np.arange(7) % 4, 5))
    assert "labels.npy holds 5 x 7 labels (severities 1-5 stacked) but the test split has 8" \
        in message


def test_labels_not_five_severity_blocks(tmp_path):
    message = _cifar_error(tmp_path, {}, np.zeros(41, np.int64))
    assert "labels.npy must hold (5 N,) integer labels" in message
    assert "(41,)" in message


def test_labels_that_differ_from_the_test_split(tmp_path):
    released = np.tile([0, 1, 2, 3] * 2, 5)
    released[8 + 5] = 3  # severity 2, image 5 (test label 1): row (2 - 1) * 8 + 5 = 13
    message = _cifar_error(tmp_path, {}, released)
    assert "labels.npy row 13 (severity 2, image 5) has label 3, image 5 of the test split 1" \
        in message


def test_labels_outside_the_dataset_classes(tmp_path):
    released = np.tile([0, 1, 2, 3] * 2, 5)
    released[0] = 10
    message = _cifar_error(tmp_path, {}, released)
    assert "holds labels in [0, 10] but the dataset has 4 classes ([0, 3])" in message


def test_images_of_another_size(tmp_path):
    labels = np.tile([0, 1, 2, 3] * 2, 5)
    message = _cifar_error(tmp_path, {"fog": np.zeros((40, 28, 28, 3), np.uint8)}, labels)
    assert "fog.npy holds 28x28x3 images (H x W x C), the dataset's test images are 32x32x3" \
        in message


def test_images_not_uint8(tmp_path):
    labels = np.tile([0, 1, 2, 3] * 2, 5)
    message = _cifar_error(tmp_path, {"fog": np.zeros((40, 32, 32, 3), np.float32)}, labels)
    assert "fog.npy must hold uint8 (5 N, H, W, C) images, got float32" in message


def test_a_corruption_named_like_the_means(tmp_path):
    labels = np.tile([0, 1, 2, 3] * 2, 5)
    message = _cifar_error(tmp_path, {"mean": np.zeros((40, 32, 32, 3), np.uint8)}, labels)
    assert "the corruption name 'mean' cannot be part of a metric name" in message


def _imagenet_error(folder, images, labels, num_classes, class_names=None) -> str:
    with pytest.raises(ValueError, match=f"^{re.escape(str(folder))}") as info:
        load_released_shift_set(folder, images, labels, num_classes=num_classes,
                                class_names=class_names)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_imagenet_c_errors(tmp_path):
    images = clean_images(4, size=8)
    labels = np.array([0, 1, 0, 1])
    files = {"a": [images[0], images[2]], "b": [images[1], images[3]]}

    bad_severity = write_imagenet_c(tmp_path / "s", ["fog"], files, severities=(1, 6))
    assert "fog/6/ is not a severity folder (1-5)" in _imagenet_error(bad_severity, images,
                                                                      labels, 2)

    three = write_imagenet_c(tmp_path / "k", ["fog"], {**files, "c": [images[0]]},
                             severities=(1,))
    assert "has 3 class folders but the dataset has 2 classes" in _imagenet_error(
        three, images, labels, 2)

    mixed = write_imagenet_c(tmp_path / "m", ["fog"], files, severities=(1,))
    assert "mixes class folders named as the dataset's classes (e.g. 'a') and others (e.g. 'b')" \
        in _imagenet_error(mixed, images, labels, 2, class_names=["a", "z"])

    counts = write_imagenet_c(tmp_path / "n", ["fog"], {"a": [images[0]], "b": files["b"]},
                              severities=(1,))
    assert "fog/1/ holds 1 images of class 0 (a), the test split 2" in _imagenet_error(
        counts, images, labels, 2, class_names=["a", "b"])

    other = write_imagenet_c(tmp_path / "o", ["fog"], files, severities=(1, 2))
    (other / "fog" / "2" / "b").rename(other / "fog" / "2" / "x")
    assert "fog/2/ has other class folders than" in _imagenet_error(other, images, labels, 2)

    large = {k: [np.zeros((16, 16, 3), np.uint8) + 9] * 2 for k in files}
    size = write_imagenet_c(tmp_path / "z", ["fog"], large, severities=(1,))
    message = _imagenet_error(size, images, labels, 2)
    assert "img0.png is 16x16x3 (H x W x C), the dataset's test images are 8x8x3" in message


def test_shift_data_and_shift_eval_exclude_each_other():
    with pytest.raises(ValueError, match="--shift-data and --shift-eval are mutually exclusive"):
        SweepSettings(shift_eval=True, shift_data="/x")
    with pytest.raises(ValueError, match="`shift_samples` must be >= 1, got 0"):
        SweepSettings(shift_data="/x", shift_samples=0)


def test_cli_refuses_both_shift_options(tmp_path):
    result = CliRunner().invoke(main, ["sweep", "ls", "--shift-eval", "--shift-data",
                                       str(tmp_path), "--tracking-uri",
                                       f"sqlite:///{tmp_path / 'm.db'}"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: --shift-data and --shift-eval are mutually exclusive: --shift-eval corrupts "
        "the test set itself, --shift-data reads a released corrupted test set; give one"]


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    *_, test_x, test_y, _ = write_cifar10(root, per_batch=20, n_test=30)
    return root, test_x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), np.asarray(test_y)


def test_cli_wrong_layout_is_one_line_before_anything_runs(tmp_path, cifar_dir):
    root, _, _ = cifar_dir
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(main, ["sweep", "ls", "--dataset", "cifar10", "--data-dir",
                                       str(root), "--model", "resnet20", "--shift-data",
                                       str(empty), "--tracking-uri", uri])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: --shift-data {empty}: no labels.npy and no <corruption>/<severity>/ folders; "
        "expected CIFAR-10-C (<corruption>.npy + labels.npy) or ImageNet-C "
        "(<corruption>/<severity>/<class>/*.JPEG) layout"]
    client = MlflowClient(uri)  # nothing was recorded: the check runs before the parent run
    exp = client.get_experiment_by_name("raysearch")
    assert exp is None or not client.search_runs([exp.experiment_id])


# --------------------------------------------------------------------------------------------
# End to end: one real sweep (local Ray, local MLflow) with --shift-data
# --------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_sweep_with_released_shift_data(ray_session, cifar_dir, tmp_path):
    root, test_images, test_labels = cifar_dir
    rng = np.random.default_rng(1)
    noise = [rng.integers(0, 256, test_images.shape, dtype=np.uint8) for _ in SEVERITIES]
    folder = write_cifar_c(tmp_path / "CIFAR-10-C", {
        "same": [test_images] * 5,  # the clean test images at every severity
        "dark": [np.zeros_like(test_images)] * 5,
        "noise": noise,
    }, test_labels)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    result = CliRunner().invoke(main, [
        "sweep", "ls", "--dataset", "cifar10", "--data-dir", str(root), "--model", "resnet20",
        "--num-samples", "1", "--epochs", "1", "--name", "e2e-shift-data", "--tracking-uri", uri,
        "--storage-path", str(tmp_path / "ray"), "--shift-data", str(folder)],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (f"shift evaluation: 30 test images x 3 corruptions x 5 severities of {folder}"
            in result.output)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id])
    (child,) = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    metrics = child.data.metrics
    shift = {k: v for k, v in metrics.items() if k.startswith("shift_")}
    # rows: clean + 3 corruptions x 5 severities; per row accuracy/ece/nll before and after the
    # default post-hoc calibrator (ts); means per severity 0-5 of the same 6
    rows = [("clean", 0)] + [(c, s) for c in ("dark", "noise", "same") for s in SEVERITIES]
    names = [m + t for m in ("accuracy", "ece", "nll") for t in ("", "_ts")]
    expected = {f"shift_{c}_{s}_{m}" for c, s in rows for m in names}
    expected |= {f"shift_mean_{s}_{m}" for s in range(6) for m in names}
    assert len(expected) == (3 * 5 + 1) * 6 + 6 * 6
    assert set(shift) == expected
    for key, value in shift.items():
        if "_accuracy" in key or "_ece" in key:
            assert 0 <= value <= 1, key
    # the clean row is the whole clean test set (no --shift-samples): the test metrics
    assert shift["shift_clean_0_accuracy"] == metrics["test_accuracy"]
    for severity in SEVERITIES:
        for metric in names:
            # the same images through the same normalisation: the same numbers, exactly
            assert shift[f"shift_same_{severity}_{metric}"] == shift[f"shift_clean_0_{metric}"]
        mean = np.mean([shift[f"shift_{c}_{severity}_accuracy"] for c in ("dark", "noise",
                                                                          "same")])
        assert shift[f"shift_mean_{severity}_accuracy"] == pytest.approx(mean)
    artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
    assert {"shift.png", "shift.csv"} <= artifacts
