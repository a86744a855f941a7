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
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import ray
from ray import tune
from ray.tune.logger import JsonLoggerCallback
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch

from raysearch import tracking
from raysearch.config import _absolute
from raysearch.tracking import ui
from raysearch.tracking.reconcile import STORE_ERRORS
from raysearch.tune import study as sweep_study
from raysearch.tune.heap import frozen_heap
from raysearch.tune.prepare import Prepared, build_shift, prepare_data
from raysearch.tune.searchers import RepeatedSearcher
from raysearch.tune.settings import OBJECTIVES, RAY_JOB_ENV, SAMPLERS, SCHEDULERS, SweepSettings
from raysearch.tune.spaces import SearchSpace, load_space
from raysearch.tune.storage import check_storage, resolve_storage
from raysearch.tune.sync import read_trials, reconcile_sweep, repair_checkpoints
from raysearch.tune.trainable import COMPLETED, DIVERGED, run_trial, trial_env, trial_resources

__all__ = ["OBJECTIVES", "SAMPLERS", "SCHEDULERS", "CompletedOnlyOptunaSearch", "SweepResult",
           "SweepSettings", "TrackingUnavailableError", "build_tuner", "init_ray",
           "make_sampler", "prepare_data", "resume_sweep", "run_sweep", "sync_sweep"]

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

    @property
    def front(self) -> pd.DataFrame:
        """The trials on the Pareto front (validation accuracy vs. validation ECE)."""
        if self.trials.empty or "on_front" not in self.trials:
            return self.trials.iloc[0:0]
        return self.trials[self.trials["on_front"]]


class CompletedOnlyOptunaSearch(OptunaSearch):
    """OptunaSearch that tells Optuna only trials that ran all their epochs as COMPLETE.

    Ray reports a trial stopped early by a scheduler as complete with its partial-epoch values;
    here such a trial (whose last result lacks ``completed = True``) is told as PRUNED, so it never
    enters the sampler's history or a multi-objective Pareto set as a finished trial. A trial
    whose loss diverged (``diverged`` in its last result) is told as FAIL.

    Args:
        *args: as ``OptunaSearch``.
        require_completed: True (raysearch's trainable): a result without ``completed = True``
            is partial. False (a trainable of one's own): only a result with ``completed =
            False`` is.
        **kwargs: as ``OptunaSearch``.
    """

    def __init__(self, *args: Any, require_completed: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.require_completed = require_completed

    def on_trial_complete(self, trial_id: str, result: dict | None = None,  # noqa: D102
                          error: bool = False) -> None:
        complete = (result or {}).get(COMPLETED, not getattr(self, "require_completed", True))
        if not error and result is not None and result.get(DIVERGED):
            result, error = None, True  # -> FAIL
        elif not error and result is not None and not complete:
            result = None  # -> PRUNED in OptunaSearch.on_trial_complete
        super().on_trial_complete(trial_id, result=result, error=error)


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """The seeded Optuna sampler for ``--sampler`` (tpe handles one or several objectives)."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=8)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler '{name}'; choose from {', '.join(SAMPLERS)}")


def quiet_ray_env() -> None:
    """Silence the noise users see from Ray and Optuna in a sweep (see the stack notes)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # a diverged trial's last report carries no metrics (it is recorded FAILED, not scored)
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # our own progress lines report every trial (failures included); Tune's summaries of the
    # same events and its "could not fetch metrics" notes (no result.json by design) are noise
    for name in ("ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def init_ray(address: str | None = None, modules: tuple[str, ...] = ()) -> None:
    """Connect to `address` or start a local Ray, unless Ray is already initialised.

    On a remote cluster (:func:`is_remote_address`) the user's own packages and modules
    (`modules`: what :func:`prepare_data` found behind the import strings and callables) are
    shipped with Ray's ``runtime_env`` ``py_modules``, so every worker imports them as the
    driver does. A local Ray needs nothing shipped: its workers start with the driver's
    current directory and ``PYTHONPATH`` on their path.
    """
    quiet_ray_env()
    if ray.is_initialized():
        return
    runtime_env: dict[str, Any] = {"env_vars": trial_env()}
    if modules and is_remote_address(address):
        runtime_env["py_modules"] = list(modules)
    ray.init(address=address, log_to_driver=False, configure_logging=True,
             logging_level=logging.WARNING, runtime_env=runtime_env)


def in_ray_job() -> bool:
    """True when this process is a Ray Job's entrypoint (its cwd is a temporary copy)."""
    return RAY_JOB_ENV in os.environ


def is_remote_address(address: str | None) -> bool:
    """True when the sweep's driver-side work may run away from this machine's cwd.

    A Ray Client address (``ray://``, even tunnelled to 127.0.0.1: Tune then runs the sweep on
    the head node) or a cluster on another host; ``auto``/``local``/None and a GCS address on
    this machine are local.
    """
    if not address or address in ("local", "auto"):
        return False
    if address.startswith("ray://"):
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def check_tracking_for_cluster(uri: str | None, address: str | None) -> None:
    """Refuse a relative SQLite tracking URI when the sweep runs on a remote cluster.

    The MLflow records are written by the sweep's driver-side callback, which runs where Tune's
    controller runs: on the head node for a Ray Client address (``ray://``) or a Ray Job, whose
    working directory is a temporary copy that vanishes with the job. A relative SQLite file
    (including the default ``./mlruns.db``) would land there. An ``http(s)://`` tracking
    server, a database URI or an absolute SQLite path that exists where the driver runs is
    accepted.

    Args:
        uri (str | None): the tracking URI as the user gave it (``--tracking-uri`` or
            ``$MLFLOW_TRACKING_URI``); None means the default ``./mlruns.db``.
        address (str | None): ``--address``.

    Raises:
        ValueError: one line saying why and what to use instead.
    """
    if not is_remote_address(address) and not in_ray_job():
        return
    if uri is not None and (not uri.startswith("sqlite:///") or uri.startswith("sqlite:////")):
        return
    uri = uri or "sqlite:///mlruns.db (the default)"
    where = (f"--address {address} runs the sweep on a remote Ray cluster"
             if is_remote_address(address) else "this sweep runs as a Ray Job")
    raise ValueError(f"--tracking-uri {uri} is a relative SQLite file, but {where}, where the "
                     "driver's working folder may be a temporary copy: use an MLflow server "
                     "(--tracking-uri http://HOST:5000) or an absolute sqlite:////path")


def check_ray_address(address: str | None, *, timeout: float = 5.0) -> None:
    """Fail in one line when `address` (``host:port`` or ``ray://host:port``) is unreachable.

    ``ray.init`` would otherwise retry for minutes. ``auto``, ``local`` and None are not probed.

    Raises:
        ValueError: naming the address and the socket error.
    """
    if not address or address in ("auto", "local"):
        return
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--address {address}: expected host:port or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ValueError(f"cannot reach the Ray cluster at --address {address}: "
                         f"{exc.strerror or exc}") from None


def check_gpus(settings: SweepSettings) -> None:
    """Fail in one line when trials ask for GPUs that the Ray cluster does not have."""
    if settings.workers_per_trial > 1:
        wanted = settings.workers_per_trial * settings.gpus_per_worker
        option = f"--workers-per-trial {settings.workers_per_trial} --gpus-per-worker " \
                 f"{settings.gpus_per_worker:g}"
    else:
        wanted, option = settings.gpus_per_trial, f"--gpus-per-trial {settings.gpus_per_trial:g}"
    if not wanted:
        return
    have = float(ray.cluster_resources().get("GPU", 0))
    if have >= wanted:
        return
    cluster = bool(settings.address) or in_ray_job()
    where = "the Ray cluster" if cluster else "this machine"
    message = (f"{option} needs {wanted:g} GPU per trial but {where} has {have:g}; "
               "leave the GPU options out to train on the CPU")
    if cluster:
        # an autoscaling cluster may still add GPU nodes: say it, and let Ray wait for them
        logger.warning("%s (waiting for the autoscaler to add GPU nodes)", message)
        return
    raise ValueError(message)


def _sizes(data: Any) -> str:
    return f"{len(data.train)} train / {len(data.val)} val / {len(data.test)} test samples"


def default_sweep_name(space: SearchSpace) -> str:
    """``<space>-<YYYYmmdd-HHMMSS>``."""
    return f"{space.name}-{time.strftime('%Y%m%d-%H%M%S')}"


#: Parent-run artifact holding what ``--resume`` needs: the settings and the search space.
SWEEP_RECORD = "sweep.json"


def check_new_sweep_name(client: Any, experiment: str, name: str) -> None:
    """Refuse a sweep name the experiment already holds (its runs would be mixed up).

    Raises:
        ValueError: one line naming the existing sweep and suggesting ``--resume``.
    """
    if client.get_experiment_by_name(experiment) is None:
        return
    try:
        parent = tracking.find_sweep(client, name, experiment, known=False)
    except ValueError:
        return
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(parent.info.start_time / 1000))
    raise ValueError(f"a sweep named '{name}' already exists in experiment '{experiment}' "
                     f"(started {started}, {parent.info.status}): continue it with "
                     f"`raysearch sweep --resume {name}` or choose another --name")


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
        ValueError: on bad settings, an unknown space or name, an import string that does not
            import, a factory that raises or breaks its contract, an unreachable tracking URI,
            or a sweep name the experiment already has (use :func:`resume_sweep`); all are
            checked before Ray starts, any trial runs or anything is written.
    """
    settings = settings or SweepSettings()
    settings.validate()
    space = space if isinstance(space, SearchSpace) else load_space(space)
    say = progress or (lambda line: logger.info("%s", line))
    from raysearch.tune.recipes import with_recipe

    space, _, why = with_recipe(space, settings)  # the training protocol (raysearch.tune.recipes)
    # names, data, models, losses and optimizers fail here, before Ray or MLflow
    prepared = prepare_data(space, settings, say, components)
    say(why)
    data = prepared.data
    settings.validate()  # the metrics of the data's task are known now
    check_tracking_for_cluster(settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"),
                               settings.address)
    client, uri = tracking.get_client(settings.tracking_uri)
    name = settings.name or default_sweep_name(space)
    check_new_sweep_name(client, settings.experiment, name)
    storage = resolve_storage(settings.storage_path)
    check_storage(storage)
    experiment_id = tracking.ensure_experiment(client, settings.experiment, uri)
    check_ray_address(settings.address)
    init_ray(settings.address, prepared.modules)
    check_gpus(settings)
    ray_client = (settings.address or "").startswith("ray://")  # the searcher runs on the head
    optuna_url = None if ray_client else sweep_study.optuna_storage_url(uri, storage)
    if optuna_url:
        sweep_study.check_new_study(optuna_url, name)
    parent = client.create_run(experiment_id, run_name=name,
                               tags={tracking.SWEEP_TAG: name, "raysearch.space": space.name,
                                     tracking.DRIVER_TAG: _driver(),
                                     **({sweep_study.STORAGE_TAG: optuna_url,
                                         sweep_study.STUDY_TAG: name} if optuna_url else {})})
    parent_id = parent.info.run_id
    max_failures = settings.resolved_max_failures()
    tracking.log_params(client, parent_id, {
        "space": space.name, "methods": ",".join(space.methods), "dataset": settings.dataset,
        "recipe": space.recipe or "none",
        "num_samples": settings.num_samples, "max_concurrent": settings.max_concurrent,
        "epochs": settings.epochs if settings.epochs is not None else "space",
        "seed": settings.seed, "objective": settings.objective, "sampler": settings.sampler,
        "scheduler": settings.scheduler or "none", "tolerance": settings.tolerance,
        "posthoc": ",".join(settings.posthoc) or "none",
        "selection_rule": settings.selection_rule(), "ece_metric": settings.ece_metric,
        "repeats": settings.repeats, "selection": settings.selection,
        "accuracy_metric": settings.accuracy_metric,
        **({"metrics": ",".join(settings.metrics)} if settings.metrics else {}),
        "model": settings.model or "space", "gpus_per_trial": settings.gpus_per_trial,
        "cpus_per_trial": settings.cpus_per_trial, "precision": settings.precision,
        "workers_per_trial": settings.workers_per_trial, "max_failures": max_failures,
        "storage_path": storage,
        **{f"data_{k}": v for k, v in data.info.items()},
    })
    record = {"version": 1, "name": name, "storage_path": storage,
              "settings": {**settings.to_record(), "name": name},
              "space": space.to_dict()}
    client.log_text(parent_id, json.dumps(record, indent=1), SWEEP_RECORD)
    tracking.log_dataset(client, parent_id, _dataset_record(data, settings))
    gpu = f", {settings.gpus_per_trial:g} GPU per trial" if settings.gpus_per_trial else ""
    count = (f"{settings.num_samples} trials" if settings.repeats == 1 else
             f"{settings.num_samples} configurations x {settings.repeats} seeds "
             f"({settings.trials} trials)")
    say(f"sweep {name}: {count} of space '{space.name}' on "
        f"{settings.dataset} ({_sizes(data)}){gpu}, objective {settings.objective}, sampler "
        f"{settings.sampler}; MLflow {uri} (experiment '{settings.experiment}')")
    return _execute(space, settings, client, uri, experiment_id, parent_id, name, storage,
                    prepared, say, components=components)


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
        progress: as for :func:`run_sweep`.
        components: the objects a sweep started from Python was given (as for
            :func:`run_sweep`): names recorded as ``__main__:...`` need them again.
        storage_path: where the sweep's Tune storage is now (default: the path it was started
            with, from its record): the same path, or a folder (URI) the storage was moved or
            copied to; the sweep's own experiment folder ``<path>/<name>`` is accepted too. The
            record then points to it for later resumes.

    Returns:
        The :class:`SweepResult` over all the sweep's trials.

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
    record = _load_record(client, parent.info.run_id, name)
    space = SearchSpace.from_dict(record["space"])
    settings = SweepSettings.from_record(record["settings"])
    settings.tracking_uri, settings.experiment, settings.name = uri, experiment, name
    if address is not None:
        settings.address = address
    settings.validate()
    storage = _resume_storage(record, name, storage_path)
    path = f"{storage.rstrip('/')}/{name}"
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
    settings.storage_path = storage
    prepared = prepare_data(space, settings, say, components)
    check_tracking_for_cluster(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"),
                               settings.address)
    check_ray_address(settings.address)
    init_ray(settings.address, prepared.modules)
    check_gpus(settings)
    parent_id = parent.info.run_id
    client.update_run(parent_id, status="RUNNING")
    resumes = int(parent.data.tags.get("raysearch.resumes", 0)) + 1
    client.set_tag(parent_id, "raysearch.resumes", str(resumes))
    client.set_tag(parent_id, tracking.DRIVER_TAG, _driver())
    trials = read_trials(path)
    repair_checkpoints(trials, say)  # a snapshot naming a checkpoint Tune had deleted
    # what the killed driver never wrote to MLflow, from Tune's records, before the trials go on
    done = reconcile_sweep(client, parent, trials, describe=_describer(space, settings),
                           repeats=settings.repeats, progress=say)
    if done.changed:
        say(f"sweep {name}: MLflow caught up with Tune's records ({done.summary()})")
    count = (f"{settings.num_samples} trials" if settings.repeats == 1 else
             f"{settings.num_samples} configurations x {settings.repeats} seeds")
    say(f"resuming sweep {name} from {path} ({count} of space "
        f"'{space.name}' on {settings.dataset}); MLflow {uri} (experiment '{experiment}')")
    result = _execute(space, settings, client, uri, parent.info.experiment_id, parent_id, name,
                      storage, prepared, say, restore=path, components=components)
    if not result.interrupted:  # asks of the killed driver that no trial ran stay RUNNING
        sweep_study.fail_stale_trials(parent)
    return result


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


def _load_record(client: Any, parent_id: str, name: str) -> dict[str, Any]:
    names = {a.path for a in client.list_artifacts(parent_id)}
    if SWEEP_RECORD not in names:
        raise ValueError(f"sweep '{name}' has no {SWEEP_RECORD} record (it was started by an "
                         "older raysearch) and cannot be resumed")
    with tempfile.TemporaryDirectory() as d:
        local = client.download_artifacts(parent_id, SWEEP_RECORD, d)
        return json.loads(Path(local).read_text())


def _execute(space: SearchSpace, settings: SweepSettings, client: Any, uri: str,
             experiment_id: str, parent_id: str, name: str, storage: str, prepared: Prepared,
             say: Callable[[str], None], restore: str | None = None,
             components: dict[str, dict[str, Any]] | None = None) -> SweepResult:
    """Run (or, with `restore`, continue) the Tuner of a sweep; select and log at the end."""
    import cloudpickle

    data = prepared.data
    metric, mode = settings.objective_metrics()
    overrides = settings.overrides()
    max_failures = settings.resolved_max_failures()
    start = time.monotonic()
    status = "FAILED"
    callback = None
    try:
        shift_set = None
        if settings.shift_eval or settings.shift_data is not None:
            shift_set = build_shift(data, settings, say)
        # the callback Tune calls after a restore is the copy pickled with the experiment;
        # every copy in this process shares one writer, which this one flushes below
        callback = tracking.MlflowSweepCallback(
            client, experiment_id, parent_id, name, space, overrides, progress=say,
            total=settings.trials, max_failures=max_failures,
            dataset=_dataset_record(data, settings), repeats=settings.repeats)
        resources = trial_resources(
            cpus_per_trial=settings.cpus_per_trial, gpus_per_trial=settings.gpus_per_trial,
            workers=settings.workers_per_trial, cpus_per_worker=settings.cpus_per_worker,
            gpus_per_worker=settings.gpus_per_worker)
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, space=space, overrides=overrides,
                                 posthoc=tuple(settings.posthoc),
                                 checkpoint_every=settings.checkpoint_every,
                                 # a scheduler compares trials at every epoch (ASHA's rungs);
                                 # otherwise epochs travel in fewer reports
                                 report_every_epoch=settings.scheduler is not None,
                                 precision=settings.precision,
                                 cpus_per_trial=settings.cpus_per_trial, shift_set=shift_set,
                                 workers=settings.workers_per_trial,
                                 cpus_per_worker=settings.cpus_per_worker,
                                 gpus_per_worker=settings.gpus_per_worker,
                                 fault_epoch=settings.fault_epoch,
                                 fault_kind=settings.fault_kind,
                                 log_weights=settings.log_weights,
                                 metrics=tuple(settings.metrics),
                                 code_paths=prepared.code_paths,
                                 # the API's callables travel by value; names are resolved
                                 # by each worker itself
                                 components=cloudpickle.dumps(components) if components
                                 else None),
            resources)
        if restore is not None:
            # unfinished trials go on from their checkpoints; failed ones too (resume, not
            # restart: a restarted trial gets a new id, hence a second MLflow run)
            tuner = tune.Tuner.restore(restore, trainable=trainable, resume_unfinished=True,
                                       resume_errored=True)
            callback.setup()  # adopt the sweep's runs now (Tune's restored copy shares them)
            trials = _snapshot_trials(restore)
            if trials is not None:
                callback.known_trials({t.trial_id for t in trials})
        else:
            tuner = _new_tuner(space, settings, trainable, callback, name, storage, metric,
                               mode, max_failures)
        tuner.fit()
        # Ctrl-C once: Tune stops the trials and returns normally
        ended = _trials_ended(f"{storage.rstrip('/')}/{name}")
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
        frame = _record_end(client, uri, parent_id, name, f"{storage.rstrip('/')}/{name}",
                            space, settings, status, say)
    selected = None
    if not frame.empty and frame["selected"].any():
        selected = frame[frame["selected"]].iloc[0]
    seconds = time.monotonic() - start
    done = int(frame["complete"].sum()) if not frame.empty else 0
    what = "trials" if settings.repeats == 1 else f"configurations ({settings.repeats} seeds each)"
    say(f"sweep {name} {'stopped' if status == 'KILLED' else 'finished'} in {seconds:.1f}s: "
        f"{done}/{settings.num_samples} {what} complete; parent run {parent_id}")
    return SweepResult(name, parent_id, uri, frame, selected, seconds,
                       interrupted=status == "KILLED",
                       mlflow_link=ui.run_link(ui.ui_base_url(uri), experiment_id, parent_id),
                       mlflow_hint=_ui_hint(uri))


class TrackingUnavailableError(ValueError):
    """The tracking store stopped answering: the sweep's records wait in Tune's storage.

    Raised at the end of a sweep whose MLflow server went away (for longer than its client's
    retries) and had not come back when the trials ended; nothing is lost: ``raysearch sync
    NAME`` (:func:`sync_sweep`) writes the missing records once the store answers.
    """


def _driver() -> str:
    """``<host>:<pid>`` of this driver process (the parent run's ``raysearch.driver`` tag)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _describer(space: SearchSpace, settings: SweepSettings) -> Callable:
    """``config -> (config JSON, params, method)`` of the sweep's trials, as its runs have them."""
    overrides = settings.overrides()
    return lambda config: tracking.describe(space, overrides, config)


def _record_end(client: Any, uri: str, parent_id: str, name: str, path: str,
                space: SearchSpace, settings: SweepSettings, status: str,
                say: Callable[[str], None]) -> pd.DataFrame:
    """The sweep's last MLflow writes: what Tune recorded and MLflow lacks, then the selection.

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
    try:
        parent = client.get_run(parent_id)
        try:
            trials = read_trials(path)
        except ValueError:  # the sweep stopped before Tune's first snapshot: nothing to add
            trials = []
        done = reconcile_sweep(client, parent, trials, describe=_describer(space, settings),
                               repeats=settings.repeats)
        if done.changed:
            say(f"sweep {name}: MLflow caught up with Tune's records ({done.summary()})")
        return tracking.finalize_sweep(client, parent_id, tolerance=settings.tolerance,
                                       ece_key=settings.ece_key, status=status,
                                       selection=settings.selection,
                                       accuracy_key=settings.accuracy_key)
    except STORE_ERRORS as exc:
        raise TrackingUnavailableError(f"MLflow {uri} failed at the end of the sweep "
                                       f"({' '.join(str(exc).split())[:200]}); {later}") from None


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
    record = _load_record(client, parent.info.run_id, name)
    settings = SweepSettings.from_record(record["settings"])
    space = SearchSpace.from_dict(record["space"])
    storage = _resume_storage(record, name, storage_path)
    path = f"{storage.rstrip('/')}/{name}"
    running = parent.info.status == "RUNNING"
    if running and _driver_alive(parent.data.tags.get(tracking.DRIVER_TAG, "")):
        raise ValueError(f"sweep '{name}' is still running (driver "
                         f"{parent.data.tags[tracking.DRIVER_TAG]}); sync it once it ended")
    done = reconcile_sweep(client, parent, read_trials(path),
                           describe=_describer(space, settings),
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
    record = _load_record(client, parent.info.run_id, name)
    return f"{_resume_storage(record, name, storage_path).rstrip('/')}/{name}"


def _driver_alive(tag: str) -> bool:
    """True when `tag` (``<host>:<pid>``) names a live process of this machine other than us."""
    host, _, pid = tag.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _ui_hint(uri: str) -> str:
    """How to serve a local store's UI (the sweep's link points there); empty for a server."""
    if uri.startswith(("http://", "https://")):
        return ""
    store = "" if uri == tracking.default_tracking_uri() else f" --tracking-uri {uri}"
    return f" (serve it with `raysearch ui{store}`)"


def _dataset_record(data: Any, settings: SweepSettings) -> dict[str, Any]:
    """The sweep's dataset as MLflow shows it (:func:`raysearch.tracking.dataset_record`)."""
    source = _absolute(settings.data_dir) or f"raysearch.training.data.load_dataset('{data.name}')"
    return tracking.dataset_record(data, source)


def _trials_ended(path: str) -> int | None:
    """Trials that ended (TERMINATED or ERROR) in Tune's last snapshot of the experiment.

    After a Ctrl-C, Tune snapshots the experiment before it stops the running trials, so they
    are still unfinished there (and ``Tuner.restore`` continues them), while the trials that
    ``Tuner.fit`` returns are all stopped. None if the snapshot cannot be read.
    """
    trials = _snapshot_trials(path)
    if trials is None:
        return None
    return sum(t.status in ("TERMINATED", "ERROR") for t in trials)


def _snapshot_trials(path: str) -> list[Any] | None:
    """The trials of Tune's last experiment snapshot at `path` (None if unreadable)."""
    from ray.tune import ExperimentAnalysis

    try:
        return ExperimentAnalysis(path).trials
    except Exception as exc:  # noqa: BLE001 (the sweep's result does not depend on it)
        logger.warning("cannot read Tune's experiment state at %s: %s", path, exc)
        return None


def _new_tuner(space: SearchSpace, settings: SweepSettings, trainable: Any, callback: Any,
               name: str, storage: str, metric: Any, mode: Any, max_failures: int) -> Any:
    # a conditional space (all.yaml) first gives every method one trial, in file order, so
    # that each method is on the board before the sampler concentrates on the good ones
    warm_start = [{"method": m} for m in space.methods] if space.conditional else None
    # the study lives in an Optuna journal file, named after the sweep (the parent run's tags
    # point to it; in memory through a Ray Client); Tune pickles the searcher with it, and a
    # restored one reads the same study back
    optuna_url = None if (settings.address or "").startswith("ray://") else \
        sweep_study.optuna_storage_url(tracking.resolve_tracking_uri(settings.tracking_uri),
                                       storage)
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
        smode = "max" if settings.scheduler_metric.endswith("accuracy") else "min"
        scheduler = ASHAScheduler(metric=settings.scheduler_metric, mode=smode,
                                  time_attr="training_iteration", grace_period=1,
                                  max_t=max(settings.epochs or 100, 1))
    return build_tuner(trainable, search_alg=searcher, scheduler=scheduler,
                       num_samples=settings.trials, max_concurrent=settings.max_concurrent,
                       name=name, storage_path=storage, callbacks=[callback],
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
