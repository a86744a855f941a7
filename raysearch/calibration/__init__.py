"""Post-hoc calibrators, their objectives, and their name registry.

Fit one by name on a calibration (validation) set and apply it to new logits::

    from raysearch.calibration import fit_calibrator
    cal = fit_calibrator("ts", val_logits, val_labels)
    probs = cal.predict_proba(test_logits)      # (N, K) float64, rows sum to 1
    cal.temperature, cal.params_

Registered calibrators (``_CALIBRATORS``): ``ts`` (temperature scaling), ``ets`` (Mix-n-Match
ensemble TS), ``cts`` (one temperature per class), ``pts`` (parameterized TS of Tomani et al., an
MLP on the sorted top logits), ``pts_sctl`` (the PTS baseline as Jung et al.'s released code
builds it, for reproducing their tables), ``ts_sbece`` (TS fitted on soft-binned ECE),
``ts_hb_ece`` (TS fitted on hard-binned ECE by a multi-resolution search, Karandikar et al.),
``dirichlet`` (Dirichlet calibration with ODIR, Kull et al.).
Objectives (``loss=``): ``nll``, ``mse``, ``ls`` (``epsilon``), ``focal`` (``gamma``),
``sbece`` (``n_bins``, ``sb_temperature``, ``p``, ``binning``), ``hbece`` (``n_bins``,
``binning``, ``norm``). Each calibrator's default objective is its authors'
(``default_objective``): ``nll`` for ``ts``, ``cts``, ``pts_sctl`` and ``dirichlet``, ``mse``
for ``ets`` and ``pts`` (their released code), ``sbece`` for ``ts_sbece``, ``hbece`` for
``ts_hb_ece``. ``classwise_scaling=True`` wraps any calibrator in the class-wise loss scaling of
Jung et al. (ICML 2023), by default as their released code does it (``variant="official"``).
A new calibrator is a class in its family file plus one line in ``_CALIBRATORS``.

**Layer.** Science: plain PyTorch, NumPy and SciPy. It imports :mod:`raysearch.registry`,
:mod:`raysearch.metrics` and :mod:`raysearch.losses` (the objectives' soft-binned ECE); no Ray,
MLflow or Optuna. :mod:`~raysearch.calibration.posthoc` fits and evaluates calibrators on a
run's held-out logits, :mod:`~raysearch.calibration.reproduce` puts the papers' published
numbers (:mod:`~raysearch.calibration.published`, read from a data file) beside ours.
"""

import inspect
from typing import Any

from raysearch.calibration.base import Calibrator
from raysearch.calibration.classwise import ClasswiseLossScaling
from raysearch.calibration.dirichlet import DirichletCalibration
from raysearch.calibration.objectives import (
    OBJECTIVES,
    CalibrationObjective,
    build_objective,
    objective_parameters,
)
from raysearch.calibration.pts import (
    ParameterizedTemperatureScaling,
    SCTLParameterizedTemperatureScaling,
)
from raysearch.calibration.temperature import (
    ClassTemperatureScaling,
    EnsembleTemperatureScaling,
    TemperatureScaling,
    TemperatureScalingHBECE,
    TemperatureScalingSBECE,
)
from raysearch.registry import Registry, object_label

_CALIBRATORS: dict[str, type[Calibrator]] = {
    "ts": TemperatureScaling,
    "ets": EnsembleTemperatureScaling,
    "cts": ClassTemperatureScaling,
    "pts": ParameterizedTemperatureScaling,
    "pts_sctl": SCTLParameterizedTemperatureScaling,
    "ts_sbece": TemperatureScalingSBECE,
    "ts_hb_ece": TemperatureScalingHBECE,
    "dirichlet": DirichletCalibration,
}

#: Built-in calibrators plus the installed plug-ins (entry-point group ``raysearch.calibrators``).
CALIBRATOR_REGISTRY = Registry("calibrators", _CALIBRATORS)

__all__ = [
    "CALIBRATOR_REGISTRY",
    "OBJECTIVES",
    "CalibrationObjective",
    "Calibrator",
    "ClassTemperatureScaling",
    "ClasswiseLossScaling",
    "DirichletCalibration",
    "EnsembleTemperatureScaling",
    "ParameterizedTemperatureScaling",
    "SCTLParameterizedTemperatureScaling",
    "TemperatureScaling",
    "TemperatureScalingHBECE",
    "TemperatureScalingSBECE",
    "available_calibrators",
    "build_objective",
    "calibrator_parameters",
    "default_objective",
    "fit_calibrator",
]

#: Parameters every calibrator takes from fit_calibrator's own keywords, not from **params.
_RESERVED = ("self", "objective", "inputs", "base")


def available_calibrators() -> list[str]:
    """Return the registered calibrator names, sorted.

    Returns:
        ``["cts", "dirichlet", "ets", "pts", "pts_sctl", "ts", "ts_hb_ece", "ts_sbece"]``.
    """
    return CALIBRATOR_REGISTRY.names()


def _calibrator_class(name: Any) -> Any:
    return CALIBRATOR_REGISTRY.get(name)


def _is_builtin(target: Any) -> bool:
    return inspect.isclass(target) and issubclass(target, Calibrator)


def default_objective(name: str) -> str:
    """The objective a calibrator fits when ``fit_calibrator`` gets no ``loss``.

    Its authors' objective: ``"nll"`` for ``ts``, ``cts``, ``pts_sctl`` and ``dirichlet``,
    ``"mse"`` for ``ets`` and ``pts`` (their released code), ``"sbece"`` for ``ts_sbece``,
    ``"hbece"`` for ``ts_hb_ece``.

    Args:
        name: a registered calibrator name.

    Returns:
        An objective name of :data:`OBJECTIVES`.

    Raises:
        ValueError: if ``name`` is not registered.
    """
    target = _calibrator_class(name)
    return target.default_objective if _is_builtin(target) else "nll"


def _keyword_defaults(function: Any) -> dict[str, Any]:
    return {
        param.name: param.default
        for param in inspect.signature(function).parameters.values()
        if param.name not in _RESERVED and param.default is not inspect.Parameter.empty
    }


def calibrator_parameters(name: str) -> dict[str, Any]:
    """Keyword parameters of a calibrator (not of its objective) and their defaults.

    Args:
        name: a registered calibrator name.

    Returns:
        e.g. ``{"t_min": 0.05, "t_max": 20.0}`` for ``"ts"``.

    Raises:
        ValueError: if ``name`` is not registered.
    """
    return _keyword_defaults(_calibrator_class(name).__init__)


def fit_calibrator(
    name: str,
    logits: Any,
    labels: Any,
    *,
    inputs: str = "logits",
    classwise_scaling: bool = False,
    loss: str | None = None,
    **params: Any,
) -> Calibrator:
    """Build a registered calibrator and fit it on a calibration set.

    ``params`` are routed by name: objective parameters of ``loss`` (``epsilon`` for ``ls``,
    ``gamma`` for ``focal``, ``n_bins``/``sb_temperature``/``p``/``binning`` for ``sbece``,
    ``n_bins``/``binning``/``norm`` for ``hbece``), calibrator parameters
    (:func:`calibrator_parameters`, e.g. ``t_max``, PTS's ``steps``, ``reg_lambda``) and,
    with ``classwise_scaling=True``, the wrapper's ``norm``, ``variant`` (``"official"``, the
    default, or ``"paper"``), ``max_rounds``, ``tol``.

    Args:
        name: ``"ts"``, ``"ets"``, ``"cts"``, ``"pts"``, ``"pts_sctl"``, ``"ts_sbece"``,
            ``"ts_hb_ece"`` or ``"dirichlet"``.
        logits: (N, K) float logits (NumPy array or torch tensor), or probabilities with
            ``inputs="probs"``.
        labels: (N,) integer labels in [0, K).
        inputs: ``"logits"`` or ``"probs"`` (``log max(p, 1e-12)`` is used). Defaults to
            ``"logits"``.
        classwise_scaling: wrap the calibrator in Jung et al.'s class-wise loss scaling.
            Defaults to False.
        loss: objective name (``"nll"``, ``"mse"``, ``"ls"``, ``"focal"``, ``"sbece"``,
            ``"hbece"``); None means the calibrator's default, its authors' objective:
            ``"nll"`` for ``ts``, ``cts``, ``pts_sctl`` and ``dirichlet``, ``"mse"`` for
            ``ets`` and ``pts``, ``"sbece"`` for ``ts_sbece`` and ``"hbece"`` for
            ``ts_hb_ece`` (each accepts no other).
        **params: see above.

    Returns:
        The fitted calibrator; ``predict_proba(logits)`` gives (N, K) probabilities.

    Raises:
        ValueError: for an unknown calibrator ("Unknown calibrator 'x'; available: cts, ets,
            ..."), an unknown loss, a parameter that neither the loss, the calibrator nor the
            wrapper accepts (the message lists the accepted ones), an out-of-range value, or
            invalid inputs (NaN/inf, ndim != 2, N mismatch, labels outside [0, K), K < 2,
            probabilities outside [0, 1] or rows not summing to 1, a missing class for ``cts``
            or class-wise scaling).
        TypeError: for a parameter of the wrong type or a non-bool ``classwise_scaling``.
    """
    calibrator_class = _calibrator_class(name)
    if not _is_builtin(calibrator_class):
        return _fit_plugin(calibrator_class, name, logits, labels, inputs=inputs,
                           classwise_scaling=classwise_scaling, loss=loss, **params)
    if not isinstance(classwise_scaling, bool):
        raise TypeError(
            f"`classwise_scaling` must be a bool, got {type(classwise_scaling).__name__}"
        )
    loss_name = calibrator_class.default_objective if loss is None else loss
    objective_keys = objective_parameters(loss_name)
    calibrator_keys = calibrator_parameters(name)
    wrapper_keys = _keyword_defaults(ClasswiseLossScaling.__init__) if classwise_scaling else {}
    accepted = {**objective_keys, **calibrator_keys, **wrapper_keys}
    unexpected = sorted(set(params) - set(accepted))
    if unexpected:
        raise ValueError(
            f"calibrator {name!r} with loss {loss_name!r}"
            f"{' and classwise_scaling' if classwise_scaling else ''} got unexpected "
            f"parameter(s) {', '.join(unexpected)}; accepted: {', '.join(accepted) or '(none)'}"
        )
    objective = build_objective(loss_name, **{k: params[k] for k in params if k in objective_keys})
    calibrator = calibrator_class(
        objective, inputs=inputs, **{k: params[k] for k in params if k in calibrator_keys}
    )
    if classwise_scaling:
        calibrator = ClasswiseLossScaling(
            calibrator, **{k: params[k] for k in params if k in wrapper_keys}
        )
    return calibrator.fit(logits, labels)


def _fit_plugin(target: Any, name: Any, logits: Any, labels: Any, *, inputs: str,
                classwise_scaling: bool, loss: str | None, **params: Any) -> Any:
    """A user's calibrator: ``target(**params).fit(logits, labels)`` with ``predict_proba``.

    The contract of a plug-in (entry point ``raysearch.calibrators``, import string or class):
    a class or factory taking its hyperparameters as keywords, whose result has
    ``fit(logits, labels)`` (returning the fitted calibrator or None) and
    ``predict_proba(logits) -> (N, K) probabilities``.
    """
    import numpy as np

    label = name if isinstance(name, str) else object_label(name)
    if inputs != "logits" or classwise_scaling or loss is not None:
        raise ValueError(f"calibrator {label!r} is a plug-in: it takes logits and its own "
                         "keyword parameters only (no inputs=, classwise_scaling, loss=)")
    try:
        calibrator = target(**params)
        fitted = calibrator.fit(np.asarray(logits, dtype=np.float64), np.asarray(labels))
    except (ValueError, TypeError):
        raise
    except Exception as exc:  # noqa: BLE001 (a user's calibrator: one line naming it)
        raise ValueError(f"calibrator {label!r} raised {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())}") from None
    fitted = calibrator if fitted is None else fitted
    if not callable(getattr(fitted, "predict_proba", None)):
        raise ValueError(f"calibrator {label!r}: its fit() returned {type(fitted).__name__} "
                         "without predict_proba(logits)")
    return fitted
