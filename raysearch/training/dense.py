"""Evaluation of dense (semantic segmentation) outputs without holding every pixel in memory.

A PASCAL VOC validation pass produces about 360M pixel predictions over 21 classes: far too many
to keep (about 30 GB of float32 probabilities). :func:`evaluate_dense` streams the batches of a
split through the model and into :class:`raysearch.metrics.CalibrationMeter` (per-bin sums and a
confusion matrix: memory independent of the number of pixels), one meter per temperature, and
keeps only what the trial needs besides the metrics:

- a seeded uniform sample of at most `sample_pixels` valid pixels' logits and labels (a
  reservoir by random keys: every valid pixel of the split has the same chance to be kept,
  whatever the batching), on which temperature scaling is fitted (Guo et al. 2017; for dense
  outputs, fitting one temperature on a sample of pixels is what Ding et al. 2021 "Local
  temperature scaling" compare against as global TS);
- the first `keep_images` images with their ground truth, prediction and confidence (the top
  softmax probability), for the confidence-map figure of MbLS Fig. 3.

Plain PyTorch: no Ray, no MLflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

#: Valid validation pixels that temperature scaling of a segmentation trial is fitted on.
TS_SAMPLE_PIXELS = 200_000
#: Validation images kept for the confidence-map figure.
KEEP_IMAGES = 4


@dataclass
class DenseEval:
    """What :func:`evaluate_dense` returns.

    Attributes:
        meters: one :class:`~raysearch.metrics.CalibrationMeter` per temperature, in the order
            of the `temperatures` argument (``meters[0]`` at T = 1 unless told otherwise).
        sample_logits: float32 (M, K) logits of the sampled valid pixels (M <= sample_pixels).
        sample_labels: int64 (M,) their labels.
        images: up to `keep_images` tuples ``(image float32 (3, H, W) as the model saw it,
            ground truth int64 (H, W), prediction int64 (H, W), confidence float32 (H, W))``
            as NumPy arrays.
    """

    meters: list[Any]
    sample_logits: np.ndarray
    sample_labels: np.ndarray
    images: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=list)


class _Reservoir:
    """A uniform sample without replacement of at most `size` rows, kept by random keys."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.generator = torch.Generator().manual_seed(seed)
        self.keys: Tensor | None = None
        self.rows: Tensor | None = None
        self.labels: Tensor | None = None

    def add(self, logits: Tensor, labels: Tensor) -> None:
        """Offer (P, K) logits rows and their (P,) labels (valid pixels only)."""
        if self.size <= 0 or not len(labels):
            return
        keys = torch.rand(len(labels), generator=self.generator).to(logits.device)
        if self.keys is not None and len(self.keys) >= self.size:
            keep = keys < self.keys.max()  # cannot enter a full reservoir otherwise
            keys, logits, labels = keys[keep], logits[keep], labels[keep]
        if self.keys is not None:
            keys = torch.cat([self.keys, keys])
            logits = torch.cat([self.rows, logits])
            labels = torch.cat([self.labels, labels])
        if len(keys) > self.size:
            best = torch.topk(keys, self.size, largest=False).indices
            keys, logits, labels = keys[best], logits[best], labels[best]
        self.keys, self.rows, self.labels = keys, logits.float(), labels

    def arrays(self, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
        if self.rows is None:
            return np.zeros((0, num_classes), np.float32), np.zeros(0, np.int64)
        return (self.rows.cpu().numpy().astype(np.float32),
                self.labels.cpu().numpy().astype(np.int64))


def evaluate_dense(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    num_classes: int,
    ignore_index: int | None,
    n_bins: int = 15,
    temperatures: Sequence[float] = (1.0,),
    sample_pixels: int = 0,
    keep_images: int = 0,
    seed: int = 0,
    prepare: Any = None,
    label: str = "the model",
) -> DenseEval:
    """Stream a split through `model` into calibration meters (no per-pixel storage).

    Under ``torch.inference_mode`` in eval mode (restored afterwards), in float32.

    Args:
        model: maps (N, C, H, W) float inputs to (N, K, H, W) logits on the batches' device.
        batches: ``(x, y)`` pairs: x float (N, C, H, W), y int64 (N, H, W) with `ignore_index`
            marking ignored pixels (VOC's 255).
        num_classes: K.
        ignore_index: the label of ignored pixels, or None.
        n_bins: bins of the equal-width calibration errors. Defaults to 15.
        temperatures: one meter per temperature T, fed ``softmax(logits / T)``. Defaults to
            ``(1.0,)``.
        sample_pixels: size of the seeded uniform sample of valid pixels' logits to return
            (0: none). Defaults to 0.
        keep_images: how many of the first images to return with their prediction and
            confidence. Defaults to 0.
        seed: seed of the pixel sample. Defaults to 0.
        prepare: optional callable applied to x before the forward pass (memory format).
        label: the model's name in messages. Its output may be the logits, a tuple whose
            first item is the logits, or a mapping with ``logits``
            (:func:`raysearch.training.models.output_logits`).

    Returns:
        A :class:`DenseEval`.

    Raises:
        ValueError: if the model's logits are not finite (a diverged model), or do not have
            the labels' spatial shape.
    """
    from raysearch.metrics import CalibrationMeter
    from raysearch.training.models import output_logits

    meters = [CalibrationMeter(num_classes, n_bins=n_bins, ignore_index=ignore_index)
              for _ in temperatures]
    reservoir = _Reservoir(sample_pixels, seed)
    images: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for xb, yb in batches:
                logits = output_logits(model(prepare(xb) if prepare is not None else xb),
                                       model=label).float()
                if logits.shape[-2:] != yb.shape[-2:]:
                    raise ValueError(f"the model's logits {tuple(logits.shape)} do not match the "
                                     f"masks {tuple(yb.shape)}")
                if not torch.isfinite(logits).all():
                    raise ValueError("the model's logits are not finite")
                for meter, t in zip(meters, temperatures, strict=True):
                    meter.update(torch.softmax(logits if t == 1 else logits / t, dim=1), yb)
                if sample_pixels > 0:
                    rows = logits.movedim(1, -1).reshape(-1, num_classes)
                    flat = yb.reshape(-1)
                    valid = flat != ignore_index if ignore_index is not None else \
                        torch.ones_like(flat, dtype=torch.bool)
                    reservoir.add(rows[valid], flat[valid])
                if len(images) < keep_images:
                    probs = torch.softmax(logits, dim=1)
                    conf, pred = probs.max(dim=1)
                    for i in range(min(keep_images - len(images), len(yb))):
                        images.append((xb[i].float().cpu().numpy(), yb[i].cpu().numpy(),
                                       pred[i].cpu().numpy(), conf[i].cpu().numpy()))
    finally:
        model.train(was_training)
    sample_logits, sample_labels = reservoir.arrays(num_classes)
    return DenseEval(meters, sample_logits, sample_labels, images)


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """Temperature scaling (NLL, Guo et al. 2017) fitted on a pixel sample; 1.0 if it is empty.

    Args:
        logits: float (M, K) logits of sampled valid pixels.
        labels: int (M,) their labels.

    Returns:
        The temperature T > 0.
    """
    if len(labels) == 0:
        return 1.0
    from raysearch.calibration import fit_calibrator

    return float(fit_calibrator("ts", logits, labels).temperature)


def split_sample(labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two halves (index arrays) of a pixel sample, by a seeded permutation."""
    order = np.random.default_rng(seed).permutation(len(labels))
    half = len(order) // 2
    return order[:half], order[half:]
