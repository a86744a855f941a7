"""An out-of-memory error in a run fails it with one line, and only that trial of a sweep.

The models here are plug-ins of a user's own: their forward pass raises the error torch raises
when an allocation fails (``torch.OutOfMemoryError``) once a batch is larger than a limit, as a
network too big for the GPU does at a large batch size.
"""

import textwrap

import pytest
import torch
from mlflow import MlflowClient
from torch import nn

import raysearch
from raysearch.config import RunConfig
from raysearch.training.data import DatasetSplits, load_dataset
from raysearch.training.run import EVAL_BATCH_SIZE, OutOfMemoryRunError, fit

OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
ORIGINAL = "CUDA out of memory. Tried to allocate 2.00 GiB"

#: A plug-in model, defined as a notebook cell defines it (in ``__main__``), so that it travels
#: to the trials by value.
MODEL = """
import torch
from torch import nn


class BatchLimited(nn.Module):
    '''A linear classifier whose forward pass runs out of memory above `limit` samples.'''

    def __init__(self, num_classes, input_shape, limit=10_000, eval_only=False):
        super().__init__()
        self.fc = nn.Linear(int(torch.tensor(input_shape).prod()), num_classes)
        self.limit, self.eval_only = limit, eval_only

    def forward(self, x):
        if len(x) > self.limit and not (self.eval_only and self.training):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.fc(x.flatten(1))
"""


def _model_class() -> type[nn.Module]:
    namespace: dict = {"__name__": "__main__"}
    exec(textwrap.dedent(MODEL), namespace)  # noqa: S102 (the test's own source)
    return namespace["BatchLimited"]


@pytest.fixture(scope="module")
def digits() -> DatasetSplits:
    return load_dataset("digits", seed=0)


def _fit_limited(digits: DatasetSplits, **params) -> OutOfMemoryRunError:
    cfg = RunConfig(loss={"name": "ce"}, model={"name": "limited", "params": params}, epochs=2,
                    batch_size=64, seed=0)
    with pytest.raises(OutOfMemoryRunError) as info:
        fit(cfg, data=digits, components={"models": {"limited": _model_class()}})
    return info.value


def test_training_out_of_memory_is_one_line(digits):
    error = _fit_limited(digits, limit=32)  # every training batch of 64 > 32 samples
    # the first batch of epoch 1 on the CPU, whose run already trains in float32
    assert str(error) == (
        "CUDA out of memory at batch size 64 on cpu (training, epoch 1): lower batch_size, use "
        "precision bf16, or fewer trials per GPU (gpus_per_trial)")
    assert "\n" not in str(error)
    assert isinstance(error, RuntimeError)
    assert isinstance(error.__cause__, OOM)
    assert str(error.__cause__) == ORIGINAL


def test_the_batch_and_the_run_are_dropped(digits):
    error = _fit_limited(digits, limit=32)
    frames = {}
    tb = error.__cause__.__traceback__
    while tb is not None:
        frames[tb.tb_frame.f_code.co_name] = tb.tb_frame
        tb = tb.tb_next
    assert {"fit", "_epochs", "train_pass", "forward"} <= set(frames)
    assert frames["forward"].f_locals == {}  # the batch x and the model are released
    assert frames["train_pass"].f_locals == {}
    assert "run" not in frames["fit"].f_locals  # the model, optimiser and data on the device


def test_evaluation_out_of_memory_is_one_line(digits):
    # trains (batches of 64 <= 100) but the validation pass predicts all 360 samples at once
    assert len(digits.val) == 360 < EVAL_BATCH_SIZE
    error = _fit_limited(digits, limit=100, eval_only=True)
    assert str(error) == (
        "CUDA out of memory at batch size 360 on cpu (validation after epoch 1): use a smaller "
        "model, or fewer trials per GPU (gpus_per_trial)")
    assert isinstance(error.__cause__, OOM)
    assert str(error.__cause__) == ORIGINAL


def test_a_sweep_fails_the_trial_that_runs_out_of_memory(ray_session, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    result = raysearch.sweep(
        {"method": "ce", "model": {"limit": {"choices": [32, 10_000]}},
         "train": {"epochs": 1, "batch_size": 64}},
        model=_model_class(), num_samples=2, seed=0, sampler="random", name="oom",
        tracking_uri=uri, storage_path=str(tmp_path / "ray"), progress=None)
    trials = result.trials
    assert len(trials) == 2
    client = MlflowClient(uri)
    children = client.search_runs(
        [client.get_experiment_by_name("raysearch").experiment_id],
        filter_string="tags.`mlflow.parentRunId` = '" + result.parent_run_id + "'")
    outcome = {c.data.params["model.limit"]: c for c in children}
    assert set(outcome) == {"32", "10000"}, "seed 0 draws both limits"
    failed, done = outcome["32"], outcome["10000"]
    assert failed.info.status == "FAILED"
    # the error's last traceback line: its class, then the one line (no traceback, no cause)
    assert failed.data.tags["raysearch.error"] == (
        "raysearch.training.divergence.OutOfMemoryRunError: CUDA out of memory at batch size 64 "
        "on cpu (training, epoch 1): lower batch_size, use precision bf16, or fewer trials per "
        "GPU (gpus_per_trial)")
    assert failed.data.tags["raysearch.outcome"] == "error"
    assert done.info.status == "FINISHED"
    assert "test_ece" in done.data.metrics
