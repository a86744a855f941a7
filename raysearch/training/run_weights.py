"""Where a run's weights start and how the optimiser steps them.

Pretrained weights (:func:`load_run_pretrained`), a resumed ``on_epoch`` state
(:func:`restore_run`), the classification head's parameter group (:func:`run_head_names`,
:func:`run_param_groups`: ``cfg.model.head_lr``), the frozen backbone of the first
``cfg.model.freeze_backbone_epochs`` epochs (:func:`freeze_backbone`) and the learning-rate
schedule (:func:`lr_factor`, stepped once per epoch by a ``LambdaLR``). See
:func:`raysearch.training.run.fit` (**Optimiser**, **Schedule**).

Imports (lazily) only :mod:`raysearch.training.models.pretrained` of the package (and
:mod:`raysearch.config` for type hints); never :mod:`raysearch.training.run`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from raysearch.config import RunConfig

__all__ = ["freeze_backbone", "load_run_pretrained", "lr_factor", "restore_run",
           "run_head_names", "run_param_groups"]

logger = logging.getLogger(__name__)


def load_run_pretrained(net: nn.Module, source: str) -> None:
    """Load pretrained weights into `net` (see :mod:`raysearch.training.models.pretrained`)."""
    from raysearch.training.models.pretrained import load_pretrained

    info = load_pretrained(net, source)
    logger.info("loaded %d tensors of %s (sha256 %s)%s", info.loaded, info.source,
                info.sha256[:12], "; head replaced" if info.replaced_head else "")


def restore_run(
    cfg: RunConfig,
    resume: dict[str, Any] | None,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[int, dict[str, float]]:
    """Load a `resume` state; returns the first epoch to train and the state's metrics.

    Without `resume`: ``(1, {})``.

    Raises:
        ValueError: if `resume` has no ``epoch``.
    """
    if resume is None:
        return 1, {}
    if "epoch" not in resume:
        raise ValueError(f"`resume` must be a state from on_epoch, got keys {sorted(resume)}")
    net.load_state_dict(resume["model"])
    optimizer.load_state_dict(resume["optimizer"])
    scheduler.load_state_dict(resume["scheduler"])
    start_epoch = int(resume["epoch"]) + 1
    logger.info("resuming %s/%s at epoch %d", cfg.loss.name, cfg.model.name, start_epoch)
    return start_epoch, dict(resume.get("metrics") or {})


def lr_factor(cfg: RunConfig) -> Callable[[int], float]:
    """The schedule of `cfg` as ``factor(i)``: epoch ``i + 1`` trains at ``lr * factor(i)``.

    See the module docstring (cosine / multistep / constant, linear warm-up from 0.1).
    """
    epochs = cfg.epochs
    warmup = cfg.schedule.warmup_epochs
    schedule = cfg.schedule.name
    milestones = cfg.schedule.milestone_epochs()
    decay = cfg.schedule.lr_decay

    def factor(i: int) -> float:
        if schedule == "cosine":
            span = max(epochs - warmup, 1)
            value = (1 + math.cos(math.pi * max(i - warmup, 0) / span)) / 2
        elif schedule == "multistep":
            value = decay ** sum(1 for m in milestones if m <= i)
        else:
            value = 1.0
        if i < warmup:
            value *= 0.1 + 0.9 * i / warmup
        return value

    return factor


def run_head_names(model: nn.Module, cfg: RunConfig) -> set[str]:
    """Parameter names of the classification head when the run treats it apart.

    That is with a head learning rate or a frozen backbone; empty otherwise.
    """
    if cfg.model.head_lr is None and not cfg.model.freeze_backbone_epochs:
        return set()
    from raysearch.training.models.pretrained import head_parameter_names

    return set(head_parameter_names(model))


def run_param_groups(model: nn.Module, cfg: RunConfig, head: set[str]) -> list[dict[str, Any]]:
    """Parameter groups: the head at ``model.head_lr`` (when set), the rest at ``lr``."""
    head_lr = cfg.model.head_lr
    if head_lr is None or not head:
        return [{"params": list(model.parameters())}]
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n not in head]},
            {"params": [p for n, p in named if n in head], "lr": head_lr}]


def freeze_backbone(model: nn.Module, head: set[str], frozen: bool) -> None:
    """``requires_grad`` off for every parameter outside the head while `frozen`, else on.

    SGD skips parameters without a gradient: no update, no weight decay, no momentum.
    """
    for name, param in model.named_parameters():
        if name not in head:
            param.requires_grad_(not frozen)
