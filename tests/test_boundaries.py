"""Science modules stay plain PyTorch/NumPy: no Ray, MLflow, Optuna or matplotlib on import."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCIENCE = ["raysearch.losses", "raysearch.metrics", "raysearch.data", "raysearch.models",
           "raysearch.training", "raysearch.config", "raysearch.selection", "raysearch.posthoc",
           "raysearch.calibration", "raysearch.reproduce", "raysearch.shift",
           "raysearch.data.images", "raysearch.data.vision", "raysearch.models.resnet",
           "raysearch.models.torchvision_models", "raysearch.dense", "raysearch.repeats",
           "raysearch.data.segmentation", "raysearch.models.segmentation", "raysearch.data.cub",
           "raysearch.models.pretrained",
           "raysearch.data.text", "raysearch.models.text"]
FORBIDDEN = ["ray", "mlflow", "optuna", "matplotlib", "raysearch.cli"]


@pytest.mark.parametrize("module", SCIENCE)
def test_science_module_imports_no_infrastructure(module):
    code = (f"import sys, {module}\n"
            f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "", f"{module} imports {out}"


def test_nothing_imports_the_cli():
    code = ("import sys, raysearch.sweep, raysearch.tracking, raysearch.trainable, "
            "raysearch.spaces, raysearch.plots\nprint('raysearch.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
