"""A sweep's trial: one searcher suggestion trained as one run and reported to Tune.

:func:`tune_trial` is the Tune function trainable of every sweep: it turns the searcher's
suggestion into the trial's :class:`~raysearch.config.RunConfig` (through the sweep's
:class:`~raysearch.tune.spaces.TrialConfigs`, the one place a suggestion changes form) and
learns its attempt from Tune (:class:`~raysearch.tune.trial_options.TrialContext`), then
:func:`run_trial` trains it with the sweep's
:class:`~raysearch.tune.trial_options.TrialOptions`. A trial reports validation metrics with
its checkpoints, adds the test metrics and the test reliability bins to its last report, and
says ``completed = True`` there when it ran all its epochs; a trial stopped early by a scheduler
never does, which is how the searcher and the selection rule tell finished trials from partial
ones (:mod:`raysearch.tune.trial_reports`). Every report carries ``node_id``, the Ray node that
trained. With ``workers > 1`` the trial is a data-parallel Ray Train run
(:mod:`raysearch.tune.ddp`); checkpoints are read and written by
:mod:`raysearch.tune.checkpoints`, fault drills live in :mod:`raysearch.tune.drills`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from raysearch.config import RunConfig
from raysearch.training.records import NODE_ID
from raysearch.tune.checkpoints import report, resume_state
from raysearch.tune.ddp import run_ddp
from raysearch.tune.trial_options import (
    TrialContext,
    TrialOptions,
    check_workers,
    loader_workers,
)
from raysearch.tune.trial_reports import TrialReports

__all__ = ["COORDINATOR_MEMORY", "run_trial", "trial_context", "trial_device", "trial_env",
           "trial_resources", "tune_trial"]

#: Logical memory (bytes) that the coordinating function of a DDP trial reserves: Tune needs a
#: non-empty resource bundle, and CPUs or GPUs held there could not go to the Train workers.
COORDINATOR_MEMORY = 2**20


def trial_device() -> torch.device:
    """``cuda`` when this process sees a GPU, else ``cpu``.

    Ray sets ``CUDA_VISIBLE_DEVICES`` to the trial's share; a trial that asked for none sees none.
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def trial_resources(*, cpus_per_trial: float, gpus_per_trial: float, workers: int,
                    cpus_per_worker: float, gpus_per_worker: float) -> dict[str, float]:
    """What a trial of :func:`tune_trial` asks Tune for (``tune.with_resources``).

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
    check_workers(workers, cpus_per_worker, gpus_per_worker)
    if not cpus_per_trial > 0 or not gpus_per_trial >= 0:
        raise ValueError(f"`cpus_per_trial` must be > 0 and `gpus_per_trial` >= 0, got "
                         f"{cpus_per_trial} and {gpus_per_trial}")
    if workers > 1:
        return {"cpu": 0.0, "memory": COORDINATOR_MEMORY}
    resources = {"cpu": cpus_per_trial}
    if gpus_per_trial:
        resources["gpu"] = gpus_per_trial
    return resources


def trial_context() -> TrialContext:
    """This attempt's :class:`TrialContext`, from Tune (inside a trial).

    When Tune gives the attempt a checkpoint whose ``state.pt`` cannot be read, the attempt
    resumes from the trial's newest readable older checkpoint, or from scratch when none is
    (:func:`raysearch.tune.checkpoints.resume_state`); the line that says so is logged as a
    warning and travels in the attempt's first report.
    """
    resume, skipped = None, None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        resume, skipped = resume_state(checkpoint)
        if skipped is not None:
            logging.getLogger(__name__).warning(skipped)
    return TrialContext(trial_id=tune.get_context().get_trial_id() or "trial", resume=resume,
                        skipped=skipped, first_attempt=checkpoint is None)


def tune_trial(config: dict[str, Any], *, configs: Any, options: TrialOptions) -> None:
    """The Tune function trainable of a sweep: one suggestion, one training run.

    Args:
        config: the searcher's suggestion (sampled and fixed values under the space's names).
        configs: the sweep's :class:`~raysearch.tune.spaces.TrialConfigs` (the space and
            the settings' sections): ``configs.resolve(config)`` is the trial's run config.
        options: the sweep's :class:`TrialOptions`.
    """
    run_trial(configs.resolve(config), options, trial_context())


def run_trial(cfg: RunConfig, options: TrialOptions, context: TrialContext) -> None:
    """Train `cfg` in this Tune trial and report to Tune (see the module docstring).

    The trial trains on the GPU Ray gave it (:func:`trial_device`), else on the CPU with
    ``cpus_per_trial`` torch threads; with ``options.workers > 1`` this function only
    coordinates a DDP Train run (:func:`raysearch.tune.ddp.run_ddp`).

    **Checkpoints and retries**: when Tune retries a failed trial or resumes a sweep, the
    attempt's `context` holds the last readable checkpoint and training continues at the next
    epoch with the same batches as an uninterrupted run (the batch order is seeded per epoch);
    its reports carry ``resumed_from_epoch``.

    A training loss that becomes NaN/inf ends the trial with a last report holding
    ``diverged`` (the message): the tracking callback records it FAILED and the searcher tells
    Optuna FAIL. Any other exception propagates (Tune marks the trial ERROR); a batch that
    does not fit in the GPU's memory is one of them:
    :class:`~raysearch.training.run.OutOfMemoryRunError`, whose one line (batch size, device,
    epoch) becomes the trial's ``raysearch.error`` tag. The trial is not retried with a smaller
    batch (that would change its configuration); the other trials go on.

    Args:
        cfg: the trial's run config.
        options: the sweep's trial options.
        context: this attempt (:func:`trial_context`).

    Raises:
        raysearch.tune.drills.InjectedFault: at a fault drill's epoch (Tune retries).
        Exception: what training raised besides a divergence.
    """
    if options.workers > 1:
        torch.set_num_threads(1)  # this process only coordinates
        run_ddp(cfg, options, context)
        return
    device = trial_device()
    torch.set_num_threads(1 if device.type == "cuda" else max(int(options.cpus_per_trial), 1))
    node = ray.get_runtime_context().get_node_id()

    def send(metrics: dict[str, Any], files: Path | None = None, last: bool = False) -> bool:
        report({**metrics, NODE_ID: node}, files)
        return True

    TrialReports(cfg, options, context, send).run(device, loader_workers(options.cpus_per_trial))


def trial_env() -> dict[str, str]:
    """Environment variables every trial worker needs (set through Ray's runtime env)."""
    return {
        # keep the driver's working directory: relative paths stay meaningful in trials
        "RAY_CHDIR_TO_TRIAL_DIR": "0",
        # a DDP trial's Train controller notices its workers ended (a stop) within 0.5 s, not 2
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
        "OMP_NUM_THREADS": os.environ.get("RAYSEARCH_TRIAL_THREADS", "1"),
    }
