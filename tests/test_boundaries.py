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
           "raysearch.data.text", "raysearch.models.text", "raysearch.registry",
           "raysearch.loop", "raysearch.tasks", "raysearch.optim", "raysearch.data.splits"]
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
    code = ("import sys, raysearch.sweep_engine, raysearch.tracking, raysearch.trainable, "
            "raysearch.spaces, raysearch.plots\nprint('raysearch.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


ENGINE = ["training/__init__.py", "training/run_parts.py", "training/run_weights.py",
          "training/divergence.py", "training/mixing.py", "training/interleaving.py",
          "trainable.py", "sweep_engine.py", "loop.py"]


@pytest.mark.parametrize("module", ENGINE)
def test_the_engine_names_no_dataset_model_or_task(module):
    """The loop, the trainable and the sweep serve every task and every plug-in alike."""
    import ast
    import re
    from pathlib import Path

    import raysearch
    from raysearch.data import _DATASETS
    from raysearch.models import _MODELS, _SEGMENTATION_MODELS, _TEXT_MODELS

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
