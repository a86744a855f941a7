r"""How the temperature calibrators fit their temperatures: one T, or its first step.

Temperatures are optimised as :math:`s = \log T` inside ``[log t_min, log t_max]`` in float64
NumPy with scipy. A single temperature (``ts``, ``ts_sbece``, the first stage of ``ets``) is
fitted by :func:`fit_log_temperature`:

* objectives convex in :math:`1/T` (``nll``, ``ls``): a safeguarded Newton iteration on
  :math:`dL/d\log T = 0` with the first and second derivatives by autograd, from T = 1 (or the
  warm start), run to convergence (:math:`|dL/d\log T| \le 10^{-10}`, typically 5-8
  evaluations), not a fixed number of steps; convexity in 1/T makes the root unique, so a
  bracket guards every step (L-BFGS-B needed about twice as many evaluations);
* ``mse`` and ``focal`` (not convex): L-BFGS-B on :math:`\log T` with the derivative by
  autograd (``gtol`` 1e-10, ``ftol`` 1e-15), started from the best point of a 25-point
  log-grid; where the objective is so flat that L-BFGS-B stops on ``ftol`` with
  :math:`|dL/d\log T| > 10^{-10}`, the Newton iteration above finishes the local minimum;
* ``sbece`` (non-convex, piecewise flat far from the data; also ``hbece`` under ``ts``): a
  61-point log-grid, then a bounded Brent search (``minimize_scalar``) between the grid
  neighbours of the best point (xatol 1e-7 in log T); no derivative is used.

``ts_hb_ece`` (hard-binned ECE, piecewise constant) searches a multi-resolution grid in log T
(:func:`multiresolution_log_temperature`). On a separable calibration set (100% accuracy) the
objectives but ``ls`` fall towards 0 as T -> 0 and the searches stop wherever the objective
has become numerically flat; :func:`lower_bound_if_no_worse` then moves the fit to ``t_min``,
the bound of the searched range (the temperature calibrators call it on separable sets only).
:func:`first_step` and
:func:`first_temperature_step` give torch L-BFGS's first iteration, the step whose class losses
the class-wise loss scaling reads (:mod:`raysearch.calibration.classwise`).

Derivatives (in :math:`\log T`, in the K temperatures of ``cts``, in the weights of ``ets``)
come from torch autograd in float64 through the objective's torch definition
(:mod:`raysearch.calibration._autograd`); none is written by hand. An evaluation with its
derivative costs a few passes over the (N, K) logits: on (50000, 100) logits and one CPU core
a Newton evaluation (value, first and second derivative) takes about 0.5 s, so ``nll`` fits
in a few seconds.
"""

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from scipy import optimize

from raysearch.calibration._autograd import value_and_derivatives, value_and_grad
from raysearch.calibration._checks import log_softmax
from raysearch.calibration.objectives import CalibrationObjective

__all__ = [
    "BOUND_TOL",
    "FIRST_STEP_LR",
    "ScalarTemperatureProblem",
    "first_step",
    "first_temperature_step",
    "fit_log_temperature",
    "lower_bound_if_no_worse",
    "multiresolution_log_temperature",
    "newton_log_temperature",
    "temperature_scaled",
]

#: Learning rate of the authors' L-BFGS (Jung et al., Sec. 5.3: 0.02); torch's first L-BFGS
#: iteration moves the parameters by lr * g / max(1, ||g||_1): that is the "first iteration"
#: whose class losses Eq. 6 of the class-wise scaling uses.
FIRST_STEP_LR = 0.02
_GRID_POINTS_NONCONVEX = 25
_GRID_POINTS_SBECE = 61
#: Distance in log T below which a fitted temperature counts as on its bound.
BOUND_TOL = 1e-6


def first_step(theta: np.ndarray, grad: np.ndarray, lr: float = FIRST_STEP_LR) -> np.ndarray:
    """torch.optim.LBFGS's first iteration: theta - lr * min(1, 1/||g||_1) * g."""
    norm = float(np.abs(grad).sum())
    return theta - lr * min(1.0, 1.0 / norm if norm > 0 else 1.0) * grad


def first_temperature_step(
    problem: "ScalarTemperatureProblem", log_t: float, bounds: tuple[float, float]
) -> float:
    """One torch-L-BFGS-like iteration on T itself (the released code's parameter).

    dL/dT = (dL/ds) / T; a central difference in T for objectives without a derivative.
    Returns the new log T, clipped into ``bounds``.
    """
    t = math.exp(log_t)
    if problem.objective.differentiable:
        d_t = problem.value_and_grad(log_t)[1] / t
    else:
        h = 1e-4 * t
        d_t = (problem.value(math.log(t + h)) - problem.value(math.log(t - h))) / (2 * h)
    t_new = float(first_step(np.array([t]), np.array([d_t]))[0])
    return min(max(math.log(max(t_new, 1e-12)), bounds[0]), bounds[1])


def temperature_scaled(
    z: np.ndarray,
    labels: np.ndarray,
    objective: CalibrationObjective,
    class_coef: np.ndarray | None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The objective of ``softmax(z / exp(s))`` as a torch function of s (for autograd).

    s is a 0-d tensor (one temperature, TS) or a (K,) tensor (one per logit column, CTS).
    """
    objective_fn = objective.torch_objective(labels, class_coef)
    z_t = torch.from_numpy(z)
    return lambda log_t: objective_fn(torch.log_softmax(z_t * torch.exp(-log_t), dim=1))


class ScalarTemperatureProblem:
    """Objective of softmax(z / T) as a function of s = log T, with derivatives in s.

    Values of objectives without a derivative come from :meth:`CalibrationObjective.value`;
    derivatives by torch autograd (:mod:`raysearch.calibration._autograd`).

    Args:
        z: (N, K) float64 logits.
        labels: (N,) labels.
        objective: the objective.
        class_coef: class coefficients or None (see objectives).
    """

    def __init__(
        self,
        z: np.ndarray,
        labels: np.ndarray,
        objective: CalibrationObjective,
        class_coef: np.ndarray | None,
    ) -> None:
        self.z = z
        self.labels = labels
        self.objective = objective
        self.class_coef = class_coef
        self._loss = temperature_scaled(z, labels, objective, class_coef)
        self.evaluations = 0
        self._last: tuple[float, tuple[float, float, float]] | None = None

    def evaluate(self, log_t: float, curvature: bool = False) -> tuple[float, float, float]:
        """Objective, d/ds and (if ``curvature``) d2/ds2 at s = log T (else NaN).

        The last point is remembered: asking again at the same s (the fit's final value and
        derivative) costs no pass over the logits.
        """
        if self._last is not None and self._last[0] == log_t and (
                not curvature or not math.isnan(self._last[1][2])):
            return self._last[1]
        self.evaluations += 1
        if curvature:
            out = value_and_derivatives(self._loss, log_t)
        else:
            value, grad = value_and_grad(self._loss, log_t)
            out = (value, float(grad), float("nan"))
        self._last = (log_t, out)
        return out

    def value_and_grad(self, log_t: float) -> tuple[float, float]:
        """Objective and d/ds at s = log T (:meth:`evaluate` without the curvature)."""
        value, grad, _ = self.evaluate(log_t)
        return value, grad

    def value(self, log_t: float) -> float:
        """Objective at s = log T from its value definition (no derivative)."""
        self.evaluations += 1
        log_p = log_softmax(self.z * math.exp(-log_t))
        return self.objective.value(log_p, self.labels, self.class_coef)


def newton_log_temperature(
    problem: ScalarTemperatureProblem, lo: float, hi: float, start: float
) -> float:
    """Safeguarded Newton iteration on dL/ds = 0 over [lo, hi] (objectives convex in 1/T).

    The first step uses the autograd curvature d2L/ds2, the later ones the secant of the last
    two gradients (superlinear, one backward pass each).

    Convexity in beta = exp(-s) makes the sign of dL/ds go from - to + once, so a bracket
    [a, b] of the minimiser is kept: Newton steps that leave it (or meet a non-positive
    curvature, L need not be convex in s) are replaced by a bound (first time) or bisection.
    Stops when |dL/ds| <= 1e-10, the bracket is shorter than 1e-12, the Newton step is below
    1e-14, or the minimiser lies beyond a bound (dL/ds still points outward there).
    """
    a, b = lo, hi
    a_seen = b_seen = False  # whether the sign of dL/ds is known at a / b
    s = min(max(start, lo), hi)
    _, g, h = problem.evaluate(s, curvature=True)
    for _ in range(200):
        s_prev, g_prev = s, g
        if g > 0:
            b, b_seen = s, True
        elif g < 0:
            a, a_seen = s, True
        if abs(g) <= 1e-10 or b - a <= 1e-12:
            break
        if (s >= hi and g < 0) or (s <= lo and g > 0):
            break  # the minimiser is beyond this bound
        step = s - g / h if h > 0 else float("nan")
        if not a < step < b:
            if g < 0 and not b_seen:
                step = hi
            elif g > 0 and not a_seen:
                step = lo
            else:
                step = 0.5 * (a + b)
        if abs(step - s) <= 1e-14:
            break
        s = step
        # later steps take the curvature from the last two gradients (a secant): one backward
        # pass per step instead of a double backward, and the bracket keeps it safe
        _, g, _ = problem.evaluate(s)
        h = (g - g_prev) / (s - s_prev)
    return s


def fit_log_temperature(
    problem: ScalarTemperatureProblem, bounds: tuple[float, float], start: float
) -> dict[str, Any]:
    """Minimise the scalar-temperature objective over s = log T in ``bounds``.

    Returns:
        ``{"log_t": s, "value": f(s), "grad": f'(s) (NaN without derivative),
        "evaluations": int, "method": str, "at_bound": "lower" | "upper" | ""}``.
    """
    lo, hi = bounds
    objective = problem.objective
    if not objective.differentiable:
        method = "grid+brent"
        grid = np.linspace(lo, hi, _GRID_POINTS_SBECE)
        values = np.array([problem.value(s) for s in grid])
        best = int(np.argmin(values))
        left, right = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
        result = optimize.minimize_scalar(
            problem.value, bounds=(left, right), method="bounded", options={"xatol": 1e-7}
        )
        log_t, value = float(result.x), float(result.fun)
        if values[best] < value:  # never worse than the grid
            log_t, value = float(grid[best]), float(values[best])
        grad = float("nan")
    elif objective.convex_in_inverse_temperature:
        method = "newton"
        log_t = newton_log_temperature(problem, lo, hi, start)
        value, grad = problem.value_and_grad(log_t)
    else:
        method = "grid+l-bfgs-b"
        grid = np.linspace(lo, hi, _GRID_POINTS_NONCONVEX)
        x0 = float(grid[int(np.argmin([problem.value(s) for s in grid]))])
        result = optimize.minimize(
            lambda x: _as_array_grad(problem.value_and_grad(float(x[0]))),
            np.array([x0]),
            jac=True,
            method="L-BFGS-B",
            bounds=[(lo, hi)],
            options={"maxiter": 200, "ftol": 1e-15, "gtol": 1e-10},
        )
        log_t = float(result.x[0])
        value, grad = problem.value_and_grad(log_t)
        if abs(grad) > 1e-10:
            # where the objective is flat L-BFGS-B can stop on ftol first: finish the local
            # minimum with the safeguarded Newton iteration (autograd curvature)
            near = (max(lo, log_t - 1e-6), min(hi, log_t + 1e-6))
            log_t = newton_log_temperature(problem, *near, log_t)
            value, grad = problem.value_and_grad(log_t)
    return _fit_result(problem, bounds, log_t, value, grad, method)


def _fit_result(
    problem: ScalarTemperatureProblem,
    bounds: tuple[float, float],
    log_t: float,
    value: float,
    grad: float,
    method: str,
) -> dict[str, Any]:
    """The ``fit_info_`` of a scalar-temperature fit (see :func:`fit_log_temperature`)."""
    at_bound = ""
    if log_t - bounds[0] <= BOUND_TOL:
        at_bound = "lower"
    elif bounds[1] - log_t <= BOUND_TOL:
        at_bound = "upper"
    return {
        "log_t": log_t,
        "value": value,
        "grad": grad,
        "evaluations": problem.evaluations,
        "method": method,
        "at_bound": at_bound,
    }


def lower_bound_if_no_worse(
    problem: ScalarTemperatureProblem, bounds: tuple[float, float], info: dict[str, Any]
) -> dict[str, Any]:
    """A scalar-temperature fit moved to the lower bound when the objective is no larger there.

    Where the objective has no finite optimum (a separable calibration set: it falls towards
    0 as T -> 0) a search stops where the objective is numerically flat, anywhere between
    ``bounds[0]`` and a few tenths. This puts such a fit on the lower bound, where the search
    would have gone with exact arithmetic: the objective's values (value definition, no
    derivative) at ``info["log_t"]`` and at ``bounds[0]`` are compared, two evaluations.

    Args:
        problem: the fitted problem.
        bounds: (log t_min, log t_max).
        info: the fit's result (:func:`fit_log_temperature`,
            :func:`multiresolution_log_temperature`).

    Returns:
        ``info`` unchanged where the bound is worse (a finite optimum, e.g. ``ls``) or already
        reached; else a copy with ``log_t`` = ``bounds[0]``, its value, ``at_bound`` ``"lower"``
        and the gradient there (NaN without derivative).
    """
    lo = bounds[0]
    if info["log_t"] - lo <= BOUND_TOL:
        return info
    if problem.value(lo) > problem.value(info["log_t"]):
        return info
    if problem.objective.differentiable:
        value, grad = problem.value_and_grad(lo)
    else:
        value, grad = problem.value(lo), float("nan")
    return {**info, "log_t": lo, "value": value, "grad": grad,
            "evaluations": problem.evaluations, "at_bound": "lower"}


def _as_array_grad(pair: tuple[float, float]) -> tuple[float, np.ndarray]:
    return pair[0], np.array([pair[1]])


def multiresolution_log_temperature(
    problem: ScalarTemperatureProblem,
    bounds: tuple[float, float],
    grid_points: int,
    levels: int,
) -> dict[str, Any]:
    """Multi-resolution grid search of s = log T in ``bounds`` (no derivative).

    Level 1 evaluates ``grid_points`` equally spaced s over ``bounds``; every next level
    evaluates ``grid_points`` equally spaced s over [best - h, best + h] (clipped to the
    bounds), h the spacing of the level before, so each level divides the spacing by
    (``grid_points`` - 1) / 2. Ties go to the smallest s. The best point over all levels wins.

    Returns:
        ``{"log_t", "value", "grad" (NaN), "evaluations", "method", "at_bound",
        "spacings": [h_1, ..., h_levels] in log T}``.
    """
    lo, hi = bounds
    left, right = lo, hi
    best_s, best_value = float("nan"), float("inf")
    spacings: list[float] = []
    for _ in range(levels):
        grid = np.linspace(left, right, grid_points)
        spacing = float(grid[1] - grid[0])
        spacings.append(spacing)
        values = np.array([problem.value(float(s)) for s in grid])
        index = int(np.argmin(values))
        if values[index] < best_value:
            best_s, best_value = float(grid[index]), float(values[index])
        left, right = max(best_s - spacing, lo), min(best_s + spacing, hi)
    info = _fit_result(problem, bounds, best_s, best_value, float("nan"), "multi-resolution grid")
    return {**info, "spacings": spacings}
