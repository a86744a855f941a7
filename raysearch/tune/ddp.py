"""DDP trials: one trial as a data-parallel Ray Train run, its reports relayed to Tune.

With ``workers > 1`` (``--workers-per-trial``) the Tune trial function only coordinates a Ray
Train ``TorchTrainer`` (``ScalingConfig(num_workers=workers, use_gpu=gpus_per_worker > 0,
resources_per_worker={"CPU": cpus_per_worker, "GPU": gpus_per_worker})``, NCCL on GPUs, gloo on
the CPU); its resources are those of :func:`raysearch.tune.trainable.trial_resources`. Every
worker runs :func:`raysearch.training.run.fit` in DDP mode, whose metrics and logits are those
of one worker. Rank 0 makes every report a one-process trial makes
(:class:`~raysearch.tune.trial_reports.TrialReports`); they reach Tune through the
coordinating function (:func:`run_ddp`), which calls ``tune.report`` with a Tune checkpoint
holding the same files, so the results, the MLflow run and the checkpoint look like a
one-process trial's and ``tune.get_checkpoint()`` resumes it (the state is handed to every
worker). Ray Train's ``TuneReportCallback`` is not used: it forwards metrics and only the path
of a Train checkpoint, never a Tune checkpoint. Reporting is synchronous as in a one-process
trial: rank 0 waits until Tune took each report, and when Tune stops the trial (a scheduler)
every rank leaves at that epoch boundary (:class:`Relay`).
"""

from __future__ import annotations

import contextlib
import queue
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
from raysearch.training.records import NODE_ID
from raysearch.tune.checkpoints import report
from raysearch.tune.trial_options import TrialContext, TrialOptions, loader_workers
from raysearch.tune.trial_reports import TrialReports

__all__ = ["Relay", "run_ddp"]

#: Seconds a stopped DDP trial waits for its Train run to end before returning to Tune (the
#: run goes on ending in the background; see :func:`run_ddp`).
_STOP_WAIT_S = 1.5


class Relay:
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


def run_ddp(cfg: RunConfig, options: TrialOptions, context: TrialContext) -> None:
    """Coordinate one DDP trial: a TorchTrainer in a thread, its reports relayed to Tune.

    Raises:
        Exception: what the Train run raised (a worker's error), or RuntimeError when it
            ended without a final report from rank 0.
    """
    relay = _start_relay()
    trainer = _trainer(cfg, options, context, relay)
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
                report(metrics, files)
                return
            report(metrics, files)  # raises SystemExit when Tune stops the trial
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


def _start_relay() -> Any:
    """The trial's :class:`Relay` actor, watching this coordinating actor (if it is one)."""
    try:
        coordinator = ray.get_runtime_context().current_actor
    except RuntimeError:  # not in an actor: nobody to watch
        coordinator = None
    relay_cls = ray.remote(num_cpus=0, max_concurrency=4)(Relay)
    # outside the trial's placement group (which captures child actors): Tune removes that
    # group, killing what runs in it, when it stops the trial
    return relay_cls.options(lifetime="detached",
                             scheduling_strategy="DEFAULT").remote(coordinator)


def _trainer(cfg: RunConfig, options: TrialOptions, context: TrialContext, relay: Any) -> Any:
    """The trial's ``TorchTrainer``: `options.workers` workers running :func:`_ddp_worker`."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    use_gpu = options.gpus_per_worker > 0
    per_worker = {"CPU": options.cpus_per_worker}
    if use_gpu:
        per_worker["GPU"] = options.gpus_per_worker
    tune_context = tune.get_context()
    storage = Path(tune_context.get_trial_dir() or tempfile.gettempdir())
    return TorchTrainer(
        _ddp_worker,
        train_loop_config={"cfg": cfg, "options": options, "context": context, "relay": relay},
        scaling_config=ray.train.ScalingConfig(num_workers=options.workers, use_gpu=use_gpu,
                                               resources_per_worker=per_worker),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=f"ddp-{tune_context.get_trial_id() or 'trial'}-{uuid.uuid4().hex[:8]}",
            storage_path=str(storage.resolve()),
            failure_config=ray.train.FailureConfig(max_failures=0)),
    )


def _kill_after(thread: threading.Thread, relay: Any) -> None:
    thread.join()
    ray.kill(relay)


def _ddp_worker(loop: dict[str, Any]) -> None:
    """Per-worker function of a DDP trial: fit() in DDP mode, rank 0 reports via the relay."""
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    options: TrialOptions = loop["options"]
    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device() if options.gpus_per_worker > 0 else torch.device("cpu")
    cpus = options.cpus_per_worker
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

    TrialReports(loop["cfg"], options, loop["context"], send, rank=rank,
                 agree=agree).run(device, loader_workers(cpus))


