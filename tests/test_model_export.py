"""``raysearch export --register`` / ``--with-weights``: the selected trial as a pyfunc model.

A real digits sweep on the session's local Ray, a real MLflow SQLite store with its model
registry; the model is loaded back through ``mlflow.pyfunc.load_model`` and its predictions are
checked against the trial's own stored test logits: softmax(logits / T) with the temperature
fitted on the trial's validation logits (Guo et al. 2017, temperature scaling).
"""

from __future__ import annotations

import mlflow
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from torch import nn

import raysearch
from raysearch.calibration import fit_calibrator
from raysearch.cli.commands import main
from raysearch.config import RunConfig
from raysearch.tracking import trial_outputs
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
    np.testing.assert_allclose(model.predict(x), expected, atol=1e-6)


@pytest.fixture(autouse=True)
def _tracking_uri_restored():
    before = mlflow.get_tracking_uri()
    yield
    mlflow.set_tracking_uri(before)
