"""RICAP: random image cropping and patching, a batch augmentation with area-mixed labels.

Plain PyTorch (no Ray, no MLflow). The training loop uses it when ``cfg.ricap_beta`` > 0
(:func:`raysearch.training.run.fit`), like MixUp and CutMix.
"""

import numbers

import numpy as np
import torch
from torch import Tensor

__all__ = ["ricap", "ricap_patches"]


def ricap_patches(
    images: Tensor,
    labels: Tensor,
    beta: float,
    *,
    generator: torch.Generator | None = None,
    boundary: tuple[int, int] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Patch four random crops of a batch into each image; return the patch labels and weights.

    Takahashi et al. (Sec. 3.1, Fig. 2; their released ``ricap`` training code): one boundary
    position ``(w, h) = (round(W * b_x), round(H * b_y))`` with ``b_x, b_y ~ Beta(beta, beta)``
    is drawn per batch. It splits every output image into four regions, top-left ``w x h``,
    top-right ``(W - w) x h``, bottom-left ``w x (H - h)`` and bottom-right ``(W - w) x (H - h)``;
    region k is filled, for every sample, with a crop of that size at a uniformly random position
    ``x_k ~ U{0, ..., W - w_k}``, ``y_k ~ U{0, ..., H - h_k}`` (one position per region and
    batch) of the image ``perm_k[i]`` of a random permutation ``perm_k`` of the batch. The label
    of the patched image mixes the four labels by area: ``W_k = w_k h_k / (W H)``, which sum to 1.

    Args:
        images: (N, C, H, W) float batch.
        labels: (N,) int64 class indices.
        beta: the Beta distribution's parameter, > 0 (Takahashi et al. use 0.3).
        generator: source of every random draw (boundary, permutations, crop positions); the
            result is deterministic given its state. Defaults to torch's global generator.
        boundary: ``(w, h)``, a fixed boundary with 0 <= w <= W and 0 <= h <= H instead of the
            Beta draw. Defaults to ``None`` (drawn).

    Returns:
        ``(mixed, weights, patch_labels)``: mixed images (N, C, H, W) in the dtype of `images`;
        weights (4,) float32, the area shares ``W_k`` (top-left, top-right, bottom-left,
        bottom-right); patch_labels (4, N) int64, ``labels[perm_k]``.

    Raises:
        TypeError: if `images` is not a floating-point tensor or `labels` not an int64 tensor.
        ValueError: if `images` is not (N, C, H, W), `labels` is not (N,), `beta` <= 0 (or not
            finite), or `boundary` lies outside the image.
    """
    if not isinstance(images, Tensor) or not images.is_floating_point():
        raise TypeError("`images` must be a floating-point tensor (N, C, H, W)")
    if images.ndim != 4:
        raise ValueError(f"RICAP needs image batches (N, C, H, W), got {tuple(images.shape)}")
    if not isinstance(labels, Tensor) or labels.dtype != torch.int64:
        raise TypeError("`labels` must be an int64 tensor of class indices")
    if tuple(labels.shape) != (images.shape[0],):
        raise ValueError(f"`labels` must have shape ({images.shape[0]},) for images of shape "
                         f"{tuple(images.shape)}, got {tuple(labels.shape)}")
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0 < beta < float("inf"):
        raise ValueError(f"`beta` must be a number > 0, got {beta!r}")
    num, _, height, width = images.shape
    if boundary is None:
        # Beta(beta, beta) for each axis, from NumPy seeded by one draw of `generator`
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        b_x, b_y = np.random.default_rng(seed).beta(float(beta), float(beta), size=2)
        w, h = round(width * float(b_x)), round(height * float(b_y))
    else:
        w, h = (int(v) for v in boundary)
        if not (0 <= w <= width and 0 <= h <= height):
            raise ValueError(f"`boundary` (w, h) must lie in [0, {width}] x [0, {height}], "
                             f"got {tuple(boundary)}")
    widths = (w, width - w, w, width - w)
    heights = (h, h, height - h, height - h)
    crops, patch_labels = [], []
    for w_k, h_k in zip(widths, heights, strict=True):
        perm = torch.randperm(num, generator=generator).to(images.device)
        x_k = int(torch.randint(0, width - w_k + 1, (1,), generator=generator))
        y_k = int(torch.randint(0, height - h_k + 1, (1,), generator=generator))
        crops.append(images[perm][:, :, y_k:y_k + h_k, x_k:x_k + w_k])
        patch_labels.append(labels[perm])
    top = torch.cat((crops[0], crops[1]), dim=3)
    bottom = torch.cat((crops[2], crops[3]), dim=3)
    mixed = torch.cat((top, bottom), dim=2)
    weights = torch.tensor([w_k * h_k / (width * height)
                            for w_k, h_k in zip(widths, heights, strict=True)])
    return mixed, weights, torch.stack(patch_labels)


def ricap(
    images: Tensor,
    labels: Tensor,
    beta: float,
    num_classes: int,
    *,
    generator: torch.Generator | None = None,
    boundary: tuple[int, int] | None = None,
) -> tuple[Tensor, Tensor]:
    """RICAP on a batch: patched images and their soft targets (Takahashi et al. 2018).

    See :func:`ricap_patches` for the patching; the soft target of image i is
    ``sum_k W_k onehot(labels[perm_k[i]])``, so the cross-entropy with it is the paper's
    ``sum_k W_k CE(logits, c_k)``.

    Args:
        images: (N, C, H, W) float batch.
        labels: (N,) int64 class indices in [0, num_classes).
        beta: the Beta distribution's parameter, > 0 (Takahashi et al. use 0.3).
        num_classes: K.
        generator: source of every random draw. Defaults to torch's global generator.
        boundary: a fixed boundary ``(w, h)`` instead of the Beta draw. Defaults to ``None``.

    Returns:
        ``(mixed, soft)``: mixed images (N, C, H, W); soft targets (N, K) float32, rows summing
        to 1.

    Raises:
        TypeError, ValueError: as :func:`ricap_patches`.
    """
    mixed, weights, patch_labels = ricap_patches(images, labels, beta, generator=generator,
                                                 boundary=boundary)
    onehot = torch.nn.functional.one_hot(patch_labels, num_classes).float()  # (4, N, K)
    soft = (weights.to(onehot.device)[:, None, None] * onehot).sum(dim=0)
    return mixed, soft
