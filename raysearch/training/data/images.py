"""Image datasets: in-memory uint8 tensors with vectorised crop/flip, and image files.

- :class:`CropFlip`: the standard CIFAR augmentation (zero-pad, random crop of the original size,
  random horizontal flip).
- :class:`ImageTensorDataset`: all images in memory as uint8 (N, C, H, W) (CIFAR, SVHN, MNIST,
  Tiny-ImageNet), normalised per channel on the fly; :meth:`ImageTensorDataset.batch` gathers,
  augments and normalises a whole batch at once on the device the images live on.
- :class:`ImageFileDataset`: images read from files per sample (ImageFolder trees of
  variable-size images), transformed by ``torchvision.transforms.v2``;
  :func:`imagenet_transforms` builds the usual train/eval pipelines.

Example:
    >>> import torch
    >>> images = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    >>> ds = ImageTensorDataset(images, torch.arange(4), mean=(0.5,) * 3, std=(0.25,) * 3,
    ...                         augment=CropFlip(padding=2, flip=True))
    >>> x, y = ds.batch(torch.tensor([0, 3]), generator=torch.Generator().manual_seed(0))
    >>> tuple(x.shape), x.dtype, y.tolist()
    ((2, 3, 8, 8), torch.float32, [0, 3])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms import v2

from raysearch.training.data import batch_kernel
from raysearch.training.data.splits import DatasetError

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CropFlip",
    "ImageFileDataset",
    "ImageTensorDataset",
    "imagenet_transforms",
    "read_rgb",
]

#: Per-channel mean and std of ImageNet in [0, 1] pixel units (torchvision's pretrained models).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class CropFlip:
    """Zero-pad, random crop of the original size, random horizontal flip (CIFAR augmentation).

    Random crop of the original size after zero-padding `padding` pixels per side (0 = no crop),
    then horizontal flip with probability 0.5 if `flip`.
    The crop offsets ``(dy, dx)`` are uniform in ``{0, ..., 2 * padding}`` (offset ``padding`` is
    the identity), as ``torchvision.transforms.RandomCrop(size, padding)`` with zero fill.

    Attributes:
        padding (int): zero-padding per side in pixels, >= 0.
        flip (bool): flip horizontally with probability 0.5.

    Raises:
        ValueError: if `padding` is negative or not an int.
        TypeError: if `flip` is not a bool.
    """

    padding: int
    flip: bool

    def __post_init__(self) -> None:
        if isinstance(self.padding, bool) or not isinstance(self.padding, int) or self.padding < 0:
            raise ValueError(f"`padding` must be an int >= 0, got {self.padding!r}")
        if not isinstance(self.flip, bool):
            raise TypeError(f"`flip` must be a bool, got {type(self.flip).__name__}")

    @property
    def active(self) -> bool:
        """Whether this augmentation changes anything (padding > 0 or flip)."""
        return self.padding > 0 or self.flip


def _as_index(index: Tensor | np.ndarray | Sequence[int], device: torch.device) -> Tensor:
    index = torch.as_tensor(np.asarray(index) if not isinstance(index, Tensor) else index)
    if index.dtype == torch.bool:
        index = index.nonzero().flatten()
    if index.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"`index` must hold integers, got {index.dtype}")
    return index.to(device=device, dtype=torch.int64).reshape(-1)


class ImageTensorDataset(Dataset):
    """In-memory uint8 images, per-channel normalisation, optional augmentation (train only).

    A sample is ``((images[i] / 255 - mean) / std, labels[i])`` as float32 (C, H, W), augmented
    by :class:`CropFlip` first when `augment` is set. :meth:`batch` does the same for a batch of
    indices in a few tensor operations on the images' device (the fast path for training loops);
    ``__getitem__`` serves ``DataLoader`` and uses the global torch RNG.

    Args:
        images (Tensor): uint8 (N, C, H, W), on any device.
        labels (Tensor): integer (N,) class labels; stored as int64 on the images' device.
        mean (Sequence[float]): length C, per-channel mean in [0, 1] pixel units.
        std (Sequence[float]): length C, per-channel std in [0, 1] pixel units, > 0.
        augment (CropFlip, optional): training augmentation. Defaults to ``None``.

    Attributes:
        images (Tensor): uint8 (N, C, H, W).
        labels (Tensor): int64 (N,), on the images' device.
        mean (tuple[float, ...]): per-channel mean.
        std (tuple[float, ...]): per-channel std.
        augment (CropFlip | None): training augmentation.

    Raises:
        TypeError: if `images` is not a uint8 tensor, `labels` not an integer tensor, or
            `augment` not a CropFlip.
        ValueError: if `images` is not 4-D, the lengths of `images` and `labels` differ, or
            `mean`/`std` do not have C entries or a std is not > 0.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        *,
        mean: Sequence[float],
        std: Sequence[float],
        augment: CropFlip | None = None,
    ) -> None:
        if not isinstance(images, Tensor) or images.dtype != torch.uint8:
            raise TypeError(
                f"`images` must be a uint8 tensor, got {getattr(images, 'dtype', type(images))}"
            )
        if images.ndim != 4:
            raise ValueError(f"`images` must be (N, C, H, W), got shape {tuple(images.shape)}")
        labels = torch.as_tensor(labels)
        if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
            raise TypeError(f"`labels` must hold integers, got {labels.dtype}")
        if labels.shape != (images.shape[0],):
            raise ValueError(
                f"`labels` must be ({images.shape[0]},) to match `images` "
                f"{tuple(images.shape)}, got {tuple(labels.shape)}"
            )
        channels = images.shape[1]
        mean = tuple(float(m) for m in mean)
        std = tuple(float(s) for s in std)
        if len(mean) != channels or len(std) != channels:
            raise ValueError(
                f"`mean` and `std` must have {channels} entries (one per channel), "
                f"got mean={mean}, std={std}"
            )
        if not all(s > 0 for s in std):
            raise ValueError(f"`std` must be > 0, got {std}")
        if augment is not None and not isinstance(augment, CropFlip):
            raise TypeError(f"`augment` must be a CropFlip or None, got {type(augment).__name__}")
        self.images = images
        self.labels = labels.to(device=images.device, dtype=torch.int64)
        self.mean = mean
        self.std = std
        self.augment = augment
        shape = (1, channels, 1, 1)
        self._mean = torch.tensor(mean, dtype=torch.float32, device=images.device).view(shape)
        self._std = torch.tensor(std, dtype=torch.float32, device=images.device).view(shape)

    def __len__(self) -> int:
        """Number of samples N."""
        return int(self.images.shape[0])

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        """Sample `i`: float32 (C, H, W) normalised (augmented, global RNG) and its label."""
        n = len(self)
        if not -n <= int(i) < n:
            raise IndexError(f"index {i} is out of range for a dataset of {n} samples")
        x, y = self.batch(torch.tensor([int(i) % n]))
        return x[0], int(y[0])

    @property
    def device(self) -> torch.device:
        """The device the images live on."""
        return self.images.device

    def batch(
        self,
        index: Tensor | np.ndarray | Sequence[int],
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Gather, augment and normalise a batch without a Python loop over samples.

        The random crop offsets ``(dy, dx)`` (one ``torch.randint(0, 2 * padding + 1, (2, B))``
        draw, when padding > 0) and then the flips (``torch.rand(B) < 0.5``, when `flip`) are
        drawn on the CPU from `generator` (the global RNG when ``None``) and moved to the images'
        device, so the same generator state gives the same batch on CPU and CUDA. Nothing is
        drawn when `augment` is ``None``. Output pixel ``(i, j)`` of a sample with offsets
        ``(dy, dx)`` is padded pixel ``(dy + i, dx + j)``, or ``(dy + i, dx + W - 1 - j)`` when
        flipped (crop, then flip). On a CUDA device with Triton the gather, crop, flip and
        normalisation run as one kernel (:mod:`raysearch.training.data.batch_kernel`), equal to
        the plain-torch path's batch to the bit.

        Args:
            index (Tensor | np.ndarray | Sequence[int]): (B,) sample indices (a bool mask is
                accepted), on any device.
            generator (torch.Generator, optional): CPU generator of the augmentation.
                Defaults to ``None`` (global RNG).

        Returns:
            tuple[Tensor, Tensor]: x float32 (B, C, H, W) normalised, y int64 (B,), on the
            images' device.

        Raises:
            TypeError: if `index` does not hold integers.
            IndexError: if an index is out of range.
        """
        device = self.images.device
        index = _as_index(index, device)
        labels = self.labels[index]  # raises IndexError first (a device assert on CUDA)
        draws = None
        if self.augment is not None and self.augment.active:
            draws = self._draws(index.numel(), generator).to(device, non_blocking=True)
        if batch_kernel.kernel_ready(self.images):
            try:
                return batch_kernel.fused_batch(
                    self.images, index, draws, self.augment.padding if draws is not None else 0,
                    self._mean.view(-1), self._std.view(-1)), labels
            except Exception as exc:  # noqa: BLE001 (a kernel that cannot build: plain torch)
                batch_kernel.disable(exc)
        x = self.images[index]
        if draws is not None:
            x = self._crop_flip(x, draws)
        x = x.to(torch.float32).div_(255.0).sub_(self._mean).div_(self._std)
        return x, labels

    def _draws(self, b: int, generator: torch.Generator | None) -> Tensor:
        """int64 (3, B) on the CPU: crop offsets dy, dx (randint), then flips (rand < 0.5)."""
        pad = self.augment.padding
        draws = torch.zeros(3, b, dtype=torch.int64)
        if pad > 0:
            draws[:2] = torch.randint(0, 2 * pad + 1, (2, b), generator=generator)
        if self.augment.flip:
            draws[2] = torch.rand(b, generator=generator) < 0.5
        return draws

    def _crop_flip(self, x: Tensor, draws: Tensor) -> Tensor:
        """Crop-with-padding and flip of uint8 (B, C, H, W) as one gather from the padded batch."""
        b, c, h, w = x.shape
        pad = self.augment.padding
        if pad > 0:
            x = torch.nn.functional.pad(x, (pad, pad, pad, pad))
        rows = draws[0][:, None] + torch.arange(h, device=x.device)  # (B, H)
        cols_fwd = torch.arange(w, device=x.device)
        # flipped window: output column j reads crop column w - 1 - j
        cols = torch.where(draws[2][:, None] != 0, cols_fwd.flip(0), cols_fwd) + draws[1][:, None]
        batch_ix = torch.arange(b, device=x.device)[:, None, None, None]
        chan_ix = torch.arange(c, device=x.device)[None, :, None, None]
        return x[batch_ix, chan_ix, rows[:, None, :, None], cols[:, None, None, :]]

    def _like(self, images: Tensor, labels: Tensor, augment: CropFlip | None) -> ImageTensorDataset:
        return ImageTensorDataset(images, labels, mean=self.mean, std=self.std, augment=augment)

    def to(self, device: torch.device | str) -> ImageTensorDataset:
        """The same dataset with images (still uint8) and labels on `device`."""
        return self._like(self.images.to(device), self.labels.to(device), self.augment)

    def subset(self, index: Tensor | np.ndarray | Sequence[int]) -> ImageTensorDataset:
        """The samples at `index` (a copy), with the same mean, std and augmentation."""
        index = _as_index(index, self.images.device)
        return self._like(self.images[index], self.labels[index], self.augment)

    def with_images(
        self, images: Tensor | np.ndarray, augment: CropFlip | None = None
    ) -> ImageTensorDataset:
        """Same labels, mean and std with other images (e.g. a corrupted copy of a test set).

        Args:
            images (Tensor | np.ndarray): uint8 (N, C, H, W) tensor, or uint8 (N, H, W, C) numpy
                array (the layout of image-corruption libraries), transposed to (N, C, H, W).
            augment (CropFlip, optional): augmentation of the new dataset. Defaults to ``None``.

        Returns:
            ImageTensorDataset: on the device of this dataset's images.

        Raises:
            TypeError: if `images` is not uint8.
            ValueError: if `images` is not 4-D or its N or C differ from this dataset's.
        """
        if isinstance(images, np.ndarray):
            if images.dtype != np.uint8:
                raise TypeError(f"`images` must be uint8, got {images.dtype}")
            if images.ndim != 4:
                raise ValueError(f"`images` must be (N, H, W, C), got shape {images.shape}")
            images = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
        if not isinstance(images, Tensor) or images.dtype != torch.uint8:
            raise TypeError(f"`images` must be uint8, got {getattr(images, 'dtype', type(images))}")
        if images.ndim != 4 or images.shape[:2] != self.images.shape[:2]:
            raise ValueError(
                f"`images` must be ({len(self)}, {self.images.shape[1]}, H, W) like this "
                f"dataset, got {tuple(images.shape)}"
            )
        return self._like(images.to(self.images.device), self.labels, augment)

    def images_hwc(self) -> np.ndarray:
        """uint8 (N, H, W, C) numpy copy on the CPU (the layout of image-corruption libraries)."""
        return np.ascontiguousarray(self.images.permute(0, 2, 3, 1).cpu().numpy())

    def __repr__(self) -> str:
        return (
            f"ImageTensorDataset(n={len(self)}, shape={tuple(self.images.shape[1:])}, "
            f"device={self.images.device}, augment={self.augment})"
        )


def read_rgb(path: str) -> Image.Image:
    """Open an image file as an RGB PIL image (grey-scale and palette images are converted).

    Raises:
        DatasetError: naming `path` if it cannot be read or decoded.
    """
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise DatasetError(
            f"cannot read image {path}: {type(err).__name__}: {err}; the file is corrupt or not "
            "an image"
        ) from err


def imagenet_transforms(
    image_size: int,
    *,
    train: bool,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> v2.Transform:
    """The usual ImageNet pipelines on a PIL image, ending in a normalised float32 (3, S, S).

    Train: ``RandomResizedCrop(image_size)`` + ``RandomHorizontalFlip()``; eval:
    ``Resize(round(image_size / 0.875))`` (shorter side) + ``CenterCrop(image_size)``.

    Args:
        image_size (int): output side S in pixels, >= 1.
        train (bool): the training pipeline (random) or the evaluation pipeline (deterministic).
        mean (Sequence[float], optional): per-channel mean. Defaults to ``IMAGENET_MEAN``.
        std (Sequence[float], optional): per-channel std. Defaults to ``IMAGENET_STD``.

    Returns:
        v2.Transform: a ``v2.Compose``.

    Raises:
        ValueError: if `image_size` < 1.
    """
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"`image_size` must be an int >= 1, got {image_size!r}")
    if train:
        geometry = [v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip()]
    else:
        geometry = [v2.Resize(round(image_size / 0.875), antialias=True), v2.CenterCrop(image_size)]
    return v2.Compose(
        [
            v2.ToImage(),
            *geometry,
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=list(mean), std=list(std)),
        ]
    )


class ImageFileDataset(Dataset):
    """Images read from files (ImageFolder trees), transformed by ``torchvision.transforms.v2``.

    Each access opens the file as RGB (:func:`read_rgb`) and applies `transform`, which must
    return a float32 (C, H, W) tensor (see :func:`imagenet_transforms`).

    Args:
        samples (Sequence[tuple[str, int]]): ``(path, label)`` pairs, as torchvision's
            ``make_dataset`` returns them.
        transform (Callable): PIL image -> float32 (C, H, W) tensor.

    Attributes:
        samples (list[tuple[str, int]]): the ``(path, label)`` pairs.
        transform (Callable): the transform.

    Raises:
        TypeError: if `transform` is not callable.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable) -> None:
        if not callable(transform):
            raise TypeError(f"`transform` must be callable, got {type(transform).__name__}")
        self.samples = [(str(path), int(label)) for path, label in samples]
        self.transform = transform

    @property
    def labels(self) -> np.ndarray:
        """int64 (N,) labels of the samples."""
        return np.fromiter(
            (label for _, label in self.samples), dtype=np.int64, count=len(self.samples)
        )

    def __len__(self) -> int:
        """Number of samples N."""
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        """Sample `i`: the transformed image (float32 (C, H, W)) and its label.

        Raises:
            DatasetError: naming the file if it cannot be read.
        """
        path, label = self.samples[i]
        return self.transform(read_rgb(path)), label

    def subset(self, index: Sequence[int] | np.ndarray) -> ImageFileDataset:
        """The samples at `index`, with the same transform."""
        return ImageFileDataset(
            [self.samples[int(i)] for i in np.asarray(index).reshape(-1)], self.transform
        )

    def images_hwc(self, size: int) -> np.ndarray:
        """uint8 (N, size, size, 3) of every image, resized and centre-cropped as for evaluation.

        ``Resize(round(size / 0.875))`` of the shorter side then ``CenterCrop(size)``, without
        normalisation (for image-corruption libraries).

        Args:
            size (int): output side in pixels, >= 1.

        Returns:
            np.ndarray: uint8 (N, size, size, 3).

        Raises:
            ValueError: if `size` < 1.
            DatasetError: naming a file that cannot be read.
        """
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"`size` must be an int >= 1, got {size!r}")
        resize = v2.Compose(
            [v2.ToImage(), v2.Resize(round(size / 0.875), antialias=True), v2.CenterCrop(size)]
        )
        out = np.empty((len(self), size, size, 3), dtype=np.uint8)
        for row, (path, _) in enumerate(self.samples):
            out[row] = resize(read_rgb(path)).permute(1, 2, 0).numpy()
        return out

    def __repr__(self) -> str:
        return f"ImageFileDataset(n={len(self)}, transform={self.transform})"
