"""CUB-200-2011's training split as augmented crops with their objectness, for ``als``.

:class:`CUBObjectnessDataset` yields ``(x, y, objectness, context)`` like
:class:`~raysearch.training.data.objectness.ObjectnessDataset`: MbLS's CUB training crop (the
pipeline of :func:`~raysearch.training.data.cub.cub_transforms`, with its window known) and the
share of the bird's box (``bounding_boxes.txt``) inside it, the objectness that the
objectness-adaptive label smoothing ``als`` reads. :func:`cub_objectness_dataset` builds it from
the splits of :func:`~raysearch.training.data.cub.load_cub200`.

Imports :mod:`raysearch.training.data.cub`, :mod:`raysearch.training.data._crops`,
:mod:`raysearch.training.data.images` and :mod:`raysearch.training.data.splits` of the package;
never :mod:`raysearch.training.data.objectness` (which imports this module lazily).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor
from torchvision.transforms.v2 import functional as TF

from raysearch.training.data._crops import (
    CropResult,
    EpochCropDataset,
    ObjectnessCrop,
    _sample_seed,
    rasterize_boxes,
)
from raysearch.training.data.cub import (
    CROP_SIZE,
    CUBImageDataset,
    _as_boxes,
    _check_resize,
    _check_size,
    _resize_size,
)
from raysearch.training.data.images import IMAGENET_MEAN, IMAGENET_STD, read_rgb
from raysearch.training.data.splits import DatasetSplits

__all__ = ["CUBObjectnessDataset", "cub_objectness_dataset"]


class CUBObjectnessDataset(EpochCropDataset):
    """CUB training images yielding MbLS's augmented crops with their objectness every epoch.

    Item ``i`` of epoch ``e`` is ``(x, y, objectness, context)``, read from disk when asked and
    seeded, as in :class:`~raysearch.training.data.objectness.ObjectnessDataset`, by a
    ``torch.Generator`` seeded with the same function of ``(seed, e, i)``: the crops of an epoch
    do not depend on earlier epochs, on the order of access or on DataLoader workers.

    Pipeline of one sample (draws from its generator in this order):

    1. context: ``rand() < context_fraction`` (always drawn). A context sample has its bird
       removed: the pixels of the ORIGINAL image inside its box (pixel centres,
       :func:`~raysearch.training.data.objectness.rasterize_boxes`) are painted with the ImageNet
       mean (uint8 ``round(255 * mean)``, about 0 after normalisation), as the paper replaces
       objects by the pixel mean; its box is dropped, so its objectness is 0 and ``context=True``.
    2. resize of the uint8 image to ``round(size / 0.875)`` (256 for 224; both sides for
       ``resize="square"``, the shorter side for ``"shorter"``), the box scaled with it;
    3. crop window ``top = randint(0, H' - size + 1)``, ``left = randint(0, W' - size + 1)``
       (torchvision ``RandomCrop``'s draws and order), then flip ``rand() < 0.5``;
    4. :meth:`ObjectnessCrop.apply <raysearch.training.data.objectness.ObjectnessCrop.apply>` on the
       window: objectness = resized-box pixels inside the window / window pixels (pixel-centre
       rule on the resized grid), the box clipped and flipped with the image;
    5. ``ToDtype(float32, scale=True)`` and ImageNet normalisation.

    Steps 2, 3 and 5 are exactly the training pipeline of :func:`cub_transforms` (the same
    torchvision kernels), so without context a sample is a training crop of
    :func:`load_cub200` whose window is known. Unlike the default
    :class:`~raysearch.training.data.objectness.ObjectnessCrop` (``RandomResizedCrop``) the crop is
    MbLS's fixed-size random crop, so ``als`` and the other losses see the same augmentation.

    Args:
        samples (Sequence[tuple[str, int]]): ``(path, label)`` pairs.
        boxes (np.ndarray | Tensor): (N, 4) xyxy box of each image in its original pixels.
        seed (int, optional): seed of the crops, >= 0. Defaults to ``0``.
        context_fraction (float, optional): share of object-free context samples, in [0, 1).
            Defaults to ``0.0``.
        size (int, optional): crop side S, >= 1. Defaults to ``224``.
        resize (str, optional): ``"square"`` or ``"shorter"``. Defaults to ``"square"``.
        num_threads (int, optional): threads that decode the images of :meth:`epoch_tensors`.
            Defaults to ``min(8, os.cpu_count())``.

    Attributes:
        samples (list[tuple[str, int]]): the ``(path, label)`` pairs.
        labels (Tensor): int64 (N,) labels.
        boxes (np.ndarray): float32 (N, 4) xyxy boxes (original pixels).
        seed (int): seed of the crops.
        context_fraction (float): share of context samples.
        size (int): crop side S.
        resize (str): resize mode.
        epoch (int): epoch of :meth:`__getitem__` (1 until :meth:`set_epoch`).

    Raises:
        ValueError: if `boxes` is not (N, 4) xyxy, `seed` < 0, `context_fraction` is outside
            [0, 1), `size` or `num_threads` < 1, or `resize` is unknown.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        boxes: np.ndarray | Tensor,
        *,
        seed: int = 0,
        context_fraction: float = 0.0,
        size: int = CROP_SIZE,
        resize: str = "square",
        num_threads: int | None = None,
    ) -> None:
        self.samples = [(str(path), int(label)) for path, label in samples]
        self.labels = torch.tensor([label for _, label in self.samples], dtype=torch.int64)
        self.boxes = _as_boxes(boxes, len(self.samples))
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"`seed` must be an int >= 0, got {seed!r}")
        if not 0 <= context_fraction < 1:
            raise ValueError(f"`context_fraction` must be in [0, 1), got {context_fraction}")
        self.seed = seed
        self.context_fraction = float(context_fraction)
        self.size = _check_size("size", size)
        self.resize = _check_resize(resize)
        if num_threads is None:
            num_threads = min(8, os.cpu_count() or 1)
        self.num_threads = _check_size("num_threads", num_threads)
        self.epoch = 1
        fill = [round(255 * m) for m in IMAGENET_MEAN]
        self._fill = torch.tensor(fill, dtype=torch.uint8).view(3, 1, 1)
        self._mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32).view(3, 1, 1)
        self._std = torch.tensor(IMAGENET_STD, dtype=torch.float32).view(3, 1, 1)
        self._crop = ObjectnessCrop(flip=True)

    def __len__(self) -> int:
        """Number of samples N."""
        return len(self.samples)

    def crop(self, index: int, epoch: int) -> tuple[CropResult, bool]:
        """The unnormalised crop of one sample in one epoch, and whether it is a context sample.

        Args:
            index (int): sample index in [0, N).
            epoch (int): epoch number (any int; ``fit`` counts from 1).

        Returns:
            tuple[CropResult, bool]: image float32 (3, S, S) in [0, 1]; ``boxes`` the box in
            the output image ((0, 4) when it left the window or for a context sample);
            ``objectness`` in [0, 1]; ``top``, ``left``, ``height``, ``width`` the window in
            the RESIZED image; ``flipped``. Then the context flag.

        Raises:
            IndexError: if `index` is out of range.
            DatasetError: naming the file if it cannot be read.
        """
        n = len(self)
        if not -n <= int(index) < n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} samples")
        index = int(index) % n
        generator = torch.Generator().manual_seed(_sample_seed(self.seed, epoch, index))
        is_context = torch.rand(1, generator=generator).item() < self.context_fraction
        image = TF.pil_to_tensor(read_rgb(self.samples[index][0]))  # uint8 (3, H, W)
        _, height, width = image.shape
        boxes = self.boxes[index : index + 1].astype(np.float64)
        if is_context:
            covered = rasterize_boxes(torch.from_numpy(boxes), height, width)
            image = torch.where(covered, self._fill, image)
            boxes = np.zeros((0, 4))
        image = TF.resize(image, _resize_size(self.size, self.resize), antialias=True)
        _, new_h, new_w = image.shape
        boxes[:, [0, 2]] = boxes[:, [0, 2]] * new_w / width
        boxes[:, [1, 3]] = boxes[:, [1, 3]] * new_h / height
        s = self.size
        top = int(torch.randint(0, new_h - s + 1, (1,), generator=generator).item())
        left = int(torch.randint(0, new_w - s + 1, (1,), generator=generator).item())
        flipped = bool(torch.rand(1, generator=generator).item() < 0.5)
        window = image[:, top : top + s, left : left + s].to(torch.float32).div_(255.0)
        boxes -= np.array([left, top, left, top], dtype=np.float64)
        result = self._crop.apply(
            window, top=0, left=0, height=s, width=s, flip=flipped, boxes=boxes
        )
        return dataclasses.replace(result, top=top, left=left), bool(is_context)

    def sample(self, index: int, epoch: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Augment one sample for one epoch.

        Args:
            index (int): sample index in [0, N).
            epoch (int): epoch number (any int; ``fit`` counts from 1).

        Returns:
            tuple: x float32 (3, S, S) normalised, y int64 scalar, objectness float32 scalar in
            [0, 1], context bool scalar.

        Raises:
            IndexError: if `index` is out of range.
            DatasetError: naming the file if it cannot be read.
        """
        result, is_context = self.crop(index, epoch)
        x = (result.image - self._mean) / self._std
        return (
            x,
            self.labels[int(index) % len(self)],
            torch.tensor(result.objectness, dtype=torch.float32),
            torch.tensor(is_context),
        )

    def epoch_tensors(self, epoch: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """All samples of one epoch, stacked (decoded by `num_threads` threads).

        Memory: ``N * 3 * S * S * 4`` bytes for x (3.2 GB for CUB's 5,394 training images at
        224).

        Args:
            epoch (int): epoch number.

        Returns:
            tuple: x float32 (N, 3, S, S), y int64 (N,), objectness float32 (N,), context bool
            (N,).
        """
        n, s = len(self), self.size
        x = torch.empty(n, 3, s, s, dtype=torch.float32)
        objectness = torch.empty(n, dtype=torch.float32)
        context = torch.empty(n, dtype=torch.bool)

        def fill(i: int) -> None:
            x[i], _, objectness[i], context[i] = self.sample(i, epoch)

        if self.num_threads == 1 or n <= 1:
            for i in range(n):
                fill(i)
        else:
            with ThreadPoolExecutor(max_workers=self.num_threads) as pool:
                list(pool.map(fill, range(n)))
        return x, self.labels.clone(), objectness, context

    def __repr__(self) -> str:
        return (
            f"CUBObjectnessDataset(n={len(self)}, size={self.size}, resize={self.resize!r}, "
            f"seed={self.seed}, context_fraction={self.context_fraction:g})"
        )


def cub_objectness_dataset(
    splits: DatasetSplits,
    *,
    seed: int,
    context_fraction: float = 0.0,
    size: int | None = None,
    num_threads: int | None = None,
) -> CUBObjectnessDataset:
    """The training split of :func:`load_cub200` as a :class:`CUBObjectnessDataset`.

    Args:
        splits (DatasetSplits): splits from :func:`load_cub200`.
        seed (int): seed of the crops, >= 0.
        context_fraction (float, optional): share of object-free context samples, in [0, 1).
            Defaults to ``0.0``.
        size (int, optional): crop side. Defaults to the training set's (``224``).
        num_threads (int, optional): decoding threads of ``epoch_tensors``. Defaults to
            ``min(8, os.cpu_count())``.

    Returns:
        CUBObjectnessDataset: the training samples with their boxes and the training set's
        resize mode.

    Raises:
        ValueError: if ``splits.train`` is not a :class:`CUBImageDataset`, or an argument is
            invalid (see :class:`CUBObjectnessDataset`).
    """
    train = splits.train
    if not isinstance(train, CUBImageDataset):
        raise ValueError(
            f"`splits.train` must be a CUBImageDataset (from load_cub200), got "
            f"{type(train).__name__} of dataset {splits.name!r}"
        )
    return CUBObjectnessDataset(
        train.samples,
        train.boxes,
        seed=seed,
        context_fraction=context_fraction,
        size=train.image_size if size is None else size,
        resize=train.resize,
        num_threads=num_threads,
    )
