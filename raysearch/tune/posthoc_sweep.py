"""Sweep post-hoc calibrators over a stored logits file with Ray Tune, Optuna and MLflow.

A post-hoc search space (``search_spaces/posthoc.yaml``, ``kind: posthoc``) samples a
calibrator, its objective, class-wise loss scaling on/off and the objective's parameters::

    kind: posthoc
    calibrator: {choices: [ts, ets, cts, pts, ts_sbece]}
    loss: {choices: [nll, mse, ls, focal]}      # not sampled for ts_sbece (always sbece);
                                                # absent: each calibrator's default objective
    classwise_scaling: {choices: [false, true]}
    epsilon: {low: 0.01, high: 0.2, log: true}  # only sampled when loss == ls
    gamma: {low: 1.0, high: 5.0}                 # only sampled when loss == focal

Specs follow :mod:`raysearch.tune.spaces` (a scalar is fixed, ``{low, high, log}`` a range,
``{choices}`` a categorical). Without ``loss`` every calibrator fits its default objective
(:func:`raysearch.calibration.default_objective`: its authors'), and class-wise scaling always
runs as the released code does (``variant="official"``, the wrapper's default).
:func:`run_posthoc_sweep` splits the outputs into a calibration
part and an evaluation part (:func:`raysearch.calibration.posthoc.split_outputs`), splits the
calibration part again (stratified) into a fit part and a held-out part, and runs one Tune trial per
configuration: fit on the fit part, score on the held-out part (``holdout_*``, what Optuna
minimises and the selection rule uses) and on the evaluation part (``eval_*``, reported only).
All MLflow writes happen in the driver, after the trials.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import yaml
from ray import tune
from ray.tune.search.optuna import OptunaSearch

from raysearch import tracking
from raysearch.calibration.posthoc import Outputs, split_outputs
from raysearch.metrics import calibration_summary, softmax
from raysearch.metrics.selection import select_best
from raysearch.registry import did_you_mean
from raysearch.tune.engine import build_tuner, init_ray, make_sampler
from raysearch.tune.spaces import (
    SpaceError,
    _fmt,
    _locate,
    _one_line,
    _parse_spec,
    _read_yaml,
    _Spec,
)

if TYPE_CHECKING:
    import optuna

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
#: Result key holding the error message of a combination the calibrator rejected.
FAILED = "error"
KIND_TAG = "raysearch.kind"
#: Metrics reported per trial, per part (``holdout_*``, ``eval_*``).
_METRICS = ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier")
_KEYS = ("kind", "description", "calibrator", "loss", "classwise_scaling", "epsilon", "gamma")
#: Objective parameter -> the only loss that takes it.
_PARAM_LOSS = {"epsilon": "ls", "gamma": "focal"}
#: Failures of a calibrator that make a trial FAILED instead of crashing it.
_FAILURES = (ValueError, RuntimeError, ArithmeticError, np.linalg.LinAlgError)


@dataclass(frozen=True, eq=False)
class PosthocSpace:
    """A validated post-hoc search space, loaded by :func:`load_posthoc_space`.

    Attributes:
        name: file name without ``.yaml``.
        path: the YAML file.
        description: the file's ``description`` (may be empty).
        specs: ``calibrator``, ``classwise_scaling`` and, when given, ``loss``, ``epsilon``
            and ``gamma`` (parsed specs of :mod:`raysearch.tune.spaces`; without ``loss`` each
            calibrator fits its default objective).
    """

    name: str
    path: Path
    description: str
    specs: dict[str, _Spec]

    @classmethod
    def load(cls, name_or_path: str | Path) -> PosthocSpace:
        """Same as :func:`load_posthoc_space`."""
        return load_posthoc_space(name_or_path)

    def define_by_run(self, trial: optuna.Trial) -> dict[str, Any]:
        """Optuna define-by-run function: sample one configuration, conditionally.

        ``loss`` is not sampled for a calibrator of :data:`FIXED_OBJECTIVE` (``ts_sbece``
        fits ``sbece``, ``ts_hb_ece`` ``hbece``), nor when the space has no
        ``loss`` (the calibrator's default objective is fixed); ``epsilon`` only when the loss
        is ``ls``; ``gamma`` only when it is ``focal``.

        Returns:
            The fixed (not sampled) values of this configuration, which Tune adds to the
            trial config.
        """
        from raysearch.calibration import default_objective

        fixed: dict[str, Any] = {}

        def take(name: str) -> Any:
            spec = self.specs[name]
            if spec.sampled:
                return spec.suggest(trial, name)
            fixed[name] = spec.value
            return spec.value

        calibrator = take("calibrator")
        if calibrator in FIXED_OBJECTIVE:
            fixed["loss"] = FIXED_OBJECTIVE[calibrator]
        else:
            if "loss" in self.specs:
                loss = take("loss")
            else:
                loss = fixed["loss"] = default_objective(calibrator)
            for param, needs in _PARAM_LOSS.items():
                if loss == needs and param in self.specs:
                    take(param)
        take("classwise_scaling")
        return fixed

    def fit_arguments(self, config: dict[str, Any]) -> dict[str, Any]:
        """``fit_calibrator`` keywords of a trial config: name, loss, flag, loss parameters."""
        loss = FIXED_OBJECTIVE.get(config["calibrator"], config["loss"])
        out = {
            "name": config["calibrator"],
            "loss": loss,
            "classwise_scaling": bool(config["classwise_scaling"]),
        }
        out.update(
            {
                p: config[p]
                for p, needs in _PARAM_LOSS.items()
                if loss == needs and _present(config.get(p))
            }
        )
        return out

    def describe(self) -> str:
        """Readable table of the space, one row per parameter."""
        rows = [(key, *spec.row()) for key, spec in self.specs.items()]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [
            f"{self.name}: {self.description}" if self.description else self.name,
            f"file: {self.path}",
            "kind: posthoc",
        ]
        for row in rows:
            lines.append(
                (
                    "  " + "  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3]
                ).rstrip()
            )
        return "\n".join(lines)


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _choice_values(spec: _Spec, where: str, allowed: list[Any]) -> tuple[Any, ...]:
    if spec.kind in ("float", "int"):
        raise SpaceError(f"{where}: must be a fixed value or {{choices: [...]}}, not a range")
    for value in spec.candidates():
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            shown = ", ".join(_fmt(a) for a in allowed)
            raise SpaceError(f"{where}: unknown value {value!r}; allowed: {shown}")
    return spec.candidates()


def load_posthoc_space(name_or_path: str | Path) -> PosthocSpace:
    """Load and validate a post-hoc search space.

    Args:
        name_or_path: a bundled name (``posthoc``) or the path of a YAML file.

    Returns:
        The validated :class:`PosthocSpace`.

    Raises:
        SpaceError: one line ``<file>: <key>: <problem>`` for malformed YAML, a missing or
            wrong ``kind``, an unknown key, an unknown calibrator or loss, a non-bool
            ``classwise_scaling``, a bad range, a value the objective rejects, or ``epsilon`` /
            ``gamma`` given while ``loss`` never takes ``ls`` / ``focal``.
        FileNotFoundError: if a given path does not exist.
    """
    from raysearch.calibration import available_calibrators, default_objective
    from raysearch.calibration.objectives import OBJECTIVES as LOSSES
    from raysearch.calibration.objectives import build_objective

    path, label = _locate(name_or_path)
    doc = _read_yaml(path, label)
    if not isinstance(doc, dict):
        raise SpaceError(f"{label}: expected a mapping with `kind: posthoc` and `calibrator`")
    if doc.get("kind") != "posthoc":
        raise SpaceError(
            f"{label}: kind: expected 'posthoc', got {doc.get('kind')!r} "
            "(training spaces load with raysearch.tune.spaces.load_space)"
        )
    unknown = sorted(str(k) for k in doc if k not in _KEYS)
    if unknown:
        raise SpaceError(
            f"{label}: unknown top-level key(s) {', '.join(unknown)}"
            f"{did_you_mean(unknown, _KEYS)}; allowed: {', '.join(_KEYS)}"
        )
    if "calibrator" not in doc:
        raise SpaceError(f"{label}: calibrator: missing (e.g. {{choices: [ts, ets]}})")
    description = doc.get("description") or ""
    if not isinstance(description, str):
        raise SpaceError(f"{label}: description: must be a string, got {description!r}")

    specs: dict[str, _Spec] = {}
    raw = {"classwise_scaling": False, **doc}
    for key, allowed in (
        ("calibrator", available_calibrators()),
        ("loss", list(LOSSES)),
        ("classwise_scaling", [False, True]),
    ):
        if key not in raw:  # no `loss`: each calibrator's default objective
            continue
        where = f"{label}: {key}"
        specs[key] = _parse_spec(raw[key], where, expect_float=False)
        _choice_values(specs[key], where, allowed)
    calibrators = set(specs["calibrator"].candidates())
    if "loss" in specs:
        losses = set(specs["loss"].candidates())
    else:
        losses = {default_objective(name) for name in calibrators - set(FIXED_OBJECTIVE)}
    if calibrators <= set(FIXED_OBJECTIVE):
        losses = {FIXED_OBJECTIVE[name] for name in calibrators}
    for key, needs in _PARAM_LOSS.items():
        if key not in doc:
            continue
        where = f"{label}: {key}"
        if needs not in losses:
            raise SpaceError(f"{where}: only used with loss {needs!r}, which `loss` never takes")
        spec = _parse_spec(doc[key], where, expect_float=True)
        for value in spec.candidates():
            try:
                build_objective(needs, **{key: value})
            except (ValueError, TypeError) as exc:
                raise SpaceError(f"{where}: {_one_line(exc)}") from None
        specs[key] = spec
    return PosthocSpace(name=path.stem, path=path, description=description, specs=specs)


#: Calibrators whose objective is part of the method: ``loss`` is never sampled for them.
FIXED_OBJECTIVE = {"ts_sbece": "sbece", "ts_hb_ece": "hbece"}


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
        tune.report({FAILED: f"{type(exc).__name__}: {_one_line(exc)}"})
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


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and k.startswith(("holdout_", "eval_", "fit_"))
    }


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
    params = {
        "space": space.name,
        "num_samples": num_samples,
        "seed": seed,
        "fraction": fraction,
        "holdout": holdout,
        "tolerance": tolerance,
        "objective": objective,
        "sampler": "tpe",
        "n_fit": parts.fit.n_samples,
        "n_holdout": parts.holdout.n_samples,
        "n_eval": parts.evaluation.n_samples,
        "n_classes": source_outputs.n_classes,
        "n_bins": n_bins,
        "selection_rule": rule,
    }
    parent_id = _open_parent(client, experiment_id, name, space, params, parts.uncalibrated)
    say(
        f"post-hoc sweep {name}: {num_samples} trials of space '{space.name}'; "
        f"{parts.description}; MLflow {uri} (experiment '{experiment}')"
    )

    start = time.monotonic()
    try:
        grid = _run_trials(
            space,
            parts,
            name=name,
            objective=objective,
            num_samples=num_samples,
            seed=seed,
            n_bins=n_bins,
            address=address,
            storage_path=storage_path,
        )
        frame = _log_trials(client, experiment_id, parent_id, name, space, grid, say)
    except BaseException:
        client.set_terminated(parent_id, "FAILED")
        raise

    selected = _select(frame, tolerance)
    best = space.fit_arguments(selected.to_dict()) if selected is not None else None
    _finish_parent(client, parent_id, frame, selected, best, name, rule, parts.description)
    seconds = time.monotonic() - start
    if selected is not None:
        say(
            f"selected trial {selected['trial']} ({_config_text(best)}): held-out ECE "
            f"{100 * selected['holdout_ece']:.2f}%, eval ECE {100 * selected['eval_ece']:.2f}% "
            f"(uncalibrated {100 * parts.uncalibrated['eval_ece']:.2f}%)"
        )
    n_ok = int((frame["status"] == "ok").sum()) if not frame.empty else 0
    say(
        f"post-hoc sweep {name} finished in {seconds:.1f}s: {n_ok}/{len(frame)} trials ok; "
        f"parent run {parent_id}"
    )
    return PosthocSweepResult(
        name, parent_id, uri, frame, selected, best, parts.uncalibrated, parts.description, seconds
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


def _open_parent(
    client: Any,
    experiment_id: str,
    name: str,
    space: PosthocSpace,
    params: dict[str, Any],
    uncalibrated: dict[str, float],
) -> str:
    """Create the sweep's parent run with its params and uncalibrated metrics; its run id."""
    parent_id = client.create_run(
        experiment_id,
        run_name=name,
        tags={
            tracking.SWEEP_TAG: name,
            KIND_TAG: "posthoc",
            "raysearch.space": space.name,
        },
    ).info.run_id
    tracking.log_params(client, parent_id, params)
    tracking.log_metrics(
        client, parent_id, {f"uncalibrated_{k}": v for k, v in uncalibrated.items()}, step=0
    )
    return parent_id


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


def _config_text(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())


def _log_trials(
    client: Any,
    experiment_id: str,
    parent_id: str,
    name: str,
    space: PosthocSpace,
    grid: Any,
    say: Callable[[str], None],
) -> pd.DataFrame:
    """One child run per trial of the ResultGrid; returns the trials table (trial order)."""
    results = sorted(grid, key=lambda r: (r.metrics or {}).get("trial_id") or r.path or "")
    rows = []
    for index, result in enumerate(results):
        metrics = result.metrics or {}
        config = {
            k: v
            for k, v in (result.config or {}).items()
            if k in ("calibrator", "loss", "classwise_scaling", "epsilon", "gamma")
        }
        params = space.fit_arguments(config) if "calibrator" in config else {}
        params = {("calibrator" if k == "name" else k): v for k, v in params.items()}
        error = metrics.get(FAILED)
        if result.error is not None:
            error = f"{type(result.error).__name__}: {_one_line(result.error)}"
        status = "failed" if error else "ok"
        trial_id = metrics.get("trial_id", str(index))
        run = client.create_run(
            experiment_id,
            run_name=f"{name}-{index:03d}",
            tags={
                tracking.PARENT_TAG: parent_id,
                tracking.SWEEP_TAG: name,
                KIND_TAG: "posthoc",
                tracking.TRIAL_TAG: trial_id,
            },
        )
        run_id = run.info.run_id
        tracking.log_params(client, run_id, params)
        values = _finite(metrics)
        if values:
            tracking.log_metrics(client, run_id, values, step=0)
        if error:
            client.set_tag(run_id, "raysearch.error", error[:5000])
        client.set_terminated(run_id, "FAILED" if error else "FINISHED")
        rows.append(
            {
                "trial": index,
                "trial_id": trial_id,
                "run_id": run_id,
                "status": status,
                "error": error,
                **params,
                **values,
            }
        )
        shown = _config_text(params)
        if error:
            say(f"trial {index} ({shown}) failed: {error}")
        else:
            say(
                f"trial {index} ({shown}): held-out acc {100 * values['holdout_accuracy']:.2f}% "
                f"ECE {100 * values['holdout_ece']:.2f}% NLL {values['holdout_nll']:.4f}"
            )
    frame = pd.DataFrame(rows)
    for column in ("holdout_accuracy", "holdout_ece", "holdout_nll", "epsilon", "gamma"):
        if column not in frame:
            frame[column] = np.nan
    return frame


def _finish_parent(
    client: Any,
    parent_id: str,
    frame: pd.DataFrame,
    selected: pd.Series | None,
    best: dict[str, Any] | None,
    name: str,
    rule: str,
    split: str,
) -> None:
    with tempfile.TemporaryDirectory() as d:
        tracking.write_parquet(frame, Path(d) / "trials.parquet")
        client.log_artifact(parent_id, str(Path(d) / "trials.parquet"))
        if selected is not None and best is not None:
            metrics = _finite(selected.to_dict())
            document = {
                "calibrator": best["name"],
                "loss": best["loss"],
                "classwise_scaling": best["classwise_scaling"],
                "params": {k: float(v) for k, v in best.items() if k in _PARAM_LOSS},
                "sweep": name,
                "trial": int(selected["trial"]),
                "run_id": selected["run_id"],
                "selection": rule,
                "split": split,
                "metrics": dict(sorted(metrics.items())),
            }
            (Path(d) / "best_posthoc.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
            client.log_artifact(parent_id, str(Path(d) / "best_posthoc.yaml"))
            tracking.log_metrics(
                client, parent_id, {f"best_{k}": v for k, v in metrics.items()}, step=0
            )
            client.set_tag(parent_id, "raysearch.selected_run", selected["run_id"])
    client.set_tag(
        parent_id,
        "raysearch.trials_ok",
        str(int((frame.get("status") == "ok").sum()) if not frame.empty else 0),
    )
    client.set_terminated(parent_id, "FINISHED")
