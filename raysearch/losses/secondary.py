"""Secondary calibration objectives: a primary loss plus beta times a secondary loss.

Karandikar et al. (NeurIPS 2021, Sec. 5) train with ``PL + beta * SL``: a primary loss PL
(cross-entropy, focal or squared error) plus beta times a secondary, calibration-incentivising
loss SL computed on the whole batch. :class:`SecondaryObjective` builds the primary from
``primary`` / ``primary_params`` (:class:`BrierLoss` is the ``"mse"`` primary) and each subclass
implements :meth:`SecondaryObjective.secondary`: SB-ECE (:mod:`raysearch.losses.soft_binning`),
S-AvUC, AvUC and AvUC-GS (:mod:`raysearch.losses.avuc`), MMCE and MDCA
(:mod:`raysearch.losses.mmce_mdca`). ``forward`` returns one scalar, the total objective;
:meth:`SecondaryObjective.terms` returns ``{"primary", "secondary", "total"}`` for logging. Also
here: the parameter checks and numerics those subclasses share (``_finite``, ``_positive``,
``_open_unit``, ``_positive_int``, ``_canonical_variant``, ``_safe_root``,
``_confidence_and_accuracy``) and the constants ``OFFICIAL`` and ``CALTRAIN_EPS``.

Notation (Karandikar et al., Sec. 3): ``p_i = softmax(z_i)`` over K classes, confidence
``c_i = max_k p_ik`` (the gradient flows through the max), accuracy ``a_i = 1[argmax_k p_ik ==
y_i]`` (a constant: no gradient), entropy ``h_i = -sum_k p_ik log p_ik`` in nats. Every location
of a dense (N, K, *) prediction counts as one sample. The secondary losses are batch statistics
(bins, kernels, class frequencies over the batch), not means of per-sample terms, so their value
depends on the batch size. A location whose target is ``ignore_index`` counts nowhere: its row is
removed before the primary AND the secondary loss, so it is in no bin, kernel, count or class
mean, and N counts the other locations only; a batch with none gives 0.

Variants: where the paper's equations and the authors' released code differ, ``variant=
"official"`` (the DEFAULT) is the released code, the form whose scale the published
hyperparameters and tables belong to, and ``variant="paper"`` the equations as written. SB-ECE,
S-AvUC, AvUC and AvUC-GS also accept the older names ``"caltrain"`` (and, for SB-ECE,
``"caltrain_lb"`` / ``"caltrain_bin"``, which also fix ``binning``) for ``"official"``. MDCA's
paper and code agree: it has no variant. Each class docstring says what differs and why.

Imports: torch and :mod:`raysearch.losses._common` / :mod:`raysearch.losses.classification` only;
never a module of a secondary loss (they import this one).

References:
    Karandikar, Cain, Tran, Lakshminarayanan, Shlens, Mozer and Roelofs, "Soft Calibration
    Objectives for Neural Networks", NeurIPS 2021, arXiv:2108.00106. Released code (footnote 2
    of the paper): google/uncertainty-baselines ``experimental/caltrain/secondary_losses.py``.
    Kumar, Sarawagi and Jain, "Trainable Calibration Measures for Neural Networks from Kernel
    Mean Embeddings", ICML 2018; code: aviralkumar2907/MMCE ``20ng_mmce.py``.
    Hebbalaguppe, Prakash, Madan and Arora, "A Stitch in Time Saves Nine", CVPR 2022,
    arXiv:2203.13834; code: mdca-loss/MDCA-Calibration ``solvers/loss.py``.
"""

import math
import numbers
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from raysearch.losses._common import (
    DEFAULT_IGNORE_INDEX,
    FlatLoss,
    TermsLoss,
    flatten_inputs,
    validate_choice,
    validate_number,
    zero_loss,
)
from raysearch.losses.classification import CrossEntropy, FocalLoss

#: Primary losses of :class:`SecondaryObjective` (``None`` is also accepted: no primary).
PRIMARIES = ("ce", "focal", "mse")
#: Keys of ``primary_params`` accepted by each primary.
PRIMARY_PARAMS: dict[str, tuple[str, ...]] = {"ce": (), "focal": ("gamma",), "mse": ()}
#: The canonical name of the authors' released code in every ``variant=`` (as for ``acls``).
OFFICIAL = "official"
#: The numerical guard of the caltrain code: probability smoothing, bin-size and ratio floors.
CALTRAIN_EPS = 1e-5


# --------------------------------------------------------------------------------------------
# Parameter validation
# --------------------------------------------------------------------------------------------


def _finite(name: str, value: object, *, minimum: float | None = None) -> float:
    """A real number >= ``minimum`` that is not infinite (ValueError names ``name``)."""
    number = validate_number(name, value, minimum=minimum)
    if math.isinf(number):
        raise ValueError(f"`{name}` must be finite, got {value}")
    return number


def _positive(name: str, value: object) -> float:
    """A finite real number > 0 (ValueError names ``name``)."""
    number = validate_number(name, value)
    if not 0.0 < number < math.inf:
        raise ValueError(f"`{name}` must be > 0 and finite, got {value}")
    return number


def _open_unit(name: str, value: object) -> float:
    """A real number in the open interval (0, 1) (ValueError names ``name``)."""
    number = validate_number(name, value)
    if not 0.0 < number < 1.0:
        raise ValueError(f"`{name}` must be in (0, 1), got {value}")
    return number


def _positive_int(name: str, value: object) -> int:
    """An integer >= 1; TypeError for non-integers (``bool`` included)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"`{name}` must be >= 1, got {value}")
    return int(value)


def _canonical_variant(variant: object, choices: tuple[str, ...]) -> str:
    """Validate ``variant``: ``"paper"``, or ``"official"`` for every name of the released code."""
    name = validate_choice("variant", variant, choices)
    return "paper" if name == "paper" else OFFICIAL


def _check_primary(primary: object, primary_params: object) -> tuple[str | None, dict[str, object]]:
    """Validate ``primary`` and ``primary_params``; return the primary name and a params copy."""
    if primary_params is None:
        params: dict[str, object] = {}
    elif isinstance(primary_params, Mapping):
        params = dict(primary_params)
    else:
        raise TypeError(
            f"`primary_params` must be a dict or None, got {type(primary_params).__name__}"
        )
    if primary is None:
        if params:
            raise ValueError(f"`primary_params` must be empty when `primary` is None, got {params}")
        return None, params
    if not isinstance(primary, str):
        raise TypeError(
            f"`primary` must be a str (one of 'ce', 'focal', 'mse') or None, "
            f"got {type(primary).__name__}"
        )
    if primary not in PRIMARIES:
        raise ValueError(f"`primary` must be one of 'ce', 'focal', 'mse' or None, got {primary!r}")
    accepted = PRIMARY_PARAMS[primary]
    unexpected = sorted(str(key) for key in params if key not in accepted)
    if unexpected:
        raise ValueError(
            f"`primary_params` got unexpected key(s) {', '.join(unexpected)} for "
            f"primary={primary!r}; accepted: {', '.join(accepted) or '(none)'}"
        )
    return primary, params


def _build_primary(
    primary: str | None, params: dict[str, object], ignore_index: int
) -> nn.Module | None:
    """The primary loss module (its own ``__init__`` validates the parameter values)."""
    if primary is None:
        return None
    if primary == "ce":
        return CrossEntropy(ignore_index=ignore_index)
    if primary == "focal":
        return FocalLoss(**params, ignore_index=ignore_index)
    return BrierLoss(ignore_index=ignore_index)


# --------------------------------------------------------------------------------------------
# Shared numerics
# --------------------------------------------------------------------------------------------


def _safe_root(value: torch.Tensor, p: float) -> torch.Tensor:
    """``value ** (1/p)`` with value 0 (and gradient 0) where ``value <= 0``.

    The root has an infinite derivative at 0, which would turn a perfectly calibrated batch into
    a NaN gradient; at that minimum the gradient is set to 0 instead. Rounding can make a
    non-negative quantity (a kernel quadratic form) slightly negative: it is read as 0.
    """
    if p == 1.0:
        return value
    positive = value > 0
    safe = torch.where(positive, value, torch.ones_like(value))
    return torch.where(positive, safe.pow(1.0 / p), torch.zeros_like(value))


def _confidence_and_accuracy(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Probabilities (M, K), confidences c (M,) with gradient, accuracies a (M,) without."""
    probs = torch.softmax(logits, dim=1)
    confidence, prediction = probs.max(dim=1)
    accuracy = (prediction == targets).to(probs.dtype)
    return probs, confidence, accuracy


# --------------------------------------------------------------------------------------------
# Primary losses and the composition
# --------------------------------------------------------------------------------------------


class BrierLoss(FlatLoss):
    """Squared error between softmax probabilities and the one-hot target (primary ``"mse"``).

    ``L = (1/N) sum_i sum_k (p_ik - 1[k == y_i])^2``: the multiclass Brier score, summed over the
    K classes and averaged over samples. It is the ``"mse"`` primary of
    :class:`SecondaryObjective` (Karandikar et al. cite Hui and Belkin, ICLR 2021, for the MSE
    primary; this class uses softmax probabilities, not raw logits).

    Args, shapes and errors: as :class:`~raysearch.losses._common.FlatLoss` (``ignore_index``
    only, keyword-only).

    Returns:
        Scalar tensor: the batch mean of the sum over classes, in [0, 2].
    """

    def _rows_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean Brier score of the (M, K) kept rows."""
        probs = torch.softmax(logits, dim=1)
        one_hot = F.one_hot(targets, probs.shape[1]).to(probs.dtype)
        return (probs - one_hot).square().sum(dim=1).mean()


class SecondaryObjective(TermsLoss):
    """Base class: primary loss + beta * secondary calibration loss (Karandikar et al., Sec. 5).

    ``total = PL + beta * SL`` with PL the primary loss and SL :meth:`secondary`. With
    ``primary=None`` the total is the secondary term alone, unscaled (``beta`` is then unused;
    it is still validated). Subclasses implement :meth:`secondary`.

    Primaries (``primary_params`` in brackets): ``"ce"`` cross-entropy
    (:class:`~raysearch.losses.classification.CrossEntropy`, no params), ``"focal"``
    (:class:`~raysearch.losses.classification.FocalLoss`, ``{"gamma": float}``), ``"mse"``
    (:class:`BrierLoss`, no params).

    Args:
        beta (float, optional): weight of the secondary loss, finite, >= 0. ``beta=0`` gives the
            primary alone. Defaults to ``1.0``.
        primary (str or None, optional): ``"ce"``, ``"focal"``, ``"mse"`` or None. Defaults to
            ``"ce"``.
        primary_params (dict or None, optional): keyword parameters of the primary, e.g.
            ``{"gamma": 3.0}`` for focal; must be empty for None. Defaults to None (the primary's
            defaults).
        ignore_index (int, optional): keyword-only; as
            :class:`~raysearch.losses._common.FlatLoss`, which gives the shapes.

    Returns:
        Scalar tensor: PL (batch mean) + beta * SL (a batch statistic). :meth:`terms` gives
        ``{"primary": PL, "secondary": SL (unscaled), "total": PL + beta * SL}``; with
        ``primary=None``, ``primary`` is a zero tensor and ``total`` is SL.

    Raises:
        TypeError: if ``beta`` is not a real number, ``primary`` not a str or None, or
            ``primary_params`` not a dict or None.
        ValueError: if ``beta`` < 0 or infinite, ``primary`` is unknown, ``primary_params`` has
            a key the primary does not accept (or any key when ``primary`` is None), or a primary
            parameter is out of range (e.g. ``gamma`` < 0).
    """

    repr_names = ("beta", "primary", "primary_params", "ignore_index")
    term_names = ("primary", "secondary", "total")

    def __init__(
        self,
        beta: float = 1.0,
        primary: str | None = "ce",
        primary_params: dict[str, float] | None = None,
        *,
        ignore_index: int = DEFAULT_IGNORE_INDEX,
    ) -> None:
        super().__init__(ignore_index=ignore_index)
        self.beta = _finite("beta", beta, minimum=0.0)
        self.primary, self.primary_params = _check_primary(primary, primary_params)
        self.primary_loss = _build_primary(self.primary, self.primary_params, self.ignore_index)

    def secondary(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Compute the secondary loss SL of the batch, unscaled (0 when every target is ignored).

        Args:
            logits: unnormalised scores, (N, K) or (N, K, *) float.
            targets: class indices, (N,) or (N, *) int64; ``ignore_index`` counts nowhere.

        Returns:
            Scalar tensor (what it is: the subclass's docstring).

        Raises:
            TypeError: if ``logits`` is not floating point or ``targets`` is not int64.
            ValueError: if the shape of ``targets`` does not match ``logits``, a target is
                neither in [0, K) nor ``ignore_index``, or a subclass's requirement on K fails.
            NotImplementedError: in the base class.
        """
        logits, targets = flatten_inputs(logits, targets, ignore_index=self.ignore_index)
        self._check_secondary_rows(logits)
        if logits.shape[0] == 0:
            return zero_loss(logits)
        return self._rows_secondary(logits, targets)

    def _check_secondary_rows(self, logits: torch.Tensor) -> None:
        """Raise ValueError where the (M, K) kept logits do not suit SL (default: none)."""

    def _rows_secondary(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """SL of M >= 1 kept rows: logits (M, K), targets (M,) in [0, K)."""
        raise NotImplementedError

    def _rows_terms(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """PL, SL and the total of M >= 1 kept rows."""
        secondary = self.secondary(logits, targets)
        if self.primary_loss is None:
            return {"primary": secondary.new_zeros(()), "secondary": secondary, "total": secondary}
        primary = self.primary_loss(logits, targets)
        return {
            "primary": primary,
            "secondary": secondary,
            "total": primary + self.beta * secondary,
        }

    def _total(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The objective: the part ``total``."""
        return parts["total"]
