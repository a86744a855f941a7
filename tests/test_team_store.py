"""A team's store: an `mlflow server` on PostgreSQL with its artifacts in S3, studies in PostgreSQL.

Real servers started by the suite (conftest's ``team_store``): Debian's PostgreSQL on
127.0.0.1, moto's S3 server, ``mlflow server --backend-store-uri postgresql://...
--artifacts-destination s3://team/mlflow``; a 2-CPU Ray cluster on this machine whose nodes hold
the S3 credentials (as a cloud's nodes would). Every sweep is the ``raysearch`` command in a
subprocess, with Tune's storage in S3, the Optuna study in a PostgreSQL database of its own
(``--optuna-storage``) and the password in ``PGPASSWORD``, never in a URL:

- two drivers creating Optuna's tables, the experiment and its dataset row at the same moment
  both go on;
- two sweeps started at the same moment in one new experiment, and a third under a name in
  use: both finish, each parent holds its own children with every epoch once; the third is
  refused in one line before it writes anything;
- a sweep interrupted (Ctrl-C), its first machine's folder deleted, resumed from another folder
  that sees only the servers: the same study goes on (its trial numbers continue); then
  ``report`` (with ``--importance``, from the study), ``export --register`` (the model
  registered in PostgreSQL, its files in S3) and ``sync``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from functools import partial

import mlflow
import numpy as np
import optuna
import pytest
from click.testing import CliRunner
from clusters import start_cluster, stop_process
from mlflow.tracking import MlflowClient

from raysearch.cli.commands import main
from raysearch.tracking import ensure_experiment, log_dataset
from raysearch.tune.study import STORAGE_TAG, STUDY_TAG, open_storage

pytestmark = pytest.mark.integration

RAYSEARCH = [sys.executable, "-m", "raysearch.cli"]


@pytest.fixture(scope="module")
def team_cluster(team_store):
    """A 2-CPU Ray cluster; its nodes (hence the trials) get S3's credentials at start."""
    s3 = {k: v for k, v in team_store.env.items() if k.startswith("AWS_")}
    saved = {k: os.environ.get(k) for k in s3}
    os.environ.update(s3)
    try:
        cluster = start_cluster(2)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def optuna_uri(team_store):
    """The team's Optuna database (``postgresql://raysearch@127.0.0.1:<port>/optuna``)."""
    return team_store.postgres.create_database("optuna")


@pytest.fixture
def team_env(team_store, monkeypatch):
    """This process reads S3 and the Optuna database as the drivers do."""
    for key, value in team_store.env.items():
        monkeypatch.setenv(key, value)
    return team_store


def _options(team, cluster, optuna_url: str, experiment: str) -> list[str]:
    return ["--tracking-uri", team.tracking_uri, "--experiment", experiment,
            "--optuna-storage", optuna_url, "--storage-path", f"s3://{team.bucket}/ray",
            "--address", cluster.address]


def _raysearch(team, *args: str, cwd=None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*RAYSEARCH, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env={**os.environ, **team.env})


def _popen(team, log, *args: str, cwd=None) -> subprocess.Popen:
    return subprocess.Popen([*RAYSEARCH, *args], stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                            env={**os.environ, **team.env})


@contextlib.contextmanager
def _stopped_at_the_end(procs: dict[str, subprocess.Popen]):
    """Yield `procs`; on the way out stop those of them still running (by their pids)."""
    try:
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                stop_process(proc)


def _sweep_runs(client: MlflowClient, experiment: str):
    """The experiment's parent runs by sweep name, and every child run by its parent's id."""
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=500) if exp else []
    parents = {r.data.tags["raysearch.sweep"]: r for r in runs
               if "mlflow.parentRunId" not in r.data.tags}
    children: dict[str, list] = {}
    for run in runs:
        if "mlflow.parentRunId" in run.data.tags:
            children.setdefault(run.data.tags["mlflow.parentRunId"], []).append(run)
    return parents, children


def _steps(client: MlflowClient, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "val_accuracy"))


def _study(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(url))


def _at_once(*calls) -> list:
    """Each of `calls` in a thread of its own, released together: what each returned (in the
    order of `calls`), or its error."""
    barrier, got = threading.Barrier(len(calls)), [None] * len(calls)

    def one(i: int) -> None:
        barrier.wait()
        try:
            got[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 (the outcome is what is compared)
            got[i] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return got


def test_two_drivers_starting_at_the_same_moment_both_go_on(team_env):
    # two people's first sweeps at the same moment, on a fresh database, a new experiment and
    # the same data: Optuna's CREATE TABLE, MLflow's create_experiment and its dataset row
    # each let one of two racers fail
    client = MlflowClient(team_env.tracking_uri)
    record = {"name": "digits", "source": "raysearch.training.data.load_dataset('digits')",
              "profile": "{}"}
    for attempt in range(3):
        url = team_env.postgres.create_database(f"optuna_fresh_{attempt}")
        opened = _at_once(partial(open_storage, url), partial(open_storage, url))
        assert all(isinstance(s, optuna.storages.RDBStorage) for s in opened), opened
        name = f"fresh-{attempt}"
        make = partial(ensure_experiment, client, name, team_env.tracking_uri)
        ids = _at_once(make, make)
        assert ids[0] == ids[1] == client.get_experiment_by_name(name).experiment_id, ids
        runs = [client.create_run(ids[0]).info.run_id for _ in range(2)]
        record["digest"] = f"{attempt:012d}"
        assert _at_once(*(partial(log_dataset, client, r, record) for r in runs)) == [None] * 2
        for run_id in runs:
            (logged,) = client.get_run(run_id).inputs.dataset_inputs
            assert logged.dataset.digest == record["digest"]


def test_two_sweeps_at_once_and_a_name_in_use(team_env, team_cluster, tmp_path):
    team = team_env
    # a fresh database and a new experiment: both drivers create Optuna's tables and the
    # experiment at the same moment
    optuna_url = team.postgres.create_database("optuna_race")
    options = _options(team, team_cluster, optuna_url, "team")
    args = ["sweep", "ce", "--num-samples", "2", "--max-concurrent", "1", "--epochs", "2",
            "--posthoc", "none", *options]
    procs = {}
    with _stopped_at_the_end(procs):
        for name in ("alice", "bob"):
            with open(tmp_path / f"{name}.log", "w") as log:  # the process keeps its own fd
                procs[name] = _popen(team, log, *args, "--name", name, cwd=tmp_path)
        client = MlflowClient(team.tracking_uri)
        deadline = time.monotonic() + 240
        while len(_sweep_runs(client, "team")[0]) < 2:
            assert all(p.poll() is None for p in procs.values()), \
                {n: (tmp_path / f"{n}.log").read_text()[-2000:] for n in procs}
            assert time.monotonic() < deadline
            time.sleep(0.5)
        # a third sweep under a name in use: one line, exit code 2, nothing written
        third = _raysearch(team, *args, "--name", "alice", cwd=tmp_path, timeout=120)
        assert third.returncode == 2, third.stdout[-2000:] + third.stderr[-2000:]
        assert third.stderr.strip().count("\n") == 0, third.stderr
        assert "a sweep named 'alice' already exists in experiment 'team'" in third.stderr
        for name, proc in procs.items():
            assert proc.wait(timeout=300) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]

    parents, children = _sweep_runs(client, "team")
    assert sorted(parents) == ["alice", "bob"]  # the third made no parent run
    for name, parent in parents.items():
        own = children[parent.info.run_id]
        assert len(own) == 2, name
        assert all(c.info.status == "FINISHED" for c in own)
        assert len({c.data.tags["raysearch.trial_id"] for c in own}) == 2
        for child in own:  # every epoch once
            assert _steps(client, child.info.run_id) == [1, 2], (name, child.info.run_name)
    assert sum(len(runs) for runs in children.values()) == 4  # no child of anyone else
    storage = open_storage(optuna_url)
    summaries = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage)}
    assert summaries == {"alice": 2, "bob": 2}  # and no study of the third


def _first_finished(client: MlflowClient, name: str, proc: subprocess.Popen, log,
                    timeout: float = 240) -> None:
    """Wait until sweep `name` has one FINISHED child run (its process still running)."""
    deadline = time.monotonic() + timeout
    while True:
        _, children = _sweep_runs(client, name)
        if any(c.info.status == "FINISHED" for runs in children.values() for c in runs):
            return
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)


def test_a_sweep_resumed_elsewhere_then_report_export_and_sync(team_env, team_cluster,
                                                                optuna_uri, tmp_path):
    team = team_env
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    options = _options(team, team_cluster, optuna_uri, "solo")
    log = first / "sweep.log"
    client = MlflowClient(team.tracking_uri)
    with open(log, "w") as out, _stopped_at_the_end({}) as procs:
        proc = procs["first"] = _popen(
            team, out, "sweep", "ce", "--num-samples", "3", "--max-concurrent", "1",
            "--epochs", "4", "--checkpoint-every", "1", "--name", "solo", *options, cwd=first)
        _first_finished(client, "solo", proc, log)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: Tune stops the trials and snapshots
        assert proc.wait(timeout=180) == 130, log.read_text()[-3000:]
    parents, _ = _sweep_runs(client, "solo")
    # the study is in PostgreSQL; the parent's tag names it, without a password
    assert parents["solo"].data.tags[STORAGE_TAG] == optuna_uri
    assert parents["solo"].data.tags[STUDY_TAG] == "solo"
    before = {t.number: t for t in _study(optuna_uri, "solo").trials}
    assert 1 <= len(before) < 3
    shutil.rmtree(first)  # the first machine is gone: nothing of the sweep was only there

    resumed = _raysearch(team, "sweep", "--resume", "solo", "--tracking-uri",
                         team.tracking_uri, "--experiment", "solo", "--address",
                         team_cluster.address, cwd=other, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming sweep solo" in resumed.stdout
    assert "3/3 trials complete" in resumed.stdout
    assert not list(other.iterdir())  # the second machine kept nothing either
    after = _study(optuna_uri, "solo").trials
    numbers = [t.number for t in after]
    assert numbers == list(range(len(after)))  # one study, numbered on from the first run
    assert max(numbers) > max(before)
    for number, trial in before.items():  # the first run's trials, with their parameters
        assert after[number].params == trial.params
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in after) == 3
    parents, children = _sweep_runs(client, "solo")
    parent = parents["solo"]
    own = children[parent.info.run_id]
    assert Counter(c.info.status for c in own) == {"FINISHED": 3}
    for child in own:  # every epoch once
        assert _steps(client, child.info.run_id) == [1, 2, 3, 4]
    # the parent's artifacts went through the server to S3
    import boto3

    s3 = boto3.client("s3", endpoint_url=team.env["AWS_ENDPOINT_URL"])
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=team.bucket,
                                                 Prefix="mlflow/").get("Contents", [])]
    assert any(k.endswith(f"{parent.info.run_id}/artifacts/trials.parquet") for k in keys), keys
    for child in own:  # and each trial's, those its driver wrote straight to its artifact URI
        assert any(k.endswith(f"{child.info.run_id}/artifacts/reliability.png")
                   for k in keys), keys

    # what a laptop runs afterwards (in this process: S3's and the database's credentials in
    # its environment)
    store = ["--tracking-uri", team.tracking_uri, "--experiment", "solo"]
    report = CliRunner().invoke(main, ["report", "solo", "--importance", *store])
    assert report.exit_code == 0, report.output
    assert f"Optuna study 'solo' in {optuna_uri}" in report.stdout
    assert "fANOVA importances over 3 complete trials" in report.stdout
    export = CliRunner().invoke(main, ["export", "solo", "--register", "team-digits", *store])
    assert export.exit_code == 0, export.output
    assert "registered: mlflow.pyfunc.load_model('models:/team-digits/1')" in export.stdout
    before_uri = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(team.tracking_uri)
    try:
        model = mlflow.pyfunc.load_model("models:/team-digits/1")  # its files come from S3
    finally:
        mlflow.set_tracking_uri(before_uri)
    probs = model.predict(np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32))
    assert probs.shape == (4, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    sync = CliRunner().invoke(main, ["sync", "solo", *store])
    assert sync.exit_code == 0, sync.output
    assert "MLflow already held every record" in sync.stdout
