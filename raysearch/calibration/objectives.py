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
  computed by :func:`raysearch.losses.soft_binning.soft_binned_ece` (torch, gradients) and a
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

Each objective is written once, in torch (float64), as a function of the (N, K)
log-probabilities (:meth:`CalibrationObjective.torch_value`; a per-sample objective defines only
its per-sample loss). The calibrators fitted by scipy compose it
(:meth:`CalibrationObjective.torch_objective`) with their own map (the log-temperature of TS,
with the second derivative for its Newton iteration; the K temperatures of CTS; ETS's mixture
weights; the Dirichlet map) and take the gradient by torch autograd
(:func:`raysearch.calibration._autograd.value_and_grad`); no gradient is written by hand.
:meth:`CalibrationObjective.value_and_grad_logits` and ``value_and_grad_probs`` give it with
respect to the logits and the probabilities. The values of ``sbece`` and ``hbece`` come from
NumPy (the derivative-free TS searches evaluate them often); those of the per-sample objectives
are the torch function without gradient.
"""

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from raysearch.calibration._autograd import value_and_grad
from raysearch.calibration._checks import (
    validate_choice,
    validate_int,
    validate_number,
)
from raysearch.calibration.sbece import grouped_sbece, per_class_sbece
from raysearch.losses.soft_binning import soft_binned_ece
from raysearch.metrics import BINNINGS as HB_BINNINGS
from raysearch.metrics import NORMS as HB_NORMS
from raysearch.metrics.binning import binned_ece

__all__ = [
    "OBJECTIVES",
    "CalibrationObjective",
    "Focal",
    "HardBinnedECE",
    "LabelSmoothedNLL",
    "MeanSquaredError",
    "NegativeLogLikelihood",
    "SoftBinnedECE",
    "build_objective",
    "objective_parameters",
]

#: Floor on probabilities before a logarithm or a division.
_TINY = 1e-300
#: Binnings of SB-ECE: Eq. 11 (``"bin"``) and Eq. 12 (``"lb"``, label-binned).
SB_BINNINGS = ("bin", "lb")


def _class_counts(labels: np.ndarray, n_classes: int) -> np.ndarray:
    return np.bincount(labels, minlength=n_classes)


class CalibrationObjective:
    """Base class of the calibration objectives (see the module docstring for reductions).

    Subclasses define :meth:`torch_value` and :meth:`torch_class_losses` (or, as a mean of
    per-sample losses, only ``torch_per_sample``); values and gradients follow from them.

    Class attributes:
        name: registry name of the objective.
        differentiable: whether TS uses its derivative (else a derivative-free search).
        convex_in_inverse_temperature: whether the TS objective is convex in 1/T (one minimum:
            TS then runs a safeguarded Newton iteration instead of a coarse grid).
    """

    name: ClassVar[str] = ""
    differentiable: ClassVar[bool] = True
    convex_in_inverse_temperature: ClassVar[bool] = False

    @property
    def params(self) -> dict[str, Any]:
        """Hyperparameters of the objective (for logging)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"

    # Torch: the definition -----------------------------------------------------------------

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

    def torch_objective(
        self, labels: np.ndarray, class_coef: np.ndarray | None = None
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The objective as a function of (N, K) float64 log-probabilities, for autograd.

        Args:
            labels: (N,) labels in [0, K).
            class_coef: (K,) class coefficients or None (module docstring).

        Returns:
            ``log_p -> torch_value(log_p, labels, class_coef)``, a 0-d float64 tensor.
        """
        y = torch.tensor(np.asarray(labels), dtype=torch.int64)  # a copy: labels may be read-only
        coef = None if class_coef is None else torch.as_tensor(class_coef, dtype=torch.float64)
        return lambda log_p: self.torch_value(log_p, y, coef)

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
        y = torch.tensor(np.asarray(labels), dtype=torch.int64)
        with torch.no_grad():
            losses = self.torch_class_losses(
                torch.as_tensor(log_p, dtype=torch.float64), y, n_classes
            ).numpy()
        return np.where(_class_counts(labels, n_classes) > 0, losses, np.nan)

    def value(
        self, log_p: np.ndarray, labels: np.ndarray, class_coef: np.ndarray | None = None
    ) -> float:
        """The objective of log-probabilities (N, K), reduced as in the module docstring."""
        with torch.no_grad():
            log_p_t = torch.as_tensor(log_p, dtype=torch.float64)
            return self.torch_objective(labels, class_coef)(log_p_t).item()

    # Gradients (autograd) ----------------------------------------------------------------

    def value_and_grad_logits(
        self, z: np.ndarray, labels: np.ndarray, class_coef: np.ndarray | None = None
    ) -> tuple[float, np.ndarray]:
        """Objective of ``softmax(z)`` and its (N, K) gradient with respect to the logits ``z``."""
        objective = self.torch_objective(labels, class_coef)
        return value_and_grad(lambda x: objective(torch.log_softmax(x, dim=1)), z)

    def value_and_grad_probs(
        self, p: np.ndarray, labels: np.ndarray, class_coef: np.ndarray | None = None
    ) -> tuple[float, np.ndarray]:
        """Objective of probabilities ``p`` (N, K) and its gradient with respect to ``p``."""
        objective = self.torch_objective(labels, class_coef)
        return value_and_grad(lambda q: objective(q.clamp_min(_TINY).log()), p)


class _PerSampleObjective(CalibrationObjective):
    """An objective that is a mean of per-sample losses l(p_n, y_n)."""

    def torch_per_sample(self, log_p: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(N,) differentiable losses of (N, K) log-probabilities (the subclass's definition)."""
        raise NotImplementedError

    def torch_class_losses(self, log_p, labels, n_classes):  # noqa: D102
        losses = self.torch_per_sample(log_p, labels)
        sums = torch.zeros(n_classes, dtype=losses.dtype).index_add(0, labels, losses)
        counts = torch.bincount(labels, minlength=n_classes).to(losses.dtype)
        return sums / counts.clamp_min(1.0)

    def torch_value(self, log_p, labels, class_coef=None):  # noqa: D102
        if class_coef is None:
            return self.torch_per_sample(log_p, labels).mean()
        return (class_coef * self.torch_class_losses(log_p, labels, log_p.shape[1])).sum()


def _true_class(log_p: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(N,) the labels' entries of an (N, K) tensor (e.g. log p_y)."""
    return log_p.gather(1, labels[:, None])[:, 0]


class NegativeLogLikelihood(_PerSampleObjective):
    r"""Negative log-likelihood :math:`-\log p_y` (``nll``), the default of every calibrator.

    Convex in the inverse temperature of TS (and in the inverse temperatures of CTS).
    """

    name = "nll"
    convex_in_inverse_temperature = True

    def torch_per_sample(self, log_p, labels):  # noqa: D102
        return -_true_class(log_p, labels)


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

    def __init__(self, epsilon: float = 0.05) -> None:
        self.epsilon = validate_number("epsilon", epsilon, minimum=0.0, maximum=1.0)
        if self.epsilon == 1.0:
            raise ValueError(f"`epsilon` must be >= 0 and < 1, got {epsilon}")

    @property
    def params(self):  # noqa: D102
        return {"epsilon": self.epsilon}

    def torch_per_sample(self, log_p, labels):  # noqa: D102
        eps = self.epsilon
        return -(1.0 - eps) * _true_class(log_p, labels) - eps * log_p.mean(dim=1)


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

    def torch_per_sample(self, log_p, labels):  # noqa: D102
        log_p_true = _true_class(log_p, labels)
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

    def torch_per_sample(self, log_p, labels):  # noqa: D102
        p = log_p.exp()
        p_true = _true_class(p, labels)
        return (p * p).sum(dim=1) - 2.0 * p_true + 1.0


class _Top1CalibrationError(CalibrationObjective):
    """An ECE of the top-1 confidences and hits; values in NumPy (per class with coefficients).

    Subclasses define :meth:`_overall` and :meth:`_grouped` (and the torch functions when
    they have a gradient).
    """

    differentiable = False

    def _overall(self, confidences: np.ndarray, correct: np.ndarray) -> float:
        """The error of all N samples: (N,) confidences and (N,) bool hits."""
        raise NotImplementedError

    def _grouped(
        self, confidences: np.ndarray, correct: np.ndarray, labels: np.ndarray, n_classes: int
    ) -> np.ndarray:
        """The error of each class's samples, (K,), NaN for classes without samples."""
        raise NotImplementedError

    @staticmethod
    def _top1_numpy(log_p: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = log_p.argmax(axis=1)
        return np.exp(log_p[np.arange(labels.shape[0]), index]), index == labels

    def class_losses(self, log_p, labels, n_classes):  # noqa: D102
        return self._grouped(*self._top1_numpy(log_p, labels), labels, n_classes)

    def value(self, log_p, labels, class_coef=None):  # noqa: D102
        confidences, correct = self._top1_numpy(log_p, labels)
        if class_coef is None:
            return self._overall(confidences, correct)
        k = int(np.shape(class_coef)[0])
        per_class = self._grouped(confidences, correct, labels, k)
        present = _class_counts(labels, k) > 0
        return float(np.asarray(class_coef, dtype=np.float64)[present] @ per_class[present])


class SoftBinnedECE(_Top1CalibrationError):
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

    def _overall(self, confidences, correct):
        groups = np.zeros(confidences.shape[0], dtype=np.intp)
        return float(grouped_sbece(confidences, correct, groups, 1, *self._settings())[0])

    def _grouped(self, confidences, correct, labels, n_classes):
        losses = grouped_sbece(confidences, correct, labels, n_classes, *self._settings())
        losses[_class_counts(labels, n_classes) == 0] = np.nan
        return losses

    # Torch (gradients) -------------------------------------------------------------------

    @staticmethod
    def _top1(log_p: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, index = log_p.max(dim=1)
        return top.exp(), index == labels

    def torch_class_losses(self, log_p, labels, n_classes):  # noqa: D102
        conf, hits = self._top1(log_p, labels)
        return per_class_sbece(conf, hits, labels, n_classes, self._settings())

    def torch_value(self, log_p, labels, class_coef=None):  # noqa: D102
        if class_coef is None:
            conf, hits = self._top1(log_p, labels)
            return soft_binned_ece(conf, hits, *self._settings())
        per_class = self.torch_class_losses(log_p, labels, int(class_coef.shape[0]))
        present = torch.bincount(labels, minlength=int(class_coef.shape[0])) > 0
        return (class_coef[present] * per_class[present]).sum()


class HardBinnedECE(_Top1CalibrationError):
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

    def __init__(self, n_bins: int = 15, binning: str = "equal_mass", norm: str = "l2") -> None:
        self.n_bins = validate_int("n_bins", n_bins, minimum=1)
        self.binning = validate_choice("binning", binning, HB_BINNINGS)
        self.norm = validate_choice("norm", norm, HB_NORMS)

    @property
    def params(self):  # noqa: D102
        return {"n_bins": self.n_bins, "binning": self.binning, "norm": self.norm}

    def _overall(self, confidences, correct):
        return binned_ece(confidences, correct, self.n_bins, self.binning, self.norm)

    def _grouped(self, confidences, correct, labels, n_classes):
        out = np.full(n_classes, np.nan)
        for k in np.unique(labels):
            members = labels == k
            out[k] = self._overall(confidences[members], correct[members])
        return out

    def _no_gradient(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(
            "calibration loss 'hbece' (hard-binned ECE) has no gradient; fit it with "
            "'ts_hb_ece' (or 'ts'), or use loss 'sbece' for a gradient-based calibrator"
        )

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
