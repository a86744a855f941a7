r"""Dirichlet calibration with ODIR regularisation: ``dirichlet`` (Kull et al., NeurIPS 2019).

.. math::

    q = \mathrm{softmax}(W \ln p + b), \qquad W \in \mathbb{R}^{K \times K},\ b \in
    \mathbb{R}^K,

fitted by minimising the objective (NLL by default) on the calibration set plus the
Off-Diagonal and Intercept Regularisation (ODIR)

.. math::

    \lambda \frac{1}{K (K - 1)} \sum_{i \ne j} w_{ij}^2 + \mu \frac{1}{K} \sum_j b_j^2.

Kull, Perello-Nieto, Kängsepp, Silva Filho, Song and Flach, "Beyond temperature scaling:
Obtaining well-calibrated multiclass probabilities with Dirichlet calibration", NeurIPS 2019,
arXiv:1910.12656, Sec. 3 (the map and ODIR); released code dirichletcal/dirichlet_python
(``FullDirichletCalibrator``, ``MultinomialRegression``: identity start, mean log-loss, ODIR
normalised by K(K - 1) and K with ``reg_norm=True``). It is the "DirODIR" baseline of Jung et
al. (ICML 2023, Sec. 2.2) and the post-hoc Dirichlet calibration of Karandikar et al. (NeurIPS
2021, App. I, Table 5).

Choices, and where they differ from the released code:

* features: :math:`\ln p` with :math:`p = \mathrm{softmax}(z)`, i.e. ``log_softmax`` of the
  logits (of ``log max(p, 1e-12)`` with ``inputs="probs"``; the released code clips p at the
  float epsilon). The calibrator is therefore invariant to a per-row shift of the logits;
* parametrisation: the full (K, K) matrix and K intercepts, as the paper's map (the released
  code subtracts the last row, ``ref_row=True``; softmax ignores a vector added to every row
  of [W | b], so both describe the same maps, but ODIR then penalises the differences);
* start: W = I, b = 0, where :math:`q = \mathrm{softmax}(\ln p) = p`, the uncalibrated
  probabilities (the released ``initializer='identity'``);
* optimiser: scipy L-BFGS-B with the gradient by torch autograd in float64 (``max_iter``
  iterations, ``gtol`` 1e-7, ``ftol`` 1e-12) on standardised features (an exact change of
  variables), with ODIR taken at the best of the K + 1 parameter directions that leave the
  map unchanged (the result is that representative, the minimiser of the objective plus ODIR
  itself), for every K (the released code uses Newton steps for K <= 36 and L-BFGS-B above);
* λ and μ: Kull et al. choose them per data set by cross-validated log-loss on the
  calibration set over log-spaced grids; no single value is published. The defaults here are
  ``reg_lambda = reg_mu = 1e-2``, a mild penalty in the middle of such grids; sweep them
  (a post-hoc space) for the authors' protocol.

Not rank preserving: a general W can change the argmax (and so the accuracy).
"""

import logging
from typing import Any

import numpy as np
import torch
from scipy import optimize

from raysearch.calibration._autograd import value_and_grad
from raysearch.calibration._checks import log_softmax, validate_int, validate_number
from raysearch.calibration.base import Calibrator
from raysearch.calibration.objectives import CalibrationObjective
from raysearch.calibration.temperature_fit import first_step

__all__ = ["DirichletCalibration", "odir_penalty"]

logger = logging.getLogger(__name__)


def _odir(w: torch.Tensor, b: torch.Tensor, reg_lambda: float, reg_mu: float) -> torch.Tensor:
    """ODIR of (K, K) W and (K,) b as a 0-d tensor (:func:`odir_penalty`, differentiable)."""
    k = w.shape[0]
    off = w * (1.0 - torch.eye(k, dtype=w.dtype))
    return reg_lambda / (k * (k - 1)) * (off * off).sum() + reg_mu / k * (b @ b)


def odir_penalty(
    weights: Any, intercept: Any, reg_lambda: float, reg_mu: float
) -> tuple[float, np.ndarray, np.ndarray]:
    r"""ODIR of Kull et al. (NeurIPS 2019, Sec. 3) and its gradient (torch autograd).

    .. math::

        R(W, b) = \lambda \frac{1}{K (K - 1)} \sum_{i \ne j} w_{ij}^2
        + \mu \frac{1}{K} \sum_j b_j^2

    Args:
        weights: (K, K) float matrix W, K >= 2.
        intercept: (K,) float intercepts b.
        reg_lambda: λ >= 0, weight of the off-diagonal term.
        reg_mu: μ >= 0, weight of the intercept term.

    Returns:
        ``(R, dR/dW (K, K), dR/db (K,))`` in float64.

    Raises:
        ValueError: if ``weights`` is not (K, K) with K >= 2, ``intercept`` is not (K,), or
            ``reg_lambda``/``reg_mu`` is negative.
        TypeError: if ``reg_lambda``/``reg_mu`` is not a real number.
    """
    reg_lambda = validate_number("reg_lambda", reg_lambda, minimum=0.0)
    reg_mu = validate_number("reg_mu", reg_mu, minimum=0.0)
    w = np.asarray(weights, dtype=np.float64)
    b = np.asarray(intercept, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 2:
        raise ValueError(f"`weights` must be a (K, K) matrix with K >= 2, got shape {w.shape}")
    k = w.shape[0]
    if b.shape != (k,):
        raise ValueError(f"`intercept` must have shape ({k},) to match `weights`, got {b.shape}")
    value, grad = value_and_grad(
        lambda t: _odir(t[: k * k].reshape(k, k), t[k * k :], reg_lambda, reg_mu),
        np.concatenate([w.ravel(), b]),
    )
    return value, grad[: k * k].reshape(k, k), grad[k * k :]


def _representative(
    weights: torch.Tensor, intercept: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The (W + 1 v^T, b + c 1) of least ODIR; it gives the same map as (W, b).

    softmax ignores a vector added to every row of [W | b] (every output gains
    :math:`v^\top \ln p + c`). ODIR is smallest at :math:`v_j = -\mathrm{mean}_{i \ne j}
    w_{ij}` (every column's off-diagonal entries sum to 0) and :math:`c = -\mathrm{mean}_j b_j`.

    The fit minimises the objective plus the ODIR of this representative: both are unchanged
    along the K + 1 directions that leave the map unchanged, so L-BFGS-B never crawls along
    them (ODIR alone bends them only by λ / (K (K - 1)), a very ill-conditioned problem), and
    the minimiser's representative is the minimiser of the objective plus ODIR itself.
    Differentiable (torch).
    """
    k = weights.shape[0]
    off_sums = (weights * (1.0 - torch.eye(k, dtype=weights.dtype))).sum(dim=0)
    return weights - off_sums[None, :] / (k - 1), intercept - intercept.mean()


class DirichletCalibration(Calibrator):
    r"""Dirichlet calibration ``dirichlet`` (full matrix, ODIR): see the module docstring.

    :math:`q = \mathrm{softmax}(W \ln \mathrm{softmax}(z) + b)`; the objective (``nll`` by
    default, as Kull et al.) on the calibration set plus :func:`odir_penalty` is minimised by
    L-BFGS-B from W = I, b = 0. Any objective with a gradient works (``mse``, ``ls``,
    ``focal``, ``sbece`` by autograd); ``hbece`` has none and raises ``ValueError``.
    Class-wise loss scaling (Jung et al.) weights the objective, not the penalty.

    Args:
        objective (CalibrationObjective): the objective (``fit_calibrator`` default: ``nll``).
        inputs (str, optional): ``"logits"`` or ``"probs"``. Defaults to ``"logits"``.
        reg_lambda (float, optional): λ >= 0 of the off-diagonal term. Defaults to ``1e-2``.
        reg_mu (float, optional): μ >= 0 of the intercept term. Defaults to ``1e-2``.
        max_iter (int, optional): L-BFGS-B iterations >= 0; 0 keeps the identity start
            (the uncalibrated probabilities). Defaults to ``1000``.

    Shape:
        logits: (N, K) float; labels: (N,) int in [0, K). ``weights``: (K, K);
        ``intercept``: (K,).

    Raises:
        ValueError: if ``reg_lambda`` or ``reg_mu`` < 0 or ``max_iter`` < 0; for invalid
            inputs in ``fit`` and ``predict_proba``.
        TypeError: if ``reg_lambda``/``reg_mu`` is not a real number or ``max_iter`` not an
            integer.
    """

    name = "dirichlet"
    rank_preserving = False
    default_objective = "nll"

    def __init__(
        self,
        objective: CalibrationObjective,
        *,
        inputs: str = "logits",
        reg_lambda: float = 1e-2,
        reg_mu: float = 1e-2,
        max_iter: int = 1000,
    ) -> None:
        super().__init__(objective, inputs=inputs)
        self.reg_lambda = validate_number("reg_lambda", reg_lambda, minimum=0.0)
        self.reg_mu = validate_number("reg_mu", reg_mu, minimum=0.0)
        self.max_iter = validate_int("max_iter", max_iter, minimum=0)
        self._weights = np.zeros((0, 0))
        self._intercept = np.zeros(0)
        self.fit_info_: dict[str, Any] = {}

    @property
    def weights(self) -> np.ndarray:
        """The fitted (K, K) matrix W, a copy.

        Raises:
            RuntimeError: if called before ``fit``.
        """
        self._check_fitted()
        return self._weights.copy()

    @property
    def intercept(self) -> np.ndarray:
        """The fitted (K,) intercepts b, a copy (raises as :attr:`weights` before ``fit``)."""
        self._check_fitted()
        return self._intercept.copy()

    # ---------------------------------------------------------------- helpers

    def _standardisation(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Column means m and standard deviations s (1 where constant) of the features x."""
        mean = x.mean(axis=0)
        std = x.std(axis=0)
        return mean, np.where(std > 1e-12, std, 1.0)

    def _value_and_grad(
        self,
        theta: np.ndarray,
        x_std: np.ndarray,
        y: np.ndarray,
        class_coef: np.ndarray | None,
        mean: np.ndarray,
        std: np.ndarray,
    ) -> tuple[float, np.ndarray]:
        """Objective + ODIR of the representative, and its gradient (autograd) in theta.

        theta = (V.ravel(), c) acts on the standardised features x_std = (ln p - m) / s:
        V x_std + c = W ln p + b with W = V / s (column-wise) and b = c - W m. The same
        function of (W, b), better conditioned for L-BFGS-B (ln p of confident networks
        spans tens of nats). ODIR is that of the best representative (:func:`_representative`).
        """
        k = x_std.shape[1]
        objective_fn = self.objective.torch_objective(y, class_coef)
        x_t, mean_t, std_t = (torch.from_numpy(a) for a in (x_std, mean, std))

        def total(t: torch.Tensor) -> torch.Tensor:
            v, c = t[: k * k].reshape(k, k), t[k * k :]
            w = v / std_t[None, :]
            penalty = _odir(*_representative(w, c - w @ mean_t), self.reg_lambda, self.reg_mu)
            return objective_fn(torch.log_softmax(x_t @ v.T + c, dim=1)) + penalty

        return value_and_grad(total, theta)

    # ---------------------------------------------------------------- hooks

    def _reset(self, z, y):
        k = z.shape[1]
        self._weights = np.eye(k)
        self._intercept = np.zeros(k)

    def _fit_with_coef(self, z, y, class_coef):
        k = z.shape[1]
        x = log_softmax(z)
        mean, std = self._standardisation(x)
        x_std = (x - mean) / std
        # (W, b) -> standardised (V, c) = (W s, b + W m)
        start = np.concatenate(
            [(self._weights * std[None, :]).ravel(), self._intercept + self._weights @ mean]
        )
        args = (x_std, y, class_coef, mean, std)
        if self.max_iter == 0:
            self.fit_info_ = {
                "success": True,
                "message": "max_iter=0: the start is kept",
                "iterations": 0,
                "objective": self._value_and_grad(start, *args)[0],
            }
            return
        result = optimize.minimize(
            self._value_and_grad,
            start,
            args=args,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": self.max_iter, "ftol": 1e-12, "gtol": 1e-7},
        )
        v, c = result.x[: k * k].reshape(k, k), result.x[k * k :]
        weights = v / std[None, :]
        representative = _representative(
            torch.from_numpy(weights), torch.from_numpy(c - weights @ mean)
        )
        self._weights, self._intercept = (a.numpy() for a in representative)
        self.fit_info_ = {
            "success": bool(result.success),
            "message": str(result.message),
            "iterations": int(result.nit),
            "objective": float(result.fun),
        }
        if not result.success:
            logger.warning("dirichlet: L-BFGS-B stopped early: %s", result.message)

    def _first_iteration(self, z, y, class_coef):
        # one torch-L-BFGS-like step on (W, b) themselves, as the released class-wise code
        # steps its calibrator's own parameters
        k = z.shape[1]
        x = log_softmax(z)
        ones, zeros = np.ones(k), np.zeros(k)
        theta = np.concatenate([self._weights.ravel(), self._intercept])
        grad = self._value_and_grad(theta, x, y, class_coef, zeros, ones)[1]
        theta = first_step(theta, grad)
        self._weights = theta[: k * k].reshape(k, k).copy()
        self._intercept = theta[k * k :].copy()

    def _predict_log_proba(self, z):
        return log_softmax(log_softmax(z) @ self._weights.T + self._intercept)

    def _params(self):
        w = self._weights
        off = w[~np.eye(w.shape[0], dtype=bool)]
        return {
            "reg_lambda": self.reg_lambda,
            "reg_mu": self.reg_mu,
            "diagonal_mean": float(np.mean(np.diag(w))),
            "off_diagonal_rms": float(np.sqrt(np.mean(off * off))),
            "intercept_rms": float(np.sqrt(np.mean(self._intercept**2))),
            "fit_iterations": int(self.fit_info_.get("iterations", 0)),
            "fit_objective": float(self.fit_info_.get("objective", float("nan"))),
        }
