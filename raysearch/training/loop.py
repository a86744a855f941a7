"""The pieces of the epoch loop: batches on the device, precision, DDP, and what a run returns.

:class:`Source` serves one split as batches on the training device (a ``TensorDataset`` moved
once and indexed; an in-memory image set gathered and augmented on the device; any other
map-style dataset through a ``DataLoader``), :class:`Amp` holds the autocast and memory-format
settings, :class:`Dist` the process's place in a DDP group, :func:`predict_source` the float32
logits of a split. Plain PyTorch: no Ray, no MLflow; nothing here knows a dataset or a model by
name. :mod:`raysearch.training.run` runs the loop with them; :mod:`raysearch.training.tasks`
evaluates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from raysearch.training.data.splits import TASKS
from raysearch.training.models import output_logits

if TYPE_CHECKING:
    from raysearch.training.data import DatasetSplits

__all__ = ["EVAL_BATCH_SIZE", "PRECISIONS", "Amp", "DivergedError", "Dist", "SideInputFeed",
           "Source", "TrainFeed", "TrainResult", "evaluate", "numpy_logits", "predict_source",
           "to_device", "train_feed"]

#: Batch size of validation/test inference.
EVAL_BATCH_SIZE = 1024

#: Values of `precision` in :func:`raysearch.training.run.fit`.
PRECISIONS = ("auto", "bf16", "fp32")


@dataclass
class TrainResult:
    """Outcome of :func:`fit`.

    Attributes:
        metrics: the last epoch's ``train_loss``, ``train_accuracy`` and ``val_*`` metrics plus
            ``test_{accuracy,ece,aece,cece,mce,nll,brier}``, and for the final model
            ``{val,test}_{ece_l2em,debiased_ce,sweep_ce,marginal_ece,ks}``
            (:func:`raysearch.metrics.estimator_summary`).
        epochs_completed: number of the last trained epoch (``cfg.epochs`` unless resumed past it).
        model: the trained model (on the training device, in eval mode).
        val_logits: float32 (N_val, K) logits of the final model on the validation split.
        val_labels: int64 (N_val,) validation labels.
        test_logits: float32 (N_test, K) logits on the test split.
        test_labels: int64 (N_test,) test labels.
        task: ``"classification"`` or ``"segmentation"``. For segmentation the logits fields
            hold a seeded sample of valid *pixels* (``val_*``: the temperature-scaling sample,
            :data:`raysearch.training.dense.TS_SAMPLE_PIXELS`; ``test_*``: empty), and `dense` holds
            what the trial logs: ``temperature`` (fitted on the validation sample),
            ``test_bins`` (reliability bins of all valid test pixels), ``val_iou`` and
            ``test_iou`` (per-class IoU, NaN for classes absent from both prediction and
            labels), ``class_names`` and ``images`` (validation images with ground truth,
            prediction and confidence, for the confidence maps).
        dense: see `task`; None for classification.
    """

    metrics: dict[str, float]
    epochs_completed: int
    model: nn.Module
    val_logits: np.ndarray
    val_labels: np.ndarray
    test_logits: np.ndarray
    test_labels: np.ndarray
    task: str = TASKS[0]
    dense: dict[str, Any] | None = None


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite (the message names the epoch and batch)."""


class Amp:
    """Autocast and memory-format settings of one run."""

    def __init__(self, device: torch.device, precision: str) -> None:
        self.device = device
        self.bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
        self.channels_last = device.type == "cuda"

    def autocast(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` to bf16 when the run asks for it, else a no-op context."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def prepare(self, x: Tensor) -> Tensor:
        """`x` in the run's memory format (channels-last for 4-D inputs on CUDA)."""
        if self.channels_last and x.ndim == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x


class Source:
    """One split as batches on the training device (see the module docstring, **Data**)."""

    def __init__(self, dataset: Dataset, device: torch.device, *, num_workers: int = 0) -> None:
        self.dataset = dataset
        self.device = device
        self.num_workers = num_workers
        self.n = len(dataset)  # type: ignore[arg-type]
        if isinstance(dataset, TensorDataset):
            self.kind = "tensor"
            self.x, self.y = to_device(dataset, device)
        elif callable(getattr(dataset, "batch", None)) and callable(getattr(dataset, "to", None)):
            self.kind = "images"
            self.images = dataset.to(device)
        else:
            self.kind = "loader"

    def labels(self) -> Tensor:
        """All labels, int64 (N,), in dataset order."""
        if self.kind == "tensor":
            return self.y
        if self.kind == "images":
            return self.images.labels
        labels = getattr(self.dataset, "labels", None)
        if labels is None:
            labels = [self.dataset[i][1] for i in range(self.n)]
        return torch.as_tensor(np.asarray(labels), dtype=torch.int64)

    def batches(
        self,
        order: Tensor,
        batch_size: int,
        augment: torch.Generator | None,
        ddp: Dist | None = None,
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """``(x, y, index)`` on the device for consecutive chunks of `order` (CPU int64).

        With `ddp`, this rank's share ``chunk[rank::world]`` of every chunk, as
        ``(x, y, index, len(chunk))`` (see :meth:`_shares`).
        """
        if ddp is not None:
            yield from self._shares(order, batch_size, augment, ddp)  # type: ignore[misc]
            return
        if self.kind == "loader":
            yield from self._loader_batches(order, batch_size, augment)
            return
        for index in torch.split(order.to(self.device), batch_size):
            if self.kind == "tensor":
                yield self.x[index], self.y[index], index
            else:
                xb, yb = self.images.batch(index, generator=augment)
                yield xb, yb, index

    def _shares(
        self, order: Tensor, batch_size: int, augment: torch.Generator | None, ddp: Dist
    ) -> Iterator[tuple[Tensor, Tensor, Tensor, int]]:
        """This rank's share of every global batch, and the global batch's size.

        In-memory images are gathered and augmented for the whole batch (the augmentation
        generator then advances as with one worker) and sliced; tensors are indexed by the share;
        file-backed datasets load the share only. A share may be empty (a last batch smaller
        than the number of ranks): then x and y have 0 rows.
        """
        chunks = torch.split(order, batch_size)
        if self.kind == "loader":
            shares = [chunk[ddp.rank :: ddp.world] for chunk in chunks]
            loaded = self._loader_batches(shares, batch_size, augment)
            for chunk, (xb, yb, index) in zip(chunks, loaded, strict=True):
                yield xb, yb, index, len(chunk)
            return
        for chunk in chunks:
            if self.kind == "tensor":
                index = chunk[ddp.rank :: ddp.world].to(self.device)
                yield self.x[index], self.y[index], index, len(chunk)
            else:
                index = chunk.to(self.device)
                xb, yb = self.images.batch(index, generator=augment)
                mine = slice(ddp.rank, None, ddp.world)
                yield xb[mine], yb[mine], index[mine], len(chunk)

    def _loader_batches(
        self, order: Tensor | list[Tensor], batch_size: int, augment: torch.Generator | None
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        if isinstance(order, list):  # given batches (DDP shares), possibly empty
            yield from self._loader_given(order, augment)
            return
        cuda = self.device.type == "cuda"
        loader = DataLoader(
            self.dataset,
            batch_size=batch_size,
            sampler=order.tolist(),
            num_workers=self.num_workers,
            pin_memory=cuda,
            generator=augment,
        )
        for (xb, yb), index in zip(loader, torch.split(order, batch_size), strict=True):
            yield (
                xb.to(self.device, non_blocking=cuda),
                torch.as_tensor(yb).to(self.device, dtype=torch.int64, non_blocking=cuda),
                index.to(self.device),
            )

    def _loader_given(
        self, shares: list[Tensor], augment: torch.Generator | None
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """The batches `shares` through a DataLoader; an empty share gives 0-row tensors."""
        cuda = self.device.type == "cuda"
        nonempty = [share.tolist() for share in shares if len(share)]
        loader = iter(DataLoader(
            self.dataset,
            batch_sampler=nonempty,
            num_workers=self.num_workers if nonempty else 0,
            pin_memory=cuda,
            generator=augment,
        ))
        empty_x = None
        for share in shares:
            if len(share):
                xb, yb = next(loader)
                xb = xb.to(self.device, non_blocking=cuda)
                yb = torch.as_tensor(yb).to(self.device, dtype=torch.int64, non_blocking=cuda)
                empty_x = xb[:0]
            else:
                if empty_x is None:
                    sample = torch.as_tensor(self.dataset[0][0])
                    empty_x = sample.new_zeros((0, *sample.shape)).to(self.device)
                xb, yb = empty_x, torch.zeros(0, dtype=torch.int64, device=self.device)
            yield xb, yb, share.to(self.device)


class Dist:
    """This process's place in the ``torch.distributed`` group of a DDP run of :func:`fit`."""

    def __init__(self, device: torch.device) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = device
        # NCCL reduces CUDA tensors only; gloo (the CPU backend) CPU tensors
        self.comm = device if dist.get_backend() == "nccl" else torch.device("cpu")

    @classmethod
    def detect(cls, distributed: bool | None, device: torch.device) -> Dist | None:
        """The group to train over, or None (see `distributed` in :func:`fit`)."""
        if distributed is not None and not isinstance(distributed, bool):
            raise TypeError(f"`distributed` must be a bool or None, got {distributed!r}")
        if distributed is False:
            return None
        import torch.distributed as dist

        initialised = dist.is_available() and dist.is_initialized()
        if distributed and not initialised:
            raise ValueError("`distributed`=True but no torch.distributed process group is "
                             "initialised (run fit() in the workers of a TorchTrainer)")
        if not initialised or dist.get_world_size() < 2:
            return None
        return cls(device)

    def check_sizes(self, batch_size: int, data: DatasetSplits) -> None:
        """Every rank needs samples: the batch size and each split must reach the world size."""
        if batch_size < self.world:
            raise ValueError(f"`batch_size` ({batch_size}) must be >= the number of DDP ranks "
                             f"({self.world})")
        for name in ("train", "val", "test"):
            n = len(getattr(data, name))
            if n < self.world:
                raise ValueError(f"the {name} split has {n} samples, fewer than the {self.world} "
                                 "DDP ranks")

    def wrap(self, model: nn.Module) -> nn.Module:
        """``DistributedDataParallel(model)``, with ``device_ids`` on CUDA."""
        from torch.nn.parallel import DistributedDataParallel

        if self.device.type == "cuda":
            index = self.device.index
            if index is None:
                index = torch.cuda.current_device()
            return DistributedDataParallel(model, device_ids=[index], output_device=index)
        return DistributedDataParallel(model)

    def _reduce(self, value: Tensor, op: Any) -> Tensor:
        out = value.detach().to(self.comm).clone()
        self.dist.all_reduce(out, op=op)
        return out.to(value.device)

    def all_sum(self, value: Tensor) -> Tensor:
        """The sum of `value` over the ranks (a new tensor on `value`'s device)."""
        return self._reduce(value, self.dist.ReduceOp.SUM)

    def all_min(self, value: Tensor) -> Tensor:
        """The minimum of `value` over the ranks."""
        return self._reduce(value, self.dist.ReduceOp.MIN)

    def gather(self, rows: Tensor, n: int) -> Tensor:
        """Rows ``[rank::world]`` of an (n, ...) tensor from every rank, back in order.

        Shares differ in length by at most one: each is padded to ``ceil(n / world)`` rows,
        all-gathered, interleaved, and the padding dropped.
        """
        per_rank = -(-n // self.world)
        padded = rows.new_zeros((per_rank, *rows.shape[1:]))
        padded[: len(rows)] = rows
        padded = padded.to(self.comm)
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        self.dist.all_gather(parts, padded)
        # parts[r][j] is row j * world + r
        full = torch.stack(parts, dim=1).reshape(per_rank * self.world, *rows.shape[1:])
        return full[:n].to(rows.device)

    def sync_buffers(self, model: nn.Module) -> None:
        """Broadcast rank 0's buffers (BatchNorm running statistics) to every rank."""
        for buffer in model.buffers():
            if buffer.device.type == self.comm.type:
                self.dist.broadcast(buffer.data, src=0)
            else:
                value = buffer.detach().to(self.comm)
                self.dist.broadcast(value, src=0)
                buffer.data.copy_(value)


def to_device(dataset: Dataset, device: torch.device) -> tuple[Tensor, Tensor]:
    """The (x, y) tensors of a dataset on `device` (the data is held in memory)."""
    if isinstance(dataset, TensorDataset):
        x, y = dataset.tensors[0], dataset.tensors[1]
    else:
        xs, ys = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
        x, y = torch.stack([torch.as_tensor(v) for v in xs]), torch.as_tensor(ys)
    return x.to(device), y.to(device=device, dtype=torch.int64)


def predict_source(
    model: nn.Module,
    source: Source,
    amp: Amp,
    batch_size: int = EVAL_BATCH_SIZE,
    *,
    ddp: Dist | None = None,
    label: str = "the model",
) -> tuple[Tensor, Tensor]:
    """Float32 logits (N, K) and labels (N,) of a split in eval mode, in dataset order.

    Never under autocast: the reported calibration does not depend on the training precision.
    Restores the model's train/eval mode. With `ddp` each rank predicts ``arange(N)[rank::world]``
    (with the unwrapped model: no DDP collective per forward) and the shards are all-gathered
    back into dataset order, on every rank.
    """
    was_training = model.training
    model.eval()
    order = torch.arange(source.n)
    if ddp is not None:
        order = order[ddp.rank :: ddp.world]
    try:
        with torch.inference_mode():
            logits, labels = [], []
            for xb, yb, _ in source.batches(order, batch_size, None):
                logits.append(output_logits(model(amp.prepare(xb)), model=label).float())
                labels.append(yb)
    finally:
        model.train(was_training)
    if ddp is not None:
        return ddp.gather(torch.cat(logits), source.n), ddp.gather(torch.cat(labels), source.n)
    return torch.cat(logits), torch.cat(labels)


def numpy_logits(logits: Tensor) -> np.ndarray:
    """A logits tensor as a float32 NumPy array on the CPU."""
    return logits.detach().cpu().numpy().astype(np.float32, copy=False)


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    *,
    batch_size: int = EVAL_BATCH_SIZE,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Logits and labels of `model` on `dataset`, in eval mode under ``torch.inference_mode``.

    Computed in float32; the model's train/eval mode is restored afterwards.

    Args:
        model (nn.Module): maps (N, C, H, W) inputs to (N, K) logits; must already be on `device`.
        dataset (Dataset): a ``TensorDataset`` (x, y), an in-memory image set, or any dataset of
            ``(x, y)`` pairs.
        batch_size (int, optional): inference batch size (>= 1). Defaults to ``1024``.
        device (str | torch.device, optional): where inputs are sent. Defaults to ``"cpu"``.
        num_workers (int, optional): ``DataLoader`` workers for file-backed datasets.
            Defaults to ``0``.

    Returns:
        tuple[np.ndarray, np.ndarray]: logits float32 (N, K) and labels int64 (N,), in dataset
        order.

    Raises:
        ValueError: if `batch_size` < 1.
    """
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
    device = torch.device(device)
    source = Source(dataset, device, num_workers=num_workers)
    logits, labels = predict_source(model, source, Amp(device, "fp32"), batch_size)
    return numpy_logits(logits), labels.cpu().numpy().astype(np.int64)




class TrainFeed:
    """The training batches of each epoch: the training split, reshuffled.

    Attributes:
        source: the training split on the device (:class:`Source`).
        side_inputs: names of the per-sample keyword inputs the batches carry for the loss:
            those of `side`, tensors indexed like the training split (``index``), or none.
    """

    side_inputs: tuple[str, ...] = ()

    def __init__(self, dataset: Dataset, device: torch.device, *, num_workers: int = 0,
                 side: dict[str, Tensor] | None = None) -> None:
        self.source = Source(dataset, device, num_workers=num_workers)
        self.side = {key: value.to(device) for key, value in side.items()} if side else None
        if self.side:
            self.side_inputs = tuple(self.side)
        self._checked: dict[tuple[int, int | None], bool] = {}

    def labels_checked(self, num_classes: int, ignore_index: int | None) -> bool:
        """Whether every training label is a class index in [0, K) other than `ignore_index`.

        Checked once per (K, ignore_index), where the split is in memory (one host
        synchronisation); False for a file-backed split (its labels are not read ahead). The
        training pass then runs the losses under
        :func:`raysearch.losses.checked_targets` (no per-batch check).
        """
        key = (num_classes, ignore_index)
        if key not in self._checked:
            ok = False
            if self.source.kind != "loader":
                y = self.source.labels()
                if not (y.is_floating_point() or y.is_complex() or y.dtype == torch.bool):
                    good = (y >= 0) & (y < num_classes)
                    if ignore_index is not None:
                        good &= y != ignore_index
                    ok = bool(good.all())
            self._checked[key] = ok
        return self._checked[key]

    def epoch(self, epoch: int, batch_size: int, generator: torch.Generator,
              augment: torch.Generator, ddp: Dist | None
              ) -> tuple[Iterator[Any], int, dict[str, Tensor] | None]:
        """``(batches, n, side)`` of one epoch, in the order drawn from `generator`."""
        order = torch.randperm(self.source.n, generator=generator)
        return self.source.batches(order, batch_size, augment, ddp), self.source.n, self.side


class SideInputFeed:
    """Training batches made afresh every epoch, with per-sample inputs of the loss.

    ``epoch_tensors(epoch) -> (x, y, side)`` gives the epoch's samples (augmented crops, say)
    and ``side``, tensors indexed like them (``objectness``); the loop passes
    ``side[key][batch_index]`` to the loss as keywords.
    """

    source = None

    def __init__(self, epoch_tensors: Any, side_inputs: tuple[str, ...],
                 device: torch.device) -> None:
        self.epoch_tensors = epoch_tensors
        self.side_inputs = side_inputs
        self.device = device

    def labels_checked(self, num_classes: int, ignore_index: int | None) -> bool:
        """False: the epochs' samples are made afresh (see :meth:`TrainFeed.labels_checked`)."""
        return False

    def epoch(self, epoch: int, batch_size: int, generator: torch.Generator,
              augment: torch.Generator, ddp: Dist | None
              ) -> tuple[Iterator[Any], int, dict[str, Tensor] | None]:
        """``(batches, n, side)`` of one epoch (`side` on the device)."""
        x, y, side = self.epoch_tensors(epoch)
        source = Source(TensorDataset(x, y), self.device)
        order = torch.randperm(len(y), generator=generator)
        side = {key: value.to(self.device) for key, value in side.items()}
        return source.batches(order, batch_size, augment, ddp), len(y), side


def train_feed(data: DatasetSplits, loss_fn: Any, *, seed: int, device: torch.device,
               num_workers: int = 0) -> TrainFeed | SideInputFeed:
    """The training batches of a run: what the loss takes from the data, the data supplies.

    A loss that takes per-sample inputs besides the logits and targets (its ``side_inputs``,
    :func:`raysearch.training.data.side.loss_side_inputs`) trains on epochs the data makes for it
    (:func:`raysearch.training.data.side.side_input_epochs`); any other loss on the training split,
    with
    the inputs that describe the split itself (``index``,
    :func:`raysearch.training.data.side.split_side_inputs`) when it takes only those.

    Raises:
        ValueError: if no data provides an input the loss takes.
    """
    from raysearch.training.data.side import loss_side_inputs, side_input_epochs, split_side_inputs

    names = loss_side_inputs(loss_fn)
    side = split_side_inputs(data, names)
    if not names or side is not None:
        return TrainFeed(data.train, device, num_workers=num_workers, side=side)
    return SideInputFeed(side_input_epochs(data, names, loss_fn, seed=seed), names, device)
