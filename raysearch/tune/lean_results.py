"""What Ray Tune keeps in memory of a trial's reports: the metrics its searcher and scheduler read.

Ray Tune holds every trial of a sweep in the driver until the sweep ends, and with each trial its
last result and, for every numeric key of it, running statistics (max, min, mean, last, the
means of the last 5 and 10 reports) and a cached JSON copy of them: with the ~80 metrics of a
raysearch trial, ~0.2 MiB per trial, 2 GiB over a 10,000-trial sweep. raysearch needs none of
it: every report is in the trial's ``result.json`` (Tune's ``JsonLoggerCallback``, what
:mod:`raysearch.tune.sync` and the end of a sweep read) and in MLflow (the sweep's callback
writes it as it arrives). :class:`LeanResults`, the last of the Tuner's callbacks, trims each
report in place (Tune's callback API allows it) to what Tune itself reads afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ray import tune
from ray.tune.result import CONFIG_PREFIX

from raysearch.tracking.runs import METRIC_PREFIXES
from raysearch.training.records import EPOCH_HISTORY


class LeanResults(tune.Callback):
    """A Tune callback that drops from each report the metrics no searcher or scheduler reads.

    Runs after the callbacks that record the reports (it must come last in
    ``RunConfig.callbacks``): it deletes, in place, the keys that start with
    :data:`~raysearch.tracking.runs.METRIC_PREFIXES` other than `keep`, and
    :data:`~raysearch.training.records.EPOCH_HISTORY` (the epochs a report carries for the
    record), and with ``keep_config=False`` the copy of the trial's config each report carries
    (``config``, ~1.2 KiB a trial in its last result and as much in its checkpoints' results;
    Tune keeps the trial's own, ``Trial.config``, and reads the copy only for its console
    tables and the ``Result.config`` of the ``ResultGrid`` that ``Tuner.fit`` returns, which
    a sweep does not read). Tune's other keys (``training_iteration``, ``time_*``, ...), the
    trial's flags (``completed``, ``diverged``) and the `keep` metrics stay, so the searcher's
    ``on_trial_complete`` and the scheduler see what they use; Tune's statistics then cover
    those few keys only. When a trial ends, the reports Tune keeps with its checkpoints (which
    come from the trial's process, whole) are trimmed the same way; Tune's own keys there
    (``training_iteration``, ``time_total_s``) are what a retried trial restarts its count from.
    And Tune's running statistics of the ended trial (``Trial.metric_analysis``: max, min, mean,
    last and two windows of recent values for each numeric key of its reports, ~1.7 KiB a key)
    are dropped: only ``ExperimentAnalysis.get_best_trial``
    reads them, which a sweep does not use (it selects on MLflow's records); a trial that runs
    again (``--resume`` of a failed one) starts them anew.

    Args:
        keep: the metric names the searcher and the scheduler read (e.g. ``val_ece``,
            ``val_accuracy``).
        keep_config: keep the report's ``config``. Defaults to True.
    """

    def __init__(self, keep: Iterable[str], *, keep_config: bool = True) -> None:
        self.keep = frozenset(keep)
        self.keep_config = keep_config

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,  # noqa: D102
                        **info: Any) -> None:
        for key in [k for k in result if self._drop(k)]:
            del result[key]

    def on_trial_complete(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                          **info: Any) -> None:
        self._trim_ended(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                       **info: Any) -> None:
        self._trim_ended(trial)

    def _trim_ended(self, trial: Any) -> None:
        """Trim what Tune keeps of an ended trial: its statistics, its checkpoints' results."""
        metadata = getattr(trial, "run_metadata", None)
        if metadata is None:
            return
        if isinstance(getattr(metadata, "metric_analysis", None), dict):
            metadata.metric_analysis = {}  # (assigning invalidates the cached JSON)
            metadata.metric_n_steps = {}
        manager = getattr(metadata, "checkpoint_manager", None)
        if manager is None:
            return
        for kept in (manager.latest_checkpoint_result, *manager.best_checkpoint_results):
            metrics = getattr(kept, "metrics", None)
            if isinstance(metrics, dict):
                for key in [k for k in metrics if self._drop(k)]:
                    del metrics[key]
        metadata.invalidate_cache()  # (its cached JSON held them)

    def _drop(self, key: Any) -> bool:
        if not isinstance(key, str) or key in self.keep:
            return False
        if key == CONFIG_PREFIX:
            return not self.keep_config
        return key == EPOCH_HISTORY or key.startswith(METRIC_PREFIXES)


def kept_metrics(metric: str | list[str], scheduler_metric: str | None = None) -> set[str]:
    """The metric names a sweep's searcher (`metric`: one or a list) and scheduler read."""
    names = {metric} if isinstance(metric, str) else set(metric)
    if scheduler_metric:
        names.add(scheduler_metric)
    return names
