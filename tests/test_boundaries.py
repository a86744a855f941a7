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


# One interpreter imports the science modules one by one and records, after each, the
# forbidden modules that import brought in: a module is blamed for what its own import loaded,
# so a forbidden import anywhere fails, as one fresh interpreter per module would (each of
# which costs seconds of torch import).
_PROBE = """
import importlib, json, sys
forbidden, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
seen, blame = set(), {}
for module in modules:
    importlib.import_module(module)
    new = {m for m in forbidden if m in sys.modules} - seen
    seen |= new
    blame[module] = sorted(new)
print(json.dumps(blame))
"""


def _first_imports(modules: list[str], forbidden: list[str]) -> dict[str, list[str]]:
    """``{module: forbidden modules its import loaded first}``, in one fresh interpreter."""
    import json

    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(forbidden),
                          json.dumps(modules)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_probe_blames_the_module_whose_import_loads_a_forbidden_one():
    blame = _first_imports(["json", "email.mime.text", "email"], ["email", "email.mime"])
    assert blame == {"json": [], "email.mime.text": ["email", "email.mime"], "email": []}


def test_science_modules_import_no_infrastructure():
    blame = _first_imports(SCIENCE, FORBIDDEN)
    assert set(blame) == set(SCIENCE)
    assert {m: bad for m, bad in blame.items() if bad} == {}


def test_nothing_imports_the_cli():
    code = ("import sys, raysearch.tune.engine, raysearch.tracking, raysearch.tune.trainable, "
            "raysearch.tune.spaces, raysearch.training.plots\n"
            "print('raysearch.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


ENGINE = ["training/run.py", "training/run_parts.py", "training/run_weights.py",
          "training/divergence.py", "training/mixing.py", "training/interleaving.py",
          "training/passes.py", "tune/trainable.py", "tune/trial_reports.py", "tune/ddp.py",
          "tune/engine.py", "tune/plan.py", "training/loop.py"]


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
