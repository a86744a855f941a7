"""The 13 reference workloads: every test metric of each, written to JSON and compared.

A refactor of the configuration, the loop or the evaluation must leave the numbers where they
were. This script trains 13 small runs on the CPU through :func:`raysearch.train` (the path a
sweep's trial and ``raysearch train`` take) on data it writes itself in each dataset's real
on-disk layout, and writes every ``test_*`` and ``val_*`` metric:

- digits with ``ce``, ``ls``, ``focal``, ``mbls``, ``acls``, ``als``, ``sbece`` interleaved,
  MixUp, and Adam with a multistep schedule;
- CIFAR-10 (python-pickle batches) with ``resnet20``;
- PASCAL VOC 2012 (JPEG + palette PNG masks) with ``deeplabv3_resnet34``;
- 20 Newsgroups (``20news-bydate`` trees) with ``gpool_cnn``, GloVe-format embeddings, Adam;
- CUB-200-2011 with ``torchvision:resnet18`` fine-tuned from a weights file.

Each run is also trained from the exported YAML of its config (``RunConfig.to_yaml``, then
``from_yaml``), so a change to the config's round trip shows here too.

Usage::

    python benchmarks/reference_workloads.py --out before.json            # on the old commit
    python benchmarks/reference_workloads.py --out after.json --compare before.json

With ``--compare`` it prints ``max |old - new|`` per workload and exits 1 when any differs
(NaN equal to NaN).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' writers of the real on-disk formats


def _digits(loss: dict, **extra) -> dict:
    run = {"loss": loss, "model": {"name": "cnn"}, "data": {"name": "digits"},
           "optimizer": {"name": "sgd", "lr": 0.05}, "epochs": 2, "batch_size": 64, "seed": 0}
    run.update(extra)
    return run


def workloads(root: Path) -> dict[str, dict]:
    """Sectioned run configs by workload name; writes the data they read under `root`."""
    import numpy as np
    import torch
    import torchvision
    from formats import write_cifar10
    from test_beyond_cifar import GROUPS, TOPIC, write_bydate, write_cub, write_glove
    from test_segmentation import write_voc

    runs = {
        "digits-ce": _digits({"name": "ce"}),
        "digits-ls": _digits({"name": "ls", "params": {"epsilon": 0.1}}),
        "digits-focal": _digits({"name": "focal", "params": {"gamma": 3.0}}),
        "digits-mbls": _digits({"name": "mbls", "params": {"margin": 10.0, "alpha": 0.1}}),
        "digits-acls": _digits({"name": "acls",
                                "params": {"margin": 10.0, "lambda1": 0.1, "lambda2": 0.01}}),
        "digits-als": _digits({"name": "als", "params": {"beta": 0.5}}),
        "digits-sbece-interleaved": _digits(
            {"name": "sbece", "params": {"beta": 1.0}}, interleaved=True,
            interleave_fraction=0.2),
        "digits-mixup": _digits({"name": "ce"}, mixup_alpha=0.2),
        "digits-adam-multistep": _digits(
            {"name": "ce"}, epochs=3, optimizer={"name": "adam", "lr": 1e-3,
                                                 "weight_decay": 0.0},
            schedule={"name": "multistep", "milestones": "2", "lr_decay": 0.1}),
    }
    write_cifar10(root / "cifar10", per_batch=20, n_test=20)
    runs["cifar10-resnet20"] = {
        "loss": {"name": "ce"}, "model": {"name": "resnet20"},
        "data": {"name": "cifar10", "dir": str(root / "cifar10")},
        "optimizer": {"name": "sgd", "lr": 0.05}, "epochs": 2, "batch_size": 16, "seed": 0}
    write_voc(root / "voc")
    runs["voc-deeplabv3_resnet34"] = {
        "loss": {"name": "mbls", "params": {"margin": 10.0, "alpha": 0.1}},
        "model": {"name": "deeplabv3_resnet34"},
        "data": {"name": "voc", "dir": str(root / "voc"), "val_fraction": 0.25,
                 "params": {"crop_size": 64}},
        "optimizer": {"name": "sgd", "lr": 0.01}, "epochs": 1, "batch_size": 4, "seed": 0}
    write_bydate(root / "20news")
    words = sorted({w for t in TOPIC.values() for w in t.split()}) + ["unused"]
    glove = write_glove(root / "glove.6B.100d.txt", words)
    assert GROUPS
    runs["newsgroups20-gpool_cnn-adam"] = {
        "loss": {"name": "ce"},
        "model": {"name": "gpool_cnn", "params": {"embeddings_path": str(glove)}},
        "data": {"name": "newsgroups20", "dir": str(root / "20news"), "val_fraction": 0.25},
        "optimizer": {"name": "adam", "lr": 1e-3, "weight_decay": 0.0},
        "epochs": 2, "batch_size": 8, "seed": 0}
    write_cub(root / "cub")
    torch.manual_seed(0)
    weights = root / "resnet18.pt"
    torch.save(torchvision.models.resnet18(num_classes=1000).state_dict(), weights)
    runs["cub200-resnet18"] = {
        "loss": {"name": "ce"},
        "model": {"name": "torchvision:resnet18", "pretrained": str(weights)},
        "data": {"name": "cub200", "dir": str(root / "cub"), "val_fraction": 0.25},
        "optimizer": {"name": "sgd", "lr": 0.01}, "epochs": 1, "batch_size": 4, "seed": 0}
    del np
    return runs


def run_all(only: list[str] | None = None) -> dict[str, dict[str, float]]:
    """``{workload: {metric: value}}`` of every (or every named) workload."""
    import torch

    from raysearch.config import RunConfig
    from raysearch.training.run import fit

    torch.set_num_threads(1)
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for name, sections in workloads(root).items():
            if only and name not in only:
                continue
            start = time.perf_counter()
            cfg = RunConfig(**sections)
            cfg.to_yaml(root / f"{name}.yaml")  # the exported form trains
            result = fit(RunConfig.from_yaml(root / f"{name}.yaml"))
            out[name] = {k: float(v) for k, v in sorted(result.metrics.items())
                         if k.startswith(("val_", "test_"))}
            print(f"{name:32s} {len(out[name]):3d} metrics  "
                  f"{time.perf_counter() - start:6.1f} s", flush=True)
    return out


def _max_difference(old: dict[str, float], new: dict[str, float]) -> float:
    """max |old - new| over the shared keys (NaN equal to NaN); inf for differing keys."""
    if set(old) != set(new):
        return math.inf
    worst = 0.0
    for key, a in old.items():
        b = new[key]
        if math.isnan(a) and math.isnan(b):
            continue
        if math.isnan(a) or math.isnan(b):
            return math.inf
        worst = max(worst, abs(a - b))
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--compare", type=Path, help="JSON file of an earlier run")
    parser.add_argument("--only", nargs="*", help="workload names (default: all 13)")
    args = parser.parse_args()
    metrics = run_all(args.only)
    args.out.write_text(json.dumps(metrics, indent=1, sort_keys=True))
    if args.compare is None:
        return 0
    old = json.loads(args.compare.read_text())
    worst = 0.0
    for name, values in metrics.items():
        diff = _max_difference(old.get(name, {}), values)
        worst = max(worst, diff)
        print(f"{name:32s} max|old - new| = {diff}")
    print(f"all {len(metrics)} workloads: max|old - new| = {worst}")
    return 0 if worst == 0.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
