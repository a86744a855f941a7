"""Reconcile a sweep's MLflow runs with the trials' records that Ray Tune keeps on disk.

Tune writes every report of a trial to its ``result.json`` in the sweep's storage, while the
MLflow runs are written once, live, by :class:`~raysearch.tracking.callback.MlflowSweepCallback`.
When the tracking server is away for longer than its client's own retries, or the driver is
killed with writes still queued, records are missing from MLflow. :func:`reconcile_trial`
compares one trial's records (a :class:`TrialRecords`, read by
:mod:`raysearch.tune.sync`) with its child run and writes what is missing:

- the child run itself (named, tagged and with the params a live sweep gives it);
- every epoch's metrics, each ``(metric, epoch)`` exactly once: a value MLflow already holds at
  that step is never written again (the first report of an epoch wins, as live: a retried
  trial reports the epochs after its checkpoint again);
- the node and checkpoint-epoch tags, the retry count;
- for a trial Tune ended: its outcome tags, the artifacts of its last checkpoint (logits,
  reliability diagram) if the run has none, and its status (FINISHED or FAILED);

then tags the run :data:`~raysearch.tracking.runs.RECORDED_TAG`, so that a later pass leaves it
unread. A second pass over the same records writes nothing.

It imports :mod:`raysearch.tracking.client`, :mod:`~raysearch.tracking.runs` and
:mod:`raysearch.training.records`; :mod:`raysearch.tune.sync` uses it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raysearch.tracking.client import _numeric_metrics, log_params
from raysearch.tracking.runs import (
    COMPLETE_TAG,
    CONFIG_TAG,
    CONFIGURATION_TAG,
    DEGENERATE_TAG,
    ERROR_TAG,
    NODE_KEY,
    NODE_TAG,
    OUTCOME_TAG,
    PARENT_TAG,
    RECORDED_TAG,
    REPEATS_TAG,
    RESUMED_TAG,
    RETRIES_TAG,
    SKIPPED_TAG,
    SWEEP_TAG,
    TABLE_TAG,
    TRIAL_TAG,
)
from raysearch.training.records import (
    ARTIFACT_FILES,
    CHECKPOINT_SKIPPED,
    COMPLETED,
    CONFIG_ID_KEY,
    DEGENERATE_CALIBRATORS,
    DIVERGED,
    EPOCH_HISTORY,
    RESUMED_FROM,
    SEED_INDEX_KEY,
)

logger = logging.getLogger("raysearch.tracking")

#: What a store that stops answering raises (after its client's own retries).
STORE_ERRORS = (MlflowException, OSError)
#: Tune's statuses of a trial that will not run again (unless a resume retries an ERROR).
ENDED = ("TERMINATED", "ERROR")
_BATCH = 1000  # MLflow's limit of metrics per log_batch request


def error_line(text: str) -> str:
    """The line of a Tune error file that names the error (its last ``...Error``/``Exception``)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    return (errors[-1] if errors else lines[-1]).strip() if lines else "unknown error"


@dataclass
class TrialRecords:
    """What Ray Tune's storage holds of one trial of a sweep.

    Attributes:
        trial_id: Tune's trial id (the child run's ``raysearch.trial_id`` tag).
        index: the trial's position in the sweep (0-based, Tune's order): numbers a run that
            the reconciliation creates, as the live sweep numbers its runs.
        config: the trial's config as sampled (Tune's ``params.json``).
        status: Tune's status: ``TERMINATED``, ``ERROR``, or ``RUNNING``/``PENDING``/``PAUSED``
            for a trial a killed driver left unfinished.
        results: every report of the trial in order (the lines of its ``result.json``).
        error: the last line of the trial's error (empty unless ``status == "ERROR"``).
        retries: how many times Tune retried the trial (``num_failures`` of an ended trial,
            failures of the ones before; 0 if none).
        checkpoint: the trial's last checkpoint Tune registered (a ``tune.Checkpoint``: its
            ``path`` and ``filesystem`` in the storage), or None without one.
    """

    trial_id: str
    index: int
    config: dict[str, Any]
    status: str
    results: list[dict[str, Any]]
    error: str = ""
    retries: int = 0
    checkpoint: Any = None

    @property
    def ended(self) -> bool:
        """True when Tune ended the trial (TERMINATED or ERROR)."""
        return self.status in ENDED

    def epochs(self) -> dict[int, dict[str, float]]:
        """``{epoch: {metric: value}}`` of every reported epoch, the first report of each winning.

        A report carries its own epoch and the unreported ones before it
        (:data:`~raysearch.training.records.EPOCH_HISTORY`); a retried attempt reports the epochs
        after its checkpoint again, and its first value of a metric at an epoch is kept, as the
        live callback keeps it.
        """
        out: dict[int, dict[str, float]] = {}
        for result in self.results:
            for entry in [*result.get(EPOCH_HISTORY, ()), result]:
                step = int(entry.get("epoch", result.get("training_iteration", 0)))
                for key, value in _numeric_metrics(entry).items():
                    out.setdefault(step, {}).setdefault(key, value)
        return out

    def last_tag_values(self) -> dict[str, str]:
        """The node, checkpoint-epoch, skipped-checkpoint and degenerate-calibrator tags.

        Each from the last report that has it.
        """
        tags: dict[str, str] = {}
        for result in self.results:
            for key, tag, kind in ((NODE_KEY, NODE_TAG, str), (RESUMED_FROM, RESUMED_TAG, int),
                                   (CHECKPOINT_SKIPPED, SKIPPED_TAG, str),
                                   (DEGENERATE_CALIBRATORS, DEGENERATE_TAG, str)):
                value = result.get(key)
                if isinstance(value, kind) and not isinstance(value, bool):
                    tags[tag] = str(value)
        return tags


@dataclass
class Reconciled:
    """What one reconciliation wrote (all zero: MLflow already held every record).

    Attributes:
        runs_created: child runs (and configuration runs) made for trials MLflow lacked.
        metrics_written: metric values written (one per metric and epoch).
        runs_ended: runs whose outcome or status was set or changed.
        artifacts: files attached from the trials' last checkpoints.
        tags_written: other tags set (node, checkpoint epoch, retries, recorded).
        unfinished: trials Tune has not ended (left RUNNING or as they are).
    """

    runs_created: int = 0
    metrics_written: int = 0
    runs_ended: int = 0
    artifacts: int = 0
    tags_written: int = 0
    unfinished: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """True when anything was written."""
        return bool(self.runs_created or self.metrics_written or self.runs_ended
                    or self.artifacts or self.tags_written)

    def add(self, other: Reconciled) -> None:
        """Add `other`'s counts to these."""
        self.runs_created += other.runs_created
        self.metrics_written += other.metrics_written
        self.runs_ended += other.runs_ended
        self.artifacts += other.artifacts
        self.tags_written += other.tags_written
        self.unfinished.extend(other.unfinished)

    def summary(self) -> str:
        """One readable line of the counts."""
        if not self.changed:
            return "MLflow already held every record"
        return (f"{self.runs_created} runs created, {self.metrics_written} metric values, "
                f"{self.runs_ended} outcomes, {self.artifacts} artifacts and "
                f"{self.tags_written} tags written")


@dataclass
class SweepRuns:
    """A sweep's runs in MLflow, indexed for :func:`reconcile_trial`.

    Attributes:
        client: client of the sweep's store.
        experiment_id: the sweep's experiment.
        parent_run_id: the sweep's parent run.
        sweep_name: the sweep's name (prefix of run names).
        by_trial: trial id -> its run (an ``mlflow.entities.Run``).
        config_runs: configuration id -> run id of a repeated sweep's configuration run.
        repeats: seeds per configuration (``--repeats``).
        stamped: the parent carries :data:`~raysearch.tracking.runs.TABLE_TAG` (removed by
            :meth:`unstamp` before the first write).
    """

    client: MlflowClient
    experiment_id: str
    parent_run_id: str
    sweep_name: str
    by_trial: dict[str, Any]
    config_runs: dict[str, str]
    repeats: int = 1
    stamped: bool = False

    def unstamp(self) -> None:
        """Remove the parent's :data:`~raysearch.tracking.runs.TABLE_TAG` (once), before a write.

        Its ``trials.parquet`` is then no longer read back as current
        (:func:`~raysearch.tracking.sweeps.stored_trials`) until the selection runs again.
        """
        if self.stamped:
            self.stamped = False
            try:
                self.client.delete_tag(self.parent_run_id, TABLE_TAG)
            except MlflowException:  # removed since it was read
                pass

    @classmethod
    def index(cls, client: MlflowClient, experiment_id: str, parent_run_id: str,
              sweep_name: str, runs: list[Any], repeats: int = 1) -> SweepRuns:
        """Index `runs` (:func:`~raysearch.tracking.sweeps.sweep_runs` of the parent)."""
        by_trial, config_runs = {}, {}
        for run in runs:
            tags = run.data.tags
            if tags.get(TRIAL_TAG):
                by_trial.setdefault(tags[TRIAL_TAG], run)
            elif tags.get(CONFIGURATION_TAG):
                config_runs.setdefault(tags[CONFIGURATION_TAG], run.info.run_id)
        return cls(client, experiment_id, parent_run_id, sweep_name, by_trial, config_runs,
                   repeats)


def reconcile_trial(runs: SweepRuns, trial: TrialRecords,
                    describe: Callable[[dict[str, Any]], tuple[str, dict[str, Any], str]],
                    *, write_unfinished: bool = True) -> Reconciled:
    """Write what `trial`'s child run lacks of the trial's records (see the module docstring).

    Args:
        runs: the sweep's runs (updated with a run this call creates).
        trial: the trial's records in Tune's storage.
        describe: ``config -> (config JSON, params, short method name)`` of a trial config
            (:meth:`~raysearch.tracking.callback.MlflowSweepCallback.describe`).
        write_unfinished: False: a trial Tune has not ended is left alone (a live driver may
            be writing it); True: its epochs are filled in too (the run stays as it is).

    Returns:
        What was written (:class:`Reconciled`).

    Raises:
        mlflow.exceptions.MlflowException: when the store does not answer (nothing is lost:
            the records stay in Tune's storage for the next pass).
    """
    done = Reconciled()
    client = runs.client
    run = runs.by_trial.get(trial.trial_id)
    if not trial.ended:
        done.unfinished.append(trial.trial_id)
        if not write_unfinished:
            return done
    elif run is not None and run.data.tags.get(RECORDED_TAG) == "true" \
            and run.info.status in ("FINISHED", "FAILED"):
        return done  # every record reached it
    runs.unstamp()  # what follows writes to the sweep's runs
    if run is None:
        run = _create_run(runs, trial, describe)
        done.runs_created += 1
    run_id = run.info.run_id
    if not run.data.params:  # created, then the server went away before its params
        log_params(client, run_id, _params(trial, describe, runs.repeats))
    epochs = trial.epochs()
    done.metrics_written = _fill_epochs(client, run_id, epochs)
    tags = {k: v for k, v in trial.last_tag_values().items() if run.data.tags.get(k) != v}
    if trial.retries and run.data.tags.get(RETRIES_TAG) != str(trial.retries):
        tags[RETRIES_TAG] = str(trial.retries)
    if tags:
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        done.tags_written += len(tags)
    if trial.ended:
        done.add(_end_run(client, run, trial))
    return done


def _params(trial: TrialRecords, describe: Callable, repeats: int) -> dict[str, Any]:
    _, params, _ = describe(trial.config)
    if repeats > 1 and SEED_INDEX_KEY in trial.config:
        params = {**params, "seed_index": trial.config[SEED_INDEX_KEY]}
    return params


def _create_run(runs: SweepRuns, trial: TrialRecords, describe: Callable) -> Any:
    """The child run a live sweep would have made for `trial` (under its configuration run)."""
    client = runs.client
    cfg_json, params, method = describe(trial.config)
    parent, tags = runs.parent_run_id, {}
    name = f"{runs.sweep_name}-{trial.index:03d}-{method}"
    gid = trial.config.get(CONFIG_ID_KEY) if runs.repeats > 1 else None
    if gid is not None:
        if gid not in runs.config_runs:
            base = {k: v for k, v in trial.config.items() if k != SEED_INDEX_KEY}
            base_json, base_params, _ = describe(base)
            config_run = client.create_run(
                runs.experiment_id, run_name=f"{runs.sweep_name}-{gid}-{method}",
                tags={PARENT_TAG: runs.parent_run_id, SWEEP_TAG: runs.sweep_name,
                      CONFIGURATION_TAG: gid, CONFIG_TAG: base_json,
                      REPEATS_TAG: str(runs.repeats)})
            log_params(client, config_run.info.run_id, {**base_params, "repeats": runs.repeats})
            runs.config_runs[gid] = config_run.info.run_id
        parent, tags = runs.config_runs[gid], {CONFIGURATION_TAG: gid}
        name += f"-seed{trial.config.get(SEED_INDEX_KEY, 0)}"
    run = client.create_run(runs.experiment_id, run_name=name, tags={
        PARENT_TAG: parent, SWEEP_TAG: runs.sweep_name, TRIAL_TAG: trial.trial_id,
        CONFIG_TAG: cfg_json, **tags})
    log_params(client, run.info.run_id, _params(trial, describe, runs.repeats))
    runs.by_trial[trial.trial_id] = client.get_run(run.info.run_id)
    return runs.by_trial[trial.trial_id]


def _fill_epochs(client: MlflowClient, run_id: str, epochs: dict[int, dict[str, float]]) -> int:
    """Log every ``(metric, epoch)`` of `epochs` the run's history lacks; returns how many."""
    keys = sorted({k for metrics in epochs.values() for k in metrics})
    missing = []
    for key in keys:
        logged = {m.step for m in client.get_metric_history(run_id, key)}
        missing.extend(Metric(key, metrics[key], 0, step) for step, metrics in epochs.items()
                       if key in metrics and step not in logged)
    for start in range(0, len(missing), _BATCH):
        client.log_batch(run_id, metrics=missing[start:start + _BATCH])
    return len(missing)


def _end_run(client: MlflowClient, run: Any, trial: TrialRecords) -> Reconciled:
    """Set the outcome, attach the last checkpoint's files and end the run, as Tune ended it."""
    done = Reconciled()
    run_id = run.info.run_id
    last = trial.results[-1] if trial.results else {}
    if trial.status == "ERROR":
        tags = {COMPLETE_TAG: "false", OUTCOME_TAG: "error",
                ERROR_TAG: (trial.error or "unknown error")[:4000]}
        status = "FAILED"
    elif last.get(DIVERGED):
        tags = {COMPLETE_TAG: "false", OUTCOME_TAG: "diverged", ERROR_TAG: str(last[DIVERGED])}
        status = "FAILED"
    else:
        complete = bool(last.get(COMPLETED, False))
        tags = {COMPLETE_TAG: str(complete).lower(),
                OUTCOME_TAG: "complete" if complete else "stopped_early"}
        status = "FINISHED"
        if complete and trial.checkpoint is not None:
            done.artifacts = _attach_artifacts(client, run_id, trial)
    changed = {k: v for k, v in tags.items() if run.data.tags.get(k) != v}
    if status != "FAILED" and ERROR_TAG in run.data.tags:  # a reopened run's old error
        client.delete_tag(run_id, ERROR_TAG)
        done.runs_ended = 1
    if changed:
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in changed.items()])
    if changed or run.info.status != status:
        client.set_terminated(run_id, status)
        done.runs_ended = 1
    client.set_tag(run_id, RECORDED_TAG, "true")
    done.tags_written += 1
    return done


def _attach_artifacts(client: MlflowClient, run_id: str, trial: TrialRecords) -> int:
    """Attach the trial's checkpoint files the run lacks; returns how many."""
    have = {a.path for a in client.list_artifacts(run_id)}
    attached = 0
    try:
        with trial.checkpoint.as_directory() as folder:
            for name in ARTIFACT_FILES:
                path = Path(folder) / name
                if name not in have and path.is_file():
                    client.log_artifact(run_id, str(path))
                    attached += 1
    except OSError as exc:  # a checkpoint gone from storage: the metrics still count
        logger.warning("artifacts of trial %s not attached: %s", trial.trial_id, exc)
    return attached
