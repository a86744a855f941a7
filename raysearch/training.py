"""The epoch loop of one training run (plain PyTorch; no Ray, no MLflow).

:func:`fit` trains ``cfg.model`` on ``cfg.dataset`` with the loss ``cfg.method``:

- **Optimiser**: SGD with ``cfg.lr``, ``cfg.momentum``, ``cfg.weight_decay`` (on every
  parameter, biases included) and ``cfg.nesterov``; or, with ``cfg.optimizer == "adam"``, Adam
  with ``cfg.lr``, betas (0.9, 0.999) and ``cfg.weight_decay``. ``cfg.head_lr`` puts the
  classification head in its own group; ``cfg.pretrained`` loads weights first
  (:func:`raysearch.models.pretrained.load_pretrained`) and ``cfg.freeze_backbone_epochs``
  trains only the head for the first epochs.
- **Schedule** (a ``LambdaLR`` stepped once per epoch; epoch e, 1-based, trains at
  ``lr * factor(e - 1)``): ``cosine`` (default): ``(1 + cos(pi * (e - 1 - W) / (epochs - W))) / 2``
  after W = ``cfg.warmup_epochs`` warm-up epochs; ``multistep``: ``lr_decay ** #{m in milestones:
  m < e}`` (MbLS App. B: x0.1 after epochs 150 and 250); ``constant``: 1. Warm-up epochs
  e <= W train at ``0.1 + 0.9 * (e - 1) / W`` of the schedule's value.
- **Batches**: the training split is reshuffled every epoch into mini-batches of
  ``cfg.batch_size`` (the last one may be smaller). The order of epoch e comes from a
  ``torch.Generator`` seeded with ``(cfg.seed, e)``, so it does not depend on earlier epochs and
  a resumed run sees the same batches as an uninterrupted one; augmentation draws from a second
  generator seeded from the same pair.
- **Data**: a ``TensorDataset`` (digits) is moved to `device` once and batched by indexing; an
  in-memory image set (:class:`~raysearch.data.images.ImageTensorDataset`: CIFAR, SVHN, MNIST,
  ...) is moved to `device` once as uint8 and each batch is gathered, augmented (random crop +
  flip) and normalised there, so the GPU never waits for a loader; any other map-style dataset
  (ImageFolder trees) goes through a ``DataLoader`` with `num_workers` worker processes, pinned
  memory on CUDA and non-blocking copies.
- **Precision** (`precision`): ``"bf16"`` runs the training forward pass under
  ``torch.autocast(dtype=bfloat16)``; ``"fp32"`` does not; ``"auto"`` (default) is bf16 on CUDA
  and fp32 on the CPU. The loss is always computed in float32 on float32 logits (outside
  autocast), and validation/test logits are always computed in float32, so the reported
  calibration does not depend on the precision. On CUDA the model and its inputs are
  channels-last.
- **MixUp / CutMix** (``cfg.mixup_alpha``, ``cfg.cutmix_alpha`` > 0; torchvision.transforms.v2,
  one lambda per batch): the batch is mixed with a permutation of itself and the objective is
  ``lam * loss(logits, y) + (1 - lam) * loss(logits, y_partner)``, which for cross-entropy is
  the soft-label loss and works for every loss in the registry. **RICAP** (``cfg.ricap_beta``
  > 0; Takahashi et al. 2018, :func:`raysearch.data.ricap.ricap_patches`) patches four random
  crops into each image around a boundary ~ Beta(beta, beta) and trains on
  ``sum_k W_k * loss(logits, y_k)`` with W_k the patch areas; with several of the three on,
  each batch uses one of them, chosen uniformly.
- **Per epoch**: after training, the validation split is evaluated (``val_*`` metrics from
  :func:`raysearch.metrics.calibration_summary`) and ``on_epoch(epoch, metrics, state)`` is
  called. After the last epoch the test split is evaluated once (``test_*``).
- **Divergence**: on the CPU every batch's loss is checked with ``torch.isfinite`` before the
  backward pass; on CUDA the check is kept on the device (no host sync per batch) and read
  every 50 batches and at the end of the epoch; a NaN/inf raises :class:`DivergedError` naming
  the first bad batch.
- **Objectness losses**: when the built loss has the class attribute ``needs_objectness = True``
  (``als``), every epoch trains on freshly augmented crops of the training split with their
  objectness (:func:`raysearch.data.objectness.objectness_train_set`; digits: the ink box of
  each image as the object, random-resized crops with scale (0.5, 1) and no flip, see
  :data:`~raysearch.data.objectness.DIGITS_CROP`). The crops of epoch e are seeded by
  ``(cfg.seed, e, sample index)`` and computed on the CPU before the epoch; each batch calls
  ``loss_fn(logits, y, objectness=o)`` (plus ``context=c`` when the loss's
  ``context_fraction`` > 0). Validation and test are evaluated on the unaugmented images.
- **Interleaved training** (Karandikar et al., App. B), when ``cfg.interleaved`` is true: the
  training split is divided once (stratified, seeded with ``cfg.seed``) into a "majority" part
  and a "held-out" part of ``cfg.interleave_fraction`` of the samples; each epoch is split in
  two: first one pass over shuffled majority batches stepping on the PRIMARY loss only, then one
  pass over shuffled held-out batches stepping on ``beta * secondary`` only. The loss must be a
  primary + secondary objective: a ``terms(logits, targets)`` method returning differentiable
  ``"primary"`` and ``"secondary"`` tensors and a ``beta`` attribute (``sbece``, ``savuc``, ...).
  ``train_loss`` is then the sample mean over both parts of the objective each batch stepped on.

Reproducibility: ``torch.manual_seed(cfg.seed)`` (and Python's and NumPy's global seeds) before
the model is built; on CPU two runs of the same config give bit-identical metrics, and resuming
from the state of epoch e gives the same result as not stopping. On GPU, cuDNN may pick
non-deterministic kernels; this module does not change global determinism flags.

**Data-parallel training (DDP)**: when a ``torch.distributed`` process group of W > 1 ranks is
initialised (Ray Train's ``TorchTrainer`` does it: NCCL on GPUs, gloo on the CPU) :func:`fit`
runs the same training on every rank (``distributed=None``, the default, detects it;
``distributed=False`` trains independently on each rank):

- every rank builds the same model, batch order and augmentation draws (same seeds); the
  model is wrapped in ``DistributedDataParallel`` (``device_ids`` on CUDA) and trains on its
  share ``batch[r::W]`` of every global mini-batch (in-memory image sets augment the whole
  batch on every rank, so the crops and flips are those of one worker, and keep the share;
  file-backed datasets load only the share). Shares differ by at most one sample, so each
  rank's loss is scaled by ``W * n_r / n_batch``: DDP's gradient average is then the gradient
  of the full-batch mean, as with one worker (up to float rounding; the last, odd-sized batch
  of an epoch included). ``cfg.batch_size`` and every split must hold at least W samples.
- ``train_loss``/``train_accuracy`` are sums all-reduced over the ranks, i.e. over the whole
  training split. Validation/test logits are predicted on shards ``arange(N)[r::W]``,
  all-gathered back into dataset order, and every rank computes the metrics on the full
  logits: the numbers (and :class:`TrainResult`'s logits) are those of one worker, on every
  rank. ``on_epoch`` is called on every rank with identical metrics (the caller decides what
  rank 0 does); ``state["model"]`` is the unwrapped model's state dict, as with one worker.
- Divergence: the full-batch loss (CPU) or the device-side flag (CUDA, at the same batches on
  every rank) is all-reduced, so every rank raises :class:`DivergedError` at the same batch
  and none is left waiting in a collective.
- Exact only for per-sample-mean objectives without batch-level terms. Losses with batch-level
  terms (e.g. ``mmce``, ``sbece``, ``savuc``, ``avuc``, ``mdca``: calibration or certainty
  terms computed over the batch) are computed on each rank's share, like per-GPU batch statistics.
  BatchNorm layers become ``SyncBatchNorm`` on CUDA (statistics of the global batch); on the
  CPU/gloo, where SyncBatchNorm is not supported, BatchNorm normalises each rank's share and
  rank 0's running statistics are used for evaluation, so BN models match one worker only
  approximately. Random layers (dropout) and MixUp/CutMix (each rank mixes its own share)
  draw per rank and match one worker only in distribution.
"""

from __future__ import annotations

import copy
import logging
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from raysearch.loop import (
    EVAL_BATCH_SIZE,
    PRECISIONS,
    Amp,
    Dist,
    DivergedError,
    Source,
    TrainResult,
    evaluate,
    numpy_logits,
    predict_source,
    train_feed,
)
from raysearch.models import output_logits

if TYPE_CHECKING:
    from raysearch.config import RunConfig
    from raysearch.data import DatasetSplits
    from raysearch.loop import SideInputFeed, TrainFeed
    from raysearch.tasks import EvalContext, Task

__all__ = ["EVAL_BATCH_SIZE", "PRECISIONS", "DivergedError", "EpochResult", "TrainResult",
           "build_run_loss", "build_run_model", "evaluate", "fit", "load_run_data"]

# the loop's pieces under the names earlier code and benchmarks import from here
_Amp, _Source, _Dist, _predict_source, _numpy_logits = (Amp, Source, Dist, predict_source,
                                                        numpy_logits)

logger = logging.getLogger(__name__)

#: On CUDA, the device-side divergence flag is read every this many batches.
_CHECK_EVERY = 50

OnEpoch = Callable[[int, dict[str, float], dict[str, Any]], None]


@dataclass
class EpochResult:
    """Metrics of one finished epoch (the arguments :func:`fit` passes to ``on_epoch``).

    Attributes:
        epoch: epoch number, 1-based.
        metrics: ``train_loss`` (sample mean of the training objective over the epoch, with the
            weights as they were at each batch), ``train_accuracy`` (of those same forward passes,
            in train mode) and ``val_{accuracy,ece,aece,cece,mce,nll,brier}`` after the epoch.
    """

    epoch: int
    metrics: dict[str, float]


def fit(
    cfg: RunConfig,
    *,
    on_epoch: OnEpoch | None = None,
    resume: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    data: DatasetSplits | None = None,
    loss: nn.Module | None = None,
    precision: str = "auto",
    num_workers: int = 0,
    distributed: bool | None = None,
    components: Mapping[str, Mapping[str, Any]] | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Train one configuration and evaluate it on validation (every epoch) and test (at the end).

    See the module docstring for the optimiser, schedule, batching, precision and seeding.

    Args:
        cfg (RunConfig): the run: loss, model, data, optimizer and schedule sections, seed.
        on_epoch (callable, optional): called after every epoch as
            ``on_epoch(epoch, metrics, state)`` with the 1-based epoch, the metrics of
            :class:`EpochResult` and ``state = {"epoch", "model", "optimizer", "scheduler",
            "metrics"}`` (state dicts, deep copies, safe to keep or ``torch.save``). Defaults to
            ``None``.
        resume (dict, optional): a ``state`` received by ``on_epoch`` (or loaded from its
            checkpoint); training continues at epoch ``state["epoch"] + 1``. Defaults to ``None``.
        device (str | torch.device, optional): where to train (``"cpu"``, ``"cuda"``,
            ``"cuda:1"``). Defaults to ``"cpu"``.
        data (DatasetSplits, optional): preloaded splits; when ``None`` they are loaded with
            :func:`load_run_data`. Defaults to ``None``.
        loss (nn.Module, optional): the objective to train with instead of
            ``build_loss(cfg.loss.name, **cfg.loss.params)`` (e.g. a custom loss object in a
            notebook). Defaults to ``None``.
        precision (str, optional): ``"auto"`` (bf16 autocast on CUDA, fp32 on the CPU),
            ``"bf16"`` or ``"fp32"``; the training forward pass only. Defaults to ``"auto"``.
        num_workers (int, optional): ``DataLoader`` worker processes for datasets that are
            read from files (ImageFolder trees); in-memory datasets need none. Defaults to ``0``.
        distributed (bool, optional): data-parallel training over the initialised
            ``torch.distributed`` process group (module docstring, **Data-parallel training**).
            ``None`` uses it when one with more than one rank is initialised; ``True`` requires
            one; ``False`` never uses it. Defaults to ``None``.
        components (mapping, optional): objects given through the Python API instead of
            names, ``{"models" | "datasets" | "losses": {label: callable}}``: a name of `cfg`
            equal to a label resolves to that object. Defaults to ``None``.
        metrics (mapping, optional): a user's metrics ``{name: fn(probs (N, K), labels (N,))
            -> float}``, logged as ``val_<name>`` every epoch and ``test_<name>`` at the end
            (classification). Defaults to ``None``.

    Returns:
        TrainResult: final metrics, the model (unwrapped from DDP), and validation/test logits
        and labels (in DDP mode the full splits' logits, on every rank).

    Raises:
        DivergedError: as soon as a batch's training loss is NaN or infinite (on CUDA: within
            50 batches), or if the model's validation/test logits are (the last step of an
            epoch blew the weights up).
        ValueError: on an unknown dataset, model, loss, optimizer or precision (or a keyword
            argument one of them does not take), a model made for another task, a model output
            without logits, a negative `num_workers`, or a `resume` state without ``epoch``; for
            ``distributed=True`` without an initialised process group, or (DDP) a batch size or
            split smaller than the number of ranks; for an objectness loss on a dataset without
            object annotations; for MixUp/CutMix/RICAP combined with a loss taking per-sample
            inputs (objectness, index) or interleaved training; for interleaved training with
            a loss that is not a primary + secondary objective ("interleaved training needs a
            primary + secondary objective ..."), with ``interleave_fraction`` outside (0, 1),
            or a training split too small to hold out a stratified part.
        TypeError: if `distributed` is not a bool or None.
    """
    run = _setup(cfg, resume=resume, device=device, data=data, loss=loss, precision=precision,
                 num_workers=num_workers, distributed=distributed, components=components,
                 metrics=metrics)
    val_state = None
    for epoch in range(run.start_epoch, cfg.epochs + 1):
        epoch_metrics = _train_epoch(run, epoch)
        val_state, val_metrics = _evaluate(run, epoch)
        epoch_metrics.update(val_metrics)
        run.metrics = epoch_metrics
        if on_epoch is not None:
            _report(on_epoch, epoch, epoch_metrics, _checkpoint(run, epoch))
    return _finish(run, val_state)


@dataclass
class _Run:
    """What the steps of one :func:`fit` share (built by :func:`_setup`).

    Attributes:
        cfg: the run's config.
        data: its splits.
        task: what the data asks of training and evaluation (:mod:`raysearch.tasks`).
        amp: precision and memory format of the forward passes.
        ddp: the DDP group, or None.
        model: what trains (the DDP wrapper in DDP mode).
        net: what is evaluated and checkpointed (`model` unwrapped).
        loss_fn: the training objective.
        optimizer: the optimiser over `net`'s parameter groups.
        scheduler: the ``LambdaLR`` of :func:`lr_factor`, stepped once per epoch.
        feed: the training batches of each epoch (:func:`raysearch.loop.train_feed`).
        mixer: MixUp/CutMix/RICAP (:func:`_make_mixer`), or None.
        parts: interleaved training's (majority, held-out) training indices, or None.
        head_names: parameter names of the classification head (:func:`_head_names`).
        val_source: the validation split on the device.
        ctx: what the task's evaluation needs.
        start_epoch: the first epoch to train, 1-based (after the resumed one).
        metrics: the metrics of the last finished epoch (a resumed state's, before any).
    """

    cfg: RunConfig
    data: DatasetSplits
    task: Task
    amp: Amp
    ddp: Dist | None
    model: nn.Module
    net: nn.Module
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    feed: TrainFeed | SideInputFeed
    mixer: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]] | None
    parts: tuple[Tensor, Tensor] | None
    head_names: set[str]
    val_source: Source
    ctx: EvalContext
    start_epoch: int
    metrics: dict[str, float]


def _setup(
    cfg: RunConfig,
    *,
    resume: dict[str, Any] | None,
    device: str | torch.device,
    data: DatasetSplits | None,
    loss: nn.Module | None,
    precision: str,
    num_workers: int,
    distributed: bool | None,
    components: Mapping[str, Mapping[str, Any]] | None,
    metrics: Mapping[str, Any] | None,
) -> _Run:
    """Check the arguments, seed, and build everything the epochs need (arguments of :func:`fit`).

    The global seeds are set before the data is loaded and the model built, and nothing else
    draws from them before the model, so the initial weights depend on `cfg` alone.
    """
    from raysearch.optim import build_optimizer
    from raysearch.tasks import EvalContext, task_for

    device = _checked_device(device, precision, num_workers)
    amp = Amp(device, precision)
    ddp = Dist.detect(distributed, device)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)

    if data is None:
        data = load_run_data(cfg, components=components)
    if ddp is not None:
        ddp.check_sizes(cfg.batch_size, data)
    task = task_for(data)
    label = f"model {cfg.model.name!r}"
    net = _place_model(build_run_model(cfg, data, components=components), task, label, amp, ddp)
    loss_fn = loss if loss is not None else build_run_loss(cfg, data, components=components)
    if isinstance(loss_fn, nn.Module):
        loss_fn = loss_fn.to(device)
    feed = train_feed(data, loss_fn, seed=cfg.seed, device=device, num_workers=num_workers)
    fraction, mixer = _check_training(cfg, task, loss_fn, feed.side_inputs, data.num_classes)
    if cfg.model.pretrained and resume is None:  # a resumed run loads its own checkpoint below
        _load_pretrained(net, cfg.model.pretrained)
    head_names = _head_names(net, cfg)
    optimizer = build_optimizer(cfg.optimizer, _param_groups(net, cfg, head_names))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg))
    start_epoch, epoch_metrics = _restore(cfg, resume, net, optimizer, scheduler)
    model = net if ddp is None else ddp.wrap(net)
    parts = None
    if fraction is not None:
        parts = _interleave_split(feed.source.labels().cpu().numpy(), fraction, cfg.seed)
    ctx = EvalContext(data=data, cfg=cfg, amp=amp, ddp=ddp, num_workers=num_workers,
                      label=label, metric_fns=dict(metrics or {}))
    return _Run(cfg=cfg, data=data, task=task, amp=amp, ddp=ddp, model=model, net=net,
                loss_fn=loss_fn, optimizer=optimizer, scheduler=scheduler, feed=feed, mixer=mixer,
                parts=parts, head_names=head_names,
                val_source=Source(data.val, device, num_workers=num_workers), ctx=ctx,
                start_epoch=start_epoch, metrics=epoch_metrics)


def _checked_device(device: str | torch.device, precision: str, num_workers: int) -> torch.device:
    """`device` as a ``torch.device``, after checking it, `precision` and `num_workers`."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was asked for but no CUDA GPU is visible")
    if precision not in PRECISIONS:
        raise ValueError(f"`precision` must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"`num_workers` must be an int >= 0, got {num_workers!r}")
    return device


def _place_model(model: nn.Module, task: Task, label: str, amp: Amp, ddp: Dist | None
                 ) -> nn.Module:
    """`model`, checked by the task, on the run's device and in its memory format.

    In DDP mode on CUDA its BatchNorm layers become ``SyncBatchNorm``.
    """
    task.check_model(model, label)
    if ddp is not None and amp.device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(amp.device)
    if amp.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


def _check_training(
    cfg: RunConfig, task: Task, loss_fn: nn.Module, side_inputs: tuple[str, ...], num_classes: int
) -> tuple[float | None, Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]] | None]:
    """Check that the loss, the data and the training options go together.

    Returns:
        tuple: ``(fraction, mixer)``: the interleaved held-out fraction (None when training is
        not interleaved) and the batch mixer of :func:`_make_mixer` (or None).

    Raises:
        ValueError: as listed in :func:`fit` (interleaving, mixing, the task's own checks).
    """
    interleaved = bool(cfg.interleaved)
    fraction = None
    if interleaved:
        _check_interleavable(loss_fn, cfg.loss.name, bool(side_inputs))
        fraction = _interleave_fraction(cfg)
    mixer = _make_mixer(cfg, num_classes)
    task.check_training(side_inputs=side_inputs, interleaved=interleaved,
                        mixing=mixer is not None, method=cfg.loss.name)
    if mixer is not None and (side_inputs or interleaved):
        what = (f"a loss taking {', '.join(side_inputs)} per sample" if side_inputs
                else "interleaved training")
        raise ValueError(f"MixUp/CutMix/RICAP (mixup_alpha/cutmix_alpha/ricap_beta > 0) cannot "
                         f"be combined with "
                         f"{what} (method {cfg.loss.name!r})")
    return fraction, mixer


def _load_pretrained(net: nn.Module, source: str) -> None:
    """Load pretrained weights into `net` (:func:`raysearch.models.pretrained.load_pretrained`)."""
    from raysearch.models.pretrained import load_pretrained

    info = load_pretrained(net, source)
    logger.info("loaded %d tensors of %s (sha256 %s)%s", info.loaded, info.source,
                info.sha256[:12], "; head replaced" if info.replaced_head else "")


def _restore(
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


def _train_epoch(run: _Run, epoch: int) -> dict[str, float]:
    """Train epoch `epoch` (1-based), then step the schedule; returns the training metrics.

    The batch order and the augmentation draw from generators seeded with ``(cfg.seed,
    epoch)`` alone. In DDP mode the buffers (BatchNorm statistics) are synced from rank 0.

    Raises:
        DivergedError: if a batch's loss is NaN or infinite.
    """
    cfg = run.cfg
    frozen = cfg.model.freeze_backbone_epochs
    if frozen:  # the head alone for the first `frozen` epochs, then everything
        _freeze_backbone(run.net, run.head_names, epoch <= frozen)
    generator = torch.Generator().manual_seed(_epoch_seed(cfg.seed, epoch))
    augment = torch.Generator().manual_seed(_epoch_seed(cfg.seed, epoch) ^ _AUGMENT_SALT)
    run.model.train()
    guard = _Guard(run.amp.device, run.optimizer, epoch, run.ddp)
    if run.parts is not None:
        metrics = _train_pass_interleaved(
            run.model, run.loss_fn, guard, run.feed.source, run.parts, cfg.batch_size,
            generator, augment, run.amp, ddp=run.ddp, label=run.ctx.label,
        )
    else:
        batches, n, side = run.feed.epoch(epoch, cfg.batch_size, generator, augment, run.ddp)
        metrics = _train_pass(
            run.model, run.loss_fn, guard, batches, n, run.amp, side=side, mixer=run.mixer,
            ddp=run.ddp, ignore_index=run.data.ignore_index, label=run.ctx.label,
        )
    guard.check()
    run.scheduler.step()
    if run.ddp is not None:
        run.ddp.sync_buffers(run.net)
    return metrics


def _evaluate(run: _Run, epoch: int) -> tuple[Any, dict[str, float]]:
    """The task's validation after epoch `epoch`: ``(state, val_* metrics)``.

    `state` is what the task keeps for :func:`_finish` (the last epoch's validation logits).
    """
    return run.task.evaluate(run.net, run.val_source, run.ctx, f"after epoch {epoch}",
                             final=epoch == run.cfg.epochs)


def _checkpoint(run: _Run, epoch: int) -> dict[str, Any]:
    """The state :func:`fit` gives ``on_epoch`` after epoch `epoch` (deep copies; `resume`)."""
    return {
        "epoch": epoch,
        "model": copy.deepcopy(run.net.state_dict()),
        "optimizer": copy.deepcopy(run.optimizer.state_dict()),
        "scheduler": copy.deepcopy(run.scheduler.state_dict()),
        "metrics": dict(run.metrics),
    }


def _report(on_epoch: OnEpoch, epoch: int, metrics: dict[str, float],
            state: dict[str, Any]) -> None:
    """Call ``on_epoch(epoch, metrics, state)`` with a copy of the epoch's metrics."""
    on_epoch(epoch, dict(metrics), state)


def _finish(run: _Run, val_state: Any) -> TrainResult:
    """Evaluate the trained model on the test split; the run's :class:`TrainResult`.

    `val_state` is the last :func:`_evaluate`'s state (None when a resumed run had no epoch
    left to train).
    """
    epochs_completed = max(run.cfg.epochs, run.start_epoch - 1)
    return run.task.finish(run.net, val_state, run.val_source, run.ctx, run.metrics,
                           epochs_completed, run.start_epoch)


def load_run_data(cfg: RunConfig, *, components: Mapping[str, Mapping[str, Any]] | None = None,
                  **extra: Any) -> DatasetSplits:
    """The splits of `cfg`'s data section.

    ``load_dataset(data.name, data_dir=data.dir, seed=cfg.split_seed,
    val_fraction=data.val_fraction, **data.params)``.

    Args:
        cfg: the run config.
        components: objects given through the Python API (see :func:`fit`).
        **extra: more keyword arguments of the factory (``download=True``, ``verify=True``).

    Raises:
        ValueError: as :func:`raysearch.data.load_dataset` (unknown name, a keyword the
            factory does not take, a contract violation).
    """
    from raysearch.data import load_dataset

    name = _component(cfg.data.name, "datasets", components)
    return load_dataset(name, seed=cfg.split_seed, val_fraction=cfg.data.val_fraction,
                        data_dir=cfg.data.dir, **{**cfg.data.params, **extra})


def build_run_model(cfg: RunConfig, data: DatasetSplits, *,
                    components: Mapping[str, Mapping[str, Any]] | None = None) -> nn.Module:
    """The model of `cfg`'s model section for `data`.

    ``factory(num_classes=K, input_shape=data.input_shape, **model.params)``, plus what the data
    offers the factory (``data.model_kwargs``, such as a text dataset's vocabulary) where it
    takes it.

    Raises:
        ValueError: as :func:`raysearch.models.build_model`.
    """
    from raysearch.models import build_model, model_factory
    from raysearch.registry import accepted_keywords

    name = _component(cfg.model.name, "models", components)
    names, var_kw = accepted_keywords(model_factory(name))
    offered = {k: v for k, v in data.model_kwargs.items()
               if (k in names or var_kw) and k not in cfg.model.params}
    return build_model(name, num_classes=data.num_classes, input_shape=data.input_shape,
                       **offered, **cfg.model.params)


def check_run_model(cfg: RunConfig, data: DatasetSplits, *,
                    components: Mapping[str, Mapping[str, Any]] | None = None) -> nn.Module:
    """Build `cfg`'s model to check it, cheaply: on the meta device (shapes, no memory).

    A factory that cannot run on the meta device (it reads tensor values) is built on the CPU,
    whose error, if any, is the one raised; a factory given a file (a backbone's weights) is
    built for real, so the file is read.
    Then the data's task checks the model (a segmentation network on classification data).

    Raises:
        ValueError: as :func:`build_run_model`, or from the task's check.
    """
    from raysearch.models import model_factory
    from raysearch.tasks import task_for

    task = task_for(data)
    label = f"model {cfg.model.name!r}"
    # a factory that declares its task (the built-in segmentation networks) is checked first
    task.check_model(model_factory(_component(cfg.model.name, "models", components)), label)
    if any(isinstance(v, str) and Path(v).expanduser().is_file()
           for v in cfg.model.params.values()):
        # a factory that reads a file (a segmentation backbone's weights) reads it for real
        model = build_run_model(cfg, data, components=components)
    else:
        try:
            with torch.device("meta"):
                model = build_run_model(cfg, data, components=components)
        except Exception:  # noqa: BLE001 (the factory's own error, on the CPU)
            model = build_run_model(cfg, data, components=components)
    task.check_model(model, label)
    task.check_output(model, data, label)
    return model


def build_run_loss(cfg: RunConfig, data: DatasetSplits, *,
                   components: Mapping[str, Mapping[str, Any]] | None = None) -> nn.Module:
    """The loss of `cfg`'s loss section, told the data's ``ignore_index`` when it has one.

    Raises:
        ValueError: as :func:`raysearch.losses.build_loss`.
    """
    from raysearch.losses import build_loss

    name = _component(cfg.loss.name, "losses", components)
    if data.ignore_index is not None:
        return build_loss(name, ignore_index=data.ignore_index, **cfg.loss.params)
    return build_loss(name, **cfg.loss.params)


def _component(name: str, kind: str, components: Mapping[str, Mapping[str, Any]] | None) -> Any:
    """The object given for `name` through the Python API, else the name itself."""
    given = (components or {}).get(kind) or {}
    return given.get(name, name)


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


#: Mixed into the epoch seed for the augmentation generator (independent of the batch order).
_AUGMENT_SALT = 0x5EED_A5A5


class _Guard:
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
            bad = ~torch.isfinite(loss.detach()) & (self.first_bad < 0)
            self.first_bad = torch.where(bad, batch, self.first_bad)
            if batch % _CHECK_EVERY == 0:
                self.check(note)
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
            bad = ~torch.isfinite(loss.detach()) & (self.first_bad < 0)
            self.first_bad = torch.where(bad, batch, self.first_bad)
            if batch % _CHECK_EVERY == 0:
                self.check(note)
        self.optimizer.zero_grad(set_to_none=True)
        scale = ddp.world * weight
        (loss if scale == 1.0 else loss * scale).backward()
        self.optimizer.step()

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


def _make_mixer(
    cfg: RunConfig, num_classes: int
) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]] | None:
    """MixUp/CutMix from torchvision.transforms.v2 as ``mix(x, y) -> (x_mixed, lam, y_partner)``.

    RICAP (``cfg.ricap_beta`` > 0) gives ``(x_mixed, weights (4,), labels (4, N))`` instead: the
    patch areas and labels of :func:`raysearch.data.ricap.ricap_patches`.

    torchvision returns soft labels ``lam * onehot(y) + (1 - lam) * onehot(y_partner)``; `lam` is
    the smallest own-label weight in the batch (every sample whose partner has another class
    carries exactly lam) and `y_partner` the class holding the rest.
    """
    mixup = float(getattr(cfg, "mixup_alpha", 0.0))
    cutmix = float(getattr(cfg, "cutmix_alpha", 0.0))
    ricap_beta = float(getattr(cfg, "ricap_beta", 0.0))
    if mixup <= 0 and cutmix <= 0 and ricap_beta <= 0:
        return None
    from torchvision.transforms import v2

    parts = []
    if mixup > 0:
        parts.append(v2.MixUp(alpha=mixup, num_classes=num_classes))
    if cutmix > 0:
        parts.append(v2.CutMix(alpha=cutmix, num_classes=num_classes))
    if ricap_beta > 0:  # RICAP: (x, weights (4,), labels (4, N)), see _train_pass
        from raysearch.data.ricap import ricap_patches

        parts.append(lambda x, y: ricap_patches(x, y, ricap_beta))
    transform = parts[0] if len(parts) == 1 else v2.RandomChoice(parts)

    def mix(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = transform(x, y)
        if len(out) == 3:
            return out
        mixed, soft = out
        lam = soft.gather(1, y[:, None]).min()
        rest = soft - lam * torch.nn.functional.one_hot(y, num_classes).to(soft.dtype)
        return mixed, lam, rest.argmax(dim=1)

    return mix


def _train_pass(
    model: nn.Module,
    loss_fn: nn.Module,
    guard: _Guard,
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
    for batch, (xb, yb, index, *rest) in enumerate(batches, start=1):
        if mixer is not None and len(yb):
            xb, lam, partner = mixer(xb, yb)
            logits = _forward(model, xb, amp, label)
            if partner.ndim == 2:  # RICAP: patch weights (4,), patch labels (4, N)
                loss = sum(w * loss_fn(logits, t) for w, t in zip(lam.tolist(), partner,
                                                                 strict=True) if w > 0)
            else:
                loss = lam * loss_fn(logits, yb) + (1 - lam) * loss_fn(logits, partner)
        else:
            logits = _forward(model, xb, amp, label)
            if not len(yb):  # an empty DDP share: no loss, but the same collectives
                loss = logits.sum() * 0.0
            elif side:
                loss = loss_fn(logits, yb, **{key: value[index] for key, value in side.items()})
            else:
                loss = loss_fn(logits, yb)
        guard.step(loss, batch, share=(len(yb), rest[0]) if rest else None)
        loss_sum += loss.detach().double() * len(yb)
        hit = logits.detach().argmax(dim=1) == yb
        if ignore_index is not None and yb.ndim > 1:  # dense targets: valid pixels only
            valid = yb != ignore_index
            correct += (hit & valid).sum()
            counted += valid.sum()
        else:
            correct += hit.sum()
            counted += hit.numel()
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


def _forward(model: nn.Module, x: Tensor, amp: Amp, label: str = "the model") -> Tensor:
    """Training forward pass under the run's autocast; float32 logits for the loss.

    The model may return the logits, a tuple whose first item is the logits, or a mapping with
    ``logits`` (:func:`raysearch.models.output_logits`).
    """
    with amp.autocast():
        logits = output_logits(model(amp.prepare(x)), model=label)
    return logits.float()


def _train_pass_interleaved(
    model: nn.Module,
    loss_fn: nn.Module,
    guard: _Guard,
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
            logits = _forward(model, xb, amp, label)
            if not len(yb):  # an empty DDP share: no loss, but the same collectives
                loss = logits.sum() * 0.0
            else:
                loss = _term(loss_fn, logits, yb, term)
            if term == "secondary":
                loss = beta * loss
            guard.step(loss, batch, f"{term} step, ", share=(len(yb), rest[0]) if rest else None)
            loss_sum += loss.detach().double() * len(yb)
            correct += (logits.detach().argmax(dim=1) == yb).sum()
    return _train_metrics(loss_sum, correct, n, ddp)


#: Start of the error raised when interleaved training gets a loss without primary/secondary.
_NOT_INTERLEAVABLE = "interleaved training needs a primary + secondary objective"


def _check_interleavable(loss_fn: nn.Module, method: str, side_inputs: bool) -> None:
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


def _term(loss_fn: nn.Module, logits: Tensor, targets: Tensor, name: str) -> Tensor:
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


def _interleave_fraction(cfg: RunConfig) -> float:
    """``cfg.interleave_fraction`` (default 0.1), checked to be in (0, 1)."""
    fraction = cfg.interleave_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"`interleave_fraction` must be in (0, 1), got {fraction!r}")
    return float(fraction)


def _interleave_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
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


def _epoch_seed(seed: int, epoch: int) -> int:
    """Seed of the batch order of one epoch: a fixed function of (seed, epoch)."""
    return (seed * 1_000_003 + epoch) % 2**63


def _head_names(model: nn.Module, cfg: RunConfig) -> set[str]:
    """Parameter names of the classification head when the run treats it apart.

    That is with a head learning rate or a frozen backbone; empty otherwise.
    """
    if cfg.model.head_lr is None and not cfg.model.freeze_backbone_epochs:
        return set()
    from raysearch.models.pretrained import head_parameter_names

    return set(head_parameter_names(model))


def _param_groups(model: nn.Module, cfg: RunConfig, head: set[str]) -> list[dict[str, Any]]:
    """Parameter groups: the head at ``model.head_lr`` (when set), the rest at ``lr``."""
    head_lr = cfg.model.head_lr
    if head_lr is None or not head:
        return [{"params": list(model.parameters())}]
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n not in head]},
            {"params": [p for n, p in named if n in head], "lr": head_lr}]


def _freeze_backbone(model: nn.Module, head: set[str], frozen: bool) -> None:
    """``requires_grad`` off for every parameter outside the head while `frozen`, else on.

    SGD skips parameters without a gradient: no update, no weight decay, no momentum.
    """
    for name, param in model.named_parameters():
        if name not in head:
            param.requires_grad_(not frozen)
