"""Ray Tune wrapping of :func:`raysearch.training.run.fit`: one trial = one training run.

The trial function resolves its flat Tune config into a :class:`~raysearch.config.RunConfig`
through the sweep's search space, trains with one torch thread, reports validation metrics every
epoch with a checkpoint (``tune.report``), and adds the test metrics and the test reliability
bins to the last report. A trial that ran all its epochs reports ``completed = True`` in its last
result; a trial stopped early by a scheduler never does, which is how the searcher and the
selection rule tell finished trials from partial ones. Every report carries ``node_id``, the
Ray node that trained (a string; the tracking callback tags the trial's run with it).

With ``workers > 1`` the trial is a data-parallel Ray Train run (:func:`run_trial`, **DDP
trials**): the Tune trial function only coordinates a ``TorchTrainer`` whose workers run
:func:`raysearch.training.run.fit` in DDP mode, and rank 0 makes the same reports (metrics, files
and checkpoints) as a one-process trial.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import queue
import re
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from raysearch.config import RunConfig

# the keys of the reports and the checkpoint's files, shared with the tracking
from raysearch.training.records import ARTIFACT_FILES as ARTIFACT_FILES
from raysearch.training.records import CHECKPOINT_SKIPPED as CHECKPOINT_SKIPPED
from raysearch.training.records import COMPLETED as COMPLETED
from raysearch.training.records import DIVERGED as DIVERGED
from raysearch.training.records import EPOCH_HISTORY as EPOCH_HISTORY
from raysearch.training.records import NODE_ID as NODE_ID
from raysearch.training.records import RELIABILITY as RELIABILITY
from raysearch.training.records import RELIABILITY_PLOT as RELIABILITY_PLOT
from raysearch.training.records import RESUMED_FROM as RESUMED_FROM
from raysearch.training.records import WEIGHTS_FILE as WEIGHTS_FILE
from raysearch.training.registries import metric_functions
from raysearch.training.run import DivergedError, fit, load_run_data
from raysearch.training.tasks import (  # noqa: F401 (file names re-exported for the tracking callback)
    CLASS_IOU,
    CONFIDENCE_PLOT,
    LOGITS_FILE,
    SHIFT_PLOT,
    SHIFT_TABLE,
    task_for,
)
from raysearch.tune.settings import FAULT_KINDS
from raysearch.tune.spaces import SearchSpace

#: Default checkpoint cadence (``checkpoint_every=None``): a checkpoint once this many seconds
#: of training passed since the last one. A retried trial loses at most that much work, and a
#: checkpoint (a state dict written, persisted to the storage path, and Tune's experiment
#: snapshot it forces) costs well under 1% of it.
CHECKPOINT_INTERVAL_S = 60.0
#: Without a scheduler a trial reports after its checkpoints, its last epoch, and otherwise at
#: most every this many seconds (progress lines and live MLflow curves); each report carries
#: the epochs since the previous one (:data:`EPOCH_HISTORY`). A report blocks the trial until
#: the driver has taken it, which costs a 2-s trial on a busy 2-core machine a noticeable share.
REPORT_INTERVAL_S = 10.0
_CKPT_FILE = "state.pt"
#: A trial's checkpoint folders in its storage: ``checkpoint_<index>`` (Tune's names).
_CKPT_FOLDER = re.compile(r"checkpoint_(\d+)")
#: Logical memory (bytes) that the coordinating function of a DDP trial reserves: Tune needs a
#: non-empty resource bundle, and CPUs or GPUs held there could not go to the Train workers.
COORDINATOR_MEMORY = 2**20
#: Seconds a stopped DDP trial waits for its Train run to end before returning to Tune (the
#: run goes on ending in the background; see :func:`_run_ddp`).
_STOP_WAIT_S = 1.5


class InjectedFault(RuntimeError):
    """Raised by a fault drill (``fault_epoch`` of :func:`run_trial`): Tune retries the trial."""


def _nan_to_none(values: Any) -> list[Any]:
    return [None if (isinstance(v, float) and math.isnan(v)) else v for v in values]


def trial_device() -> torch.device:
    """``cuda`` when this process sees a GPU, else ``cpu``.

    Ray sets ``CUDA_VISIBLE_DEVICES`` to the trial's share; a trial that asked for none sees none.
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def loader_workers(cpus_per_trial: float) -> int:
    """DataLoader workers of a trial with `cpus_per_trial` CPUs (0 for one CPU or less).

    One CPU runs the training loop, the rest load image files.
    """
    return max(int(math.floor(cpus_per_trial)) - 1, 0)


def trial_resources(*, cpus_per_trial: float, gpus_per_trial: float, workers: int,
                    cpus_per_worker: float, gpus_per_worker: float) -> dict[str, float]:
    """What a trial of :func:`run_trial` asks Tune for (``tune.with_resources``).

    One process (``workers == 1``): ``{"cpu": cpus_per_trial}``, plus ``"gpu"`` when
    `gpus_per_trial` > 0. A DDP trial (``workers > 1``): the Tune function only coordinates,
    so it holds no CPU and no GPU (just :data:`COORDINATOR_MEMORY` bytes of logical memory,
    since Tune needs a non-empty bundle), and Ray Train reserves the workers' own placement group
    (``workers`` bundles of `cpus_per_worker` CPUs and `gpus_per_worker` GPUs) when the run
    starts. Had the coordinator held a CPU, trials holding coordinators could block the workers
    they wait for (on 2 CPUs: two trials, each holding 1 CPU and waiting for 2 x 0.5). Tune
    cannot count the workers, so ``max_concurrent_trials`` bounds how many Train runs compete for
    them; a run that cannot get its workers yet waits for them (Train retries its start-up).

    Raises:
        ValueError: if `workers` < 1, a CPU/GPU amount is negative, `cpus_per_trial` or
            `cpus_per_worker` is not > 0, or `gpus_per_worker` is fractional in a DDP trial
            (NCCL ranks cannot share a GPU).
    """
    _check_workers(workers, cpus_per_worker, gpus_per_worker)
    if not cpus_per_trial > 0 or not gpus_per_trial >= 0:
        raise ValueError(f"`cpus_per_trial` must be > 0 and `gpus_per_trial` >= 0, got "
                         f"{cpus_per_trial} and {gpus_per_trial}")
    if workers > 1:
        return {"cpu": 0.0, "memory": COORDINATOR_MEMORY}
    resources = {"cpu": cpus_per_trial}
    if gpus_per_trial:
        resources["gpu"] = gpus_per_trial
    return resources


def _check_workers(workers: int, cpus_per_worker: float, gpus_per_worker: float) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"`workers` must be an int >= 1, got {workers!r}")
    if not cpus_per_worker > 0 or not gpus_per_worker >= 0:
        raise ValueError(f"`cpus_per_worker` must be > 0 and `gpus_per_worker` >= 0, got "
                         f"{cpus_per_worker} and {gpus_per_worker}")
    if workers > 1 and gpus_per_worker and (gpus_per_worker < 1 or gpus_per_worker % 1):
        raise ValueError(f"`gpus_per_worker` must be 0 or a whole number of GPUs in a DDP trial "
                         f"(NCCL ranks cannot share a GPU), got {gpus_per_worker}")


def run_trial(config: dict[str, Any], *, space: SearchSpace, overrides: dict[str, Any],
              posthoc: tuple[str, ...] = ("ts",), checkpoint_every: int | None = None,
              report_every_epoch: bool = False, precision: str = "auto",
              cpus_per_trial: float = 1.0,
              shift_set: Any = None, workers: int = 1, cpus_per_worker: float = 1.0,
              gpus_per_worker: float = 0.0, fault_epoch: int | None = None,
              fault_kind: str = "raise", log_weights: bool = False,
              metrics: tuple[str, ...] = (),
              code_paths: tuple[str, ...] = (), components: bytes | None = None) -> None:
    """Tune function trainable: train one configuration and report to Tune.

    After the last epoch the post-hoc calibrators named in `posthoc` are fitted on the
    validation logits and measured on the test logits (``test_ece_ts``, ...); ``val_ece_ts``
    etc. come from a calibrator fitted on one stratified half of the validation set and
    measured on the other half (an out-of-sample validation score to select on). The validation
    and test logits and labels are written as ``logits.parquet`` into the final checkpoint (the
    tracking callback attaches it to the trial's MLflow run).

    Args:
        config: the flat trial config from the searcher (sampled and fixed values).
        space: the sweep's search space (resolves `config` into a RunConfig).
        overrides: sweep-wide settings (dataset, epochs, seed, n_bins, data_dir) that replace the
            space's values.
        posthoc: calibrator names of :func:`raysearch.calibration.fit_calibrator` (may be empty).
        checkpoint_every: attach a checkpoint (model, optimizer, scheduler) to every n-th
            epoch's report; 0 checkpoints the last epoch only; None (default) checkpoints an
            epoch once :data:`CHECKPOINT_INTERVAL_S` seconds of training passed since the last
            checkpoint (or the attempt's start). The last epoch always has one.
        report_every_epoch: report every epoch (what a scheduler such as ASHA needs to compare
            rungs). False (default): report the epochs that carry a checkpoint, the last one and
            otherwise at most every :data:`REPORT_INTERVAL_S` seconds, each report holding the
            unreported epochs before it under :data:`EPOCH_HISTORY`.
        precision: ``auto``, ``bf16`` or ``fp32`` (:func:`raysearch.training.run.fit`).
        cpus_per_trial: CPUs Ray reserved for the trial: torch threads on the CPU and
            DataLoader workers (:func:`loader_workers`) for file-backed datasets.
        shift_set: a :class:`raysearch.metrics.shift.ShiftSet` built by the driver (or its ``.npz``
            path):
            after training the model is evaluated on it, before and after the first calibrator
            of `posthoc` (``shift_*`` metrics, ``shift.csv`` and ``shift.png``).
        workers: Ray Train workers; 1 trains in this process, more run a DDP trial (below).
        cpus_per_worker: CPUs of each DDP worker (torch threads, DataLoader workers).
        gpus_per_worker: GPUs of each DDP worker (0: gloo on the CPU; a whole number: NCCL).
        fault_epoch: a fault drill: the first attempt (one that Tune gave no checkpoint) raises
            :class:`InjectedFault` right after reporting epoch `fault_epoch`, so a sweep's retry
            path (``--max-failures``) can be exercised on a real cluster; None (default) never.
        fault_kind: what the drill does (:data:`raysearch.tune.settings.FAULT_KINDS`):
            ``raise`` (default, above); ``kill-in-checkpoint``: at epoch `fault_epoch` the
            attempt writes that epoch's state truncated to half its bytes as ``state.pt`` into
            the trial's next ``checkpoint_<index>`` folder in storage (what a copy interrupted
            by a kill leaves; Tune never registers it), then SIGKILLs its own process, so Ray
            sees a dead worker; ``corrupt-checkpoint``: after reporting epoch `fault_epoch`,
            the attempt truncates the ``state.pt`` of its newest checkpoint in storage, then
            raises :class:`InjectedFault`. Both need ``workers == 1``.
        log_weights: also write the final weights (the model's state dict) as ``weights.pt``
            into the last checkpoint, which the tracking callback attaches to the trial's run.
        metrics: a user's metric functions by import string (or API label): logged as
            ``val_<fn>`` every epoch and ``test_<fn>`` at the end.
        code_paths: folders of the user's code (the driver's current directory and the
            parents of its packages), put first on this worker's ``sys.path`` before any
            name is resolved: the worker imports ``package.module:attr`` as the driver did.
        components: the Python API's objects (cloudpickled ``{kind: {label: object}}``),
            unpickled after `code_paths` are on the path.

    The trial trains on the GPU Ray gave it (:func:`trial_device`), else on the CPU.

    **DDP trials** (``workers > 1``): this function coordinates a Ray Train ``TorchTrainer``
    (``ScalingConfig(num_workers=workers, use_gpu=gpus_per_worker > 0,
    resources_per_worker={"CPU": cpus_per_worker, "GPU": gpus_per_worker})``, NCCL on GPUs,
    gloo on the CPU); its resources are those of :func:`trial_resources`. Every worker runs
    :func:`raysearch.training.run.fit` in DDP mode, whose metrics and logits are those of one
    worker. Rank 0 makes every report a one-process trial makes (per-epoch metrics and
    checkpoints, the final report with reliability bins, ``logits.parquet``, post-hoc and shift
    metrics, ``diverged``); they reach Tune through this function, which calls
    ``tune.report`` with a Tune checkpoint holding the same files, so the results, the MLflow
    run and the checkpoint look like a one-process trial's and ``tune.get_checkpoint()``
    resumes it (the state is handed to every worker). Ray Train's ``TuneReportCallback`` is
    not used: it forwards metrics and only the path of a Train checkpoint, never a Tune
    checkpoint. Reporting is synchronous as in a one-process trial: rank 0 waits until Tune
    took each report, and when Tune stops the trial (a scheduler) every rank leaves at that
    epoch boundary.

    **Checkpoints and retries**: a checkpoint is a folder holding ``state.pt`` (the epoch, the
    model, optimizer and scheduler state dicts and the epoch's metrics: tensors and plain
    containers only), read back with ``torch.load(weights_only=True)``. When Tune retries a
    failed trial or resumes a sweep, ``tune.get_checkpoint()`` returns the last one and training
    continues at the next epoch with the same batches as an uninterrupted run (the batch order
    is seeded per epoch); the reports of that attempt carry ``resumed_from_epoch``. A checkpoint
    whose ``state.pt`` is missing, truncated or corrupt (a worker killed while writing it, a
    damaged storage) is skipped (:func:`resume_state`): the attempt resumes from the trial's
    newest readable older checkpoint, or starts from scratch when none is, and its first
    report carries the one line that says so (:data:`CHECKPOINT_SKIPPED`, the run's
    ``raysearch.checkpoint_skipped`` tag; it is logged as a warning too).

    A training loss that becomes NaN/inf ends the trial with a last report holding
    ``diverged`` (the message): the tracking callback records it FAILED and the searcher tells
    Optuna FAIL. Any other exception propagates (Tune marks the trial ERROR); a batch that
    does not fit in the GPU's memory is one of them:
    :class:`~raysearch.training.run.OutOfMemoryRunError`, whose one line (batch size, device,
    epoch) becomes the trial's ``raysearch.error`` tag. The trial is not retried with a smaller
    batch (that would change its configuration); the other trials go on.

    Raises:
        ValueError: on invalid `workers`, `cpus_per_worker` or `gpus_per_worker`
            (:func:`trial_resources`), an unknown `fault_kind`, or a `fault_kind` other than
            ``raise`` with ``workers > 1``.
    """
    _check_workers(workers, cpus_per_worker, gpus_per_worker)
    if fault_kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault_kind {fault_kind!r}; choose from {', '.join(FAULT_KINDS)}")
    if fault_kind != "raise" and workers > 1:
        raise ValueError(f"fault_kind {fault_kind!r} needs a one-process trial (workers 1), got "
                         f"workers {workers}")
    cfg: RunConfig = space.resolve(config, **overrides)
    resume_bytes, skipped = None, None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        resume_bytes, skipped = resume_state(checkpoint)
        if skipped is not None:
            logging.getLogger(__name__).warning(skipped)
    options = {"posthoc": tuple(posthoc), "checkpoint_every": checkpoint_every,
               "report_every_epoch": report_every_epoch, "precision": precision,
               "shift_set": shift_set, "fault_epoch": fault_epoch, "fault_kind": fault_kind,
               "log_weights": log_weights,
               # a drill fires in the first attempt only (a retry that found no readable
               # checkpoint starts from scratch, but does not drill again)
               "first_attempt": checkpoint is None, CHECKPOINT_SKIPPED: skipped,
               "trial_id": tune.get_context().get_trial_id() or "trial",
               # resolved in each training process (a DDP worker too): bytes travel safely
               "metrics": tuple(metrics), "code_paths": tuple(code_paths),
               "components": components}
    if workers > 1:
        torch.set_num_threads(1)  # this process only coordinates
        _run_ddp(cfg, resume_bytes, options, workers=workers, cpus_per_worker=cpus_per_worker,
                 gpus_per_worker=gpus_per_worker)
        return
    device = trial_device()
    torch.set_num_threads(1 if device.type == "cuda" else max(int(cpus_per_trial), 1))
    node = ray.get_runtime_context().get_node_id()

    def send(metrics: dict[str, Any], files: Path | None = None, last: bool = False) -> bool:
        _tune_report({**metrics, NODE_ID: node}, files)
        return True

    _train_and_report(cfg, resume_bytes, options, send=send, device=device,
                      num_workers=loader_workers(cpus_per_trial))


def user_components(code_paths: tuple[str, ...] = (),
                    components: bytes | None = None) -> dict[str, dict[str, Any]]:
    """Put the user's code folders on ``sys.path``, then unpickle the API's objects.

    Args:
        code_paths: folders to put first on ``sys.path`` (missing ones are skipped).
        components: cloudpickled ``{kind: {label: object}}``, or None.

    Returns:
        ``{kind: {label: object}}`` (empty without `components`).
    """
    import sys

    for path in reversed(code_paths):
        if path not in sys.path and Path(path).is_dir():
            sys.path.insert(0, path)
    if not components:
        return {}
    import cloudpickle

    return cloudpickle.loads(components)


class _Stop(Exception):  # noqa: N818 (control flow, not an error)
    """Tune stopped a DDP trial: every rank leaves fit() at the same epoch boundary."""


def _train_and_report(cfg: RunConfig, resume_bytes: bytes | None, options: dict[str, Any], *,
                      send: Any, device: torch.device, num_workers: int,
                      rank: int = 0, agree: Any = None) -> None:
    """Train `cfg` and make the trial's reports through ``send(metrics, folder, last) -> go_on``.

    ``folder`` is None or a directory holding the checkpoint's files (valid during the call);
    ``last`` marks the final or diverged report.
    One process: `send` calls ``tune.report``. DDP (in every Train worker): only `rank` 0
    sends; ``agree(go_on)`` broadcasts rank 0's answer so every rank stops together.
    """
    checkpoint_every = options["checkpoint_every"]
    every_epoch = options.get("report_every_epoch", False)
    resume = load_state(resume_bytes) if resume_bytes is not None else None
    extra: dict[str, Any] = {} if resume is None else {RESUMED_FROM: int(resume["epoch"])}
    # the line of a skipped unreadable checkpoint travels in the attempt's first report
    skipped = [options[CHECKPOINT_SKIPPED]] if options.get(CHECKPOINT_SKIPPED) else []
    if extra or skipped:
        plain_send = send

        def send(metrics: dict[str, Any], files: Path | None = None, last: bool = False) -> bool:
            first = {CHECKPOINT_SKIPPED: skipped.pop()} if skipped else {}
            return plain_send({**metrics, **extra, **first}, files, last)

    last_state: dict[str, Any] = {}
    pending: list[dict[str, Any]] = []  # epochs trained since the last report (rank 0)
    clock = {"checkpoint": time.monotonic(), "report": time.monotonic()}

    def with_history(metrics: dict[str, Any]) -> dict[str, Any]:
        if pending:
            metrics = {**metrics, EPOCH_HISTORY: list(pending)}
            pending.clear()
        return metrics

    def checkpoint_due(epoch: int, now: float) -> bool:
        if checkpoint_every is None:
            return now - clock["checkpoint"] >= options.get("checkpoint_seconds",
                                                            CHECKPOINT_INTERVAL_S)
        return bool(checkpoint_every) and epoch % checkpoint_every == 0

    def is_drill(epoch: int) -> bool:
        return epoch == options.get("fault_epoch") and options.get("first_attempt", True)

    due: set[int] = set()  # rank 0: epochs whose checkpoint wants_state found due

    def wants_state(epoch: int) -> bool:
        """Whether `on_epoch` needs the epoch's state: fit deep-copies it only then."""
        if epoch == cfg.epochs:
            return True
        if is_drill(epoch) and options.get("fault_kind") == "kill-in-checkpoint":
            return True
        if rank == 0 and checkpoint_due(epoch, time.monotonic()):
            due.add(epoch)
            return True
        return False

    def on_epoch(epoch: int, metrics: dict[str, float], state: dict | None) -> None:
        if epoch == cfg.epochs:
            # the last epoch is reported below, together with the test metrics
            last_state.update(state)
            return
        go_on = True
        drill = is_drill(epoch)
        if drill and options.get("fault_kind") == "kill-in-checkpoint":
            _kill_in_checkpoint(state)  # never returns
        if rank == 0:
            now = time.monotonic()
            checkpoint = epoch in due  # decided as fit copied the state (wants_state)
            due.discard(epoch)
            entry = {"epoch": epoch, **metrics}
            if checkpoint or drill or every_epoch or now - clock["report"] >= REPORT_INTERVAL_S:
                clock["report"] = now
                if checkpoint:
                    clock["checkpoint"] = now
                    with tempfile.TemporaryDirectory() as d:
                        torch.save(state, Path(d) / _CKPT_FILE)
                        go_on = send(with_history(entry), Path(d))
                else:
                    go_on = send(with_history(entry), None)
            else:
                pending.append(entry)
        if agree is not None and not agree(go_on):
            raise _Stop
        if drill:
            torn = ""
            if options.get("fault_kind") == "corrupt-checkpoint":
                torn = f" and truncated {_truncate_newest_checkpoint()}"
            raise InjectedFault(f"fault drill: first attempt stopped after epoch {epoch}{torn}")

    try:
        components = user_components(options.get("code_paths", ()), options.get("components"))
        metric_fns = metric_functions(options.get("metrics", ()), components)
        data = load_run_data(cfg, components=components)
        result = fit(cfg, on_epoch=on_epoch, epoch_states=wants_state, resume=resume,
                     device=device, precision=options["precision"], num_workers=num_workers,
                     data=data, distributed=agree is not None, components=components,
                     metrics=metric_fns)
    except _Stop:
        return
    except DivergedError as exc:
        # reported, not raised: the trial ends FAILED in MLflow and Optuna, and its worker
        # process stays alive for the next trial (reuse_actors) instead of being replaced
        # (in DDP every rank raises it at the same batch: the check is all-reduced)
        if rank == 0:
            send(with_history({DIVERGED: str(exc), COMPLETED: False}), None, True)
        return
    except InjectedFault:
        raise
    except Exception:
        # the epochs trained before the error still reach MLflow (one process: a DDP rank
        # that raised has no Train run left to report through)
        if rank == 0 and pending and agree is None:
            with contextlib.suppress(BaseException):
                last = pending.pop()
                send(with_history(last), None)
        raise
    if rank != 0:
        return
    with tempfile.TemporaryDirectory() as d:
        final = _final_report(result, cfg, data.test, last_state, options, Path(d))
        send(with_history(final), Path(d), True)


def load_state(data: bytes) -> dict[str, Any]:
    """Read a trial checkpoint's ``state.pt`` bytes with ``torch.load(weights_only=True)``.

    Only tensors and plain containers are accepted (no code is unpickled from the storage
    path); tensors land on the CPU.

    Raises:
        ValueError: if the file holds anything else (e.g. a checkpoint written by an older
            raysearch that pickled arbitrary objects) or is not a checkpoint state.
    """
    try:
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # pickle.UnpicklingError and friends
        raise ValueError(f"trial checkpoint {_CKPT_FILE} cannot be read with weights_only=True "
                         f"(tensors and plain containers only): {' '.join(str(exc).split())[:300]}"
                         ) from None
    if not isinstance(state, dict) or "epoch" not in state:
        raise ValueError(f"trial checkpoint {_CKPT_FILE} is not a training state (no 'epoch')")
    return state


def _storage_name(filesystem: Any, path: str) -> str:
    """`path` on `filesystem` as a user finds it: a local path, else ``<scheme>://<path>``."""
    kind = getattr(filesystem, "type_name", "local")
    return path if kind == "local" or "::" in kind else f"{kind}://{path}"


def read_state(filesystem: Any, folder: str) -> tuple[bytes, int]:
    """``state.pt`` of the checkpoint `folder` on `filesystem`: its bytes and epoch.

    Raises:
        OSError: if the file is missing or cannot be read.
        ValueError: if it is not a readable training state (:func:`load_state`).
    """
    with filesystem.open_input_stream(f"{folder}/{_CKPT_FILE}") as stream:
        data = stream.read()
    return data, int(load_state(data)["epoch"])


def _why(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "missing"
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def trial_checkpoints(filesystem: Any, folder: str) -> list[tuple[int, str]]:
    """``(index, path)`` of the ``checkpoint_<index>`` folders in a trial's `folder`, newest first.

    Args:
        filesystem: the storage's ``pyarrow.fs.FileSystem``.
        folder: the trial's folder on it (an unreadable one has none).
    """
    import pyarrow.fs

    try:
        infos = filesystem.get_file_info(pyarrow.fs.FileSelector(folder))
    except OSError:
        return []
    found = [(int(m.group(1)), info.path) for info in infos
             if info.type == pyarrow.fs.FileType.Directory
             and (m := _CKPT_FOLDER.fullmatch(info.base_name)) is not None]
    return sorted(found, reverse=True)


def resume_state(checkpoint: tune.Checkpoint) -> tuple[bytes | None, str | None]:
    """The ``state.pt`` bytes to resume from, given the checkpoint Tune returned.

    When the checkpoint's ``state.pt`` cannot be read (missing, truncated, corrupt, or not
    loadable with ``torch.load(weights_only=True)``), the trial's older checkpoint folders next
    to it (``checkpoint_<index>`` with a lower index, on the same filesystem) are tried, newest
    first.

    Args:
        checkpoint: ``tune.get_checkpoint()`` of the attempt (its ``path`` and ``filesystem``
            locate the folder in the sweep's storage).

    Returns:
        ``(bytes, None)`` when the checkpoint is readable. Otherwise the bytes of the newest
        readable older checkpoint (None: none is, the attempt starts from scratch) and one
        line naming the unreadable file (its full path in the storage) and why, and what the
        attempt resumes from instead.
    """
    fs, folder = checkpoint.filesystem, checkpoint.path.rstrip("/")
    try:
        return read_state(fs, folder)[0], None
    except (OSError, ValueError) as exc:
        why = _why(exc)
    line = (f"checkpoint {_storage_name(fs, f'{folder}/{_CKPT_FILE}')} cannot be read ({why}); "
            f"skipped")
    parent, _, name = folder.rpartition("/")
    match = _CKPT_FOLDER.fullmatch(name)
    older = [path for index, path in trial_checkpoints(fs, parent)
             if match is not None and index < int(match.group(1))]
    unreadable = []
    for path in older:
        try:
            data, epoch = read_state(fs, path)
        except (OSError, ValueError):
            unreadable.append(path.rpartition("/")[2])
            continue
        also = f" (also unreadable: {', '.join(unreadable)})" if unreadable else ""
        return data, (f"{line}; resuming from the older {_storage_name(fs, path)} (epoch "
                      f"{epoch}){also}")
    also = f" ({', '.join(unreadable)} unreadable too)" if unreadable else ""
    return None, f"{line}; no older readable checkpoint{also}: the trial starts from scratch"


def _trial_storage() -> tuple[Any, str, int]:
    """The trial's storage filesystem, its folder there, and its last checkpoint's index."""
    storage = tune.get_context().get_storage()
    return storage.storage_filesystem, storage.trial_fs_path, storage.current_checkpoint_index


def _kill_in_checkpoint(state: dict[str, Any]) -> None:
    """Fault drill ``kill-in-checkpoint``: leave a torn checkpoint, then SIGKILL this process.

    Writes `state` truncated to half its bytes as ``state.pt`` into the trial's next
    ``checkpoint_<index>`` folder in storage (the folder Tune would persist the next
    checkpoint to), as a copy interrupted by a kill leaves it; Tune never registers it.
    """
    fs, trial, index = _trial_storage()
    with tempfile.TemporaryDirectory() as d:  # the bytes the complete checkpoint would hold
        torch.save(state, Path(d) / _CKPT_FILE)
        data = (Path(d) / _CKPT_FILE).read_bytes()
    folder = f"{trial}/checkpoint_{index + 1:06d}"
    fs.create_dir(folder)
    with fs.open_output_stream(f"{folder}/{_CKPT_FILE}") as stream:
        stream.write(data[: len(data) // 2])
    logging.getLogger(__name__).warning("fault drill: torn checkpoint %s written; killing this "
                                        "worker", _storage_name(fs, f"{folder}/{_CKPT_FILE}"))
    os.kill(os.getpid(), signal.SIGKILL)


def _truncate_newest_checkpoint() -> str:
    """Fault drill ``corrupt-checkpoint``: cut the newest checkpoint's ``state.pt`` in half.

    Returns:
        The file's path in the storage, or ``"no checkpoint"`` when the trial has none yet.
    """
    fs, trial, index = _trial_storage()
    if index < 0:
        return "no checkpoint"
    path = f"{trial}/checkpoint_{index:06d}/{_CKPT_FILE}"
    with fs.open_input_stream(path) as stream:
        data = stream.read()
    with fs.open_output_stream(path) as stream:
        stream.write(data[: len(data) // 2])
    return _storage_name(fs, path)


def _tune_report(metrics: dict[str, Any], files: Path | dict[str, bytes] | None) -> None:
    """``tune.report(metrics)``, with a checkpoint of the folder or the files when given."""
    if files is None:
        tune.report(metrics)
    elif isinstance(files, Path):
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(files))
    else:
        with tempfile.TemporaryDirectory() as d:
            for name, content in files.items():
                (Path(d) / name).write_bytes(content)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))


def _final_report(result: Any, cfg: RunConfig, test: Any, last_state: dict[str, Any],
                  options: dict[str, Any], out: Path) -> dict[str, Any]:
    """The last report's metrics; writes state.pt, the diagram and the task's files to `out`.

    The task's files: :meth:`raysearch.training.tasks.Task.write_artifacts`.
    """
    task = task_for(result.task)
    final = {
        "epoch": cfg.epochs,
        **result.metrics,
        COMPLETED: True,
        RELIABILITY: _bins_record(task.test_bins(result, cfg.ece_bins)),
    }
    torch.save(last_state, out / _CKPT_FILE)
    if options.get("log_weights") and "model" in last_state:  # the run keeps them too
        torch.save(last_state["model"], out / WEIGHTS_FILE)
    _draw_reliability(final, out / RELIABILITY_PLOT, options.get("trial_id", "trial"))
    final.update(task.write_artifacts(result, cfg, options, out, test))
    return final


def _bins_record(bins: Any) -> dict[str, list]:
    """Reliability bins as JSON-ready lists (the last report's :data:`RELIABILITY`)."""
    return {
        "edges": [float(e) for e in bins.edges],
        "counts": [int(c) for c in bins.counts],
        "accuracy": _nan_to_none(float(a) for a in bins.accuracy),
        "confidence": _nan_to_none(float(c) for c in bins.confidence),
    }


def _draw_reliability(final: dict[str, Any], path: Path, trial_id: str) -> None:
    """Draw the final report's test reliability diagram (a trial's CPU, not the driver's)."""
    from raysearch.training.reliability_plot import reliability_diagram
    bins = final[RELIABILITY]
    title = f"{trial_id}  test ECE {100 * final.get('test_ece', float('nan')):.2f}%"
    try:
        reliability_diagram(bins["edges"], bins["counts"], bins["accuracy"], bins["confidence"],
                            path, title=title)
    except Exception as exc:  # noqa: BLE001 (a plot must never fail the trial)
        logging.getLogger(__name__).warning("reliability diagram not drawn: %s", exc)


class _Relay:
    """Carries rank 0's reports to the coordinating Tune function and Tune's answers back.

    A threaded Ray actor (``max_concurrency`` > 1): :meth:`report` blocks rank 0 until the
    coordinator has passed the report to Tune and answered whether to go on.

    It is also the Train run's watchdog: it is detached, watches the `coordinator` actor and,
    should the coordinator die (Tune kills the actor of a trial it stopped while the run was
    still ending), removes the workers' placement group (:meth:`hold`) and exits. Ray Train's
    own cleaner does the same through Ray's state API, which needs the dashboard.
    """

    def __init__(self, coordinator: Any = None) -> None:
        self._reports: queue.Queue = queue.Queue()
        self._answers: queue.Queue = queue.Queue()
        self._group: Any = None
        if coordinator is not None:
            threading.Thread(target=self._watch, args=(coordinator,), name="raysearch-watch",
                             daemon=True).start()

    def hold(self, group: Any) -> None:
        """Rank 0: the workers' placement group, removed should the coordinator die."""
        self._group = group

    def _watch(self, coordinator: Any) -> None:
        while True:
            try:
                ray.get(coordinator.__ray_ready__.remote())
            except ray.exceptions.ActorUnavailableError:
                pass  # (transient: retried)
            except ray.exceptions.RayActorError:
                break
            time.sleep(1.0)
        if self._group is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self._group)
        ray.kill(ray.get_runtime_context().current_actor)

    def report(self, metrics: dict[str, Any], files: dict[str, bytes] | None,
               last: bool = False) -> bool:
        """Rank 0: hand over one report; returns False when Tune stopped the trial.

        The `last` report (final or diverged) is not answered: rank 0 returns at once.
        """
        self._reports.put((metrics, files, last))
        return True if last else bool(self._answers.get())

    def next_report(self, timeout: float) -> tuple[dict[str, Any], Any, bool] | None:
        """Coordinator: the next ``(metrics, files, last)``, or None after `timeout` seconds."""
        try:
            return self._reports.get(timeout=timeout) if timeout > 0 else \
                self._reports.get_nowait()
        except queue.Empty:
            return None

    def answer(self, go_on: bool) -> None:
        """Coordinator: go on (True) or stop (False) after the last report."""
        self._answers.put(go_on)


def _run_ddp(cfg: RunConfig, resume_bytes: bytes | None, options: dict[str, Any], *,
             workers: int, cpus_per_worker: float, gpus_per_worker: float) -> None:
    """Coordinate one DDP trial: a TorchTrainer in a thread, its reports relayed to Tune."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    use_gpu = gpus_per_worker > 0
    per_worker = {"CPU": cpus_per_worker}
    if use_gpu:
        per_worker["GPU"] = gpus_per_worker
    try:
        coordinator = ray.get_runtime_context().current_actor
    except RuntimeError:  # not in an actor: nobody to watch
        coordinator = None
    relay_cls = ray.remote(num_cpus=0, max_concurrency=4)(_Relay)
    # outside the trial's placement group (which captures child actors): Tune removes that
    # group, killing what runs in it, when it stops the trial
    relay = relay_cls.options(lifetime="detached",
                              scheduling_strategy="DEFAULT").remote(coordinator)
    context = tune.get_context()
    storage = Path(context.get_trial_dir() or tempfile.gettempdir())
    trainer = TorchTrainer(
        _ddp_worker,
        train_loop_config={"cfg": cfg, "resume": resume_bytes, "options": options,
                           "relay": relay, "use_gpu": use_gpu,
                           "cpus_per_worker": cpus_per_worker},
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=use_gpu,
                                               resources_per_worker=per_worker),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=f"ddp-{context.get_trial_id() or 'trial'}-{uuid.uuid4().hex[:8]}",
            storage_path=str(storage.resolve()),
            failure_config=ray.train.FailureConfig(max_failures=0)),
    )
    outcome: dict[str, BaseException] = {}

    def train() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # noqa: BLE001 (re-raised in the trial function)
            outcome["error"] = exc

    thread = threading.Thread(target=train, name="raysearch-ddp-trainer", daemon=True)
    thread.start()
    try:
        while True:
            alive = thread.is_alive()  # (read first: a last report may come just before the end)
            item = ray.get(relay.next_report.remote(0.5 if alive else 0.0))
            if item is None:
                if alive:
                    continue
                break
            metrics, files, last = item
            if last:
                # the final (or diverged) report goes to Tune once the Train run has ended and
                # released its workers: Tune stops a trial at its last result (ASHA at max_t)
                thread.join()
                if "error" in outcome:
                    break
                _tune_report(metrics, files)
                return
            _tune_report(metrics, files)  # raises SystemExit when Tune stops the trial
            relay.answer.remote(True)
    except BaseException:
        # Tune stopped the trial at an epoch (SystemExit from tune.report): every rank leaves
        # fit() at this epoch boundary and the Train run ends by itself. Wait for that only
        # briefly: Tune reuses this actor only if this function returns within
        # TUNE_FUNCTION_THREAD_TIMEOUT_S (2 s), and a failed reuse errors the next trial. If
        # Tune kills this actor before the run ended, the relay frees the workers.
        with contextlib.suppress(Exception):  # (the relay itself may be what failed)
            ray.get(relay.answer.remote(False))
        thread.join(timeout=_STOP_WAIT_S)
        raise
    finally:
        if thread.is_alive():  # end the watchdog once the run has ended in the background
            threading.Thread(target=_kill_after, args=(thread, relay), daemon=True).start()
        else:
            ray.kill(relay)
    if "error" in outcome:
        raise outcome["error"]
    raise RuntimeError("the DDP Train run ended without a final report from rank 0")


def _kill_after(thread: threading.Thread, relay: Any) -> None:
    thread.join()
    ray.kill(relay)


def _ddp_worker(loop: dict[str, Any]) -> None:
    """Per-worker function of a DDP trial: fit() in DDP mode, rank 0 reports via the relay."""
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device() if loop["use_gpu"] else torch.device("cpu")
    cpus = loop["cpus_per_worker"]
    torch.set_num_threads(1 if device.type == "cuda" else max(int(cpus), 1))
    relay = loop["relay"]
    node = ray.get_runtime_context().get_node_id()
    group = ray.util.get_current_placement_group()
    if rank == 0 and group is not None:
        ray.get(relay.hold.remote(group))

    def send(metrics: dict[str, Any], folder: Path | None = None, last: bool = False) -> bool:
        # the checkpoint travels as bytes: rank 0 may be on another node than the coordinator
        files = None
        if folder is not None:
            files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        return ray.get(relay.report.remote({**metrics, NODE_ID: node}, files, last))

    def agree(go_on: bool) -> bool:
        flag = torch.tensor([int(go_on)], device=device if device.type == "cuda" else "cpu")
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    _train_and_report(loop["cfg"], loop["resume"], loop["options"], send=send, device=device,
                      num_workers=loader_workers(cpus), rank=rank, agree=agree)


def trial_env() -> dict[str, str]:
    """Environment variables every trial worker needs (set through Ray's runtime env)."""
    return {
        # keep the driver's working directory: relative paths stay meaningful in trials
        "RAY_CHDIR_TO_TRIAL_DIR": "0",
        # a DDP trial's Train controller notices its workers ended (a stop) within 0.5 s, not 2
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
        "OMP_NUM_THREADS": os.environ.get("RAYSEARCH_TRIAL_THREADS", "1"),
    }
