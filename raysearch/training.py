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
  the soft-label loss and works for every loss in the registry.
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

import contextlib
import copy
import logging
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

if TYPE_CHECKING:
    from raysearch.config import RunConfig
    from raysearch.data import DatasetSplits

__all__ = ["DivergedError", "EpochResult", "TrainResult", "evaluate", "fit"]

logger = logging.getLogger(__name__)

#: Metric names of :func:`raysearch.metrics.calibration_summary`, reported as ``val_*``/``test_*``.
SUMMARY_KEYS = ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier")

#: Batch size of validation/test inference.
EVAL_BATCH_SIZE = 1024

#: Values of `precision` in :func:`fit`.
PRECISIONS = ("auto", "bf16", "fp32")

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
            :data:`raysearch.dense.TS_SAMPLE_PIXELS`; ``test_*``: empty), and `dense` holds
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
    task: str = "classification"
    dense: dict[str, Any] | None = None


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite (the message names the epoch and batch)."""


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
) -> TrainResult:
    """Train one configuration and evaluate it on validation (every epoch) and test (at the end).

    See the module docstring for the optimiser, schedule, batching, precision and seeding.

    Args:
        cfg (RunConfig): the run: method and loss parameters, dataset, model, SGD settings, seed.
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
            ``load_dataset(cfg.dataset, seed=cfg.split_seed, ...)``. Defaults to ``None``.
        loss (nn.Module, optional): the objective to train with instead of
            ``build_loss(cfg.method, **cfg.loss_params)`` (e.g. a custom loss object in a
            notebook). Defaults to ``None``.
        precision (str, optional): ``"auto"`` (bf16 autocast on CUDA, fp32 on the CPU),
            ``"bf16"`` or ``"fp32"``; the training forward pass only. Defaults to ``"auto"``.
        num_workers (int, optional): ``DataLoader`` worker processes for datasets that are
            read from files (ImageFolder trees); in-memory datasets need none. Defaults to ``0``.
        distributed (bool, optional): data-parallel training over the initialised
            ``torch.distributed`` process group (module docstring, **Data-parallel training**).
            ``None`` uses it when one with more than one rank is initialised; ``True`` requires
            one; ``False`` never uses it. Defaults to ``None``.

    Returns:
        TrainResult: final metrics, the model (unwrapped from DDP), and validation/test logits
        and labels (in DDP mode the full splits' logits, on every rank).

    Raises:
        DivergedError: as soon as a batch's training loss is NaN or infinite (on CUDA: within
            50 batches), or if the model's validation/test logits are (the last step of an
            epoch blew the weights up).
        ValueError: on an unknown dataset, model, loss or precision, a negative `num_workers`,
            or a `resume` state without ``epoch``; for ``distributed=True`` without an
            initialised process group, or (DDP) a batch size or split smaller than the number
            of ranks; for an objectness loss on a dataset without
            object annotations; for MixUp/CutMix combined with an objectness loss or
            interleaved training; for interleaved training with a loss that is not a primary +
            secondary objective ("interleaved training needs a primary + secondary objective
            ..."), with ``interleave_fraction`` outside (0, 1), or a training split too small to
            hold out a stratified part.
        TypeError: if `distributed` is not a bool or None.
    """
    from raysearch.data import dataset_task, load_dataset
    from raysearch.losses import build_loss
    from raysearch.models import build_model

    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was asked for but no CUDA GPU is visible")
    if precision not in PRECISIONS:
        raise ValueError(f"`precision` must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"`num_workers` must be an int >= 0, got {num_workers!r}")
    amp = _Amp(device, precision)
    ddp = _Dist.detect(distributed, device)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)

    if data is None:
        data = load_dataset(
            cfg.dataset,
            seed=cfg.split_seed,
            val_fraction=cfg.val_fraction,
            test_fraction=cfg.test_fraction,
            data_dir=cfg.data_dir,
            imbalance_ratio=cfg.imbalance_ratio,
            **({"crop_size": cfg.crop_size} if dataset_task(cfg.dataset) == "segmentation"
               else {}),
        )
    if ddp is not None:
        ddp.check_sizes(cfg.batch_size, data)
    dense = getattr(data, "task", "classification") == "segmentation"
    ignore = getattr(data, "ignore_index", None) if dense else None
    extra: dict[str, Any] = ({"pretrained_backbone": cfg.pretrained_backbone}
                             if getattr(cfg, "pretrained_backbone", None) else {})
    if getattr(data, "vocabulary", None) is not None:  # a text dataset: its model needs it
        extra["vocabulary"] = data.vocabulary
    if getattr(cfg, "embeddings", None):
        extra["embeddings_path"] = cfg.embeddings
    model = build_model(cfg.model, num_classes=data.num_classes, input_shape=data.input_shape,
                        **extra)
    if dense and getattr(model, "task", None) != "segmentation":
        raise ValueError(f"dataset {data.name!r} is a segmentation dataset: choose a "
                         f"segmentation model (e.g. deeplabv3_resnet50), not {cfg.model!r}")
    if not dense and getattr(model, "task", None) == "segmentation":
        raise ValueError(f"model {cfg.model!r} is a segmentation model: it needs a segmentation "
                         "dataset (voc, segfolder)")
    if ddp is not None and device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(device)
    if amp.channels_last:
        model.to(memory_format=torch.channels_last)
    if loss is None:
        loss = (build_loss(cfg.method, ignore_index=ignore, **cfg.loss_params)
                if ignore is not None else build_loss(cfg.method, **cfg.loss_params))
    loss_fn = loss.to(device)
    needs_objectness = bool(getattr(loss_fn, "needs_objectness", False))
    interleaved = bool(getattr(cfg, "interleaved", False))
    if interleaved:
        _check_interleavable(loss_fn, cfg.method, needs_objectness)
        fraction = _interleave_fraction(cfg)
    mixer = _make_mixer(cfg, data.num_classes)
    if dense and (needs_objectness or interleaved or mixer is not None):
        what = ("an objectness loss" if needs_objectness else "interleaved training"
                if interleaved else "MixUp/CutMix")
        raise ValueError(f"{what} is not available for segmentation (method {cfg.method!r})")
    if mixer is not None and (needs_objectness or interleaved):
        what = "an objectness loss" if needs_objectness else "interleaved training"
        raise ValueError(f"MixUp/CutMix (mixup_alpha/cutmix_alpha > 0) cannot be combined with "
                         f"{what} (method {cfg.method!r})")
    pretrained = getattr(cfg, "pretrained", None)
    if pretrained and resume is None:  # a resumed run loads its own checkpoint below
        from raysearch.models.pretrained import load_pretrained

        info = load_pretrained(model, pretrained)
        logger.info("loaded %d tensors of %s (sha256 %s)%s", info.loaded, info.source,
                    info.sha256[:12], "; head replaced" if info.replaced_head else "")
    head_names = _head_names(model, cfg)
    if getattr(cfg, "optimizer", "sgd") == "adam":  # MbLS App. B, 20 Newsgroups
        optimizer: torch.optim.Optimizer = torch.optim.Adam(
            _param_groups(model, cfg, head_names), lr=cfg.lr, betas=(0.9, 0.999),
            weight_decay=cfg.weight_decay)
    else:
        optimizer = torch.optim.SGD(
            _param_groups(model, cfg, head_names), lr=cfg.lr, momentum=cfg.momentum,
            weight_decay=cfg.weight_decay, nesterov=bool(getattr(cfg, "nesterov", False)),
        )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg))

    start_epoch = 1
    metrics: dict[str, float] = {}
    if resume is not None:
        if "epoch" not in resume:
            raise ValueError(f"`resume` must be a state from on_epoch, got keys {sorted(resume)}")
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        start_epoch = int(resume["epoch"]) + 1
        metrics = dict(resume.get("metrics") or {})
        logger.info("resuming %s/%s at epoch %d", cfg.method, cfg.model, start_epoch)
    # `model` is what trains (DDP wrapper in DDP mode); `net` is evaluated and checkpointed
    net = model
    if ddp is not None:
        model = ddp.wrap(net)

    objectness_set = None
    if needs_objectness:
        from raysearch.data.objectness import objectness_train_set

        context_fraction = float(getattr(loss_fn, "context_fraction", 0.0))
        objectness_set = objectness_train_set(
            data, seed=cfg.seed, context_fraction=context_fraction
        )
    else:
        train_source = _Source(data.train, device, num_workers=num_workers)
    if interleaved:
        majority, held_out = _interleave_split(train_source.labels().cpu().numpy(), fraction,
                                               cfg.seed)
    val_source = _Source(data.val, device, num_workers=num_workers)

    val_logits = None
    frozen = int(getattr(cfg, "freeze_backbone_epochs", 0) or 0)
    for epoch in range(start_epoch, cfg.epochs + 1):
        if frozen:  # the head alone for the first `frozen` epochs, then everything
            _freeze_backbone(net, head_names, epoch <= frozen)
        generator = torch.Generator().manual_seed(_epoch_seed(cfg.seed, epoch))
        augment = torch.Generator().manual_seed(_epoch_seed(cfg.seed, epoch) ^ _AUGMENT_SALT)
        model.train()
        guard = _Guard(device, optimizer, epoch, ddp)
        if objectness_set is not None:
            x, y, objectness, context = objectness_set.epoch_tensors(epoch)
            side = {"objectness": objectness.to(device)}
            if objectness_set.context_fraction > 0:
                side["context"] = context.to(device)
            source = _Source(TensorDataset(x, y), device)
            order = torch.randperm(len(y), generator=generator)
            metrics = _train_epoch(
                model, loss_fn, guard, source.batches(order, cfg.batch_size, augment, ddp),
                len(y), amp, side=side, ddp=ddp,
            )
        elif interleaved:
            metrics = _train_epoch_interleaved(
                model, loss_fn, guard, train_source, (majority, held_out), cfg.batch_size,
                generator, augment, amp, ddp=ddp,
            )
        else:
            order = torch.randperm(train_source.n, generator=generator)
            metrics = _train_epoch(
                model, loss_fn, guard, train_source.batches(order, cfg.batch_size, augment, ddp),
                train_source.n, amp, mixer=mixer, ddp=ddp, ignore_index=ignore,
            )
        guard.check()
        scheduler.step()
        if ddp is not None:
            ddp.sync_buffers(net)
        if dense:
            val_eval = _dense_eval(net, val_source, amp, data, cfg, f"after epoch {epoch}",
                                   final=epoch == cfg.epochs)
            metrics.update(_dense_metrics(val_eval.meters[0], "val"))
            val_logits = val_eval
        else:
            val_logits, val_y = _predict_source(net, val_source, amp, ddp=ddp)
            metrics.update(_summary(val_logits, val_y, "val", cfg.ece_bins,
                                    f"after epoch {epoch}"))
        if on_epoch is not None:
            state = {
                "epoch": epoch,
                "model": copy.deepcopy(net.state_dict()),
                "optimizer": copy.deepcopy(optimizer.state_dict()),
                "scheduler": copy.deepcopy(scheduler.state_dict()),
                "metrics": dict(metrics),
            }
            on_epoch(epoch, dict(metrics), state)

    epochs_completed = max(cfg.epochs, start_epoch - 1)
    if dense:
        return _finish_dense(net, val_logits, val_source, data, cfg, amp, metrics,
                             epochs_completed, num_workers, start_epoch)
    if val_logits is None:  # resumed after the last epoch: nothing trained, evaluate again
        val_logits, val_y = _predict_source(net, val_source, amp, ddp=ddp)
        after = f"resumed after epoch {start_epoch - 1}"
        metrics.update(_summary(val_logits, val_y, "val", cfg.ece_bins, after))
    test_logits, test_y = _predict_source(
        net, _Source(data.test, device, num_workers=num_workers), amp, ddp=ddp)
    after = f"after epoch {epochs_completed}"
    metrics.update(_summary(test_logits, test_y, "test", cfg.ece_bins, after))
    # the estimators of raysearch.metrics.estimator_summary, once, on the final model
    metrics.update(_estimators(val_logits, val_y, "val", cfg.ece_bins))
    metrics.update(_estimators(test_logits, test_y, "test", cfg.ece_bins))
    net.eval()
    return TrainResult(
        metrics=metrics,
        epochs_completed=epochs_completed,
        model=net,
        val_logits=_numpy_logits(val_logits),
        val_labels=val_y.cpu().numpy().astype(np.int64),
        test_logits=_numpy_logits(test_logits),
        test_labels=test_y.cpu().numpy().astype(np.int64),
    )


def lr_factor(cfg: RunConfig) -> Callable[[int], float]:
    """The schedule of `cfg` as ``factor(i)``: epoch ``i + 1`` trains at ``cfg.lr * factor(i)``.

    See the module docstring (cosine / multistep / constant, linear warm-up from 0.1).
    """
    epochs = cfg.epochs
    warmup = int(getattr(cfg, "warmup_epochs", 0))
    schedule = getattr(cfg, "schedule", "cosine")
    milestones = cfg.milestone_epochs() if hasattr(cfg, "milestone_epochs") else []
    decay = float(getattr(cfg, "lr_decay", 0.1))

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
    source = _Source(dataset, device, num_workers=num_workers)
    logits, labels = _predict_source(model, source, _Amp(device, "fp32"), batch_size)
    return _numpy_logits(logits), labels.cpu().numpy().astype(np.int64)


#: Mixed into the epoch seed for the augmentation generator (independent of the batch order).
_AUGMENT_SALT = 0x5EED_A5A5


class _Amp:
    """Autocast and memory-format settings of one run."""

    def __init__(self, device: torch.device, precision: str) -> None:
        self.device = device
        self.bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
        self.channels_last = device.type == "cuda"

    def autocast(self) -> contextlib.AbstractContextManager:
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def prepare(self, x: Tensor) -> Tensor:
        if self.channels_last and x.ndim == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x


class _Source:
    """One split as batches on the training device (see the module docstring, **Data**)."""

    def __init__(self, dataset: Dataset, device: torch.device, *, num_workers: int = 0) -> None:
        self.dataset = dataset
        self.device = device
        self.num_workers = num_workers
        self.n = len(dataset)  # type: ignore[arg-type]
        if isinstance(dataset, TensorDataset):
            self.kind = "tensor"
            self.x, self.y = _to_device(dataset, device)
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
        ddp: _Dist | None = None,
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
        self, order: Tensor, batch_size: int, augment: torch.Generator | None, ddp: _Dist
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


class _Dist:
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
    def detect(cls, distributed: bool | None, device: torch.device) -> _Dist | None:
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
        ddp: _Dist | None = None,
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
        self, ddp: _Dist, loss: Tensor, batch: int, note: str, n_rank: int, n_batch: int
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

    torchvision returns soft labels ``lam * onehot(y) + (1 - lam) * onehot(y_partner)``; `lam` is
    the smallest own-label weight in the batch (every sample whose partner has another class
    carries exactly lam) and `y_partner` the class holding the rest.
    """
    mixup = float(getattr(cfg, "mixup_alpha", 0.0))
    cutmix = float(getattr(cfg, "cutmix_alpha", 0.0))
    if mixup <= 0 and cutmix <= 0:
        return None
    from torchvision.transforms import v2

    parts = []
    if mixup > 0:
        parts.append(v2.MixUp(alpha=mixup, num_classes=num_classes))
    if cutmix > 0:
        parts.append(v2.CutMix(alpha=cutmix, num_classes=num_classes))
    transform = parts[0] if len(parts) == 1 else v2.RandomChoice(parts)

    def mix(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        mixed, soft = transform(x, y)
        lam = soft.gather(1, y[:, None]).min()
        rest = soft - lam * torch.nn.functional.one_hot(y, num_classes).to(soft.dtype)
        return mixed, lam, rest.argmax(dim=1)

    return mix


def _train_epoch(
    model: nn.Module,
    loss_fn: nn.Module,
    guard: _Guard,
    batches: Iterator[tuple[Tensor, Tensor, Tensor]],
    n: int,
    amp: _Amp,
    *,
    side: dict[str, Tensor] | None = None,
    mixer: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]] | None = None,
    ddp: _Dist | None = None,
    ignore_index: int | None = None,
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
            logits = _forward(model, xb, amp)
            loss = lam * loss_fn(logits, yb) + (1 - lam) * loss_fn(logits, partner)
        else:
            logits = _forward(model, xb, amp)
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
    loss_sum: Tensor, correct: Tensor, n: int, ddp: _Dist | None, counted: Tensor | None = None
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


def _forward(model: nn.Module, x: Tensor, amp: _Amp) -> Tensor:
    """Training forward pass under the run's autocast; float32 logits for the loss."""
    with amp.autocast():
        logits = model(amp.prepare(x))
    return logits.float()


def _train_epoch_interleaved(
    model: nn.Module,
    loss_fn: nn.Module,
    guard: _Guard,
    source: _Source,
    parts: tuple[np.ndarray | Tensor, np.ndarray | Tensor],
    batch_size: int,
    generator: torch.Generator,
    augment: torch.Generator,
    amp: _Amp,
    ddp: _Dist | None = None,
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
            logits = _forward(model, xb, amp)
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


def _check_interleavable(loss_fn: nn.Module, method: str, needs_objectness: bool) -> None:
    """Reject losses that cannot be split into primary and secondary terms (before training)."""
    beta = getattr(loss_fn, "beta", None)
    if (
        needs_objectness
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
    fraction = getattr(cfg, "interleave_fraction", 0.1)
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


def _to_device(dataset: Dataset, device: torch.device) -> tuple[Tensor, Tensor]:
    """The (x, y) tensors of a dataset on `device` (the data is held in memory)."""
    if isinstance(dataset, TensorDataset):
        x, y = dataset.tensors[0], dataset.tensors[1]
    else:
        xs, ys = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
        x, y = torch.stack([torch.as_tensor(v) for v in xs]), torch.as_tensor(ys)
    return x.to(device), y.to(device=device, dtype=torch.int64)


def _predict_source(
    model: nn.Module,
    source: _Source,
    amp: _Amp,
    batch_size: int = EVAL_BATCH_SIZE,
    *,
    ddp: _Dist | None = None,
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
                logits.append(model(amp.prepare(xb)).float())
                labels.append(yb)
    finally:
        model.train(was_training)
    if ddp is not None:
        return ddp.gather(torch.cat(logits), source.n), ddp.gather(torch.cat(labels), source.n)
    return torch.cat(logits), torch.cat(labels)


def _numpy_logits(logits: Tensor) -> np.ndarray:
    return logits.detach().cpu().numpy().astype(np.float32, copy=False)


def _estimators(logits: Tensor, labels: Tensor, split: str, n_bins: int) -> dict[str, float]:
    """``{split}_{key}`` of :func:`raysearch.metrics.estimator_summary` (final model only)."""
    from raysearch.metrics import estimator_summary, softmax

    summary = estimator_summary(softmax(_numpy_logits(logits)), labels.cpu().numpy(),
                                n_bins=n_bins)
    return {f"{split}_{key}": float(value) for key, value in summary.items()}


def _summary(
    logits: Tensor, labels: Tensor, split: str, n_bins: int, after: str
) -> dict[str, float]:
    """``{split}_{metric}`` of :class:`raysearch.metrics.CalibrationMeter` on a split's logits.

    The same numbers as :func:`raysearch.metrics.calibration_summary` (to float rounding).

    Raises:
        DivergedError: if a logit is NaN or infinite (`after` says when, for the message).
    """
    from raysearch.metrics import CalibrationMeter, softmax

    if not torch.isfinite(logits).all():
        # the last optimizer step blew the weights up: the loss was finite, the model is not
        raise DivergedError(f"the model's {split} logits are not finite ({after})")
    # the same streaming meter as segmentation trials (one update: the split's logits fit in
    # memory); equal to raysearch.metrics.calibration_summary to float rounding
    meter = CalibrationMeter(int(logits.shape[1]), n_bins=n_bins,
                             aece_samples=max(int(labels.shape[0]), 1))  # exact adaptive ECE
    meter.update(softmax(_numpy_logits(logits)), labels.cpu().numpy())
    summary = meter.compute()
    return {f"{split}_{key}": float(summary[key]) for key in SUMMARY_KEYS}


#: Metrics of a segmentation split (:class:`raysearch.metrics.CalibrationMeter`), logged as
#: ``{split}_{key}``; the calibrated (temperature-scaled) ones as ``test_{key}_ts``.
DENSE_KEYS = ("accuracy", "miou", "ece", "aece", "cece", "mce", "nll", "brier", "ece_released")
_DENSE_TS_KEYS = ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier")


def _dense_eval(net: nn.Module, source: _Source, amp: _Amp, data: DatasetSplits,
                cfg: RunConfig, after: str, *, final: bool,
                temperatures: tuple[float, ...] = (1.0,)) -> Any:
    """Stream a segmentation split through `net` (:func:`raysearch.dense.evaluate_dense`).

    With `final` it also keeps the temperature-scaling pixel sample and the confidence-map
    images. Batches of ``cfg.batch_size`` images; every DDP rank evaluates the whole split.

    Raises:
        DivergedError: if the logits are not finite (`after` says when).
    """
    from raysearch.dense import KEEP_IMAGES, TS_SAMPLE_PIXELS, evaluate_dense

    order = torch.arange(source.n)
    batches = ((xb, yb) for xb, yb, _ in source.batches(order, cfg.batch_size, None))
    try:
        return evaluate_dense(
            net, batches, num_classes=data.num_classes, ignore_index=data.ignore_index,
            n_bins=cfg.ece_bins, temperatures=temperatures,
            sample_pixels=TS_SAMPLE_PIXELS if final else 0,
            keep_images=KEEP_IMAGES if final else 0, seed=cfg.split_seed, prepare=amp.prepare)
    except ValueError as exc:
        if "not finite" in str(exc):
            raise DivergedError(f"the model's logits are not finite ({after})") from None
        raise


def _dense_metrics(meter: Any, split: str, suffix: str = "",
                   keys: tuple[str, ...] = DENSE_KEYS) -> dict[str, float]:
    """``{split}_{key}{suffix}`` of a meter's :meth:`compute` (the keys it has)."""
    values = meter.compute()
    return {f"{split}_{k}{suffix}": float(values[k]) for k in keys if k in values}


def _finish_dense(net: nn.Module, val_eval: Any, val_source: _Source, data: DatasetSplits,
                  cfg: RunConfig, amp: _Amp, metrics: dict[str, float], epochs_completed: int,
                  num_workers: int, start_epoch: int) -> TrainResult:
    """The end of a segmentation run: TS fitted on a validation pixel sample, then the test pass.

    The test pass feeds two meters at once (T = 1 and the fitted T); the result holds what the
    trial logs (:class:`TrainResult`, ``dense``).
    """
    from raysearch.dense import fit_temperature, split_sample
    from raysearch.metrics import CalibrationMeter, softmax

    if val_eval is None or not len(val_eval.sample_labels):
        # resumed after the last epoch (nothing trained): evaluate the final model again
        val_eval = _dense_eval(net, val_source, amp, data, cfg,
                               f"resumed after epoch {start_epoch - 1}", final=True)
        metrics.update(_dense_metrics(val_eval.meters[0], "val"))
    logits, labels = val_eval.sample_logits, val_eval.sample_labels
    temperature = fit_temperature(logits, labels)
    # an honest validation score of TS: fitted on one half of the pixel sample, measured on
    # the other (as classification trials do with their validation logits)
    fit_half, eval_half = split_sample(labels, cfg.split_seed)
    t_half = fit_temperature(logits[fit_half], labels[fit_half])
    half = CalibrationMeter(data.num_classes, n_bins=cfg.ece_bins)
    if len(eval_half):
        half.update(softmax(logits[eval_half] / t_half), labels[eval_half])
        metrics.update(_dense_metrics(half, "val", "_ts", _DENSE_TS_KEYS))
    test_source = _Source(data.test, amp.device, num_workers=num_workers)
    test_eval = _dense_eval(net, test_source, amp, data, cfg, f"after epoch {epochs_completed}",
                            final=False, temperatures=(1.0, temperature))
    metrics.update(_dense_metrics(test_eval.meters[0], "test"))
    metrics.update(_dense_metrics(test_eval.meters[1], "test", "_ts", _DENSE_TS_KEYS))
    metrics["val_ts_temperature"] = temperature
    net.eval()
    k = data.num_classes
    dense = {"temperature": temperature, "test_bins": test_eval.meters[0].reliability_bins(),
             "val_iou": val_eval.meters[0].iou(), "test_iou": test_eval.meters[0].iou(),
             "class_names": list(data.class_names or [str(i) for i in range(k)]),
             "images": val_eval.images}
    return TrainResult(metrics=metrics, epochs_completed=epochs_completed, model=net,
                       val_logits=logits, val_labels=labels,
                       test_logits=np.zeros((0, k), np.float32),
                       test_labels=np.zeros(0, np.int64), task="segmentation", dense=dense)


def _head_names(model: nn.Module, cfg: RunConfig) -> set[str]:
    """Parameter names of the classification head when the run treats it apart.

    That is with a head learning rate or a frozen backbone; empty otherwise.
    """
    if getattr(cfg, "head_lr", None) is None and not getattr(cfg, "freeze_backbone_epochs", 0):
        return set()
    from raysearch.models.pretrained import head_parameter_names

    return set(head_parameter_names(model))


def _param_groups(model: nn.Module, cfg: RunConfig, head: set[str]) -> list[dict[str, Any]]:
    """SGD parameter groups: the head at ``cfg.head_lr`` (when set), the rest at ``cfg.lr``."""
    head_lr = getattr(cfg, "head_lr", None)
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
