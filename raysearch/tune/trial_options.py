"""What a sweep's trial is told besides its run config: its options and its attempt's context.

:class:`TrialOptions` are the same for every trial of a sweep (post-hoc calibrators, checkpoint
and report cadence, precision, resources, fault drill, the user's metrics and code);
:class:`TrialContext` is what one attempt of one trial learns from Tune (its id, the checkpoint
it resumes from). Both are frozen dataclasses that travel to the trial's process (and to every
worker of a DDP trial) by pickling. Plain Python: no Ray import.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from raysearch.tune.settings import FAULT_KINDS, PRECISIONS

__all__ = ["CHECKPOINT_INTERVAL_S", "REPORT_INTERVAL_S", "TrialContext", "TrialOptions",
           "check_workers", "loader_workers"]

#: Default checkpoint cadence (``checkpoint_every=None``): a checkpoint once this many seconds
#: of training passed since the last one. A retried trial loses at most that much work, and a
#: checkpoint (a state dict written, persisted to the storage path, and Tune's experiment
#: snapshot it forces) costs well under 1% of it.
CHECKPOINT_INTERVAL_S = 60.0
#: Without a scheduler a trial reports after its checkpoints, its last epoch, and otherwise at
#: most every this many seconds (progress lines and live MLflow curves); each report carries
#: the epochs since the previous one. A report blocks the trial until the driver has taken it,
#: which costs a 2-s trial on a busy 2-core machine a noticeable share.
REPORT_INTERVAL_S = 10.0


@dataclass(frozen=True)
class TrialOptions:
    """How every trial of a sweep trains and reports, besides its run config.

    Attributes:
        posthoc: calibrator names (:func:`raysearch.calibration.fit_calibrator`) fitted on the
            validation logits after the last epoch and measured on the test logits
            (``test_ece_ts``, ...); ``val_ece_ts`` etc. come from a calibrator fitted on one
            stratified half of the validation set and measured on the other half. May be
            empty.
        checkpoint_every: attach a checkpoint (model, optimizer, scheduler) to every n-th
            epoch's report; 0 checkpoints the last epoch only; None checkpoints an epoch once
            `checkpoint_seconds` of training passed since the last checkpoint (or the
            attempt's start). The last epoch always has one.
        checkpoint_seconds: the time-based cadence of ``checkpoint_every=None``, in seconds.
        report_every_epoch: report every epoch (what a scheduler such as ASHA needs to compare
            rungs). False: report the epochs that carry a checkpoint, the last one and
            otherwise at most every `report_seconds`, each report holding the unreported
            epochs before it.
        report_seconds: the longest time between two reports without a scheduler, in seconds.
        precision: ``auto``, ``bf16`` or ``fp32`` (:func:`raysearch.training.run.fit`).
        cpus_per_trial: CPUs Ray reserved for a one-process trial: torch threads on the CPU and
            DataLoader workers for file-backed datasets.
        workers: Ray Train workers; 1 trains in the trial's process, more run a DDP trial
            (:mod:`raysearch.tune.ddp`).
        cpus_per_worker: CPUs of each DDP worker (> 0).
        gpus_per_worker: GPUs of each DDP worker (0: gloo on the CPU; a whole number: NCCL).
        shift_set: a :class:`raysearch.metrics.shift.ShiftSet` built by the driver: after
            training the model is evaluated on it, before and after the first calibrator of
            `posthoc` (``shift_*`` metrics, ``shift.csv`` and ``shift.png``); None: none.
        fault_epoch: a fault drill (:mod:`raysearch.tune.drills`): the first attempt fails at
            this epoch; None: never.
        fault_kind: what the drill does (:data:`~raysearch.tune.settings.FAULT_KINDS`).
        log_weights: also write the final weights (the model's state dict) as ``weights.pt``
            into the last checkpoint, which the tracking callback attaches to the trial's run.
        metrics: the user's metric functions by import string (or Python-API label): logged
            as ``val_<fn>`` every epoch and ``test_<fn>`` at the end.
        code_paths: folders of the user's code, put first on the worker's ``sys.path`` before
            any name is resolved: the worker imports ``package.module:attr`` as the driver did.
        components: the Python API's objects (cloudpickled ``{kind: {label: object}}``),
            unpickled after `code_paths` are on the path; None: none.

    Raises:
        ValueError: (on construction) for an unknown `precision` or `fault_kind`, a
            `fault_kind` other than ``raise`` in a DDP trial, `workers` < 1, `cpus_per_worker`
            not > 0, a negative `gpus_per_worker`, or a fractional one in a DDP trial (NCCL
            ranks cannot share a GPU).
    """

    posthoc: tuple[str, ...] = ("ts",)
    checkpoint_every: int | None = None
    checkpoint_seconds: float = CHECKPOINT_INTERVAL_S
    report_every_epoch: bool = False
    report_seconds: float = REPORT_INTERVAL_S
    precision: str = "auto"
    cpus_per_trial: float = 1.0
    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    shift_set: Any = None
    fault_epoch: int | None = None
    fault_kind: str = "raise"
    log_weights: bool = False
    metrics: tuple[str, ...] = ()
    code_paths: tuple[str, ...] = ()
    components: bytes | None = None

    def __post_init__(self) -> None:
        check_workers(self.workers, self.cpus_per_worker, self.gpus_per_worker)
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose from "
                             f"{', '.join(PRECISIONS)}")
        if self.fault_kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault_kind {self.fault_kind!r}; choose from "
                             f"{', '.join(FAULT_KINDS)}")
        if self.fault_kind != "raise" and self.workers > 1:
            raise ValueError(f"fault_kind {self.fault_kind!r} needs a one-process trial "
                             f"(workers 1), got workers {self.workers}")

    def replace(self, **changes: Any) -> TrialOptions:
        """A copy with `changes` (checked again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class TrialContext:
    """What one attempt of a trial knows of itself (from Tune, or given by a test).

    Attributes:
        trial_id: Tune's id of the trial (the title of its reliability diagram).
        resume: the ``state.pt`` bytes the attempt resumes from (None: from scratch).
        skipped: one line naming an unreadable checkpoint that was skipped, reported with the
            attempt's first report (None: none was).
        first_attempt: True when Tune gave the attempt no checkpoint; a fault drill fires in
            the first attempt only (a retry that found no readable checkpoint starts from
            scratch, but does not drill again).
    """

    trial_id: str = "trial"
    resume: bytes | None = None
    skipped: str | None = None
    first_attempt: bool = True


def check_workers(workers: int, cpus_per_worker: float, gpus_per_worker: float) -> None:
    """Raise ValueError when a trial's worker counts cannot run (see :class:`TrialOptions`)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"`workers` must be an int >= 1, got {workers!r}")
    if not cpus_per_worker > 0 or not gpus_per_worker >= 0:
        raise ValueError(f"`cpus_per_worker` must be > 0 and `gpus_per_worker` >= 0, got "
                         f"{cpus_per_worker} and {gpus_per_worker}")
    if workers > 1 and gpus_per_worker and (gpus_per_worker < 1 or gpus_per_worker % 1):
        raise ValueError(f"`gpus_per_worker` must be 0 or a whole number of GPUs in a DDP trial "
                         f"(NCCL ranks cannot share a GPU), got {gpus_per_worker}")


def loader_workers(cpus: float) -> int:
    """DataLoader workers of a training process with `cpus` CPUs (0 for one CPU or less).

    One CPU runs the training loop, the rest load image files.
    """
    return max(int(math.floor(cpus)) - 1, 0)
