"""The trials table read back from a sweep's ``trials.parquet`` while it is current.

A sweep written into a real MLflow store (SQLite) by hand: a parent run and child runs with
params of mixed types (numbers and words in one column, a param some runs lack), then
``finalize_sweep``. ``stored_trials`` gives the same table as reading the runs while no run
changed, and nothing (the caller reads the runs) once one did: a run ended again, a run
added, one deleted, the parent running, or ``sync`` about to write.
"""

from __future__ import annotations

import json
import math
import time

import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from raysearch.config import RunConfig
from raysearch.tracking import (
    COMPLETE_TAG,
    CONFIG_TAG,
    OUTCOME_TAG,
    PARENT_TAG,
    SWEEP_TAG,
    TABLE_TAG,
    TRIAL_TAG,
    SweepRuns,
    finalize_sweep,
    load_sweep,
    stored_trials,
    sweep_trials,
)

#: Per trial: params (a mixed column, a column one run lacks, words) and final metrics.
_TRIALS = [
    ({"method": "ce", "gamma": "1", "width": "64", "note": "a"}, 0.90, 0.05, True),
    ({"method": "focal", "gamma": "1.5", "width": "32"}, 0.91, 0.03, True),
    ({"method": "focal", "gamma": "auto", "width": "64", "note": "b"}, 0.902, 0.02, True),
    ({"method": "ls", "gamma": "2", "note": "c"}, 0.80, 0.10, False),
    ({"method": "ls", "gamma": "nan", "width": "16", "note": "12"}, 0.905, 0.04, True),
]


def _sweep(client: MlflowClient, name: str = "stored") -> str:
    exp = client.create_experiment(name)
    parent = client.create_run(exp, run_name=name, tags={SWEEP_TAG: name}).info.run_id
    client.log_batch(parent, params=[Param("tolerance", "0.01"), Param("selection", "mean")])
    config = json.dumps(RunConfig().to_dict())
    for i, (params, acc, ece, complete) in enumerate(_TRIALS):
        run = client.create_run(exp, run_name=f"{name}-{i:03d}-{params['method']}", tags={
            PARENT_TAG: parent, SWEEP_TAG: name, TRIAL_TAG: f"{i:08d}", CONFIG_TAG: config,
            COMPLETE_TAG: str(complete).lower(),
            OUTCOME_TAG: "complete" if complete else "stopped_early"}).info.run_id
        now = int(time.time() * 1000)
        client.log_batch(run, params=[Param(k, v) for k, v in params.items()], metrics=[
            Metric("val_accuracy", acc, now, 1), Metric("val_ece", ece, now, 1),
            Metric("test_accuracy", acc - 0.01, now, 1), Metric("test_ece", ece + 0.01, now, 1),
            *([Metric("val_nll", math.nan, now, 1)] if i == 2 else [])])
        client.set_terminated(run)
    finalize_sweep(client, parent, tolerance=0.01)
    time.sleep(0.01)  # what changes next changes after the table (millisecond clocks)
    return parent


@pytest.fixture
def store(sqlite_uri):
    client = MlflowClient(sqlite_uri)
    parent = _sweep(client)
    return client, parent


def test_the_stored_table_is_the_table_of_the_runs(store):
    client, parent_id = store
    parent = client.get_run(parent_id)
    assert parent.data.tags[TABLE_TAG].isdigit()
    stored = stored_trials(client, parent)
    assert stored is not None
    read = sweep_trials(client, parent)
    pd.testing.assert_frame_equal(stored, read)
    assert list(stored["gamma"][:4]) == [1, 1.5, "auto", 2]  # a mixed column, as read
    assert math.isnan(stored["gamma"][4])
    assert math.isnan(stored["width"][3])
    assert stored["note"].tolist()[::2] == ["a", "b", 12]
    _, frame, _ = load_sweep(client, "stored")
    assert frame.loc[frame["selected"], "trial"].tolist() == ["stored-002-focal"]


@pytest.mark.parametrize("change", ["ended again", "added", "deleted", "parent running"])
def test_a_change_after_the_table_reads_the_runs(store, change):
    client, parent_id = store
    parent = client.get_run(parent_id)
    exp = parent.info.experiment_id
    first = sweep_trials(client, parent)["run_id"][0]
    if change == "ended again":  # a run that got a better value since (and ended again)
        client.log_metric(first, "val_ece", 0.001, step=1)
        client.set_terminated(first)
    elif change == "added":
        client.create_run(exp, run_name="stored-005-ce",
                          tags={PARENT_TAG: parent_id, SWEEP_TAG: "stored"})
    elif change == "deleted":
        client.delete_run(first)
    else:
        client.update_run(parent_id, status="RUNNING")
    parent = client.get_run(parent_id)
    assert stored_trials(client, parent) is None
    _, frame, _ = load_sweep(client, "stored")
    pd.testing.assert_frame_equal(frame.drop(columns=["on_front", "selected"]),
                                  sweep_trials(client, parent))
    if change == "ended again":
        assert frame.loc[frame["selected"], "run_id"].tolist() == [first]


def test_sync_removes_the_stamp_before_it_writes(store):
    client, parent_id = store
    parent = client.get_run(parent_id)
    runs = SweepRuns.index(client, parent.info.experiment_id, parent_id, "stored", [])
    runs.stamped = True
    runs.unstamp()
    runs.unstamp()  # once
    parent = client.get_run(parent_id)
    assert TABLE_TAG not in parent.data.tags
    assert stored_trials(client, parent) is None
    finalize_sweep(client, parent_id, tolerance=0.01)  # the selection again: current again
    assert stored_trials(client, client.get_run(parent_id)) is not None
