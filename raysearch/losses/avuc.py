"""Accuracy versus uncertainty calibration: AvUC, AvUC-GS and soft AvUC, S-AvUC.

AvUC (Krishnan and Tickoo, NeurIPS 2020; Karandikar et al., Eq. 13-14), its gradient-stopped
form AvUC-GS (Karandikar et al., App. F) and S-AvUC (Karandikar et al., Sec. 4.2, Eq. 15-16),
with the soft uncertainty :func:`soft_uncertainty` and the shared ratio ``_avuc_ratio``.
Registry names ``avuc``, ``avuc_gs`` and ``savuc``. Notation, ignored targets and variants:
see :mod:`raysearch.losses.secondary`.

Imports: torch, :mod:`raysearch.losses._common` and :mod:`raysearch.losses.secondary` only.

References:
    Karandikar, Cain, Tran, Lakshminarayanan, Shlens, Mozer and Roelofs, "Soft Calibration
    Objectives for Neural Networks", NeurIPS 2021, arXiv:2108.00106. Released code (footnote 2
    of the paper): google/uncertainty-baselines ``experimental/caltrain/secondary_losses.py``.
    Krishnan and Tickoo, "Improving model calibration with accuracy versus uncertainty
    optimization", NeurIPS 2020, arXiv:2012.07923.
"""

import math

import torch

from raysearch.losses._common import DEFAULT_IGNORE_INDEX
from raysearch.losses.secondary import (
    CALTRAIN_EPS,
    OFFICIAL,
    SecondaryObjective,
    _canonical_variant,
    _confidence_and_accuracy,
    _finite,
    _open_unit,
    _positive,
)

#: Variants of :class:`SoftAvUC`, :class:`AvUC` and :class:`AvUCGS` (``"caltrain"`` is an
#: older name of ``"official"``).
AVUC_VARIANTS = ("official", "paper", "caltrain")


# --------------------------------------------------------------------------------------------
# Entropies, soft uncertainty and the AvUC ratio
# --------------------------------------------------------------------------------------------


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of softmax(logits), (M,), from ``log_softmax`` (finite for finite logits)."""
    log_probs = torch.log_softmax(logits, dim=1)
    return -(log_probs.exp() * log_probs).sum(dim=1)


def _smoothed_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy of ``(1 - 1e-5) p + 1e-5 / K``, as the released code computes it, (M,)."""
    num_classes = probs.shape[1]
    smoothed = (1.0 - CALTRAIN_EPS) * probs + CALTRAIN_EPS / num_classes
    return -(smoothed * smoothed.log()).sum(dim=1)


def soft_uncertainty(
    normalized_entropy: torch.Tensor, kappa: float, temperature: float
) -> torch.Tensor:
    r"""Soft uncertainty :math:`t_{\kappa,T}(h^*)` of Karandikar et al., Sec. 4.2.

    .. math::

        t_{\kappa,T}(h^*) = \mathrm{logistic}\Big(\frac{1}{T}
        \log\frac{h^*(1-\kappa)}{(1-h^*)\kappa}\Big)

    increasing from 0 at :math:`h^* = 0` to 1 at :math:`h^* = 1`, 1/2 at :math:`h^* = \kappa`;
    the identity for :math:`\kappa = 1/2, T = 1` and a hard threshold at :math:`\kappa` as
    :math:`T \to 0`. The end points take their limits (0 for :math:`h^* \le 0`, 1 for
    :math:`h^* \ge 1`, with zero gradient), so one-hot or exactly uniform predictions do not give
    NaN.

    Args:
        normalized_entropy (torch.Tensor): :math:`h^* = h / \log K`, any shape.
        kappa (float): soft threshold in (0, 1) (not checked here).
        temperature (float): sharpness T > 0 (not checked here).

    Returns:
        Tensor of the shape of ``normalized_entropy``, values in [0, 1].
    """
    inside = (normalized_entropy > 0) & (normalized_entropy < 1)
    safe = torch.where(inside, normalized_entropy, torch.full_like(normalized_entropy, 0.5))
    log_odds = safe.log() - torch.log1p(-safe) - math.log(kappa / (1.0 - kappa))
    soft = torch.sigmoid(log_odds / temperature)
    limit = (normalized_entropy >= 1).to(normalized_entropy.dtype)
    return torch.where(inside, soft, limit)


def _avuc_ratio(
    accurate: torch.Tensor,
    uncertain_weight: torch.Tensor,
    certain_weight: torch.Tensor,
    tanh_entropy: torch.Tensor,
    floor: float | None,
) -> torch.Tensor:
    """``log(1 + (n_AU + n_IC) / (n_AC + n_IU))`` of Eq. 13/15 from per-sample factors.

    ``uncertain_weight`` multiplies ``tanh h`` and ``certain_weight`` multiplies ``1 - tanh h``;
    accurate samples count in AU / AC, inaccurate ones in IU / IC. ``floor`` is the released
    code's lower bound on the denominator (None: no bound).
    """
    inaccurate = 1.0 - accurate
    uncertain_term = uncertain_weight * tanh_entropy
    certain_term = certain_weight * (1.0 - tanh_entropy)
    n_au = (accurate * uncertain_term).sum()
    n_iu = (inaccurate * uncertain_term).sum()
    n_ac = (accurate * certain_term).sum()
    n_ic = (inaccurate * certain_term).sum()
    denominator = n_ac + n_iu
    if floor is not None:
        denominator = denominator.clamp(min=floor)
    return torch.log1p((n_au + n_ic) / denominator)


# --------------------------------------------------------------------------------------------
# The training objectives
# --------------------------------------------------------------------------------------------


class SoftAvUC(SecondaryObjective):
    r"""Primary loss + beta * soft AvUC, S-AvUC (registry name ``savuc``).

    S-AvUC (Karandikar et al., Sec. 4.2, Eq. 15-16) softens the certain/uncertain split of AvUC
    with the soft uncertainty :math:`t_i = t_{\kappa,T}(h^*_i)` (:func:`soft_uncertainty`) of
    the normalised entropy :math:`h^*_i = h_i / \log K`:

    .. math::

        \mathrm{S\text{-}AvUC} = \log\Big(1 + \frac{n'_{AU} + n'_{IC}}{n'_{AC} + n'_{IU}}\Big),

    :math:`n'_{AU} = \sum_{a_i=1} t_i \tanh h_i`,
    :math:`n'_{IC} = \sum_{a_i=0} (1 - t_i)(1 - \tanh h_i)`,
    :math:`n'_{AC} = \sum_{a_i=1} (1 - t_i)(1 - \tanh h_i)`,
    :math:`n'_{IU} = \sum_{a_i=0} t_i \tanh h_i`, where :math:`\tanh` takes the raw entropy
    :math:`h_i` in nats (Eq. 16) and :math:`t` the normalised one. The confidences do not appear;
    the gradient flows through :math:`h_i` (both in :math:`t_i` and in :math:`\tanh h_i`).

    ``variant="official"`` (the default) is the released ``get_soft_avuc_loss`` of
    google/uncertainty-baselines ``experimental/caltrain/secondary_losses.py`` (with
    ``soft_avuc_use_deprecated_v0=False``, the :math:`t_{\kappa,T}` path): the entropy (in
    :math:`h^*` and in :math:`\tanh h`) is that of :math:`(1 - 10^{-5}) p + 10^{-5}/K`, and the
    denominator is floored at :math:`10^{-5}`. ``"caltrain"`` is an older name for it.
    ``variant="paper"`` is Eq. 15-16 as written, with no guard: a batch with
    :math:`n'_{AC} + n'_{IU} = 0` gives ``inf``. :math:`t` uses :func:`soft_uncertainty` in both
    variants (its end-point limits only matter where the released code would give NaN). The
    released code's deprecated v0 path (a softmax over :math:`-(h - \log K)^2` and
    :math:`-h^2`, with no kappa or T) is not reproduced: the paper tunes kappa and T (App. G),
    which only the :math:`t_{\kappa,T}` path has.

    Why the released code is the default: it is the implementation the authors published with
    the paper (footnote 2) and the closest available reproduction of Tables 1-2 (the training
    driver is not public). Here the two variants differ only by the 1e-5 smoothing (relative
    differences of 1e-5 to 1e-4 on ordinary batches) and where the paper's ratio is infinite
    (no accurate-certain or inaccurate-uncertain mass), which the released floor turns into a
    finite, trainable value.

    References:
        Karandikar et al., "Soft Calibration Objectives for Neural Networks", NeurIPS 2021,
        arXiv:2108.00106; code: google/uncertainty-baselines
        ``experimental/caltrain/secondary_losses.py``. AvUC: Krishnan and Tickoo, NeurIPS 2020,
        arXiv:2012.07923.

    Args:
        beta (float, optional): weight of S-AvUC, finite, >= 0. Defaults to ``1.0``.
        primary (str or None, optional): ``"ce"``, ``"focal"``, ``"mse"`` or None (the
            secondary term alone). Defaults to ``"ce"``.
        primary_params (dict or None, optional): parameters of the primary, e.g.
            ``{"gamma": 3.0}``. Defaults to None.
        ignore_index (int, optional): keyword-only; a target value that counts nowhere, as
            in :class:`~raysearch.losses.SecondaryObjective`.
        kappa (float, optional): soft entropy threshold on the normalised entropy, in (0, 1).
            Defaults to ``0.5``.
        temperature (float, optional): sharpness T > 0 of the soft threshold. Defaults to
            ``1.0`` (with ``kappa=0.5``, t is the identity).
        variant (str, optional): ``"official"`` (released code), ``"paper"`` (Eq. 15-16) or
            ``"caltrain"`` (= ``"official"``). Defaults to ``"official"``.

    Returns:
        Scalar tensor: PL (batch mean) + beta * S-AvUC of the batch.

    Raises:
        TypeError: if a parameter has the wrong type.
        ValueError: if ``beta`` < 0, ``kappa`` is not in (0, 1), ``temperature`` <= 0,
            ``variant`` is unknown or ``primary`` / ``primary_params`` is invalid; in
            ``forward``, if K < 2 (the entropy is normalised by log K).
    """

    repr_names = (*SecondaryObjective.repr_names, "kappa", "temperature", "variant")

    def __init__(
        self,
        beta: float = 1.0,
        primary: str | None = "ce",
        primary_params: dict[str, float] | None = None,
        kappa: float = 0.5,
        temperature: float = 1.0,
        variant: str = OFFICIAL,
        *,
        ignore_index: int = DEFAULT_IGNORE_INDEX,
    ) -> None:
        super().__init__(beta, primary, primary_params, ignore_index=ignore_index)
        self.kappa = _open_unit("kappa", kappa)
        self.temperature = _positive("temperature", temperature)
        self.variant = _canonical_variant(variant, AVUC_VARIANTS)

    def _check_secondary_rows(self, logits: torch.Tensor) -> None:
        """Raise ValueError if K < 2 (S-AvUC normalises the entropy by log K)."""
        if logits.shape[1] < 2:
            raise ValueError(
                f"S-AvUC needs K >= 2 classes (it normalises the entropy by log K), got logits "
                f"of shape {tuple(logits.shape)}"
            )

    def _rows_secondary(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """S-AvUC (Eq. 15) of the (M, K) kept rows, K >= 2."""
        num_classes = logits.shape[1]
        probs, _, accuracy = _confidence_and_accuracy(logits, targets)
        if self.variant == OFFICIAL:
            entropy = _smoothed_entropy(probs)
            floor = CALTRAIN_EPS
        else:
            entropy = _entropy(logits)
            floor = None
        uncertainty = soft_uncertainty(
            entropy / math.log(num_classes), self.kappa, self.temperature
        )
        return _avuc_ratio(accuracy, uncertainty, 1.0 - uncertainty, torch.tanh(entropy), floor)


class AvUC(SecondaryObjective):
    r"""Primary loss + beta * AvUC (registry name ``avuc``).

    Accuracy versus uncertainty calibration (Krishnan and Tickoo; Karandikar et al., Eq. 13-14)
    splits the batch into accurate/inaccurate (:math:`a_i`) and certain/uncertain (entropy
    :math:`h_i < \kappa` / :math:`h_i \ge \kappa`) and relaxes the four counts:

    .. math::

        \mathrm{AvUC} = \log\Big(1 + \frac{n_{AU} + n_{IC}}{n_{AC} + n_{IU}}\Big),

    :math:`n_{AU} = \sum_{AU} c_i \tanh h_i`,
    :math:`n_{IC} = \sum_{IC} (1 - c_i)(1 - \tanh h_i)`,
    :math:`n_{AC} = \sum_{AC} c_i (1 - \tanh h_i)`,
    :math:`n_{IU} = \sum_{IU} (1 - c_i) \tanh h_i`.

    ``kappa`` is a threshold on the RAW entropy :math:`h_i` in nats (in [0, log K]), as in the
    paper (Sec. 4.2: "entropy ... above or below a threshold") and in the released code (which
    compares the entropy with ``avuc_entropy_threshold``); it is not normalised by log K, unlike
    the ``kappa`` of :class:`SoftAvUC`. Samples with :math:`h_i = \kappa` are uncertain. The
    split is piecewise constant (no gradient); the gradient flows through :math:`c_i` and
    :math:`h_i`.

    ``variant="official"`` (the default) is the released ``get_avuc_loss`` of
    google/uncertainty-baselines ``experimental/caltrain/secondary_losses.py`` with
    ``avuc_stop_prob_gradients=False``: the entropy (for the split and in :math:`\tanh h`) is
    that of :math:`(1 - 10^{-5}) p + 10^{-5}/K` and the denominator is floored at
    :math:`10^{-5}`. ``"caltrain"`` is an older name for it. ``variant="paper"`` is Eq. 13-14 as
    written, with no guard (a zero denominator gives ``inf``). Why the released code is the
    default: AvUC is a baseline of Karandikar et al.'s Table 2 and ``get_avuc_loss`` is the
    implementation they released with the paper (footnote 2; the training driver is not
    public); the variants differ only by the 1e-5 smoothing and where the paper's ratio is
    infinite.

    References:
        Krishnan and Tickoo, "Improving model calibration with accuracy versus uncertainty
        optimization", NeurIPS 2020, arXiv:2012.07923. Karandikar et al., NeurIPS 2021,
        arXiv:2108.00106, Eq. 13-14; code: google/uncertainty-baselines
        ``experimental/caltrain/secondary_losses.py``.

    Args:
        beta (float, optional): weight of AvUC, finite, >= 0. Defaults to ``1.0``.
        primary (str or None, optional): ``"ce"``, ``"focal"``, ``"mse"`` or None (the
            secondary term alone). Defaults to ``"ce"``.
        primary_params (dict or None, optional): parameters of the primary, e.g.
            ``{"gamma": 3.0}``. Defaults to None.
        ignore_index (int, optional): keyword-only; a target value that counts nowhere, as
            in :class:`~raysearch.losses.SecondaryObjective`.
        kappa (float, optional): entropy threshold in nats, finite, >= 0 (useful values lie in
            (0, log K)). Defaults to ``0.5``.
        variant (str, optional): ``"official"`` (released code), ``"paper"`` (Eq. 13-14) or
            ``"caltrain"`` (= ``"official"``). Defaults to ``"official"``.

    Returns:
        Scalar tensor: PL (batch mean) + beta * AvUC of the batch.

    Raises:
        TypeError: if a parameter has the wrong type.
        ValueError: if ``beta`` < 0, ``kappa`` < 0 or infinite, ``variant`` is unknown or
            ``primary`` / ``primary_params`` is invalid.
    """

    repr_names = (*SecondaryObjective.repr_names, "kappa", "variant")

    #: Whether the confidence factors c_i and 1 - c_i are detached (AvUC-GS).
    stop_confidence_gradient = False

    def __init__(
        self,
        beta: float = 1.0,
        primary: str | None = "ce",
        primary_params: dict[str, float] | None = None,
        kappa: float = 0.5,
        variant: str = OFFICIAL,
        *,
        ignore_index: int = DEFAULT_IGNORE_INDEX,
    ) -> None:
        super().__init__(beta, primary, primary_params, ignore_index=ignore_index)
        self.kappa = _finite("kappa", kappa, minimum=0.0)
        self.variant = _canonical_variant(variant, AVUC_VARIANTS)

    def _rows_secondary(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """AvUC of the (M, K) kept rows (Eq. 13)."""
        probs, confidence, accuracy = _confidence_and_accuracy(logits, targets)
        if self.stop_confidence_gradient:
            confidence = confidence.detach()
        if self.variant == OFFICIAL:
            entropy = _smoothed_entropy(probs)
            floor = CALTRAIN_EPS
        else:
            entropy = _entropy(logits)
            floor = None
        uncertain = (entropy.detach() >= self.kappa).to(entropy.dtype)
        # AU / IU carry c (accurate) or 1 - c (inaccurate) times tanh h, only when uncertain;
        # AC / IC carry c or 1 - c times 1 - tanh h, only when certain.
        factor = accuracy * confidence + (1.0 - accuracy) * (1.0 - confidence)
        return _avuc_ratio(
            accuracy, uncertain * factor, (1.0 - uncertain) * factor, torch.tanh(entropy), floor
        )


class AvUCGS(AvUC):
    r"""Primary loss + beta * AvUC with gradient stopping, AvUC-GS (registry name ``avuc_gs``).

    :class:`AvUC` with the gradient stopped through the confidence factors :math:`c_i` and
    :math:`1 - c_i` of Eq. 14 (Karandikar et al., App. F); the gradient still flows through
    :math:`\tanh h_i`. Same value, parameters and variants as :class:`AvUC` (``kappa`` on the
    raw entropy in nats). ``variant="official"`` (the default; ``"caltrain"`` is an older name)
    is the released ``get_avuc_loss`` of google/uncertainty-baselines
    ``experimental/caltrain/secondary_losses.py`` with ``avuc_stop_prob_gradients=True``
    (1e-5 smoothing of p in the entropy, denominator floored at 1e-5); ``variant="paper"`` is
    App. F as written. The released code is the default because AvUC-GS is a row of Table 2
    and that function is the implementation released with the paper (the training driver is
    not public); the variants differ only by the 1e-5 smoothing and where the paper's ratio is
    infinite.

    References:
        Karandikar et al., "Soft Calibration Objectives for Neural Networks", NeurIPS 2021,
        arXiv:2108.00106, App. F.

    Args, returns and errors: as :class:`AvUC` (``beta`` weighs AvUC-GS; ``variant="paper"`` is
    App. F as written).

    """

    stop_confidence_gradient = True
