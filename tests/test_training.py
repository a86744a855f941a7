import io
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from compare import assert_same_metrics
from torch.utils.data import Dataset, TensorDataset

from raysearch.config import RunConfig
from raysearch.metrics import ESTIMATOR_KEYS, TABLE_KEYS
from raysearch.training.data import DatasetSplits, load_dataset
from raysearch.training.run import DivergedError, TrainResult, evaluate, fit
from raysearch.tune.checkpoints import load_state

SUMMARY = ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier")
EPOCH_KEYS = {"train_loss", "train_accuracy"} | {f"val_{k}" for k in SUMMARY}
# the final model also gets the estimators of raysearch.metrics.estimator_summary and the
# papers' table metrics (raysearch.metrics.TABLE_KEYS)
FINAL_KEYS = EPOCH_KEYS | {f"test_{k}" for k in SUMMARY} | {
    f"{split}_{k}" for split in ("val", "test") for k in (*ESTIMATOR_KEYS, *TABLE_KEYS)}


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    """Train single-threaded, as trials do (and immune to oversubscribed CI machines)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def digits() -> DatasetSplits:
    return load_dataset("digits", seed=0)


@pytest.fixture(scope="module")
def three_epochs(digits):
    """A 3-epoch CE run of the default CNN, with everything on_epoch received."""
    calls = []
    cfg = RunConfig(loss={"name": "ce"}, model={"name": "cnn"}, epochs=3, seed=0)
    result = fit(cfg, data=digits, on_epoch=lambda e, m, s: calls.append((e, m, s)))
    return cfg, result, calls


@pytest.fixture(scope="module")
def two_epochs(digits):
    """A straight 2-epoch run, keeping the state of epoch 1 (for determinism and resume)."""
    states = {}
    cfg = RunConfig(loss={"name": "ce"}, model={"name": "cnn"}, epochs=2, seed=0)
    result = fit(cfg, data=digits, on_epoch=lambda e, m, s: states.setdefault(e, s))
    return cfg, result, states


def test_three_epoch_run_learns(three_epochs):
    _, result, _ = three_epochs
    assert isinstance(result, TrainResult)
    assert result.epochs_completed == 3
    assert result.metrics["val_accuracy"] > 0.8
    assert result.metrics["test_accuracy"] > 0.8
    assert set(result.metrics) == FINAL_KEYS


def test_on_epoch_calls(three_epochs):
    _, result, calls = three_epochs
    assert [e for e, _, _ in calls] == [1, 2, 3]
    for epoch, metrics, state in calls:
        assert set(metrics) == EPOCH_KEYS
        assert all(isinstance(v, float) for v in metrics.values())
        assert state["epoch"] == epoch
        assert {"epoch", "model", "optimizer", "scheduler"} <= set(state)
    # the final val metrics are those of the last epoch
    for key in EPOCH_KEYS:
        assert result.metrics[key] == calls[-1][1][key]
    # training improves
    assert calls[-1][1]["train_loss"] < calls[0][1]["train_loss"]


def test_states_are_snapshots(three_epochs):
    _, result, calls = three_epochs
    first = calls[0][2]["model"]
    final = result.model.state_dict()
    assert any(not torch.equal(first[k], final[k]) for k in final)


def test_epoch_states_copy_the_state_of_the_asked_epochs_only(digits, monkeypatch):
    import raysearch.training.run as run_module

    copied = []
    real = run_module._checkpoint
    monkeypatch.setattr(run_module, "_checkpoint",
                        lambda run, epoch: copied.append(epoch) or real(run, epoch))
    asked, calls = [], []
    cfg = RunConfig(loss={"name": "ce"}, epochs=3, seed=0)
    result = fit(cfg, data=digits, on_epoch=lambda e, m, s: calls.append((e, m, s)),
                 epoch_states=lambda e: asked.append(e) or e == 2)
    assert asked == [1, 2, 3]  # asked after each epoch, before on_epoch
    assert copied == [2]  # nothing copied for the others
    assert [e for e, _, _ in calls] == [1, 2, 3]
    assert calls[0][2] is None
    assert calls[2][2] is None
    assert calls[1][2]["epoch"] == 2
    # the state is the same as without the option: training resumes from it alike
    resumed = fit(cfg, data=digits, resume=calls[1][2])
    assert resumed.metrics["val_nll"] == result.metrics["val_nll"]


def test_cosine_schedule(three_epochs):
    cfg, _, calls = three_epochs
    for epoch, _, state in calls:
        # after epoch e the scheduler has stepped e times: lr = lr0 * (1 + cos(pi * e / E)) / 2
        expected = cfg.optimizer.lr * (1 + math.cos(math.pi * epoch / cfg.epochs)) / 2
        assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(expected, abs=1e-12)
        assert state["scheduler"]["last_epoch"] == epoch


def test_metric_ranges(three_epochs):
    _, result, calls = three_epochs
    for metrics in [result.metrics] + [m for _, m, _ in calls]:
        for key, value in metrics.items():
            assert math.isfinite(value), key
            if key.endswith(("_nll", "_loss")):
                assert value >= 0, key
            elif key.endswith("_brier"):
                assert 0 <= value <= 2, key
            else:
                assert 0 <= value <= 1, key


def test_logits_and_labels(three_epochs, digits):
    _, result, _ = three_epochs
    assert result.val_logits.dtype == np.float32
    assert result.val_logits.shape == (len(digits.val), 10)
    assert result.test_logits.shape == (len(digits.test), 10)
    assert result.val_labels.dtype == np.int64
    np.testing.assert_array_equal(result.val_labels, digits.val.tensors[1].numpy())
    np.testing.assert_array_equal(result.test_labels, digits.test.tensors[1].numpy())
    acc = float((result.test_logits.argmax(1) == result.test_labels).mean())
    assert acc == pytest.approx(result.metrics["test_accuracy"])


def test_evaluate_matches_fit(three_epochs, digits):
    _, result, _ = three_epochs
    model = result.model
    model.train()
    logits, labels = evaluate(model, digits.test, batch_size=100)
    assert model.training  # mode restored
    np.testing.assert_allclose(logits, result.test_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(labels, result.test_labels)


def test_evaluate_generic_dataset(three_epochs, digits):
    class Pairs(Dataset):
        def __init__(self, ds: TensorDataset) -> None:
            self.ds = ds

        def __len__(self) -> int:
            return len(self.ds)

        def __getitem__(self, i):
            x, y = self.ds[i]
            return x, int(y)

    _, result, _ = three_epochs
    logits, labels = evaluate(result.model, Pairs(digits.val), batch_size=64)
    assert logits.dtype == np.float32
    assert labels.dtype == np.int64
    np.testing.assert_allclose(logits, result.val_logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(result.model, digits.val, batch_size=0)


def test_deterministic(two_epochs):
    # a second run of the same config, loading its data itself (same split from cfg.seed),
    # gives bit-identical metrics and logits
    cfg, first, _ = two_epochs
    second = fit(cfg)
    assert_same_metrics(second.metrics, first.metrics)
    np.testing.assert_array_equal(second.test_logits, first.test_logits)


def test_resume_is_exact(two_epochs, digits, tmp_path):
    cfg, straight, states = two_epochs
    # round-trip through torch.save and the trainable's weights_only loader
    path = tmp_path / "state.pt"
    torch.save(states[1], path)
    state = load_state(path.read_bytes())
    seen = []
    resumed = fit(cfg, data=digits, resume=state, on_epoch=lambda e, m, s: seen.append(e))
    assert seen == [2]
    assert resumed.epochs_completed == 2
    # bit-identical: same weights, momentum buffers, lr, and the same batch order for epoch 2
    assert_same_metrics(resumed.metrics, straight.metrics)
    np.testing.assert_array_equal(resumed.val_logits, straight.val_logits)


def test_resume_after_last_epoch(two_epochs, digits):
    cfg, straight, states = two_epochs
    calls = []
    result = fit(cfg, data=digits, resume=states[2], on_epoch=lambda *a: calls.append(a))
    assert calls == []
    assert result.epochs_completed == 2
    assert_same_metrics(result.metrics, straight.metrics)


def test_resume_needs_epoch(digits):
    with pytest.raises(ValueError, match="resume"):
        fit(RunConfig(epochs=1), data=digits, resume={"model": {}})


def test_diverges_with_huge_lr(digits):
    cfg = RunConfig(loss={"name": "ce"}, model={"name": "cnn"},
                    optimizer={"lr": 1e6, "params": {"momentum": 0.9}}, epochs=2)
    with pytest.raises(DivergedError, match=r"epoch 1, batch \d+"):
        fit(cfg, data=digits)


def test_diverged_error_names_batch(digits, monkeypatch):

    class NaNAtBatch3(torch.nn.Module):
        calls = 0

        def forward(self, logits, targets):
            self.calls += 1
            loss = torch.nn.functional.cross_entropy(logits, targets)
            return loss * float("nan") if self.calls == 3 else loss

    with pytest.raises(DivergedError, match="nan at epoch 1, batch 3"):
        fit(RunConfig(model={"name": "mlp"}, epochs=1), data=digits, loss=NaNAtBatch3())


def test_custom_data_and_mlp():
    gen = torch.Generator().manual_seed(0)

    def split(n):
        y = torch.arange(n) % 3
        x = torch.randn(n, 2, 4, 4, generator=gen) + y.view(-1, 1, 1, 1).float()
        return TensorDataset(x, y)

    data = DatasetSplits(split(90), split(30), split(30), 3, (2, 4, 4), "toy")
    for model in ("mlp", "cnn"):
        result = fit(RunConfig(model={"name": model}, epochs=2, batch_size=16), data=data)
        assert result.test_logits.shape == (30, 3)
        assert set(result.metrics) == FINAL_KEYS


def test_unknown_model(digits):
    with pytest.raises(ValueError, match="Unknown model"):
        fit(RunConfig(model={"name": "nope"}, epochs=1), data=digits)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda(digits):
    result = fit(RunConfig(epochs=3), data=digits, device="cuda")
    assert result.metrics["val_accuracy"] > 0.8
    assert next(result.model.parameters()).is_cuda


def test_no_framework_imports():
    code = (
        "import sys\n"
        "import raysearch.training.data, raysearch.training.models, raysearch.training\n"
        "banned = [m for m in ('ray', 'mlflow', 'optuna', 'matplotlib') if m in sys.modules]\n"
        "assert not banned, banned\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- objectness-adaptive label smoothing (als): augmented crops with objectness per batch ---


class _RecordingALS(torch.nn.Module):
    """ObjectnessLabelSmoothing that records the side inputs fit passes per batch."""

    def __init__(self, **params):
        from raysearch.losses.objectness import ObjectnessLabelSmoothing

        super().__init__()
        self.inner = ObjectnessLabelSmoothing(**params)
        self.side_inputs = self.inner.side_inputs
        self.context_fraction = self.inner.context_fraction
        self.calls = []

    def forward(self, logits, targets, *, objectness=None, context=None):
        self.calls.append((len(targets), objectness, context))
        return self.inner(logits, targets, objectness=objectness, context=context)


@pytest.fixture(scope="module")
def als_run(digits):
    """A 2-epoch digits run of 'als' (beta=1), recording objectness, keeping the epoch-1 state."""
    loss = _RecordingALS(beta=1.0)
    states = {}
    cfg = RunConfig(loss={"name": "als", "params": {"beta": 1.0}}, epochs=2, seed=0)
    result = fit(cfg, data=digits, on_epoch=lambda e, m, s: states.setdefault(e, s), loss=loss)
    return cfg, loss, result, states


def test_als_fit_passes_objectness(als_run, digits):
    _, loss, result, _ = als_run
    assert set(result.metrics) == FINAL_KEYS
    assert result.metrics["val_accuracy"] > 0.5
    batches = math.ceil(len(digits.train) / 64)  # 1077 samples -> 17 batches per epoch
    assert len(loss.calls) == 2 * batches
    for size, objectness, context in loss.calls:
        assert objectness.shape == (size,)
        assert bool(((objectness >= 0) & (objectness <= 1)).all())
        assert context is None  # context_fraction = 0
    epoch1 = torch.cat([o for _, o, _ in loss.calls[:batches]])
    epoch2 = torch.cat([o for _, o, _ in loss.calls[batches:]])
    assert len(epoch1) == len(digits.train)
    # fresh crops every epoch; crops smaller than the ink box give objectness < 1
    assert not torch.equal(epoch1.sort().values, epoch2.sort().values)
    assert 0.5 < epoch1.mean().item() < 1.0
    # validation and test are not augmented
    np.testing.assert_array_equal(result.test_labels, digits.test.tensors[1].numpy())


def test_als_resume_is_exact(als_run, digits, monkeypatch):

    cfg, _, straight, states = als_run
    resumed = fit(cfg, data=digits, resume=states[1], loss=_RecordingALS(beta=1.0))
    assert_same_metrics(resumed.metrics, straight.metrics)


def test_als_context_samples(digits, monkeypatch):

    loss = _RecordingALS(beta=1.0, context_fraction=0.3)
    fit(RunConfig(loss={"name": "als"}, model={"name": "mlp"}, epochs=1), data=digits, loss=loss)
    context = torch.cat([c for _, _, c in loss.calls])
    objectness = torch.cat([o for _, o, _ in loss.calls])
    assert 0.2 < context.float().mean().item() < 0.4
    assert bool((objectness[context] == 0).all())


def test_als_needs_annotations(monkeypatch):

    toy = TensorDataset(torch.randn(30, 1, 4, 4), torch.arange(30) % 3)
    data = DatasetSplits(toy, toy, toy, 3, (1, 4, 4), "toy")
    with pytest.raises(ValueError, match="no object annotations"):
        fit(RunConfig(model={"name": "mlp"}, epochs=1), data=data, loss=_RecordingALS())


def test_checkpoint_holds_only_tensors_and_plain_containers(two_epochs, tmp_path):
    cfg, _, states = two_epochs
    buffer = io.BytesIO()
    torch.save(states[2], buffer)
    # weights_only=True accepts it as is: nothing but tensors, numbers, strings and containers
    state = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    assert state["epoch"] == 2
    assert sorted(state) == ["epoch", "metrics", "model", "optimizer", "scheduler"]
    assert all(isinstance(v, float) for v in state["metrics"].values())


def test_a_checkpoint_that_pickles_code_is_refused(tmp_path):
    buffer = io.BytesIO()
    torch.save({"epoch": 1, "model": Path("not a tensor")}, buffer)  # an arbitrary object
    with pytest.raises(ValueError, match="weights_only=True"):
        load_state(buffer.getvalue())
    buffer = io.BytesIO()
    torch.save({"model": {}}, buffer)
    with pytest.raises(ValueError, match="no 'epoch'"):
        load_state(buffer.getvalue())


def test_training_labels_are_checked_once_and_a_bad_label_still_fails(digits):
    import dataclasses

    from raysearch.training.loop import TrainFeed

    feed = TrainFeed(digits.train, torch.device("cpu"))
    k = digits.num_classes
    assert feed.labels_checked(k, -100)  # every label in [0, K): the losses skip their check
    assert not feed.labels_checked(k - 1, -100)  # the labels K - 1 lie outside [0, K - 1)
    assert not feed.labels_checked(k, int(feed.source.labels()[0]))  # a label is ignored
    x, y = digits.train.tensors
    y = y.clone()
    y[5] = k
    bad = dataclasses.replace(digits, train=TensorDataset(x, y))
    assert not TrainFeed(bad.train, torch.device("cpu")).labels_checked(k, -100)
    # the losses check every batch again and fail in one line
    with pytest.raises(ValueError, match=rf"class indices in \[0, {k}\).*got {k}"):
        fit(RunConfig(loss={"name": "ce"}, model={"name": "cnn"}, epochs=1, seed=0), data=bad)
