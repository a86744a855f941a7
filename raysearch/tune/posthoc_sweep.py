"""Sweep post-hoc calibrators over a stored logits file with Ray Tune, Optuna and MLflow.

A post-hoc search space (:mod:`raysearch.tune.posthoc_space`, ``kind: posthoc``) samples a
calibrator, its objective, class-wise loss scaling on/off and the objective's parameters.
:func:`run_posthoc_sweep` splits the outputs into a calibration part and an evaluation part
(:func:`raysearch.calibration.posthoc.split_outputs`), splits the calibration part again
(stratified) into a fit part and a held-out part, and runs one Tune trial per configuration
(:func:`run_posthoc_trial`): fit on the fit part, score on the held-out part (``holdout_*``,
what Optuna minimises and the selection rule uses) and on the evaluation part (``eval_*``,
reported only). All MLflow writes happen in the driver, after the trials
(:mod:`raysearch.tune.posthoc_record`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from ray import tune
from ray.tune.search.optuna import OptunaSearch

from raysearch import tracking
from raysearch.calibration.posthoc import Outputs, split_outputs
from raysearch.metrics import calibration_summary, softmax
from raysearch.metrics.selection import select_best
from raysearch.tune.cluster import init_ray
from raysearch.tune.engine import build_tuner
from raysearch.tune.posthoc_record import (
    FAILED,
    config_text,
    finish_parent,
    log_trials,
    open_parent,
)
from raysearch.tune.posthoc_space import PosthocSpace, load_posthoc_space
from raysearch.tune.searchers import make_sampler
from raysearch.tune.spaces import one_line

__all__ = [
    "OBJECTIVES",
    "PosthocSpace",
    "PosthocSweepResult",
    "load_posthoc_space",
    "run_posthoc_sweep",
]

logger = logging.getLogger(__name__)

#: ``objective=`` -> the held-out metric Optuna minimises.
OBJECTIVES = {"ece": "holdout_ece", "nll": "holdout_nll"}
#: Metrics reported per trial, per part (``holdout_*``, ``eval_*``).
_METRICS = ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier")
#: Failures of a calibrator that make a trial FAILED instead of crashing it.
_FAILURES = (ValueError, RuntimeError, ArithmeticError, np.linalg.LinAlgError)


class _PosthocOptunaSearch(OptunaSearch):
    """OptunaSearch telling Optuna FAIL for a trial whose calibrator rejected its config."""

    def on_trial_complete(
        self,
        trial_id: str,
        result: dict | None = None,  # noqa: D102
        error: bool = False,
    ) -> None:
        if not error and result is not None and result.get(FAILED):
            result, error = None, True
        super().on_trial_complete(trial_id, result=result, error=error)


def _summary(probs: Any, labels: np.ndarray, prefix: str, n_bins: int) -> dict[str, float]:
    summary = calibration_summary(probs, labels, n_bins=n_bins)
    return {f"{prefix}_{k}": float(summary[k]) for k in _METRICS}


def run_posthoc_trial(
    config: dict[str, Any], *, space: PosthocSpace, data: dict[str, Any], n_bins: int = 15
) -> None:
    """Tune function trainable: fit one calibrator configuration and report once.

    Args:
        config: the trial config (calibrator, loss, classwise_scaling, epsilon/gamma).
        space: the sweep's space (turns `config` into ``fit_calibrator`` keywords).
        data: ``fit``, ``holdout`` and ``eval`` entries, each a (logits, labels) pair.
        n_bins: bins of the reported calibration errors.

    Reports ``holdout_*`` and ``eval_*`` metrics and ``fit_seconds``, or only ``error`` (the
    message) when the calibrator raises ValueError, RuntimeError, ArithmeticError or
    LinAlgError.
    """
    import torch

    from raysearch.calibration import fit_calibrator

    torch.set_num_threads(1)
    kwargs = space.fit_arguments(config)
    logits, labels = data["fit"]
    start = time.perf_counter()
    try:
        calibrator = fit_calibrator(kwargs.pop("name"), logits, labels, **kwargs)
        seconds = time.perf_counter() - start
        result = {"fit_seconds": seconds}
        for part, prefix in (("holdout", "holdout"), ("eval", "eval")):
            part_logits, part_labels = data[part]
            probs = calibrator.predict_proba(part_logits)
            result.update(_summary(probs, part_labels, prefix, n_bins))
    except _FAILURES as exc:
        tune.report({FAILED: f"{type(exc).__name__}: {one_line(exc)}"})
        return
    tune.report(result)


@dataclass
class PosthocSweepResult:
    """What a finished post-hoc sweep returns.

    Attributes:
        name: the sweep's name (MLflow tag ``raysearch.sweep``).
        parent_run_id: MLflow parent run id.
        tracking_uri: where it was tracked.
        trials: one row per trial: ``trial``, ``run_id``, ``status`` (``ok``/``failed``),
            ``error``, the config columns, ``holdout_*``, ``eval_*``, ``fit_seconds``,
            ``selected``.
        selected: the selected trial's row (None when every trial failed).
        best: the winner's ``fit_calibrator`` keywords (``name``, ``loss``,
            ``classwise_scaling``, ``epsilon``/``gamma``), or None.
        uncalibrated: metrics of the uncalibrated outputs (``holdout_*``, ``eval_*``).
        split: one line saying how the data were split.
        seconds: wall time of the sweep.
    """

    name: str
    parent_run_id: str
    tracking_uri: str
    trials: pd.DataFrame
    selected: pd.Series | None
    best: dict[str, Any] | None
    uncalibrated: dict[str, float]
    split: str
    seconds: float


def run_posthoc_sweep(
    source_outputs: Outputs,
    *,
    space: str | Path | PosthocSpace = "posthoc",
    num_samples: int = 16,
    seed: int = 0,
    fraction: float = 0.5,
    holdout: float = 0.3,
    tolerance: float = 0.01,
    objective: str = "ece",
    tracking_uri: str | None = None,
    experiment: str = tracking.DEFAULT_EXPERIMENT,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
    address: str | None = None,
    n_bins: int = 15,
    storage_path: str | None = None,
) -> PosthocSweepResult:
    """Sweep a post-hoc space over stored outputs and select on held-out calibration data.

    The outputs are split by :func:`~raysearch.calibration.posthoc.split_outputs` (``fraction``,
    ``seed``; the file's own split if it has one) into a calibration and an evaluation part; the
    calibration part is split again (stratified, ``holdout`` share, same seed) into a fit part
    and a held-out part. Each trial fits its configuration on the fit part. Optuna (seeded TPE)
    minimises ``holdout_ece`` (``objective="ece"``) or ``holdout_nll``. The selection rule runs
    on held-out metrics only: lowest ``holdout_ece`` within ``tolerance`` of the best
    ``holdout_accuracy``; the winner's ``eval_*`` metrics are its honest estimate.

    MLflow (driver side): a parent run tagged ``raysearch.sweep`` = name and
    ``raysearch.kind`` = ``posthoc`` with the sweep's params, the uncalibrated metrics
    (``uncalibrated_holdout_ece``, ...), the winner's (``best_holdout_ece``, ``best_eval_ece``,
    ...), and the artifacts ``trials.parquet`` and ``best_posthoc.yaml``; one child run per
    trial (params: calibrator, loss, classwise_scaling, epsilon/gamma; metrics), FAILED for a
    combination the calibrator rejected.

    Args:
        source_outputs: loaded outputs (:func:`~raysearch.calibration.posthoc.load_outputs`).
        space: a bundled post-hoc space name, a YAML path or a loaded :class:`PosthocSpace`.
        num_samples: number of trials, >= 1.
        seed: seeds both splits and the sampler, >= 0.
        fraction: calibration share of the first split, in (0, 1).
        holdout: held-out share of the calibration part, in (0, 1).
        tolerance: absolute accuracy tolerance of the selection rule, in [0, 1).
        objective: ``"ece"`` or ``"nll"`` (the held-out metric Optuna minimises).
        tracking_uri: MLflow tracking URI (default as :func:`raysearch.tracking.get_client`).
        experiment: MLflow experiment name.
        name: sweep name (default ``<space>-<YYYYmmdd-HHMMSS>``).
        progress: called with one readable line per trial and a few status lines.
        address: address of an existing Ray cluster (None: a local Ray, unless one is running).
        n_bins: bins of the reported calibration errors.
        storage_path: where Tune keeps its experiment state (default ``~/ray_results``).

    Returns:
        A :class:`PosthocSweepResult`.

    Raises:
        SpaceError: for an invalid space.
        ValueError: for a bad setting, split or tracking URI (before any trial runs).
    """
    _check_settings(num_samples, objective, tolerance, holdout)
    space = space if isinstance(space, PosthocSpace) else load_posthoc_space(space)
    say = progress or (lambda line: logger.info("%s", line))
    parts = _split_parts(
        source_outputs, fraction=fraction, holdout=holdout, seed=seed, n_bins=n_bins
    )

    client, uri = tracking.get_client(tracking_uri)
    experiment_id = tracking.ensure_experiment(client, experiment, uri)
    name = name or f"{space.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    rule = f"lowest holdout_ece within {tolerance} of the best holdout_accuracy"
    params = {"space": space.name, "num_samples": num_samples, "seed": seed, "fraction": fraction,
              "holdout": holdout, "tolerance": tolerance, "objective": objective,
              "sampler": "tpe", **parts.sizes(), "n_classes": source_outputs.n_classes,
              "n_bins": n_bins, "selection_rule": rule}
    parent_id = open_parent(client, experiment_id, name, space, params, parts.uncalibrated)
    say(
        f"post-hoc sweep {name}: {num_samples} trials of space '{space.name}'; "
        f"{parts.description}; MLflow {uri} (experiment '{experiment}')"
    )

    start = time.monotonic()
    try:
        grid = _run_trials(space, parts, name=name, objective=objective, num_samples=num_samples,
                           seed=seed, n_bins=n_bins, address=address, storage_path=storage_path)
        frame = log_trials(client, experiment_id, parent_id, name, space, grid, say)
    except BaseException:
        client.set_terminated(parent_id, "FAILED")
        raise

    selected = _select(frame, tolerance)
    best = space.fit_arguments(selected.to_dict()) if selected is not None else None
    finish_parent(client, parent_id, frame, selected, best, name, rule, parts.description)
    seconds = time.monotonic() - start
    _say_outcome(say, name, parent_id, frame, selected, best, parts, seconds)
    return PosthocSweepResult(
        name, parent_id, uri, frame, selected, best, parts.uncalibrated, parts.description, seconds
    )


def _say_outcome(say: Callable[[str], None], name: str, parent_id: str, frame: pd.DataFrame,
                 selected: pd.Series | None, best: dict[str, Any] | None, parts: _Parts,
                 seconds: float) -> None:
    """The sweep's last lines: the selected trial (if any), then how many trials ran."""
    if selected is not None:
        say(
            f"selected trial {selected['trial']} ({config_text(best)}): held-out ECE "
            f"{100 * selected['holdout_ece']:.2f}%, eval ECE {100 * selected['eval_ece']:.2f}% "
            f"(uncalibrated {100 * parts.uncalibrated['eval_ece']:.2f}%)"
        )
    n_ok = int((frame["status"] == "ok").sum()) if not frame.empty else 0
    say(
        f"post-hoc sweep {name} finished in {seconds:.1f}s: {n_ok}/{len(frame)} trials ok; "
        f"parent run {parent_id}"
    )


def _check_settings(num_samples: Any, objective: str, tolerance: float, holdout: float) -> None:
    """Refuse a bad sweep setting in one line, before anything is split or written.

    Raises:
        ValueError: naming the setting and its value.
    """
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"`num_samples` must be an integer >= 1, got {num_samples!r}")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose from {', '.join(OBJECTIVES)}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"`tolerance` must be in [0, 1), got {tolerance}")
    if not 0 < holdout < 1:
        raise ValueError(f"`holdout` must be in (0, 1), got {holdout}")


@dataclass(frozen=True)
class _Parts:
    """The three parts of a post-hoc sweep's outputs and the uncalibrated baseline.

    Attributes:
        fit: what each trial fits its calibrator on.
        holdout: held-out calibration data (``holdout_*`` metrics: objective and selection).
        evaluation: the evaluation part (``eval_*`` metrics, reported only).
        description: one line saying how the data were split.
        uncalibrated: ``holdout_*`` and ``eval_*`` metrics of the uncalibrated softmax.
    """

    fit: Outputs
    holdout: Outputs
    evaluation: Outputs
    description: str
    uncalibrated: dict[str, float]

    def sizes(self) -> dict[str, int]:
        """``n_fit``, ``n_holdout`` and ``n_eval``: the samples of each part (sweep params)."""
        return {"n_fit": self.fit.n_samples, "n_holdout": self.holdout.n_samples,
                "n_eval": self.evaluation.n_samples}

    def trial_data(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``fit``, ``holdout`` and ``eval`` (logits, labels) pairs, as the trials take them."""
        return {
            "fit": (self.fit.logits, self.fit.labels),
            "holdout": (self.holdout.logits, self.holdout.labels),
            "eval": (self.evaluation.logits, self.evaluation.labels),
        }


def _split_parts(
    source_outputs: Outputs, *, fraction: float, holdout: float, seed: int, n_bins: int
) -> _Parts:
    """Split into calibration and evaluation, then calibration into fit and held-out parts."""
    parts = split_outputs(source_outputs, fraction=fraction, seed=seed)
    inner = split_outputs(parts.calibration, fraction=1.0 - holdout, seed=seed)
    fit, held, ev = inner.calibration, inner.evaluation, parts.evaluation
    description = (
        f"{parts.description}; calibration part split again: {fit.n_samples} fit / "
        f"{held.n_samples} held-out"
    )
    uncalibrated = {
        **_summary(softmax(held.logits), held.labels, "holdout", n_bins),
        **_summary(softmax(ev.logits), ev.labels, "eval", n_bins),
    }
    return _Parts(fit, held, ev, description, uncalibrated)


def _run_trials(
    space: PosthocSpace,
    parts: _Parts,
    *,
    name: str,
    objective: str,
    num_samples: int,
    seed: int,
    n_bins: int,
    address: str | None,
    storage_path: str | None,
) -> Any:
    """Run the sweep's trials through :func:`raysearch.tune.engine.build_tuner`.

    One trial per sampled configuration, one CPU each, no retry (a calibrator that rejects its
    configuration reports ``error`` and ends FAILED); seeded TPE minimises the held-out metric
    of `objective`.

    Returns:
        Tune's ``ResultGrid``.
    """
    init_ray(address)
    data = parts.trial_data()
    searcher = _PosthocOptunaSearch(
        space=space.define_by_run,
        metric=OBJECTIVES[objective],
        mode="min",
        sampler=make_sampler("tpe", seed),
    )
    trainable = tune.with_resources(
        tune.with_parameters(run_posthoc_trial, space=space, data=data, n_bins=n_bins),
        {"cpu": 1},
    )
    storage = Path(storage_path or Path("~/ray_results").expanduser()).resolve()
    tuner = build_tuner(
        trainable,
        search_alg=searcher,
        num_samples=num_samples,
        name=name,
        storage_path=str(storage),
        max_failures=0,
    )
    return tuner.fit()


def _select(frame: pd.DataFrame, tolerance: float) -> pd.Series | None:
    """Mark and return the selected trial among the ``ok`` ones (None when every one failed).

    The selection rule (:func:`raysearch.metrics.selection.select_best`) on held-out metrics only:
    lowest ``holdout_ece`` within `tolerance` of the best ``holdout_accuracy``. Sets the
    ``selected`` column of `frame`.
    """
    frame["selected"] = False
    ok = frame[frame["status"] == "ok"] if not frame.empty else frame
    if ok.empty:
        return None
    position = select_best(
        ok.reset_index(drop=True),
        accuracy="holdout_accuracy",
        ece="holdout_ece",
        tolerance=tolerance,
    )
    frame.loc[ok.index[position], "selected"] = True
    return frame.loc[ok.index[position]]
