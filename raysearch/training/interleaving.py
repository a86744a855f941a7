"""Checks and data split of interleaved training (Karandikar et al. 2021, App. B).

:func:`check_interleavable` (the loss is a primary + secondary objective), :func:`loss_term` (one
of its terms, checked to be a differentiable scalar), :func:`interleave_fraction` (the
held-out share of ``cfg.interleave_fraction``) and :func:`interleave_split` (the stratified,
seeded majority / held-out split of the training indices). The interleaved epoch itself is
:func:`raysearch.training.passes.train_pass_interleaved`; see :func:`raysearch.training.run.fit`
(**Interleaved training**).

Imports nothing of the package (but :mod:`raysearch.config` for type hints).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from raysearch.config import RunConfig


#: Start of the error raised when interleaved training gets a loss without primary/secondary.
_NOT_INTERLEAVABLE = "interleaved training needs a primary + secondary objective"


def check_interleavable(loss_fn: nn.Module, method: str, side_inputs: bool) -> None:
    """Reject losses that cannot be split into primary and secondary terms (before training)."""
    beta = getattr(loss_fn, "beta", None)
    if (
        side_inputs
        or not callable(getattr(loss_fn, "terms", None))
        or isinstance(beta, bool)
        or not isinstance(beta, (int, float))
    ):
        raise ValueError(
            f"{_NOT_INTERLEAVABLE} (a loss with terms(logits, targets) returning 'primary' and "
            f"'secondary' and a `beta` attribute, e.g. sbece or savuc), got loss {method!r}"
        )


def loss_term(loss_fn: nn.Module, logits: Tensor, targets: Tensor, name: str) -> Tensor:
    """``loss_fn.terms(logits, targets)[name]``, checked to be a differentiable scalar."""
    terms = loss_fn.terms(logits, targets)
    if not isinstance(terms, Mapping) or "primary" not in terms or "secondary" not in terms:
        keys = sorted(terms) if isinstance(terms, Mapping) else type(terms).__name__
        raise ValueError(
            f"{_NOT_INTERLEAVABLE}: {type(loss_fn).__name__}.terms() must return 'primary' and "
            f"'secondary', got {keys}"
        )
    value = terms[name]
    if not isinstance(value, Tensor) or value.ndim != 0:
        raise ValueError(f"terms()[{name!r}] must be a scalar tensor, got {value!r}")
    if torch.is_grad_enabled() and not value.requires_grad:
        raise ValueError(
            f"terms()[{name!r}] of {type(loss_fn).__name__} carries no gradient; interleaved "
            "training steps on it (is the primary None, or is the term detached?)"
        )
    return value


def interleave_fraction(cfg: RunConfig) -> float:
    """``cfg.interleave_fraction`` (default 0.1), checked to be in (0, 1)."""
    fraction = cfg.interleave_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"`interleave_fraction` must be in (0, 1), got {fraction!r}")
    return float(fraction)


def interleave_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Stratified, seeded (majority, held-out) split of the training indices.

    ``train_test_split(range(n), test_size=fraction, stratify=labels, random_state=seed)``: the
    held-out part has ``ceil(fraction * n)`` samples. Returns sorted int64 index tensors.

    Raises:
        ValueError: if the split cannot be stratified (a class with one sample, or fewer
            held-out samples than classes).
    """
    from sklearn.model_selection import train_test_split

    index = np.arange(len(labels))
    try:
        majority, held_out = train_test_split(
            index, test_size=fraction, stratify=labels, random_state=seed % 2**32
        )
    except ValueError as exc:
        raise ValueError(
            f"`interleave_fraction`={fraction} cannot hold out a stratified part of the "
            f"{len(labels)} training samples: {exc}"
        ) from None
    return torch.from_numpy(np.sort(majority)), torch.from_numpy(np.sort(held_out))
