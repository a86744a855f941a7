"""Semantic-segmentation datasets: PASCAL VOC 2012 and a user's own image/mask folder.

Loaders (registered in :mod:`raysearch.data` as ``voc`` and ``segfolder``): :func:`load_voc` and
:func:`load_segfolder`. Each takes the keyword-only arguments of
:func:`raysearch.data.load_dataset` (`imbalance_ratio` must be ``None``: a long tail is defined
on image labels, not pixels) plus `crop_size` and `verify`, and returns a
:class:`~raysearch.data.DatasetSplits` with ``task="segmentation"``, ``ignore_index=255`` and
:class:`SegmentationDataset` splits of ``(x float32 (3, S, S), y int64 (S, S))``,
``S = crop_size`` (default 512). Nothing is ever downloaded.

Layouts.

- ``voc``: the extracted official tar (:data:`VOC_URL`), ``data_dir`` being the folder above
  ``VOCdevkit``, ``VOCdevkit`` itself, or ``VOC2012`` itself::

      VOCdevkit/VOC2012/JPEGImages/<id>.jpg
      VOCdevkit/VOC2012/SegmentationClass/<id>.png      palette PNG, index = class id, 255 = void
      VOCdevkit/VOC2012/ImageSets/Segmentation/train.txt, val.txt   one <id> per line

  With the SBD augmentation (Hariharan et al. 2011) unpacked beside it, that is both
  ``VOC2012/SegmentationClassAug/<id>.png`` (single-channel PNGs of class ids and 255) and
  ``VOC2012/ImageSets/Segmentation/train_aug.txt`` (one ``<id>`` per line, or DeepLab's
  ``/JPEGImages/<id>.jpg /SegmentationClassAug/<id>.png`` lines), the training list is
  ``train_aug.txt`` (10,582 images in the real set) minus any image of ``val.txt``, with its
  masks from ``SegmentationClassAug/``. 21 classes, :data:`VOC_CLASSES` (0 = background).
  Lists are resolved into file paths by ``torchvision.datasets.VOCSegmentation(root,
  year="2012", image_set=..., download=False)``; where it cannot (``data_dir`` is a ``VOC2012``
  folder not inside a ``VOCdevkit`` folder, or the ``train_aug`` list), a subclass of it builds
  the same lists from the folder given.
- ``segfolder``::

      images/<stem>.jpg|.jpeg|.png     RGB (grey-scale and palette images are converted)
      masks/<stem>.png                 single-channel or palette PNG, value = class id, 255 = ignore
      classes.txt                      one class name per line; K = number of lines (<= 255)
      splits/train.txt, test.txt       optional: one <stem> per line (val.txt optional too)

Splits. ``voc``: VOC's ``val.txt`` (1,449 images) is the TEST split (the labels of VOC's own
test set are not public; the MbLS and ACLS papers report on ``val``). Validation for model
selection is `val_fraction` (default 0.1) of the training list, drawn at random
(``sklearn.model_selection.train_test_split(..., random_state=seed)``, not stratified: the
labels are pixels, not one class per image). ``segfolder`` with ``splits/``: the listed stems;
without ``val.txt`` validation is carved from ``train.txt`` as for VOC. Without ``splits/``: all
images with a mask are split at random by seed, `test_fraction` (default 0.2) of all as test,
then `val_fraction` (default 0.1) of all as validation. ``info`` records how
(``val_split``, ``test_split``, sizes, ``train_list`` for VOC).

Transforms (:func:`segmentation_transforms`, ``torchvision.transforms.v2`` on a
``tv_tensors.Image`` and a ``tv_tensors.Mask`` together; masks are resized with nearest
neighbour and padded with 255, so padding is ignored by the loss and the metrics):

- train: ``ScaleJitter``: resize so the LONGEST side is ``S * s``, ``s ~ U(0.5, 2.0)`` (the
  scale augmentation of the DeepLab training pipelines); pad bottom/right to at least S x S
  (image 0, mask 255); random S x S crop; random horizontal flip; colour jitter (brightness,
  contrast, saturation 0.2; image only); float32 in [0, 1]; ImageNet mean/std. The random draws
  use the global torch RNG (the trainer seeds it; DataLoader workers get their own seeds).
- val and test: no crop: resize the longest side to S, pad bottom/right to S x S (mask 255),
  normalise. Every sample then has the same shape, so batches stack; metrics (mIoU, pixel ECE)
  are therefore computed at that resolution, not at the original image size.

Checks. Loading always checks the folders, the split files and that every listed image and mask
exists (one directory listing per folder). Mask values are checked lazily, when a sample is read
(a :class:`~raysearch.data.DatasetError` naming the file), and for every mask at once with
``verify=True`` (:func:`verify_segmentation`: every mask is decoded, its mode and values checked
against {0..K-1, 255}, and its size compared with its image's header). Measured on 1,000
synthetic VOC-sized (500x375) palette PNGs (three objects with 255 borders each): 0.43 s of CPU
per 1,000 masks (decoding is most of it), 0.6 to 1.0 s of wall time on a busy 2-core machine
(up to 4 s for a first call in a fresh process there); so roughly 5 to 12 s for the 12,031 masks
of VOC with the SBD list. One thread: PNG decoding holds the GIL, threads did not help. The
sweep's driver does it once, before Ray starts; trials load without it.

References:
    Everingham et al., "The PASCAL Visual Object Classes (VOC) Challenge", IJCV 2010.
    Hariharan et al., "Semantic Contours from Inverse Detectors", ICCV 2011 (SBD).
    Chen et al., "Rethinking Atrous Convolution for Semantic Image Segmentation" (DeepLabV3),
    arXiv:1706.05587, 2017. Liu et al., "The Devil is in the Margin: Margin-based Label Smoothing
    for Network Calibration" (MbLS), CVPR 2022: DeepLabV3 on VOC 2012, batch 8, 100 epochs.
    Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network Calibration", ICCV
    2023: MbLS's protocol with the SBD-augmented list (10,582 training, 1,449 validation images).
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
from torchvision.datasets import VisionDataset, VOCSegmentation
from torchvision.transforms import v2

from raysearch.data.images import IMAGENET_MEAN, IMAGENET_STD, read_rgb
from raysearch.data.objectness import VOC_CLASSES as _VOC_OBJECTS
from raysearch.data.splits import (
    IMAGEFOLDER_TEST_FRACTION,
    IMAGEFOLDER_VAL_FRACTION,
    OFFICIAL_VAL_FRACTION,
    DatasetError,
    DatasetSplits,
    check_fraction_sum,
)

__all__ = [
    "COLOR_JITTER",
    "DEFAULT_CROP_SIZE",
    "IGNORE_INDEX",
    "SCALE_RANGE",
    "SEGFOLDER_LAYOUT",
    "VOC_CLASSES",
    "VOC_LAYOUT",
    "VOC_URL",
    "PadToSize",
    "SegmentationDataset",
    "load_segfolder",
    "load_voc",
    "segmentation_transforms",
    "verify_segmentation",
]

logger = logging.getLogger(__name__)

#: Target value of pixels left out of the loss and the metrics (VOC boundaries/void, padding).
IGNORE_INDEX = 255
#: Side S of the square training crops and evaluation canvases when `crop_size` is ``None``.
DEFAULT_CROP_SIZE = 512
#: Range of the scale factor s of the training resize (longest side = S * s).
SCALE_RANGE = (0.5, 2.0)
#: Brightness, contrast and saturation jitter of the training images.
COLOR_JITTER = 0.2

def voc_palette() -> np.ndarray:
    """The PASCAL VOC colour map of the devkit's ``labelcolormap``: (256, 3) uint8 RGB.

    Class id i (0..255, 255 = the boundary label) gets the colour whose bits interleave the
    bits of i; the ``SegmentationClass`` PNGs of VOC carry this palette.
    """
    colours = np.zeros((256, 3), np.uint8)
    for i in range(256):
        c, r, g, b = i, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        colours[i] = (r, g, b)
    return colours


#: The 21 PASCAL VOC segmentation classes, index = class id in the masks: the background and
#: the devkit's 20 object classes.
VOC_CLASSES = ("background", *_VOC_OBJECTS)

VOC_URL = "http://host.robots.ox.ac.uk/pascal/VOC/voc2012/VOCtrainval_11-May-2012.tar"
VOC_LAYOUT = (
    "VOCdevkit/VOC2012/{JPEGImages/<id>.jpg, SegmentationClass/<id>.png, "
    "ImageSets/Segmentation/{train,val}.txt}"
)
SEGFOLDER_LAYOUT = (
    "images/<stem>.{jpg,jpeg,png}, masks/<stem>.png (class ids, 255 = ignore), classes.txt "
    "(one class name per line), optional splits/{train,val,test}.txt (stems)"
)

_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
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


# --------------------------------------------------------------------------------------------
# PASCAL VOC 2012


class _VOCSegmentationLists(VOCSegmentation):
    """``VOCSegmentation`` over a ``VOC2012`` folder anywhere, with any list and mask folder.

    ``VOCSegmentation(root, year="2012", image_set=...)`` wants ``root/VOCdevkit/VOC2012``, a list
    in ``{train, trainval, val}`` and masks in ``SegmentationClass/``. This builds ``images`` and
    ``targets`` exactly as its constructor does (``JPEGImages/<id>.jpg``,
    ``<mask_dir>/<id>.png``) from `voc_root` itself, for a ``VOC2012`` folder outside a
    ``VOCdevkit`` folder and for SBD's ``train_aug`` list with ``SegmentationClassAug/``.
    """

    def __init__(self, voc_root: Path, image_set: str, mask_dir: str, stems: list[str]) -> None:
        VisionDataset.__init__(self, str(voc_root))
        self.year = "2012"
        self.image_set = image_set
        self.images = [os.path.join(voc_root, "JPEGImages", s + ".jpg") for s in stems]
        self.targets = [os.path.join(voc_root, mask_dir, s + ".png") for s in stems]


def _find_voc_root(root: Path) -> Path:
    """The ``VOC2012`` folder of `data_dir` (above ``VOCdevkit``, ``VOCdevkit``, or itself)."""
    for candidate in (root / "VOCdevkit" / "VOC2012", root / "VOC2012", root):
        if (candidate / "ImageSets" / "Segmentation").is_dir() or (
            candidate / "JPEGImages"
        ).is_dir():
            return candidate
    raise DatasetError(
        f"voc: no PASCAL VOC 2012 folder in {root}/; expected {root}/{VOC_LAYOUT} (or pass the "
        f"VOCdevkit or VOC2012 folder itself); download and extract {VOC_URL} there"
    )


def _voc_pairs(
    voc_root: Path, image_set: str, mask_dir: str, stems: list[str]
) -> list[tuple[str, str]]:
    """(image, mask) paths of `stems`, through VOCSegmentation where it can read the folder."""
    tv_root = voc_root.parent.parent
    if (
        mask_dir == "SegmentationClass"
        and image_set in ("train", "val")
        and voc_root.name == "VOC2012"
        and voc_root.parent.name == "VOCdevkit"
    ):
        reader: VOCSegmentation = VOCSegmentation(
            str(tv_root), year="2012", image_set=image_set, download=False
        )
        # VOCSegmentation keeps blank lines as empty ids; the stems parsed here do not
        pairs = [
            (image, mask)
            for image, mask in zip(reader.images, reader.masks, strict=True)
            if Path(mask).name != ".png"
        ]
        if [Path(mask).stem for _, mask in pairs] == stems:
            return pairs
    reader = _VOCSegmentationLists(voc_root, image_set, mask_dir, stems)
    return list(zip(reader.images, reader.masks, strict=True))


def _check_present(
    name: str, pairs: list[tuple[str, str]], listings: dict[Path, set[str]], layout: str
) -> None:
    """Raise naming the first listed image or mask that is not on disk."""
    for pair in pairs:
        for path in map(Path, pair):
            folder = path.parent
            if folder not in listings:
                listings[folder] = _listing(folder) if folder.is_dir() else set()
            if path.name not in listings[folder]:
                raise DatasetError(
                    f"{name}: {path} is listed but missing ({len(pairs)} images listed); "
                    f"expected {layout}"
                )


def load_voc(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
    crop_size: int | None = None,
    verify: bool = False,
) -> DatasetSplits:
    """PASCAL VOC 2012 segmentation (21 classes), optionally with the SBD training list.

    See the module docstring for the layout, the splits and the transforms: ``val.txt`` is the
    test split, validation is a random `val_fraction` of the training list (``train.txt``, or
    ``train_aug.txt`` minus ``val.txt`` when ``SegmentationClassAug/`` and ``train_aug.txt``
    exist).

    Args:
        seed (int): seed of the validation carve.
        val_fraction (float, optional): share of the training list held out for validation, in
            (0, 1). Defaults to ``None`` (0.1).
        test_fraction (float, optional): must be ``None`` (the test split is ``val.txt``).
        data_dir (str | os.PathLike, optional): the folder above ``VOCdevkit``, ``VOCdevkit`` or
            ``VOC2012``; required.
        download (bool, optional): must be ``False``; raysearch does not download VOC.
        imbalance_ratio (float, optional): must be ``None``.
        crop_size (int, optional): side S of the crops and evaluation canvases, >= 1. Defaults
            to ``None`` (:data:`DEFAULT_CROP_SIZE`, 512).
        verify (bool, optional): decode and check every mask now (:func:`verify_segmentation`,
            roughly 5 to 12 s for the SBD list). Defaults to ``False`` (masks are checked when
            read).

    Returns:
        DatasetSplits: :class:`SegmentationDataset` splits of ``(x float32 (3, S, S), y int64
        (S, S))``, ``task="segmentation"``, ``ignore_index=255``; ``info`` has ``train_list``
        (``"train"`` or ``"train_aug"``), ``val_split``, ``val_fraction``, ``test_split``,
        ``data_dir``, ``crop_size`` and the sizes.

    Raises:
        DatasetError: if `data_dir` is None or holds no VOC 2012 folder, a split file or folder
            is missing, a listed image or mask is missing, `download`, `imbalance_ratio` or
            `test_fraction` is given, the training list is too small to carve, or (with
            `verify`, or when a sample is read) a mask is unreadable, has a value outside
            {0..20, 255} or another size than its image.
        ValueError: if `crop_size` < 1.
    """
    name = "voc"
    if download:
        raise DatasetError(
            f"voc: raysearch does not download PASCAL VOC 2012; download {VOC_URL} (about 2 GB), "
            f"extract it and pass the folder holding {VOC_LAYOUT} as --data-dir, without "
            "--download"
        )
    _reject_unsupported(name, imbalance_ratio, verify)
    if test_fraction is not None:
        raise DatasetError(
            f"voc tests on VOC's val.txt; `test_fraction` applies to digits and to folder "
            f"datasets without their own test split (got test_fraction={test_fraction})"
        )
    crop_size = _resolve_crop_size(crop_size)
    val_fraction = OFFICIAL_VAL_FRACTION if val_fraction is None else float(val_fraction)
    root = _require_dir(name, data_dir, VOC_LAYOUT)
    voc_root = _find_voc_root(root)
    layout = f"{voc_root}/{{JPEGImages/<id>.jpg, SegmentationClass/<id>.png, ImageSets/...}}"
    sets = voc_root / "ImageSets" / "Segmentation"
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        if not (voc_root / folder).is_dir():
            raise DatasetError(
                f"voc: the folder {voc_root / folder}/ is missing; expected {layout}"
            )
    test_stems = _read_stems(name, sets / "val.txt", layout)
    use_aug = (voc_root / "SegmentationClassAug").is_dir() and (sets / "train_aug.txt").is_file()
    if use_aug:
        train_list, mask_dir = "train_aug", "SegmentationClassAug"
        test_set = set(test_stems)
        listed = _read_stems(name, sets / "train_aug.txt", layout)
        train_stems = [s for s in listed if s not in test_set]
        removed = len(listed) - len(train_stems)
        if removed:
            logger.info("voc: %d images of train_aug.txt are in val.txt: left out", removed)
    else:
        train_list, mask_dir = "train", "SegmentationClass"
        train_stems = _read_stems(name, sets / "train.txt", layout)
        removed = 0
    train_pairs = _voc_pairs(voc_root, train_list, mask_dir, train_stems)
    test_pairs = _voc_pairs(voc_root, "val", "SegmentationClass", test_stems)
    listings: dict[Path, set[str]] = {}
    _check_present(name, train_pairs, listings, layout)
    _check_present(name, test_pairs, listings, layout)
    source = f"{train_list}.txt" + (" minus val.txt" if use_aug else "")
    train, val = _random_carve(name, len(train_pairs), val_fraction, seed, "validation", source)
    info = {
        "train_list": train_list,
        "val_split": (
            f"random {_pct(val_fraction)} of the {source} list ({len(train_pairs)} images), "
            f"seed {seed}; not stratified"
        ),
        "val_fraction": val_fraction,
        "test_split": "VOC2012 ImageSets/Segmentation/val.txt",
        "data_dir": str(voc_root),
    }
    if use_aug:
        info["train_aug_in_val"] = removed
    return _splits(
        name,
        {
            "train": [train_pairs[i] for i in train],
            "val": [train_pairs[i] for i in val],
            "test": test_pairs,
        },
        classes=VOC_CLASSES,
        crop_size=crop_size,
        info=info,
        verify=verify,
    )


# --------------------------------------------------------------------------------------------
# a user's own folder


def _read_classes(path: Path) -> list[str]:
    layout = SEGFOLDER_LAYOUT
    if not path.is_file():
        raise DatasetError(f"segfolder: {path} does not exist; expected {layout}")
    try:
        lines = [line.strip() for line in path.read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(f"segfolder: cannot read {path}: {err}") from err
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise DatasetError(f"segfolder: {path} lists no class; expected one class name per line")
    if "" in lines:
        raise DatasetError(
            f"segfolder: {path} has an empty line {lines.index('') + 1}; line i + 1 names class "
            "id i, so every line needs a name"
        )
    if len(lines) > IGNORE_INDEX:
        raise DatasetError(
            f"segfolder: {path} lists {len(lines)} classes; at most {IGNORE_INDEX} fit in "
            f"8-bit masks with {IGNORE_INDEX} as the ignore value"
        )
    return lines


def _scan_files(folder: Path, extensions: tuple[str, ...]) -> dict[str, Path]:
    """Map stem -> file of the files of `folder` with one of `extensions` (case-insensitive)."""
    if not folder.is_dir():
        raise DatasetError(
            f"segfolder: the folder {folder}/ is missing; expected {SEGFOLDER_LAYOUT}"
        )
    found: dict[str, Path] = {}
    for entry in sorted(_listing(folder)):
        path = folder / entry
        if path.suffix.lower() not in extensions:
            continue
        if path.stem in found:
            raise DatasetError(
                f"segfolder: {found[path.stem]} and {path} share the stem {path.stem!r}; "
                "keep one file per stem"
            )
        found[path.stem] = path
    return found


def _pair(
    stem: str, images: dict[str, Path], masks: dict[str, Path], root: Path, source: str
) -> tuple[str, str]:
    if stem not in images:
        raise DatasetError(
            f"segfolder: {root / 'images' / stem}.{{jpg,jpeg,png}} ({source}) is missing; "
            f"expected {SEGFOLDER_LAYOUT}"
        )
    if stem not in masks:
        raise DatasetError(
            f"segfolder: {root / 'masks' / stem}.png (the mask of {images[stem]}) is missing; "
            f"expected {SEGFOLDER_LAYOUT}"
        )
    return str(images[stem]), str(masks[stem])


def load_segfolder(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
    crop_size: int | None = None,
    verify: bool = False,
) -> DatasetSplits:
    """A user's own segmentation folder: ``images/``, ``masks/``, ``classes.txt``, ``splits/``.

    See the module docstring for the layout, the splits and the transforms.

    Args:
        seed (int): seed of the random splits.
        val_fraction (float, optional): validation share in (0, 1): of all images without
            ``splits/``, of ``splits/train.txt`` when ``splits/val.txt`` is absent; must be
            ``None`` with ``splits/val.txt``. Defaults to ``None`` (0.1).
        test_fraction (float, optional): test share of all images in (0, 1), without ``splits/``
            only. Defaults to ``None`` (0.2).
        data_dir (str | os.PathLike, optional): the folder; required.
        download (bool, optional): must be ``False`` (nothing to download).
        imbalance_ratio (float, optional): must be ``None``.
        crop_size (int, optional): side S of the crops and evaluation canvases, >= 1. Defaults
            to ``None`` (:data:`DEFAULT_CROP_SIZE`, 512).
        verify (bool, optional): decode and check every mask now (:func:`verify_segmentation`).
            Defaults to ``False`` (masks are checked when read).

    Returns:
        DatasetSplits: :class:`SegmentationDataset` splits, ``task="segmentation"``,
        ``ignore_index=255``, K = the lines of ``classes.txt``.

    Raises:
        DatasetError: if `data_dir` is None or not a folder, ``images/``, ``masks/`` or
            ``classes.txt`` is missing, ``classes.txt`` has no or an empty line or more than 255
            classes, ``splits/`` lacks ``train.txt`` or ``test.txt``, a listed or found image
            has no mask, two files share a stem, the split files share a stem, a fraction is
            given where it does not apply, a split would be empty, `download` or
            `imbalance_ratio` is given, or (with `verify`, or when a sample is read) a mask is
            unreadable, has a value outside {0..K-1, 255} or another size than its image.
        ValueError: if `val_fraction` + `test_fraction` >= 1 or `crop_size` < 1.
    """
    name = "segfolder"
    if download:
        raise DatasetError(
            f"segfolder: there is nothing to download for a folder of your own"
            f"{'' if data_dir is None else f' ({data_dir})'}; drop --download"
        )
    _reject_unsupported(name, imbalance_ratio, verify)
    crop_size = _resolve_crop_size(crop_size)
    root = _require_dir(name, data_dir, SEGFOLDER_LAYOUT)
    classes = _read_classes(root / "classes.txt")
    images = _scan_files(root / "images", _IMAGE_EXTENSIONS)
    masks = _scan_files(root / "masks", (".png",))
    info: dict[str, Any] = {"data_dir": str(root)}
    splits_dir = root / "splits"
    if splits_dir.is_dir():
        layout = f"{splits_dir}/train.txt and test.txt (stems; val.txt optional)"
        if test_fraction is not None:
            raise DatasetError(
                f"segfolder: {splits_dir}/ gives the test split; `test_fraction` applies to "
                f"folders without splits/ (got test_fraction={test_fraction})"
            )
        stems = {
            part: _read_stems(name, splits_dir / f"{part}.txt", layout)
            for part in ("train", "test")
        }
        has_val = (splits_dir / "val.txt").is_file()
        if has_val:
            if val_fraction is not None:
                raise DatasetError(
                    f"segfolder: {splits_dir / 'val.txt'} gives the validation split; "
                    f"`val_fraction` applies without it (got val_fraction={val_fraction})"
                )
            stems["val"] = _read_stems(name, splits_dir / "val.txt", layout)
        for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
            shared = sorted(set(stems.get(a, ())) & set(stems.get(b, ())))
            if shared:
                raise DatasetError(
                    f"segfolder: {splits_dir}/{a}.txt and {b}.txt share {len(shared)} stems "
                    f"({', '.join(shared[:3])}); the splits must be disjoint"
                )
        pairs = {
            part: [_pair(s, images, masks, root, f"listed in {part}.txt") for s in listed]
            for part, listed in stems.items()
        }
        if has_val:
            info["val_split"] = str(splits_dir / "val.txt")
        else:
            fraction = OFFICIAL_VAL_FRACTION if val_fraction is None else float(val_fraction)
            train, val = _random_carve(
                name, len(pairs["train"]), fraction, seed, "validation", "splits/train.txt"
            )
            pairs["train"], pairs["val"] = (
                [pairs["train"][i] for i in train],
                [pairs["train"][i] for i in val],
            )
            info.update(
                val_split=(
                    f"random {_pct(fraction)} of splits/train.txt ({len(train) + len(val)} "
                    f"images), seed {seed}; not stratified"
                ),
                val_fraction=fraction,
            )
        info["test_split"] = str(splits_dir / "test.txt")
    else:
        val_fraction = IMAGEFOLDER_VAL_FRACTION if val_fraction is None else float(val_fraction)
        test_fraction = IMAGEFOLDER_TEST_FRACTION if test_fraction is None else float(test_fraction)
        check_fraction_sum(val_fraction, test_fraction)
        if not images:
            raise DatasetError(
                f"segfolder: {root / 'images'}/ holds no .jpg/.jpeg/.png image; expected "
                f"{SEGFOLDER_LAYOUT}"
            )
        everything = [_pair(s, images, masks, root, "found in images/") for s in sorted(images)]
        rest, test = _random_carve(name, len(everything), test_fraction, seed, "test", "images/")
        kept, val = _random_carve(
            name, len(rest), val_fraction / (1.0 - test_fraction), seed, "validation", "images/"
        )
        pairs = {
            "train": [everything[i] for i in rest[kept]],
            "val": [everything[i] for i in rest[val]],
            "test": [everything[i] for i in test],
        }
        info.update(
            val_split=(
                f"random {_pct(val_fraction)} val / {_pct(test_fraction)} test of all "
                f"{len(everything)} images, seed {seed}; not stratified"
            ),
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            test_split=f"random {_pct(test_fraction)} of all images, seed {seed}",
        )
    return _splits(name, pairs, classes=classes, crop_size=crop_size, info=info, verify=verify)
