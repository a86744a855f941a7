"""What the sweep's driver writes for a trial, and in how many requests.

A trial run's files reach its artifacts without a look-up of the run; its params go with its
first metrics, or on their own once they waited ``PARAMS_WAIT_S``; the end of a sweep asks the
store for failed trials only when its trials table has one.
"""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from raysearch import tracking
from raysearch.cli.commands import main
from raysearch.tracking import book as book_module
from raysearch.tracking.book import _SweepBook
from raysearch.tracking.client import log_files
from raysearch.tune.outcome import FailedTrial, failed_trials


@pytest.fixture
def client(tmp_path) -> MlflowClient:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    return client


def _files(tmp_path, names):
    folder = tmp_path / "checkpoint"
    folder.mkdir(exist_ok=True)
    for i, name in enumerate(names):
        (folder / name).write_bytes(bytes([i]) * (100 + i))
    return [folder / n for n in names]


def test_files_go_to_the_runs_artifact_uri_as_the_client_would_put_them(client, tmp_path):
    experiment = client.get_experiment_by_name("e").experiment_id
    paths = _files(tmp_path, ["logits.parquet", "reliability.png"])
    direct, looked_up = (client.create_run(experiment) for _ in range(2))
    log_files(client, direct.info.run_id, paths, direct.info.artifact_uri)
    log_files(client, looked_up.info.run_id, paths)  # no URI: the client's own path
    # with the URI the store is not asked for the run: an id it does not know goes through
    log_files(client, "0" * 32, paths[:1], direct.info.artifact_uri.replace(
        direct.info.run_id, "0" * 32))
    with pytest.raises(Exception, match="not found"):
        log_files(client, "0" * 32, paths[:1])
    for run in (direct, looked_up):
        listed = {a.path: a.file_size for a in client.list_artifacts(run.info.run_id)}
        assert listed == {"logits.parquet": 100, "reliability.png": 101}
        folder = client.download_artifacts(run.info.run_id, "")
        assert (tmp_path / "checkpoint" / "reliability.png").read_bytes() == \
            open(f"{folder}/reliability.png", "rb").read()


def _table(rows):
    return pd.DataFrame(rows, columns=["trial", "run_id", "status", "outcome"])


class _NoStore:
    def __getattr__(self, name):
        raise AssertionError(f"the store was asked ({name})")


def test_a_table_without_a_failed_trial_needs_no_search():
    table = _table([("s-000-ce", "r0", "FINISHED", "complete"),
                    ("s-001-ce", "r1", "FINISHED", "stopped_early"),
                    ("s-002-ce", "r2", "KILLED", "interrupted"),
                    ("s-003-ce", "r3", "FINISHED", None)])
    assert failed_trials(_NoStore(), "parent", table) == []
    assert failed_trials(_NoStore(), "parent", _table([])) == []


@pytest.mark.parametrize(("status", "outcome"), [("FINISHED", "diverged"), ("FAILED", "error"),
                                             ("FAILED", None), ("FAILED", "")])
def test_a_failed_row_sends_the_end_to_the_store_for_its_error(client, status, outcome):
    experiment = client.get_experiment_by_name("e").experiment_id
    parent = client.create_run(experiment, tags={tracking.SWEEP_TAG: "s"})
    pid = parent.info.run_id
    tags = {tracking.SWEEP_TAG: "s", tracking.PARENT_TAG: pid, tracking.TRIAL_TAG: "t1",
            tracking.ERROR_TAG: "RuntimeError:  boom\n  here"}
    if outcome:
        tags[tracking.OUTCOME_TAG] = outcome
    bad = client.create_run(experiment, run_name="s-001-ce", tags=tags)
    client.set_terminated(bad.info.run_id, status)
    good = client.create_run(experiment, run_name="s-000-ce", tags={
        tracking.SWEEP_TAG: "s", tracking.PARENT_TAG: pid, tracking.TRIAL_TAG: "t0",
        tracking.OUTCOME_TAG: "complete"})
    client.set_terminated(good.info.run_id, "FINISHED")
    table = _table([("s-000-ce", good.info.run_id, "FINISHED", "complete"),
                    ("s-001-ce", bad.info.run_id, status, outcome)])
    expected = [FailedTrial("s-001-ce", bad.info.run_id, outcome or "error",
                            "RuntimeError: boom here")]
    assert failed_trials(client, pid, table) == expected
    assert failed_trials(client, pid) == expected  # the same as the store's own answer


def test_held_params_wait_then_fall_due_alone_or_go_with_the_next_write(tmp_path, monkeypatch):
    monkeypatch.setattr(book_module, "PARAMS_WAIT_S", 0.2)
    book = _SweepBook(MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}"))
    try:
        for tid in ("t1", "t2", "t3"):  # as the callback does: started, then params held
            book.started[tid] = time.monotonic()
        book.hold_params("t1", {"method": "ce", "lr": 0.1})
        book.hold_params("t3", {"method": "ls"})
        book.hold("t2", [(1, {"val_ece": 0.1})], {})
        book.hold("t3", [(1, {"val_ece": 0.3})], {"tag": "y"})
        assert book.take_due_params() == []
        book.hold("t1", [(1, {"val_ece": 0.2})], {"tag": "x"})
        held = book.take("t1")  # a write before the wait: the params go with it
        assert held.params == {"method": "ce", "lr": 0.1}
        assert held.epochs == [(1, {"val_ece": 0.2})]
        assert held.tags == {"tag": "x"}
        time.sleep(0.25)
        # t3's params fell due: they leave alone, its epochs and tags wait for its report;
        # t2 holds metrics only
        assert book.take_due_params() == [("t3", {"method": "ls"})]
        assert book.take_due_params() == []
        held = book.take("t3")
        assert held.params == {}
        assert held.epochs == [(1, {"val_ece": 0.3})]
        assert held.tags == {"tag": "y"}
        assert not book.take("t1")
    finally:
        book.close()


@pytest.mark.integration
def test_a_trial_with_a_late_first_report_shows_its_params_before_its_metrics(
        ray_session, tmp_path, sqlite_uri, monkeypatch):
    # one trial of 25 digits epochs (~3-5 s) reports once, at its end; its params wait 0.5 s
    monkeypatch.setattr(book_module, "PARAMS_WAIT_S", 0.5)
    seen: list[tuple[bool, bool]] = []  # (params, metrics) of the child run, as polled
    done = threading.Event()

    def poll() -> None:
        client = MlflowClient(sqlite_uri)
        while not done.is_set():
            experiment = client.get_experiment_by_name("raysearch")
            runs = client.search_runs([experiment.experiment_id]) if experiment else []
            for run in runs:
                if run.data.tags.get("mlflow.parentRunId"):
                    seen.append((bool(run.data.params), bool(run.data.metrics)))
            time.sleep(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        out = CliRunner().invoke(main, [
            "sweep", "ce", "-n", "1", "--epochs", "25", "--name", "late",
            "--tracking-uri", sqlite_uri, "--storage-path", str(tmp_path / "ray")])
    finally:
        done.set()
        poller.join()
    assert out.exit_code == 0, out.output
    assert (True, False) in seen, seen  # params on their own, before the trial's first report
    client = MlflowClient(sqlite_uri)
    child = next(r for r in client.search_runs(
        [client.get_experiment_by_name("raysearch").experiment_id])
        if r.data.tags.get("mlflow.parentRunId"))
    assert child.data.params["method"] == "ce"
    assert child.data.params["epochs"] == "25"
    steps = [m.step for m in client.get_metric_history(child.info.run_id, "val_ece")]
    assert sorted(steps) == list(range(1, 26))
