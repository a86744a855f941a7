"""Box/mask-aware random-resized crop and the objectness of a crop window.

The crop primitives shared by :mod:`raysearch.training.data.objectness` (whose API includes the
public ones) and :mod:`raysearch.training.data.cub_objectness`: :func:`rasterize_boxes`,
:class:`ObjectnessCrop` and its :class:`CropResult`, the per-sample seed of a crop and
:class:`EpochCropDataset` (the ``set_epoch``/``__getitem__`` of both crop datasets). This module
imports nothing from the package, so :mod:`raysearch.training.data.cub_objectness` never imports
:mod:`raysearch.training.data.objectness` (which imports ``cub_objectness`` for the ``cub200``
training set).

Conventions (as in :mod:`raysearch.training.data.objectness`). Boxes are ``(x1, y1, x2, y2)`` in
pixels with x along the width, half-open: the box ``(1, 0, 7, 8)`` covers columns 1..6 and rows
0..7. A pixel belongs to a box when its centre ``(c + 0.5, r + 0.5)`` lies inside it (exact for
integer boxes). Masks are (H, W) bool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as TF

__all__ = [
    "CropResult",
    "EpochCropDataset",
    "ObjectnessCrop",
    "rasterize_boxes",
]

#: Tries of the area/aspect sampling before the centre-crop fallback (as torchvision).
_CROP_TRIES = 10


def rasterize_boxes(
    boxes: Tensor, height: int, width: int, *, top: int = 0, left: int = 0
) -> Tensor:
    """Pixels of a window covered by the union of boxes.

    Pixel (r, c) of the window (image pixel ``(top + r, left + c)``) is covered when its centre
    ``(left + c + 0.5, top + r + 0.5)`` lies in some box ``[x1, x2) x [y1, y2)``.

    Args:
        boxes (Tensor): (M, 4) xyxy boxes in image pixels; M may be 0.
        height (int): window height in pixels.
        width (int): window width in pixels.
        top (int, optional): first image row of the window. Defaults to ``0``.
        left (int, optional): first image column of the window. Defaults to ``0``.

    Returns:
        Tensor: (height, width) bool.
    """
    return torch.from_numpy(_raster(_as_numpy_boxes(boxes), height, width, top, left))


class EpochCropDataset(Dataset):
    """A dataset whose item ``i`` of epoch ``e`` is ``sample(i, e)``: crops fixed per epoch.

    Subclasses define :meth:`sample` and set ``self.epoch = 1`` in ``__init__``;
    :meth:`set_epoch` (called by the training loop) selects what ``dataset[i]`` returns.
    """

    epoch: int

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose crops :meth:`__getitem__` returns (1-based, as in ``fit``)."""
        self.epoch = int(epoch)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Return ``(x, y, objectness, context)`` of sample `index` in the current epoch."""
        return self.sample(index, self.epoch)

    def sample(self, index: int, epoch: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(x, y, objectness, context)`` of sample `index` in epoch `epoch` (1-based)."""
        raise NotImplementedError


@dataclass
class CropResult:
    """One augmented sample from :class:`ObjectnessCrop`.

    Attributes:
        image: (C, H, W) cropped, resized (to the input size) and possibly flipped image.
        boxes: (M', 4) float32 boxes in the output image (clipped to the crop, rescaled, flipped;
            boxes left without area are dropped), or None when a mask was given.
        mask: (H, W) bool mask in the output image (nearest-exact resize), or None when boxes
            were given.
        objectness: object area inside the crop / crop area, in [0, 1], measured on the
            original pixel grid (see :meth:`ObjectnessCrop.apply`).
        top, left, height, width: the crop window in the input image (pixels).
        flipped: whether the output was flipped horizontally.
    """

    image: Tensor
    boxes: Tensor | None
    mask: Tensor | None
    objectness: float
    top: int
    left: int
    height: int
    width: int
    flipped: bool


class ObjectnessCrop:
    """Random-resized crop + horizontal flip of an image and its object boxes or mask.

    The crop window is drawn exactly as torchvision's ``RandomResizedCrop.get_params`` draws it
    (area share uniform in ``scale``, log aspect ratio uniform in ``log(ratio)``, 10 tries, then
    a centre crop clamped to ``ratio``), but from the given ``torch.Generator``. The window is
    resized back to the input size (H, W); with ``flip=True`` the result is flipped horizontally
    with probability 0.5. Draw order per call: the window (2 uniforms per try, then 2 integers),
    then one uniform for the flip (drawn even when ``flip=False``, so the window sequence does
    not depend on it).

    The objectness is the object area inside the crop window over the window area, counted on
    the ORIGINAL pixel grid: for boxes the union of the boxes rasterised on the window
    (:func:`rasterize_boxes`, exact for integer boxes), for a mask the mean of the mask over the
    window. The paper counts the white pixels of the transformed mask instead; both agree up to
    the nearest-neighbour rounding of the resize, and ours does not depend on the output size.

    Defaults are the paper's "standard" ImageNet augmentation (torchvision's
    ``RandomResizedCrop`` scale and ratio, plus flip); digits use :data:`DIGITS_CROP`.

    Args:
        scale (tuple[float, float], optional): range of the crop area as a share of the image
            area, ``0 < lo <= hi <= 1``. Defaults to ``(0.08, 1.0)``.
        ratio (tuple[float, float], optional): range of the crop aspect ratio w/h,
            ``0 < lo <= hi``. Defaults to ``(3/4, 4/3)``.
        flip (bool, optional): flip horizontally with probability 0.5. Defaults to ``True``.
        interpolation (str, optional): image resize, ``"bilinear"`` or ``"nearest"`` (masks
            always use nearest-exact). Defaults to ``"bilinear"``.

    Raises:
        ValueError: if ``scale``, ``ratio`` or ``interpolation`` is invalid (the message names
            it and echoes the value).
        TypeError: if ``flip`` is not a bool.
    """

    def __init__(
        self,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        flip: bool = True,
        interpolation: str = "bilinear",
    ) -> None:
        scale = tuple(float(v) for v in scale)
        ratio = tuple(float(v) for v in ratio)
        if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"`scale` must be (lo, hi) with 0 < lo <= hi <= 1, got {scale}")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1] or not math.isfinite(ratio[1]):
            raise ValueError(f"`ratio` must be (lo, hi) with 0 < lo <= hi < inf, got {ratio}")
        if not isinstance(flip, bool):
            raise TypeError(f"`flip` must be a bool, got {type(flip).__name__}")
        modes = {"bilinear": TF.InterpolationMode.BILINEAR, "nearest": TF.InterpolationMode.NEAREST}
        if interpolation not in modes:
            raise ValueError(
                f"`interpolation` must be one of 'bilinear', 'nearest', got {interpolation!r}"
            )
        self.scale = scale
        self.ratio = ratio
        self.flip = flip
        self.interpolation = interpolation
        self._mode = modes[interpolation]

    def __repr__(self) -> str:
        return (
            f"ObjectnessCrop(scale={self.scale}, ratio={self.ratio}, flip={self.flip}, "
            f"interpolation={self.interpolation!r})"
        )

    def get_params(
        self, height: int, width: int, generator: torch.Generator
    ) -> tuple[int, int, int, int]:
        """Draw a crop window ``(top, left, crop_height, crop_width)`` as torchvision does.

        Args:
            height (int): image height H.
            width (int): image width W.
            generator (torch.Generator): source of randomness (CPU).

        Returns:
            tuple[int, int, int, int]: ``(top, left, h, w)`` with ``0 < h <= H``, ``0 < w <= W``.
        """
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(_CROP_TRIES):
            target_area = area * _uniform(self.scale[0], self.scale[1], generator)
            aspect = math.exp(_uniform(log_lo, log_hi, generator))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, (1,), generator=generator).item())
                left = int(torch.randint(0, width - w + 1, (1,), generator=generator).item())
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(
        self,
        image: Tensor,
        *,
        generator: torch.Generator,
        boxes: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> CropResult:
        """Draw a crop (and flip) and apply it to the image and its annotation.

        Args:
            image (Tensor): (C, H, W) float image.
            generator (torch.Generator): source of randomness (CPU).
            boxes (Tensor, optional): (M, 4) xyxy object boxes in pixels. Give boxes or mask.
            mask (Tensor, optional): (H, W) bool object mask.

        Returns:
            CropResult: the transformed image and annotation and the objectness.

        Raises:
            ValueError: as :meth:`apply`.
        """
        _, height, width = _check_image(image)
        top, left, h, w = self.get_params(height, width, generator)
        flipped = bool(torch.rand(1, generator=generator).item() < 0.5) and self.flip
        return self.apply(
            image, top=top, left=left, height=h, width=w, flip=flipped, boxes=boxes, mask=mask
        )

    def apply(
        self,
        image: Tensor,
        *,
        top: int,
        left: int,
        height: int,
        width: int,
        flip: bool,
        boxes: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> CropResult:
        """Apply a given crop window (and flip) to an image and its annotation.

        Args:
            image (Tensor): (C, H, W) float image.
            top (int): first row of the window.
            left (int): first column of the window.
            height (int): window height, ``1 <= height`` and ``top + height <= H``.
            width (int): window width, ``1 <= width`` and ``left + width <= W``.
            flip (bool): flip the output horizontally.
            boxes (Tensor, optional): (M, 4) xyxy boxes with x1 <= x2, y1 <= y2. Give boxes
                or mask, not both.
            mask (Tensor, optional): (H, W) bool mask.

        Returns:
            CropResult: output image (C, H, W), transformed boxes or mask, objectness.

        Raises:
            ValueError: if neither or both of ``boxes`` and ``mask`` are given, a shape is wrong
                (shapes quoted), a box has x2 < x1 or y2 < y1, or the window leaves the image.
        """
        _, img_h, img_w = _check_image(image)
        if (boxes is None) == (mask is None):
            raise ValueError("give exactly one of `boxes` and `mask`")
        if not (0 <= top and 0 <= left and 1 <= height and 1 <= width):
            raise ValueError(f"invalid crop window top={top}, left={left}, {height}x{width}")
        if top + height > img_h or left + width > img_w:
            raise ValueError(
                f"crop window top={top}, left={left}, {height}x{width} leaves the "
                f"{img_h}x{img_w} image"
            )
        size = [img_h, img_w]
        out = TF.resized_crop(image, top, left, height, width, size, interpolation=self._mode)
        out_boxes = out_mask = None
        if boxes is not None:
            boxes = _as_numpy_boxes(boxes)
            if ((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])).any():
                raise ValueError(
                    f"`boxes` must be xyxy with x1 <= x2 and y1 <= y2, got {boxes.tolist()}"
                )
            objectness = float(_raster(boxes, height, width, top, left).mean())
            out_boxes = _crop_boxes(boxes, top, left, height, width, img_h, img_w, flip)
        else:
            mask = _check_mask(mask, img_h, img_w)
            objectness = mask[top : top + height, left : left + width].double().mean().item()
            out_mask = TF.resized_crop(
                mask.to(torch.uint8).unsqueeze(0),
                top,
                left,
                height,
                width,
                size,
                interpolation=TF.InterpolationMode.NEAREST_EXACT,
            )[0].bool()
            if flip:
                out_mask = out_mask.flip(-1)
        if flip:
            out = TF.horizontal_flip(out)
        return CropResult(out, out_boxes, out_mask, objectness, top, left, height, width, flip)


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return torch.empty(1).uniform_(low, high, generator=generator).item()


def _sample_seed(seed: int, epoch: int, index: int) -> int:
    """Seed of the crop of one sample in one epoch: a fixed function of (seed, epoch, index)."""
    return ((seed * 1_000_003 + epoch) * 1_000_033 + index) % 2**63


def _check_image(image: Tensor) -> tuple[int, int, int]:
    if not isinstance(image, Tensor) or image.ndim != 3:
        shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
        raise ValueError(f"`image` must be a (C, H, W) tensor, got {shape}")
    return tuple(image.shape)  # type: ignore[return-value]


def _as_numpy_boxes(boxes: Tensor | np.ndarray) -> np.ndarray:
    """(M, 4) float64 array of boxes (small per-sample arithmetic is cheaper in NumPy)."""
    if isinstance(boxes, Tensor):
        boxes = boxes.detach().cpu().numpy()
    return np.asarray(boxes, dtype=np.float64).reshape(-1, 4)


def _raster(boxes: np.ndarray, height: int, width: int, top: int, left: int) -> np.ndarray:
    """(height, width) bool: window pixels whose centre lies in the union of the boxes."""
    cols = np.arange(left, left + width) + 0.5
    rows = np.arange(top, top + height) + 0.5
    inside_x = (boxes[:, 0:1] <= cols) & (cols < boxes[:, 2:3])  # (M, width)
    inside_y = (boxes[:, 1:2] <= rows) & (rows < boxes[:, 3:4])  # (M, height)
    return (inside_y[:, :, None] & inside_x[:, None, :]).any(axis=0)


def _check_mask(mask: Tensor, height: int, width: int) -> Tensor:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise ValueError("`mask` must be a bool tensor")
    if tuple(mask.shape) != (height, width):
        raise ValueError(
            f"`mask` must have the image's shape ({height}, {width}), got {tuple(mask.shape)}"
        )
    return mask


def _crop_boxes(
    boxes: np.ndarray,
    top: int,
    left: int,
    height: int,
    width: int,
    out_h: int,
    out_w: int,
    flip: bool,
) -> Tensor:
    """Boxes in the output image: shifted, clipped to the window, rescaled, optionally flipped."""
    x = np.clip(boxes[:, [0, 2]] - left, 0, width) * (out_w / width)
    y = np.clip(boxes[:, [1, 3]] - top, 0, height) * (out_h / height)
    if flip:
        x = out_w - x[:, ::-1]
    out = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1)
    keep = (out[:, 2] > out[:, 0]) & (out[:, 3] > out[:, 1])
    return torch.from_numpy(out[keep].astype(np.float32))
