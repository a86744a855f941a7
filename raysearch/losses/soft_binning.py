"""Soft binning and the soft-binned ECE, SB-ECE (Karandikar et al., Sec. 4.1, Eq. 8-12).

The soft bin memberships and bin centres, :func:`soft_binned_ece` (the paper's Eq. 11-12 on given
confidences and correctness, shared with the post-hoc ``ts_sbece`` calibrator), the released
caltrain forms, and the training objective :class:`SoftBinnedECE` (registry name ``sbece``).
Notation, ignored targets and variants: see :mod:`raysearch.losses.secondary`.

Imports: torch, :mod:`raysearch.losses._common` and :mod:`raysearch.losses.secondary` only.

References:
    Karandikar, Cain, Tran, Lakshminarayanan, Shlens, Mozer and Roelofs, "Soft Calibration
    Objectives for Neural Networks", NeurIPS 2021, arXiv:2108.00106. Released code (footnote 2
    of the paper): google/uncertainty-baselines ``experimental/caltrain/secondary_losses.py``.
"""

import torch

from raysearch.losses._common import (
    DEFAULT_IGNORE_INDEX,
    check_tensor,
    validate_choice,
)
from raysearch.losses.secondary import (
    CALTRAIN_EPS,
    OFFICIAL,
    SecondaryObjective,
    _canonical_variant,
    _confidence_and_accuracy,
    _finite,
    _positive,
    _positive_int,
    _safe_root,
)

#: Soft-binned ECE flavours: label-binned (Eq. 12) or binned (Eq. 11).
SBECE_BINNINGS = ("lb", "bin")
#: Variants of :class:`SoftBinnedECE`: the released code (``"official"``, also spelled
#: ``"caltrain"``; ``"caltrain_lb"`` / ``"caltrain_bin"`` also fix ``binning``) or the paper.
SBECE_VARIANTS = ("official", "paper", "caltrain", "caltrain_lb", "caltrain_bin")


# --------------------------------------------------------------------------------------------
# Soft binning (Eq. 8-10) and SB-ECE (Eq. 11-12)
# --------------------------------------------------------------------------------------------


def _soft_memberships(
    confidences: torch.Tensor, centres: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Soft bin membership u*_{M,T}(c) = softmax_j(-(c - xi_j)^2 / T), (N, M)."""
    distances = (confidences.unsqueeze(1) - centres.unsqueeze(0)).square()
    return torch.softmax(-distances / temperature, dim=1)


def _bin_centres(n_bins: int, like: torch.Tensor, low: float = 0.0) -> torch.Tensor:
    """Centres of ``n_bins`` equal-width bins on [low, 1], in the dtype/device of ``like``."""
    index = torch.arange(n_bins, dtype=like.dtype, device=like.device)
    return low + (index + 0.5) * ((1.0 - low) / n_bins)


_EMPTY_BIN = 1e-12


def _paper_sbece(
    confidences: torch.Tensor,
    correct: torch.Tensor,
    n_bins: int,
    temperature: float,
    p: float,
    binning: str,
) -> torch.Tensor:
    """SB-ECE of Eq. 11 (``bin``) or Eq. 12 (``lb``), without input checks."""
    num_samples = confidences.shape[0]
    u = _soft_memberships(confidences, _bin_centres(n_bins, confidences), temperature)
    sizes = u.sum(dim=0)  # S_j, Eq. 8
    # a bin holding less than _EMPTY_BIN of mass is treated as empty: its term is below 1e-12
    # anyway, and dividing by such a size makes the backward pass overflow to inf * 0 = NaN
    filled = sizes > _EMPTY_BIN
    safe_sizes = torch.where(filled, sizes, torch.ones_like(sizes))
    if binning == "bin":
        # S_j |A_j - C_j|^p with A_j - C_j = sum_i u_ij (a_i - c_i) / S_j (Eq. 9-10); a bin whose
        # size underflows to 0 contributes 0, the limit of its term.
        gaps = (u * (correct - confidences).unsqueeze(1)).sum(dim=0)
        weighted = safe_sizes * (gaps.abs() / safe_sizes).pow(p)
        inner = torch.where(filled, weighted, torch.zeros_like(weighted)).sum() / num_samples
    else:
        # A_j of Eq. 10, then (1/N) sum_i sum_j u_ij |A_j - c_i|^p (Eq. 12); A_j of an empty bin
        # is irrelevant (all its u_ij are 0) and set to 0.
        accuracies = (u * correct.unsqueeze(1)).sum(dim=0) / safe_sizes
        accuracies = torch.where(filled, accuracies, torch.zeros_like(accuracies))
        errors = (accuracies.unsqueeze(0) - confidences.unsqueeze(1)).abs().pow(p)
        inner = (u * errors).sum() / num_samples
    return _safe_root(inner, p)


def _caltrain_lb(
    confidences: torch.Tensor,
    correct: torch.Tensor,
    num_classes: int,
    n_bins: int,
    temperature: float,
) -> torch.Tensor:
    """The released ``compute_squared_error_label_binning_tensorflow``: squared SB-ECE_lb."""
    num_samples = confidences.shape[0]
    centres = _bin_centres(n_bins, confidences, low=1.0 / num_classes)
    u = _soft_memberships(confidences, centres, temperature)
    u = (1.0 - CALTRAIN_EPS) * u + CALTRAIN_EPS / n_bins
    accuracies = (u * correct.unsqueeze(1)).sum(dim=0) / u.sum(dim=0)
    errors = (accuracies.unsqueeze(0) - confidences.unsqueeze(1)).square()
    return (u * errors).sum() / num_samples


def _caltrain_bin(
    confidences: torch.Tensor, correct: torch.Tensor, n_bins: int, temperature: float
) -> torch.Tensor:
    """The released ``get_soft_binning_ece_tensor``: SB-ECE_bin,2 with bin sizes floored."""
    u = _soft_memberships(confidences, _bin_centres(n_bins, confidences), temperature)
    sizes = u.sum(dim=0)
    floored = sizes.clamp(min=CALTRAIN_EPS)
    mean_confidence = (u * confidences.unsqueeze(1)).sum(dim=0) / floored
    mean_accuracy = (u * correct.unsqueeze(1)).sum(dim=0) / floored
    weights = sizes / sizes.sum()
    return _safe_root(((mean_confidence - mean_accuracy).square() * weights).sum(), 2.0)


def soft_binned_ece(
    confidences: torch.Tensor,
    correct: torch.Tensor,
    n_bins: int = 15,
    temperature: float = 0.01,
    p: float = 2,
    binning: str = "bin",
) -> torch.Tensor:
    r"""Soft-binned ECE of confidences against correctness (Karandikar et al., Eq. 8-12).

    Soft bin membership over M equal-width bins of [0, 1] with centres
    :math:`\xi_j = (j - 1/2)/M`:
    :math:`u_{ij} = \mathrm{softmax}_j(-(c_i - \xi_j)^2 / T)`. Then
    :math:`S_j = \sum_i u_{ij}`, :math:`C_j = \sum_i u_{ij} c_i / S_j`,
    :math:`A_j = \sum_i u_{ij} a_i / S_j` (Eq. 8-10) and

    - ``binning="bin"`` (Eq. 11):
      :math:`\big(\sum_j \tfrac{S_j}{N} |A_j - C_j|^p\big)^{1/p}`;
    - ``binning="lb"`` (Eq. 12):
      :math:`\big(\tfrac{1}{N} \sum_i \sum_j u_{ij} |A_j - c_i|^p\big)^{1/p}`.

    As ``T -> 0`` the memberships become hard bins (each confidence in the bin of its nearest
    centre) and ``bin`` with p = 2 is the l2 ECE of ``raysearch.metrics.ece(..., norm="l2")``.
    A bin whose size is below 1e-12 contributes 0 (its term is below 1e-12 anyway, and dividing
    by it would overflow the backward pass); where the value is 0
    the gradient of the root is set to 0 (the root's derivative is infinite there). The gradient
    flows into ``confidences`` (memberships, C_j, A_j and c_i); ``correct`` is detached.

    Args:
        confidences (torch.Tensor): top-label confidences, shape (N,), float, values in [0, 1]
            (not range-checked, to avoid a device synchronisation).
        correct (torch.Tensor): whether each prediction is right, shape (N,), bool or float in
            {0, 1}.
        n_bins (int, optional): number of bins M >= 1. Defaults to ``15``.
        temperature (float, optional): soft-binning temperature T > 0; smaller is closer to hard
            binning. Defaults to ``0.01``.
        p (float, optional): order of the norm, finite, >= 1. Defaults to ``2``.
        binning (str, optional): ``"bin"`` (Eq. 11) or ``"lb"`` (Eq. 12). Defaults to ``"bin"``.

    Returns:
        Scalar tensor (dtype of ``confidences``, float32 for half inputs).

    Raises:
        TypeError: if an input is not a tensor, ``confidences`` is not floating point, or a
            parameter has the wrong type.
        ValueError: if ``confidences`` is not 1-D or empty, the shapes differ (both quoted),
            ``n_bins`` < 1, ``temperature`` <= 0, ``p`` < 1 or infinite, or ``binning`` is not
            ``"bin"`` or ``"lb"``.
    """
    n_bins = _positive_int("n_bins", n_bins)
    temperature = _positive("temperature", temperature)
    p = _finite("p", p, minimum=1.0)
    binning = validate_choice("binning", binning, SBECE_BINNINGS)
    check_tensor("confidences", confidences)
    check_tensor("correct", correct)
    if not confidences.is_floating_point():
        raise TypeError(f"`confidences` must be floating point, got dtype {confidences.dtype}")
    if confidences.ndim != 1 or confidences.numel() == 0:
        raise ValueError(
            f"`confidences` must have shape (N,) with N >= 1, got {tuple(confidences.shape)}"
        )
    if correct.shape != confidences.shape:
        raise ValueError(
            f"`correct` must have the shape of `confidences` {tuple(confidences.shape)}, "
            f"got {tuple(correct.shape)}"
        )
    if confidences.dtype in (torch.float16, torch.bfloat16):
        confidences = confidences.float()
    correct = correct.detach().to(confidences.dtype)
    return _paper_sbece(confidences, correct, n_bins, temperature, p, binning)


# --------------------------------------------------------------------------------------------
# The training objective
# --------------------------------------------------------------------------------------------


class SoftBinnedECE(SecondaryObjective):
    r"""Primary loss + beta * soft-binned ECE, SB-ECE (registry name ``sbece``).

    SB-ECE (Karandikar et al., Sec. 4.1, Eq. 8-12) replaces the hard bins of the ECE by the soft
    membership :math:`u_{ij} = \mathrm{softmax}_j(-(c_i - \xi_j)^2 / T)` over M equal-width bins
    with centres :math:`\xi_j`, on the confidences :math:`c_i = \max_k p_{ik}`, with accuracies
    :math:`a_i = 1[\arg\max_k p_{ik} = y_i]`, bin sizes :math:`S_j = \sum_i u_{ij}` and bin
    accuracies and confidences :math:`A_j = \sum_i u_{ij} a_i / S_j`,
    :math:`C_j = \sum_i u_{ij} c_i / S_j` (Eq. 8-10). The gradient flows through :math:`c_i` (and
    so through the memberships, :math:`C_j` and :math:`A_j`), never through :math:`a_i`.

    ``variant="official"`` (the default) is the released code, google/uncertainty-baselines
    ``experimental/caltrain/secondary_losses.py``; which function depends on ``binning``:

    - ``binning="lb"`` (the default): ``compute_squared_error_label_binning_tensorflow``, the
      SQUARED label-binned SB-ECE with p = 2 and no root,
      :math:`\tfrac{1}{N} \sum_{ij} u'_{ij} (A'_j - c_i)^2`, with the M centres spread over
      :math:`[1/K, 1]` (:math:`\xi_j = 1/K + (j - 1/2)(1 - 1/K)/M`) instead of [0, 1], and the
      memberships mixed with the uniform distribution over bins,
      :math:`u'_{ij} = (1 - 10^{-5}) u_{ij} + 10^{-5} / M`, before :math:`A'_j` is computed;
    - ``binning="bin"``: ``get_soft_binning_ece_tensor``, Eq. 11 with p = 2 (root included) and
      centres :math:`(j - 1/2)/M` on [0, 1], except that :math:`C_j` and :math:`A_j` divide by
      :math:`\max(S_j, 10^{-5})` and the bin weights are :math:`S_j / \sum_j S_j`.

    Both need ``p=2`` (the released code is l2 only). The memberships use a numerically stable
    softmax (the released lb code divides exponentials, which is 0/0 for very small T), the
    gradient of the root at 0 is set to 0 (the released bin code gives NaN there) and the bin
    code's ``soft_binning_use_decay`` option (T from a decay factor) is not reproduced (pass T);
    the values are otherwise the released ones. The older names ``"caltrain"`` (= official),
    ``"caltrain_lb"`` and ``"caltrain_bin"`` (= official, and require that ``binning``) are
    accepted.

    ``variant="paper"`` is Eq. 11-12 as written, centres :math:`\xi_j = (j - 1/2)/M` on [0, 1]
    and any finite ``p >= 1`` (see :func:`soft_binned_ece`, which computes it):

    - ``binning="lb"`` (Eq. 12): :math:`\big(\tfrac{1}{N} \sum_i \sum_j u_{ij} |A_j -
      c_i|^p\big)^{1/p}`;
    - ``binning="bin"`` (Eq. 11): :math:`\big(\sum_j \tfrac{S_j}{N} |A_j - C_j|^p\big)^{1/p}`.

    Why the released code is the default: App. G states that the trained secondary loss is
    SB-ECE_lb,p of Eq. 12, with T and beta tuned on it, and the authors' published
    implementation of that loss is the released lb function (its docstring cites Eq. 12), which
    returns the SQUARE of the l2 form. The tuned T and beta (not listed in the paper) belong to
    that scale and gradient (d(x^2) = 2x dx, not dx), so reproducing Tables 1-2 needs the
    released form. The training driver that produced the tables is not public: the released
    loss functions are the closest reproduction available. ``variant="paper"`` keeps the
    paper's root, centres and any p (e.g. to search the norm).

    References:
        Karandikar et al., "Soft Calibration Objectives for Neural Networks", NeurIPS 2021,
        arXiv:2108.00106, Sec. 4.1 (Eq. 8-12), Sec. 5 and App. G; code: google/uncertainty-
        baselines ``experimental/caltrain/secondary_losses.py``.

    Args:
        beta (float, optional): weight of SB-ECE, finite, >= 0. Defaults to ``1.0``.
        primary (str or None, optional): ``"ce"``, ``"focal"``, ``"mse"`` or None (SB-ECE
            alone). Defaults to ``"ce"``.
        primary_params (dict or None, optional): parameters of the primary, e.g.
            ``{"gamma": 3.0}``. Defaults to None.
        n_bins (int, optional): number of bins M >= 1. Defaults to ``15`` (the paper's fixed M).
        temperature (float, optional): soft-binning temperature T > 0. Defaults to ``0.01``.
        p (float, optional): norm order, finite, >= 1; must be 2 with the official variant.
            Defaults to ``2``.
        binning (str, optional): ``"lb"`` (Eq. 12) or ``"bin"`` (Eq. 11). Defaults to ``"lb"``
            (the trained loss of App. G).
        variant (str, optional): ``"official"`` (released code), ``"paper"`` (Eq. 11-12), or
            the older names ``"caltrain"``, ``"caltrain_lb"``, ``"caltrain_bin"``. Defaults to
            ``"official"``.

    Returns:
        Scalar tensor: PL (batch mean) + beta * SB-ECE of the batch (its square for the official
        lb form).

    Raises:
        TypeError: if a parameter has the wrong type.
        ValueError: if ``beta`` < 0, ``n_bins`` < 1, ``temperature`` <= 0, ``p`` < 1 (or not 2
            with the official variant), ``binning`` or ``variant`` is unknown, ``binning`` does
            not match ``"caltrain_lb"`` / ``"caltrain_bin"``, or ``primary`` /
            ``primary_params`` is invalid.
    """

    repr_names = (
        *SecondaryObjective.repr_names, "n_bins", "temperature", "p", "binning", "variant"
    )

    def __init__(
        self,
        beta: float = 1.0,
        primary: str | None = "ce",
        primary_params: dict[str, float] | None = None,
        n_bins: int = 15,
        temperature: float = 0.01,
        p: float = 2,
        binning: str = "lb",
        variant: str = OFFICIAL,
        *,
        ignore_index: int = DEFAULT_IGNORE_INDEX,
    ) -> None:
        super().__init__(beta, primary, primary_params, ignore_index=ignore_index)
        self.n_bins = _positive_int("n_bins", n_bins)
        self.temperature = _positive("temperature", temperature)
        self.p = _finite("p", p, minimum=1.0)
        self.binning = validate_choice("binning", binning, SBECE_BINNINGS)
        self.variant = _canonical_variant(variant, SBECE_VARIANTS)
        if variant in ("caltrain_lb", "caltrain_bin"):
            released = variant.removeprefix("caltrain_")
            if self.binning != released:
                raise ValueError(
                    f"`variant`={variant!r} reproduces the released {released!r} code and "
                    f"needs `binning`={released!r}, got `binning`={self.binning!r}"
                )
        if self.variant == OFFICIAL and self.p != 2.0:
            raise ValueError(
                f"`p` must be 2 with `variant`={variant!r} (the released code is l2 only; "
                f"`variant`='paper' takes any p >= 1), got {p}"
            )

    def _rows_secondary(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """SB-ECE of the (M, K) kept rows (squared for the official ``lb`` form)."""
        _, confidence, accuracy = _confidence_and_accuracy(logits, targets)
        if self.variant == OFFICIAL and self.binning == "lb":
            return _caltrain_lb(
                confidence, accuracy, logits.shape[1], self.n_bins, self.temperature
            )
        if self.variant == OFFICIAL:
            return _caltrain_bin(confidence, accuracy, self.n_bins, self.temperature)
        return _paper_sbece(
            confidence, accuracy, self.n_bins, self.temperature, self.p, self.binning
        )
