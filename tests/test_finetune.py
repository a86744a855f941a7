"""Fine-tuning from pretrained weights: `RunConfig.pretrained`, a frozen backbone, a head lr,
and `raysearch sweep --pretrained` (the weights' sha256 in MLflow, bad weights in one line)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from raysearch.cli.commands import main
from raysearch.config import RunConfig
from raysearch.training.models import build_model
from raysearch.training.models.pretrained import head_parameter_names
from raysearch.training.run import fit


def _weights(tmp_path, num_classes: int):
    """A digits `cnn` state dict with `num_classes` outputs, saved as a plain state dict."""
    torch.manual_seed(123)
    model = build_model("cnn", num_classes=num_classes, input_shape=(1, 8, 8))
    path = tmp_path / f"cnn{num_classes}.pt"
    torch.save(model.state_dict(), path)
    return path, model.state_dict()


def test_frozen_backbone_keeps_the_pretrained_weights_and_trains_the_head(tmp_path):
    path, state = _weights(tmp_path, 5)  # 5 classes: digits has 10, so the head is replaced
    cfg = RunConfig(model={"pretrained": str(path), "freeze_backbone_epochs": 1},
                    optimizer={"lr": 0.05}, epochs=1)
    result = fit(cfg)
    trained = result.model.state_dict()
    head = set(head_parameter_names(result.model))
    assert head  # the last Linear
    for name, value in state.items():
        if name in head or not value.is_floating_point() or "running" in name:
            continue  # the head is new; BatchNorm statistics still update while frozen
        assert torch.equal(trained[name], value), name
    for name in head:
        assert trained[name].shape[0] == 10


def test_the_backbone_trains_after_the_frozen_epochs_and_head_lr_applies(tmp_path):
    path, state = _weights(tmp_path, 10)
    frozen_then_free = fit(RunConfig(model={"pretrained": str(path), "freeze_backbone_epochs": 1},
                                     epochs=2))
    conv = next(n for n, v in state.items() if v.ndim == 4)
    assert not torch.equal(frozen_then_free.model.state_dict()[conv], state[conv])
    # a head learning rate of ~0 leaves the pretrained head where it was
    still = fit(RunConfig(model={"pretrained": str(path), "head_lr": 1e-12}, epochs=1))
    head = head_parameter_names(still.model)
    for name in head:
        assert torch.allclose(still.model.state_dict()[name], state[name], atol=1e-9)
    assert not torch.equal(still.model.state_dict()[conv], state[conv])


def test_pretrained_config_errors():
    with pytest.raises(ValueError, match="head_lr"):
        RunConfig(model={"head_lr": 0.0})
    with pytest.raises(ValueError, match="freeze_backbone_epochs"):
        RunConfig(model={"freeze_backbone_epochs": -1})
    with pytest.raises(ValueError, match="not both"):
        RunConfig(model={"pretrained": "a.pt", "params": {"pretrained_backbone": "b.pt"}})


@pytest.mark.integration
def test_sweep_with_pretrained_weights_logs_their_sha256(ray_session, tmp_path, sqlite_uri):
    path, _ = _weights(tmp_path, 7)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    result = CliRunner().invoke(main, [
        "sweep", "ls", "-n", "2", "--epochs", "1", "--pretrained", str(path),
        "--freeze-backbone-epochs", "1", "--name", "ft", "--tracking-uri", sqlite_uri,
        "--storage-path", str(tmp_path / "ray")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "classification head replaced" in result.output
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name("raysearch").experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.data.params["data_pretrained_sha256"] == digest
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2
    for child in children:
        assert child.data.params["pretrained"] == str(path.resolve())
        assert child.data.params["pretrained_sha256"] == digest
        assert child.data.params["freeze_backbone_epochs"] == "1"
        assert child.data.tags["raysearch.complete"] == "true"


def test_bad_weights_fail_in_one_line(tmp_path, sqlite_uri):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"junk")
    for weights, expected in ((str(junk), "junk.pt"), (str(tmp_path / "none.pt"), "none.pt"),
                              ("ResNet18_Weights.IMAGENET1K_V1", "--download")):
        out = CliRunner().invoke(main, ["sweep", "ls", "--pretrained", weights,
                                        "--tracking-uri", sqlite_uri],
                                 env={"TORCH_HOME": str(tmp_path / "torch")})
        assert out.exit_code == 2, out.output
        assert expected in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1, out.stderr


def test_adam_optimizer_as_mbls_trains_20_newsgroups():
    states = []
    result = fit(RunConfig(optimizer={"name": "adam", "lr": 1e-3, "weight_decay": 0.0}, epochs=1),
                 on_epoch=lambda epoch, metrics, state: states.append(state))
    group = states[0]["optimizer"]["param_groups"][0]
    assert group["betas"] == (0.9, 0.999)
    assert group["initial_lr"] == pytest.approx(1e-3)
    assert 0.0 <= result.metrics["val_ece"] <= 1.0
    # any torch.optim class works by name; a misspelt one is a one-line error with a suggestion
    with pytest.raises(ValueError, match="Unknown optimizer 'rmsprp' \\(did you mean rmsprop"):
        fit(RunConfig(optimizer={"name": "rmsprp"}, epochs=1))
