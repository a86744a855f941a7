r"""Temperature-based calibrators: ``ts``, ``ts_sbece``, ``ts_hb_ece``, ``ets`` and ``cts``.

All fit their parameters with scipy in float64 NumPy; temperatures are optimised as
:math:`s = \log T` inside ``[log t_min, log t_max]`` (defaults 0.05 and 20), a single
temperature as :mod:`raysearch.calibration.temperature_fit` describes (a safeguarded Newton
iteration for objectives convex in 1/T, L-BFGS-B from a grid for ``mse`` and ``focal``, a grid
and Brent search for ``sbece``, a multi-resolution grid for ``ts_hb_ece``). Derivatives come
from torch autograd through the objective's torch definition; none is written by hand. A
temperature that ends on a bound is reported with a ``UserWarning`` and
``params_["at_bound"]``.

Every temperature stays in ``[t_min, t_max]``, the range the fit searches, also where the
objective has no finite optimum. On a separable calibration set
(:func:`~raysearch.calibration.base.is_separable`: 100% accuracy) NLL, Brier, focal and the
ECEs fall towards 0 as T -> 0: the fit stops at ``t_min``, ``degenerate`` is set (see
:class:`~raysearch.calibration.base.Calibrator`) and the ``UserWarning`` says that the
calibration set is perfectly classified. ``ls`` keeps a finite optimum there.
"""

import logging
import math
import warnings
from typing import Any, ClassVar

import numpy as np
import torch
from scipy import optimize

from raysearch.calibration._autograd import value_and_grad
from raysearch.calibration._checks import log_softmax, softmax, validate_int, validate_number
from raysearch.calibration.base import Calibrator, check_all_classes_present, is_separable
from raysearch.calibration.objectives import _TINY, CalibrationObjective
from raysearch.calibration.temperature_fit import (
    BOUND_TOL,
    ScalarTemperatureProblem,
    first_step,
    first_temperature_step,
    fit_log_temperature,
    lower_bound_if_no_worse,
    multiresolution_log_temperature,
    temperature_scaled,
)

__all__ = [
    "ClassTemperatureScaling",
    "EnsembleTemperatureScaling",
    "TemperatureScaling",
    "TemperatureScalingHBECE",
    "TemperatureScalingSBECE",
    "degenerate_message",
]

logger = logging.getLogger(__name__)


def _check_bounds(t_min: float, t_max: float) -> tuple[float, float]:
    t_min = validate_number("t_min", t_min, minimum=0.0, minimum_inclusive=False)
    t_max = validate_number("t_max", t_max, minimum=0.0, minimum_inclusive=False)
    if not t_min < t_max:
        raise ValueError(f"`t_min` must be smaller than `t_max` (t_min={t_min:g}, t_max={t_max:g})")
    return t_min, t_max


def degenerate_message(name: str, stop: str) -> str:
    """The warning of a fit without a finite optimum (a separable calibration set).

    Args:
        name: the calibrator, as the message names it.
        stop: where its temperature stopped (``"T stopped at its lower bound t_min=0.05"``).
    """
    return (f"{name}: the calibration set is perfectly classified (every sample's own class has "
            "the largest logit), so the objective keeps falling as T -> 0 and has no finite "
            f"optimum; {stop} and the fit is marked degenerate (its probabilities are near "
            "one-hot)")


def _separable_fit(problem: ScalarTemperatureProblem, bounds: tuple[float, float],
                   info: dict[str, Any]) -> dict[str, Any]:
    """On a separable set, the fit on the lower bound where it is no worse (no optimum)."""
    if is_separable(problem.z, problem.labels):
        return lower_bound_if_no_worse(problem, bounds, info)
    return info


def _warn_at_bound(name: str, at_bound: str, t_min: float, t_max: float,
                   z: np.ndarray, y: np.ndarray) -> None:
    if at_bound == "lower" and is_separable(z, y):
        warnings.warn(degenerate_message(name, f"T stopped at its lower bound t_min={t_min:g}"),
                      UserWarning, stacklevel=4)
    elif at_bound:
        bound = t_min if at_bound == "lower" else t_max
        warnings.warn(
            f"{name}: the fitted temperature hit the {at_bound} bound T={bound:g}; the "
            "objective still decreases beyond it (e.g. predictions mostly wrong: T -> inf, "
            "or all correct and separable: T -> 0); widen t_min/t_max or check the inputs",
            UserWarning,
            stacklevel=4,
        )


class _TemperatureCalibrator(Calibrator):
    """Shared constructor of the temperature calibrators: temperatures in [t_min, t_max].

    Args: as :class:`TemperatureScaling` (``t_min``/``t_max`` bound every temperature).

    Raises:
        ValueError: if ``t_min`` >= ``t_max`` or either is <= 0; if the class fits one loss
            only (``required_loss``) and ``objective`` is another.
    """

    #: The only loss the calibrator fits and its description, or None (any loss).
    required_loss: ClassVar[tuple[str, str] | None] = None

    def __init__(
        self,
        objective: CalibrationObjective,
        *,
        inputs: str = "logits",
        t_min: float = 0.05,
        t_max: float = 20.0,
    ) -> None:
        required = self.required_loss
        if required is not None and getattr(objective, "name", None) != required[0]:
            raise ValueError(
                f"{self.name} fits {required[1]} (loss {required[0]!r}), got loss "
                f"{getattr(objective, 'name', objective)!r}; use 'ts' with loss=... instead"
            )
        super().__init__(objective, inputs=inputs)
        self.t_min, self.t_max = _check_bounds(t_min, t_max)
        self._log_t: Any = 0.0
        self.fit_info_: dict[str, Any] = {}

    def _bounds(self) -> tuple[float, float]:
        return math.log(self.t_min), math.log(self.t_max)


class TemperatureScaling(_TemperatureCalibrator):
    r"""Temperature scaling ``ts``: :math:`p = \mathrm{softmax}(z / T)` with one T > 0.

    Guo, Pleiss, Sun and Weinberger, "On Calibration of Modern Neural Networks", ICML 2017,
    arXiv:1706.04599 (released code: gpleiss/temperature_scaling, ``temperature_scaling.py``,
    ``ModelWithTemperature.set_temperature``: NLL, torch L-BFGS); Jung et al., ICML 2023,
    App. B Eq. 12. T minimises the objective (NLL by default, as both papers;
    ``ls``/``focal``/``mse``/``sbece`` as in Jung et al.'s Table 1 baselines and Karandikar et
    al.) on the calibration set to convergence (module docstring); the papers and the released
    codes agree on the method, so there is no ``variant``. Jung et al.'s code (torch L-BFGS,
    lr 0.02, 1000 iterations, float32) stops once float32 loss changes fall below its 1e-9
    tolerance, a few hundredths of an ECE point from the minimiser: their Table 2 TS rows
    (6.16, 5.94) are 6.10 and 5.90 here (their loop rerun in float64 also gives 6.10, 5.91).
    Rank preserving: predictions never change.

    Args:
        objective (CalibrationObjective): the objective (see
            :func:`~raysearch.calibration.objectives.build_objective`).
        inputs (str, optional): ``"logits"`` or ``"probs"``. Defaults to ``"logits"``.
        t_min (float, optional): lower bound of T, > 0: the fit searches [t_min, t_max] and
            stops at t_min where the objective has no finite optimum (a separable calibration
            set; then ``degenerate`` is True). Defaults to ``0.05``.
        t_max (float, optional): upper bound of T. Defaults to ``20.0`` (Mix-n-Match's code
            uses 5.0, too low for very overconfident inputs).

    Attributes:
        degenerate (bool): after ``fit``, True when the calibration set is perfectly
            classified and T stopped at ``t_min`` (see the module docstring).

    Shape:
        logits: (N, K) float; labels: (N,) int in [0, K).

    Raises:
        ValueError: if ``t_min`` >= ``t_max`` or either is <= 0; for invalid inputs in ``fit``
            and ``predict_proba``.
    """

    name = "ts"
    rank_preserving = True

    @property
    def temperature(self) -> float:
        """The fitted temperature T (float).

        Raises:
            RuntimeError: if called before ``fit``.
        """
        self._check_fitted()
        return math.exp(self._log_t)

    def _reset(self, z, y):
        self._log_t = 0.0

    def _fit_with_coef(self, z, y, class_coef):
        problem = ScalarTemperatureProblem(z, y, self.objective, class_coef)
        info = fit_log_temperature(problem, self._bounds(), self._log_t)
        self.fit_info_ = _separable_fit(problem, self._bounds(), info)
        self._log_t = self.fit_info_["log_t"]
        _warn_at_bound(self.name, self.fit_info_["at_bound"], self.t_min, self.t_max, z, y)

    def _first_iteration(self, z, y, class_coef):
        problem = ScalarTemperatureProblem(z, y, self.objective, class_coef)
        self._log_t = first_temperature_step(problem, self._log_t, self._bounds())

    def _is_degenerate(self, z, y):
        return self.fit_info_.get("at_bound") == "lower" and is_separable(z, y)

    def _predict_log_proba(self, z):
        return log_softmax(z / math.exp(self._log_t))

    def _params(self):
        return {
            "temperature": math.exp(self._log_t),
            "at_bound": self.fit_info_.get("at_bound", ""),
            "fit_evaluations": self.fit_info_.get("evaluations", 0),
        }


class TemperatureScalingSBECE(TemperatureScaling):
    """Temperature scaling fitted on soft-binned ECE (``ts_sbece``, TS-SB-ECE).

    Karandikar et al., "Soft Calibration Objectives for Neural Networks", NeurIPS 2021,
    arXiv:2108.00106, Sec. 5.2 and App. C. The paper trains T by gradient descent; here T is
    found by a 61-point log-grid and a bounded Brent refinement (the objective is non-convex
    and nearly flat far from the optimum), which is deterministic and derivative-free.
    Rank preserving.

    The arguments are those of :class:`TemperatureScaling`, but ``objective`` must be a
    ``sbece`` objective (its ``n_bins``, ``sb_temperature``, ``p``, ``binning``).

    Raises:
        ValueError: if ``objective`` is not ``sbece``.
    """

    name = "ts_sbece"
    default_objective = "sbece"
    required_loss = ("sbece", "the soft-binned ECE")


class TemperatureScalingHBECE(TemperatureScaling):
    r"""Temperature scaling fitted on hard-binned ECE (``ts_hb_ece``, TS-HB-ECE).

    Karandikar et al., "Soft Calibration Objectives for Neural Networks", NeurIPS 2021,
    arXiv:2108.00106, App. C: "multi-resolution search to optimize temperature for hard-binned
    ECE (hereby, TS-HB-ECE)", the search alternative to TS-SB-ECE. :math:`p =
    \mathrm{softmax}(z / T)` with T minimising the ``hbece`` objective, whose defaults are the
    ECE of that paper's tables (equal-mass bins, l2 norm, 15 bins; Sec. 5.1, Tables 1, 2, 5).
    The paper gives no grid; here
    (:func:`~raysearch.calibration.temperature_fit.multiresolution_log_temperature`) level 1
    is ``grid_points`` points equally spaced in log T over [log t_min, log t_max], and each of
    the ``levels`` - 1 further levels puts ``grid_points`` points on the two grid intervals
    around the best point so far. The final spacing in log T is

    .. math::

        h = \frac{\log t_{max} - \log t_{min}}{G - 1}\Big(\frac{2}{G - 1}\Big)^{L - 1},

    :math:`G` = ``grid_points``, :math:`L` = ``levels``: with the defaults (0.05, 20, 41, 3)
    :math:`h = 5.99/40 \cdot (1/20)^2 = 3.7 \cdot 10^{-4}` (T known to 0.04 %), after
    :math:`V = G L = 123` evaluations, each O(N K) (the paper's O(V N_c K)). Hard-binned ECE is
    piecewise constant in T and not unimodal in general, so the search returns a best grid
    point, not a guaranteed global minimiser. ECE is a fraction in [0, 1]. Rank preserving.

    Args:
        objective (CalibrationObjective): must be an ``hbece`` objective (its ``n_bins``,
            ``binning``, ``norm``); ``inputs``, ``t_min``, ``t_max`` as
            :class:`TemperatureScaling`.
        grid_points (int, optional): points per level G >= 3. Defaults to ``41``.
        levels (int, optional): resolution levels L >= 1. Defaults to ``3``.

    Shape:
        logits: (N, K) float; labels: (N,) int in [0, K).

    Raises:
        ValueError: if ``objective`` is not ``hbece``, ``grid_points`` < 3, ``levels`` < 1,
            or ``t_min`` >= ``t_max``.
        TypeError: if ``grid_points`` or ``levels`` is not an integer.
    """

    name = "ts_hb_ece"
    default_objective = "hbece"
    required_loss = ("hbece", "the hard-binned ECE")

    def __init__(
        self,
        objective: CalibrationObjective,
        *,
        inputs: str = "logits",
        t_min: float = 0.05,
        t_max: float = 20.0,
        grid_points: int = 41,
        levels: int = 3,
    ) -> None:
        super().__init__(objective, inputs=inputs, t_min=t_min, t_max=t_max)
        self.grid_points = validate_int("grid_points", grid_points, minimum=3)
        self.levels = validate_int("levels", levels, minimum=1)

    @property
    def final_spacing(self) -> float:
        """Spacing in log T of the last grid level, h of the class docstring (float)."""
        lo, hi = self._bounds()
        return (hi - lo) / (self.grid_points - 1) * (2.0 / (self.grid_points - 1)) ** (
            self.levels - 1
        )

    def _fit_with_coef(self, z, y, class_coef):
        problem = ScalarTemperatureProblem(z, y, self.objective, class_coef)
        info = multiresolution_log_temperature(
            problem, self._bounds(), self.grid_points, self.levels
        )
        self.fit_info_ = _separable_fit(problem, self._bounds(), info)
        self._log_t = self.fit_info_["log_t"]
        _warn_at_bound(self.name, self.fit_info_["at_bound"], self.t_min, self.t_max, z, y)

    def _params(self):
        return {**super()._params(), "ece": self.fit_info_.get("value", float("nan"))}


class EnsembleTemperatureScaling(_TemperatureCalibrator):
    r"""Ensemble temperature scaling ``ets`` (Mix-n-Match).

    .. math::

        p = w_1\,\mathrm{softmax}(z / T) + w_2\,\mathrm{softmax}(z) + w_3 / K,
        \quad w \in \Delta_3

    Zhang, Kailkhura and Han, "Mix-n-Match: Ensemble and Compositional Methods for Uncertainty
    Calibration in Deep Learning", ICML 2020, arXiv:2003.07329; released code
    zhang64-llnl/Mix-n-Match-Calibration, ``util_calibration.py`` (``ets_calibrate``,
    ``temperature_scaling``, ``ensemble_scaling``). Fitted in the released order: T first by
    the objective of TS (module docstring), then the weights by the same objective of the
    mixture with T fixed (SLSQP, bounds [0, 1], equality constraint :math:`\sum w = 1`, start
    (1, 0, 0), tol 1e-12, as released).

    Objective: the DEFAULT is ``mse`` (the Brier score), because ``ets_calibrate`` fits both
    stages with it (``loss='mse'`` is hard-coded there; the demo reports "ETS with MSE Loss"):
    that is the setting of the authors' own results. ``loss="nll"`` is the alternative the
    released code names in a comment ("loss can change to 'ce'"). Released details not
    copied: T is bounded by [0.05, 5.0] there (``t_max`` here, default 20) and its NLL clips
    p to [1e-20, 1 - 1e-20].

    Not the "ETS" of Jung et al. (ICML 2023): their App. B (Eq. 13) and their code mix LOGITS,
    :math:`w_1 z / t + w_2 z + w_3 / K` with unconstrained weights, which is one temperature
    :math:`1 / (w_1 / t + w_2)` again (the constant shifts every logit alike) fitted on NLL;
    ``fit_calibrator("ts", ...)`` reproduces their ETS rows.

    Rank preserving whenever :math:`w_1 + w_2 > 0`: both softmaxes rank the classes as z does
    and a positive combination of two vectors with the same strict order (plus a constant) has
    that order. Only the degenerate w = (0, 0, 1) (uniform output, never better than chance)
    would tie all classes.

    The arguments are those of :class:`TemperatureScaling`; ``objective`` is that of both
    stages (``fit_calibrator`` default: ``mse``), ``t_max`` bounds T (released: 5.0).

    Raises:
        ValueError: if ``t_min`` >= ``t_max`` or either is <= 0.
    """

    name = "ets"
    rank_preserving = True
    default_objective = "mse"

    @property
    def temperature(self) -> float:
        """The fitted temperature T of the first component."""
        self._check_fitted()
        return math.exp(self._log_t)

    @property
    def weights(self) -> np.ndarray:
        """The fitted simplex weights (w_ts, w_uncalibrated, w_uniform), a copy."""
        self._check_fitted()
        return self._weights.copy()

    def _components(self, z: np.ndarray) -> np.ndarray:
        """(3, N, K): softmax(z/T), softmax(z), uniform."""
        k = z.shape[1]
        return np.stack([softmax(z / math.exp(self._log_t)), softmax(z), np.full(z.shape, 1.0 / k)])

    def _reset(self, z, y):
        self._log_t = 0.0
        self._weights = np.array([1.0, 0.0, 0.0])

    def _fit_with_coef(self, z, y, class_coef):
        problem = ScalarTemperatureProblem(z, y, self.objective, class_coef)
        bounds = self._bounds()
        info = _separable_fit(problem, bounds, fit_log_temperature(problem, bounds, self._log_t))
        self._log_t = info["log_t"]
        _warn_at_bound(self.name, info["at_bound"], self.t_min, self.t_max, z, y)
        components = self._components(z)

        objective_fn = self.objective.torch_objective(y, class_coef)
        components_t = torch.from_numpy(components)

        def fun(w: np.ndarray) -> tuple[float, np.ndarray]:
            return value_and_grad(
                lambda w_t: objective_fn(
                    torch.tensordot(w_t, components_t, dims=1).clamp_min(_TINY).log()
                ),
                w,
            )

        result = optimize.minimize(
            fun,
            self._weights,
            jac=True,
            method="SLSQP",
            bounds=[(0.0, 1.0)] * 3,
            constraints=[
                {"type": "eq", "fun": lambda w: np.sum(w) - 1.0, "jac": lambda w: np.ones(3)}
            ],
            tol=1e-12,
            options={"maxiter": 1000},
        )
        weights = np.clip(result.x, 0.0, 1.0)
        self._weights = weights / weights.sum()
        self.fit_info_ = {
            "temperature_fit": info,
            "weights_success": bool(result.success),
            "weights_message": str(result.message),
        }
        if not result.success:
            logger.warning("ets: SLSQP on the weights did not converge: %s", result.message)

    def _first_iteration(self, z, y, class_coef):
        # the released class-wise code runs the temperature optimiser first: its first step
        problem = ScalarTemperatureProblem(z, y, self.objective, class_coef)
        bounds = self._bounds()
        self._log_t = first_temperature_step(problem, self._log_t, bounds)

    def _is_degenerate(self, z, y):
        at_bound = self.fit_info_.get("temperature_fit", {}).get("at_bound")
        return at_bound == "lower" and is_separable(z, y)

    def _predict_log_proba(self, z):
        mixture = np.tensordot(self._weights, self._components(z), axes=1)
        mixture /= mixture.sum(axis=1, keepdims=True)
        return np.log(np.maximum(mixture, 1e-300))

    def _params(self):
        w = self._weights
        return {
            "temperature": math.exp(self._log_t),
            "weights": [float(v) for v in w],
            "w_ts": float(w[0]),
            "w_uncalibrated": float(w[1]),
            "w_uniform": float(w[2]),
            "at_bound": self.fit_info_.get("temperature_fit", {}).get("at_bound", ""),
        }


class ClassTemperatureScaling(_TemperatureCalibrator):
    r"""Class-based temperature scaling ``cts``: logit column k divided by its own T_k.

    .. math::

        p = \mathrm{softmax}(z_1 / T_1, \dots, z_K / T_K)

    Frenkel and Goldberger, "Network Calibration by Class-based Temperature Scaling", EUSIPCO
    2021; as defined by Jung et al. (ICML 2023, App. B Eq. 15) and their code
    (SeungjinJung/SCTL ``models/scaler.py``, ``class_based_temperature_scaler``: ``x / T`` with
    T of shape (K,), initialised to 1, NLL, torch L-BFGS): the temperature is indexed by the
    logit's class, not by the predicted class. This form reproduces Jung et al.'s Table 2 CTS
    rows (ECE 6.02 and 5.74 published, 5.95 and 5.68 here, with the same accuracy changes).
    Frenkel and Goldberger released no code that we know of; their abstract describes "an
    optimization method that finds the suitable temperature scaling for each class", which
    is not reproduced here. The K temperatures minimise the objective by L-BFGS-B on
    :math:`\log T_k` in [log t_min, log t_max] from T = 1 (the released code's start) with the
    gradient by torch autograd. NLL and ``ls`` are convex in the inverse temperatures, so the
    start does not matter for them; for the non-convex ``mse``, ``focal`` and ``sbece`` the best
    shared temperature (the TS solution) is used as the start when it is better, and the
    L-BFGS-B result is kept only if it improves on its start (``sbece`` is discontinuous here:
    the hits change when predictions do).

    Not rank preserving: dividing columns by different temperatures can change the argmax,
    so predictions (and accuracy) may change. Not invariant to a per-row shift of the logits
    either: on ``inputs="probs"`` it scales ``log p``, which differs from scaling the network's
    raw logits. Needs every class in the calibration set (a class without samples has no
    data to fit its temperature).

    Args: as :class:`TemperatureScaling` (``t_min``/``t_max`` bound every T_k).

    Raises:
        ValueError: if ``t_min`` >= ``t_max``; in ``fit`` if a class is missing (named).
    """

    name = "cts"
    rank_preserving = False

    @property
    def temperatures(self) -> np.ndarray:
        """The fitted (K,) temperatures, a copy."""
        self._check_fitted()
        return np.exp(self._log_t)

    def fit(self, logits: Any, labels: Any) -> "ClassTemperatureScaling":
        """Fit the K temperatures (see :meth:`Calibrator.fit`).

        Raises:
            ValueError: for invalid inputs or a class without samples (named).
        """
        z, y = self._prepare_fit(logits, labels)
        check_all_classes_present(y, z.shape[1], "cts")
        self._reset(z, y)
        self._fit_with_coef(z, y, None)
        self.degenerate = self._is_degenerate(z, y)
        self.n_classes_ = z.shape[1]
        return self

    def _value_and_grad(self, log_t, z, y, class_coef):
        return value_and_grad(temperature_scaled(z, y, self.objective, class_coef), log_t)

    def _reset(self, z, y):
        self._log_t = np.zeros(z.shape[1])

    def _value(self, log_t, z, y, class_coef) -> float:
        return self.objective.value(log_softmax(z * np.exp(-log_t)), y, class_coef)

    def _fit_with_coef(self, z, y, class_coef):
        lo, hi = self._bounds()
        start = np.clip(self._log_t, lo, hi)
        if not self.objective.convex_in_inverse_temperature:
            # non-convex objective: also try the best shared temperature (the TS solution)
            problem = ScalarTemperatureProblem(z, y, self.objective, class_coef)
            shared = fit_log_temperature(problem, (lo, hi), float(start.mean()))["log_t"]
            candidate = np.full(z.shape[1], shared)
            if self._value(candidate, z, y, class_coef) < self._value(start, z, y, class_coef):
                start = candidate
        result = optimize.minimize(
            self._value_and_grad,
            start,
            args=(z, y, class_coef),
            jac=True,
            method="L-BFGS-B",
            bounds=[(lo, hi)] * z.shape[1],
            # sbece is discontinuous in the temperatures of CTS: bound the line-search effort
            options={
                "maxiter": 1000 if self.objective.differentiable else 50,
                "ftol": 1e-15,
                "gtol": 1e-9,
            },
        )
        if self._value(result.x, z, y, class_coef) <= self._value(start, z, y, class_coef):
            self._log_t = result.x.copy()
        else:  # a line search that failed on a non-smooth objective (sbece): keep the start
            self._log_t = start.copy()
        if is_separable(z, y):  # no finite optimum where the common lower bound is no worse
            floor = np.full(z.shape[1], lo)
            if self._value(floor, z, y, class_coef) <= self._value(self._log_t, z, y, class_coef):
                self._log_t = floor
        lower = self._log_t - lo <= BOUND_TOL
        on_bound = lower | (hi - self._log_t <= BOUND_TOL)
        self.fit_info_ = {
            "success": bool(result.success),
            "message": str(result.message),
            "iterations": int(result.nit),
            "classes_at_bound": [int(k) for k in np.flatnonzero(on_bound)],
            "classes_at_lower_bound": [int(k) for k in np.flatnonzero(lower)],
        }
        if lower.any() and is_separable(z, y):
            classes = self.fit_info_["classes_at_lower_bound"]
            stop = f"the temperatures of classes {classes} stopped at t_min={self.t_min:g}"
            warnings.warn(degenerate_message("cts", stop), UserWarning, stacklevel=3)
        elif on_bound.any():
            warnings.warn(
                f"cts: the temperatures of classes {self.fit_info_['classes_at_bound']} hit "
                f"a bound ({self.t_min:g} or {self.t_max:g})",
                UserWarning,
                stacklevel=3,
            )

    def _first_iteration(self, z, y, class_coef):
        t = np.exp(self._log_t)
        grad_s = self._value_and_grad(self._log_t, z, y, class_coef)[1]
        t_new = first_step(t, grad_s / t)
        lo, hi = self._bounds()
        self._log_t = np.clip(np.log(np.maximum(t_new, 1e-12)), lo, hi)

    def _is_degenerate(self, z, y):
        return bool(self.fit_info_.get("classes_at_lower_bound")) and is_separable(z, y)

    def _predict_log_proba(self, z):
        return log_softmax(z * np.exp(-self._log_t))

    def _params(self):
        temperatures = np.exp(self._log_t)
        return {
            "temperatures": [float(t) for t in temperatures],
            "temperature_mean": float(temperatures.mean()),
            "classes_at_bound": self.fit_info_.get("classes_at_bound", []),
        }
