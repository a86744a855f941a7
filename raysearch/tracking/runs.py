"""Names and look-ups of raysearch's MLflow runs, without Ray.

The tags that mark a sweep's parent and child runs, the tracking-URI rules (a store that answers, a
SQLite file no other process holds locked), and finding a sweep in a store.
:mod:`raysearch.tracking` (which imports Ray Tune for its callback) re-exports all of it; commands
that only read a store (``raysearch ui``) import this module and start in about a second instead of
several.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from raysearch.config import DEFAULT_EXPERIMENT  # noqa: F401 (re-exported)

SWEEP_TAG = "raysearch.sweep"
CONFIG_TAG = "raysearch.config"
COMPLETE_TAG = "raysearch.complete"
TRIAL_TAG = "raysearch.trial_id"
#: Child-run tag: the Ray node id the trial ran on (rank 0 for a DDP trial).
NODE_TAG = "raysearch.node_id"
#: Result key of that node id (reported by every trial).
NODE_KEY = "node_id"
PARENT_TAG = "mlflow.parentRunId"
#: Child-run tag: why the run ended (complete, stopped_early, diverged, error, interrupted).
OUTCOME_TAG = "raysearch.outcome"
#: Outcomes of trials that Tune will not train again: a resumed sweep leaves their runs as is.
SEALED_OUTCOMES = ("complete", "stopped_early", "diverged")
#: Child-run tag: how many times Tune retried the trial (``--max-failures``).
RETRIES_TAG = "raysearch.retries"
#: Child-run tag: the checkpoint epoch the trial's last attempt resumed from.
RESUMED_TAG = "raysearch.resumed_from_epoch"
ERROR_TAG = "raysearch.error"
#: Child-run tag: the line of an attempt that skipped an unreadable checkpoint
#: (:data:`~raysearch.training.records.CHECKPOINT_SKIPPED`).
SKIPPED_TAG = "raysearch.checkpoint_skipped"
#: Tag of a trial whose post-hoc calibrators could not be fitted (a perfectly classified
#: validation split): their names, comma-separated (``"ts"``), from the last report's
#: :data:`~raysearch.training.records.DEGENERATE_CALIBRATORS`.
DEGENERATE_TAG = "raysearch.calibrator_degenerate"
#: Child-run tag ``true``: every record of the ended trial reached the run (set by the live
#: writer when none of the trial's writes failed, and by ``raysearch sync`` after it filled the
#: run in); ``sync`` leaves such runs unread.
RECORDED_TAG = "raysearch.recorded"
#: Parent-run tag: ``<host>:<pid>`` of the driver process running the sweep (``sync`` will not
#: write beside a live driver of this host).
DRIVER_TAG = "raysearch.driver"
#: Parent-run tag: when :func:`~raysearch.tracking.finalize_sweep` began reading the runs its
#: ``trials.parquet`` holds (milliseconds since the epoch, the writer's clock); removed before a
#: ``raysearch sync`` writes to a trial run (:func:`~raysearch.tracking.stored_trials`).
TABLE_TAG = "raysearch.trials_table"
#: Tag of a repeated sweep's configuration run (``--repeats``) and of its seed runs: the
#: configuration id (its seeds' runs are nested under the configuration run).
CONFIGURATION_TAG = "raysearch.configuration"
#: Configuration-run tag: seeds per configuration (``--repeats``).
REPEATS_TAG = "raysearch.metrics.repeats"
#: Configuration-run tag: ``<complete seeds>/<seeds>`` its mean and SEM were computed over.
SEEDS_TAG = "raysearch.seeds"
#: Experiment tag that MLflow 3's UI reads for the kind of an experiment, and our value for it
#: ("model training", not GenAI: the UI then does not ask which kind the experiment is).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
METRIC_PREFIXES = ("train_", "val_", "test_", "shift_")


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<cwd>/mlruns.db`` (absolute)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd().resolve() / 'mlruns.db'}"


def resolve_tracking_uri(uri: str | None) -> str:
    """The tracking URI to use: `uri` if given, else :func:`default_tracking_uri`.

    A relative SQLite path (``sqlite:///mlruns.db``) is made absolute against the current
    directory, since Ray trials and ``mlflow ui`` may run elsewhere.
    """
    uri = uri or default_tracking_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///"):]
        uri = f"sqlite:///{(Path.cwd() / rel).resolve()}"
    return uri


def check_tracking_uri(uri: str, *, timeout: float = 5.0) -> None:
    """Fail fast when the tracking store cannot be reached (before any trial starts).

    Raises:
        ValueError: naming the URI and the reason (server down, folder missing, bad scheme).
    """
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"tracking URI {uri} is unreachable: HTTP {resp.status}")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ValueError(f"tracking URI {uri} is unreachable: {reason}") from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///"):]).parent
        if not folder.is_dir():
            raise ValueError(f"tracking URI {uri} is unreachable: folder {folder} does not exist")
        if not os.access(folder, os.W_OK):
            raise ValueError(f"tracking URI {uri} is unreachable: folder {folder} is not writable")
    elif uri.startswith(("file:", "/")) or "://" not in uri:
        path = Path(uri[len("file://"):] if uri.startswith("file://") else uri)
        if not path.parent.is_dir():
            raise ValueError(f"tracking URI {uri} is unreachable: folder {path.parent} is missing")
    elif not uri.startswith(("postgresql", "mysql", "mssql", "databricks")):
        raise ValueError(f"tracking URI {uri} has an unsupported scheme")


#: Seconds a probe of a SQLite tracking store waits for another process's lock (as long as
#: MLflow's own SQLite connections wait).
STORE_LOCK_TIMEOUT_S = 5.0


def probe_tracking_store(uri: str, *, write: bool = False,
                         timeout: float = STORE_LOCK_TIMEOUT_S) -> None:
    """Fail in one line when a SQLite tracking store cannot be read (or written) now.

    Another process may hold the store's file locked (a sweep's writes take milliseconds; a
    ``sqlite3`` shell in an open transaction or a crashed writer holds it for good), or the
    file may not be an SQLite database. Probing before anything is written turns MLflow's
    "database is locked" traceback into one line. Only an existing ``sqlite:///`` file is
    probed (MLflow creates a missing one); other stores answer :func:`check_tracking_uri`.

    Args:
        uri: a resolved tracking URI (:func:`resolve_tracking_uri`).
        write: take the write lock (``BEGIN IMMEDIATE``, rolled back) instead of reading.
        timeout: seconds to wait for another process's lock.

    Raises:
        ValueError: naming the file and SQLite's reason (locked, not a database, read-only).
    """
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri[len("sqlite:///"):])
    if not path.is_file():
        return
    import contextlib
    import sqlite3

    mode = "rw" if write else "ro"
    try:
        with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode={mode}",
                                                uri=True, timeout=timeout,
                                                isolation_level=None)) as con:
            if write:
                con.execute("BEGIN IMMEDIATE")
                con.execute("ROLLBACK")
            else:
                con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        reason = " ".join(str(exc).split())
        if "locked" in reason or "busy" in reason:
            raise ValueError(f"tracking store {path} is locked by another process (SQLite: "
                             f"{reason}, after {timeout:g} s): wait until it lets go or use "
                             "another --tracking-uri") from None
        raise ValueError(f"tracking store {path} cannot be {'written' if write else 'read'}: "
                         f"SQLite: {reason}") from None


def find_sweep(client: MlflowClient, name: str, experiment: str | None = None, *,
               known: bool = True) -> Any:
    """The newest parent run of sweep `name`.

    Args:
        client: client of the store.
        name: the sweep's name (its parent run's ``raysearch.sweep`` tag).
        experiment: the experiment to look in; None: every experiment of the store.
        known: list the sweeps the store holds in the error (one more search of the store);
            False when the caller only asks whether the sweep exists.

    Raises:
        ValueError: if no sweep of that name is recorded in the store (lists the known ones).
    """
    exps = ([client.get_experiment_by_name(experiment)] if experiment
            else client.search_experiments())
    exp_ids = [e.experiment_id for e in exps if e is not None]
    runs = []
    if exp_ids:
        runs = client.search_runs(exp_ids, filter_string=f"tags.`{SWEEP_TAG}` = '{name}' "
                                  f"and tags.`{PARENT_TAG}` IS NULL",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        runs = [r for r in runs if PARENT_TAG not in r.data.tags]
    if not runs:
        names = sorted(list_sweeps(client, exp_ids)) if known else []
        hint = (f"; known sweeps: {', '.join(names)}" if names else
                "; the store has no sweeps" if known else "")
        raise ValueError(f"no sweep named '{name}'{hint}")
    return runs[0]


def list_sweeps(client: MlflowClient, exp_ids: list[str]) -> list[str]:
    """Names of the sweeps (parent runs) recorded in the given experiments."""
    if not exp_ids:
        return []
    runs = client.search_runs(exp_ids, filter_string=f"tags.`{SWEEP_TAG}` != ''",
                              max_results=5000)
    return sorted({r.data.tags[SWEEP_TAG] for r in runs if PARENT_TAG not in r.data.tags})
