"""``benchmarks/jpeg_loader.py`` (the GPU acceptance's JPEG folder part) on the CPU.

The JPEG tree it writes is a real ImageFolder tree (every file decodes, sizes in range, 10
classes that raysearch's ``imagefolder`` dataset finds); without a CUDA device the script says
so in one line and exits 0; with ``--device cpu`` it prints both figures and their ratio.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = BENCHMARKS / "jpeg_loader.py"


def _script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_tree_is_an_imagefolder_of_real_jpegs(tmp_path, monkeypatch):
    from PIL import Image

    from raysearch.training.data.vision_trees import load_imagefolder

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from jpeg_loader import CLASSES, write_jpeg_tree

    assert write_jpeg_tree(tmp_path, 40, sides=(40, 60)) == 40
    files = sorted(tmp_path.glob("*/*.jpg"))
    assert len(files) == 40
    assert len({f.parent.name for f in files}) == CLASSES
    for f in files:
        with Image.open(f) as image:
            assert (image.format, image.mode) == ("JPEG", "RGB")
            assert 40 <= image.width <= 60
            assert 40 <= image.height <= 60
    data = load_imagefolder(seed=0, data_dir=tmp_path, image_size=16, val_fraction=0.25,
                            test_fraction=0.25)
    assert data.num_classes == CLASSES
    assert len(data.train) + len(data.val) + len(data.test) == 40
    x, y = data.train[0]
    assert tuple(x.shape) == (3, 16, 16)
    assert x.dtype == torch.float32
    assert 0 <= y < CLASSES


def test_without_a_gpu_the_script_says_so_in_one_line():
    done = _script(env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # no GPU, on any machine
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("jpeg_loader: no CUDA device found")


def test_on_the_cpu_it_prints_both_figures_and_their_ratio():
    done = _script("--device", "cpu", "--model", "cnn", "--image-size", "32", "--images", "60",
                   "--batch-size", "8", "--batches", "3", "--workers", "1")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    loader = float(re.search(r"loader\s+([\d.]+) images/s", out).group(1))
    training = float(re.search(r"training\s+([\d.]+) images/s", out).group(1))
    ratio = float(re.search(r"loader / training: ([\d.]+); goal >= 1.0: (met|NOT met)",
                            out).group(1))
    assert loader > 0
    assert training > 0
    assert ratio == pytest.approx(loader / training, abs=0.006 + 0.001 * ratio)
    assert "1 loader workers, cnn on CPU" in out
