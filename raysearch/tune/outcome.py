"""How a sweep ended for its trials: the failed ones, and the error when none completed.

:func:`failed_trials` reads a sweep's failed trial runs from its MLflow store as
:class:`FailedTrial` records (:attr:`raysearch.tune.engine.SweepResult.failed`);
:class:`NoTrialCompletedError` is what :func:`raysearch.sweep` raises when a sweep ran but none
of its trials completed. The exit codes of ``raysearch sweep`` that say the same are in
:mod:`raysearch.cli.base`.

Imports :mod:`raysearch.tracking` (tag names, the sweep's runs, the one-line summary); no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raysearch import tracking
from raysearch.tracking.reports import failure_line

__all__ = ["FAILED_OUTCOMES", "FailedTrial", "NoTrialCompletedError", "failed_trials"]

#: The outcomes (tag ``raysearch.outcome``) of a trial that failed: it raised (after its
#: retries) or its loss became NaN/inf. ``stopped_early`` (a scheduler's choice) and
#: ``interrupted`` (Ctrl-C) are not failures.
FAILED_OUTCOMES = ("error", "diverged")


@dataclass(frozen=True)
class FailedTrial:
    """One trial of a sweep that failed.

    Attributes:
        trial: its child run's name (``<sweep>-<NNN>-<method>``; a seed run's name, ending in
            ``-seed<k>``, in a sweep with ``repeats`` > 1).
        run_id: its MLflow run id.
        outcome: ``error`` (it raised) or ``diverged`` (its loss became NaN or inf).
        error: the error on one line (``RuntimeError: ...``; for a divergence its message).
    """

    trial: str
    run_id: str
    outcome: str
    error: str


def failed_trials(client: Any, parent_run_id: str, table: Any = None) -> list[FailedTrial]:
    """The failed trial runs of the sweep whose parent run is `parent_run_id`, by name.

    A trial run failed when its outcome is in :data:`FAILED_OUTCOMES`, or when it ended FAILED
    without an outcome (a record lost with the store). Configuration runs of a repeated sweep
    are not trials: their seed runs are.

    Args:
        client: an ``MlflowClient`` of the sweep's store.
        parent_run_id: the sweep's parent run.
        table: the sweep's trials table (``status`` and ``outcome`` columns) when it stands
            for the store (the callback's table of a sweep that just ended): without a failed
            row in it, the store is not asked.

    Returns:
        One :class:`FailedTrial` per failed trial run, sorted by run name. The store is asked
        for those runs only (one search per failed outcome and one for FAILED runs), not for
        every run of the sweep.
    """
    if table is not None and not any(
            _failed(s, o) for s, o in zip(table["status"], table["outcome"].fillna(""),
                                          strict=True)):
        return []
    experiment_id = client.get_run(parent_run_id).info.experiment_id
    runs = {}
    for where in (*(f"tags.`{tracking.OUTCOME_TAG}` = '{o}'" for o in FAILED_OUTCOMES),
                  "attributes.status = 'FAILED'"):
        for run in tracking.sweep_runs(client, experiment_id, parent_run_id, where=where):
            runs[run.info.run_id] = run
    failed = []
    for run in runs.values():
        tags = run.data.tags
        outcome = tags.get(tracking.OUTCOME_TAG, "")
        if not tags.get(tracking.TRIAL_TAG):
            continue
        if _failed(run.info.status, outcome):
            error = " ".join(tags.get(tracking.ERROR_TAG, "").split()) or "unknown error"
            failed.append(FailedTrial(run.info.run_name or run.info.run_id, run.info.run_id,
                                      outcome or "error", error))
    return sorted(failed, key=lambda f: f.trial)


def _failed(status: str, outcome: str) -> bool:
    """Whether a trial run with this status and outcome tag ("": none) failed."""
    return outcome in FAILED_OUTCOMES or (not outcome and status == "FAILED")


class NoTrialCompletedError(RuntimeError):
    """A sweep ran, but none of its trials completed: every one failed (or was stopped early).

    Raised by :func:`raysearch.sweep` after the sweep ended and was recorded: the parent run,
    the trials table and the failed trials' runs exist. A RuntimeError, not a ValueError: the
    input was accepted, running it failed. ``raysearch sweep`` exits with code 4 instead.

    Args:
        result: the sweep's :class:`~raysearch.tune.engine.SweepResult`.

    Attributes:
        result: that SweepResult; ``result.failed`` lists the failed trials with their errors.
    """

    def __init__(self, result: Any) -> None:
        self.result = result
        super().__init__(failure_line(result) or f"sweep {result.name}: no trial completed")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.result,))
