"""What a trial reports and when: epochs, checkpoints, the final report, a divergence.

:class:`TrialReports` trains one run config with :func:`raysearch.training.run.fit` and makes
the trial's reports through ``send(metrics, folder, last) -> go_on``: per-epoch metrics at the
cadence of the :class:`~raysearch.tune.trial_options.TrialOptions` (the unreported epochs
travel in the next report under :data:`EPOCH_HISTORY`), checkpoints (``state.pt`` in the
folder), the final report (test metrics, reliability bins and diagram, post-hoc calibrators,
the task's files), and a last report naming a divergence. A one-process trial's `send` calls
``tune.report``; in a DDP trial every worker trains and only rank 0 sends
(:mod:`raysearch.tune.ddp`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from raysearch.config import RunConfig
from raysearch.training.records import (
    CHECKPOINT_SKIPPED,
    COMPLETED,
    DIVERGED,
    EPOCH_HISTORY,
    RELIABILITY,
    RELIABILITY_PLOT,
    RESUMED_FROM,
    WEIGHTS_FILE,
)
from raysearch.training.registries import metric_functions
from raysearch.training.run import DivergedError, fit, load_run_data
from raysearch.training.tasks import task_for
from raysearch.tune.checkpoints import STATE_FILE, load_state
from raysearch.tune.drills import InjectedFault, kill_in_checkpoint, truncate_newest_checkpoint
from raysearch.tune.trial_options import TrialContext, TrialOptions

__all__ = ["Send", "StopTrial", "TrialReports", "user_components"]

#: ``send(metrics, folder, last) -> go_on``: one report; `folder` (or None) holds the
#: checkpoint's files during the call, `last` marks the final or diverged report; False:
#: Tune stopped the trial.
Send = Callable[..., bool]


class StopTrial(Exception):  # noqa: N818 (control flow, not an error)
    """Tune stopped a DDP trial: every rank leaves fit() at the same epoch boundary."""


def user_components(code_paths: tuple[str, ...] = (),
                    components: bytes | None = None) -> dict[str, dict[str, Any]]:
    """Put the user's code folders on ``sys.path``, then unpickle the API's objects.

    Args:
        code_paths: folders to put first on ``sys.path`` (missing ones are skipped).
        components: cloudpickled ``{kind: {label: object}}``, or None.

    Returns:
        ``{kind: {label: object}}`` (empty without `components`).
    """
    for path in reversed(code_paths):
        if path not in sys.path and Path(path).is_dir():
            sys.path.insert(0, path)
    if not components:
        return {}
    import cloudpickle

    return cloudpickle.loads(components)


class TrialReports:
    """Train one run config and make the trial's reports (see the module docstring).

    Args:
        cfg: the trial's run config.
        options: the sweep's trial options.
        context: the attempt (its checkpoint to resume from, a skipped checkpoint's line).
        send: makes one report (:data:`Send`).
        rank: the DDP rank of this process (0 in a one-process trial); only rank 0 sends.
        agree: DDP only: ``agree(go_on) -> go_on`` broadcasts rank 0's answer so that every
            rank stops at the same epoch.
    """

    def __init__(self, cfg: RunConfig, options: TrialOptions, context: TrialContext,
                 send: Send, *, rank: int = 0, agree: Callable[[bool], bool] | None = None
                 ) -> None:
        self.cfg, self.options, self.context = cfg, options, context
        self.rank, self.agree = rank, agree
        self._send = send
        self.resume = load_state(context.resume) if context.resume is not None else None
        self._extra = {} if self.resume is None else {RESUMED_FROM: int(self.resume["epoch"])}
        # the line of a skipped unreadable checkpoint travels in the attempt's first report
        self._skipped = [context.skipped] if context.skipped else []
        self._last_state: dict[str, Any] = {}
        self._pending: list[dict[str, Any]] = []  # epochs trained since the last report
        self._due: set[int] = set()  # rank 0: epochs whose checkpoint wants_state found due
        now = time.monotonic()
        self._clock = {"checkpoint": now, "report": now}

    # -- sending ---------------------------------------------------------------------------
    def send(self, metrics: dict[str, Any], folder: Path | None = None,
             last: bool = False) -> bool:
        """One report, with the attempt's resume epoch and its first report's skipped line."""
        first = {CHECKPOINT_SKIPPED: self._skipped.pop()} if self._skipped else {}
        return self._send({**metrics, **self._extra, **first}, folder, last)

    def _with_history(self, metrics: dict[str, Any]) -> dict[str, Any]:
        if self._pending:
            metrics = {**metrics, EPOCH_HISTORY: list(self._pending)}
            self._pending.clear()
        return metrics

    # -- cadence ---------------------------------------------------------------------------
    def _checkpoint_due(self, epoch: int, now: float) -> bool:
        every = self.options.checkpoint_every
        if every is None:
            return now - self._clock["checkpoint"] >= self.options.checkpoint_seconds
        return bool(every) and epoch % every == 0

    def _is_drill(self, epoch: int) -> bool:
        return epoch == self.options.fault_epoch and self.context.first_attempt

    def wants_state(self, epoch: int) -> bool:
        """Whether :meth:`on_epoch` needs the epoch's state: fit deep-copies it only then."""
        if epoch == self.cfg.epochs:
            return True
        if self._is_drill(epoch) and self.options.fault_kind == "kill-in-checkpoint":
            return True
        if self.rank == 0 and self._checkpoint_due(epoch, time.monotonic()):
            self._due.add(epoch)
            return True
        return False

    def on_epoch(self, epoch: int, metrics: dict[str, float], state: dict | None) -> None:
        """After each epoch: report (with a checkpoint) when due, run a drill when due.

        Raises:
            StopTrial: in DDP, when Tune stopped the trial.
            InjectedFault: at a fault drill's epoch.
        """
        if epoch == self.cfg.epochs:
            self._last_state.update(state)  # reported by run(), together with the test metrics
            return
        drill = self._is_drill(epoch)
        if drill and self.options.fault_kind == "kill-in-checkpoint":
            kill_in_checkpoint(state)  # never returns
        go_on = self._report_epoch(epoch, metrics, state, drill) if self.rank == 0 else True
        if self.agree is not None and not self.agree(go_on):
            raise StopTrial
        if drill:
            torn = ""
            if self.options.fault_kind == "corrupt-checkpoint":
                torn = f" and truncated {truncate_newest_checkpoint()}"
            raise InjectedFault(f"fault drill: first attempt stopped after epoch {epoch}{torn}")

    def _report_epoch(self, epoch: int, metrics: dict[str, float], state: dict | None,
                      drill: bool) -> bool:
        """Rank 0: report the epoch now (with its checkpoint) or keep it for the next one."""
        now = time.monotonic()
        checkpoint = epoch in self._due  # decided as fit copied the state (wants_state)
        self._due.discard(epoch)
        entry = {"epoch": epoch, **metrics}
        if not (checkpoint or drill or self.options.report_every_epoch
                or now - self._clock["report"] >= self.options.report_seconds):
            self._pending.append(entry)
            return True
        self._clock["report"] = now
        if not checkpoint:
            return self.send(self._with_history(entry), None)
        self._clock["checkpoint"] = now
        with tempfile.TemporaryDirectory() as d:
            torch.save(state, Path(d) / STATE_FILE)
            return self.send(self._with_history(entry), Path(d))

    # -- the run ---------------------------------------------------------------------------
    def run(self, device: torch.device, num_workers: int) -> None:
        """Train, report every epoch as due, and make the final (or the diverged) report.

        Raises:
            InjectedFault: at a fault drill's epoch.
            Exception: whatever training raised besides a divergence (the epochs trained
                before it are reported first, in a one-process trial).
        """
        options = self.options
        try:
            components = user_components(options.code_paths, options.components)
            metric_fns = metric_functions(options.metrics, components)
            data = load_run_data(self.cfg, components=components)
            result = fit(self.cfg, on_epoch=self.on_epoch, epoch_states=self.wants_state,
                         resume=self.resume, device=device, precision=options.precision,
                         num_workers=num_workers, data=data, distributed=self.agree is not None,
                         components=components, metrics=metric_fns)
        except StopTrial:
            return
        except DivergedError as exc:
            # reported, not raised: the trial ends FAILED in MLflow and Optuna, and its worker
            # process stays alive for the next trial (reuse_actors) instead of being replaced
            # (in DDP every rank raises it at the same batch: the check is all-reduced)
            if self.rank == 0:
                self.send(self._with_history({DIVERGED: str(exc), COMPLETED: False}), None, True)
            return
        except InjectedFault:
            raise
        except Exception:
            # the epochs trained before the error still reach MLflow (one process: a DDP rank
            # that raised has no Train run left to report through)
            if self.rank == 0 and self._pending and self.agree is None:
                with contextlib.suppress(BaseException):
                    self.send(self._with_history(self._pending.pop()), None)
            raise
        if self.rank != 0:
            return
        with tempfile.TemporaryDirectory() as d:
            final = self._final_report(result, data.test, Path(d), metric_fns)
            self.send(self._with_history(final), Path(d), True)

    def _final_report(self, result: Any, test: Any, out: Path,
                      metric_fns: Any = None) -> dict[str, Any]:
        """The last report's metrics; writes state.pt, the diagram and the task's files to `out`.

        The task's files: :meth:`raysearch.training.tasks.Task.write_artifacts`.
        """
        task = task_for(result.task)
        final = {
            "epoch": self.cfg.epochs,
            **result.metrics,
            COMPLETED: True,
            RELIABILITY: _bins_record(task.test_bins(result, self.cfg.ece_bins)),
        }
        torch.save(self._last_state, out / STATE_FILE)
        if self.options.log_weights and "model" in self._last_state:  # the run keeps them too
            torch.save(self._last_state["model"], out / WEIGHTS_FILE)
        _draw_reliability(final, out / RELIABILITY_PLOT, self.context.trial_id)
        final.update(task.write_artifacts(
            result, self.cfg, out, test, posthoc=self.options.posthoc,
            shift_set=self.options.shift_set, title=self.context.trial_id,
            metric_fns=metric_fns))
        return final


def _nan_to_none(values: Any) -> list[Any]:
    return [None if (isinstance(v, float) and math.isnan(v)) else v for v in values]


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
