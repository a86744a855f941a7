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

The built-ins are the plain dict ``_LOSSES`` below (a new loss is a class in its family file plus
one line here); with the installed plug-ins (entry-point group ``raysearch.losses``) they form
:data:`LOSS_REGISTRY` (:mod:`raysearch.registry`). Every function here also takes an import
string ``package.module:attr`` or the class itself: a user's loss is an ``nn.Module`` class (or a
factory returning one) whose keyword arguments are its hyperparameters, called as
``loss_fn(logits, targets)``.

Per-sample side inputs: a loss whose class attribute ``side_inputs`` names keyword inputs
(``objectness`` for ``als``, ``index`` for ``crl``) gets them from the training loop, batch by
batch (:mod:`raysearch.training.data.side`); called by hand, it needs them as keywords, e.g.
``loss_fn(logits, targets, index=positions)``.

**Layer.** Science, the second floor of the house: plain PyTorch. It imports
:mod:`raysearch.registry` and no other module of the package; no Ray, MLflow or Optuna.
Training, tracking, tune and the interface import it.
"""

import inspect
from typing import Any

from torch import nn

from raysearch.losses._common import DEFAULT_IGNORE_INDEX, checked_targets
from raysearch.losses.avuc import AvUC, AvUCGS, SoftAvUC
from raysearch.losses.classification import CrossEntropy, FocalLoss, FocalLossSD, LabelSmoothing
from raysearch.losses.margin import ACLS, MarginLabelSmoothing
from raysearch.losses.mmce_mdca import MDCA, MMCE
from raysearch.losses.objectness import ObjectnessLabelSmoothing
from raysearch.losses.pairwise import CorrectnessRankingLoss, PairwiseConstraints
from raysearch.losses.penalties import ConfidencePenalty
from raysearch.losses.secondary import SecondaryObjective
from raysearch.losses.soft_binning import SoftBinnedECE
from raysearch.registry import Registry, accepted_keywords, object_label

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
    # pairwise baselines of ACLS (supp. S1.2, S1.5): class pairs (CPC), sample pairs ranked by
    # their correctness history (CRL: takes each sample's training-split ``index``)
    "cpc": PairwiseConstraints,
    "crl": CorrectnessRankingLoss,
}

#: Built-in losses plus the installed plug-ins (entry-point group ``raysearch.losses``).
LOSS_REGISTRY = Registry("losses", _LOSSES)

__all__ = [
    "ACLS",
    "MDCA",
    "MMCE",
    "AvUC",
    "AvUCGS",
    "ConfidencePenalty",
    "CorrectnessRankingLoss",
    "ObjectnessLabelSmoothing",
    "PairwiseConstraints",
    "SecondaryObjective",
    "SoftAvUC",
    "SoftBinnedECE",
    "CrossEntropy",
    "FocalLoss",
    "FocalLossSD",
    "LabelSmoothing",
    "LOSS_REGISTRY",
    "MarginLabelSmoothing",
    "available_losses",
    "build_loss",
    "checked_targets",
    "loss_parameters",
]


def available_losses() -> list[str]:
    """Return the registered loss names (built-ins and plug-ins), sorted.

    Returns:
        Sorted list of the names accepted by :func:`build_loss`.
    """
    return LOSS_REGISTRY.names()


def _loss_class(name: Any) -> Any:
    """The loss class (or factory) of a name, an import string or the object itself.

    Raises:
        ValueError: if ``name`` is not registered and not an importable import string; the
            message gives the closest names and lists the registered ones.
    """
    return LOSS_REGISTRY.get(name)


def loss_label(name: Any) -> str:
    """The name a loss is recorded under: as given, or a class's import string."""
    return name if isinstance(name, str) else object_label(name)


def loss_parameters(name: Any) -> dict[str, object]:
    """Return the keyword parameters of a loss and their defaults.

    Read from the signature of the loss class's ``__init__`` (or of a factory function); a
    parameter without a default is listed with ``inspect.Parameter.empty``. The search-space
    validator uses it to reject unknown parameters. The keyword-only ``ignore_index`` that every
    built-in loss takes is left out: it describes the data, not a hyperparameter to search (pass
    it to :func:`build_loss` on its own).

    Args:
        name: a registered loss name (``"acls"``), an import string or a loss class/factory.

    Returns:
        ``{parameter: default}`` in signature order, e.g. ``{"epsilon": 0.05}`` for ``"ls"`` and
        ``{}`` for ``"ce"``.

    Raises:
        ValueError: if ``name`` is not a registered loss or importable.
    """
    target = _loss_class(name)
    try:
        signature = inspect.signature(target.__init__ if inspect.isclass(target) else target)
    except (TypeError, ValueError):
        return {}
    return {
        param.name: param.default
        for param in signature.parameters.values()
        if param.name not in ("self", "ignore_index")
        and param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def build_loss(
    name: Any, *, ignore_index: int | None = DEFAULT_IGNORE_INDEX, **params: object
) -> nn.Module:
    """Build a loss by name, import string or class.

    Args:
        name: a registered loss name (see :func:`available_losses`), an import string
            ``package.module:attr`` naming an ``nn.Module`` class or a factory returning one,
            or that class/factory itself.
        ignore_index: target value of the locations that count nowhere (no cross-entropy, no
            regulariser, no mean or batch statistic); e.g. ``255`` for the object boundaries of
            PASCAL VOC segmentation. Set as ``loss_fn.ignore_index``; not one of
            :func:`loss_parameters`. Passed to a user's loss only if it takes it; ``None`` (or
            the default ``-100``, ``torch.nn.CrossEntropyLoss``'s) passes nothing to such a loss.
        **params: keyword parameters of that loss (see :func:`loss_parameters`); omitted ones
            take their defaults.

    Returns:
        The loss module; ``loss_fn(logits, targets)`` returns the scalar total objective, with
        logits (N, K) or (N, K, d1, ..., dm) float and targets (N,) or (N, d1, ..., dm) int64,
        each in [0, K) or ``ignore_index``. For the built-ins it equals the loss on the (M, K)
        rows of the locations whose target is not ``ignore_index``, and is 0 (gradient 0) when
        M = 0.

    Raises:
        ValueError: if ``name`` is unknown ("Unknown loss 'x'; did you mean ...? available:
            acls, ce, ..."), if a parameter is not accepted by that loss (the message names it
            and lists the accepted ones), if a parameter value is out of range (raised by the
            loss), if a user's loss raises while being built, returns something that is not
            callable, or does not take the ``ignore_index`` the data needs.
        TypeError: if a parameter value has the wrong type, ``ignore_index`` included (raised by
            a built-in loss).
    """
    loss_class = _loss_class(name)
    label = loss_label(name)
    accepted = loss_parameters(loss_class)
    _, var_kw = accepted_keywords(loss_class)
    unexpected = sorted(set(params) - set(accepted))
    if unexpected and not var_kw:
        raise ValueError(
            f"loss {label!r} got unexpected parameter(s) {', '.join(unexpected)}; "
            f"accepted: {', '.join(accepted) or '(none)'}"
        )
    takes_ignore = "ignore_index" in accepted_keywords(loss_class)[0]
    if takes_ignore:  # (a built-in checks the value itself: None is a TypeError there)
        return loss_class(**params, ignore_index=ignore_index)
    if not takes_ignore and ignore_index not in (None, DEFAULT_IGNORE_INDEX):
        raise ValueError(f"loss {label!r} takes no `ignore_index`, but the data marks targets "
                         f"to ignore with {ignore_index}: add an `ignore_index` keyword to it")
    if loss_class in _LOSSES.values():
        return loss_class(**params)
    try:
        loss = loss_class(**params)
    except (ValueError, TypeError):
        raise
    except Exception as exc:  # noqa: BLE001 (a user's loss: one line naming it)
        raise ValueError(f"loss {label!r} raised {type(exc).__name__} while being built: "
                         f"{' '.join(str(exc).split())}") from None
    if not callable(loss):
        raise ValueError(f"loss {label!r} returned {type(loss).__name__}, expected an "
                         "nn.Module called as loss(logits, targets)")
    return loss
