"""The user's own model, data, loss, calibrator and metric, end to end (real Ray and MLflow).

- the CLI, run as a user would from a folder outside the repo, sweeps a package that is not
  installed (a dict-output model, a scikit-learn tabular dataset, a loss class, a searched int
  `hidden` in `model:`, AdamW), exports the selected trial and retrains it to the same numbers;
- the Python API sweeps callables defined in a notebook or script (``__main__``), which reach
  the workers by value, and retrains the export with them;
- a plug-in installed with ``pip install --target DIR`` is used by its entry-point names in the
  trials, its calibrator and its metric included;
- bad input is one line on stderr, exit 2, before Ray starts and before anything is written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

import raysearch
from raysearch.cli.commands import main

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tabular_calib"
SMALL = {"n_samples": 600}  # data params: a small table, so the trials take a second


def _copy_example(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(EXAMPLE / "tabular_calib", dest / "tabular_calib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    space = yaml.safe_load((EXAMPLE / "space.yaml").read_text())
    space["train"]["epochs"] = 3
    (dest / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    return dest


def _child_runs(client: MlflowClient, parent_id: str) -> list:
    parent = client.get_run(parent_id)
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")


def test_the_console_script_finds_a_package_next_to_the_user(tmp_path):
    """`raysearch` (a console script, whose sys.path starts at its bin/) imports as Python would
    from the folder it runs in: the space's loss, model and dataset import strings resolve."""
    project = _copy_example(tmp_path / "project")  # outside the repo, not installed
    raysearch_cli = shutil.which("raysearch")
    assert raysearch_cli, "the raysearch console script is installed with the package"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([raysearch_cli, "spaces", "validate", "space.yaml"], cwd=project,
                          env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ok: space.yaml (tabular_calib.losses:Poly1Loss)" in done.stdout


def test_cli_sweeps_exports_and_retrains_a_package_that_is_not_installed(ray_session, tmp_path,
                                                                          monkeypatch):
    project = _copy_example(tmp_path / "project")  # outside the repo, not installed
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))  # what the CLI adds (the cwd); undone after
    uri = f"sqlite:///{project / 'mlruns.db'}"

    def run(*args: str) -> str:
        done = CliRunner().invoke(main, list(args))
        assert done.exit_code == 0, done.output + str(done.exception)
        return done.output

    out = run("sweep", "space.yaml", "-n", "3", "--name", "own", "--tracking-uri", uri,
              "--storage-path", str(project / "ray"), "--data-param", "n_samples=600",
              "--metric", "tabular_calib.metrics:confidence_gap")
    assert "selected: own-" in out
    client = MlflowClient(tracking_uri=uri)
    parent = client.search_runs([client.get_experiment_by_name("raysearch").experiment_id],
                                filter_string="tags.`raysearch.sweep` = 'own'")[-1]
    children = _child_runs(client, parent.info.run_id)
    assert len(children) == 3
    for child in children:
        params = child.data.params
        assert params["method"] == "tabular_calib.losses:Poly1Loss"
        assert params["model"] == "tabular_calib.models:make_mlp"
        assert params["optimizer"] == "adamw"
        assert params["optimizer.betas"] == "[0.9, 0.999]"
        assert 16 <= int(params["model.hidden"]) <= 128  # a searched int, in its range
        assert params["data.n_samples"] == "600"
        assert params["data.label_noise"] == "0.1"
        assert -1.0 <= float(params["epsilon"]) <= 2.0
        assert "val_confidence_gap" in child.data.metrics
        assert "test_confidence_gap" in child.data.metrics
    assert len({c.data.params["model.hidden"] for c in children}) > 1  # sampled, not fixed

    run("export", "own", "-o", "best.yaml", "--tracking-uri", uri)
    doc = yaml.safe_load((project / "best.yaml").read_text())
    assert doc["config"]["model"]["name"] == "tabular_calib.models:make_mlp"
    assert doc["requires"]["packages"] == {"tabular_calib": "0.1.0"}
    assert "tabular_calib.losses:Poly1Loss" in doc["requires"]["imports"]
    assert doc["requires"]["raysearch"] == raysearch.__version__
    assert doc["metric_functions"] == ["tabular_calib.metrics:confidence_gap"]

    run("train", "best.yaml", "--tracking-uri", uri, "--name", "again")
    again = client.search_runs([parent.info.experiment_id],
                               filter_string="attributes.run_name = 'again'")[0]
    for key in ("test_accuracy", "test_ece", "test_nll", "test_confidence_gap"):
        assert again.data.metrics[key] == pytest.approx(doc["metrics"][key], abs=1e-6), key
    for name in [m for m in sys.modules if m.startswith("tabular_calib")]:
        del sys.modules[name]


NOTEBOOK = '''
import numpy as np
import torch
from sklearn.datasets import make_classification
from torch import nn
from torch.utils.data import TensorDataset

from raysearch import DatasetSplits


class TwoHeads(nn.Module):
    def __init__(self, n_in, k, hidden):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, k)

    def forward(self, x):
        features = self.body(x)
        return self.head(features), features          # a tuple: the logits first


def make_net(num_classes, input_shape, hidden=16):
    return TwoHeads(input_shape[0], num_classes, hidden)


def rows(data_dir, seed, val_fraction, n=600):
    x, y = make_classification(n_samples=n, n_features=8, n_informative=5, n_classes=3,
                               random_state=0)
    x = x.astype(np.float32)
    parts = np.array_split(np.random.default_rng(seed).permutation(n), [n // 2, 3 * n // 4])
    sets = [TensorDataset(torch.from_numpy(x[p]), torch.from_numpy(y[p])) for p in parts]
    return DatasetSplits(train=sets[0], val=sets[1], test=sets[2], num_classes=3)


class SquaredMargin(nn.Module):
    def __init__(self, weight=0.1):
        super().__init__()
        self.weight = weight

    def forward(self, logits, targets):
        top2 = logits.topk(2, dim=1).values
        return (nn.functional.cross_entropy(logits, targets)
                + self.weight * ((top2[:, 0] - top2[:, 1]) ** 2).mean() / 100)


def sharpness(probs, labels):
    return float(np.asarray(probs).max(axis=1).mean())
'''


def _notebook() -> dict:
    """Objects defined as a notebook cell defines them: in ``__main__``."""
    namespace: dict = {"__name__": "__main__"}
    exec(textwrap.dedent(NOTEBOOK), namespace)  # noqa: S102 (the test's own source)
    return namespace


def test_the_python_api_sweeps_notebook_callables(ray_session, tmp_path):
    nb = _notebook()
    assert nb["make_net"].__module__ == "__main__"  # travels by value, as a notebook's would
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    result = raysearch.sweep(
        {"params": {"weight": {"low": 0.0, "high": 1.0}},
         "model": {"hidden": {"low": 4, "high": 32}},
         "optimizer": {"name": "adamw", "lr": 0.01}, "train": {"epochs": 3}},
        model=nb["make_net"], dataset=nb["rows"], loss=nb["SquaredMargin"],
        metrics=[nb["sharpness"]], num_samples=2, name="nb", tracking_uri=uri,
        storage_path=str(tmp_path / "ray"), objective="sharpness:min", progress=None)
    trials = result.trials
    assert len(trials) == 2
    assert trials["complete"].all()
    assert {"model.hidden", "weight", "val_sharpness", "test_sharpness", "on_front",
            "selected"} <= set(trials.columns)
    assert trials["method"].eq("__main__:SquaredMargin").all()
    assert result.selected is not None
    assert result.selected["selected"]
    assert set(result.front["trial"]) <= set(trials["trial"])
    assert len(result.front) >= 1
    assert result.parent_run_id == MlflowClient(uri).get_run(
        result.selected["run_id"]).data.tags["mlflow.parentRunId"]
    doc = raysearch.export("nb", tmp_path / "best.yaml", tracking_uri=uri)
    assert doc["config"]["model"]["name"] == "__main__:make_net"
    run = raysearch.train(tmp_path / "best.yaml", model=nb["make_net"], dataset=nb["rows"],
                          loss=nb["SquaredMargin"], metrics=[nb["sharpness"]], tracking_uri=uri)
    assert run.metrics["test_ece"] == pytest.approx(result.selected["test_ece"], abs=1e-6)
    assert run.metrics["test_sharpness"] == pytest.approx(result.selected["test_sharpness"],
                                                          abs=1e-6)
    with pytest.raises(ValueError, match=r"space names its loss"):
        raysearch.sweep({"method": "ce"}, loss=nb["SquaredMargin"], tracking_uri=uri)


def test_a_pip_target_plugin_is_used_by_its_names_in_the_trials(ray_session, tabular_plugin,
                                                                 tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tabular_plugin))  # as PYTHONPATH=DIR would
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    result = raysearch.sweep(
        {"method": "poly1", "params": {"epsilon": {"low": 0.0, "high": 1.0}},
         "model": {"name": "tabular_mlp", "hidden": 24},
         "data": {"name": "synthetic_table", **SMALL}, "train": {"epochs": 2}},
        metrics=["confidence_gap"], posthoc=("ts", "vector_scaling"), num_samples=2,
        name="plug", tracking_uri=uri, storage_path=str(tmp_path / "ray"), progress=None)
    trials = result.trials
    assert trials["complete"].all(), trials[["trial", "outcome"]]
    assert trials["model"].eq("tabular_mlp").all()
    assert trials["dataset"].eq(
        "synthetic_table").all()
    # the plug-in's calibrator and metric ran in the trials, under their entry-point names
    for key in ("test_ece_vector_scaling", "val_ece_vector_scaling", "test_ece_ts"):
        assert trials[key].between(0, 1).all(), key
    assert trials["val_confidence_gap"].notna().all()
    params = MlflowClient(uri).get_run(result.parent_run_id).data.params
    assert params["dataset"] == "synthetic_table"
    assert params["data_train_size"] == "360"


def _write_bad_package(root: Path) -> None:
    pkg = root / "badpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "parts.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset

        from raysearch import DatasetSplits

        def _set(n, labels):
            return TensorDataset(torch.randn(n, 4), torch.as_tensor(labels))

        def table(data_dir, seed, val_fraction):
            return DatasetSplits(train=_set(8, [0, 1] * 4), val=_set(4, [0, 1] * 2),
                                 test=_set(4, [0, 1] * 2), num_classes=2)

        def out_of_range(data_dir, seed, val_fraction):
            return DatasetSplits(train=_set(8, [0, 1, 2, 1] * 2), val=_set(4, [0, 1] * 2),
                                 test=_set(4, [0, 1] * 2), num_classes=2)

        def not_splits(data_dir, seed, val_fraction):
            return {"train": [1, 2]}

        def raising(data_dir, seed, val_fraction):
            raise FileNotFoundError("/data/table.csv")

        class Named(nn.Module):
            def __init__(self, k):
                super().__init__()
                self.fc = nn.Linear(4, k)

            def forward(self, x):
                return {"scores": self.fc(x)}

        def no_logits(num_classes, input_shape):
            return Named(num_classes)

        def net(num_classes, input_shape, hidden=8):
            return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        '''))


@pytest.mark.parametrize(("args", "message"), [
    (["--dataset", "badpkg.parts:tabel"], r"'badpkg\.parts' has no attribute 'tabel'; did you "
                                          r"mean table\?"),
    (["--dataset", "nopkg.parts:table"], r"cannot import module 'nopkg\.parts'"),
    (["--dataset", "cifar1O"], r"Unknown dataset 'cifar1O' \(did you mean cifar10"),
    (["--dataset", "badpkg.parts:out_of_range"], r"its train split has label 2, outside "
                                                 r"\[0, 2\)"),
    (["--dataset", "badpkg.parts:not_splits"], r"dataset 'badpkg\.parts:not_splits' returned "
                                               r"dict, expected raysearch\.DatasetSplits"),
    (["--dataset", "badpkg.parts:raising"], r"dataset 'badpkg\.parts:raising' raised "
                                            r"FileNotFoundError: /data/table\.csv"),
    (["--dataset", "badpkg.parts:table", "--model", "badpkg.parts:no_logits"],
     r"model 'badpkg\.parts:no_logits' returned a dict with keys \['scores'\], expected a "
     r"'logits' tensor"),
    (["--dataset", "badpkg.parts:table", "--model", "badpkg.parts:net", "--model-param",
      "width=3"], r"model 'badpkg\.parts:net' takes no argument 'width'"),
    (["--dataset", "badpkg.parts:table", "--model", "badpkg.parts:net", "--metric",
      "badpkg.parts:nope"], r"'badpkg\.parts' has no attribute 'nope'"),
])
def test_bad_input_is_one_line_before_ray_and_writes_nothing(tmp_path, monkeypatch, args,
                                                             message):
    _write_bad_package(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = CliRunner().invoke(main, ["sweep", "ce", *args, "--tracking-uri",
                                    f"sqlite:///{tmp_path / 'm.db'}", "--storage-path",
                                    str(tmp_path / "ray")])
    for name in [m for m in sys.modules if m.startswith("badpkg")]:
        del sys.modules[name]
    assert out.exit_code == 2, out.output
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: ")
    assert re.search(message, out.stderr), out.stderr
    assert not (tmp_path / "m.db").exists()
    assert not (tmp_path / "ray").exists()
    assert not (tmp_path / "mlruns.db").exists()


def test_the_own_trainable_example_runs(ray_session, tmp_path, monkeypatch, capsys):
    """examples/own_trainable.py, run as a script: public names only; the parent run holds the
    Pareto plot and the best config."""
    import runpy

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the example honours it
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["own_trainable.py", "--num-samples", "2", "--name",
                                      "mine", "--storage-path", str(tmp_path / "ray")])
    runpy.run_path(str(REPO / "examples" / "own_trainable.py"), run_name="__main__")
    assert "selected mine-" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=uri)
    parent = client.search_runs([client.get_experiment_by_name("raysearch").experiment_id],
                                filter_string="attributes.run_name = 'mine'")[0]
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"pareto.png", "best_config.yaml", "trials.parquet"} <= names
    children = _child_runs(client, parent.info.run_id)
    assert len(children) == 2
    assert all("val_ece" in c.data.metrics and "test_ece" in c.data.metrics for c in children)
    local = client.download_artifacts(parent.info.run_id, "best_config.yaml", str(tmp_path))
    best = yaml.safe_load(Path(local).read_text())
    assert set(best["config"]) >= {"epsilon", "lr", "method"}
    assert best["run_id"] == parent.data.tags["raysearch.selected_run"]
