"""The failure guards of a run: the divergence check of each batch, and out-of-memory errors.

``Guard(device, optimizer, epoch, ddp).step(loss, batch)`` checks that the loss is finite (at
once on the CPU; on CUDA on the device, read every ``_CHECK_EVERY`` batches and by
``Guard.check()``, with no host sync per batch), then runs the backward pass and the optimiser
step; in DDP mode the check agrees on every rank and each rank's loss is scaled so that DDP's
gradient average is the full-batch gradient. A NaN/inf raises
:class:`~raysearch.training.loop.DivergedError` naming the first bad batch. See
:func:`raysearch.training.run.fit` (**Divergence**).

An out-of-memory error (``torch.OutOfMemoryError``) raised while training or evaluating becomes
:class:`OutOfMemoryRunError`, one line naming the batch size, the device and the stage
(:func:`out_of_memory_error`); the run is not retried with a smaller batch, which would change
its configuration.

Imports only :mod:`raysearch.training.loop` of the package; never :mod:`raysearch.training.run`.
"""

from __future__ import annotations

import traceback

import torch
from torch import Tensor

from raysearch.training.loop import Dist, DivergedError

#: On CUDA, the device-side divergence flag is read every this many batches.
_CHECK_EVERY = 50

#: What torch raises when an allocation fails (``torch.cuda.OutOfMemoryError`` before torch 2.5).
OUT_OF_MEMORY: type[BaseException] = getattr(torch, "OutOfMemoryError",
                                             torch.cuda.OutOfMemoryError)


class OutOfMemoryRunError(RuntimeError):
    """A run's batch did not fit in the device's memory (one line: batch size, device, stage).

    Raised by :func:`raysearch.training.run.fit` from the original ``torch.OutOfMemoryError``
    (its ``__cause__``); the message starts with ``"CUDA out of memory"``.
    """


def out_of_memory_error(
    exc: BaseException, batch_size: int, device: torch.device, stage: str, *,
    training: bool = True, bf16: bool = False,
) -> OutOfMemoryRunError:
    """The one-line :class:`OutOfMemoryRunError` for `exc`, after dropping what it holds.

    The locals of the finished frames of `exc`'s traceback (the batch, its activations and
    logits) are dropped; the caller then drops its own references to the model and the
    optimiser and calls :func:`free_device_memory`.

    Args:
        exc: the ``torch.OutOfMemoryError`` (set as the new error's ``__cause__``).
        batch_size: samples per batch where it happened (the training or evaluation batch).
        device: the run's device (``cuda`` is named with its index).
        stage: where in the run, e.g. ``"training, epoch 3"``.
        training: whether it happened in a training pass (`batch_size` is then ``batch_size``
            of the config); False: evaluation, at the fixed evaluation batch size.
        bf16: whether the training forward pass already runs under bf16 autocast.

    Returns:
        OutOfMemoryRunError: e.g. ``"CUDA out of memory at batch size 128 on cuda:0 (training,
        epoch 3): lower batch_size, use precision bf16, or fewer trials per GPU
        (gpus_per_trial)"``.
    """
    if exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if training:
        advice = "lower batch_size, " + ("" if bf16 else "use precision bf16, ")
    else:
        advice = "use a smaller model, "
    error = OutOfMemoryRunError(
        f"CUDA out of memory at batch size {batch_size} on {device} ({stage}): {advice}or "
        f"fewer trials per GPU (gpus_per_trial)")
    error.__cause__ = exc
    return error


def free_device_memory() -> None:
    """Return the CUDA allocator's cached blocks to the device (``torch.cuda.empty_cache()``).

    A no-op without CUDA.
    """
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Guard:
    """Divergence check of one epoch: at once on the CPU, on the device (no sync) on CUDA.

    In DDP mode (`ddp`) the check agrees on all ranks: on the CPU the full-batch loss is
    all-reduced every batch; on CUDA the first bad batch is all-reduced (min) at each check.
    """

    def __init__(
        self,
        device: torch.device,
        optimizer: torch.optim.Optimizer,
        epoch: int,
        ddp: Dist | None = None,
    ) -> None:
        self.deferred = device.type == "cuda"
        self.optimizer = optimizer
        self.epoch = epoch
        self.ddp = ddp
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)

    def step(
        self, loss: Tensor, batch: int, note: str = "", share: tuple[int, int] | None = None
    ) -> None:
        """Check the loss (or record it), then one backward pass and optimizer step.

        In DDP mode `share` is ``(n_rank, n_batch)``: `loss` is the mean over this rank's
        ``n_rank`` samples of a global batch of ``n_batch``; it is scaled by
        ``world * n_rank / n_batch`` so that DDP's gradient average is the full-batch gradient.
        """
        if self.ddp is not None and share is not None:
            self._step_shared(self.ddp, loss, batch, note, *share)
            return
        if not self.deferred:
            if not torch.isfinite(loss):
                self._raise(f"{loss.item()}", batch, note)
        else:
            self._record(loss, batch, note)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def _step_shared(
        self, ddp: Dist, loss: Tensor, batch: int, note: str, n_rank: int, n_batch: int
    ) -> None:
        weight = n_rank / n_batch
        if not self.deferred:
            total = ddp.all_sum(loss.detach().double() * weight)  # the full-batch loss
            if not torch.isfinite(total):
                self._raise(f"{total.item()}", batch, note)
        else:
            self._record(loss, batch, note)
        self.optimizer.zero_grad(set_to_none=True)
        scale = ddp.world * weight
        (loss if scale == 1.0 else loss * scale).backward()
        self.optimizer.step()

    def _record(self, loss: Tensor, batch: int, note: str) -> None:
        """Record the first non-finite batch on the device (deferred mode; no host sync)."""
        bad = ~torch.isfinite(loss.detach()) & (self.first_bad < 0)
        self.first_bad = torch.where(bad, batch, self.first_bad)
        if batch % _CHECK_EVERY == 0:
            self.check(note)

    def check(self, note: str = "") -> None:
        """Raise DivergedError if a recorded loss was not finite (one host sync on CUDA)."""
        if not self.deferred:
            return
        first_bad = self.first_bad
        if self.ddp is not None:  # the first bad batch on any rank, on every rank
            none = torch.iinfo(torch.int64).max
            first_bad = self.ddp.all_min(torch.where(first_bad < 0, none, first_bad))
            first_bad = torch.where(first_bad == none, -1, first_bad)
        if int(first_bad.item()) >= 0:
            self._raise("not finite", int(first_bad.item()), note)

    def _raise(self, what: str, batch: int, note: str) -> None:
        lr = self.optimizer.param_groups[0]["lr"]
        raise DivergedError(
            f"training loss is {what} at epoch {self.epoch}, batch {batch} ({note}lr={lr:g})"
        )
