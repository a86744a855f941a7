"""End to end beyond CIFAR: a 20 Newsgroups sweep of GPool-CNN with GloVe embeddings and a
CUB-200-2011 sweep fine-tuning pretrained weights, on trees the tests write in the real on-disk
layouts; each exported config trains again with `raysearch train` to its trial's numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from PIL import Image

from raysearch.cli.commands import main

pytestmark = pytest.mark.integration

GROUPS = ["comp.graphics", "rec.autos", "sci.space", "talk.politics.guns"]
TOPIC = {"comp.graphics": "pixel render image shading", "rec.autos": "engine wheel car brake",
         "sci.space": "orbit rocket launch planet", "talk.politics.guns": "law vote senate rights"}


def write_bydate(root, per_group: int = 8, test_per_group: int = 3):
    """scikit-learn's on-disk 20news-bydate-train/ and -test/ trees, headers included."""
    rng = np.random.default_rng(0)
    for split, n in (("20news-bydate-train", per_group), ("20news-bydate-test", test_per_group)):
        for g, group in enumerate(GROUPS):
            folder = root / split / group
            folder.mkdir(parents=True)
            for i in range(n):
                words = TOPIC[group].split() * 3 + list(rng.choice(["the", "a", "of"], 5))
                rng.shuffle(words)
                (folder / str(10000 + 100 * g + i)).write_text(
                    f"From: user{i}@example.com\nSubject: post {i}\n\n{' '.join(words)}\n",
                    encoding="latin-1")
    return root


def write_glove(path, words, dim: int = 100):
    rng = np.random.default_rng(1)
    lines = [w + " " + " ".join(f"{v:.4f}" for v in rng.normal(size=dim)) for w in words]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_cub(root, classes: int = 3, per_class: int = 6):
    """CUB_200_2011/ with images/, images.txt, image_class_labels.txt, train_test_split.txt,
    classes.txt and bounding_boxes.txt (4 training and 2 test images per class)."""
    cub = root / "CUB_200_2011"
    rng = np.random.default_rng(2)
    images, labels, split, boxes, names = [], [], [], [], []
    image_id = 0
    for c in range(1, classes + 1):
        folder = f"{c:03d}.Bird_{c}"
        names.append(f"{c} {folder}")
        (cub / "images" / folder).mkdir(parents=True)
        for i in range(per_class):
            image_id += 1
            w, h = int(rng.integers(240, 320)), int(rng.integers(230, 300))
            pixels = np.full((h, w, 3), 60 * c, np.uint8) + rng.integers(0, 30, (h, w, 3),
                                                                          np.uint8)
            rel = f"{folder}/img_{i}.jpg"
            Image.fromarray(pixels).save(cub / "images" / rel, quality=90)
            images.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {c}")
            split.append(f"{image_id} {1 if i < 4 else 0}")
            boxes.append(f"{image_id} 10.0 12.0 {w / 2:.1f} {h / 2:.1f}")
    for name, rows in (("images.txt", images), ("image_class_labels.txt", labels),
                       ("train_test_split.txt", split), ("bounding_boxes.txt", boxes),
                       ("classes.txt", names)):
        (cub / name).write_text("\n".join(rows) + "\n")
    return root


def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _sweep_runs(uri):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id], max_results=50,
                              order_by=["attributes.start_time DESC"])
    return client, exp, runs


def _export_and_train(client, exp, name, uri, tmp_path):
    """Export the sweep's pick, train it again, return (selected trial run, retrained run)."""
    best = tmp_path / f"{name}.yaml"
    out = _cli("export", name, "-o", str(best), "--tracking-uri", uri)
    assert out.exit_code == 0, out.output
    again = _cli("train", str(best), "--tracking-uri", uri)
    assert again.exit_code == 0, again.output
    runs = client.search_runs([exp.experiment_id], max_results=50,
                              order_by=["attributes.start_time DESC"])
    parent = next(r for r in runs if r.data.tags.get("raysearch.sweep") == name
                  and "mlflow.parentRunId" not in r.data.tags)
    trial = client.get_run(parent.data.tags["raysearch.selected_run"])
    return trial, runs[0]


def test_newsgroups_sweep_with_glove(ray_session, tmp_path, sqlite_uri):
    data = write_bydate(tmp_path / "20news")
    words = sorted({w for t in TOPIC.values() for w in t.split()}) + ["unused"]
    glove = write_glove(tmp_path / "glove.6B.100d.txt", words)
    result = _cli("sweep", "mbls", "--dataset", "newsgroups20", "--data-dir", str(data),
                  "--model", "gpool_cnn", "--embeddings", str(glove), "-n", "2", "--epochs",
                  "2", "--val-fraction", "0.25", "--name", "ng", "--tracking-uri", sqlite_uri,
                  "--storage-path", str(tmp_path / "ray"))
    assert result.exit_code == 0, result.output
    client, exp, runs = _sweep_runs(sqlite_uri)
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.data.params["data_layout"] == "bydate"
    assert parent.data.params["data_test_size"] == str(3 * len(GROUPS))
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2
    for child in children:
        assert child.data.tags["raysearch.complete"] == "true"
        assert child.data.params["model"] == "gpool_cnn"
        assert child.data.params["model.embeddings_path"] == str(glove)
        assert 0.0 <= child.data.metrics["test_ece"] <= 1.0
    trial, rerun = _export_and_train(client, exp, "ng", sqlite_uri, tmp_path)
    for key in ("val_accuracy", "val_ece", "test_accuracy", "test_ece"):
        assert rerun.data.metrics[key] == pytest.approx(trial.data.metrics[key], abs=1e-6), key
    # a missing GloVe file is one line, before Ray
    bad = CliRunner().invoke(main, ["sweep", "mbls", "--dataset", "newsgroups20", "--data-dir",
                                    str(data), "--model", "gpool_cnn", "--embeddings",
                                    str(tmp_path / "nope.txt"), "--tracking-uri", sqlite_uri])
    assert bad.exit_code == 2
    assert bad.stderr.count("\n") == 1, bad.stderr


def test_cub_sweep_fine_tunes_pretrained_weights(ray_session, tmp_path, sqlite_uri):
    import hashlib

    import torchvision

    data = write_cub(tmp_path / "cub")
    torch.manual_seed(0)
    weights = tmp_path / "resnet18_imagenet.pt"
    torch.save(torchvision.models.resnet18(weights=None, num_classes=1000).state_dict(), weights)
    result = _cli("sweep", "acls", "--dataset", "cub200", "--data-dir", str(data), "--model",
                  "torchvision:resnet18", "--pretrained", str(weights), "-n", "2", "--epochs",
                  "1", "--val-fraction", "0.25", "--name", "cub", "--tracking-uri", sqlite_uri,
                  "--storage-path", str(tmp_path / "ray"))
    assert result.exit_code == 0, result.output
    assert "classification head replaced" in result.output
    client, exp, runs = _sweep_runs(sqlite_uri)
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert "MbLS selected on test" in parent.data.params["data_val_split"]
    assert parent.data.params["data_test_size"] == "6"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2
    for child in children:
        assert child.data.tags["raysearch.complete"] == "true"
        assert child.data.params["pretrained_sha256"] == digest
    trial, rerun = _export_and_train(client, exp, "cub", sqlite_uri, tmp_path)
    assert rerun.data.params["pretrained_sha256"] == digest
    for key in ("val_accuracy", "val_ece", "test_accuracy", "test_ece"):
        assert rerun.data.metrics[key] == pytest.approx(trial.data.metrics[key], abs=1e-6), key
