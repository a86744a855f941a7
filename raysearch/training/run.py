"""The epoch loop of one training run (plain PyTorch; no Ray, no MLflow).

:func:`fit` trains the model ``cfg.model.name`` on the dataset ``cfg.data.name`` with the loss
``cfg.loss.name`` (each with its ``params``):

- **Optimiser**: any ``torch.optim`` optimizer, named by ``cfg.optimizer.name`` (``sgd``, the
  default, with momentum 0.9 unless set; ``adam``, ``adamw``, ``rmsprop``, ... or an import
  string), built with ``cfg.optimizer.lr``, ``cfg.optimizer.weight_decay`` (on every parameter,
  biases included) and the class's other keyword arguments in ``cfg.optimizer.params``
  (``momentum``, ``nesterov``, ``betas``, ...; :mod:`raysearch.training.optim`).
  ``cfg.model.head_lr`` puts the classification head in its own group; ``cfg.model.pretrained``
  loads weights first (:func:`raysearch.training.models.pretrained.load_pretrained`) and
  ``cfg.model.freeze_backbone_epochs`` trains only the head for the first epochs.
- **Schedule** ``cfg.schedule.name`` (a ``LambdaLR`` stepped once per epoch; epoch e, 1-based,
  trains at ``lr * factor(e - 1)``): ``cosine`` (default):
  ``(1 + cos(pi * (e - 1 - W) / (epochs - W))) / 2`` after W = ``cfg.schedule.warmup_epochs``
  warm-up epochs; ``multistep``: ``lr_decay ** #{m in milestones: m < e}`` with
  ``cfg.schedule.lr_decay`` and ``cfg.schedule.milestones`` (MbLS App. B: x0.1 after epochs 150
  and 250); ``constant``: 1. Warm-up epochs e <= W train at ``0.1 + 0.9 * (e - 1) / W`` of the
  schedule's value.
- **Batches**: the training split is reshuffled every epoch into mini-batches of
  ``cfg.batch_size`` (the last one may be smaller). The order of epoch e comes from a
  ``torch.Generator`` seeded with ``(cfg.seed, e)``, so it does not depend on earlier epochs and
  a resumed run sees the same batches as an uninterrupted one; augmentation draws from a second
  generator seeded from the same pair.
- **Data**: a ``TensorDataset`` (digits) is moved to `device` once and batched by indexing; an
  in-memory image set (:class:`~raysearch.training.data.images.ImageTensorDataset`: CIFAR, SVHN,
  MNIST, ...) is moved to `device` once as uint8 and each batch is gathered, augmented (random
  crop + flip) and normalised there, so the GPU never waits for a loader; any other map-style
  dataset (ImageFolder trees) goes through a ``DataLoader`` with `num_workers` worker
  processes, pinned memory on CUDA and non-blocking copies.
- **Precision** (`precision`): ``"bf16"`` runs the training forward pass under
  ``torch.autocast(dtype=bfloat16)``; ``"fp32"`` does not; ``"auto"`` (default) is bf16 on CUDA
  and fp32 on the CPU. The loss is always computed in float32 on float32 logits (outside
  autocast), and validation/test logits are always computed in float32, so the reported
  calibration does not depend on the precision. On CUDA the model and its inputs are
  channels-last.
- **Compilation** (``cfg.compile``, default off): the model and the loss are compiled with
  ``torch.compile`` (:mod:`raysearch.training.compiled`); the final metrics then hold
  ``train_compile_seconds``, the time spent compiling (in the first steps and evaluation batches).
- **MixUp / CutMix** (``cfg.mixup_alpha``, ``cfg.cutmix_alpha`` > 0; torchvision.transforms.v2,
  one lambda per batch): the batch is mixed with a permutation of itself and the objective is
  ``lam * loss(logits, y) + (1 - lam) * loss(logits, y_partner)``, which for cross-entropy is
  the soft-label loss and works for every loss in the registry. **RICAP** (``cfg.ricap_beta``
  > 0; Takahashi et al. 2018, :func:`raysearch.training.data.ricap.ricap_patches`) patches four
  random crops into each image around a boundary ~ Beta(beta, beta) and trains on
  ``sum_k W_k * loss(logits, y_k)`` with W_k the patch areas; with several of the three on,
  each batch uses one of them, chosen uniformly.
- **Per epoch**: after training, the validation split is evaluated (``val_*`` metrics from
  :func:`raysearch.metrics.calibration_summary`) and ``on_epoch(epoch, metrics, state)`` is
  called. After the last epoch the test split is evaluated once (``test_*``).
- **Divergence**: on the CPU every batch's loss is checked with ``torch.isfinite`` before the
  backward pass; on CUDA the check is kept on the device (no host sync per batch) and read
  every 50 batches and at the end of the epoch; a NaN/inf raises :class:`DivergedError` naming
  the first bad batch.
- **Out of memory**: a ``torch.OutOfMemoryError`` raised while training or evaluating (a batch
  that does not fit on the GPU) raises :class:`OutOfMemoryRunError`, one line naming the batch
  size, the device and the epoch (e.g. "CUDA out of memory at batch size 128 on cuda:0
  (training, epoch 3): lower batch_size, use precision bf16, or fewer trials per GPU
  (gpus_per_trial)"), from the original error, after the run's tensors are dropped and the CUDA
  cache is emptied. The run is never retried with a smaller batch: that would silently change
  its configuration; in a sweep the trial fails with that line and the sweep goes on.
- **Objectness losses**: when the built loss's ``side_inputs`` name ``objectness``
  (``als``), every epoch trains on freshly augmented crops of the training split with their
  objectness (:func:`raysearch.training.data.objectness.objectness_train_set`; digits: the ink box
  of each image as the object, random-resized crops with scale (0.5, 1) and no flip, see
  :data:`~raysearch.training.data.objectness.DIGITS_CROP`). The crops of epoch e are seeded by
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

**Layout** (the package ``raysearch.training``): here the loop (:func:`fit` and its steps);
:mod:`~raysearch.training.passes` the training passes over an epoch's batches,
:mod:`~raysearch.training.run_parts` the data/model/loss builders,
:mod:`~raysearch.training.run_weights` the pretrained/resumed weights, head lr, frozen backbone
and schedule, :mod:`~raysearch.training.divergence` the divergence guard,
:mod:`~raysearch.training.mixing` MixUp/CutMix/RICAP and :mod:`~raysearch.training.interleaving`
the interleaved-training checks.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from raysearch.losses import checked_targets
from raysearch.training.compiled import COMPILE_SECONDS, CompileClock, compile_run
from raysearch.training.divergence import (
    OUT_OF_MEMORY,
    Guard,
    OutOfMemoryRunError,
    free_device_memory,
    out_of_memory_error,
)
from raysearch.training.interleaving import (
    check_interleavable,
    interleave_fraction,
    interleave_split,
)
from raysearch.training.loop import (
    EVAL_BATCH_SIZE,
    PRECISIONS,
    Amp,
    Dist,
    DivergedError,
    Source,
    TrainResult,
    evaluate,
    train_feed,
)
from raysearch.training.mixing import make_mixer
from raysearch.training.passes import train_pass, train_pass_interleaved
from raysearch.training.run_parts import build_run_loss, build_run_model, load_run_data
from raysearch.training.run_weights import (
    freeze_backbone,
    load_run_pretrained,
    lr_factor,
    restore_run,
    run_head_names,
    run_param_groups,
)

if TYPE_CHECKING:
    from raysearch.config import RunConfig
    from raysearch.training.data import DatasetSplits
    from raysearch.training.loop import SideInputFeed, TrainFeed
    from raysearch.training.tasks import EvalContext, Task

__all__ = ["EVAL_BATCH_SIZE", "PRECISIONS", "DivergedError", "EpochResult", "OutOfMemoryRunError",
           "TrainResult", "build_run_loss", "build_run_model", "evaluate", "fit", "load_run_data"]

logger = logging.getLogger(__name__)

OnEpoch = Callable[[int, dict[str, float], dict[str, Any] | None], None]


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
    epoch_states: Callable[[int], bool] | None = None,
) -> TrainResult:
    """Train one configuration and evaluate it on validation (every epoch) and test (at the end).

    See the module docstring for the optimiser, schedule, batching, precision and seeding.

    Args:
        cfg (RunConfig): the run: loss, model, data, optimizer and schedule sections, seed.
        on_epoch (callable, optional): called after every epoch as
            ``on_epoch(epoch, metrics, state)`` with the 1-based epoch, the metrics of
            :class:`EpochResult` and ``state = {"epoch", "model", "optimizer", "scheduler",
            "metrics"}`` (state dicts, deep copies, safe to keep or ``torch.save``; ``None`` for
            the epochs `epoch_states` declines). Defaults to ``None``.
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
        epoch_states (callable, optional): ``epoch_states(epoch) -> bool``, asked after each
            epoch before ``on_epoch``: whether ``on_epoch`` gets that epoch's ``state``; it
            gets ``None`` otherwise, and nothing is copied (the deep copies of the model's
            and the optimiser's tensors take time, ~0.5 ms for the digits CNN, and as much
            memory again on the device while they live). ``None``: every epoch. Defaults to
            ``None``.

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
        OutOfMemoryRunError: if a training or evaluation batch does not fit in the device's
            memory (``torch.OutOfMemoryError``, its ``__cause__``); one line, starting "CUDA out
            of memory at batch size B on DEVICE (STAGE)". The run is failed, not retried with a
            smaller batch (that would change its configuration).
    """
    run = _setup(cfg, resume=resume, device=device, data=data, loss=loss, precision=precision,
                 num_workers=num_workers, distributed=distributed, components=components,
                 metrics=metrics)
    try:
        return _epochs(run, on_epoch, epoch_states)
    except OUT_OF_MEMORY as exc:
        batch_size, stage, training = run.stage
        error = out_of_memory_error(exc, batch_size, run.amp.device, stage, training=training,
                                    bf16=run.amp.bf16)
    del run  # the model, the optimiser and the data on the device
    free_device_memory()
    raise error from error.__cause__


def _epochs(run: _Run, on_epoch: OnEpoch | None,
            epoch_states: Callable[[int], bool] | None = None) -> TrainResult:
    """Train the epochs left, evaluating after each, then the test split (:func:`fit`'s loop).

    ``run.stage`` says where the run is, for an out-of-memory error: ``(batch size, where,
    training)``.
    """
    cfg = run.cfg
    val_state = None
    for epoch in range(run.start_epoch, cfg.epochs + 1):
        run.stage = (cfg.batch_size, f"training, epoch {epoch}", True)
        epoch_metrics = _train_epoch(run, epoch)
        run.stage = (_eval_batch(run.data.val), f"validation after epoch {epoch}", False)
        val_state, val_metrics = _evaluate(run, epoch)
        epoch_metrics.update(val_metrics)
        run.metrics = epoch_metrics
        if on_epoch is not None:
            wanted = epoch_states is None or epoch_states(epoch)
            _report(on_epoch, epoch, epoch_metrics, _checkpoint(run, epoch) if wanted else None)
    run.stage = (_eval_batch(run.data.test), "test", False)
    return _finish(run, val_state)


def _eval_batch(split: Any) -> int:
    """The largest batch an evaluation of `split` predicts at once (``EVAL_BATCH_SIZE`` at most)."""
    try:
        return min(EVAL_BATCH_SIZE, len(split))
    except TypeError:  # a dataset without a length
        return EVAL_BATCH_SIZE


@dataclass
class _Run:
    """What the steps of one :func:`fit` share (built by :func:`_setup`).

    Attributes:
        cfg: the run's config.
        data: its splits.
        task: what the data asks of training and evaluation (:mod:`raysearch.training.tasks`).
        amp: precision and memory format of the forward passes.
        ddp: the DDP group, or None.
        model: what trains (the DDP wrapper in DDP mode).
        net: what is evaluated and checkpointed (`model` unwrapped).
        loss_fn: the training objective.
        optimizer: the optimiser over `net`'s parameter groups.
        scheduler: the ``LambdaLR`` of :func:`lr_factor`, stepped once per epoch.
        feed: the training batches of each epoch (:func:`raysearch.training.loop.train_feed`).
        mixer: MixUp/CutMix/RICAP (:func:`make_mixer`), or None.
        parts: interleaved training's (majority, held-out) training indices, or None.
        head_names: parameter names of the classification head (:func:`run_head_names`).
        val_source: the validation split on the device.
        ctx: what the task's evaluation needs.
        start_epoch: the first epoch to train, 1-based (after the resumed one).
        metrics: the metrics of the last finished epoch (a resumed state's, before any).
        stage: ``(batch size, where, training)`` of the pass running now, for an
            out-of-memory error (:func:`_epochs`).
        compile_clock: with ``cfg.compile``, the time spent compiling
            (:mod:`raysearch.training.compiled`); None otherwise.
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
    stage: tuple[int, str, bool] = (0, "setup", False)
    compile_clock: CompileClock | None = None


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
    from raysearch.training.optim import build_optimizer
    from raysearch.training.tasks import EvalContext, task_for

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
    clock = compile_run(net, loss_fn) if cfg.compile else None
    feed = train_feed(data, loss_fn, seed=cfg.seed, device=device, num_workers=num_workers)
    fraction, mixer = _check_training(cfg, task, loss_fn, feed.side_inputs, data.num_classes)
    if cfg.model.pretrained and resume is None:  # a resumed run loads its own checkpoint below
        load_run_pretrained(net, cfg.model.pretrained)
    head_names = run_head_names(net, cfg)
    optimizer = build_optimizer(cfg.optimizer, run_param_groups(net, cfg, head_names))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg))
    start_epoch, epoch_metrics = restore_run(cfg, resume, net, optimizer, scheduler)
    model = net if ddp is None else ddp.wrap(net)
    parts = None
    if fraction is not None:
        parts = interleave_split(feed.source.labels().cpu().numpy(), fraction, cfg.seed)
    ctx = EvalContext(data=data, cfg=cfg, amp=amp, ddp=ddp, num_workers=num_workers,
                      label=label, metric_fns=dict(metrics or {}))
    return _Run(cfg=cfg, data=data, task=task, amp=amp, ddp=ddp, model=model, net=net,
                loss_fn=loss_fn, optimizer=optimizer, scheduler=scheduler, feed=feed, mixer=mixer,
                parts=parts, head_names=head_names,
                val_source=Source(data.val, device, num_workers=num_workers), ctx=ctx,
                start_epoch=start_epoch, metrics=epoch_metrics, compile_clock=clock)


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
        not interleaved) and the batch mixer of :func:`make_mixer` (or None).

    Raises:
        ValueError: as listed in :func:`fit` (interleaving, mixing, the task's own checks).
    """
    interleaved = bool(cfg.interleaved)
    fraction = None
    if interleaved:
        check_interleavable(loss_fn, cfg.loss.name, bool(side_inputs))
        fraction = interleave_fraction(cfg)
    mixer = make_mixer(cfg, num_classes)
    task.check_training(side_inputs=side_inputs, interleaved=interleaved,
                        mixing=mixer is not None, method=cfg.loss.name)
    if mixer is not None and (side_inputs or interleaved):
        what = (f"a loss taking {', '.join(side_inputs)} per sample" if side_inputs
                else "interleaved training")
        raise ValueError(f"MixUp/CutMix/RICAP (mixup_alpha/cutmix_alpha/ricap_beta > 0) cannot "
                         f"be combined with "
                         f"{what} (method {cfg.loss.name!r})")
    return fraction, mixer


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
        freeze_backbone(run.net, run.head_names, epoch <= frozen)
    generator = torch.Generator().manual_seed(_epoch_seed(cfg.seed, epoch))
    augment = torch.Generator().manual_seed(_epoch_seed(cfg.seed, epoch) ^ _AUGMENT_SALT)
    run.model.train()
    guard = Guard(run.amp.device, run.optimizer, epoch, run.ddp)
    checked = run.feed.labels_checked(run.data.num_classes,
                                      getattr(run.loss_fn, "ignore_index", None))
    with checked_targets(checked):  # no per-batch target check (a host synchronisation)
        metrics = _train_batches(run, epoch, guard, generator, augment)
    guard.check()
    run.scheduler.step()
    if run.ddp is not None:
        run.ddp.sync_buffers(run.net)
    return metrics


def _train_batches(run: _Run, epoch: int, guard: Guard, generator: torch.Generator,
                   augment: torch.Generator) -> dict[str, float]:
    """The training pass of :func:`_train_epoch` (interleaved or plain)."""
    cfg = run.cfg
    if run.parts is not None:
        metrics = train_pass_interleaved(
            run.model, run.loss_fn, guard, run.feed.source, run.parts, cfg.batch_size,
            generator, augment, run.amp, ddp=run.ddp, label=run.ctx.label,
        )
    else:
        batches, n, side = run.feed.epoch(epoch, cfg.batch_size, generator, augment, run.ddp)
        metrics = train_pass(
            run.model, run.loss_fn, guard, batches, n, run.amp, side=side, mixer=run.mixer,
            ddp=run.ddp, ignore_index=run.data.ignore_index, label=run.ctx.label,
        )
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
            state: dict[str, Any] | None) -> None:
    """Call ``on_epoch(epoch, metrics, state)`` with a copy of the epoch's metrics."""
    on_epoch(epoch, dict(metrics), state)


def _finish(run: _Run, val_state: Any) -> TrainResult:
    """Evaluate the trained model on the test split; the run's :class:`TrainResult`.

    `val_state` is the last :func:`_evaluate`'s state (None when a resumed run had no epoch
    left to train).
    """
    epochs_completed = max(run.cfg.epochs, run.start_epoch - 1)
    result = run.task.finish(run.net, val_state, run.val_source, run.ctx, run.metrics,
                             epochs_completed, run.start_epoch)
    if run.compile_clock is not None:
        result.metrics[COMPILE_SECONDS] = run.compile_clock.seconds()
    return result


#: Mixed into the epoch seed for the augmentation generator (independent of the batch order).
_AUGMENT_SALT = 0x5EED_A5A5


def _epoch_seed(seed: int, epoch: int) -> int:
    """Seed of the batch order of one epoch: a fixed function of (seed, epoch)."""
    return (seed * 1_000_003 + epoch) % 2**63
