"""The CLI is a thin layer: it parses options and prints what the Python API returns.

MLflow, PyTorch, NumPy, pandas and Ray are imported by the layers below it (the API,
:mod:`raysearch.tracking`, :mod:`raysearch.tracking.reports`, the science modules), never by
a module of ``raysearch/cli/`` itself, so ``raysearch --help`` starts in a fraction of a second.
"""

from __future__ import annotations

import ast
import math
import subprocess
import sys
from pathlib import Path

import raysearch

HEAVY = ("mlflow", "torch", "numpy", "pandas", "ray")
CLI = Path(raysearch.__file__).parent / "cli" / "commands.py"


def _imported_modules(tree: ast.AST) -> list[str]:
    """The modules named by ``import``, ``from ... import``, ``__import__``, ``import_module``."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called in ("__import__", "import_module") and isinstance(node.args[0].value, str):
                names.append(node.args[0].value)
    return names


def test_heavy_import_finder_sees_every_form():
    # the checker itself: each of the four forms, at module level and inside a function
    code = ("import numpy as np\nfrom mlflow.tracking import MlflowClient\n"
            "def f():\n    import torch.nn\n    from ray import tune\n"
            "    __import__('pandas')\n    importlib.import_module('mlflow.entities')\n"
            "from raysearch.api import sweep\nfrom . import cli\n")
    top = sorted({n.split(".")[0] for n in _imported_modules(ast.parse(code))})
    assert top == ["mlflow", "numpy", "pandas", "ray", "raysearch", "torch"]


def test_cli_source_imports_no_heavy_module():
    names = _imported_modules(ast.parse(CLI.read_text()))
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert heavy == [], f"raysearch/cli/commands.py imports {heavy}"
    assert "click" in names  # the walk did see the file's imports


def test_no_module_of_the_cli_package_imports_a_heavy_module():
    files = sorted(CLI.parent.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "__main__.py", "commands.py", "plan.py"}
    heavy = {f.name: sorted(n for n in _imported_modules(ast.parse(f.read_text()))
                            if n.split(".")[0] in HEAVY) for f in files}
    assert {name: found for name, found in heavy.items() if found} == {}


def test_importing_the_cli_and_its_help_load_no_heavy_module():
    code = ("import sys\nimport raysearch.cli.commands\n"
            f"after_import = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "try:\n    raysearch.cli.commands.main(['--help'], prog_name='raysearch')\n"
            "except SystemExit as exc:\n    code = exc.code\n"
            f"after_help = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "print('RESULT', after_import, after_help, code)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "Usage: raysearch [OPTIONS] COMMAND [ARGS]..." in out
    assert out.strip().splitlines()[-1] == "RESULT [] [] 0"


def test_raysearch_help_runs():
    proc = subprocess.run([sys.executable, "-m", "raysearch.cli", "--help"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    commands = {"sweep", "train", "report", "compare", "export", "calibrate", "list",
                "spaces", "recipes", "reproduce", "sync", "ui"}
    listed = {line.split()[0] for line in proc.stdout.split("Commands:")[1].splitlines()
              if line.strip()}
    assert listed == commands


def test_report_text_comes_from_the_reports_layer():
    from raysearch.tracking.reports import mean_sem, metrics_line, percent

    # 0.1234 -> 100 * 0.1234 = 12.34 percent points; SEM 0.0056 -> 0.56 points
    assert mean_sem(0.1234, 0.0056) == "12.34% ± 0.56"
    assert mean_sem(0.1234, math.nan) == "12.34%"  # one seed: no SEM
    assert percent(None) == "-"
    assert percent(math.nan) == "-"
    metrics = {"val_accuracy": 0.9, "val_ece": 0.015, "val_aece": 0.02, "val_nll": 0.3,
               "test_accuracy": 0.875, "test_ece": 0.0125, "test_aece": 0.025,
               "test_nll": 0.35}
    assert metrics_line(metrics) == (
        "val: acc 90.00% ECE 1.50% AECE 2.00% NLL 0.3000 | "
        "test: acc 87.50% ECE 1.25% AECE 2.50% NLL 0.3500")


def test_api_calibrate_returns_the_report_and_says_the_cli_lines(tmp_path):
    import numpy as np

    from raysearch.api import calibrate

    # 40 samples, 2 classes x 20: a stratified half-split fits on 2 x 10 = 20, evaluates on 20
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 20)
    logits = rng.normal(size=(40, 2)) + 3.0 * np.eye(2)[labels]
    np.savez(tmp_path / "outs.npz", logits=logits, labels=labels)
    said: list[str] = []
    result = calibrate(tmp_path / "outs.npz", methods="ts", output_dir=tmp_path / "out",
                       progress=said.append)
    assert (result.report.n_calibration, result.report.n_evaluation) == (20, 20)
    assert result.run_id is None  # neither log nor a tracking URI: no MLflow run
    assert said[0] == result.report.format_table()
    n_rows = len(result.report.rows)
    assert said[1:] == [f"\nwrote {tmp_path / 'out'}/calibration.csv and {n_rows} "
                        "reliability diagrams"]
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "calibration.csv" in written
    assert len([n for n in written if n.startswith("reliability_")]) == n_rows
