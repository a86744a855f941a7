"""Faults in checkpoints: a worker killed while writing one, and a truncated one in storage.

Real files, real ``tune.Checkpoint`` objects and, for the drills (marked slow), a real local Ray
with a real MLflow SQLite store:

- :func:`~raysearch.tune.checkpoints.resume_state` skips an unreadable ``state.pt`` (missing,
  truncated, corrupt) in one line naming the file, and falls back to the trial's newest
  readable older checkpoint folder, or to scratch;
- the drill ``kill-in-checkpoint``: the first attempt leaves a torn ``state.pt`` in its next
  checkpoint folder and SIGKILLs its own worker; the retry resumes from the previous complete
  checkpoint and ends where an uninterrupted run ends;
- the drill ``corrupt-checkpoint``: the first attempt truncates its newest checkpoint in
  storage and raises; the retry names that file in one line (the run's
  ``raysearch.checkpoint_skipped`` tag), resumes from the older checkpoint and ends where an
  uninterrupted run ends.
"""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
import torch
from drills import uninterrupted
from mlflow.tracking import MlflowClient
from ray import tune

from raysearch.config import RunConfig
from raysearch.tune.checkpoints import load_state, resume_state
from raysearch.tune.engine import run_sweep
from raysearch.tune.settings import SweepSettings
from raysearch.tune.trial_options import TrialOptions


def _state_bytes(epoch: int) -> bytes:
    buffer = io.BytesIO()
    torch.save({"epoch": epoch, "model": {"w": torch.full((4,), float(epoch))}}, buffer)
    return buffer.getvalue()


def _folder(trial: Path, index: int, data: bytes | None) -> Path:
    folder = trial / f"checkpoint_{index:06d}"
    folder.mkdir(parents=True)
    if data is not None:
        (folder / "state.pt").write_bytes(data)
    return folder


# -- resume_state on real checkpoint folders (fast) -----------------------------------------------

def test_a_readable_checkpoint_is_used_as_is(tmp_path):
    data = _state_bytes(3)
    folder = _folder(tmp_path / "trial", 2, data)
    resumed, line = resume_state(tune.Checkpoint(str(folder)))
    assert line is None
    assert resumed == data


def test_a_truncated_checkpoint_falls_back_to_the_newest_readable_older_one(tmp_path):
    trial = tmp_path / "trial"
    _folder(trial, 0, _state_bytes(1))
    _folder(trial, 1, _state_bytes(2))
    whole = _state_bytes(3)
    torn = _folder(trial, 2, whole[: len(whole) // 2])  # a copy cut off halfway
    _folder(trial, 3, _state_bytes(4))  # newer than the one Tune gave: never used
    resumed, line = resume_state(tune.Checkpoint(str(torn)))
    assert load_state(resumed)["epoch"] == 2  # checkpoint_000001, the newest older readable
    assert "\n" not in line
    assert line.startswith(f"checkpoint {torn / 'state.pt'} cannot be read (")
    assert line.endswith(f"resuming from the older {trial / 'checkpoint_000001'} (epoch 2)")


def test_missing_and_corrupt_checkpoints_start_the_trial_from_scratch(tmp_path):
    trial = tmp_path / "trial"
    _folder(trial, 0, b"not a zip archive at all")  # corrupt
    _folder(trial, 1, None)  # no state.pt: a folder whose copy never began
    empty = _folder(trial, 2, None)
    resumed, line = resume_state(tune.Checkpoint(str(empty)))
    assert resumed is None
    assert "\n" not in line
    assert line == (f"checkpoint {empty / 'state.pt'} cannot be read (missing); skipped; no "
                    f"older readable checkpoint (checkpoint_000001, checkpoint_000000 unreadable "
                    f"too): the trial starts from scratch")


def test_a_checkpoint_that_is_not_a_training_state_is_skipped(tmp_path):
    trial = tmp_path / "trial"
    _folder(trial, 0, _state_bytes(2))
    buffer = io.BytesIO()
    torch.save({"model": {}}, buffer)  # loads, but holds no epoch
    wrong = _folder(trial, 1, buffer.getvalue())
    resumed, line = resume_state(tune.Checkpoint(str(wrong)))
    assert load_state(resumed)["epoch"] == 2
    assert "is not a training state (no 'epoch')" in line


def test_unreadable_older_checkpoints_are_passed_over_and_named(tmp_path):
    trial = tmp_path / "trial"
    _folder(trial, 3, _state_bytes(4))
    whole = _state_bytes(5)
    _folder(trial, 5, whole[:100])  # two older ones torn as well
    _folder(trial, 6, whole[: len(whole) - 1])
    torn = _folder(trial, 7, whole[: len(whole) // 2])
    resumed, line = resume_state(tune.Checkpoint(str(torn)))
    assert load_state(resumed)["epoch"] == 4
    assert line.endswith(f"resuming from the older {trial / 'checkpoint_000003'} (epoch 4) "
                         f"(also unreadable: checkpoint_000006, checkpoint_000005)")


def test_an_unknown_fault_kind_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown fault_kind 'explode'; choose from raise, "
                                         r"kill-in-checkpoint, corrupt-checkpoint$"):
        SweepSettings(fault_kind="explode")
    with pytest.raises(ValueError, match=r"needs one-process trials \(workers_per_trial 1\), "
                                         r"got 2$"):
        SweepSettings(fault_kind="kill-in-checkpoint", workers_per_trial=2)
    SweepSettings(fault_kind="corrupt-checkpoint")  # a known kind
    # the trial's options refuse it too, when they are made
    with pytest.raises(ValueError, match=r"^unknown fault_kind 'explode'"):
        TrialOptions(fault_kind="explode")
    with pytest.raises(ValueError, match=r"needs a one-process trial \(workers 1\), got workers 2"):
        TrialOptions(fault_kind="corrupt-checkpoint", workers=2)


# -- the drills on a real Ray (slow: `python -m pytest -m slow tests/test_checkpoint_faults.py`) --

def _child(uri: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id], max_results=50)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 1
    return client, children[0]


def _assert_as_uninterrupted(client: MlflowClient, run) -> None:
    """Each epoch logged once, and every logged value equal to a run that never failed."""
    run_id = run.info.run_id
    for key in ("val_accuracy", "val_ece", "train_loss"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == [1, 2, 3, 4, 5], key
    cfg = RunConfig.from_dict(json.loads(run.data.tags["raysearch.config"]))
    straight, per_epoch = uninterrupted(cfg)
    logged = client.get_run(run_id).data.metrics
    for key in ("val_accuracy", "val_ece", "val_nll", "test_accuracy", "test_ece", "test_nll"):
        assert logged[key] == pytest.approx(straight.metrics[key], abs=1e-12), key
    history = {m.step: m.value for m in client.get_metric_history(run_id, "val_nll")}
    assert history == pytest.approx({e + 1: m["val_nll"] for e, m in enumerate(per_epoch)},
                                    abs=1e-12)


def _sweep(tmp_path: Path, name: str, **drill) -> tuple[MlflowClient, object]:
    settings = SweepSettings(num_samples=1, max_concurrent=1, epochs=5, max_failures=1,
                             posthoc=(), name=name, storage_path=str(tmp_path / "ray"),
                             tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}", **drill)
    result = run_sweep("ce", settings, progress=lambda line: None)
    assert bool(result.trials["complete"].iloc[0])
    return _child(settings.tracking_uri)


@pytest.mark.slow
@pytest.mark.integration
def test_a_worker_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(
        ray_session, tmp_path):
    # checkpoints at epochs 2 (checkpoint_000000) and 4; the first attempt dies (SIGKILL) while
    # writing epoch 4's, leaving half of its state.pt in checkpoint_000001; Tune never
    # registered it, so the retry resumes from epoch 2 and writes epoch 4 there again
    torn: dict[str, int] = {}  # unreadable state.pt files seen in the storage -> size
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for path in (tmp_path / "ray").glob("drill-kill/*/checkpoint_*/state.pt"):
                try:
                    load_state(path.read_bytes())
                except (OSError, ValueError):
                    torn.setdefault(path.parent.name, path.stat().st_size)
            done.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        client, run = _sweep(tmp_path, "drill-kill", checkpoint_every=2, fault_epoch=4,
                             fault_kind="kill-in-checkpoint")
    finally:
        done.set()
        watcher.join()
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["raysearch.outcome"] == "complete"
    assert tags["raysearch.retries"] == "1"
    assert tags["raysearch.resumed_from_epoch"] == "2"
    assert "raysearch.checkpoint_skipped" not in tags  # the torn one was never Tune's
    assert "fault drill" not in tags["raysearch.last_failure"]  # a dead worker, not a raise
    # the torn file was there, half the size of the epoch-4 state the retry wrote in its place
    assert "checkpoint_000001" in torn, torn
    (final,) = (tmp_path / "ray").glob("drill-kill/*/checkpoint_000001/state.pt")
    assert load_state(final.read_bytes())["epoch"] == 4
    assert torn["checkpoint_000001"] == final.stat().st_size // 2
    _assert_as_uninterrupted(client, run)


@pytest.mark.slow
@pytest.mark.integration
def test_a_truncated_checkpoint_is_skipped_for_the_last_good_one(ray_session, tmp_path):
    # a checkpoint every epoch, 2 kept: after epoch 3, checkpoint_000001 (epoch 2) and
    # checkpoint_000002 (epoch 3) are left; the first attempt truncates checkpoint_000002's
    # state.pt and raises, so the retry skips it and resumes from epoch 2
    client, run = _sweep(tmp_path, "drill-corrupt", checkpoint_every=1, fault_epoch=3,
                         fault_kind="corrupt-checkpoint")
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["raysearch.outcome"] == "complete"
    assert tags["raysearch.retries"] == "1"
    assert tags["raysearch.resumed_from_epoch"] == "2"
    (trial,) = {p.parent for p in (tmp_path / "ray" / "drill-corrupt").glob("*/checkpoint_*")}
    bad = trial / "checkpoint_000002" / "state.pt"
    assert f"truncated {bad}" in tags["raysearch.last_failure"]
    line = tags["raysearch.checkpoint_skipped"]
    assert "\n" not in line
    assert line.startswith(f"checkpoint {bad} cannot be read (")
    assert line.endswith(f"resuming from the older {trial / 'checkpoint_000001'} (epoch 2)")
    _assert_as_uninterrupted(client, run)
