"""Train-time losses for network calibration and their name registry.

Every loss is an ``nn.Module`` whose ``forward(logits, targets)`` returns one scalar, the total
training objective (primary + regulariser), averaged over samples. Build one by name::

    from raysearch.losses import build_loss
    loss_fn = build_loss("acls", margin=10.0, lambda1=0.1, lambda2=0.01)
    loss = loss_fn(logits, targets)

Inputs: logits (N, K) or (N, K, d1, ..., dm) float (every location of a dense prediction is one
sample); targets (N,) or (N, d1, ..., dm) int64, each a class in [0, K) or ``ignore_index``.

Ignored targets: every loss takes a keyword-only ``ignore_index`` (an int, ``-100`` by default as
in ``torch.nn.CrossEntropyLoss``; ``build_loss(name, ignore_index=255)`` for the boundary label of
PASCAL VOC). A location whose target equals it counts nowhere: not in the cross-entropy, not in
the regulariser, not in any mean or batch statistic (bins, kernels, class means). Its value equals
the loss on the (M, K) rows of the other locations; a batch with every target ignored gives 0
(gradient 0). ``ignore_index`` is not a hyperparameter: :func:`loss_parameters` leaves it out.

The registry is the plain dict ``_LOSSES`` below; a new loss is a class in its family file plus
one line here.
"""

import inspect

from torch import nn

from raysearch.losses._common import DEFAULT_IGNORE_INDEX
from raysearch.losses.classification import CrossEntropy, FocalLoss, FocalLossSD, LabelSmoothing
from raysearch.losses.margin import ACLS, MarginLabelSmoothing
from raysearch.losses.objectness import ObjectnessLabelSmoothing
from raysearch.losses.penalties import ConfidencePenalty
from raysearch.losses.soft_calibration import (
    MDCA,
    MMCE,
    AvUC,
    AvUCGS,
    SecondaryObjective,
    SoftAvUC,
    SoftBinnedECE,
)

_LOSSES: dict[str, type[nn.Module]] = {
    "ce": CrossEntropy,
    "ls": LabelSmoothing,
    "focal": FocalLoss,
    "flsd": FocalLossSD,
    "mbls": MarginLabelSmoothing,
    "acls": ACLS,
    "ecp": ConfidencePenalty,
    "als": ObjectnessLabelSmoothing,
    # secondary objectives of Karandikar et al. (total = primary + beta * secondary) and the
    # baselines they and ACLS compare against
    "sbece": SoftBinnedECE,
    "savuc": SoftAvUC,
    "avuc": AvUC,
    "avuc_gs": AvUCGS,
    "mmce": MMCE,
    "mdca": MDCA,
}

__all__ = [
    "ACLS",
    "MDCA",
    "MMCE",
    "AvUC",
    "AvUCGS",
    "ConfidencePenalty",
    "ObjectnessLabelSmoothing",
    "SecondaryObjective",
    "SoftAvUC",
    "SoftBinnedECE",
    "CrossEntropy",
    "FocalLoss",
    "FocalLossSD",
    "LabelSmoothing",
    "MarginLabelSmoothing",
    "available_losses",
    "build_loss",
    "loss_parameters",
]


def available_losses() -> list[str]:
    """Return the registered loss names, sorted.

    Returns:
        Sorted list of the names accepted by :func:`build_loss`.
    """
    return sorted(_LOSSES)


def _loss_class(name: str) -> type[nn.Module]:
    """Look a loss class up by name.

    Raises:
        ValueError: if ``name`` is not registered; the message lists the registered names.
    """
    if not isinstance(name, str) or name not in _LOSSES:
        raise ValueError(f"Unknown loss {name!r}; available: {', '.join(available_losses())}")
    return _LOSSES[name]


def loss_parameters(name: str) -> dict[str, object]:
    """Return the keyword parameters of a loss and their defaults.

    Read from the signature of the loss class's ``__init__``; every registered loss gives each
    parameter a default. The search-space validator uses it to reject unknown parameters. The
    keyword-only ``ignore_index`` that every loss takes is left out: it describes the data, not a
    hyperparameter to search (pass it to :func:`build_loss` on its own).

    Args:
        name: a registered loss name, e.g. ``"acls"``.

    Returns:
        ``{parameter: default}`` in signature order, e.g. ``{"epsilon": 0.05}`` for ``"ls"`` and
        ``{}`` for ``"ce"``.

    Raises:
        ValueError: if ``name`` is not a registered loss.
    """
    signature = inspect.signature(_loss_class(name).__init__)
    return {
        param.name: param.default
        for param in signature.parameters.values()
        if param.name not in ("self", "ignore_index")
        and param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def build_loss(
    name: str, *, ignore_index: int = DEFAULT_IGNORE_INDEX, **params: object
) -> nn.Module:
    """Build a registered loss by name.

    Args:
        name: a registered loss name (see :func:`available_losses`).
        ignore_index: target value of the locations that count nowhere (no cross-entropy, no
            regulariser, no mean or batch statistic); e.g. ``255`` for the object boundaries of
            PASCAL VOC segmentation. Set as ``loss_fn.ignore_index``; not one of
            :func:`loss_parameters`. Defaults to ``-100`` (``torch.nn.CrossEntropyLoss``'s).
        **params: keyword parameters of that loss (see :func:`loss_parameters`); omitted ones
            take their defaults.

    Returns:
        The loss module; ``loss_fn(logits, targets)`` returns the scalar total objective, with
        logits (N, K) or (N, K, d1, ..., dm) float and targets (N,) or (N, d1, ..., dm) int64,
        each in [0, K) or ``ignore_index``. It equals the loss on the (M, K) rows of the
        locations whose target is not ``ignore_index``, and is 0 (gradient 0) when M = 0.

    Raises:
        ValueError: if ``name`` is unknown ("Unknown loss 'x'; available: acls, ce, ..."), if a
            parameter is not accepted by that loss (the message names it and lists the accepted
            ones), or if a parameter value is out of range (raised by the loss).
        TypeError: if a parameter value has the wrong type, ``ignore_index`` included (raised by
            the loss).
    """
    loss_class = _loss_class(name)
    accepted = loss_parameters(name)
    unexpected = sorted(set(params) - set(accepted))
    if unexpected:
        raise ValueError(
            f"loss {name!r} got unexpected parameter(s) {', '.join(unexpected)}; "
            f"accepted: {', '.join(accepted) or '(none)'}"
        )
    return loss_class(**params, ignore_index=ignore_index)
