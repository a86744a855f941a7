"""Build and run a sweep: Ray Tune ``Tuner`` + seeded ``OptunaSearch`` + MLflow tracking.

The default objective is the pair (validation accuracy max, validation ECE min) searched with
Optuna's multi-objective samplers: ECE alone is a degenerate target (a constant uniform predictor
has ECE 0 on balanced classes). After the last trial the selection rule ("lowest validation ECE
within `tolerance` of the best validation accuracy") picks the winner among trials that ran all
their epochs, and the parent MLflow run gets the Pareto plot, the trials table and the winner's
config.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from ray import tune
from ray.tune.logger import JsonLoggerCallback
from ray.tune.schedulers import ASHAScheduler

from raysearch import tracking
from raysearch.config import absolute_path
from raysearch.metrics import metric_direction
from raysearch.tracking import ui
from raysearch.tracking.reconcile import ENDED, STORE_ERRORS
from raysearch.tracking.searched import SEARCHED_TAG
from raysearch.tune import study as sweep_study
from raysearch.tune.cluster import (
    check_ray_address,
    check_resources,
    check_tracking_for_cluster,
    init_ray,
)
from raysearch.tune.heap import HeapTrim, frozen_heap
from raysearch.tune.lean_results import LeanResults, kept_metrics
from raysearch.tune.outcome import FailedTrial, failed_trials
from raysearch.tune.plan import SweepPlan, build_shift, make_plan
from raysearch.tune.searchers import CompletedOnlyOptunaSearch, RepeatedSearcher, make_sampler
from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import SearchSpace, TrialConfigs, load_space
from raysearch.tune.storage import check_storage, check_sweep_name, resolve_storage
from raysearch.tune.sweep_record import (
    SWEEP_RECORD,
    check_new_sweep_name,
    default_sweep_name,
    driver_id,
)
from raysearch.tune.sync import (
    read_trials,
    reconcile_sweep,
    snapshot_states,
    snapshot_trials,
    without_result_frames,
)
from raysearch.tune.trainable import trial_resources, tune_trial
from raysearch.tune.trial_options import TrialOptions

__all__ = ["SweepResult", "TrackingUnavailableError", "build_tuner", "describer", "execute",
           "run_sweep", "trial_options"]

logger = logging.getLogger(__name__)

#: Checkpoints Tune keeps per trial. Two, not one: Tune deletes a trial's older checkpoint when
#: it registers a newer one, while its experiment snapshot (what ``--resume`` reads) is written
#: a moment later; with one kept, a driver killed in between leaves a snapshot pointing at a
#: deleted checkpoint and the trial cannot resume ("does not exist on storage anymore").
_KEEP_CHECKPOINTS = 2


@dataclass
class SweepResult:
    """What a finished sweep returns.

    Attributes:
        name: the sweep's name.
        parent_run_id: MLflow parent run id.
        tracking_uri: where it was tracked.
        trials: a pandas DataFrame, one row per trial (per configuration with ``repeats``):
            ``trial`` (run name), ``run_id``, ``status``, ``complete``, the params (``method``,
            the loss's, ``lr``, ``model.<kw>``, ``optimizer.<kw>``, ...), the final metrics
            (``val_*``, ``test_*``), ``on_front`` and ``selected``.
        selected: the selected trial's row, or None when no trial finished.
        seconds: wall time of the sweep.
        interrupted: True when the sweep was stopped (Ctrl-C) before all its trials ended;
            ``raysearch sweep --resume NAME`` continues it.
        mlflow_link: the parent run in the MLflow UI's model-training view
            (:func:`raysearch.tracking.ui.run_link`); for a local store the UI is that of
            ``raysearch ui`` on its default port.
        mlflow_hint: how to serve that UI (``" (serve it with `raysearch ui`)"``), empty for a
            tracking server.
        failed: the trials that failed (raised after their retries, or diverged), by run name:
            :class:`~raysearch.tune.outcome.FailedTrial` records (``trial``, ``run_id``,
            ``outcome``, ``error`` on one line); the seed runs of a repeated sweep.
        searched: the names the space samples (``margin``, ``lr``, ``optimizer.weight_decay``,
            ``model.hidden``, ...), whose values the summaries show; None: not known.
    """

    name: str
    parent_run_id: str
    tracking_uri: str
    trials: pd.DataFrame
    selected: pd.Series | None
    seconds: float
    interrupted: bool = False
    mlflow_link: str = ""
    mlflow_hint: str = ""
    failed: list[FailedTrial] = field(default_factory=list)
    searched: tuple[str, ...] | None = None

    @property
    def completed(self) -> int:
        """How many trials (configurations, with ``repeats``) ran all their epochs."""
        return int(self.trials["complete"].sum()) if "complete" in self.trials else 0

    @property
    def front(self) -> pd.DataFrame:
        """The trials on the Pareto front (validation accuracy vs. validation ECE)."""
        if self.trials.empty or "on_front" not in self.trials:
            return self.trials.iloc[0:0]
        return self.trials[self.trials["on_front"]]


def _sizes(data: Any) -> str:
    return f"{len(data.train)} train / {len(data.val)} val / {len(data.test)} test samples"


@frozen_heap()  # from the checks to the selection (see frozen_heap)
def run_sweep(space: str | Path | SearchSpace, settings: SweepSettings | None = None, *,
              progress: Callable[[str], None] | None = None,
              components: dict[str, dict[str, Any]] | None = None) -> SweepResult:
    """Run one sweep end to end and return its trials table and selected trial.

    Args:
        space: a bundled space name (``acls``), a YAML path or a loaded SearchSpace.
        settings: sweep settings (defaults: 8 trials, 2 at a time, digits, Pareto objective).
        progress: called with one readable line per finished trial and a few status lines.
        components: objects given through the Python API instead of names, by kind and label
            (``{"models": {"__main__:make_net": make_net}}``); they reach the trials by value
            (cloudpickle), so callables defined in a notebook or a script work.

    Returns:
        The :class:`SweepResult`.

    Raises:
        ValueError: on an unknown space or name, an import string that does not import, a
            factory that raises or breaks its contract, an unreachable tracking URI, or a sweep
            name the experiment already has (use :func:`raysearch.tune.resume.resume_sweep`);
            all are checked before Ray starts, any trial runs or anything is written.
    """
    settings = settings or SweepSettings()
    if settings.name is not None:
        check_sweep_name(settings.name)  # (a resumed sweep keeps the name it had)
    space = space if isinstance(space, SearchSpace) else load_space(space)
    say = progress or (lambda line: logger.info("%s", line))
    # names, data, models, losses and optimizers fail here, before Ray or MLflow
    plan = make_plan(space, settings, say, components)
    say(plan.recipe_note)
    check_tracking_for_cluster(settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"),
                               settings.address)
    storage = resolve_storage(settings.storage_path)
    check_storage(storage)  # written and left as it was, before the store takes the name
    client, uri = tracking.get_client(settings.tracking_uri, write=True)
    name = settings.name or default_sweep_name(plan.space)
    check_new_sweep_name(client, settings.experiment, name)
    ray_client = (settings.address or "").startswith("ray://")  # the searcher runs on the head
    optuna_url = None if ray_client else sweep_study.optuna_storage_url(
        uri, storage, settings.optuna_storage)
    if optuna_url:
        sweep_study.check_new_study(optuna_url, name)
    experiment_id = tracking.ensure_experiment(client, settings.experiment, uri)
    check_ray_address(settings.address)
    init_ray(settings.address, plan.modules)
    check_resources(settings.resources, settings.address)
    parent_id = _start_parent(client, experiment_id, name, plan, storage, optuna_url)
    say(_start_line(name, plan, uri))
    return execute(plan, client, uri, experiment_id, parent_id, name, storage, say,
                   components=components)


def _start_parent(client: Any, experiment_id: str, name: str, plan: SweepPlan, storage: str,
                  optuna_url: str | None) -> str:
    """Create the sweep's parent run with its tags, params, record and dataset; its id."""
    settings = plan.settings
    parent = client.create_run(experiment_id, run_name=name,
                               tags={tracking.SWEEP_TAG: name, "raysearch.space": plan.space.name,
                                     tracking.DRIVER_TAG: driver_id(),
                                     SEARCHED_TAG: json.dumps(list(plan.space.searched())),
                                     **({sweep_study.STORAGE_TAG: optuna_url,
                                         sweep_study.STUDY_TAG: name} if optuna_url else {})})
    parent_id = parent.info.run_id
    tracking.log_params(client, parent_id, _parent_params(plan, storage))
    record = {"version": 1, "name": name, "storage_path": storage,
              "settings": {**settings.to_record(), "name": name},
              "space": plan.space.to_dict()}
    client.log_text(parent_id, json.dumps(record, indent=1), SWEEP_RECORD)
    tracking.log_dataset(client, parent_id, _dataset_record(plan))
    return parent_id


def _parent_params(plan: SweepPlan, storage: str) -> dict[str, Any]:
    """The parent run's params: the sweep's settings, its recipe, its data's description."""
    settings, resources = plan.settings, plan.settings.resources
    return {
        "space": plan.space.name, "methods": ",".join(plan.space.methods),
        "dataset": plan.dataset, "recipe": plan.space.recipe or "none",
        "num_samples": settings.num_samples, "max_concurrent": settings.max_concurrent,
        "epochs": settings.epochs if settings.epochs is not None else "space",
        "seed": settings.seed, "objective": settings.objective, "sampler": settings.sampler,
        "scheduler": settings.scheduler or "none", "tolerance": settings.tolerance,
        "posthoc": ",".join(settings.posthoc) or "none",
        "selection_rule": settings.selection_rule(), "ece_metric": settings.ece_metric,
        "repeats": settings.repeats, "selection": settings.selection,
        "accuracy_metric": settings.accuracy_metric,
        **({"metrics": ",".join(settings.metrics)} if settings.metrics else {}),
        "model": plan.model or "space", "gpus_per_trial": resources.gpus_per_trial,
        "cpus_per_trial": resources.cpus_per_trial, "precision": resources.precision,
        "workers_per_trial": resources.workers_per_trial,
        "max_failures": settings.resolved_max_failures(), "storage_path": storage,
        **{f"data_{k}": v for k, v in plan.data.info.items()},
    }


def _start_line(name: str, plan: SweepPlan, uri: str) -> str:
    """The progress line that starts a sweep: its trials, space, data, objective, store."""
    settings = plan.settings
    gpus = settings.resources.gpus_per_trial
    gpu = f", {gpus:g} GPU per trial" if gpus else ""
    count = (f"{settings.num_samples} trials" if settings.repeats == 1 else
             f"{settings.num_samples} configurations x {settings.repeats} seeds "
             f"({settings.trials} trials)")
    return (f"sweep {name}: {count} of space '{plan.space.name}' on "
            f"{plan.dataset} ({_sizes(plan.data)}){gpu}, objective {settings.objective}, "
            f"sampler {settings.sampler}; MLflow {uri} (experiment '{settings.experiment}')")


def trial_options(plan: SweepPlan, shift_set: Any = None,
                  components: dict[str, dict[str, Any]] | None = None) -> TrialOptions:
    """The :class:`~raysearch.tune.trial_options.TrialOptions` of the sweep's trials."""
    import cloudpickle

    settings, resources = plan.settings, plan.settings.resources
    return TrialOptions(
        posthoc=tuple(settings.posthoc), checkpoint_every=settings.checkpoint_every,
        # a scheduler compares trials at every epoch (ASHA's rungs); otherwise epochs travel
        # in fewer reports
        report_every_epoch=settings.scheduler is not None, precision=resources.precision,
        cpus_per_trial=resources.cpus_per_trial, workers=resources.workers_per_trial,
        cpus_per_worker=resources.cpus_per_worker, gpus_per_worker=resources.gpus_per_worker,
        shift_set=shift_set, fault_epoch=settings.fault_epoch, fault_kind=settings.fault_kind,
        log_weights=settings.log_weights, metrics=tuple(settings.metrics),
        code_paths=plan.code_paths,
        # the API's callables travel by value; names are resolved by each worker itself
        components=cloudpickle.dumps(components) if components else None)


def _trainable(plan: SweepPlan, options: TrialOptions) -> Any:
    """The sweep's Tune trainable: :func:`tune_trial` with its parameters and resources."""
    resources = plan.settings.resources
    return tune.with_resources(
        tune.with_parameters(tune_trial, configs=plan.trial_configs, options=options),
        trial_resources(cpus_per_trial=resources.cpus_per_trial,
                        gpus_per_trial=resources.gpus_per_trial,
                        workers=resources.workers_per_trial,
                        cpus_per_worker=resources.cpus_per_worker,
                        gpus_per_worker=resources.gpus_per_worker))


def execute(plan: SweepPlan, client: Any, uri: str, experiment_id: str, parent_id: str,
            name: str, storage: str, say: Callable[[str], None], restore: str | None = None,
            components: dict[str, dict[str, Any]] | None = None) -> SweepResult:
    """Run (or, with `restore`, continue) the Tuner of a sweep; select and log at the end.

    Args:
        plan: the sweep's plan.
        client: MLflow client of the sweep's store, at `uri`.
        uri: the tracking URI.
        experiment_id: the MLflow experiment of the parent run `parent_id`.
        parent_id: the sweep's parent run.
        name: the sweep's name (Tune's experiment folder under `storage`).
        storage: the storage root.
        say: progress lines.
        restore: the experiment folder to restore Tune's state from (``--resume``); None: a
            new sweep.
        components: objects given through the Python API.

    Returns:
        The :class:`SweepResult` (also after a Ctrl-C, which stops the trials; the selection
        is among the finished ones).

    Raises:
        TrackingUnavailableError: when the store does not answer at the end.
    """
    settings = plan.settings
    max_failures = settings.resolved_max_failures()
    start = time.monotonic()
    status = "FAILED"
    callback = snapshot = None
    path = f"{storage.rstrip('/')}/{name}"
    try:
        shift_set = None
        if settings.shift_eval or settings.shift_data is not None:
            shift_set = build_shift(plan.data, settings, say)
        # the callback Tune calls after a restore is the copy pickled with the experiment;
        # every copy in this process shares one writer, which this one flushes below
        callback = tracking.MlflowSweepCallback(
            client, experiment_id, parent_id, name, plan.trial_configs, progress=say,
            total=settings.trials, max_failures=max_failures,
            dataset=_dataset_record(plan), repeats=settings.repeats)
        trainable = _trainable(plan, trial_options(plan, shift_set, components))
        tuner = (_restored_tuner(restore, trainable, callback) if restore is not None else
                 _new_tuner(plan, trainable, callback, name, storage, max_failures))
        with without_result_frames():  # the sweep reads the reports itself, at its end
            tuner.fit()
        # Ctrl-C once: Tune stops the trials and returns normally. The Tuner keeps Tune's
        # trials (~20 KiB each): let them go first
        del tuner
        # Tune's last snapshot: after a Ctrl-C it is taken before the running trials stop, so
        # they are still unfinished there (and Tuner.restore continues them)
        snapshot = _read_snapshot(snapshot_states, path)
        ended = None if snapshot is None else sum(t.status in ENDED for t in snapshot)
        interrupted = ended is not None and ended < settings.trials
        status = "KILLED" if interrupted else "FINISHED"
        if interrupted:
            say(f"interrupted: {ended} of {settings.trials} trials ended; selecting among "
                f"the finished ones (`raysearch sweep --resume {name}` continues the sweep)")
    except KeyboardInterrupt:
        status = "KILLED"
        say(f"interrupted: finished trials are kept in MLflow; selecting among them "
            f"(`raysearch sweep --resume {name}` continues the sweep)")
        raise
    finally:
        if callback is not None:
            callback.close()  # flush the queued MLflow writes before selecting
        frame, failed = _record_end(client, uri, parent_id, name, path, plan, status, say,
                                    table=_ended_table(callback, snapshot, status))
    return _result(plan, name, parent_id, uri, experiment_id, (frame, failed), status, start,
                   say)


def _restored_tuner(restore: str, trainable: Any, callback: Any) -> tune.Tuner:
    """Tune's experiment at `restore`, its unfinished and failed trials to be continued."""
    # unfinished trials go on from their checkpoints; failed ones too (resume, not restart:
    # a restarted trial gets a new id, hence a second MLflow run)
    tuner = tune.Tuner.restore(restore, trainable=trainable, resume_unfinished=True,
                               resume_errored=True)
    callback.setup()  # adopt the sweep's runs now (Tune's restored copy shares them)
    trials = _read_snapshot(snapshot_trials, restore)
    if trials is not None:
        callback.known_trials({t.trial_id for t in trials})
    return tuner


def _result(plan: SweepPlan, name: str, parent_id: str, uri: str, experiment_id: str,
            ended: tuple[pd.DataFrame, list[FailedTrial]], status: str, start: float,
            say: Callable[[str], None]) -> SweepResult:
    """The :class:`SweepResult` of a sweep that ended (its trials, failed ones), its last line."""
    settings = plan.settings
    frame, failed = ended
    selected = None
    if not frame.empty and frame["selected"].any():
        selected = frame[frame["selected"]].iloc[0]
    seconds = time.monotonic() - start
    done = int(frame["complete"].sum()) if not frame.empty else 0
    what = "trials" if settings.repeats == 1 else f"configurations ({settings.repeats} seeds each)"
    say(f"sweep {name} {'stopped' if status == 'KILLED' else 'finished'} in {seconds:.1f}s: "
        f"{done}/{settings.num_samples} {what} complete"
        f"{f', {len(failed)} failed' if failed else ''}; parent run {parent_id}")
    return SweepResult(name, parent_id, uri, frame, selected, seconds,
                       interrupted=status == "KILLED",
                       mlflow_link=ui.run_link(ui.ui_base_url(uri), experiment_id, parent_id),
                       mlflow_hint=_ui_hint(uri), failed=failed,
                       searched=tuple(plan.space.searched()))


def describer(configs: TrialConfigs) -> Callable:
    """``config -> (config JSON, params, method)`` of a sweep's trials, as its runs have them."""
    return lambda config: tracking.describe(configs, config)


def _dataset_record(plan: SweepPlan) -> dict[str, Any]:
    """The sweep's dataset as MLflow shows it (:func:`raysearch.tracking.dataset_record`)."""
    source = (absolute_path(plan.settings.data_dir)
              or f"raysearch.training.data.load_dataset('{plan.data.name}')")
    return tracking.dataset_record(plan.data, source)


class TrackingUnavailableError(ValueError):
    """The tracking store stopped answering: the sweep's records wait in Tune's storage.

    Raised at the end of a sweep whose MLflow server went away (for longer than its client's
    retries) and had not come back when the trials ended; nothing is lost: ``raysearch sync
    NAME`` (:func:`sync_sweep`) writes the missing records once the store answers.
    ``raysearch sweep`` prints it as one line and exits with code 5, not 2: the input was fine.
    """


def _record_end(client: Any, uri: str, parent_id: str, name: str, path: str,
                plan: SweepPlan, status: str, say: Callable[[str], None], *,
                table: pd.DataFrame | None = None) -> tuple[pd.DataFrame, list[FailedTrial]]:
    """The sweep's last MLflow writes: what Tune recorded and MLflow lacks, then the selection.

    Returns the trials table (:func:`raysearch.tracking.finalize_sweep`) and the failed trials.
    `table`: the trials table the sweep's callback kept (:func:`_ended_table`), when it stands
    for the store: then no run is read, and Tune's records are not (the callback wrote them).

    Raises:
        TrackingUnavailableError: when the store does not answer (in one line, with the
            ``raysearch sync`` command that writes the records later).
    """
    later = (f"the trials' records are kept in Tune's storage at {path}: `raysearch sync "
             f"{name}` writes them to MLflow once it answers")
    try:
        tracking.check_tracking_uri(uri, timeout=5.0)
    except ValueError as exc:
        raise TrackingUnavailableError(f"the sweep's trials ended but {exc}; {later}") from None
    settings = plan.settings
    select = {"tolerance": settings.tolerance, "ece_key": settings.ece_key, "status": status,
              "selection": settings.selection, "accuracy_key": settings.accuracy_key}
    try:
        if table is not None:
            frame = tracking.finalize_sweep(client, parent_id, table=table, **select)
            return frame, failed_trials(client, parent_id, table)
        parent = client.get_run(parent_id)
        try:
            trials = read_trials(path)
        except ValueError:  # the sweep stopped before Tune's first snapshot: nothing to add
            trials = []
        # the sweep's runs are read once (~8 ms a run from a server) for both steps, and
        # again only after the first wrote to them
        read_at = int(time.time() * 1000)
        runs = tracking.sweep_runs(client, parent.info.experiment_id, parent_id)
        done = reconcile_sweep(client, parent, trials, describe=describer(plan.trial_configs),
                               repeats=settings.repeats, runs=runs)
        if done.changed:
            say(f"sweep {name}: MLflow caught up with Tune's records ({done.summary()})")
            runs = None
        frame = tracking.finalize_sweep(client, parent_id, runs=runs, read_at=read_at, **select)
        return frame, failed_trials(client, parent_id)
    except STORE_ERRORS as exc:
        raise TrackingUnavailableError(f"MLflow {uri} failed at the end of the sweep "
                                       f"({' '.join(str(exc).split())[:200]}); {later}") from None


def _ui_hint(uri: str) -> str:
    """How to serve a local store's UI (the sweep's link points there); empty for a server."""
    if uri.startswith(("http://", "https://")):
        return ""
    store = "" if uri == tracking.default_tracking_uri() else f" --tracking-uri {uri}"
    return f" (serve it with `raysearch ui{store}`)"


def _ended_table(callback: Any, snapshot: list[Any] | None, status: str) -> pd.DataFrame | None:
    """The trials table the sweep's callback kept, when the sweep ended normally (else None)."""
    table = None if callback is None else callback.table
    if table is None or status != "FINISHED":
        return None
    return table.ended_frame(snapshot or [])


def _read_snapshot(reader: Callable[[str], list[Any]], path: str) -> list[Any] | None:
    """What `reader` reads of Tune's last experiment snapshot at `path` (None if unreadable).

    `reader` is :func:`~raysearch.tune.sync.snapshot_states` or
    :func:`~raysearch.tune.sync.snapshot_trials`; a snapshot it cannot read is a warning.
    """
    try:
        return reader(path)
    except ValueError as exc:  # the sweep's result does not depend on it
        logger.warning("cannot read Tune's experiment state at %s: %s", path, exc)
        return None


def _new_tuner(plan: SweepPlan, trainable: Any, callback: Any, name: str, storage: str,
               max_failures: int) -> Any:
    """The Tuner of a new sweep: its seeded searcher (with the sweep's Optuna study), scheduler."""
    space, settings = plan.space, plan.settings
    metric, mode = settings.objective_metrics()
    # a conditional space (all.yaml) first gives every method one trial, in file order, so
    # that each method is on the board before the sampler concentrates on the good ones
    warm_start = [{"method": m} for m in space.methods] if space.conditional else None
    # the study lives in an Optuna journal file or the --optuna-storage database, named after
    # the sweep (the parent run's tags point to it; in memory through a Ray Client); Tune
    # pickles the searcher with it, and a restored one reads the same study back
    optuna_url = None if (settings.address or "").startswith("ray://") else \
        sweep_study.optuna_storage_url(tracking.resolve_tracking_uri(settings.tracking_uri),
                                       storage, settings.optuna_storage)
    searcher = CompletedOnlyOptunaSearch(
        space=space.define_by_run, metric=metric, mode=mode,
        sampler=make_sampler(settings.sampler, settings.seed),
        points_to_evaluate=warm_start, study_name=name,
        storage=sweep_study.create_sweep_study(optuna_url, name, metric, mode) if optuna_url
        else None)
    if settings.repeats > 1:  # R trials per sampled configuration; the sampler sees their mean
        searcher = RepeatedSearcher(searcher, settings.repeats)
    scheduler = None
    if settings.scheduler == "asha":
        smode = metric_direction(settings.scheduler_metric, calibrators=settings.posthoc)
        scheduler = ASHAScheduler(metric=settings.scheduler_metric, mode=smode,
                                  time_attr="training_iteration", grace_period=1,
                                  max_t=max(settings.epochs or 100, 1))
    # Tune keeps of each report only what the searcher and scheduler read (LeanResults, last;
    # the sweep reads its trials' configs from MLflow and result.json, not from fit's results)
    read = kept_metrics(metric, settings.scheduler_metric if scheduler is not None else None)
    lean = LeanResults(read, keep_config=False)
    return build_tuner(trainable, search_alg=searcher, scheduler=scheduler,
                       num_samples=settings.trials, max_concurrent=settings.max_concurrent,
                       name=name, storage_path=storage, callbacks=[callback, HeapTrim(), lean],
                       keep_checkpoints=_KEEP_CHECKPOINTS, max_failures=max_failures)


def build_tuner(trainable: Any, *, search_alg: Any, num_samples: int, name: str,
                storage_path: str, scheduler: Any = None, max_concurrent: int | None = None,
                callbacks: list[Any] | None = None, keep_checkpoints: int | None = None,
                max_failures: int = 0) -> tune.Tuner:
    """Build the Ray Tune ``Tuner`` of a sweep: the one place raysearch constructs one.

    Training sweeps (:func:`run_sweep`) and post-hoc sweeps
    (:func:`raysearch.tune.posthoc_sweep.run_posthoc_sweep`) both run through it. Every sweep
    reuses actors (``reuse_actors=True``: ~0.4 s per trial here instead of ~6 s), keeps Tune's
    console output off (``verbose=0``; raysearch prints its own progress lines), lets the
    other trials go on when one fails (``fail_fast=False``) and writes every trial's reports to
    its ``result.json`` (Tune's ``JsonLoggerCallback``, the only one of Tune's loggers it runs:
    the records :mod:`raysearch.tune.sync` reconciles MLflow with). Metric and mode are the search
    algorithm's and the scheduler's own, never ``TuneConfig``'s (a multi-objective list there
    raises).

    Args:
        trainable: the Tune trainable, already wrapped by ``tune.with_resources``.
        search_alg: the Tune search algorithm (an ``OptunaSearch``, possibly wrapped).
        num_samples: trials to run, >= 1.
        name: the experiment's name (Tune's folder under `storage_path`).
        storage_path: absolute folder where Tune keeps the experiment state.
        scheduler: a trial scheduler (ASHA), or None for Tune's FIFO.
        max_concurrent: trials running at once, or None (as many as the resources allow).
        callbacks: driver-side ``tune.Callback`` objects (the MLflow writer), or None.
        keep_checkpoints: checkpoints kept per trial, or None to keep all.
        max_failures: retries of a trial that raised, >= 0.

    Returns:
        The ``ray.tune.Tuner``, not yet fitted.
    """
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=search_alg, scheduler=scheduler,
                                    num_samples=num_samples, reuse_actors=True,
                                    max_concurrent_trials=max_concurrent),
        run_config=tune.RunConfig(
            name=name, storage_path=storage_path, verbose=0,
            # each trial's reports in its result.json: the records `raysearch sync` reads
            callbacks=[JsonLoggerCallback(), *(callbacks or [])],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=keep_checkpoints),
            failure_config=tune.FailureConfig(max_failures=max_failures, fail_fast=False)),
    )
