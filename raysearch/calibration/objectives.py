r"""Objectives minimised by the post-hoc calibrators: nll, mse, ls, focal, sbece and hbece.

Notation: for sample n with label y, calibrated probabilities :math:`p` (log :math:`\log p`),
one-hot :math:`Y`, K classes.

* ``nll``: :math:`\ell = -\log p_y` (Guo et al., ICML 2017, arXiv:1706.04599).
* ``mse``: the multi-class Brier score :math:`\ell = \sum_k (p_k - Y_k)^2`, i.e.
  :func:`raysearch.metrics.brier` per sample. Mix-n-Match's released ``mse_t``/``mse_w`` and
  PTS's Keras ``MeanSquaredError`` average over the N·K entries instead (our value / K): the
  same minimiser.
* ``ls`` (``epsilon``, default 0.05 as in Jung et al. Table 1): label-smoothed NLL with the
  smoothing spread over all K classes, :math:`\ell = -\sum_k q_k \log p_k`,
  :math:`q = (1-\epsilon) Y + \epsilon / K` (PyTorch's ``label_smoothing``; raysearch ``ls``).
* ``focal`` (``gamma``, default 3 as in Jung et al. Table 1): :math:`\ell = -(1 - p_y)^\gamma
  \log p_y` (Lin et al., ICCV 2017; Mukhoti et al., NeurIPS 2020).
* ``sbece`` (``n_bins=15``, ``sb_temperature=0.01``, ``p=2``, ``binning="bin"``): the
  soft-binned ECE of the top-1 confidence (Karandikar et al., "Soft Calibration Objectives for
  Neural Networks", NeurIPS 2021, arXiv:2108.00106, Eq. 11 ``"bin"`` and Eq. 12 ``"lb"``),
  computed by :func:`raysearch.losses.soft_calibration.soft_binned_ece` (torch, gradients) and a
  NumPy twin for values. Not a per-sample loss; TS fits it by a derivative-free search,
  CTS/ETS/PTS by autograd.
* ``hbece`` (``n_bins=15``, ``binning="equal_mass"``, ``norm="l2"``): the hard-binned ECE of
  the top-1 confidence, :func:`raysearch.metrics.ece` (Karandikar et al., Eq. 6 and App. C,
  the objective of TS-HB-ECE). No gradient: fitted by search only (``ts_hb_ece``, ``ts``).

Reductions: with ``class_coef=None`` a per-sample objective is the mean over the N samples and
``sbece`` is computed on all samples. With ``class_coef`` = c (K,), every objective is the
class-weighted total :math:`\sum_i c_i L_i`, where :math:`L_i` is the mean of :math:`\ell` over
the samples labelled i (``sbece``: the SB-ECE of those samples); classes without samples are
skipped. :meth:`CalibrationObjective.class_losses` returns the K values :math:`L_i` (Jung et al.,
Eq. 3, as a per-class mean; see :mod:`raysearch.calibration.classwise`).

Each per-sample objective carries analytic NumPy gradients with respect to the logits (softmax
chain rule, for CTS), the probabilities (for ETS's weights) and the inverse temperature of a
scalar temperature (for TS, from row statistics only), plus a torch version (for PTS); the
tests check them against torch autograd.
"""

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from raysearch.calibration._checks import (
    log_softmax,
    validate_choice,
    validate_int,
    validate_number,
)
from raysearch.losses.soft_calibration import soft_binned_ece
from raysearch.metrics import BINNINGS as HB_BINNINGS
from raysearch.metrics import NORMS as HB_NORMS
from raysearch.metrics import _ece as _metrics_ece

__all__ = [
    "OBJECTIVES",
    "CalibrationObjective",
    "Focal",
    "HardBinnedECE",
    "LabelSmoothedNLL",
    "MeanSquaredError",
    "NegativeLogLikelihood",
    "SoftBinnedECE",
    "TemperatureStats",
    "build_objective",
    "objective_parameters",
]

#: Floor on probabilities before a logarithm or a division.
_TINY = 1e-300
#: Soft-bin mass below which a bin counts as empty (as in raysearch.losses.soft_calibration).
_EMPTY_BIN = 1e-12
#: Binnings of SB-ECE: Eq. 11 (``"bin"``) and Eq. 12 (``"lb"``, label-binned).
SB_BINNINGS = ("bin", "lb")


@dataclass
class TemperatureStats:
    r"""Row statistics of :math:`p = \mathrm{softmax}(\beta z_s)` for a scalar temperature.

    ``z_s`` are the logits shifted so that every row's maximum is 0, and
    :math:`\beta = 1/T`; with :math:`e = \exp(\beta z_s)` and :math:`S_0 = \sum_k e_k`:

    Attributes:
        beta: inverse temperature.
        log_s0: (N,) :math:`\log S_0` (>= 0, the top logit contributes 1).
        mean_z: (N,) :math:`E_p[z_s] = \sum_k e_k z_{s,k} / S_0`.
        z_true: (N,) :math:`z_{s,y}`.
        z_avg: (N,) :math:`\frac{1}{K}\sum_k z_{s,k}`.
        correct: (N,) bool, argmax (first on ties) equals the label.
        sum_p2: (N,) :math:`\sum_k p_k^2` or None when not needed.
        sum_p2_z: (N,) :math:`\sum_k p_k^2 z_{s,k}` or None.
        mean_z2: (N,) :math:`E_p[z_s^2]` or None (for the curvature of ``nll``/``ls``).
    """

    beta: float
    log_s0: np.ndarray
    mean_z: np.ndarray
    z_true: np.ndarray
    z_avg: np.ndarray
    correct: np.ndarray
    sum_p2: np.ndarray | None = None
    sum_p2_z: np.ndarray | None = None
    mean_z2: np.ndarray | None = None

    @property
    def log_p_true(self) -> np.ndarray:
        """(N,) log-probability of the label."""
        return self.beta * self.z_true - self.log_s0

    @property
    def confidence(self) -> np.ndarray:
        """(N,) top-1 probability, 1 / S_0 (the top shifted logit is 0)."""
        return np.exp(-self.log_s0)


def _class_counts(labels: np.ndarray, n_classes: int) -> np.ndarray:
    return np.bincount(labels, minlength=n_classes)


def _sample_weights(labels: np.ndarray, class_coef: np.ndarray | None) -> np.ndarray:
    """Weights v_n with sum_n v_n l_n = the objective's reduction (module docstring).

    None: v_n = 1/N. Class coefficients c (K,): v_n = c_{y_n} / |D_{y_n}|.
    """
    n = labels.shape[0]
    if class_coef is None:
        return np.full(n, 1.0 / n)
    n_classes = int(np.shape(class_coef)[0])
    counts = _class_counts(labels, n_classes)
    per_class = np.divide(
        np.asarray(class_coef, dtype=np.float64),
        counts,
        out=np.zeros(n_classes),
        where=counts > 0,
    )
    return per_class[labels]


class CalibrationObjective:
    """Base class of the calibration objectives (see the module docstring for reductions).

    Class attributes:
        name: registry name of the objective.
        differentiable: whether TS gets an analytic derivative (else a derivative-free search).
        convex_in_inverse_temperature: whether the TS objective is convex in 1/T (one minimum:
            TS then skips the coarse grid).
        needs_squares: whether :class:`TemperatureStats` must carry the squared terms.
        has_temperature_curvature: whether :meth:`temperature_curvature` is implemented (TS
            then runs a safeguarded Newton iteration).
    """

    name: ClassVar[str] = ""
    differentiable: ClassVar[bool] = True
    convex_in_inverse_temperature: ClassVar[bool] = False
    needs_squares: ClassVar[bool] = False
    has_temperature_curvature: ClassVar[bool] = False

    @property
    def params(self) -> dict[str, Any]:
        """Hyperparameters of the objective (for logging)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"

    # Values ------------------------------------------------------------------------------

    def class_losses(self, log_p: np.ndarray, labels: np.ndarray, n_classes: int) -> np.ndarray:
        """Per-class objective L_i (mean over the samples of class i; NaN for empty classes).

        Args:
            log_p: (N, K) log-probabilities.
            labels: (N,) labels in [0, K).
            n_classes: K.

        Returns:
            (K,) float64.
        """
        raise NotImplementedError

    def value(
        self, log_p: np.ndarray, labels: np.ndarray, class_coef: np.ndarray | None = None
    ) -> float:
        """The objective of log-probabilities (N, K), reduced as in the module docstring."""
        raise NotImplementedError

    # Gradients ---------------------------------------------------------------------------

    def value_and_grad_logits(
        self, z: np.ndarray, labels: np.ndarray, class_coef: np.ndarray | None = None
    ) -> tuple[float, np.ndarray]:
        """Objective of ``softmax(z)`` and its gradient with respect to the logits ``z``."""
        raise NotImplementedError

    def value_and_grad_probs(
        self, p: np.ndarray, labels: np.ndarray, class_coef: np.ndarray | None = None
    ) -> tuple[float, np.ndarray]:
        """Objective of probabilities ``p`` (N, K) and its gradient with respect to ``p``."""
        raise NotImplementedError

    def temperature_value_and_grad(
        self, stats: TemperatureStats, labels: np.ndarray, class_coef: np.ndarray | None
    ) -> tuple[float, float]:
        """Objective of ``softmax(beta * z_s)`` and its derivative in beta (NaN if none)."""
        raise NotImplementedError

    def temperature_curvature(
        self, stats: TemperatureStats, labels: np.ndarray, class_coef: np.ndarray | None
    ) -> float:
        """Second derivative of the objective of ``softmax(beta * z_s)`` in beta."""
        raise NotImplementedError

    # Torch -------------------------------------------------------------------------------

    def torch_class_losses(
        self, log_p: torch.Tensor, labels: torch.Tensor, n_classes: int
    ) -> torch.Tensor:
        """Differentiable per-class objective L_i, (K,) (0 for empty classes)."""
        raise NotImplementedError

    def torch_value(
        self,
        log_p: torch.Tensor,
        labels: torch.Tensor,
        class_coef: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Differentiable objective of log-probabilities (N, K), a scalar tensor."""
        raise NotImplementedError


class _PerSampleObjective(CalibrationObjective):
    """An objective that is a mean of per-sample losses l(p_n, y_n)."""

    # Subclass API: per-sample values and analytic gradients.
    def per_sample(self, log_p: np.ndarray, p: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(N,) losses."""
        raise NotImplementedError

    def grad_logits(self, log_p: np.ndarray, p: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(N, K) d l_n / d z_n for p = softmax(z); may overwrite ``p``."""
        raise NotImplementedError

    def grad_probs(self, log_p: np.ndarray, p: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(N, K) d l_n / d p_n."""
        raise NotImplementedError

    def temperature_terms(self, stats: TemperatureStats) -> tuple[np.ndarray, np.ndarray]:
        """(N,) losses and (N,) derivatives in beta, from row statistics."""
        raise NotImplementedError

    def torch_per_sample(self, log_p: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(N,) differentiable losses."""
        raise NotImplementedError

    # Reductions.
    def class_losses(self, log_p: np.ndarray, labels: np.ndarray, n_classes: int) -> np.ndarray:  # noqa: D102
        losses = self.per_sample(log_p, np.exp(log_p), labels)
        counts = _class_counts(labels, n_classes)
        sums = np.bincount(labels, weights=losses, minlength=n_classes)
        return np.divide(sums, counts, out=np.full(n_classes, np.nan), where=counts > 0)

    def value(self, log_p, labels, class_coef=None):  # noqa: D102
        weights = _sample_weights(labels, class_coef)
        return float(weights @ self.per_sample(log_p, np.exp(log_p), labels))

    def value_and_grad_logits(self, z, labels, class_coef=None):  # noqa: D102
        log_p = log_softmax(z)
        p = np.exp(log_p)
        weights = _sample_weights(labels, class_coef)
        value = float(weights @ self.per_sample(log_p, p, labels))
        grad = self.grad_logits(log_p, p, labels)
        grad *= weights[:, None]
        return value, grad

    def value_and_grad_probs(self, p, labels, class_coef=None):  # noqa: D102
        p = np.maximum(p, _TINY)
        log_p = np.log(p)
        weights = _sample_weights(labels, class_coef)
        value = float(weights @ self.per_sample(log_p, p, labels))
        grad = self.grad_probs(log_p, p, labels)
        grad *= weights[:, None]
        return value, grad

    def temperature_value_and_grad(self, stats, labels, class_coef):  # noqa: D102
        losses, derivatives = self.temperature_terms(stats)
        weights = _sample_weights(labels, class_coef)
        return float(weights @ losses), float(weights @ derivatives)

    def temperature_curvature(self, stats, labels, class_coef):  # noqa: D102
        # nll and ls: d2/dbeta2 log S0 = Var_p[z_s] (the other terms are linear in beta)
        if not self.has_temperature_curvature:
            raise NotImplementedError(f"{self.name} has no analytic curvature")
        variance = np.maximum(stats.mean_z2 - stats.mean_z**2, 0.0)
        return float(_sample_weights(labels, class_coef) @ variance)

    def torch_class_losses(self, log_p, labels, n_classes):  # noqa: D102
        losses = self.torch_per_sample(log_p, labels)
        sums = torch.zeros(n_classes, dtype=losses.dtype).index_add(0, labels, losses)
        counts = torch.bincount(labels, minlength=n_classes).to(losses.dtype)
        return sums / counts.clamp_min(1.0)

    def torch_value(self, log_p, labels, class_coef=None):  # noqa: D102
        if class_coef is None:
            return self.torch_per_sample(log_p, labels).mean()
        return (class_coef * self.torch_class_losses(log_p, labels, log_p.shape[1])).sum()


def _rows(labels: np.ndarray) -> np.ndarray:
    return np.arange(labels.shape[0])


class NegativeLogLikelihood(_PerSampleObjective):
    r"""Negative log-likelihood :math:`-\log p_y` (``nll``), the default of every calibrator.

    Convex in the inverse temperature of TS (and in the inverse temperatures of CTS).
    """

    name = "nll"
    convex_in_inverse_temperature = True
    has_temperature_curvature = True

    def per_sample(self, log_p, p, labels):  # noqa: D102
        return -log_p[_rows(labels), labels]

    def grad_logits(self, log_p, p, labels):  # noqa: D102
        # d/dz_j (-log p_y) = p_j - Y_j
        p[_rows(labels), labels] -= 1.0
        return p

    def grad_probs(self, log_p, p, labels):  # noqa: D102
        grad = np.zeros_like(p)
        grad[_rows(labels), labels] = -1.0 / p[_rows(labels), labels]
        return grad

    def temperature_terms(self, stats):  # noqa: D102
        # l = log S0 - beta z_y;  dl/dbeta = E_p[z] - z_y
        return -stats.log_p_true, stats.mean_z - stats.z_true

    def torch_per_sample(self, log_p, labels):  # noqa: D102
        return -log_p.gather(1, labels[:, None])[:, 0]


class LabelSmoothedNLL(_PerSampleObjective):
    r"""Label-smoothed NLL :math:`-\sum_k q_k \log p_k`, :math:`q = (1-\epsilon)Y + \epsilon/K`.

    The ``ls`` baseline of Jung et al. (ICML 2023, Table 1; their released code uses PyTorch's
    ``label_smoothing=0.05``). Convex in the inverse temperature.

    Args:
        epsilon (float, optional): smoothing weight in [0, 1). ``epsilon=0`` is ``nll``.
            Defaults to ``0.05``.

    Raises:
        ValueError: if ``epsilon`` is outside [0, 1).
    """

    name = "ls"
    convex_in_inverse_temperature = True
    has_temperature_curvature = True

    def __init__(self, epsilon: float = 0.05) -> None:
        self.epsilon = validate_number("epsilon", epsilon, minimum=0.0, maximum=1.0)
        if self.epsilon == 1.0:
            raise ValueError(f"`epsilon` must be >= 0 and < 1, got {epsilon}")

    @property
    def params(self):  # noqa: D102
        return {"epsilon": self.epsilon}

    def per_sample(self, log_p, p, labels):  # noqa: D102
        eps = self.epsilon
        return -(1.0 - eps) * log_p[_rows(labels), labels] - eps * log_p.mean(axis=1)

    def grad_logits(self, log_p, p, labels):  # noqa: D102
        # d/dz_j = p_j - q_j
        p -= self.epsilon / p.shape[1]
        p[_rows(labels), labels] -= 1.0 - self.epsilon
        return p

    def grad_probs(self, log_p, p, labels):  # noqa: D102
        grad = -(self.epsilon / p.shape[1]) / p
        grad[_rows(labels), labels] -= (1.0 - self.epsilon) / p[_rows(labels), labels]
        return grad

    def temperature_terms(self, stats):  # noqa: D102
        # l = log S0 - beta * sum_k q_k z_k;  dl/dbeta = E_p[z] - sum_k q_k z_k
        target = (1.0 - self.epsilon) * stats.z_true + self.epsilon * stats.z_avg
        return stats.log_s0 - stats.beta * target, stats.mean_z - target

    def torch_per_sample(self, log_p, labels):  # noqa: D102
        eps = self.epsilon
        return -(1.0 - eps) * log_p.gather(1, labels[:, None])[:, 0] - eps * log_p.mean(dim=1)


class Focal(_PerSampleObjective):
    r"""Focal loss :math:`-(1 - p_y)^\gamma \log p_y` (``focal``).

    The ``fl`` baseline of Jung et al. (ICML 2023, Table 1, gamma = 3). ``gamma=0`` is ``nll``.
    Not convex in the inverse temperature: TS starts from the best point of a coarse grid.

    Args:
        gamma (float, optional): focusing parameter >= 0. Defaults to ``3.0``.

    Raises:
        ValueError: if ``gamma`` < 0.
    """

    name = "focal"

    def __init__(self, gamma: float = 3.0) -> None:
        self.gamma = validate_number("gamma", gamma, minimum=0.0)

    @property
    def params(self):  # noqa: D102
        return {"gamma": self.gamma}

    def _terms(self, log_p_true: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Loss, a = d l / d log p_y, and u^gamma, from log p_y."""
        u = -np.expm1(log_p_true)  # 1 - p_y, accurate near p_y = 1
        u_gamma = u**self.gamma
        # r = log(p_y) / (1 - p_y) -> -1 as p_y -> 1
        r = np.where(u > 1e-12, log_p_true / np.maximum(u, _TINY), -1.0 - 0.5 * u)
        p_true = np.exp(log_p_true)
        # d l / d log p_y = gamma u^(gamma-1) p_y log p_y - u^gamma
        a = u_gamma * (self.gamma * p_true * r - 1.0)
        return -u_gamma * log_p_true, a, u_gamma

    def per_sample(self, log_p, p, labels):  # noqa: D102
        return self._terms(log_p[_rows(labels), labels])[0]

    def grad_logits(self, log_p, p, labels):  # noqa: D102
        # d l/dz_j = a (Y_j - p_j), a = d l / d log p_y
        a = self._terms(log_p[_rows(labels), labels])[1]
        p *= -a[:, None]
        p[_rows(labels), labels] += a
        return p

    def grad_probs(self, log_p, p, labels):  # noqa: D102
        a = self._terms(log_p[_rows(labels), labels])[1]
        grad = np.zeros_like(p)
        grad[_rows(labels), labels] = a / p[_rows(labels), labels]
        return grad

    def temperature_terms(self, stats):  # noqa: D102
        # d log p_y / d beta = z_y - E_p[z]
        losses, a, _ = self._terms(stats.log_p_true)
        return losses, a * (stats.z_true - stats.mean_z)

    def torch_per_sample(self, log_p, labels):  # noqa: D102
        log_p_true = log_p.gather(1, labels[:, None])[:, 0]
        u = -torch.expm1(log_p_true)
        # the clamp keeps the gradient of u**gamma finite (0) where p_y == 1 exactly
        return -(u.clamp_min(_TINY) ** self.gamma) * log_p_true


class MeanSquaredError(_PerSampleObjective):
    r"""Brier score :math:`\sum_k (p_k - Y_k)^2` per sample (``mse``).

    Mix-n-Match's ``ets_calibrate`` fits T and the weights with it; Tomani et al.'s PTS code
    trains with it (both as a mean over N·K entries: same minimiser), so it is the default
    objective of ``ets`` and ``pts``. Not convex in 1/T.
    """

    name = "mse"
    needs_squares = True

    def per_sample(self, log_p, p, labels):  # noqa: D102
        squares = np.einsum("ij,ij->i", p, p)
        return np.maximum(squares - 2.0 * p[_rows(labels), labels] + 1.0, 0.0)

    def grad_logits(self, log_p, p, labels):  # noqa: D102
        # h = 2 (p - Y), H = <h, p> = 2 (sum p^2 - p_y);  d l/dz_j = p_j (h_j - H)
        rows = _rows(labels)
        p_true = p[rows, labels].copy()
        big_h = 2.0 * (np.einsum("ij,ij->i", p, p) - p_true)
        grad = p * (2.0 * p - big_h[:, None])
        grad[rows, labels] -= 2.0 * p_true
        return grad

    def grad_probs(self, log_p, p, labels):  # noqa: D102
        grad = 2.0 * p
        grad[_rows(labels), labels] -= 2.0
        return grad

    def temperature_terms(self, stats):  # noqa: D102
        p_true = np.exp(stats.log_p_true)
        losses = np.maximum(stats.sum_p2 - 2.0 * p_true + 1.0, 0.0)
        # dl/dbeta = sum_j G_j z_j = 2 (sum p^2 z - p_y z_y) - 2 (sum p^2 - p_y) E_p[z]
        derivatives = (
            2.0 * (stats.sum_p2_z - p_true * stats.z_true)
            - 2.0 * (stats.sum_p2 - p_true) * stats.mean_z
        )
        return losses, derivatives

    def torch_per_sample(self, log_p, labels):  # noqa: D102
        p = log_p.exp()
        p_true = p.gather(1, labels[:, None])[:, 0]
        return (p * p).sum(dim=1) - 2.0 * p_true + 1.0


def _sbece_centers(n_bins: int) -> np.ndarray:
    return (np.arange(n_bins, dtype=np.float64) + 0.5) / n_bins


def _grouped_sbece_numpy(
    confidences: np.ndarray,
    correct: np.ndarray,
    groups: np.ndarray,
    n_groups: int,
    n_bins: int,
    temperature: float,
    p: float,
    binning: str,
) -> np.ndarray:
    """SB-ECE of every group of samples at once in NumPy, (G,) (0 for empty groups).

    A value-only twin of :func:`raysearch.losses.soft_calibration.soft_binned_ece` (the tests
    check that they agree): the derivative-free TS search evaluates SB-ECE ~80 times, and
    per-class values for the class-wise scaling come out in one vectorised pass instead of K
    small torch calls (which crawl on a busy two-core machine).
    """
    c = confidences
    a = correct.astype(np.float64)
    scores = -((c[:, None] - _sbece_centers(n_bins)[None, :]) ** 2) / temperature
    scores -= scores.max(axis=1, keepdims=True)
    u = np.exp(scores)
    u /= u.sum(axis=1, keepdims=True)  # (N, M) soft memberships
    slots = (groups[:, None] * n_bins + np.arange(n_bins)[None, :]).ravel()
    size = n_groups * n_bins

    def group_sum(values: np.ndarray) -> np.ndarray:
        total = np.bincount(slots, weights=values.ravel(), minlength=size)
        return total.reshape(n_groups, n_bins)

    sizes = group_sum(u)
    filled = sizes > _EMPTY_BIN  # as soft_binned_ece: a near-empty bin contributes 0
    safe = np.where(filled, sizes, 1.0)
    counts = np.maximum(np.bincount(groups, minlength=n_groups), 1)
    if binning == "bin":
        gaps = group_sum(u * (a - c)[:, None])  # S_j (A_j - C_j)
        terms = np.where(filled, safe * (np.abs(gaps) / safe) ** p, 0.0)
        total = terms.sum(axis=1) / counts
    else:
        acc_bins = np.where(filled, group_sum(u * a[:, None]) / safe, 0.0)
        per_sample = (u * np.abs(acc_bins[groups] - c[:, None]) ** p).sum(axis=1)
        total = np.bincount(groups, weights=per_sample, minlength=n_groups) / counts
    return np.maximum(total, 0.0) ** (1.0 / p)


def _per_class_sbece_torch(
    confidences: torch.Tensor,
    correct: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    settings: tuple[int, float, float, str],
) -> torch.Tensor:
    """SB-ECE of each class's samples (:func:`soft_binned_ece`), (K,), 0 for empty classes."""
    values = []
    for k in range(n_classes):
        mask = labels == k
        if bool(mask.any()):
            values.append(soft_binned_ece(confidences[mask], correct[mask], *settings))
        else:
            values.append(confidences.new_zeros(()))
    return torch.stack(values)


class SoftBinnedECE(CalibrationObjective):
    r"""Soft-binned ECE of the top-1 confidence (``sbece``; TS-SB-ECE of Karandikar et al.).

    Not a mean of per-sample losses: with ``class_coef`` the total is
    :math:`\sum_i c_i \mathrm{SBECE}(D_i)`, the SB-ECE of each class's samples. The hits
    :math:`a_i` (argmax equals label) carry no gradient. The TS objective is non-convex in T:
    TS fits it by a coarse log-grid and a bounded Brent refinement (no derivative). Values are
    computed in NumPy, gradients (CTS, ETS weights, PTS) with torch autograd.

    Args:
        n_bins (int, optional): number of soft bins M >= 1. Defaults to ``15``.
        sb_temperature (float, optional): soft-binning temperature > 0. Defaults to ``0.01``.
        p (float, optional): norm order >= 1. Defaults to ``2``.
        binning (str, optional): ``"bin"`` (Eq. 11) or ``"lb"`` (Eq. 12). Defaults to
            ``"bin"``.

    Raises:
        TypeError: if ``n_bins`` is not an integer.
        ValueError: if a parameter is out of range or ``binning`` unknown.
    """

    name = "sbece"
    differentiable = False

    def __init__(
        self,
        n_bins: int = 15,
        sb_temperature: float = 0.01,
        p: float = 2.0,
        binning: str = "bin",
    ) -> None:
        self.n_bins = validate_int("n_bins", n_bins, minimum=1)
        self.sb_temperature = validate_number(
            "sb_temperature", sb_temperature, minimum=0.0, minimum_inclusive=False
        )
        self.p = validate_number("p", p, minimum=1.0)
        self.binning = validate_choice("binning", binning, SB_BINNINGS)

    @property
    def params(self):  # noqa: D102
        return {
            "n_bins": self.n_bins,
            "sb_temperature": self.sb_temperature,
            "p": self.p,
            "binning": self.binning,
        }

    def _settings(self) -> tuple[int, float, float, str]:
        return self.n_bins, self.sb_temperature, self.p, self.binning

    # NumPy values ------------------------------------------------------------------------

    def _values_numpy(
        self,
        confidences: np.ndarray,
        correct: np.ndarray,
        labels: np.ndarray,
        class_coef: np.ndarray | None,
    ) -> float:
        if class_coef is None:
            groups = np.zeros(labels.shape[0], dtype=np.intp)
            return float(
                _grouped_sbece_numpy(confidences, correct, groups, 1, *self._settings())[0]
            )
        k = int(np.shape(class_coef)[0])
        per_class = _grouped_sbece_numpy(confidences, correct, labels, k, *self._settings())
        present = _class_counts(labels, k) > 0
        return float(np.asarray(class_coef, dtype=np.float64)[present] @ per_class[present])

    @staticmethod
    def _top1_numpy(log_p: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = log_p.argmax(axis=1)
        return np.exp(log_p[np.arange(labels.shape[0]), index]), index == labels

    def class_losses(self, log_p, labels, n_classes):  # noqa: D102
        conf, hits = self._top1_numpy(log_p, labels)
        losses = _grouped_sbece_numpy(conf, hits, labels, n_classes, *self._settings())
        losses[_class_counts(labels, n_classes) == 0] = np.nan
        return losses

    def value(self, log_p, labels, class_coef=None):  # noqa: D102
        conf, hits = self._top1_numpy(log_p, labels)
        return self._values_numpy(conf, hits, labels, class_coef)

    def temperature_value_and_grad(self, stats, labels, class_coef):  # noqa: D102
        value = self._values_numpy(stats.confidence, stats.correct, labels, class_coef)
        return value, float("nan")

    # Torch (gradients) -------------------------------------------------------------------

    @staticmethod
    def _top1(log_p: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, index = log_p.max(dim=1)
        return top.exp(), index == labels

    def torch_class_losses(self, log_p, labels, n_classes):  # noqa: D102
        conf, hits = self._top1(log_p, labels)
        return _per_class_sbece_torch(conf, hits, labels, n_classes, self._settings())

    def torch_value(self, log_p, labels, class_coef=None):  # noqa: D102
        if class_coef is None:
            conf, hits = self._top1(log_p, labels)
            return soft_binned_ece(conf, hits, *self._settings())
        per_class = self.torch_class_losses(log_p, labels, int(class_coef.shape[0]))
        present = torch.bincount(labels, minlength=int(class_coef.shape[0])) > 0
        return (class_coef[present] * per_class[present]).sum()

    def _autograd(self, scores: np.ndarray, labels, class_coef, from_logits: bool):
        x = torch.tensor(scores, dtype=torch.float64, requires_grad=True)
        log_p = torch.log_softmax(x, dim=1) if from_logits else x.clamp_min(_TINY).log()
        coef = None if class_coef is None else torch.as_tensor(class_coef, dtype=torch.float64)
        total = self.torch_value(log_p, torch.from_numpy(labels.astype(np.int64)), coef)
        (grad,) = torch.autograd.grad(total, x)
        return total.item(), grad.numpy()

    def value_and_grad_logits(self, z, labels, class_coef=None):  # noqa: D102
        return self._autograd(z, labels, class_coef, from_logits=True)

    def value_and_grad_probs(self, p, labels, class_coef=None):  # noqa: D102
        return self._autograd(p, labels, class_coef, from_logits=False)


class HardBinnedECE(CalibrationObjective):
    r"""Hard-binned ECE of the top-1 confidence (``hbece``; the objective of TS-HB-ECE).

    :math:`\mathrm{ECE}_{\mathrm{bin},p}` of Karandikar et al., "Soft Calibration Objectives
    for Neural Networks", NeurIPS 2021, arXiv:2108.00106, Eq. 6, computed by the binning of
    :func:`raysearch.metrics.ece` (``binning``, ``norm``; one shared helper, so the fitted
    value equals ``ece(probs, labels, n_bins, binning, norm)``). The defaults are the ECE of
    that paper's tables (Sec. 5.1 and Tables 1, 2, 5: "l2 norm equal-mass ECE with 15 bins").
    A fraction in [0, 1]. Piecewise constant in the probabilities: it has no gradient, so only
    a search fits it (``ts_hb_ece``, App. C; ``ts`` uses its grid and Brent search); the
    calibrators that need a gradient (``cts``, ``ets``, ``pts``, ``dirichlet``) raise
    ``ValueError``. With ``class_coef`` the total is :math:`\sum_i c_i \mathrm{ECE}(D_i)`,
    the ECE of each class's samples.

    Args:
        n_bins (int, optional): number of bins M >= 1. Defaults to ``15``.
        binning (str, optional): ``"equal_mass"`` or ``"equal_width"``. Defaults to
            ``"equal_mass"``.
        norm (str, optional): ``"l2"``, ``"l1"`` or ``"max"``. Defaults to ``"l2"``.

    Raises:
        TypeError: if ``n_bins`` is not an integer.
        ValueError: if ``n_bins`` < 1 or ``binning``/``norm`` is unknown.
    """

    name = "hbece"
    differentiable = False

    def __init__(self, n_bins: int = 15, binning: str = "equal_mass", norm: str = "l2") -> None:
        self.n_bins = validate_int("n_bins", n_bins, minimum=1)
        self.binning = validate_choice("binning", binning, HB_BINNINGS)
        self.norm = validate_choice("norm", norm, HB_NORMS)

    @property
    def params(self):  # noqa: D102
        return {"n_bins": self.n_bins, "binning": self.binning, "norm": self.norm}

    def _ece(self, confidences: np.ndarray, correct: np.ndarray) -> float:
        return _metrics_ece(confidences, correct, self.n_bins, self.binning, self.norm)

    def _grouped(
        self, confidences: np.ndarray, correct: np.ndarray, labels: np.ndarray, n_classes: int
    ) -> np.ndarray:
        """ECE of each class's samples, (K,), NaN for classes without samples."""
        out = np.full(n_classes, np.nan)
        for k in np.unique(labels):
            members = labels == k
            out[k] = self._ece(confidences[members], correct[members])
        return out

    def _values_numpy(self, confidences, correct, labels, class_coef) -> float:
        if class_coef is None:
            return self._ece(confidences, correct)
        k = int(np.shape(class_coef)[0])
        per_class = self._grouped(confidences, correct, labels, k)
        present = _class_counts(labels, k) > 0
        return float(np.asarray(class_coef, dtype=np.float64)[present] @ per_class[present])

    def class_losses(self, log_p, labels, n_classes):  # noqa: D102
        conf, hits = SoftBinnedECE._top1_numpy(log_p, labels)
        return self._grouped(conf, hits, labels, n_classes)

    def value(self, log_p, labels, class_coef=None):  # noqa: D102
        conf, hits = SoftBinnedECE._top1_numpy(log_p, labels)
        return self._values_numpy(conf, hits, labels, class_coef)

    def temperature_value_and_grad(self, stats, labels, class_coef):  # noqa: D102
        value = self._values_numpy(stats.confidence, stats.correct, labels, class_coef)
        return value, float("nan")

    def _no_gradient(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(
            "calibration loss 'hbece' (hard-binned ECE) has no gradient; fit it with "
            "'ts_hb_ece' (or 'ts'), or use loss 'sbece' for a gradient-based calibrator"
        )

    value_and_grad_logits = _no_gradient
    value_and_grad_probs = _no_gradient
    torch_class_losses = _no_gradient
    torch_value = _no_gradient


_OBJECTIVES: dict[str, type[CalibrationObjective]] = {
    "nll": NegativeLogLikelihood,
    "mse": MeanSquaredError,
    "ls": LabelSmoothedNLL,
    "focal": Focal,
    "sbece": SoftBinnedECE,
    "hbece": HardBinnedECE,
}

#: Names accepted by :func:`build_objective` (the ``loss`` of the calibrators), sorted.
OBJECTIVES = tuple(sorted(_OBJECTIVES))


def _objective_class(name: str) -> type[CalibrationObjective]:
    if not isinstance(name, str) or name not in _OBJECTIVES:
        raise ValueError(f"Unknown calibration loss {name!r}; available: {', '.join(OBJECTIVES)}")
    return _OBJECTIVES[name]


def objective_parameters(name: str) -> dict[str, Any]:
    """Keyword parameters of an objective and their defaults (``{}`` for ``nll``).

    Raises:
        ValueError: if ``name`` is unknown.
    """
    signature = inspect.signature(_objective_class(name).__init__)
    return {
        param.name: param.default
        for param in signature.parameters.values()
        if param.name != "self" and param.default is not inspect.Parameter.empty
    }


def build_objective(name: str, **params: Any) -> CalibrationObjective:
    """Build a calibration objective by name.

    Args:
        name: one of :data:`OBJECTIVES` (``"focal"``, ``"hbece"``, ``"ls"``, ``"mse"``,
            ``"nll"``, ``"sbece"``).
        **params: its hyperparameters (``epsilon`` for ``ls``, ``gamma`` for ``focal``,
            ``n_bins``/``sb_temperature``/``p``/``binning`` for ``sbece``,
            ``n_bins``/``binning``/``norm`` for ``hbece``).

    Returns:
        The objective.

    Raises:
        ValueError: for an unknown name, an unknown parameter or an out-of-range value.
        TypeError: for a parameter of the wrong type.
    """
    accepted = objective_parameters(name)
    unexpected = sorted(set(params) - set(accepted))
    if unexpected:
        raise ValueError(
            f"calibration loss {name!r} got unexpected parameter(s) {', '.join(unexpected)}; "
            f"accepted: {', '.join(accepted) or '(none)'}"
        )
    return _objective_class(name)(**params)
