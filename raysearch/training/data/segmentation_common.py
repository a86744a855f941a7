"""What the segmentation loaders share: transforms, mask reading, the dataset, loader helpers.

:class:`PadToSize` and :func:`segmentation_transforms` (the train and evaluation transforms),
:func:`read_mask`, :class:`SegmentationDataset`, :func:`verify_segmentation`, the constants
:data:`IGNORE_INDEX`, :data:`DEFAULT_CROP_SIZE`, :data:`SCALE_RANGE` and :data:`COLOR_JITTER`,
and the helpers both loaders use (folder and split-file checks, the random validation carve,
``_splits`` building the :class:`~raysearch.training.data.DatasetSplits`). The loaders are
:func:`raysearch.training.data.segmentation.load_voc` and
:func:`raysearch.training.data.segfolder.load_segfolder`; transforms, checks and splits are
described in :mod:`raysearch.training.data.segmentation`, which gathers the public names of
this module.

Imports: torch, torchvision, NumPy, PIL, scikit-learn and :mod:`raysearch.training.data.images` /
:mod:`raysearch.training.data.splits` only; never a loader module (they import this one).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from sklearn.model_selection import train_test_split
from torch import Tensor
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from raysearch.training.data.images import IMAGENET_MEAN, IMAGENET_STD, read_rgb
from raysearch.training.data.splits import DatasetError, DatasetSplits

# the log records keep the name of the module the loaders are documented and registered in
logger = logging.getLogger("raysearch.training.data.segmentation")

#: Target value of pixels left out of the loss and the metrics (VOC boundaries/void, padding).
IGNORE_INDEX = 255
#: Side S of the square training crops and evaluation canvases when `crop_size` is ``None``.
DEFAULT_CROP_SIZE = 512
#: Range of the scale factor s of the training resize (longest side = S * s).
SCALE_RANGE = (0.5, 2.0)
#: Brightness, contrast and saturation jitter of the training images.
COLOR_JITTER = 0.2

#: PIL modes of single-channel masks (palette masks: the values are the palette indices).
_MASK_MODES = ("1", "L", "P", "I", "I;16")


# --------------------------------------------------------------------------------------------
# transforms


class PadToSize(v2.Transform):
    """Pad the bottom and right of images and masks to at least ``size x size``.

    Images (and plain tensors) are padded with `fill`, ``tv_tensors.Mask`` with `mask_fill`;
    inputs already that large are returned unchanged.

    Args:
        size (int): minimum height and width in pixels, >= 1.
        fill (float, optional): image padding value. Defaults to ``0``.
        mask_fill (int, optional): mask padding value. Defaults to :data:`IGNORE_INDEX` (255).

    Raises:
        ValueError: if `size` < 1.
    """

    def __init__(self, size: int, *, fill: float = 0, mask_fill: int = IGNORE_INDEX) -> None:
        super().__init__()
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"`size` must be an int >= 1, got {size!r}")
        self.size = size
        self.fill = fill
        self.mask_fill = mask_fill

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        """Pad one input (called by ``v2.Transform.forward`` for each image and mask)."""
        height, width = v2.functional.get_size(inpt)
        pad_h, pad_w = max(0, self.size - height), max(0, self.size - width)
        if pad_h == 0 and pad_w == 0:
            return inpt
        fill = self.mask_fill if isinstance(inpt, tv_tensors.Mask) else self.fill
        return v2.functional.pad(inpt, [0, 0, pad_w, pad_h], fill=fill)


def segmentation_transforms(crop_size: int, *, train: bool) -> v2.Compose:
    """The joint image/mask pipeline (see the module docstring), ending in normalised tensors.

    Called as ``transform(image, mask)`` with a ``tv_tensors.Image`` uint8 (3, H, W) and a
    ``tv_tensors.Mask`` uint8 (H, W); returns float32 (3, S, S) and int64 (S, S).

    Args:
        crop_size (int): output side S in pixels, >= 1.
        train (bool): the training pipeline (scale jitter, crop, flip, colour jitter; global
            torch RNG) or the evaluation pipeline (resize the longest side to S and pad).

    Returns:
        v2.Compose: the pipeline.

    Raises:
        ValueError: if `crop_size` < 1.
    """
    crop_size = _check_crop_size(crop_size)
    if train:
        geometry = [
            v2.ScaleJitter((crop_size, crop_size), scale_range=SCALE_RANGE, antialias=True),
            PadToSize(crop_size),
            v2.RandomCrop(crop_size),
            v2.RandomHorizontalFlip(),
            v2.ColorJitter(brightness=COLOR_JITTER, contrast=COLOR_JITTER, saturation=COLOR_JITTER),
        ]
    else:
        geometry = [v2.Resize(size=None, max_size=crop_size, antialias=True), PadToSize(crop_size)]
    return v2.Compose(
        [
            *geometry,
            v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64}, scale=True),
            v2.Normalize(mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD)),
        ]
    )


def _check_crop_size(crop_size: int) -> int:
    if isinstance(crop_size, bool) or not isinstance(crop_size, int) or crop_size < 1:
        raise ValueError(f"`crop_size` must be an int >= 1, got {crop_size!r}")
    return crop_size


# --------------------------------------------------------------------------------------------
# reading


def _bad_values(mask: np.ndarray, num_classes: int, ignore_index: int) -> list[int]:
    """Sorted values of `mask` outside {0..num_classes-1, ignore_index}."""
    # two comparisons (about 0.05 ms for 500x375) instead of a histogram (0.5 ms)
    bad = (mask >= num_classes) & (mask != ignore_index)
    if mask.dtype.kind == "i":
        bad |= mask < 0
    if not bad.any():
        return []
    return [int(v) for v in np.unique(mask[bad])]


def read_mask(path: str, *, num_classes: int, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """A mask PNG as uint8 (H, W) class ids, checked against {0..K-1, `ignore_index`}.

    Palette (``P``) masks give their palette indices (VOC's ``SegmentationClass``), single-channel
    masks (``L``, ``1``, ``I``, ``I;16``) their values.

    Args:
        path (str): the mask file.
        num_classes (int): K.
        ignore_index (int, optional): the ignore value. Defaults to ``255``.

    Returns:
        np.ndarray: uint8 (H, W).

    Raises:
        DatasetError: naming `path` if it cannot be read, is not single-channel, or holds a value
            outside {0..K-1, `ignore_index`}.
    """
    try:
        with Image.open(path) as image:
            mode = image.mode
            if mode not in _MASK_MODES:
                raise DatasetError(
                    f"mask {path} is a {mode} image; masks must be single-channel (L) or palette "
                    "(P) PNGs whose values are class ids (255 = ignore)"
                )
            mask = np.array(image)  # a writable copy (torch.from_numpy needs one)
    except DatasetError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise DatasetError(
            f"cannot read mask {path}: {type(err).__name__}: {err}; the file is corrupt or not "
            "an image"
        ) from err
    bad = _bad_values(mask, num_classes, ignore_index)
    if bad:
        shown = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
        raise DatasetError(
            f"mask {path} holds values {shown} outside the class ids 0..{num_classes - 1} "
            f"({num_classes} classes) and the ignore value {ignore_index}"
        )
    return mask.astype(np.uint8, copy=False)


class SegmentationDataset(Dataset):
    """Image/mask file pairs, transformed together by a ``torchvision.transforms.v2`` pipeline.

    Each access opens the image as RGB and the mask as class ids (:func:`read_mask`: a value
    outside {0..K-1, `ignore_index`} raises), checks that their sizes agree, and applies
    `transform` to a ``tv_tensors.Image`` uint8 (3, H, W) and a ``tv_tensors.Mask`` uint8 (H, W)
    (see :func:`segmentation_transforms`).

    Args:
        samples (Sequence[tuple[str, str]]): ``(image path, mask path)`` pairs.
        transform (Callable): ``(image, mask) -> (float32 (3, S, S), int64 (S, S))``.
        num_classes (int): K, >= 1.
        ignore_index (int, optional): the ignore value of the masks. Defaults to ``255``.

    Attributes:
        samples (list[tuple[str, str]]): the pairs.
        transform (Callable): the transform.
        num_classes (int): K.
        ignore_index (int): the ignore value.

    Raises:
        TypeError: if `transform` is not callable.
        ValueError: if `num_classes` < 1.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, str]],
        transform: Callable,
        *,
        num_classes: int,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        if not callable(transform):
            raise TypeError(f"`transform` must be callable, got {type(transform).__name__}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"`num_classes` must be an int >= 1, got {num_classes!r}")
        self.samples = [(str(image), str(mask)) for image, mask in samples]
        self.transform = transform
        self.num_classes = num_classes
        self.ignore_index = int(ignore_index)

    def __len__(self) -> int:
        """Number of samples N."""
        return len(self.samples)

    def read(self, i: int) -> tuple[Tensor, Tensor]:
        """Sample `i` untransformed: uint8 (3, H, W) image and uint8 (H, W) mask (tv_tensors).

        Raises:
            DatasetError: naming the file if the image or mask cannot be read, the mask holds a
                value outside {0..K-1, `ignore_index`}, or their sizes differ.
        """
        image_path, mask_path = self.samples[i]
        image = read_rgb(image_path)
        mask = read_mask(mask_path, num_classes=self.num_classes, ignore_index=self.ignore_index)
        if mask.shape != (image.height, image.width):
            raise DatasetError(
                f"mask {mask_path} is {mask.shape[1]}x{mask.shape[0]} but its image "
                f"{image_path} is {image.width}x{image.height} (width x height); they must match"
            )
        return (
            tv_tensors.Image(v2.functional.pil_to_tensor(image)),
            tv_tensors.Mask(torch.from_numpy(mask)),
        )

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        """Sample `i`: image float32 (3, S, S) and mask int64 (S, S), as plain tensors.

        Raises:
            DatasetError: see :meth:`read`.
        """
        image, mask = self.transform(*self.read(i))
        return image.as_subclass(Tensor), mask.as_subclass(Tensor)

    def subset(self, index: Sequence[int] | np.ndarray) -> SegmentationDataset:
        """The samples at `index`, with the same transform, K and ignore value."""
        return SegmentationDataset(
            [self.samples[int(i)] for i in np.asarray(index, dtype=np.int64).reshape(-1)],
            self.transform,
            num_classes=self.num_classes,
            ignore_index=self.ignore_index,
        )

    def __repr__(self) -> str:
        return (
            f"SegmentationDataset(n={len(self)}, num_classes={self.num_classes}, "
            f"ignore_index={self.ignore_index}, transform={self.transform})"
        )


def _verify_one(sample: tuple[str, str], num_classes: int, ignore_index: int) -> None:
    image_path, mask_path = sample
    mask = read_mask(mask_path, num_classes=num_classes, ignore_index=ignore_index)
    try:
        with Image.open(image_path) as image:  # the header only: no decoding
            width, height = image.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise DatasetError(
            f"cannot read image {image_path}: {type(err).__name__}: {err}; the file is corrupt "
            "or not an image"
        ) from err
    if mask.shape != (height, width):
        raise DatasetError(
            f"mask {mask_path} is {mask.shape[1]}x{mask.shape[0]} but its image {image_path} is "
            f"{width}x{height} (width x height); they must match"
        )


def verify_segmentation(splits: DatasetSplits) -> int:
    """Decode every mask of `splits` and check it against its classes and its image.

    Each distinct ``(image, mask)`` pair of train, val and test is checked as
    :meth:`SegmentationDataset.read` would (mask mode and values in {0..K-1, 255}, mask size =
    image size; images are not decoded, only their headers read), one after the other (PNG
    decoding holds the GIL: threads did not help). About 0.45 s of CPU (0.6 to 1.0 s wall) per
    1,000 500x375 palette PNGs (see the module docstring).

    Args:
        splits (DatasetSplits): segmentation splits (:class:`SegmentationDataset` each).

    Returns:
        int: the number of pairs checked.

    Raises:
        DatasetError: the first bad file, in split order (train, val, test).
        TypeError: if a split is not a :class:`SegmentationDataset`.
    """
    samples: dict[tuple[str, str], None] = {}
    for split in (splits.train, splits.val, splits.test):
        if not isinstance(split, SegmentationDataset):
            raise TypeError(f"expected SegmentationDataset splits, got {type(split).__name__}")
        samples.update(dict.fromkeys(split.samples))
    ignore = IGNORE_INDEX if splits.ignore_index is None else splits.ignore_index
    for sample in samples:
        _verify_one(sample, splits.num_classes, ignore)
    return len(samples)


# --------------------------------------------------------------------------------------------
# shared loader helpers


def _resolve_crop_size(crop_size: int | None) -> int:
    return DEFAULT_CROP_SIZE if crop_size is None else _check_crop_size(crop_size)


def _reject_unsupported(name: str, imbalance_ratio: float | None, verify: bool) -> None:
    if imbalance_ratio is not None:
        raise DatasetError(
            f"{name} is a segmentation dataset: `imbalance_ratio` (a long-tailed subset by image "
            f"label) does not apply to per-pixel labels (got imbalance_ratio={imbalance_ratio})"
        )
    if not isinstance(verify, bool):
        raise TypeError(f"`verify` must be a bool, got {type(verify).__name__}")


def _require_dir(name: str, data_dir: str | os.PathLike | None, layout: str) -> Path:
    if data_dir is None:
        raise DatasetError(f"{name}: `--data-dir` is required (expected {layout})")
    root = Path(data_dir).expanduser().absolute()
    if not root.is_dir():
        raise DatasetError(f"{name}: {root}/ is not a folder; expected {layout}")
    return root


def _listing(folder: Path) -> set[str]:
    """File names in `folder` (one directory listing: cheap for 17k files)."""
    with os.scandir(folder) as entries:
        return {entry.name for entry in entries}


def _read_stems(name: str, path: Path, layout: str) -> list[str]:
    """Ids of a split file: the first token of each non-empty line, as a stem.

    A line ``/JPEGImages/<id>.jpg /SegmentationClassAug/<id>.png`` (DeepLab's list format) gives
    ``<id>``; so does ``<id>``.
    """
    if not path.is_file():
        raise DatasetError(f"{name}: the split file {path} does not exist; expected {layout}")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(f"{name}: cannot read the split file {path}: {err}") from err
    stems = [Path(line.split()[0]).stem for line in lines if line.strip()]
    if not stems:
        raise DatasetError(f"{name}: the split file {path} lists no image; expected {layout}")
    return stems


def _random_carve(
    name: str, count: int, fraction: float, seed: int, what: str, source: str
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (kept, held) int64 indices of range(count): `fraction` held at random by seed."""
    try:
        kept, held = train_test_split(
            np.arange(count, dtype=np.int64), test_size=fraction, random_state=seed
        )
    except ValueError as err:
        raise DatasetError(
            f"{name}: cannot carve a {what} split of {fraction:g} from the {count} images of "
            f"{source}: {err}"
        ) from err
    return np.sort(kept), np.sort(held)


def _pct(fraction: float) -> str:
    return f"{100 * fraction:g}%"


def _splits(
    name: str,
    parts: dict[str, list[tuple[str, str]]],
    *,
    classes: Sequence[str],
    crop_size: int,
    info: dict[str, Any],
    verify: bool,
) -> DatasetSplits:
    k = len(classes)
    transforms = {train: segmentation_transforms(crop_size, train=train) for train in (True, False)}

    def dataset(part: str) -> SegmentationDataset:
        return SegmentationDataset(parts[part], transforms[part == "train"], num_classes=k)

    splits = DatasetSplits(
        train=dataset("train"),
        val=dataset("val"),
        test=dataset("test"),
        num_classes=k,
        input_shape=(3, crop_size, crop_size),
        name=name,
        class_names=list(classes),
        task="segmentation",
        ignore_index=IGNORE_INDEX,
    )
    splits.info = {
        "train_size": len(splits.train),
        "val_size": len(splits.val),
        "test_size": len(splits.test),
        **info,
        "crop_size": crop_size,
    }
    if verify:
        checked = verify_segmentation(splits)
        logger.info("%s: verified %d masks", name, checked)
    return splits
