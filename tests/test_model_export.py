"""``raysearch export --register`` / ``--with-weights``: the selected trial as a pyfunc model.

A real digits sweep on the session's local Ray, a real MLflow SQLite store with its model
registry; the model is loaded back through ``mlflow.pyfunc.load_model`` and its predictions are
checked against the trial's own stored test logits: softmax(logits / T) with the temperature
fitted on the trial's validation logits (Guo et al. 2017, temperature scaling). The model's
environment (raysearch as installed, the user's package as code), its inputs (float64 and
integers cast to float32), and ``mlflow models serve`` answering ``POST /invocations``; a sweep of
``__main__`` objects exported with them again; a perfectly classified validation split exported
without its calibrator. The tests that sweep are ``integration`` (they start Ray).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from clusters import stop_process
from mlflow.tracking import MlflowClient
from torch import nn

import raysearch
from raysearch.calibration import fit_calibrator
from raysearch.cli.commands import main
from raysearch.config import RunConfig
from raysearch.tracking import trial_outputs
from raysearch.tracking.export import model_environment, raysearch_requirement
from raysearch.tracking.pyfunc import save_calibrated_model
from raysearch.training.run_parts import load_run_data
from raysearch.tune.sync import trial_weights


def make_net(num_classes, input_shape, hidden=32):
    """A user's model: an MLP over the flattened input."""
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


def _test_inputs(doc: dict) -> np.ndarray:
    data = load_run_data(RunConfig.from_dict(doc["config"]))
    return torch.stack([data.test[i][0] for i in range(len(data.test))]).numpy()


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _stored(uri: str, run_id: str):
    outputs = trial_outputs(MlflowClient(uri), run_id)
    split = np.asarray(outputs.split)
    return outputs.logits[split == "val"], outputs.labels[split == "val"], \
        outputs.logits[split == "test"]


@pytest.mark.integration
def test_register_a_built_in_model_and_load_it_by_its_models_uri(ray_session, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    raysearch.sweep("ce", num_samples=2, epochs=2, posthoc=(), name="reg", tracking_uri=uri,
                    storage_path=str(tmp_path / "ray"), log_weights=True, progress=None)
    result = CliRunner().invoke(main, ["export", "reg", "--register", "digits-ce",
                                       "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    assert "registered: mlflow.pyfunc.load_model('models:/digits-ce/1')" in result.output
    # --log-weights reached the trials: the run keeps the weights its last checkpoint holds
    assert "weights from the trial's run, calibrator ts" in result.output
    doc = raysearch.export("reg", tracking_uri=uri)
    client = MlflowClient(uri)
    on_run = torch.load(client.download_artifacts(doc["run_id"], "weights.pt", str(tmp_path)),
                        weights_only=True)
    tid = client.get_run(doc["run_id"]).data.tags["raysearch.trial_id"]
    in_checkpoint = trial_weights(str(tmp_path / "ray" / "reg"), tid)
    assert on_run.keys() == in_checkpoint.keys()
    assert all(torch.equal(on_run[k], in_checkpoint[k]) for k in on_run)

    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model("models:/digits-ce/1")
    x = _test_inputs(doc)
    assert x.shape[1:] == (1, 8, 8)
    probs = model.predict(x)
    assert probs.shape == (len(x), 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    # the trial's final weights and its fitted temperature: softmax(test logits / T)
    val_logits, val_labels, test_logits = _stored(uri, doc["run_id"])
    temperature = fit_calibrator("ts", val_logits, val_labels).temperature
    np.testing.assert_allclose(probs, _softmax(test_logits / temperature), atol=1e-5)
    assert model.metadata.metadata["calibrator"] == "ts"
    # the same trial without a registry, uncalibrated: the network's own softmax
    folder = tmp_path / "model"
    saved = CliRunner().invoke(main, ["export", "reg", "--with-weights", "-o", str(folder),
                                      "--calibrator", "none", "--tracking-uri", uri])
    assert saved.exit_code == 0, saved.output
    plain = mlflow.pyfunc.load_model(str(folder)).predict(x)
    np.testing.assert_allclose(plain, _softmax(test_logits), atol=1e-5)
    assert (folder / "artifacts" / "best_config.yaml").is_file()

    # bad requests: one line each, nothing written
    for args, needle in ((["--with-weights"], "-o DIR"),
                         (["--with-weights", "-o", str(folder)], "exists"),
                         (["--register", "m", "--calibrator", "tss"], "(did you mean ts")):
        bad = CliRunner().invoke(main, ["export", "reg", *args, "--tracking-uri", uri])
        assert bad.exit_code == 2, bad.output
        assert bad.stderr.count("\n") == 1, bad.stderr
        assert needle in bad.stderr
    assert [v.version for v in MlflowClient(uri).search_model_versions("name='m'")] == []


def test_a_users_model_comes_back_from_its_factory(tmp_path):
    # the network is rebuilt by its import string at load time (here: this test module's
    # factory), gets the saved weights, and the temperature divides its logits
    spec = {"name": "test_model_export:make_net", "num_classes": 3, "input_shape": (1, 4, 4),
            "params": {"hidden": 8}}
    torch.manual_seed(0)
    net = make_net(3, (1, 4, 4), hidden=8)
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(200, 3)) * 3
    labels = np.where(rng.random(200) < 0.7, logits.argmax(axis=1), rng.integers(0, 3, 200))
    calibrator = fit_calibrator("ts", logits, labels)
    save_calibrated_model(tmp_path / "m", model=spec, weights=net.state_dict(),
                          calibrator=calibrator, calibrator_name="ts", export={"sweep": "own"})
    x = rng.normal(size=(5, 1, 4, 4)).astype(np.float32)
    with torch.no_grad():
        expected = _softmax(net(torch.from_numpy(x)).double().numpy() / calibrator.temperature)
    model = mlflow.pyfunc.load_model(str(tmp_path / "m"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_allclose(model.predict(x), expected, atol=1e-6)
        # float64 and integers are cast to float32: no schema error
        np.testing.assert_allclose(model.predict(x.astype(np.float64)), expected, atol=1e-6)
        ints = np.round(x).astype(np.int64)
        with torch.no_grad():
            from_ints = net(torch.from_numpy(ints.astype(np.float32))).double().numpy()
        np.testing.assert_allclose(model.predict(ints),
                                   _softmax(from_ints / calibrator.temperature), atol=1e-6)
        frozen = x.copy()
        frozen.setflags(write=False)  # as MLflow hands some arrays over: no torch warning
        np.testing.assert_allclose(model.predict(frozen), expected, atol=1e-6)
        np.testing.assert_allclose(model.predict(x.tolist()), expected, atol=1e-6)
    assert [str(w.message) for w in caught] == []
    # wrong inputs: one line, the array not printed
    for bad, needle in ((np.zeros((2, 16), np.float32), "the model takes (N, 1, 4, 4)"),
                        (np.array([["a"] * 16]).reshape(1, 1, 4, 4), "must be numbers")):
        with pytest.raises(ValueError, match=r".") as raised:
            model.predict(bad)
        assert needle in str(raised.value)
        assert "\n" not in str(raised.value)
    meta = model.metadata.metadata
    assert json.loads(meta["input"])["shape"] == [-1, 1, 4, 4]
    assert json.loads(meta["model"])["name"] == "test_model_export:make_net"


def _requirements(folder: Path) -> list[str]:
    return (folder / "requirements.txt").read_text().splitlines()


def test_the_model_requires_raysearch_as_it_is_installed(tmp_path):
    import raysearch as package

    root = Path(package.__file__).resolve().parents[1]
    line, note = raysearch_requirement()
    assert (root / "pyproject.toml").is_file()  # a source tree: its folder, not a version
    assert line == f"raysearch @ {root.as_uri()}"
    assert note == ""
    pip, code, notes = model_environment(["cnn", None])
    assert line in pip
    assert not any(p.startswith("raysearch==") for p in pip)
    assert {p.split("==")[0] for p in pip if "==" in p} >= {"torch", "mlflow", "numpy",
                                                              "cloudpickle"}
    assert (code, notes) == ([], [])
    # an installed distribution is named with its version; torchvision for its models
    pip, code, _ = model_environment(["yaml:safe_load", "torchvision:resnet18"])
    import importlib.metadata

    assert f"PyYAML=={importlib.metadata.version('PyYAML')}" in pip
    assert f"torchvision=={importlib.metadata.version('torchvision')}" in pip
    assert code == []
    # objects of __main__ travel by value; a module that imports nowhere gets a note
    _, code, notes = model_environment([_notebook_net(), "nowhere_pkg.models:net"])
    assert code == []
    assert notes == ["note: the model imports nowhere_pkg, which is neither installed nor "
                     "importable here: make it importable where the model is loaded"]


def _notebook_net():
    namespace: dict = {"__name__": "__main__"}
    exec("def make_net(num_classes, input_shape):\n    return None\n", namespace)  # noqa: S102
    return namespace["make_net"]


USER_NETS = """
import numpy as np
from torch import nn


def make_net(num_classes, input_shape, hidden=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))
"""


def test_a_users_package_that_no_index_has_travels_inside_the_model(tmp_path, monkeypatch):
    src = tmp_path / "src" / "mynets"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "nets.py").write_text(USER_NETS)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "src"), *sys.path])
    from mynets.nets import make_net as user_net  # noqa: PLC0415 (written by this test)

    spec = {"name": "mynets.nets:make_net", "num_classes": 3, "input_shape": (4,),
            "params": {"hidden": 8}}
    torch.manual_seed(0)
    net = user_net(3, (4,), hidden=8)
    save_calibrated_model(tmp_path / "m", model=spec, weights=net.state_dict(), calibrator=None,
                          calibrator_name="none", export={"sweep": "own"})
    assert (tmp_path / "m" / "code" / "mynets" / "nets.py").is_file()
    assert not (tmp_path / "m" / "code" / "mynets" / "__pycache__").exists()
    assert raysearch_requirement()[0] in _requirements(tmp_path / "m")
    # where the model is loaded the package is not on sys.path: the model's code/ is
    sys.path.remove(str(tmp_path / "src"))
    for name in [m for m in sys.modules if m == "mynets" or m.startswith("mynets.")]:
        monkeypatch.delitem(sys.modules, name)
    x = np.random.default_rng(0).normal(size=(5, 4))
    probs = mlflow.pyfunc.load_model(str(tmp_path / "m")).predict(x)
    with torch.no_grad():
        expected = _softmax(net(torch.from_numpy(x.astype(np.float32))).double().numpy())
    np.testing.assert_allclose(probs, expected, atol=1e-6)
    assert sys.modules["mynets"].__file__.startswith(str(tmp_path / "m" / "code"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model_uri: str, uri: str, cwd: Path) -> tuple[subprocess.Popen, str]:
    """`mlflow models serve` of `model_uri` on a free port of 127.0.0.1, once /ping answers."""
    port = _free_port()
    log = open(cwd / "serve.log", "w")  # noqa: SIM115 (the process writes it)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager",
         "local", "-h", "127.0.0.1", "-p", str(port)], cwd=cwd, stdout=log,
        stderr=subprocess.STDOUT, env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        start_new_session=True)  # its own process group: uvicorn stops with it
    log.close()
    deadline = time.monotonic() + 240
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc)
                raise RuntimeError("mlflow models serve did not start: "
                                   + (cwd / "serve.log").read_text()[-3000:]) from None
            time.sleep(0.5)


SERVEPKG = """
import numpy as np
from torch import nn


def make_net(num_classes, input_shape, hidden=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))
"""


@pytest.mark.integration
def test_a_registered_user_model_is_served_by_mlflow_models_serve(ray_session, tmp_path,
                                                                  monkeypatch):
    project = tmp_path / "project"  # the user's package: next to them, not installed
    (project / "servepkg").mkdir(parents=True)
    (project / "servepkg" / "__init__.py").write_text("")
    (project / "servepkg" / "models.py").write_text(SERVEPKG)
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))  # what the CLI adds (the cwd); undone after
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    raysearch.sweep("ce", model="servepkg.models:make_net", num_samples=1, epochs=1,
                    name="served", tracking_uri=uri, storage_path=str(tmp_path / "ray"),
                    progress=None)
    done = CliRunner().invoke(main, ["export", "served", "--register", "served-model",
                                     "--tracking-uri", uri])
    assert done.exit_code == 0, done.output
    assert "calibrator ts" in done.output
    doc = raysearch.export("served", tracking_uri=uri)
    model_dir = Path(MlflowClient(uri).download_artifacts(doc["run_id"], "model",
                                                          str(tmp_path / "dl")))
    requirements = _requirements(model_dir)
    assert raysearch_requirement()[0] in requirements  # raysearch @ file:///<its source tree>
    assert not any(line.startswith("raysearch==") for line in requirements)
    assert (model_dir / "code" / "servepkg" / "models.py").is_file()

    x = _test_inputs(doc)[:6]
    val_logits, val_labels, test_logits = _stored(uri, doc["run_id"])
    expected = _softmax(test_logits[:6] / fit_calibrator("ts", val_logits, val_labels).temperature)
    elsewhere = tmp_path / "elsewhere"  # neither the project nor its package on sys.path
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    proc, url = _serve("models:/served-model/1", uri, elsewhere)
    try:
        request = urllib.request.Request(
            f"{url}/invocations", data=json.dumps({"inputs": x.tolist()}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
    finally:
        stop_process(proc)
    probs = np.asarray(answer["predictions"])
    assert probs.shape == (6, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    np.testing.assert_allclose(probs, expected, atol=1e-5)  # calibrated: softmax(z / T)
    for name in [m for m in sys.modules if m == "servepkg" or m.startswith("servepkg.")]:
        del sys.modules[name]


BLOBS = """
import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from raysearch import DatasetSplits


def make_net(num_classes, input_shape, hidden=12):
    return nn.Sequential(nn.Linear(input_shape[0], hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


def blobs(data_dir, seed, val_fraction, n=600):
    # three clusters far apart: every validation sample is classified right
    rng = np.random.default_rng(0)
    y = np.arange(n) % 3
    x = rng.normal(scale=0.3, size=(n, 6)).astype(np.float32)
    x[np.arange(n), y] += 6.0
    parts = np.array_split(np.arange(n), [n // 2, 3 * n // 4])
    sets = [TensorDataset(torch.from_numpy(x[p]), torch.from_numpy(y[p])) for p in parts]
    return DatasetSplits(train=sets[0], val=sets[1], test=sets[2], num_classes=3)
"""
#: A space for the separable blobs: Adam, two epochs; the hidden width is searched.
BLOBS_SPACE = {"method": "ce", "model": {"hidden": {"low": 8, "high": 16}},
               "optimizer": {"name": "adam", "lr": 0.05}, "train": {"epochs": 2}}
DEGENERATE = ("validation split is perfectly classified; the calibrator cannot be fitted — "
              "exported without it")


@pytest.mark.integration
def test_a_notebook_sweep_is_exported_with_its_objects(ray_session, tmp_path):
    nb: dict = {"__name__": "__main__"}
    exec(BLOBS, nb)  # noqa: S102 (defined as a notebook cell defines them: in __main__)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    lines: list[str] = []
    raysearch.sweep(BLOBS_SPACE, model=nb["make_net"], dataset=nb["blobs"], num_samples=1,
                    name="nb", tracking_uri=uri, storage_path=str(tmp_path / "ray"),
                    progress=lines.append)
    doc = raysearch.export("nb", tracking_uri=uri)
    assert doc["config"]["model"]["name"] == "__main__:make_net"
    # the validation split is perfectly classified: the trial's run says so, tag and line
    run = MlflowClient(uri).get_run(doc["run_id"])
    assert run.data.metrics["val_accuracy"] == 1.0
    assert run.data.tags["raysearch.calibrator_degenerate"] == "ts"
    said = [line for line in lines if "validation split is perfectly classified" in line]
    assert len(said) == 1, lines
    assert "calibrator ts cannot be fitted" in said[0]

    # the CLI cannot rebuild __main__ objects: one line naming the Python call, nothing made
    cli = CliRunner().invoke(main, ["export", "nb", "--register", "nb-model",
                                    "--tracking-uri", uri])
    assert cli.exit_code == 2, cli.output
    assert cli.stderr.count("\n") == 1, cli.stderr
    assert "raysearch.export('nb', register=..., model=make_net, dataset=blobs)" in cli.stderr
    assert "has no attribute" not in cli.stderr
    assert MlflowClient(uri).search_model_versions("name='nb-model'") == []
    with pytest.raises(ValueError, match=r"raysearch\.export\('nb', register=\.\.\., "
                       r"model=make_net, dataset=blobs\)"):
        raysearch.export("nb", register="nb-model", tracking_uri=uri)

    # with the objects: registered, without the calibrator that cannot be fitted
    with pytest.warns(UserWarning, match=DEGENERATE):
        doc = raysearch.export("nb", register="nb-model", tracking_uri=uri,
                               model=nb["make_net"], dataset=nb["blobs"], loss="ce")
    assert doc["model"]["uri"] == "models:/nb-model/1"
    assert doc["model"]["calibrator"] == "none"
    assert doc["model"]["degenerate_calibrator"] == "ts"
    assert doc["model"]["code"] == []  # __main__ objects travel by value in the pickle
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model("models:/nb-model/1")
    assert model.metadata.metadata["calibrator_degenerate"] == "ts"
    test = nb["blobs"](None, 0, 0.1).test
    x = torch.stack([test[i][0] for i in range(len(test))]).numpy().astype(np.float64)
    _, _, test_logits = _stored(uri, doc["run_id"])
    np.testing.assert_allclose(model.predict(x), _softmax(test_logits), atol=1e-5)


@pytest.mark.integration
def test_the_cli_exports_a_perfectly_classified_trial_without_its_calibrator(
        ray_session, tmp_path, monkeypatch):
    (tmp_path / "sepdata.py").write_text(BLOBS)  # a module of the user's, next to them
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    raysearch.sweep(BLOBS_SPACE, model="sepdata:make_net", dataset="sepdata:blobs",
                    num_samples=1, name="sep", tracking_uri=uri,
                    storage_path=str(tmp_path / "ray"), progress=None)
    done = CliRunner().invoke(main, ["export", "sep", "--register", "sep-model",
                                     "--tracking-uri", uri])
    assert done.exit_code == 0, done.output
    said = [line for line in done.stderr.splitlines() if "perfectly classified" in line]
    assert said == [f"warning: {DEGENERATE}"], done.stderr
    assert "calibrator none" in done.output
    doc = raysearch.export("sep", tracking_uri=uri)
    model_dir = Path(MlflowClient(uri).download_artifacts(doc["run_id"], "model",
                                                          str(tmp_path / "dl")))
    assert (model_dir / "code" / "sepdata.py").is_file()  # a module file, carried as code
    for name in [m for m in sys.modules if m == "sepdata"]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def _tracking_uri_restored():
    before = mlflow.get_tracking_uri()
    yield
    mlflow.set_tracking_uri(before)
