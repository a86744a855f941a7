"""Read a sweep's trials from Ray Tune's storage and reconcile its MLflow runs with them.

Tune keeps every trial's reports on disk (``result.json`` in the trial's folder, one JSON line
per report), its status and error in the experiment snapshot, and its checkpoints; those
records outlive an MLflow server that was away, or a driver killed with writes still queued.
:func:`read_trials` reads them (local or S3 storage, through the storage's pyarrow file system)
into :class:`~raysearch.tracking.reconcile.TrialRecords`, and :func:`reconcile_sweep` writes
what the sweep's MLflow runs lack (:func:`~raysearch.tracking.reconcile.reconcile_trial`), then
the parent's selection, Pareto plot and trials table when anything changed.

It is run at the end of every sweep, by ``raysearch sweep --resume`` before the trials go on,
and by ``raysearch sync NAME`` (:func:`raysearch.tune.resume.sync_sweep`).
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from raysearch import tracking
from raysearch.tracking.reconcile import (
    Reconciled,
    SweepRuns,
    TrialRecords,
    error_line,
    reconcile_trial,
)

logger = logging.getLogger(__name__)

RESULT_FILE = "result.json"  # Tune's record of a trial's reports (one JSON object per line)


def snapshot_trials(path: str) -> list[Any]:
    """The trials (``ray.tune.experiment.Trial``) of Tune's last experiment snapshot at `path`.

    Tune's ``ExperimentAnalysis`` also reads every trial's ``result.json`` into a pandas
    DataFrame when it opens an experiment, all held at once; the sweep reads the reports
    itself (:func:`read_trials`), so the trials are read here without those DataFrames. Each
    restored trial still holds Tune's statistics of every numeric metric it reported (~0.2 MiB
    with ~80 metrics): keep them no longer than needed.

    Args:
        path: the sweep's experiment folder (``<storage path>/<sweep name>``; a local path or
            a URI such as ``s3://bucket/prefix/name``).

    Returns:
        The trials, in Tune's order, with their status, config, run metadata and storage.

    Raises:
        ValueError: if `path` holds no readable Tune experiment snapshot.
    """
    try:
        return _analysis_class()(path).trials
    except Exception as exc:  # noqa: BLE001 (missing or unreadable experiment state)
        raise ValueError(f"no Tune experiment state under {path}: "
                         f"{' '.join(str(exc).split())[:200]}") from None


class TrialState(NamedTuple):
    """A trial's id and status in Tune's experiment snapshot (``TERMINATED``, ``ERROR``, ...)."""

    trial_id: str
    status: str


def snapshot_states(path: str) -> list[TrialState]:
    """``trial_id`` and status of each trial of Tune's last experiment snapshot at `path`.

    Reads the snapshot's JSON only: none of Tune's trials (~20 KiB each) is restored. A trial
    that was running when the snapshot was taken is ``PENDING``, as Tune restores it.

    Args:
        path: the sweep's experiment folder (a local path or a URI such as ``s3://...``).

    Returns:
        The trials' states, in Tune's order.

    Raises:
        ValueError: if `path` holds no readable Tune experiment snapshot.
    """
    try:
        return _analysis_class(states_only=True)(path).trials
    except Exception as exc:  # noqa: BLE001 (missing or unreadable experiment state)
        raise ValueError(f"no Tune experiment state under {path}: "
                         f"{' '.join(str(exc).split())[:200]}") from None


@contextlib.contextmanager
def without_result_frames() -> Iterator[None]:
    """Within it, the end of a Tuner's ``fit()`` reads no trial's ``result.json``.

    Tune's ``fit()`` ends by opening an ``ExperimentAnalysis`` of the experiment, which reads
    every trial's reports into a pandas DataFrame for the ``ResultGrid`` it returns (~40 KiB
    and ~7 ms of the driver per raysearch trial: 0.4 GiB at the end of a 10,000-trial sweep).
    A sweep reads the reports itself (:func:`read_trials`); here the ``ResultGrid``'s results
    carry no ``metrics_dataframe`` (their metrics and checkpoints are Tune's as ever). It holds
    for every Tuner of the process that ends while it lasts.
    """
    import ray.tune.tune as tune_run

    original = getattr(tune_run, "ExperimentAnalysis", None)
    if original is None:  # (Tune's run() no longer names it: nothing to replace)
        yield
        return
    tune_run.ExperimentAnalysis = _analysis_class()
    try:
        yield
    finally:
        tune_run.ExperimentAnalysis = original


@functools.cache
def _analysis_class(states_only: bool = False) -> type:
    """``ExperimentAnalysis`` without its per-trial DataFrames (made at first use: Ray).

    With `states_only`, its ``trials`` are :class:`TrialState` read from the snapshot's JSON.
    """
    from ray.tune import ExperimentAnalysis

    class TrialsOnly(ExperimentAnalysis):
        def _fetch_trial_dataframes(self) -> dict[str, Any]:
            return {}  # (Tune's hook; were it renamed, the DataFrames would be read again)

    class StatesOnly(TrialsOnly):
        def _load_trials(self) -> list[Any]:  # (Tune's hook, as above)
            with self._fs.open_input_stream(self._experiment_json_fs_path) as f:
                return read_states(f)

        def get_all_configs(self, prefix: bool = False) -> dict[str, Any]:
            return {}

    return StatesOnly if states_only else TrialsOnly


def read_states(stream: Any, chunk: int = 1 << 20) -> list[TrialState]:
    """The :class:`TrialState` of each trial of a Tune experiment snapshot, read from `stream`.

    The snapshot (a JSON object whose ``trial_data`` is a list of ``[trial state, run
    metadata]`` pairs of JSON strings; ~9 KiB a trial) is decoded one pair at a time, `chunk`
    bytes read at a time: the memory it takes does not grow with the number of trials. Tune's
    pickled objects in it stay text (plain JSON; nothing is unpickled).

    Args:
        stream: a binary stream with a ``read(n)`` method (a file, a pyarrow input stream).
        chunk: bytes per read.

    Raises:
        ValueError: if the stream holds no ``trial_data`` list or ends inside it.
    """
    decoder, text = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8")()
    buffer, pos, ended, states = "", -1, False, []

    def more() -> None:
        nonlocal buffer, pos, ended
        data = stream.read(chunk)
        ended = not data
        start = 0 if pos < 0 else pos
        buffer, pos = buffer[start:] + text.decode(data, final=ended), 0 if pos >= 0 else -1

    while pos < 0:  # the start of the trial_data list
        key = buffer.find('"trial_data"')
        bracket = buffer.find("[", key) if key >= 0 else -1
        if bracket >= 0:
            pos = bracket + 1
        elif ended:
            raise ValueError("the snapshot has no trial_data list")
        else:
            more()
    while True:
        while pos < len(buffer) and buffer[pos] in " \t\r\n,":
            pos += 1
        if pos < len(buffer) and buffer[pos] == "]":
            return states
        try:
            (state, _), pos = decoder.raw_decode(buffer, pos)
        except json.JSONDecodeError:
            if ended:
                raise ValueError("the snapshot ends inside its trial_data list") from None
            more()
            continue
        states.append(_trial_state(json.loads(state)))


def _trial_state(state: dict[str, Any]) -> TrialState:
    """The :class:`TrialState` of one trial's state in Tune's snapshot (running: pending)."""
    status = state["status"]
    return TrialState(state["trial_id"], "PENDING" if status == "RUNNING" else status)


def read_trials(path: str) -> list[TrialRecords]:
    """Every trial of the Tune experiment at `path`, with its reports, status and error.

    Args:
        path: the sweep's experiment folder (``<storage path>/<sweep name>``; a local path or
            a URI such as ``s3://bucket/prefix/name``).

    Returns:
        One :class:`TrialRecords` per trial of Tune's last experiment snapshot, in Tune's
        order. A torn last line of a ``result.json`` (a report cut off by a kill) is skipped.

    Raises:
        ValueError: if `path` holds no Tune experiment snapshot.
    """
    out = []
    for index, trial in enumerate(snapshot_trials(path)):
        fs, folder = trial.storage.storage_filesystem, trial.storage.trial_fs_path
        results = _read_results(fs, f"{folder}/{RESULT_FILE}")
        error = ""
        if trial.status == "ERROR" and trial.run_metadata.error_filename:
            error = error_line(_read_text(fs, f"{folder}/{trial.run_metadata.error_filename}")
                               or str(trial.run_metadata.error_filename))
        failures = int(getattr(trial, "num_failures", 0) or 0)
        retries = max(failures - (trial.status == "ERROR"), 0)
        out.append(TrialRecords(
            trial_id=trial.trial_id, index=index, config=dict(trial.config),
            status=trial.status, results=results, error=error, retries=retries,
            checkpoint=trial.checkpoint))
    return out


def _read_text(fs: Any, path: str) -> str:
    try:
        with fs.open_input_stream(path) as f:
            return f.read().decode("utf-8", errors="replace")
    except (FileNotFoundError, OSError):
        return ""


def _read_results(fs: Any, path: str) -> list[dict[str, Any]]:
    results = []
    for line in _read_text(fs, path).splitlines():
        if not line.strip():
            continue
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:  # the last report, cut off by a kill
            logger.warning("skipping a torn line of %s", path)
    return results


def reconcile_sweep(client: Any, parent: Any, trials: list[TrialRecords], *,
                    describe: Callable[[dict[str, Any]], tuple[str, dict[str, Any], str]],
                    repeats: int = 1, write_unfinished: bool = True,
                    progress: Callable[[str], None] | None = None,
                    runs: list[Any] | None = None) -> Reconciled:
    """Write what the sweep's child runs lack of Tune's records of its trials.

    Args:
        client: MLflow client of the sweep's store.
        parent: the sweep's parent run (an ``mlflow.entities.Run``).
        trials: Tune's records of the sweep's trials (:func:`read_trials`).
        describe: ``config -> (config JSON, params, short method name)`` (the sweep's
            :meth:`~raysearch.tracking.MlflowSweepCallback.describe`).
        repeats: seeds per configuration (``--repeats``).
        write_unfinished: also fill in the epochs of trials Tune has not ended (False while
            another driver may still be writing them).
        progress: called with one line per 25 trials read and written (long sweeps).
        runs: the sweep's runs (:func:`raysearch.tracking.sweep_runs`) when just read; None:
            read here.

    Returns:
        What was written (:class:`~raysearch.tracking.reconcile.Reconciled`).

    Raises:
        mlflow.exceptions.MlflowException: when the store stops answering (what was written
            stays written; the next pass writes the rest).
    """
    name = parent.data.tags.get(tracking.SWEEP_TAG, "")
    if runs is None:
        runs = tracking.sweep_runs(client, parent.info.experiment_id, parent.info.run_id)
    runs = SweepRuns.index(client, parent.info.experiment_id, parent.info.run_id, name, runs,
                           repeats=repeats)
    runs.stamped = tracking.TABLE_TAG in parent.data.tags
    done = Reconciled()
    for number, trial in enumerate(trials, 1):
        done.add(reconcile_trial(runs, trial, describe, write_unfinished=write_unfinished))
        if progress is not None and number % 25 == 0 and number < len(trials):
            progress(f"  sync: {number}/{len(trials)} trials checked")
    return done


def trial_weights(path: str, trial_id: str) -> dict[str, Any]:
    """The model weights (a state dict) of trial `trial_id`'s last checkpoint in Tune's storage.

    Args:
        path: the sweep's experiment folder (``<storage path>/<sweep name>``).
        trial_id: Tune's trial id (the child run's ``raysearch.trial_id`` tag).

    Returns:
        The ``model`` entry of the checkpoint's ``state.pt`` (read with ``weights_only=True``):
        the network's weights at the end of the trial.

    Raises:
        ValueError: if the experiment has no such trial, or the trial no readable checkpoint.
    """
    from raysearch.tune.checkpoints import STATE_FILE, load_state, read_state

    trial = next((t for t in read_trials(path) if t.trial_id == trial_id), None)
    if trial is None:
        raise ValueError(f"Tune's storage at {path} has no trial {trial_id}")
    if trial.checkpoint is None:
        raise ValueError(f"trial {trial_id} has no checkpoint in Tune's storage at {path}")
    try:
        state = load_state(read_state(trial.checkpoint.filesystem, trial.checkpoint.path)[0])
    except OSError as exc:
        raise ValueError(f"trial {trial_id}'s last checkpoint has no readable {STATE_FILE}: "
                         f"{exc}") from None
    if "model" not in state:
        raise ValueError(f"trial {trial_id}'s checkpoint {STATE_FILE} holds no model weights")
    return state["model"]


def repair_checkpoints(trials: list[TrialRecords], say: Callable[[str], None]) -> int:
    """Give every unfinished trial a checkpoint at the path Tune's snapshot names.

    Tune deletes a trial's oldest kept checkpoint when it registers a newer one, and writes its
    experiment snapshot (what ``Tuner.restore`` reads) a moment later; a driver killed in
    between leaves a snapshot that names a deleted checkpoint, and Tune would fail the resumed
    trial ("does not exist on storage anymore"). The newest readable checkpoint of the trial
    (its ``state.pt`` loads, at an epoch the trial's ``result.json`` reports: a checkpoint
    written after the last report Tune processed would skip epochs the records lack) is copied
    to the path the snapshot names, so the trial resumes from the last good state; with none
    an empty folder is made there, and the trial starts again from scratch
    (:func:`raysearch.tune.checkpoints.resume_state` says so).

    Args:
        trials: Tune's records of the sweep's trials (:func:`read_trials`).
        say: called with one line per repaired trial.

    Returns:
        How many trials were repaired.
    """
    from pyarrow import fs as pafs

    from raysearch.tune.checkpoints import read_state, trial_checkpoints

    repaired = 0
    for trial in trials:
        if trial.ended or trial.checkpoint is None:
            continue
        fs, missing = trial.checkpoint.filesystem, trial.checkpoint.path.rstrip("/")
        if fs.get_file_info(missing).type != pafs.FileType.NotFound:
            continue
        reported = max(trial.epochs(), default=0)
        good, epoch = None, None
        for _, candidate in trial_checkpoints(fs, str(PurePosixPath(missing).parent)):
            try:
                epoch = read_state(fs, candidate)[1]
            except (OSError, ValueError):
                continue
            if epoch <= reported:
                good = candidate
                break
        fs.create_dir(missing)
        if good is not None:
            pafs.copy_files(good, missing, source_filesystem=fs, destination_filesystem=fs)
            say(f"  trial {trial.trial_id}: its checkpoint {PurePosixPath(missing).name} was "
                f"deleted after Tune's last snapshot; resuming from {PurePosixPath(good).name} "
                f"(epoch {epoch})")
        else:
            say(f"  trial {trial.trial_id}: no readable checkpoint left; it starts again")
        repaired += 1
    return repaired
