"""MLflow tracking of sweeps: one parent run per sweep, one child run per trial.

All MLflow writes happen in the driver process, through :class:`MlflowSweepCallback` (a Ray Tune
callback) and :class:`MlflowClient`; trial workers never talk to MLflow. The store and the
experiment are created by the driver before any trial starts (two processes creating a fresh
SQLite store at once race on its migrations).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from ray import tune

from raysearch import plots
from raysearch.config import SELECTIONS, RunConfig
from raysearch.runs import (  # noqa: F401 (re-exported: the public names of this module)
    COMPLETE_TAG,
    CONFIG_TAG,
    CONFIGURATION_TAG,
    DEFAULT_EXPERIMENT,
    ERROR_TAG,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    METRIC_PREFIXES,
    NODE_KEY,
    NODE_TAG,
    OUTCOME_TAG,
    PARENT_TAG,
    REPEATS_TAG,
    RESUMED_TAG,
    RETRIES_TAG,
    SEALED_OUTCOMES,
    SEEDS_TAG,
    SWEEP_TAG,
    TRIAL_TAG,
    check_tracking_uri,
    default_tracking_uri,
    find_sweep,
    list_sweeps,
    resolve_tracking_uri,
)
from raysearch.selection import selection_table
from raysearch.spaces import CONFIG_ID_KEY, SEED_INDEX_KEY, SearchSpace
from raysearch.trainable import (
    ARTIFACT_FILES,
    COMPLETED,
    DIVERGED,
    EPOCH_HISTORY,
    LOGITS_FILE,
    RELIABILITY,
    RELIABILITY_PLOT,
    RESUMED_FROM,
)

logger = logging.getLogger(__name__)

def get_client(uri: str | None = None) -> tuple[MlflowClient, str]:
    """A client for the resolved tracking URI (checked for reachability) and the URI itself."""
    uri = resolve_tracking_uri(uri)
    check_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri), uri


def ensure_experiment(client: MlflowClient, name: str, uri: str) -> str:
    """Id of experiment `name`, created if missing (artifacts beside a SQLite store, absolute).

    The experiment is tagged :data:`EXPERIMENT_KIND_TAG` = :data:`EXPERIMENT_KIND` (MLflow 3's
    "model training" kind), so the MLflow UI does not ask which kind of experiment it is.
    """
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.tags.get(EXPERIMENT_KIND_TAG) is None:
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        root = Path(uri[len("sqlite:///"):]).parent / "mlartifacts"
        location = root.resolve().as_uri()
    return client.create_experiment(name, artifact_location=location,
                                    tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})


def _numeric_metrics(result: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in result.items():
        if key.startswith(METRIC_PREFIXES) and isinstance(value, (int, float)):
            if not isinstance(value, bool) and math.isfinite(value):
                out[key] = float(value)
    return out


def run_params(cfg: RunConfig) -> dict[str, Any]:
    """MLflow params of a run: the hyperparameters under plain names, plus the run settings.

    The loss's parameters under their own names (``margin``), ``method``, ``dataset``,
    ``model``, ``epochs``, ``seed``, ``lr``, ``batch_size``; the keyword arguments of the
    optimizer, the model factory and the dataset factory as ``optimizer.<kw>`` (with
    ``optimizer`` the optimizer's name), ``model.<kw>``, ``data.<kw>``; the other settings
    only where they differ from their defaults.
    """
    params: dict[str, Any] = {"method": cfg.loss.name, **cfg.loss.params}
    params.update({"dataset": cfg.data.name, "model": cfg.model.name, "epochs": cfg.epochs,
                   "seed": cfg.seed, "lr": cfg.optimizer.lr, "batch_size": cfg.batch_size,
                   "optimizer": cfg.optimizer.name})
    kwargs = cfg.optimizer.kwargs()
    params.update({f"optimizer.{k}": v for k, v in kwargs.items() if k != "lr"})
    params.update({f"model.{k}": v for k, v in cfg.model.params.items()})
    params.update({f"data.{k}": v for k, v in cfg.data.params.items()})
    if cfg.interleaved:
        params["interleaved"] = True
        params["interleave_fraction"] = cfg.interleave_fraction
    # the rest only where it differs from the default, so digits runs keep their short list
    flat = {"data_seed": cfg.data.seed, "val_fraction": cfg.data.val_fraction,
            "schedule": cfg.schedule.name, "milestones": cfg.schedule.milestones,
            "lr_decay": cfg.schedule.lr_decay, "warmup_epochs": cfg.schedule.warmup_epochs,
            "mixup_alpha": cfg.mixup_alpha, "cutmix_alpha": cfg.cutmix_alpha,
            "ricap_beta": cfg.ricap_beta,
            "pretrained": cfg.model.pretrained,
            "freeze_backbone_epochs": cfg.model.freeze_backbone_epochs,
            "head_lr": cfg.model.head_lr}
    params.update({k: v for k, v in flat.items() if v != _RUN_DEFAULTS[k]})
    if cfg.model.pretrained:  # which weights exactly: `raysearch train` of the config is
        params["pretrained_sha256"] = _weights_sha256(cfg.model.pretrained)  # reproducible
    return params


_RUN_DEFAULTS = {"data_seed": None, "val_fraction": None, "schedule": "cosine", "milestones": "",
                 "lr_decay": 0.1, "warmup_epochs": 0, "mixup_alpha": 0.0, "cutmix_alpha": 0.0,
                 "ricap_beta": 0.0, "pretrained": None, "freeze_backbone_epochs": 0,
                 "head_lr": None}


def _weights_sha256(weights: str) -> str:
    """SHA-256 of a weights file, or of a torchvision weights name's cached file ("" if absent).

    Cached per (path, modification time): a sweep hashes its weights once, not per trial.
    """
    path = Path(weights).expanduser()
    if not path.is_file():
        try:
            import torch
            from torchvision.models import get_weight

            path = Path(torch.hub.get_dir()) / "checkpoints" / Path(get_weight(weights).url).name
        except Exception:  # noqa: BLE001 (an unknown name: the trial reports it)
            return ""
    if not path.is_file():
        return ""
    key = (str(path), path.stat().st_mtime)
    if key not in _SHA_CACHE:
        from raysearch.models.pretrained import file_sha256

        _SHA_CACHE[key] = file_sha256(path)
    return _SHA_CACHE[key]


_SHA_CACHE: dict[tuple[str, float], str] = {}


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    """Log params in one batch (values as strings, as MLflow stores them; long ones cut)."""
    client.log_batch(run_id, params=[Param(k, _param_text(v)) for k, v in params.items()])


def _param_text(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _PARAM_CHARS else text[:_PARAM_CHARS - 3] + "..."


#: Longest param value logged (MLflow stores at most 6,000 characters).
_PARAM_CHARS = 1000


def log_epochs(client: MlflowClient, run_id: str, epochs: list[tuple[int, dict[str, float]]],
               tags: dict[str, str] | None = None) -> None:
    """Log several epochs' metrics (each at ``step=epoch``) and `tags` in one batch."""
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, step) for step, metrics in epochs
                                      for k, v in metrics.items()],
                     tags=[RunTag(k, v) for k, v in (tags or {}).items()])


def dataset_record(data: Any, source: str) -> dict[str, Any]:
    """What MLflow shows of a sweep's dataset: name, source, split sizes and a digest.

    Args:
        data: the sweep's :class:`~raysearch.data.DatasetSplits`.
        source: where it was read from (the data folder, or the bundled loader's name).

    Returns:
        ``{"name", "source", "digest", "profile"}``; ``profile`` is a JSON string of the split
        sizes, the number of classes and the input shape; ``digest`` (12 hex digits) is a
        SHA-256 over the name, source, the split description (``data.info``, which holds the
        seed and fractions) and, where a split exposes them without reading images, its labels:
        the same dataset split the same way has the same digest.
    """
    import hashlib

    import numpy as np

    profile = {"train_size": len(data.train), "val_size": len(data.val),
               "test_size": len(data.test), "num_classes": int(data.num_classes),
               "input_shape": list(data.input_shape)}
    digest = hashlib.sha256(json.dumps([data.name, source, data.info, profile], sort_keys=True,
                                       default=str).encode())
    for split in (data.train, data.val, data.test):
        labels = _split_labels(split)
        if labels is not None:
            digest.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return {"name": data.name, "source": source, "digest": digest.hexdigest()[:12],
            "profile": json.dumps(profile)}


def _split_labels(split: Any) -> Any:
    """Labels of a split when it holds them in memory (a TensorDataset, ``targets``), else None."""
    tensors = getattr(split, "tensors", None)
    if isinstance(tensors, tuple) and len(tensors) >= 2:
        return tensors[1].cpu().numpy()
    for name in ("targets", "labels", "y"):
        value = getattr(split, name, None)
        if value is not None and hasattr(value, "__len__") and not callable(value):
            try:
                import numpy as np

                return np.asarray(value)
            except (TypeError, ValueError):
                return None
    return None


def log_dataset(client: MlflowClient, run_id: str, record: dict[str, Any],
                context: str = "training") -> None:
    """Attach `record` (:func:`dataset_record`) to `run_id` as an MLflow dataset input."""
    dataset = Dataset(name=record["name"], digest=record["digest"], source_type="local",
                      source=json.dumps({"uri": record["source"]}), profile=record["profile"])
    client.log_inputs(run_id, datasets=[DatasetInput(dataset, tags=[
        InputTag("mlflow.data.context", context)])])


def log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float], step: int) -> None:
    """Log metrics in one batch at `step` (the epoch)."""
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])


def log_reliability(client: MlflowClient, run_id: str, bins: dict[str, list], title: str) -> None:
    """Draw the test reliability diagram from its bins and attach it as ``reliability.png``."""
    with tempfile.TemporaryDirectory() as d:
        path = plots.reliability_diagram(bins["edges"], bins["counts"], bins["accuracy"],
                                         bins["confidence"], Path(d) / "reliability.png",
                                         title=title)
        client.log_artifact(run_id, str(path))


class _SweepBook:
    """One sweep's child-run bookkeeping and its MLflow writer thread, one per driver process.

    Tune pickles callbacks with its state (``tuner.pkl``) and ``Tuner.restore`` brings back a
    copy; every copy of a sweep's :class:`MlflowSweepCallback` in a process shares this book
    (keyed by the parent run id), so the copy Tune calls and the one the driver flushes agree.
    """

    def __init__(self, client: MlflowClient) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.children: dict[str, str] = {}  # trial id -> run id (set by the writer thread)
        self.started: dict[str, float] = {}
        self.last_line: dict[str, float] = {}
        self.nodes: dict[str, str] = {}  # trial id -> Ray node id its (rank-0) process ran on
        self.steps: dict[str, int] = {}  # trial id -> last epoch logged (no duplicate steps)
        self.retries: dict[str, int] = {}
        self.resumed: dict[str, int] = {}  # trial id -> checkpoint epoch its attempt resumed
        self.sealed: set[str] = set()  # runs ended before a resume: left exactly as they are
        self.reopen: set[str] = set()  # runs to set RUNNING again when their trial restarts
        self.configs: dict[str, str] = {}  # trial id -> its RunConfig JSON (adopted runs)
        self.orphans: dict[str, str] = {}  # run id -> config JSON: trials Tune's snapshot lost
        self.count = 0  # child runs created or adopted (numbers the run names)
        # repeated sweeps (--repeats): configuration id -> its run id / its number
        self.config_runs: dict[str, str] = {}
        self.config_index: dict[str, int] = {}
        self.orphan_parents: dict[str, str] = {}  # orphaned seed run -> its configuration run
        self.seeds_ended: dict[str, int] = {}  # configuration run id -> seeds that ended
        self.trial_gid: dict[str, str] = {}  # a seed's trial id -> its configuration id
        self.finished = 0
        self.adopted = False
        self.queue: queue.Queue = queue.Queue()
        self.writer = threading.Thread(target=self._drain, name="raysearch-mlflow", daemon=True)
        self.writer.start()

    def _drain(self) -> None:
        while True:
            job = self.queue.get()
            try:
                if job is None:
                    return
                job()
            except Exception as exc:  # a failed write must not stop the sweep or later writes
                logger.warning("MLflow write failed: %s", exc)
            finally:
                self.queue.task_done()

    def submit(self, job: Callable[[], None]) -> None:
        self.queue.put(job)

    def flush(self) -> None:
        """Wait until every queued write is done."""
        if self.writer.is_alive():
            self.queue.join()

    def close(self) -> None:
        if self.writer.is_alive():
            self.queue.put(None)
            self.writer.join()


_BOOKS: dict[str, _SweepBook] = {}
_BOOKS_LOCK = threading.Lock()


def _book_for(parent_run_id: str, client: MlflowClient) -> _SweepBook:
    with _BOOKS_LOCK:
        book = _BOOKS.get(parent_run_id)
        if book is None or not book.writer.is_alive():
            book = _BOOKS[parent_run_id] = _SweepBook(client)
        return book


def _last_step(client: MlflowClient, run_id: str) -> int:
    """Last epoch logged to `run_id` (0 when none)."""
    steps = [m.step for m in client.get_metric_history(run_id, "val_accuracy")]
    return max(steps, default=0)


class MlflowSweepCallback(tune.Callback):
    """Driver-side Tune callback: a child run per trial under the sweep's parent run.

    Params are logged at trial start, ``train_*``/``val_*`` metrics every epoch with
    ``step=epoch``, the ``test_*`` metrics and a reliability diagram at the end. The child ends
    FINISHED (tag ``raysearch.complete`` says whether it ran all its epochs) or FAILED; the tag
    ``raysearch.outcome`` says why (``complete``, ``stopped_early``, ``diverged``, ``error``,
    ``interrupted``).

    **Faults.** A trial that Tune retries (``--max-failures``) keeps its one child run: the
    tag ``raysearch.retries`` counts the retries, ``raysearch.resumed_from_epoch`` names the
    checkpoint the last attempt started from, and epochs the retry trains again are not logged
    twice (a step is logged once). When a sweep is resumed (``raysearch sweep --resume``),
    :meth:`setup` adopts the existing child runs by their trial id: runs that had ended keep
    their records untouched, interrupted or failed ones are set RUNNING again when their trial
    restarts.

    The MLflow writes run in order on one background thread of the driver, so Tune's event loop
    (and the trials waiting on it after each ``tune.report``) never waits on the store; call
    :meth:`close` after ``Tuner.fit`` to flush them (``on_experiment_end`` flushes too).

    Args:
        client: MLflow client of the sweep's store.
        experiment_id: experiment holding the parent run.
        parent_run_id: the sweep's parent run.
        sweep_name: the sweep's name (prefix of child run names).
        space: the sweep's search space (resolves trial configs).
        overrides: sweep-wide RunConfig overrides (dataset, epochs, seed, ...).
        progress: called with one readable line per finished trial, one per retry, and with an
            epoch line for a running trial when its last line is at least
            :attr:`EPOCH_LINE_EVERY_S` seconds old (long epochs on real datasets; digits
            trials finish first).
        total: number of trials of the sweep (for the progress line).
        max_failures: retries Tune grants a failed trial (for the retry line).
        dataset: the sweep's :func:`dataset_record`, logged as each child run's dataset input.
        repeats: seeds per configuration (``--repeats``). With more than one, the child run of
            the parent is a *configuration run* per sampled configuration (its trial configs
            share ``_config_id``); each seed's trial gets its own run nested under it
            (``mlflow.parentRunId`` = the configuration run), and once all its seeds ended the
            configuration run gets the mean and SEM of every metric
            (:func:`summarize_configuration`).
    """

    #: Shortest gap (seconds) between two epoch lines of one running trial.
    EPOCH_LINE_EVERY_S = 30.0
    #: A trial counts as complete only when its last result says ``completed: True`` (what
    #: raysearch's trainable reports); False: unless it says ``completed: False``.
    requires_completed = True

    def __init__(self, client: MlflowClient, experiment_id: str, parent_run_id: str,
                 sweep_name: str, space: SearchSpace, overrides: dict[str, Any],
                 progress: Callable[[str], None] | None = None, total: int | None = None,
                 max_failures: int = 0, dataset: dict[str, Any] | None = None,
                 repeats: int = 1):
        self.dataset = dataset
        self.repeats = repeats
        self.tracking_uri = client.tracking_uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.sweep_name = sweep_name
        self.space = space
        self.overrides = overrides
        self.progress = progress
        self.total = total
        self.max_failures = max_failures
        self._client = client

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks with the experiment (tuner.pkl): the client and the book stay
        state = self.__dict__.copy()
        state.pop("_client", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client = None

    @property
    def client(self) -> MlflowClient:
        """Client of the sweep's store (recreated after unpickling)."""
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    @property
    def book(self) -> _SweepBook:
        """This process's bookkeeping of the sweep (shared by every copy of the callback)."""
        return _book_for(self.parent_run_id, self.client)

    @property
    def children(self) -> dict[str, str]:
        """Trial id -> child run id (complete once :meth:`close` returned)."""
        return self.book.children

    @property
    def finished(self) -> int:
        """Trials that ended so far (including those recorded before a resume)."""
        return self.book.finished

    def _submit(self, job: Callable[[], None]) -> None:
        self.book.submit(job)

    def close(self) -> None:
        """Wait until every queued MLflow write is done, then stop the writer thread."""
        with _BOOKS_LOCK:
            book = _BOOKS.pop(self.parent_run_id, None)
        if book is not None:
            book.close()

    # -- Tune hooks (event loop thread) ------------------------------------------------------
    def setup(self, **info: Any) -> None:
        """Adopt the child runs the sweep already has (a resumed sweep); no-op on a new one."""
        book = self.book
        if book.adopted:
            return
        book.adopted = True
        runs = sweep_runs(self.client, self.experiment_id, self.parent_run_id)
        now = time.monotonic()
        for run in runs:  # configuration runs first (they are older than their seeds')
            gid = run.data.tags.get(CONFIGURATION_TAG)
            if gid and not run.data.tags.get(TRIAL_TAG):
                book.config_runs[gid] = run.info.run_id
                book.config_index[gid] = len(book.config_index)
        runs = [r for r in runs if r.data.tags.get(TRIAL_TAG)]
        for run in runs:
            tid = run.data.tags.get(TRIAL_TAG)
            book.count += 1
            book.children[tid] = run.info.run_id
            book.configs[tid] = run.data.tags.get(CONFIG_TAG, "")
            if run.data.tags.get(CONFIGURATION_TAG):
                book.trial_gid[tid] = run.data.tags[CONFIGURATION_TAG]
            book.started[tid] = now
            book.retries[tid] = int(run.data.tags.get(RETRIES_TAG, 0))
            if run.data.tags.get(NODE_TAG):
                book.nodes[tid] = run.data.tags[NODE_TAG]
            outcome = run.data.tags.get(OUTCOME_TAG)
            if run.info.status == "FINISHED" or outcome in SEALED_OUTCOMES:
                book.sealed.add(tid)
                book.finished += 1
                if run.data.tags.get(CONFIGURATION_TAG):
                    config_run = run.data.tags.get(PARENT_TAG, "")
                    book.seeds_ended[config_run] = book.seeds_ended.get(config_run, 0) + 1
            else:
                book.steps[tid] = _last_step(self.client, run.info.run_id)
                if run.info.status != "RUNNING":
                    book.reopen.add(tid)
        if runs and self.progress is not None:
            self.progress(f"resuming sweep {self.sweep_name}: {len(book.sealed)} trials already "
                          f"recorded as ended, {len(runs) - len(book.sealed)} to continue")

    def known_trials(self, trial_ids: set[str]) -> None:
        """The trial ids of a restored experiment (``Tuner.restore``): call after :meth:`setup`.

        Adopted unended runs of other trials are orphans: their trials started after Tune's
        last snapshot, so the restored searcher samples them again under new ids. A new trial
        whose configuration equals an orphan's takes over that run (see :meth:`_start`)
        instead of creating a second run for the same configuration.
        """
        book = self.book
        for tid in list(book.children):
            if tid not in trial_ids and tid not in book.sealed:
                run_id = book.children.pop(tid)
                book.orphans[run_id] = book.configs.get(tid, "")
                book.orphan_parents[run_id] = self._adopted_parent(run_id)
                book.started.pop(tid, None)
                book.reopen.discard(tid)

    def _adopted_parent(self, run_id: str) -> str:
        try:
            return self.client.get_run(run_id).data.tags.get(PARENT_TAG, "")
        except Exception:  # noqa: BLE001 (an unreadable run: no configuration to rejoin)
            return ""

    def _start(self, trial: Any) -> None:
        book = self.book
        tid = trial.trial_id
        if tid in book.started:
            if tid in book.reopen:
                book.reopen.discard(tid)
                self._submit(lambda: self._reopen(tid))
            return
        book.started[tid] = time.monotonic()
        cfg_json, params, method = self.describe(trial.config)
        gid = trial.config.get(CONFIG_ID_KEY) if self.repeats > 1 else None
        orphan = next((r for r, c in book.orphans.items() if c == cfg_json), None)
        if orphan is not None:
            del book.orphans[orphan]
            book.children[tid] = orphan
            book.steps[tid] = _last_step(self.client, orphan)
            config_run = book.orphan_parents.pop(orphan, "")
            if gid is not None and gid not in book.config_runs and config_run \
                    and config_run != self.parent_run_id:
                # the restored searcher sampled this configuration again under a new id:
                # its seeds rejoin the configuration run they had
                book.config_runs[gid] = config_run
                book.config_index[gid] = len(book.config_index)

            if gid is not None and config_run:
                book.trial_gid[tid] = gid

            def claim() -> None:
                self.client.set_tag(orphan, TRIAL_TAG, tid)
                if gid is not None and book.config_runs.get(gid) == config_run:
                    self.client.set_tag(orphan, CONFIGURATION_TAG, gid)
                    self.client.set_tag(config_run, CONFIGURATION_TAG, gid)
                self._reopen(tid)

            self._submit(claim)
            return
        if gid is not None:
            self._start_seed(trial, tid, gid, cfg_json, params, method)
            return
        index = book.count
        book.count += 1

        def create() -> None:
            run = self.client.create_run(
                self.experiment_id, run_name=f"{self.sweep_name}-{index:03d}-{method}",
                tags={PARENT_TAG: self.parent_run_id, SWEEP_TAG: self.sweep_name,
                      TRIAL_TAG: tid, CONFIG_TAG: cfg_json})
            book.children[tid] = run.info.run_id
            log_params(self.client, run.info.run_id, params)
            if self.dataset:
                log_dataset(self.client, run.info.run_id, self.dataset)

        self._submit(create)

    def _start_seed(self, trial: Any, tid: str, gid: str, cfg_json: str,
                    params: dict[str, Any], method: str) -> None:
        """A repeated sweep's trial: its run goes under its configuration's run (made once)."""
        book = self.book
        seed_index = trial.config.get(SEED_INDEX_KEY, 0)
        if gid not in book.config_index:
            number = book.config_index[gid] = len(book.config_index)
            base = {k: v for k, v in trial.config.items() if k != SEED_INDEX_KEY}
            base_json, base_params, _ = self.describe(base)

            def create_configuration() -> None:
                run = self.client.create_run(
                    self.experiment_id, run_name=f"{self.sweep_name}-{number:03d}-{method}",
                    tags={PARENT_TAG: self.parent_run_id, SWEEP_TAG: self.sweep_name,
                          CONFIGURATION_TAG: gid, CONFIG_TAG: base_json,
                          REPEATS_TAG: str(self.repeats)})
                book.config_runs[gid] = run.info.run_id
                log_params(self.client, run.info.run_id, {**base_params,
                                                          "repeats": self.repeats})
                if self.dataset:
                    log_dataset(self.client, run.info.run_id, self.dataset)

            self._submit(create_configuration)
        number = book.config_index[gid]
        book.count += 1
        book.trial_gid[tid] = gid

        def create() -> None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"{self.sweep_name}-{number:03d}-{method}-seed{seed_index}",
                tags={PARENT_TAG: book.config_runs[gid], SWEEP_TAG: self.sweep_name,
                      TRIAL_TAG: tid, CONFIG_TAG: cfg_json, CONFIGURATION_TAG: gid})
            book.children[tid] = run.info.run_id
            log_params(self.client, run.info.run_id, {**params, "seed_index": seed_index})
            if self.dataset:
                log_dataset(self.client, run.info.run_id, self.dataset)

        self._submit(create)

    def _seed_ended(self, tid: str) -> None:
        """Writer thread, after a seed run ended: summarise its configuration once all did."""
        book = self.book
        run_id = book.children.get(tid)
        config_run = book.config_runs.get(book.trial_gid.get(tid, ""))
        if run_id is None or config_run is None:
            return
        book.seeds_ended[config_run] = book.seeds_ended.get(config_run, 0) + 1
        if book.seeds_ended[config_run] >= self.repeats:
            line = summarize_configuration(self.client, self.experiment_id, config_run)
            if line and self.progress is not None:
                self.progress(line)

    def describe(self, config: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
        """(config JSON, MLflow params, short method name) of a trial config.

        The config is resolved through the sweep's space into a :class:`RunConfig`; a config
        the space cannot resolve (the trial will fail too) gets an ``error`` param.
        """
        try:
            cfg = self.space.resolve(config, **self.overrides)
        except ValueError as exc:
            return "{}", {"error": str(exc)[:400]}, "?"
        return json.dumps(cfg.to_dict()), run_params(cfg), _short_name(cfg.loss.name)

    def headline(self, config: dict[str, Any]) -> str:
        """The method and hyperparameters of a trial, for its progress line."""
        try:
            cfg = self.space.resolve(config, **self.overrides)
        except ValueError:
            return "?"
        shown = {**cfg.loss.params, "lr": cfg.optimizer.lr}
        # the factories' arguments the space searches (model.hidden, optimizer.weight_decay)
        shown.update({k: v for k, v in config.items() if "." in k
                      and k.split(".", 1)[0] in ("model", "data", "optimizer")
                      and k not in ("optimizer.lr",)})
        hp = " ".join(f"{k}={_short(v)}" for k, v in shown.items() if k != "variant")
        head = f"{_short_name(cfg.loss.name):<6s} {hp}"
        if self.repeats > 1 and SEED_INDEX_KEY in config:
            head += f" seed {cfg.seed}"
        return head

    def _reopen(self, tid: str) -> None:
        run_id = self.book.children[tid]
        self.client.update_run(run_id, status="RUNNING")
        for tag in (ERROR_TAG, OUTCOME_TAG, COMPLETE_TAG):
            with contextlib.suppress(Exception):  # (absent tags)
                self.client.delete_tag(run_id, tag)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:  # noqa: D102
        self._start(trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,  # noqa: D102
                        **info: Any) -> None:
        self._start(trial)
        tid = trial.trial_id
        book = self.book
        if tid in book.sealed:
            return
        tags = self._tag_changes(tid, result)
        # a report carries its own epoch and the unreported epochs before it (EPOCH_HISTORY)
        epochs = []
        for entry in [*result.get(EPOCH_HISTORY, ()), result]:
            metrics = _numeric_metrics(entry)
            step = int(entry.get("epoch", result.get("training_iteration", 0)))
            if metrics and step > book.steps.get(tid, 0):
                book.steps[tid] = step
                epochs.append((step, metrics))
        if epochs or tags:
            self._submit(lambda: log_epochs(self.client, book.children[tid], epochs, tags))
        if epochs:
            self._epoch_line(trial, *epochs[-1])

    def _tag_changes(self, tid: str, result: dict) -> dict[str, str]:
        """Tags to set: the node and the checkpoint epoch of `result` where they changed."""
        book = self.book
        tags = {}
        for key, tag, seen, kind in ((NODE_KEY, NODE_TAG, book.nodes, str),
                                     (RESUMED_FROM, RESUMED_TAG, book.resumed, int)):
            value = result.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) or seen.get(tid) == value:
                continue
            seen[tid] = value
            tags[tag] = str(value)
        return tags

    def _epoch_line(self, trial: Any, epoch: int, metrics: dict[str, float]) -> None:
        now = time.monotonic()
        tid = trial.trial_id
        book = self.book
        last = book.last_line.get(tid, book.started.get(tid, now))
        if self.progress is None or now - last < self.EPOCH_LINE_EVERY_S:
            return
        if "val_accuracy" not in metrics or "val_ece" not in metrics:
            return
        book.last_line[tid] = now
        epochs = self.overrides.get("epochs") or trial.config.get("epochs", "?")
        self.progress(f"  {tid} epoch {epoch}/{epochs}: val acc "
                      f"{100 * metrics['val_accuracy']:.2f}% ECE {100 * metrics['val_ece']:.2f}%"
                      f" ({now - book.started.get(tid, now):.0f}s)")

    def on_trial_recover(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                         **info: Any) -> None:
        self._start(trial)
        tid = trial.trial_id
        book = self.book
        book.retries[tid] = book.retries.get(tid, 0) + 1
        count = book.retries[tid]
        message = _trial_error(trial)
        self._submit(lambda: self._tag_retry(tid, count, message))
        if self.progress is not None:
            self.progress(f"  {tid} failed ({message.splitlines()[-1][:160]}); retrying from its "
                          f"last checkpoint (retry {count} of {self.max_failures})")

    def _tag_retry(self, tid: str, count: int, message: str) -> None:
        run_id = self.book.children[tid]
        self.client.set_tag(run_id, RETRIES_TAG, str(count))
        self.client.set_tag(run_id, "raysearch.last_failure", message[:4000])

    def on_trial_complete(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                          **info: Any) -> None:
        self._start(trial)
        tid = trial.trial_id
        book = self.book
        result = dict(trial.last_result or {})
        if tid in book.sealed:  # recorded before a resume (Tune's snapshot was older)
            return
        tags = self._tag_changes(tid, result)
        if tags:
            self._submit(lambda: log_epochs(self.client, book.children[tid], [], tags))
        if result.get(DIVERGED):
            self._fail(trial, str(result[DIVERGED]), result, outcome="diverged")
            return
        complete = bool(result.get(COMPLETED, not self.requires_completed))
        checkpoint = trial.checkpoint if complete else None

        def finish() -> None:
            run_id = book.children[tid]
            log_epochs(self.client, run_id, [], {
                COMPLETE_TAG: str(complete).lower(),
                OUTCOME_TAG: "complete" if complete else "stopped_early"})
            drawn = False  # the trial draws its reliability diagram into its last checkpoint
            if checkpoint is not None:
                try:
                    with checkpoint.as_directory() as d:
                        for name in ARTIFACT_FILES:
                            if (Path(d) / name).is_file():
                                self.client.log_artifact(run_id, str(Path(d) / name))
                                drawn = drawn or name == RELIABILITY_PLOT
                except Exception as exc:  # never lose the run over an artifact
                    logger.warning("logits of %s not attached: %s", tid, exc)
            if complete and not drawn and isinstance(result.get(RELIABILITY), dict):
                title = f"{tid}  test ECE {100 * result.get('test_ece', float('nan')):.2f}%"
                try:
                    log_reliability(self.client, run_id, result[RELIABILITY], title)
                except Exception as exc:  # a plot must never lose the run
                    logger.warning("reliability diagram of %s failed: %s", tid, exc)
            self.client.set_terminated(run_id, "FINISHED")
            if tid in book.trial_gid:
                self._seed_ended(tid)

        self._submit(finish)
        self._report(trial, result, "done" if complete else "stopped early")

    def on_trial_error(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                       **info: Any) -> None:
        self._start(trial)
        self._fail(trial, _trial_error(trial), dict(trial.last_result or {}), outcome="error")

    def on_experiment_end(self, trials: list, **info: Any) -> None:  # noqa: D102
        self.book.flush()

    def _fail(self, trial: Any, message: str, result: dict, *, outcome: str) -> None:
        tid = trial.trial_id
        book = self.book

        def fail() -> None:
            run_id = book.children[tid]
            log_epochs(self.client, run_id, [], {COMPLETE_TAG: "false", OUTCOME_TAG: outcome,
                                                 ERROR_TAG: message[:4000]})
            self.client.set_terminated(run_id, "FAILED")
            if tid in book.trial_gid:
                self._seed_ended(tid)

        self._submit(fail)
        self._report(trial, result, f"FAILED: {message.splitlines()[-1][:160]}")

    def _report(self, trial: Any, result: dict, outcome: str) -> None:
        book = self.book
        book.finished += 1
        if self.progress is None:
            return
        elapsed = time.monotonic() - book.started.get(trial.trial_id, time.monotonic())
        head = self.headline(trial.config)
        total = f"/{self.total}" if self.total else ""
        scores = ""
        if "val_miou" in result and "val_ece" in result:  # segmentation
            scores = (f" val mIoU {100 * result['val_miou']:.2f}%"
                      f" pixel ECE {100 * result['val_ece']:.2f}%")
        elif "val_accuracy" in result and "val_ece" in result:
            scores = (f" val acc {100 * result['val_accuracy']:.2f}%"
                      f" ECE {100 * result['val_ece']:.2f}%")
        done = result.get(COMPLETED, not self.requires_completed)
        if "test_miou" in result and done:
            scores += (f" | test mIoU {100 * result['test_miou']:.2f}%"
                       f" pixel ECE {100 * result['test_ece']:.2f}%")
        elif "test_accuracy" in result and done:
            scores += (f" | test acc {100 * result['test_accuracy']:.2f}%"
                       f" ECE {100 * result['test_ece']:.2f}%")
        retries = book.retries.get(trial.trial_id, 0)
        if retries:
            outcome += f", after {retries} {'retry' if retries == 1 else 'retries'}"
        self.progress(f"[{book.finished}{total}] {head}{scores} ({elapsed:.1f}s, {outcome})")


def _short_name(name: str) -> str:
    """A name for run names and progress lines: an import string's attribute (``MyLoss``)."""
    return name.rsplit(":", 1)[-1].rsplit(".", 1)[-1] if ":" in name else name


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _trial_error(trial: Any) -> str:
    path = getattr(trial, "error_file", None)
    if path and Path(path).is_file():
        text = Path(path).read_text().strip()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln or "Exception" in ln]
        return (errors[-1] if errors else lines[-1]).strip() if lines else "unknown error"
    return str(getattr(trial, "error_msg", None) or "unknown error")


def _coerce(value: str) -> Any:
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def sweep_trials(client: MlflowClient, parent: Any) -> pd.DataFrame:
    """One row per child run of a sweep: identifiers, status, params and final metrics.

    Columns: ``trial`` (run name), ``run_id``, ``trial_id``, ``status``, ``complete`` (bool: ran
    all its epochs), ``outcome`` (complete, stopped_early, diverged, error, interrupted), the
    params (numbers where they parse), every metric's last value (``val_*`` of the last epoch,
    ``test_*``), and ``config`` (the RunConfig as JSON).
    """
    rows = []
    for run in child_runs(client, parent.info.experiment_id, parent.info.run_id):
        row = {"trial": run.info.run_name, "run_id": run.info.run_id,
               "trial_id": run.data.tags.get(TRIAL_TAG, ""), "status": run.info.status,
               "complete": run.data.tags.get(COMPLETE_TAG) == "true",
               "outcome": run.data.tags.get(OUTCOME_TAG, "")}
        row.update({k: _coerce(v) for k, v in run.data.params.items()})
        row.update(run.data.metrics)
        row["config"] = run.data.tags.get(CONFIG_TAG, "{}")
        rows.append(row)
    return pd.DataFrame(rows)


def sweep_runs(client: MlflowClient, experiment_id: str, parent_run_id: str) -> list[Any]:
    """Every run of a sweep below its parent (all pages), oldest first.

    Trial runs, and for ``--repeats`` the configuration runs and the seed runs under them.
    """
    name = client.get_run(parent_run_id).data.tags.get(SWEEP_TAG, "")
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=f"tags.`{SWEEP_TAG}` = '{name}'",
                                  max_results=1000, page_token=token,
                                  order_by=["attributes.start_time ASC"])
        runs.extend(r for r in page if r.info.run_id != parent_run_id
                    and r.data.tags.get(PARENT_TAG))
        token = page.token
        if not token:
            return runs


#: Outcomes that make a configuration incomplete even when other seeds completed: one that
#: diverges on a seed is unstable. (A seed stopped early by ASHA, which compares trials, not
#: configurations, or one that failed with an error is left out of the mean.)
_SPOILING_OUTCOMES = ("diverged",)


def summarize_configuration(client: MlflowClient, experiment_id: str,
                            config_run_id: str) -> str:
    """Log a repeated sweep's configuration run: mean and SEM over its seeds, then end it.

    Every final metric (``train_*``, ``val_*``, ``test_*``, ``shift_*``) that all the complete
    seed runs hold is logged as ``{m}_mean``, ``{m}_sem`` (sample std / sqrt(n), for n >= 2;
    :func:`raysearch.repeats.sem`) and under its plain name ``{m}`` = the mean, so selection,
    ``report`` and ``export`` read a configuration run like a single trial's run; ``n_seeds``
    is the number of complete seeds. The run is complete (tag ``raysearch.complete``) when at
    least one seed completed and none diverged; a seed stopped early (``--scheduler asha``
    judges every seed's trial on its own) or failed with an error only lowers ``n_seeds``. It
    ends FINISHED (also when every seed was stopped early, as a trial run does), else FAILED
    (KILLED when a seed was interrupted).

    Returns:
        A one-line summary for the progress output (empty when the run has no seeds).
    """
    from raysearch.repeats import sem

    seeds = child_runs(client, experiment_id, config_run_id)
    if not seeds:
        return ""
    complete = [r for r in seeds if r.data.tags.get(COMPLETE_TAG) == "true"]
    outcomes = [r.data.tags.get(OUTCOME_TAG, "") for r in seeds]
    metrics: dict[str, float] = {"n_seeds": float(len(complete))}
    if complete:
        keys = set.intersection(*({k for k in r.data.metrics if k.startswith(METRIC_PREFIXES)}
                                  for r in complete))
        for key in sorted(keys):
            values = [float(r.data.metrics[key]) for r in complete]
            if not all(math.isfinite(v) for v in values):
                continue
            metrics[key] = metrics[key + "_mean"] = sum(values) / len(values)
            if len(values) >= 2:
                metrics[key + "_sem"] = sem(values)
    spoiled = next((o for o in outcomes if o in _SPOILING_OUTCOMES), None)
    is_complete = bool(complete) and spoiled is None
    if is_complete:
        outcome, status = "complete", "FINISHED"
    elif "interrupted" in outcomes or any(r.info.status in ("RUNNING", "KILLED") for r in seeds):
        outcome, status = spoiled or "interrupted", "KILLED"
    elif spoiled is None and "stopped_early" in outcomes:  # ASHA stopped every seed
        outcome, status = "stopped_early", "FINISHED"
    else:
        outcome, status = spoiled or "error", "FAILED"
    run = client.get_run(config_run_id)
    step = int(run.data.params.get("epochs", 0)) if str(
        run.data.params.get("epochs", "")).isdigit() else 0
    log_epochs(client, config_run_id, [(step, metrics)], {
        COMPLETE_TAG: str(is_complete).lower(), OUTCOME_TAG: outcome,
        SEEDS_TAG: f"{len(complete)}/{len(seeds)}"})
    client.set_terminated(config_run_id, status)
    line = f"  configuration {run.info.run_name}: {len(complete)}/{len(seeds)} seeds complete"
    if is_complete and "val_accuracy" in metrics and "val_ece" in metrics:
        parts = []
        for key, label in (("val_accuracy", "val acc"), ("val_ece", "ECE")):
            spread = metrics.get(key + "_sem")
            pm = f" ± {100 * spread:.2f}" if spread is not None else ""
            parts.append(f"{label} {100 * metrics[key]:.2f}%{pm}")
        line += ", mean " + " ".join(parts)
    return line if is_complete else f"{line} ({outcome})"


def seed_trials(client: MlflowClient, parent: Any) -> pd.DataFrame:
    """One row per seed run of a sweep: its trials for a single-seed sweep, else the seed runs.

    For a repeated sweep (``--repeats``) the rows are the seed runs nested under the
    configuration runs, with ``config`` set to their configuration run's config (the same for
    all seeds of a configuration: the seed of its first run) and ``trial`` to that run's name;
    ``seed_run`` keeps the seed run's own name. For a single-seed sweep this is
    :func:`sweep_trials`. This is what :func:`raysearch.repeats.compare_methods` takes.
    """
    frame = sweep_trials(client, parent)
    if frame.empty or "repeats" not in frame:  # configuration runs carry the param
        return frame
    configs = {r["run_id"]: r for _, r in frame.iterrows()}
    rows = []
    for run in sweep_runs(client, parent.info.experiment_id, parent.info.run_id):
        owner = configs.get(run.data.tags.get(PARENT_TAG, ""))
        if owner is None or not run.data.tags.get(TRIAL_TAG):
            continue
        row = {"trial": owner["trial"], "seed_run": run.info.run_name,
               "run_id": run.info.run_id, "trial_id": run.data.tags.get(TRIAL_TAG, ""),
               "status": run.info.status,
               "complete": run.data.tags.get(COMPLETE_TAG) == "true",
               "outcome": run.data.tags.get(OUTCOME_TAG, "")}
        row.update({k: _coerce(v) for k, v in run.data.params.items()})
        row.update(run.data.metrics)
        row["config"] = owner["config"]
        rows.append(row)
    return pd.DataFrame(rows)


def child_runs(client: MlflowClient, experiment_id: str, parent_run_id: str) -> list[Any]:
    """Every child run of a sweep's parent run (all pages), oldest first."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id],
                                  filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                                  max_results=1000, page_token=token,
                                  order_by=["attributes.start_time ASC"])
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def write_parquet(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write a trials table with pyarrow (mixed-type param columns stored as strings)."""
    frame = frame.copy()
    for col in frame.columns:
        if frame[col].dtype == object:
            kinds = {type(v) for v in frame[col] if v is not None and v == v}
            if len(kinds) > 1 or kinds - {str, bool}:
                frame[col] = frame[col].map(lambda v: None if v is None or v != v else str(v))
    table = pa.Table.from_pandas(frame, preserve_index=False)
    pq.write_table(table, path)
    return Path(path)




def annotate_selection(
    frame: pd.DataFrame, *, tolerance: float, accuracy_key: str = "val_accuracy",
    ece_key: str = "val_ece", selection: str = "mean",
) -> pd.DataFrame:
    """Add ``on_front`` and ``selected`` columns, judged among the complete trials only.

    Failed and early-stopped trials keep ``on_front = selected = False``. The front is that of
    the (mean) metrics; with ``selection="robust"`` the selected row is the one with the lowest
    ``{ece_key}_mean + {ece_key}_sem`` among those within `tolerance` of the best mean accuracy
    (:func:`raysearch.repeats.select_robust`; rows of a repeated sweep's configurations).

    Raises:
        ValueError: if `selection` is unknown, or ``robust`` on a table without SEM columns.
    """
    if selection not in SELECTIONS:
        raise ValueError(f"unknown selection '{selection}'; choose from {', '.join(SELECTIONS)}")
    frame = frame.copy()
    frame["on_front"] = False
    frame["selected"] = False
    if frame.empty or "complete" not in frame or accuracy_key not in frame \
            or ece_key not in frame:
        return frame
    eligible = frame[frame["complete"] & frame[accuracy_key].notna() & frame[ece_key].notna()]
    if eligible.empty:
        return frame
    table = selection_table(eligible.reset_index(drop=True), accuracy=accuracy_key, ece=ece_key,
                            tolerance=tolerance)
    frame.loc[eligible.index, "on_front"] = table["on_front"].to_numpy()
    frame.loc[eligible.index, "selected"] = table["selected"].to_numpy()
    if selection == "robust":
        from raysearch.repeats import MEAN, SEM, select_robust

        if ece_key + SEM not in frame or accuracy_key + MEAN not in frame:
            raise ValueError(f"--selection robust needs the standard error of {ece_key} over "
                             "seeds: run the sweep with --repeats 2 or more")
        rows = eligible.reset_index(drop=True)
        pick = select_robust(rows, accuracy=accuracy_key, ece=ece_key, tolerance=tolerance)
        frame["selected"] = False
        frame.loc[eligible.index[pick], "selected"] = True
    return frame


def load_sweep(client: MlflowClient, name: str, experiment: str | None = None,
               tolerance: float | None = None, ece_key: str = "val_ece",
               selection: str | None = None) -> tuple[Any, pd.DataFrame, float]:
    """Parent run, trials table (with ``on_front``/``selected``) and tolerance of sweep `name`.

    `tolerance` and `selection` (:data:`SELECTIONS`) default to the ones the sweep ran with;
    `ece_key` is the validation ECE the front and the selection use (``val_ece_ts`` for the
    post-TS ECE). A repeated sweep's table has one row per configuration (means, ``_mean`` and
    ``_sem`` columns, ``n_seeds``). The accuracy axis is the sweep's ``accuracy_metric`` param
    (``val_miou`` for a segmentation sweep).

    Raises:
        ValueError: if the sweep is unknown.
    """
    parent = find_sweep(client, name, experiment)
    if tolerance is None:
        tolerance = float(parent.data.params.get("tolerance", 0.01))
    frame = sweep_trials(client, parent)
    if ece_key != "val_ece" and not frame.empty and ece_key not in frame:
        raise ValueError(f"sweep '{name}' has no metric {ece_key}: run it with that post-hoc "
                         "calibrator (--posthoc)")
    if selection is None:
        selection = parent.data.params.get("selection", "mean")
    accuracy_key = f"val_{parent.data.params.get('accuracy_metric', 'accuracy')}"
    frame = annotate_selection(frame, tolerance=tolerance, ece_key=ece_key, selection=selection,
                               accuracy_key=accuracy_key)
    return parent, frame, tolerance


def finalize_sweep(client: MlflowClient, parent_run_id: str, *, tolerance: float,
                   ece_key: str = "val_ece", accuracy_key: str = "val_accuracy",
                   status: str = "FINISHED", selection: str = "mean") -> pd.DataFrame:
    """Select the winner and attach ``pareto.png``, ``trials.parquet``, ``best_config.yaml``.

    The selection rule (lowest validation ECE within `tolerance` of the best validation
    accuracy) runs over the trials that ran all their epochs; failed and early-stopped trials
    stay in the table with ``on_front = selected = False``. In a repeated sweep the rows are
    its configuration runs (summarised here if a seed ended after the live summary), the rule
    applies to their means (`selection` ``mean``) or to mean + SEM of ECE (``robust``),
    ``pareto.png`` draws ±1 SEM error bars, and ``seeds.parquet`` holds the seed runs.

    Returns:
        The trials table with ``on_front`` and ``selected`` columns.
    """
    parent = client.get_run(parent_run_id)
    sweep_name = parent.data.tags.get(SWEEP_TAG, "")
    runs = sweep_runs(client, parent.info.experiment_id, parent_run_id)
    for run in runs:
        if run.info.status == "RUNNING" and run.data.tags.get(TRIAL_TAG):
            # trials the sweep left behind (interrupted, or lost with a killed driver): KILLED,
            # and `sweep --resume` sets them RUNNING again when it continues them
            client.set_tag(run.info.run_id, OUTCOME_TAG, "interrupted")
            client.set_tag(run.info.run_id, ERROR_TAG, "the sweep ended while this trial ran; "
                           f"`raysearch sweep --resume {sweep_name}` continues it")
            client.set_terminated(run.info.run_id, "KILLED")
    repeated = [r for r in runs if r.data.tags.get(REPEATS_TAG)
                and not r.data.tags.get(TRIAL_TAG)]
    for run in repeated:
        if run.info.status != "FINISHED" or _ended_after(client, run, runs):
            summarize_configuration(client, parent.info.experiment_id, run.info.run_id)
    frame = sweep_trials(client, parent)
    if frame.empty:
        client.set_terminated(parent_run_id, status)
        return frame
    try:
        frame = annotate_selection(frame, tolerance=tolerance, accuracy_key=accuracy_key,
                                   ece_key=ece_key, selection=selection)
    except ValueError as exc:  # robust without SEM (a single complete seed per configuration)
        logger.warning("%s; selecting on means", exc)
        frame = annotate_selection(frame, tolerance=tolerance, accuracy_key=accuracy_key,
                                   ece_key=ece_key)
    with tempfile.TemporaryDirectory() as d:
        write_parquet(frame, Path(d) / "trials.parquet")
        client.log_artifact(parent_run_id, str(Path(d) / "trials.parquet"))
        if repeated:
            seeds = seed_trials(client, parent)
            if not seeds.empty:
                write_parquet(seeds, Path(d) / "seeds.parquet")
                client.log_artifact(parent_run_id, str(Path(d) / "seeds.parquet"))
        shown = frame[frame["complete"] & frame[accuracy_key].notna()] \
            if accuracy_key in frame else frame.iloc[0:0]
        if not shown.empty:
            sel = [i for i, s in enumerate(shown["selected"]) if s]
            bars = {}
            if accuracy_key + "_sem" in shown and ece_key + "_sem" in shown:
                bars = {"accuracy_sem": shown[accuracy_key + "_sem"],
                        "ece_sem": shown[ece_key + "_sem"]}
            plots.pareto_plot(shown[accuracy_key], shown[ece_key], shown["on_front"],
                              Path(d) / "pareto.png", selected=sel[0] if sel else None,
                              groups=(list(shown["method"].astype(str))
                                      if "method" in shown else None),
                              title=f"sweep {sweep_name}" + (
                                  f" (mean ± SEM over {parent.data.params.get('repeats')} seeds)"
                                  if bars else ""),
                              ece_label="validation " + (
                                  "ECE" if ece_key == "val_ece" else ece_key[len("val_"):]),
                              **bars)
            client.log_artifact(parent_run_id, str(Path(d) / "pareto.png"))
        if frame["selected"].any():
            best = frame[frame["selected"]].iloc[0]
            export = best_config_document(best, parent)
            (Path(d) / "best_config.yaml").write_text(yaml.safe_dump(export, sort_keys=False))
            client.log_artifact(parent_run_id, str(Path(d) / "best_config.yaml"))
            metrics = {f"best_{k}": float(best[k]) for k in best.index
                       if isinstance(k, str) and k.startswith(("val_", "test_"))
                       and isinstance(best[k], (int, float)) and math.isfinite(best[k])}
            log_metrics(client, parent_run_id, metrics, step=0)
            client.set_tag(parent_run_id, "raysearch.selected_run", best["run_id"])
    client.set_tag(parent_run_id, "raysearch.trials_complete", str(int(frame["complete"].sum())))
    client.set_terminated(parent_run_id, status)
    return frame


def _ended_after(client: MlflowClient, config_run: Any, runs: list[Any]) -> bool:
    """True when a seed run of `config_run` ended after the configuration was summarised."""
    done = config_run.info.end_time or 0
    return any(r.data.tags.get(PARENT_TAG) == config_run.info.run_id
               and (r.info.end_time or 0) > done for r in runs)


def best_config_document(best: pd.Series, parent: Any) -> dict[str, Any]:
    """The exported document: ``config``, where it came from, and what it needs.

    ``config`` is a RunConfig mapping; ``requires`` is :func:`requirements`.
    """
    config = json.loads(best["config"])
    metrics = {k: float(best[k]) for k in best.index if isinstance(k, str)
               and k.startswith(("val_", "test_")) and isinstance(best[k], (int, float))
               and math.isfinite(best[k])}
    return {
        "config": config,
        "sweep": parent.data.tags.get(SWEEP_TAG, ""),
        "trial": best["trial"],
        "run_id": best["run_id"],
        "selection": parent.data.params.get("selection_rule", ""),
        "metrics": dict(sorted(metrics.items())),
        **({"metric_functions": parent.data.params["metrics"].split(",")}
           if parent.data.params.get("metrics") else {}),
        "requires": requirements(config, parent.data.params.get("metrics", "")),
    }


def requirements(config: dict[str, Any], metrics: str = "") -> dict[str, Any]:
    """What a config needs to train again: versions and the user's code behind its names.

    Returns:
        ``{"python": ..., "raysearch": ..., "torch": ..., "imports": [import strings of the
        loss, model, dataset, optimizer and metrics], "packages": {top-level package: its
        version}}``; a package without a version (not installed, no ``__version__``) is
        listed as ``"unversioned"``.
    """
    import platform
    import sys

    from raysearch import __version__
    from raysearch.registry import is_import_string

    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:  # pragma: no cover (torch is a dependency)
        torch_version = "absent"
    names = []
    if isinstance(config.get("loss"), dict):
        names = [config[s].get("name") for s in ("loss", "model", "data", "optimizer")
                 if isinstance(config.get(s), dict)]
    else:  # the flat layout of earlier versions
        names = [config.get(k) for k in ("method", "model", "dataset", "optimizer")]
    names += [m for m in str(metrics).split(",") if m]
    imports = [n for n in names if is_import_string(n)]
    packages = _plugin_packages(config, names)
    for name in imports:
        top = name.split(":", 1)[0].split(".", 1)[0]
        if top in ("__main__", "raysearch") or top in sys.stdlib_module_names:
            continue
        packages[top] = _package_version(top)
    return {"python": platform.python_version(), "raysearch": __version__,
            "torch": torch_version, "imports": imports, "packages": packages}


def _plugin_packages(config: dict[str, Any], names: list[Any]) -> dict[str, str]:
    """``{distribution: version}`` of the installed plug-ins behind a config's short names."""
    from raysearch.registries import registry
    from raysearch.registry import BUILT_IN, is_import_string

    kinds = {"loss": "losses", "model": "models", "data": "datasets", "optimizer": "optimizers"}
    pairs = [(kinds[s], config[s].get("name")) for s in kinds
             if isinstance(config.get(s), dict)]
    pairs += [("metrics", n) for n in names[len(pairs):]]
    out = {}
    for kind, name in pairs:
        if not isinstance(name, str) or is_import_string(name):
            continue
        try:
            source = registry(kind).source(name)
        except Exception:  # noqa: BLE001 (a registry that cannot be read here: nothing known)
            continue
        if source not in (BUILT_IN, "unknown") and " " in source:
            dist, version = source.rsplit(" ", 1)
            out[dist] = version
    return out


def _package_version(top: str) -> str:
    """The installed distribution's version of a top-level package, else its __version__."""
    import importlib
    import importlib.metadata

    from raysearch.registry import ensure_cwd_on_path

    ensure_cwd_on_path()
    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        return str(getattr(importlib.import_module(top), "__version__", "unversioned"))
    except Exception:  # noqa: BLE001 (not importable here: the export still records it)
        return "unversioned"


def check_export_versions(doc: Any, say: Callable[[str], None]) -> None:
    """Say (one line each) where this environment differs from an export's ``requires``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("requires"), dict):
        return
    wanted = doc["requires"]
    here = requirements(doc.get("config") or {}, ",".join(
        m for m in wanted.get("imports", []) if m not in _config_names(doc.get("config"))))
    for key in ("raysearch", "torch"):
        if wanted.get(key) and wanted[key] != here[key]:
            say(f"note: exported with {key} {wanted[key]}, this is {here[key]}: numbers may "
                "differ")
    for package, version in (wanted.get("packages") or {}).items():
        mine = here["packages"].get(package, _package_version(package))
        if version != mine:
            say(f"note: exported with {package} {version}, this is {mine}")


def _config_names(config: Any) -> set[str]:
    if not isinstance(config, dict):
        return set()
    return {str(v.get("name")) for v in config.values() if isinstance(v, dict)}


def train_and_log(cfg: RunConfig, *, tracking_uri: str | None = None,
                  experiment: str = DEFAULT_EXPERIMENT, run_name: str | None = None,
                  tags: dict[str, str] | None = None,
                  progress: Callable[[str], None] | None = None, device: str | None = None,
                  precision: str = "auto",
                  components: dict[str, dict[str, Any]] | None = None,
                  metrics: Any = ()) -> tuple[str, dict[str, float]]:
    """Train one RunConfig in this process (one torch thread) and log it as an MLflow run.

    `device` defaults to ``cuda`` when a GPU is visible, else ``cpu``; `precision` as in
    :func:`raysearch.training.fit`. The data, the model, the loss and the optimizer are built
    before the run is created: a bad name or argument writes nothing.

    Params, per-epoch ``train_*``/``val_*`` metrics (``step=epoch``), the test metrics and a
    reliability diagram are logged; the run ends FINISHED, or FAILED if training raises.

    Args:
        cfg: the run.
        tracking_uri: MLflow store (default as for a sweep).
        experiment: MLflow experiment.
        run_name: the run's name.
        tags: more tags of the run.
        progress: called with one line per epoch.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``auto``, ``bf16`` or ``fp32``.
        components: objects given through the Python API by label (as
            :func:`raysearch.training.fit`).
        metrics: a user's metric functions: import strings, callables, or a comma-separated
            string of import strings; logged as ``val_<fn>``/``test_<fn>``.

    Returns:
        (run id, final metrics).

    Raises:
        ValueError: if the tracking URI is unreachable or the config is invalid (unknown name,
            a keyword a factory does not take, a factory that raises).
        raysearch.training.DivergedError: if the loss becomes NaN (the run is marked FAILED).
    """
    import torch

    from raysearch.optim import check_optimizer
    from raysearch.registries import metric_functions
    from raysearch.tasks import task_for
    from raysearch.training import build_run_loss, check_run_model, fit, load_run_data

    components = components or {}
    if isinstance(metrics, str):
        metrics = [m for m in metrics.split(",") if m]
    metric_fns = metric_functions(metrics or (), components)
    data = load_run_data(cfg, components=components)  # bad input fails before MLflow
    task = task_for(data)
    check_run_model(cfg, data, components=components)
    build_run_loss(cfg, data, components=components)
    check_optimizer(cfg.optimizer)
    client, uri = get_client(tracking_uri)
    experiment_id = ensure_experiment(client, experiment, uri)
    run = client.create_run(experiment_id, run_name=run_name,
                            tags={CONFIG_TAG: json.dumps(cfg.to_dict()), **(tags or {})})
    run_id = run.info.run_id
    log_params(client, run_id, run_params(cfg))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a trial: same numerics, reproducible results
    accuracy = f"val_{task.primary_metric}"

    def on_epoch(epoch: int, values: dict[str, float], state: dict) -> None:
        log_metrics(client, run_id, _numeric_metrics(values), epoch)
        if progress is None:
            return
        if accuracy != "val_accuracy":
            progress(f"epoch {epoch}/{cfg.epochs}: {accuracy} {100 * values[accuracy]:.2f}% "
                     f"pixel acc {100 * values['val_accuracy']:.2f}% "
                     f"ECE {100 * values['val_ece']:.2f}%")
        else:
            progress(f"epoch {epoch}/{cfg.epochs}: val acc {100 * values['val_accuracy']:.2f}%"
                     f" ECE {100 * values['val_ece']:.2f}%")

    try:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        result = fit(cfg, on_epoch=on_epoch, device=device, precision=precision, data=data,
                     components=components, metrics=metric_fns)
    except BaseException as exc:
        client.set_tag(run_id, "raysearch.error", str(exc)[:4000])
        client.set_terminated(run_id, "FAILED")
        raise
    finally:
        torch.set_num_threads(threads)
    log_metrics(client, run_id, _numeric_metrics(result.metrics), cfg.epochs)
    bins = task.test_bins(result, cfg.ece_bins)
    log_reliability(client, run_id, {"edges": bins.edges, "counts": bins.counts,
                                     "accuracy": bins.accuracy, "confidence": bins.confidence},
                    f"{run_name or run_id}  test ECE {100 * result.metrics['test_ece']:.2f}%")
    client.set_tag(run_id, COMPLETE_TAG, "true")
    client.set_terminated(run_id, "FINISHED")
    return run_id, result.metrics


def trial_outputs(client: MlflowClient, run_id: str) -> Any:
    """The val/test logits and labels a trial stored (``logits.parquet``), or None.

    Returns:
        A :class:`raysearch.posthoc.Outputs` with ``split`` set, or None when the run has no
        such artifact (a failed or early-stopped trial).
    """
    from raysearch.posthoc import load_outputs

    if LOGITS_FILE not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    with tempfile.TemporaryDirectory() as d:
        local = client.download_artifacts(run_id, LOGITS_FILE, d)
        return load_outputs(local)


class SweepCallback(MlflowSweepCallback):
    """The sweep's MLflow record for a Tune trainable of your own (a ``tune.Tuner`` callback).

    Give it to your ``tune.RunConfig(callbacks=[...])``: it makes a parent run for the sweep and
    a child run per trial (the trial's config as params, every reported metric with
    ``step=epoch`` or ``training_iteration``), and once the trials ended it applies the
    selection rule ("lowest `ece` within `tolerance` of the best `accuracy`", on validation
    metrics) and attaches ``pareto.png``, ``trials.parquet`` and ``best_config.yaml`` to the
    parent run, as ``raysearch sweep`` does. A trial counts as complete when it ends without an
    error (a last result with ``completed: False``, e.g. one a scheduler stopped, does not).

    The tracking URI is `tracking_uri`, else ``$MLFLOW_TRACKING_URI``, else
    ``sqlite:///<cwd>/mlruns.db``.

    Args:
        name: the sweep's name (the parent run's name and tag; default
            ``<space>-<YYYYmmdd-HHMMSS>``).
        space: the :class:`~raysearch.spaces.SearchSpace` the trials were sampled from
            (their params are then named as in the space); None: the config's scalar values.
        experiment: MLflow experiment.
        tracking_uri: MLflow tracking URI.
        accuracy: the validation metric of the accuracy axis (maximised).
        ece: the validation metric of the calibration axis (minimised).
        tolerance: accuracy tolerance of the rule (absolute fraction).
        progress: called with one line per finished trial (default: :func:`print`).

    Attributes:
        parent_run_id: the sweep's parent run.
        trials: after the sweep, the trials table (``on_front``, ``selected`` columns).

    Example:
        >>> callback = SweepCallback(space=space)                  # doctest: +SKIP
        >>> tune.Tuner(my_trainable, tune_config=tune.TuneConfig(search_alg=raysearch.searcher(
        ...     space)), run_config=tune.RunConfig(callbacks=[callback])).fit()
    """

    requires_completed = False

    def __init__(self, name: str | None = None, *, space: SearchSpace | None = None,
                 experiment: str = DEFAULT_EXPERIMENT, tracking_uri: str | None = None,
                 accuracy: str = "val_accuracy", ece: str = "val_ece",
                 tolerance: float = 0.01,
                 progress: Callable[[str], None] | None = print) -> None:
        client, uri = get_client(tracking_uri)
        experiment_id = ensure_experiment(client, experiment, uri)
        name = name or f"{space.name if space is not None else 'sweep'}-" \
                       f"{time.strftime('%Y%m%d-%H%M%S')}"
        parent = client.create_run(experiment_id, run_name=name,
                                   tags={SWEEP_TAG: name, "raysearch.trainable": "own"})
        log_params(client, parent.info.run_id, {
            "space": space.name if space is not None else "", "tolerance": tolerance,
            "accuracy_metric": accuracy[len("val_"):] if accuracy.startswith("val_")
            else accuracy, "ece_metric": ece[len("val_"):] if ece.startswith("val_") else ece,
            "selection_rule": f"lowest {ece} within {tolerance} of the best {accuracy}"})
        super().__init__(client, experiment_id, parent.info.run_id, name, space, {},
                         progress=progress)
        self.accuracy, self.ece, self.tolerance = accuracy, ece, tolerance
        self.trials: pd.DataFrame | None = None

    def describe(self, config: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
        """The trial's config as JSON, its scalar values (or the space's names) as params."""
        plain = {k: v for k, v in config.items() if isinstance(v, (str, int, float, bool))
                 or v is None}
        if self.space is not None:
            try:
                plain = self.space.plain_params(config)
            except ValueError:
                pass
        method = _short_name(str(plain.get("method", "trial")))
        return json.dumps(_jsonable(config)), plain, method

    def headline(self, config: dict[str, Any]) -> str:
        """The trial's sampled values, for its progress line."""
        _, params, _ = self.describe(config)
        return " ".join(f"{k}={_short(v)}" for k, v in params.items())

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """Flush the writes, then select and attach the Pareto plot, table and best config."""
        super().on_experiment_end(trials, **info)
        self.close()
        self.trials = finalize_sweep(self.client, self.parent_run_id, tolerance=self.tolerance,
                                     ece_key=self.ece, accuracy_key=self.accuracy)
        if self.progress is not None:
            picked = self.trials[self.trials["selected"]] if not self.trials.empty else None
            line = (f"selected {picked.iloc[0]['trial']}" if picked is not None and len(picked)
                    else "no complete trial: nothing selected")
            self.progress(f"sweep {self.sweep_name}: {line}; parent run {self.parent_run_id}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    return str(value)


def log_calibration_run(client: MlflowClient, uri: str, experiment: str, *, run_name: str,
                        source: str, params: dict[str, Any], metrics: dict[str, float],
                        folder: str | Path) -> str:
    """Log a post-hoc calibration of stored outputs as one finished MLflow run.

    Args:
        client: a client on the store.
        uri: the store's resolved tracking URI (where a new experiment keeps its artifacts).
        experiment: the experiment, created if missing.
        run_name: the run's name (``calibrate-<file stem>``).
        source: the calibrated file or trial run id (tag ``raysearch.source``).
        params: the calibration's settings, logged as params.
        metrics: its metrics (as :meth:`raysearch.posthoc.CalibrationReport.as_metrics`),
            logged at step 0.
        folder: a folder whose files (the table, the reliability diagrams) become artifacts.

    Returns:
        The run id.
    """
    exp_id = ensure_experiment(client, experiment, uri)
    run = client.create_run(exp_id, run_name=run_name, tags={"raysearch.source": source})
    log_params(client, run.info.run_id, params)
    log_metrics(client, run.info.run_id, metrics, step=0)
    for item in sorted(Path(folder).iterdir()):
        client.log_artifact(run.info.run_id, str(item))
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id
