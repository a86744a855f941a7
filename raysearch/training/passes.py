"""The training passes of one epoch: every batch's forward pass, loss and optimiser step.

:func:`train_pass` runs one pass over an epoch's batches (plain, with MixUp/CutMix/RICAP, or
with a loss's per-sample side inputs) and :func:`train_pass_interleaved` the two-part epoch of
interleaved training (Karandikar et al., App. B); both return ``train_loss`` and
``train_accuracy``. :func:`train_forward` is the training forward pass (the run's autocast,
float32 logits for the loss). Each batch's loss goes through the run's
:class:`~raysearch.training.divergence.Guard` (divergence check, backward pass, optimiser
step). :func:`raysearch.training.run.fit` calls them once per epoch.

Imports :mod:`raysearch.training.loop`, :mod:`raysearch.training.divergence`,
:mod:`raysearch.training.interleaving` and :mod:`raysearch.training.models` of the package; never
:mod:`raysearch.training.run`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from raysearch.training.divergence import Guard
from raysearch.training.interleaving import loss_term
from raysearch.training.loop import Amp, Dist, Source
from raysearch.training.models import output_logits

__all__ = ["train_forward", "train_pass", "train_pass_interleaved"]


def train_pass(
    model: nn.Module,
    loss_fn: nn.Module,
    guard: Guard,
    batches: Iterator[tuple[Tensor, Tensor, Tensor]],
    n: int,
    amp: Amp,
    *,
    side: dict[str, Tensor] | None = None,
    mixer: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]] | None = None,
    ddp: Dist | None = None,
    ignore_index: int | None = None,
    label: str = "the model",
) -> dict[str, float]:
    """One pass over `batches`; returns ``train_loss`` and ``train_accuracy``.

    For dense targets (segmentation masks) the accuracy is over the pixels whose label is not
    `ignore_index`.

    ``side`` holds per-sample keyword inputs of the loss (``objectness``, ``context``), indexed
    like the dataset and passed batch by batch. With `mixer` the accuracy is against the
    batch's own (unmixed) labels. With `ddp` the batches are this rank's shares
    ``(x, y, index, n_batch)`` and the sums are all-reduced over the ranks.
    """
    loss_sum = torch.zeros((), dtype=torch.float64, device=amp.device)
    correct = torch.zeros((), dtype=torch.int64, device=amp.device)
    counted = torch.zeros((), dtype=torch.int64, device=amp.device)
    seen = 0  # predictions of classification batches, counted on the host
    for batch, (xb, yb, index, *rest) in enumerate(batches, start=1):
        if mixer is not None and len(yb):
            xb, lam, partner = mixer(xb, yb)
            logits = train_forward(model, xb, amp, label)
            if partner.ndim == 2:  # RICAP: patch weights (4,), patch labels (4, N)
                loss = sum(w * loss_fn(logits, t) for w, t in zip(lam.tolist(), partner,
                                                                 strict=True) if w > 0)
            else:
                loss = lam * loss_fn(logits, yb) + (1 - lam) * loss_fn(logits, partner)
        else:
            logits = train_forward(model, xb, amp, label)
            if not len(yb):  # an empty DDP share: no loss, but the same collectives
                loss = logits.sum() * 0.0
            elif side:
                loss = loss_fn(logits, yb, **{key: value[index] for key, value in side.items()})
            else:
                loss = loss_fn(logits, yb)
        guard.step(loss, batch, share=(len(yb), rest[0]) if rest else None)
        # one kernel each, no host sync: the float32 loss is summed in float64
        loss_sum.add_(loss.detach(), alpha=len(yb))
        hit = logits.detach().argmax(dim=1) == yb
        if ignore_index is not None and yb.ndim > 1:  # dense targets: valid pixels only
            valid = yb != ignore_index
            correct += (hit & valid).sum()
            counted += valid.sum()
        else:
            correct += hit.sum()
            seen += hit.numel()
    counted += seen
    return _train_metrics(loss_sum, correct, n, ddp, counted=counted)


def _train_metrics(
    loss_sum: Tensor, correct: Tensor, n: int, ddp: Dist | None, counted: Tensor | None = None
) -> dict[str, float]:
    """``train_loss`` and ``train_accuracy`` from the sums of one epoch (all ranks' in DDP).

    `counted` is the number of predictions the accuracy is over (pixels for dense targets);
    None: `n`.
    """
    if ddp is not None:
        loss_sum, correct = ddp.all_sum(loss_sum), ddp.all_sum(correct)
        if counted is not None:
            counted = ddp.all_sum(counted)
    total = n if counted is None else max(int(counted.item()), 1)
    return {"train_loss": loss_sum.item() / n, "train_accuracy": correct.item() / total}


def train_forward(model: nn.Module, x: Tensor, amp: Amp, label: str = "the model") -> Tensor:
    """Training forward pass under the run's autocast; float32 logits for the loss.

    The model may return the logits, a tuple whose first item is the logits, or a mapping with
    ``logits`` (:func:`raysearch.training.models.output_logits`).
    """
    with amp.autocast():
        logits = output_logits(model(amp.prepare(x)), model=label)
    return logits.float()


def train_pass_interleaved(
    model: nn.Module,
    loss_fn: nn.Module,
    guard: Guard,
    source: Source,
    parts: tuple[np.ndarray | Tensor, np.ndarray | Tensor],
    batch_size: int,
    generator: torch.Generator,
    augment: torch.Generator,
    amp: Amp,
    ddp: Dist | None = None,
    label: str = "the model",
) -> dict[str, float]:
    """One interleaved epoch (App. B): primary on majority batches, then beta * secondary.

    ``parts`` are the (majority, held-out) index tensors into the training split. Both parts
    are reshuffled with ``generator`` (majority first); the batch number in error messages
    counts through the whole epoch. With `ddp` each rank trains on its shares.
    """
    n = sum(len(part) for part in parts)
    loss_sum = torch.zeros((), dtype=torch.float64, device=amp.device)
    correct = torch.zeros((), dtype=torch.int64, device=amp.device)
    beta = float(loss_fn.beta)
    batch = 0
    for term, part in zip(("primary", "secondary"), parts, strict=True):
        part = torch.as_tensor(part)
        order = part[torch.randperm(len(part), generator=generator)]
        for xb, yb, _, *rest in source.batches(order, batch_size, augment, ddp):
            batch += 1
            logits = train_forward(model, xb, amp, label)
            if not len(yb):  # an empty DDP share: no loss, but the same collectives
                loss = logits.sum() * 0.0
            else:
                loss = loss_term(loss_fn, logits, yb, term)
            if term == "secondary":
                loss = beta * loss
            guard.step(loss, batch, f"{term} step, ", share=(len(yb), rest[0]) if rest else None)
            loss_sum.add_(loss.detach(), alpha=len(yb))
            correct += (logits.detach().argmax(dim=1) == yb).sum()
    return _train_metrics(loss_sum, correct, n, ddp)
