"""Semantic segmentation end to end: a PASCAL VOC tree written by the test, `fit` of DeepLabV3,
and a 2-trial `raysearch sweep mbls --dataset voc` with real Ray and MLflow that selects on mIoU.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from PIL import Image

from raysearch.cli.commands import main
from raysearch.config import RunConfig
from raysearch.metrics.selection import select_best
from raysearch.training.data.segmentation import voc_palette

CROP = 64
CLASSES_USED = (0, 1, 7, 15)  # background, aeroplane, car, person


def write_voc(root, *, n_train: int = 8, n_val: int = 4, bad_value: int | None = None):
    """VOCdevkit/VOC2012 with JPEGs, palette PNG masks (255 borders) and the split files.

    Each image holds one coloured rectangle of its class on a grey background, so the network
    can learn something in an epoch or two.
    """
    voc = root / "VOCdevkit" / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    stems = [f"2007_{i:06d}" for i in range(n_train + n_val)]
    colours = {1: (220, 40, 40), 7: (40, 220, 40), 15: (40, 40, 220)}
    for i, stem in enumerate(stems):
        w, h = int(rng.integers(48, 80)), int(rng.integers(40, 72))
        cls = CLASSES_USED[1 + i % 3]
        image = np.full((h, w, 3), 128, np.uint8) + rng.integers(0, 20, (h, w, 3), np.uint8)
        mask = np.zeros((h, w), np.uint8)
        top, left = int(rng.integers(2, h // 2)), int(rng.integers(2, w // 2))
        bottom, right = top + h // 3, left + w // 3
        image[top:bottom, left:right] = colours[cls]
        mask[top - 1:bottom + 1, left - 1:right + 1] = 255
        mask[top:bottom, left:right] = cls
        if bad_value is not None and i == 1:
            mask[0, 0] = bad_value
        Image.fromarray(image).save(voc / "JPEGImages" / f"{stem}.jpg", quality=95)
        png = Image.fromarray(mask, mode="P")
        png.putpalette(voc_palette().ravel().tolist())
        png.save(voc / "SegmentationClass" / f"{stem}.png")
    sets = voc / "ImageSets" / "Segmentation"
    (sets / "train.txt").write_text("".join(s + "\n" for s in stems[:n_train]))
    (sets / "val.txt").write_text("".join(s + "\n" for s in stems[n_train:]))
    return root


def test_fit_deeplabv3_on_a_voc_tree(tmp_path):
    from raysearch.training.run import fit

    data_dir = write_voc(tmp_path)
    cfg = RunConfig(loss={"name": "mbls", "params": {"margin": 10.0, "alpha": 0.1}},
                    model={"name": "deeplabv3_resnet50"},
                    data={"name": "voc", "dir": str(data_dir), "params": {"crop_size": CROP},
                          "val_fraction": 0.25},
                    optimizer={"lr": 0.01}, epochs=2, batch_size=4)
    result = fit(cfg)
    m = result.metrics
    assert result.task == "segmentation"
    for split in ("val", "test"):
        for key in ("accuracy", "miou", "ece", "aece", "cece", "mce", "nll", "brier",
                    "ece_released"):
            assert math.isfinite(m[f"{split}_{key}"]), (split, key)
        assert 0.0 <= m[f"{split}_miou"] <= 1.0
        assert 0.0 <= m[f"{split}_ece"] <= 1.0
    assert 0.0 <= m["train_accuracy"] <= 1.0
    assert m["val_ts_temperature"] > 0
    for key in ("ece", "nll", "accuracy"):
        assert math.isfinite(m[f"test_{key}_ts"])
        assert math.isfinite(m[f"val_{key}_ts"])
    # TS does not change the argmax: the accuracy after it is the same
    assert m["test_accuracy_ts"] == pytest.approx(m["test_accuracy"], abs=1e-12)
    dense = result.dense
    assert len(dense["val_iou"]) == len(dense["test_iou"]) == 21
    assert len(dense["class_names"]) == 21
    assert dense["class_names"][15] == "person"
    assert sum(dense["test_bins"].counts) > 0
    assert 1 <= len(dense["images"]) <= 4
    image, truth, pred, conf = dense["images"][0]
    assert image.shape == (3, CROP, CROP)
    assert truth.shape == pred.shape == conf.shape
    # the pixel sample that TS is fitted on holds valid pixels only
    assert len(result.val_labels) > 0
    assert (result.val_labels != 255).all()
    assert result.val_logits.shape == (len(result.val_labels), 21)


def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.integration
def test_voc_sweep_selects_on_miou(ray_session, tmp_path, sqlite_uri):
    data_dir = write_voc(tmp_path / "data")
    result = _cli("sweep", "mbls", "--dataset", "voc", "--data-dir", str(data_dir),
                  "--model", "deeplabv3_resnet50", "--crop-size", str(CROP), "-n", "2",
                  "--epochs", "1", "--name", "voc", "--tracking-uri", sqlite_uri,
                  "--storage-path", str(tmp_path / "ray"))
    assert result.exit_code == 0, result.output
    assert "val mIoU" in result.output
    client = MlflowClient(sqlite_uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id], max_results=50)
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.data.params["accuracy_metric"] == "miou"
    assert "of the best val_miou" in parent.data.params["selection_rule"]
    assert len(children) == 2
    for child in children:
        assert child.data.tags["raysearch.complete"] == "true", child.data.tags
        for key in ("val_miou", "val_ece", "val_aece", "val_nll", "test_miou", "test_ece",
                    "test_ece_ts"):
            assert key in child.data.metrics, key
        assert child.data.params["data.crop_size"] == str(CROP)
        arts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"class_iou.csv", "reliability.png", "confidence_maps.png"} <= arts
        assert "logits.parquet" not in arts  # no per-pixel logits
        table = pd.read_csv(client.download_artifacts(child.info.run_id, "class_iou.csv",
                                                      str(tmp_path)))
        assert list(table.columns) == ["class", "val_iou", "test_iou"]
        assert len(table) == 21
    # the rule: lowest val ECE within 0.01 of the best val mIoU
    rows = [{"name": c.info.run_name, **c.data.metrics} for c in children]
    pick = rows[select_best(rows, accuracy="val_miou", ece="val_ece", tolerance=0.01)]
    selected = parent.data.tags["raysearch.selected_run"]
    chosen = client.get_run(selected).data.metrics
    # the rule's pick (the recipe fixes the learning rate: two margins may tie exactly)
    assert (chosen["val_ece"], chosen["val_miou"]) == (pick["val_ece"], pick["val_miou"])
    # the exported config trains again with `raysearch train` to the trial's numbers
    best = tmp_path / "best.yaml"
    assert _cli("export", "voc", "-o", str(best), "--tracking-uri", sqlite_uri).exit_code == 0
    again = _cli("train", str(best), "--tracking-uri", sqlite_uri)
    assert again.exit_code == 0, again.output
    assert "val: mIoU" in again.output
    rerun = client.search_runs([exp.experiment_id], max_results=1,
                               order_by=["attributes.start_time DESC"])[0]
    trial = client.get_run(selected)
    for key in ("val_miou", "val_ece", "test_miou", "test_ece"):
        assert rerun.data.metrics[key] == pytest.approx(trial.data.metrics[key], abs=1e-6), key
    report = _cli("report", "voc", "--tracking-uri", sqlite_uri)
    assert report.exit_code == 0, report.output
    assert "within 0.01 of the best val mIoU" in report.output
    assert "val mIoU" in report.output


def test_bad_voc_masks_and_wrong_models_fail_in_one_line(tmp_path, sqlite_uri):
    bad = write_voc(tmp_path / "bad", bad_value=30)
    out = CliRunner().invoke(main, ["sweep", "mbls", "--dataset", "voc", "--data-dir",
                                    str(bad), "--model", "deeplabv3_resnet50", "--crop-size",
                                    "32", "--tracking-uri", sqlite_uri])
    assert out.exit_code == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert "30" in out.stderr, out.stderr
    good = write_voc(tmp_path / "good")
    out = CliRunner().invoke(main, ["sweep", "mbls", "--dataset", "voc", "--data-dir",
                                    str(good), "--model", "cnn", "--tracking-uri", sqlite_uri])
    assert out.exit_code == 2
    assert "segmentation" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a state dict")
    out = CliRunner().invoke(main, ["sweep", "mbls", "--dataset", "voc", "--data-dir",
                                    str(good), "--model", "deeplabv3_resnet50", "--crop-size",
                                    "32", "--pretrained-backbone", str(junk),
                                    "--tracking-uri", sqlite_uri])
    assert out.exit_code == 2
    assert "junk.pt" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    out = CliRunner().invoke(main, ["sweep", "mbls", "--model", "deeplabv3_resnet50",
                                    "--tracking-uri", sqlite_uri])
    assert out.exit_code == 2
    assert "segmentation" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
