"""Science modules stay plain PyTorch/NumPy: no Ray, MLflow, Optuna or matplotlib on import."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCIENCE = ["raysearch.losses", "raysearch.metrics", "raysearch.training.data",
           "raysearch.training.models", "raysearch.training", "raysearch.training.run",
           "raysearch.config", "raysearch.metrics.selection", "raysearch.calibration.posthoc",
           "raysearch.calibration", "raysearch.calibration.reproduce", "raysearch.metrics.shift",
           "raysearch.training.data.images", "raysearch.training.data.vision",
           "raysearch.training.models.resnet", "raysearch.training.models.torchvision_models",
           "raysearch.training.dense", "raysearch.metrics.repeats",
           "raysearch.training.data.segmentation", "raysearch.training.models.segmentation",
           "raysearch.training.data.cub", "raysearch.training.models.pretrained",
           "raysearch.training.data.text", "raysearch.training.models.text", "raysearch.registry",
           "raysearch.training.loop", "raysearch.training.tasks", "raysearch.training.optim",
           "raysearch.training.data.splits", "raysearch.training.registries"]
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
    code = ("import sys, raysearch.tune.engine, raysearch.tracking, raysearch.tune.trainable, "
            "raysearch.tune.spaces, raysearch.training.plots\n"
            "print('raysearch.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


ENGINE = ["training/run.py", "training/run_parts.py", "training/run_weights.py",
          "training/divergence.py", "training/mixing.py", "training/interleaving.py",
          "tune/trainable.py", "tune/engine.py", "training/loop.py"]


@pytest.mark.parametrize("module", ENGINE)
def test_the_engine_names_no_dataset_model_or_task(module):
    """The loop, the trainable and the sweep serve every task and every plug-in alike."""
    import ast
    import re
    from pathlib import Path

    import raysearch
    from raysearch.training.data import _DATASETS
    from raysearch.training.models import _MODELS, _SEGMENTATION_MODELS, _TEXT_MODELS

    tree = ast.parse((Path(raysearch.__file__).parent / module).read_text())
    for node in ast.walk(tree):  # docstrings may explain the tasks; the code may not name them
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(
                body[0].value.value, str):
            body[0] = ast.Pass()
    code = ast.unparse(tree)
    names = [*_DATASETS, *_MODELS, *_SEGMENTATION_MODELS, *_TEXT_MODELS, "segmentation",
             "classification", "text", "miou", "objectness", "vocabulary"]
    quoted = [n for n in names if re.search(rf"[\"']{re.escape(n)}[\"']", code)]
    assert quoted == [], f"{module} names {quoted}"
    branches = re.findall(r"\bif\b[^\n]*(?:segmentation|dense|is_text|objectness)", code)
    assert branches == [], f"{module} branches on a task: {branches}"
