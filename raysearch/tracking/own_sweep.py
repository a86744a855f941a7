"""The sweep's MLflow record for a Ray Tune trainable of the user's own.

:class:`SweepCallback` is :class:`~raysearch.tracking.callback.MlflowSweepCallback` for a
``tune.Tuner`` the user builds: it makes the sweep's parent run itself, names a trial's params
after the search space it was sampled from (or the config's scalar values), and applies the
selection rule when the trials ended.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pandas as pd

from raysearch.tracking.callback import MlflowSweepCallback
from raysearch.tracking.client import ensure_experiment, get_client, log_params
from raysearch.tracking.export import finalize_sweep
from raysearch.tracking.runs import DEFAULT_EXPERIMENT, SWEEP_TAG
from raysearch.tracking.trial_text import short_name, short_value

__all__ = ["SweepCallback", "print_line"]


def print_line(line: str) -> None:  # noqa: T201 (the callback's default progress output)
    """Print one progress line.

    A module's function, not the builtin ``print``: Tune pickles the callback with its
    experiment, and Ray swaps ``builtins.print`` in a process where it runs, so the builtin
    does not pickle there.
    """
    print(line)  # noqa: T201


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
        space: the :class:`~raysearch.tune.spaces.SearchSpace` the trials were sampled from
            (their params are then named as in the space); None: the config's scalar values.
        experiment: MLflow experiment.
        tracking_uri: MLflow tracking URI.
        accuracy: the validation metric of the accuracy axis (maximised).
        ece: the validation metric of the calibration axis (minimised).
        tolerance: accuracy tolerance of the rule (absolute fraction).
        progress: called with one line per finished trial (default: :func:`print_line`, which
            prints it).

    Attributes:
        parent_run_id: the sweep's parent run.
        trials: after the sweep, the trials table (``on_front``, ``selected`` columns).

    Example:
        >>> callback = SweepCallback(space=space)                  # doctest: +SKIP
        >>> tune.Tuner(my_trainable, tune_config=tune.TuneConfig(search_alg=raysearch.searcher(
        ...     space)), run_config=tune.RunConfig(callbacks=[callback])).fit()
    """

    requires_completed = False

    def __init__(self, name: str | None = None, *, space: Any = None,
                 experiment: str = DEFAULT_EXPERIMENT, tracking_uri: str | None = None,
                 accuracy: str = "val_accuracy", ece: str = "val_ece",
                 tolerance: float = 0.01,
                 progress: Callable[[str], None] | None = print_line) -> None:
        client, uri = get_client(tracking_uri)
        experiment_id = ensure_experiment(client, experiment, uri)
        name = name or f"{space.name if space is not None else 'sweep'}-" \
                       f"{time.strftime('%Y%m%d-%H%M%S')}"
        parent = client.create_run(experiment_id, run_name=name,
                                   tags={SWEEP_TAG: name, "raysearch.tune.trainable": "own"})
        log_params(client, parent.info.run_id, {
            "space": space.name if space is not None else "", "tolerance": tolerance,
            "accuracy_metric": accuracy[len("val_"):] if accuracy.startswith("val_")
            else accuracy, "ece_metric": ece[len("val_"):] if ece.startswith("val_") else ece,
            "selection_rule": f"lowest {ece} within {tolerance} of the best {accuracy}"})
        super().__init__(client, experiment_id, parent.info.run_id, name, space,
                         progress=progress)
        self.space = space
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
        method = short_name(str(plain.get("method", "trial")))
        return json.dumps(_jsonable(config)), plain, method

    def headline(self, config: dict[str, Any]) -> str:
        """The trial's sampled values, for its progress line."""
        _, params, _ = self.describe(config)
        return " ".join(f"{k}={short_value(v)}" for k, v in params.items())

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """Flush the writes, then select and attach the Pareto plot, table and best config."""
        super().on_experiment_end(trials, **info)
        self.close()
        table = None if self.table is None else self.table.ended_frame(trials)
        self.trials = finalize_sweep(self.client, self.parent_run_id, tolerance=self.tolerance,
                                     ece_key=self.ece, accuracy_key=self.accuracy, table=table)
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
