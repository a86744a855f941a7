"""``raysearch sync``: a sweep's MLflow runs reconciled with the trials' records Tune keeps.

Real Ray (the session's local Ray), a real MLflow SQLite store, Tune's ``result.json`` files on
disk. The drills where the records go missing for real (an MLflow server killed across the end
of a sweep, drivers SIGKILLed) are in tests/test_faults.py (marked slow).
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pandas as pd
from click.testing import CliRunner
from clusters import stop_process
from drills import first_reports
from mlflow.tracking import MlflowClient

from raysearch.cli.commands import main
from raysearch.tracking.reconcile import TrialRecords
from raysearch.tune.engine import run_sweep
from raysearch.tune.settings import SweepSettings


def test_an_epoch_keeps_its_first_reported_value():
    # attempt 1 reports epochs 1-2 in one report (epoch 1 in its history) and epoch 3; it dies,
    # and its retry from the epoch-2 checkpoint reports epoch 3 again (another value) and 4
    reports = [
        {"epoch": 2, "val_ece": 0.20, "epoch_history": [{"epoch": 1, "val_ece": 0.30}]},
        {"epoch": 3, "val_ece": 0.15, "node_id": "a", "resumed_from_epoch": None},
        {"epoch": 3, "val_ece": 0.99, "node_id": "b", "resumed_from_epoch": 2},
        {"epoch": 4, "val_ece": 0.10, "test_ece": 0.12, "completed": True, "done": True,
         "pid": 7},
    ]
    trial = TrialRecords("t1", 0, {}, "TERMINATED", reports)
    # by hand: 1 -> 0.30 (history), 2 -> 0.20, 3 -> 0.15 (first attempt wins), 4 -> 0.10; the
    # test metric sits at the last epoch; pid/done/completed are no metrics
    assert trial.epochs() == {1: {"val_ece": 0.30}, 2: {"val_ece": 0.20},
                              3: {"val_ece": 0.15}, 4: {"val_ece": 0.10, "test_ece": 0.12}}
    assert trial.last_tag_values() == {"raysearch.node_id": "b",
                                       "raysearch.resumed_from_epoch": "2"}
    assert trial.ended


def _state(client: MlflowClient, experiment_id: str) -> dict:
    """Every run of the experiment: status, tags, params and full metric histories."""
    state = {}
    for run in client.search_runs([experiment_id], max_results=500):
        tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.log-model")}
        history = {k: sorted((m.step, m.value) for m in client.get_metric_history(
            run.info.run_id, k)) for k in run.data.metrics}
        state[run.info.run_id] = (run.info.status, tags, dict(run.data.params), history,
                                  sorted(a.path for a in client.list_artifacts(run.info.run_id)))
    return state


def test_sync_writes_back_a_lost_run_once(ray_session, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    settings = SweepSettings(num_samples=2, max_concurrent=2, epochs=3, posthoc=(), name="lost",
                             storage_path=str(tmp_path / "ray"), tracking_uri=uri)
    run_sweep("ce", settings, progress=lambda line: None)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch").experiment_id
    children = [r for r in client.search_runs([exp]) if "raysearch.trial_id" in r.data.tags]
    # a live sweep whose writes all landed tags its runs recorded: sync reads them no more
    assert {r.data.tags["raysearch.recorded"] for r in children} == {"true"}
    args = ["sync", "lost", "--tracking-uri", uri]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "sync lost: MLflow already held every record" in result.output

    # a child run MLflow never got (its server was away when the trial started)
    lost = children[0]
    tid = lost.data.tags["raysearch.trial_id"]
    client.delete_run(lost.info.run_id)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "sync lost: 1 runs created" in result.output
    (again,) = [r for r in client.search_runs([exp])
                if r.data.tags.get("raysearch.trial_id") == tid]
    assert again.info.run_id != lost.info.run_id
    assert again.info.status == "FINISHED"
    assert again.data.tags["raysearch.outcome"] == "complete"
    assert again.data.tags["raysearch.config"] == lost.data.tags["raysearch.config"]
    assert again.data.params == lost.data.params
    for key in ("val_nll", "train_loss", "test_ece"):
        history = {m.step: m.value for m in client.get_metric_history(again.info.run_id, key)}
        assert history == first_reports(tmp_path / "ray" / "lost", tid, key), key
        assert history == {m.step: m.value for m in client.get_metric_history(
            lost.info.run_id, key)}, key  # what the live sweep had logged
    assert sorted(a.path for a in client.list_artifacts(again.info.run_id)) == \
        ["logits.parquet", "reliability.png"]
    parent = client.get_run(again.data.tags["mlflow.parentRunId"])
    table = pd.read_parquet(client.download_artifacts(parent.info.run_id, "trials.parquet",
                                                      str(tmp_path)))
    assert again.info.run_id in set(table["run_id"])

    # twice changes nothing
    before = _state(client, exp)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "already held every record" in result.output
    assert _state(client, exp) == before

    # a parent left RUNNING by a driver that is alive on this machine: refused in one line
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        client.update_run(parent.info.run_id, "RUNNING")
        client.set_tag(parent.info.run_id, "raysearch.driver",
                       f"{socket.gethostname()}:{sleeper.pid}")
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2
        assert result.stderr.count("\n") == 1
        assert "sweep 'lost' is still running" in result.stderr
    finally:
        stop_process(sleeper, kill=True)
    # the driver died during the final selection: sync ends the parent for it
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"



def test_the_ends_records_of_tunes_trials_are_compact(ray_session, tmp_path):
    # the end of every sweep reads Tune's snapshot and the trials' reports: it keeps the
    # reports, status and checkpoint of each trial, not Tune's restored trials (their metric
    # statistics: ~0.2 MiB each with ~80 metrics), nor a DataFrame per trial
    import gc
    import tracemalloc

    from ray import tune
    from ray.tune import ExperimentAnalysis
    from ray.tune.logger import JsonLoggerCallback

    from raysearch.tune.sync import read_trials, snapshot_trials

    def trainable(config):  # a trial's last report: ~80 metrics, as a raysearch trial's
        tune.report({f"val_m{i}": config["x"] + i / 100 for i in range(80)})

    tune.Tuner(trainable, param_space={"x": tune.grid_search(list(range(16)))},
               run_config=tune.RunConfig(name="snap", storage_path=str(tmp_path), verbose=0,
                                         callbacks=[JsonLoggerCallback()])).fit()
    path = str(tmp_path / "snap")

    def held(read):  # bytes that what `read` returns keeps alive
        gc.collect()
        tracemalloc.start()
        try:
            kept = read(path)
            return kept, tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()

    _, tunes = held(ExperimentAnalysis)
    trials, without_frames = held(snapshot_trials)
    records, ours = held(read_trials)
    assert len(trials) == len(records) == 16
    assert {r.status for r in records} == {"TERMINATED"}
    assert sorted(r.results[-1]["val_m1"] for r in records) == [x + 0.01 for x in range(16)]
    assert without_frames < tunes
    assert ours < tunes / 4, (ours, tunes)


def test_tunes_fit_ends_without_result_frames_and_the_states_read_lean(ray_session, tmp_path):
    # within without_result_frames(), fit()'s ResultGrid holds no DataFrame of reports (its
    # metrics stay); outside, Tune's own ExperimentAnalysis is back. snapshot_states gives the
    # same ids and statuses as Tune's restored trials, an errored trial included
    import ray.tune.tune as tune_run
    from ray import tune

    from raysearch.tune.sync import (
        TrialState,
        snapshot_states,
        snapshot_trials,
        without_result_frames,
    )

    def trainable(config):
        if config["x"] == 2:
            raise RuntimeError("trial 2 fails")
        tune.report({"val_ece": config["x"] / 10})

    def fit(name):
        return tune.Tuner(trainable, param_space={"x": tune.grid_search([0, 1, 2])},
                          run_config=tune.RunConfig(name=name, storage_path=str(tmp_path),
                                                    verbose=0)).fit()

    original = tune_run.ExperimentAnalysis
    with without_result_frames():
        lean = fit("lean")
    assert tune_run.ExperimentAnalysis is original
    full = fit("full")
    for grid, frames in ((lean, False), (full, True)):
        ok = sorted((r for r in grid if r.error is None), key=lambda r: r.metrics["val_ece"])
        assert [r.metrics["val_ece"] for r in ok] == [0.0, 0.1]
        assert all((r.metrics_dataframe is not None) is frames for r in ok)
    path = str(tmp_path / "lean")
    states = snapshot_states(path)
    assert all(isinstance(s, TrialState) for s in states)
    assert states == [(t.trial_id, t.status) for t in snapshot_trials(path)]
    assert sorted(s.status for s in states) == ["ERROR", "TERMINATED", "TERMINATED"]


def test_snapshot_states_are_decoded_pair_by_pair_across_any_chunking():
    # a snapshot as Tune writes it (trial states as JSON strings inside the document), read a
    # few bytes at a time: a pair or a two-byte character split between reads decodes the same;
    # a running trial is pending (as Tune restores it); a cut-off snapshot is a ValueError
    import io
    import json

    import pytest

    from raysearch.tune.sync import TrialState, read_states

    pairs = [[json.dumps({"trial_id": "a1", "status": "RUNNING", "config": {"note": "é" * 9}},
                         indent=2), json.dumps({"last_result": {"trial_id": "a1"}})],
             [json.dumps({"trial_id": "b2", "status": "ERROR"}), "{}"],
             [json.dumps({"trial_id": "c3", "status": "TERMINATED"}), "{}"]]
    raw = json.dumps({"trial_data": pairs, "runner_data": {"x": [1, 2]}}, indent=2).encode()
    expected = [TrialState("a1", "PENDING"), TrialState("b2", "ERROR"),
                TrialState("c3", "TERMINATED")]
    for chunk in (1, 2, 3, 5, 64, 1 << 20):
        assert read_states(io.BytesIO(raw), chunk) == expected, chunk
    assert read_states(io.BytesIO(b'{"trial_data": []}')) == []
    with pytest.raises(ValueError, match="ends inside"):
        read_states(io.BytesIO(raw[: len(raw) // 2]), 16)
    with pytest.raises(ValueError, match="no trial_data"):
        read_states(io.BytesIO(b'{"runner_data": {}}'))
