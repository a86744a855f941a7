"""Continuing a sweep: ``--resume`` after its driver was killed, ``sync`` of its records.

:func:`resume_sweep` restores Tune's experiment from the sweep's storage and goes on with the
same parent run; :func:`sync_sweep` writes what MLflow lacks of Tune's records
(:mod:`raysearch.tune.sync`); :func:`sweep_experiment_path` locates a sweep's Tune storage.
Both read the sweep's record (:mod:`raysearch.tune.sweep_record`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from ray import tune

from raysearch import tracking
from raysearch.tune import study as sweep_study
from raysearch.tune.cluster import (
    check_gpus,
    check_ray_address,
    check_tracking_for_cluster,
    init_ray,
)
from raysearch.tune.engine import SweepResult, describer, execute
from raysearch.tune.heap import frozen_heap
from raysearch.tune.plan import make_plan
from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import SearchSpace, TrialConfigs
from raysearch.tune.storage import check_storage, resolve_storage
from raysearch.tune.sweep_record import SWEEP_RECORD, driver_alive, driver_id, load_record
from raysearch.tune.sync import read_trials, reconcile_sweep, repair_checkpoints

__all__ = ["resume_sweep", "sweep_experiment_path", "sync_sweep"]

logger = logging.getLogger(__name__)


@frozen_heap()
def resume_sweep(name: str, *, tracking_uri: str | None = None,
                 experiment: str = tracking.DEFAULT_EXPERIMENT, address: str | None = None,
                 progress: Callable[[str], None] | None = None,
                 components: dict[str, dict[str, Any]] | None = None,
                 storage_path: str | None = None) -> SweepResult:
    """Continue sweep `name` after its driver was killed or interrupted (``sweep --resume``).

    The sweep's settings and search space come from its record (``sweep.json`` of the parent
    run); Tune's experiment state, the Optuna searcher and the trials' checkpoints come from
    its storage path (``Tuner.restore``). Finished trials are not run again; unfinished ones
    and ones that had failed resume from their last checkpoints (``resume_unfinished``,
    ``resume_errored``: the same trial ids, so each keeps its one MLflow child run, set RUNNING
    again); the searcher samples the trials the sweep still lacks. The parent run is reopened,
    not recreated, and gets the selection, plot and table at the end as usual.

    Args:
        name: the sweep's name (``--name``, or the ``<space>-<timestamp>`` it printed).
        tracking_uri: the store the sweep was tracked in (default as for a sweep).
        experiment: its MLflow experiment.
        address: the Ray cluster to continue on (default: the sweep's own ``--address``).
        progress: as for :func:`~raysearch.tune.engine.run_sweep`.
        components: the objects a sweep started from Python was given (as for
            :func:`~raysearch.tune.engine.run_sweep`): names recorded as ``__main__:...``
            need them again.
        storage_path: where the sweep's Tune storage is now (default: the path it was started
            with, from its record): the same path, or a folder (URI) the storage was moved or
            copied to; the sweep's own experiment folder ``<path>/<name>`` is accepted too. The
            record then points to it for later resumes.

    Returns:
        The :class:`~raysearch.tune.engine.SweepResult` over all the sweep's trials.

    Raises:
        ValueError: if the sweep is unknown, already finished, has no record (made by an
            older raysearch) or no Tune experiment state at its storage path (with
            `storage_path`: one line naming the path and the one the sweep was started with).
    """
    say = progress or (lambda line: logger.info("%s", line))
    client, uri = tracking.get_client(tracking_uri)
    parent = tracking.find_sweep(client, name, experiment)
    if parent.info.status == "FINISHED" and not _has_errored_trials(client, parent):
        raise ValueError(f"sweep '{name}' already finished with no failed trial; nothing to "
                         f"resume (`raysearch report {name}` shows it)")
    record = load_record(client, parent.info.run_id, name)
    storage = _resume_storage(record, name, storage_path)
    path = f"{storage.rstrip('/')}/{name}"
    recorded = SweepSettings.from_record(record["settings"])
    settings = recorded.with_values(
        tracking_uri=uri, experiment=experiment, name=name, storage_path=storage,
        address=recorded.address if address is None else address)
    if sweep_study.STORAGE_TAG in parent.data.tags:  # the restored searcher reconnects to it
        sweep_study.load_sweep_study(parent)
    if not tune.Tuner.can_restore(path):
        raise ValueError(f"sweep '{name}' cannot be resumed: no Tune experiment state under "
                         f"{path} (the driver stopped before Tune's first snapshot); start it "
                         "again with another --name")
    if storage.rstrip("/") != record["storage_path"].rstrip("/"):
        say(f"sweep {name}: storage {record['storage_path']} -> {storage} (recorded for later "
            "resumes)")
        record["storage_path"] = storage
        client.log_text(parent.info.run_id, json.dumps(record, indent=1), SWEEP_RECORD)
    plan = make_plan(SearchSpace.from_dict(record["space"]), settings, say, components)
    check_tracking_for_cluster(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"),
                               settings.address)
    check_ray_address(settings.address)
    init_ray(settings.address, plan.modules)
    check_gpus(settings.resources, settings.address)
    _reopen(client, parent, plan, path, say)
    count = (f"{settings.num_samples} trials" if settings.repeats == 1 else
             f"{settings.num_samples} configurations x {settings.repeats} seeds")
    say(f"resuming sweep {name} from {path} ({count} of space "
        f"'{plan.space.name}' on {plan.dataset}); MLflow {uri} (experiment '{experiment}')")
    result = execute(plan, client, uri, parent.info.experiment_id, parent.info.run_id, name,
                     storage, say, restore=path, components=components)
    if not result.interrupted:  # asks of the killed driver that no trial ran stay RUNNING
        sweep_study.fail_stale_trials(parent)
    return result


def _reopen(client: Any, parent: Any, plan: Any, path: str, say: Callable[[str], None]) -> None:
    """Set the parent RUNNING again (a resume more) and write what the killed driver did not.

    What Tune recorded and MLflow lacks is written from Tune's records before the trials go
    on; a snapshot naming a checkpoint Tune had deleted is repaired first.
    """
    parent_id = parent.info.run_id
    client.update_run(parent_id, status="RUNNING")
    resumes = int(parent.data.tags.get("raysearch.resumes", 0)) + 1
    client.set_tag(parent_id, "raysearch.resumes", str(resumes))
    client.set_tag(parent_id, tracking.DRIVER_TAG, driver_id())
    trials = read_trials(path)
    repair_checkpoints(trials, say)
    done = reconcile_sweep(client, parent, trials, describe=describer(plan.trial_configs),
                           repeats=plan.settings.repeats, progress=say)
    if done.changed:
        say(f"sweep {parent.data.tags.get(tracking.SWEEP_TAG, '')}: MLflow caught up with "
            f"Tune's records ({done.summary()})")


def _resume_storage(record: dict[str, Any], name: str, given: str | None) -> str:
    """The storage root a resumed sweep reads Tune's state from (see :func:`resume_sweep`)."""
    if given is None:
        check_storage(record["storage_path"])
        return record["storage_path"]
    storage = resolve_storage(given).rstrip("/")
    check_storage(storage)
    if tune.Tuner.can_restore(f"{storage}/{name}"):
        return storage
    parent, _, leaf = storage.rpartition("/")
    if leaf == name and parent and tune.Tuner.can_restore(storage):
        return parent  # the sweep's own experiment folder
    raise ValueError(f"--storage-path {given} does not hold sweep '{name}' (no Tune experiment "
                     f"state at {storage}/{name}); give the path it was started with "
                     f"({record['storage_path']}) or the folder it was moved to")


def _has_errored_trials(client: Any, parent: Any) -> bool:
    """True when a trial of the sweep ended FAILED by an error (``--resume`` retries those)."""
    runs = tracking.sweep_runs(client, parent.info.experiment_id, parent.info.run_id)
    return any(r.data.tags.get(tracking.OUTCOME_TAG) == "error" for r in runs
               if r.data.tags.get(tracking.TRIAL_TAG))


def sync_sweep(name: str, *, tracking_uri: str | None = None,
               experiment: str = tracking.DEFAULT_EXPERIMENT, storage_path: str | None = None,
               progress: Callable[[str], None] | None = None) -> Any:
    """Write what sweep `name`'s MLflow runs lack of Tune's records (``raysearch sync NAME``).

    Every trial Tune recorded gets its child run (made if missing), each epoch's metrics once
    (by step), its params, node, checkpoint and retry tags, its outcome, the artifacts of its
    last checkpoint and its status; then, if anything was written or the parent lacks its
    trials table, the parent gets the selection, ``pareto.png``, ``trials.parquet`` and
    ``best_config.yaml``, and ends FINISHED when every trial ended. Running it twice writes
    nothing the second time. Runs of trials that ended with every record written (tag
    ``raysearch.recorded``) are not read again.

    A sweep whose driver is alive on this machine is refused; one whose parent run is still
    RUNNING (a killed driver, or one on another machine) gets the records of its ended trials
    only: ``raysearch sweep --resume NAME`` continues the others (and syncs them first).

    Args:
        name: the sweep's name.
        tracking_uri: its store (default as for a sweep).
        experiment: its MLflow experiment.
        storage_path: where its Tune storage is now (default: the path it was started with;
            as for :func:`resume_sweep`).
        progress: called with a few readable lines.

    Returns:
        What was written (:class:`~raysearch.tracking.reconcile.Reconciled`).

    Raises:
        ValueError: if the store does not answer, the sweep is unknown, has no record, its
            storage is missing, or its driver is still running on this machine.
    """
    say = progress or (lambda line: logger.info("%s", line))
    client, uri = tracking.get_client(tracking_uri)
    tracking.check_tracking_uri(uri)
    parent = tracking.find_sweep(client, name, experiment)
    record = load_record(client, parent.info.run_id, name)
    settings = SweepSettings.from_record(record["settings"])
    configs = TrialConfigs(SearchSpace.from_dict(record["space"]), settings.config_overrides())
    storage = _resume_storage(record, name, storage_path)
    path = f"{storage.rstrip('/')}/{name}"
    running = parent.info.status == "RUNNING"
    if running and driver_alive(parent.data.tags.get(tracking.DRIVER_TAG, "")):
        raise ValueError(f"sweep '{name}' is still running (driver "
                         f"{parent.data.tags[tracking.DRIVER_TAG]}); sync it once it ended")
    done = reconcile_sweep(client, parent, read_trials(path),
                           describe=describer(configs),
                           repeats=settings.repeats, write_unfinished=not running,
                           progress=say)
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    if done.changed or "trials.parquet" not in names or (running and not done.unfinished):
        status = "FINISHED" if not done.unfinished else (
            "KILLED" if running else parent.info.status)
        frame = tracking.finalize_sweep(client, parent.info.run_id,
                                        tolerance=settings.tolerance, ece_key=settings.ece_key,
                                        status=status, selection=settings.selection,
                                        accuracy_key=settings.accuracy_key)
        done.runs_ended += int(status != parent.info.status)
        say(f"sweep {name}: selection, Pareto plot and trials table written "
            f"({int(frame['complete'].sum()) if not frame.empty else 0} complete trials)")
    if done.unfinished:
        say(f"sweep {name}: {len(done.unfinished)} trials unfinished in Tune's records; "
            f"`raysearch sweep --resume {name}` continues them")
    return done


def sweep_experiment_path(client: Any, parent: Any, storage_path: str | None = None) -> str:
    """The sweep's experiment folder in Tune's storage (``<storage path>/<name>``).

    Args:
        client: MLflow client of the sweep's store.
        parent: the sweep's parent run.
        storage_path: where its storage is now (default: the path in its record).

    Raises:
        ValueError: if the sweep has no record or its storage holds no Tune experiment.
    """
    name = parent.data.tags.get(tracking.SWEEP_TAG, "")
    record = load_record(client, parent.info.run_id, name)
    return f"{_resume_storage(record, name, storage_path).rstrip('/')}/{name}"
