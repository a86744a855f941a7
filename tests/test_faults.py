"""Faults: retried trials, a dead worker node, a killed driver and ``sweep --resume``.

Real Ray (the session's local Ray, or a ``ray.cluster_utils.Cluster`` the test starts), real
MLflow SQLite stores and Tune checkpoints on disk. What is checked, fault by fault:

- a trial that raises once (the fault drill ``fault_epoch``) is retried from its last
  checkpoint: one MLflow run, no epoch logged twice, a retry count, and the same final metrics
  as a run that never failed; with ``max_failures=0`` it stays FAILED;
- a worker node killed mid-trial: the trial goes on from its checkpoint on the other node;
- the driver SIGKILLed after two trials finished: ``sweep --resume`` completes the sweep with
  every trial once, nothing left RUNNING, and the finished trials untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from clusters import start_cluster
from drills import first_reports, uninterrupted
from mlflow.tracking import MlflowClient

from raysearch.cli.commands import main
from raysearch.config import RunConfig
from raysearch.tune.engine import run_sweep
from raysearch.tune.settings import SweepSettings

pytestmark = pytest.mark.integration

RAYSEARCH = [sys.executable, "-m", "raysearch.cli"]


def _runs(uri: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch")
    if exp is None:
        return client, [], []
    runs = client.search_runs([exp.experiment_id], max_results=200)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return client, parents, children


def _steps(client: MlflowClient, run_id: str, key: str = "val_accuracy") -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _drill(tmp_path, name: str, max_failures: int):
    settings = SweepSettings(
        num_samples=1, max_concurrent=1, epochs=5, checkpoint_every=2, fault_epoch=3,
        max_failures=max_failures, posthoc=(), name=name, storage_path=str(tmp_path / "ray"),
        tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    lines: list[str] = []
    result = run_sweep("ce", settings, progress=lines.append)
    client, _, children = _runs(settings.tracking_uri)
    assert len(children) == 1
    return result, client, children[0], lines


def test_a_trial_that_raises_is_retried_from_its_checkpoint(ray_session, tmp_path):
    # checkpoints at epochs 2 and 4; the first attempt raises after reporting epoch 3, so the
    # retry resumes from epoch 2 and trains epoch 3 again
    result, client, run, lines = _drill(tmp_path, "drill", max_failures=1)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["raysearch.outcome"] == "complete"
    assert tags["raysearch.retries"] == "1"
    assert tags["raysearch.resumed_from_epoch"] == "2"
    assert "fault drill" in tags["raysearch.last_failure"]
    for key in ("val_accuracy", "val_ece", "train_loss"):
        assert _steps(client, run.info.run_id, key) == [1, 2, 3, 4, 5], key
    assert any("retrying from its last checkpoint (retry 1 of 1)" in ln for ln in lines)
    assert any("after 1 retry" in ln for ln in lines)
    assert bool(result.trials["complete"].iloc[0])

    # the retried trial ends exactly where an uninterrupted run of its config ends
    cfg = RunConfig.from_dict(json.loads(tags["raysearch.config"]))
    straight, per_epoch = uninterrupted(cfg)
    logged = client.get_run(run.info.run_id).data.metrics
    for key in ("val_accuracy", "val_ece", "val_nll", "test_accuracy", "test_ece", "test_nll"):
        assert logged[key] == pytest.approx(straight.metrics[key], abs=1e-12), key
    # and so is every epoch it logged (epoch 3 from the first attempt, 4-5 from the retry)
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val_nll")}
    assert history == pytest.approx({e + 1: m["val_nll"] for e, m in enumerate(per_epoch)},
                                    abs=1e-12)


def test_without_retries_the_failed_trial_stays_failed(ray_session, tmp_path):
    _, client, run, lines = _drill(tmp_path, "no-retry", max_failures=0)
    assert run.info.status == "FAILED"
    assert run.data.tags["raysearch.outcome"] == "error"
    assert "fault drill" in run.data.tags["raysearch.error"]
    assert "raysearch.retries" not in run.data.tags
    assert _steps(client, run.info.run_id) == [1, 2, 3]
    assert any("FAILED" in ln for ln in lines)


def _poll(uri: str, proc: subprocess.Popen, ready, timeout: float = 240.0):
    """Poll the MLflow store until ``ready(client, children)`` is true; returns its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the sweep ended before the fault was injected"
        time.sleep(0.3)
        try:
            client, _, children = _runs(uri)
            value = ready(client, children)
        except Exception:  # noqa: BLE001 (the store is being created or written)
            continue
        if value:
            return value
    raise AssertionError("the sweep never reached the point of the fault")


def _start_sweep(cluster, tmp_path, name: str, trials: int, epochs: int, *,
                 uri: str | None = None, env: dict[str, str] | None = None):
    """``raysearch sweep ce`` on `cluster` in a subprocess (2 trials at a time, 1 CPU each).

    Every epoch is checkpointed, hence reported: the tests inject their faults at epochs they
    read from MLflow. `uri`: the tracking URI (default: a SQLite store in `tmp_path`); `env`:
    extra environment variables of the driver.

    Returns the tracking URI, the options a ``--resume`` needs, and the process (its output
    goes to ``first.log``).
    """
    uri = uri or f"sqlite:///{tmp_path / 'mlruns.db'}"
    common = ["--tracking-uri", uri, "--address", cluster.address]
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [*RAYSEARCH, "sweep", "ce", "--num-samples", str(trials), "--max-concurrent", "2",
         "--epochs", str(epochs), "--name", name, "--storage-path", str(tmp_path / "ray"),
         "--posthoc", "none", "--checkpoint-every", "1", *common],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return uri, common, proc


def test_a_dead_worker_node_is_survived(tmp_path):
    cluster = start_cluster(1, 1)
    try:
        victim_node = cluster.list_all_nodes()[1]
        # 2 concurrent 1-CPU trials on 2 one-CPU nodes: one trial per node
        uri, _, proc = _start_sweep(cluster, tmp_path, "node-loss", trials=2, epochs=30)

        def on_victim(client, children):
            for run in children:
                if run.data.tags.get("raysearch.node_id") == victim_node.node_id and \
                        max(_steps(client, run.info.run_id), default=0) >= 3:
                    return run.info.run_id
            return None

        victim = _poll(uri, proc, on_victim)
        cluster.remove_node(victim_node, allow_graceful=False)  # its raylet and workers die
        assert proc.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
        out = (tmp_path / "first.log").read_text()
        client, parents, children = _runs(uri)
        assert len(parents) == 1
        assert len(children) == 2
        assert all(c.info.status == "FINISHED" for c in children)
        run = client.get_run(victim)
        # default --max-failures with --address: 2; the trial was retried once, from a
        # checkpoint (not from scratch), on the surviving head node
        assert run.data.tags["raysearch.retries"] == "1"
        assert int(run.data.tags["raysearch.resumed_from_epoch"]) >= 3
        assert run.data.tags["raysearch.node_id"] == cluster.head_node.node_id
        assert run.data.tags["raysearch.complete"] == "true"
        assert _steps(client, victim) == list(range(1, 31))
        assert "retrying from its last checkpoint (retry 1 of 2)" in out
        assert "2/2 trials complete" in out
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def one_node():
    cluster = start_cluster(2)
    yield cluster
    cluster.shutdown()


@pytest.mark.slow  # a kill drill of about a minute: nightly, with the other drills
def test_resume_after_the_driver_was_killed(one_node, tmp_path):
    uri, common, proc = _start_sweep(one_node, tmp_path, "killed", trials=4, epochs=20)

    def two_finished(client, children):
        done = [c for c in children if c.info.status == "FINISHED"]
        return {c.info.run_id: c.info.end_time for c in done} if len(done) >= 2 else None

    finished = _poll(uri, proc, two_finished)
    os.kill(proc.pid, signal.SIGKILL)  # as a lost SSH session or the OOM killer would
    proc.wait()
    client, parents, children = _runs(uri)
    assert len(parents) == 1
    assert parents[0].info.status == "RUNNING"
    parent_id = parents[0].info.run_id

    # the name is taken: a new sweep under it is refused (before Ray), pointing at --resume
    again = CliRunner().invoke(main, ["sweep", "ce", "--name", "killed", *common])
    assert again.exit_code == 2
    assert again.stderr.count("\n") == 1, again.stderr
    assert "raysearch sweep --resume killed" in again.stderr

    resumed = subprocess.run([*RAYSEARCH, "sweep", "--resume", "killed", *common],
                             capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming sweep killed" in resumed.stdout, resumed.stdout
    assert "4/4 trials complete" in resumed.stdout, resumed.stdout

    client, parents, children = _runs(uri)
    assert [p.info.run_id for p in parents] == [parent_id]  # reopened, not recreated
    assert parents[0].info.status == "FINISHED"
    trial_ids = Counter(c.data.tags["raysearch.trial_id"] for c in children)
    assert len(trial_ids) == 4
    assert set(trial_ids.values()) == {1}
    assert all(c.info.status == "FINISHED" for c in children)
    assert all(c.data.tags["raysearch.complete"] == "true" for c in children)
    for child in children:
        assert _steps(client, child.info.run_id) == list(range(1, 21))
    # the trials that had finished were not trained again
    ends = {c.info.run_id: c.info.end_time for c in children}
    for run_id, end in finished.items():
        assert ends[run_id] == end
    # the table of the resumed sweep holds every trial once
    table = client.download_artifacts(parent_id, "trials.parquet", str(tmp_path))
    frame = pd.read_parquet(table)
    assert sorted(frame["trial_id"]) == sorted(trial_ids)

    # a finished sweep has nothing to resume
    done = CliRunner().invoke(main, ["sweep", "--resume", "killed", *common])
    assert done.exit_code == 2
    assert "already finished" in done.stderr


def test_ctrl_c_then_resume(one_node, tmp_path):
    uri, common, proc = _start_sweep(one_node, tmp_path, "ctrl-c", trials=2, epochs=20)

    def both_training(client, children):
        steps = [max(_steps(client, c.info.run_id), default=0) for c in children]
        return len(steps) == 2 and min(steps) >= 3

    _poll(uri, proc, both_training)
    proc.send_signal(signal.SIGINT)  # Ctrl-C once: Tune stops the trials and returns
    assert proc.wait(timeout=120) == 130
    out = (tmp_path / "first.log").read_text()
    assert "`raysearch sweep --resume ctrl-c` continues the sweep" in out
    client, parents, children = _runs(uri)
    assert parents[0].info.status == "KILLED"
    assert [c.info.status for c in children] == ["KILLED", "KILLED"]
    assert {c.data.tags["raysearch.outcome"] for c in children} == {"interrupted"}

    # a folder that does not hold this sweep is refused in one line, before Ray starts
    (tmp_path / "other").mkdir()
    wrong = subprocess.run([*RAYSEARCH, "sweep", "--resume", "ctrl-c", "--storage-path",
                            str(tmp_path / "other"), *common],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2, wrong.stdout[-2000:] + wrong.stderr[-2000:]
    assert wrong.stderr.strip().count("\n") == 0
    assert "does not hold sweep 'ctrl-c'" in wrong.stderr
    assert str(tmp_path / "ray") in wrong.stderr  # the path it was started with
    # the storage moved (another disk, another mount point): --storage-path says where it is now
    (tmp_path / "ray").rename(tmp_path / "moved")
    # and the checkpoint Tune's snapshot names for one trial is gone (deleted by Tune when it
    # registered a newer one, just before the driver died): it resumes from the newest one kept
    from ray.tune import ExperimentAnalysis

    trial = ExperimentAnalysis(str(tmp_path / "moved" / "ctrl-c")).trials[0]
    shutil.rmtree(trial.checkpoint.path)
    resumed = subprocess.run([*RAYSEARCH, "sweep", "--resume", "ctrl-c", "--storage-path",
                              str(tmp_path / "moved"), *common],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"-> {tmp_path / 'moved'}" in resumed.stdout
    assert f"trial {trial.trial_id}: its checkpoint {Path(trial.checkpoint.path).name} was " \
        "deleted after Tune's last snapshot; resuming from checkpoint_" in resumed.stdout
    client, parents, children = _runs(uri)
    local = client.download_artifacts(parents[0].info.run_id, "sweep.json", str(tmp_path))
    record = json.loads(Path(local).read_text())
    assert record["storage_path"] == str(tmp_path / "moved")  # later resumes look there
    assert parents[0].info.status == "FINISHED"
    assert [c.info.status for c in children] == ["FINISHED", "FINISHED"]
    for child in children:
        assert child.data.tags["raysearch.outcome"] == "complete"
        assert "raysearch.error" not in child.data.tags  # cleared when it was reopened
        assert int(child.data.tags["raysearch.resumed_from_epoch"]) >= 1
        assert _steps(client, child.info.run_id) == list(range(1, 21))


# -- drills that take minutes (marked slow: `python -m pytest -m slow`, run nightly) --------------

def _assert_whole(uri: str, tmp_path: Path, name: str, trials: int, epochs: int) -> str:
    """The sweep's record is whole: one child per trial, each epoch once and equal to Tune's.

    Returns the parent run id.
    """
    client, parents, children = _runs(uri)
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    trial_ids = Counter(c.data.tags["raysearch.trial_id"] for c in children)
    assert len(trial_ids) == trials, trial_ids
    assert set(trial_ids.values()) == {1}, trial_ids
    for child in children:
        assert child.info.status == "FINISHED", child.data.tags.get("raysearch.error")
        assert child.data.tags["raysearch.outcome"] == "complete"
        assert child.data.tags["raysearch.recorded"] == "true"
        tid = child.data.tags["raysearch.trial_id"]
        for key in ("val_accuracy", "val_ece", "train_loss"):
            history = client.get_metric_history(child.info.run_id, key)
            assert sorted(m.step for m in history) == list(range(1, epochs + 1)), (tid, key)
            assert {m.step: m.value for m in history} == \
                first_reports(tmp_path / "ray" / name, tid, key), (tid, key)
        assert "test_ece" in child.data.metrics
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"trials.parquet", "pareto.png", "best_config.yaml"} <= artifacts
    table = client.download_artifacts(parent.info.run_id, "trials.parquet", str(tmp_path))
    assert sorted(pd.read_parquet(table)["trial_id"]) == sorted(trial_ids)
    return parent.info.run_id


def _resume_whole(uri: str, tmp_path: Path, common: list[str], name: str, trials: int,
                  epochs: int, timeout: int) -> None:
    """``sweep --resume NAME`` completes every trial, the record is whole, a sync adds nothing."""
    resumed = subprocess.run([*RAYSEARCH, "sweep", "--resume", name, *common],
                             capture_output=True, text=True, timeout=timeout)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"{trials}/{trials} trials complete" in resumed.stdout, resumed.stdout
    _assert_whole(uri, tmp_path, name, trials=trials, epochs=epochs)
    _sync_changes_nothing(common, name)


def _sync_changes_nothing(common: list[str], name: str) -> None:
    again = subprocess.run([*RAYSEARCH, "sync", name, *common[:2]], capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"sync {name}: MLflow already held every record" in again.stdout, again.stdout


@pytest.mark.slow
def test_an_mlflow_outage_across_the_sweeps_end_is_repaired_by_sync(one_node, tmp_path):
    from clusters import free_port, start_mlflow_server, stop_process

    root, port = tmp_path / "server", free_port()
    root.mkdir()
    server = start_mlflow_server(root, port)
    # the client's own retries shortened from ~4 minutes to ~1 second: the outage outlasts them
    retries = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    try:
        uri, common, proc = _start_sweep(one_node, tmp_path, "outage", trials=3, epochs=12,
                                         uri=f"http://127.0.0.1:{port}", env=retries)

        def training(client, children):
            return any(max(_steps(client, c.info.run_id), default=0) >= 2 for c in children)

        _poll(uri, proc, training)
        stop_process(server, kill=True)  # down until after the sweep ended
        assert proc.wait(timeout=400) == 5, (tmp_path / "first.log").read_text()[-3000:]
        out = (tmp_path / "first.log").read_text()
        assert "`raysearch sync outage` writes them to MLflow once it answers" in out, out
        assert "Traceback" not in out

        server = start_mlflow_server(root, port)  # back, on the same store
        synced = subprocess.run([*RAYSEARCH, "sync", "outage", *common[:2]],
                                capture_output=True, text=True, timeout=300, env={
                                    **os.environ, **retries})
        assert synced.returncode == 0, synced.stdout[-3000:] + synced.stderr[-3000:]
        # the third trial started during the outage: its run is made now, every epoch with it
        assert "sync outage: 1 runs created" in synced.stdout, synced.stdout
        _assert_whole(uri, tmp_path, "outage", trials=3, epochs=12)
        _sync_changes_nothing(common, "outage")
    finally:
        stop_process(server)


@pytest.mark.slow
def test_resume_after_the_driver_was_killed_before_any_trial_finished(one_node, tmp_path):
    uri, common, proc = _start_sweep(one_node, tmp_path, "early", trials=3, epochs=15)

    def mid_training(client, children):
        if any(c.info.status != "RUNNING" for c in children):
            raise AssertionError("a trial finished before the kill")
        return any(max(_steps(client, c.info.run_id), default=0) >= 2 for c in children)

    _poll(uri, proc, mid_training)
    os.kill(proc.pid, signal.SIGKILL)  # in the middle of an epoch of every running trial
    proc.wait()
    _resume_whole(uri, tmp_path, common, "early", trials=3, epochs=15, timeout=400)


@pytest.mark.slow
def test_resume_after_the_driver_was_killed_during_the_selection(one_node, tmp_path):
    uri, common, proc = _start_sweep(one_node, tmp_path, "selecting", trials=2, epochs=4,
                                     env={"RAYSEARCH_FAULT_AT": "selection"})
    assert proc.wait(timeout=300) == -signal.SIGKILL, (tmp_path / "first.log").read_text()
    client, parents, children = _runs(uri)
    assert parents[0].info.status == "RUNNING"  # killed after the table, before the rest
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert "trials.parquet" in artifacts
    assert "pareto.png" not in artifacts
    _resume_whole(uri, tmp_path, common, "selecting", trials=2, epochs=4, timeout=300)
