"""Object annotations and box/mask-aware augmentation for objectness-adaptive label smoothing.

Adaptive label smoothing (:class:`raysearch.losses.objectness.ObjectnessLabelSmoothing`) needs,
for every training sample, the objectness of its augmented crop: the object area inside the
crop over the crop area, ``o in [0, 1]``. This module provides

- :class:`ObjectnessCrop`: torchvision-style ``RandomResizedCrop`` (output size = input size)
  plus an optional horizontal flip, applied TOGETHER to an image and its annotation (boxes or a
  mask), returning the objectness of the crop (defined, with :func:`rasterize_boxes`, in the
  leaf module :mod:`raysearch.training.data._crops` and re-exported here);
- :class:`ObjectnessDataset`: images + annotations + labels, yielding
  ``(x, y, objectness, context)`` with a fresh crop of every sample in every epoch (seeded by
  ``(seed, epoch, index)``, so it does not depend on the order of access or on earlier epochs);
- digits: :func:`ink_boxes` (the bounding box of the ink of each 8x8 image) and
  :func:`objectness_train_set`, which the training loop calls;
- folder loaders for two real annotation layouts, never downloading anything:
  :func:`load_pet_folder` (Oxford-IIIT Pet trimaps) and :func:`load_voc_folder` (Pascal VOC XML
  boxes).

Conventions. Boxes are ``(x1, y1, x2, y2)`` in pixels with x along the width, half-open: the
box ``(1, 0, 7, 8)`` covers columns 1..6 and rows 0..7. A pixel belongs to a box when its centre
``(c + 0.5, r + 0.5)`` lies inside it (exact for integer boxes). Masks are (H, W) bool.
"""

from __future__ import annotations

import warnings
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import TensorDataset
from torchvision.transforms.v2 import functional as TF

# The crop primitives live in the leaf module ``_crops``, shared with ``cub_objectness`` (which
# ``objectness_train_set`` imports for cub200); the public ones are part of this module's API.
from raysearch.training.data._crops import (
    CropResult,
    EpochCropDataset,
    ObjectnessCrop,
    _sample_seed,
    rasterize_boxes,
)

if TYPE_CHECKING:
    from raysearch.training.data import DatasetSplits

__all__ = [
    "DIGITS_CROP",
    "VOC_CLASSES",
    "AnnotatedImages",
    "CropResult",
    "ObjectnessCrop",
    "ObjectnessDataset",
    "ink_boxes",
    "load_pet_folder",
    "load_voc_folder",
    "objectness_train_set",
    "rasterize_boxes",
]

#: Crop settings for digits: scale (0.5, 1), torchvision's ratio, NO flip (a mirrored digit is
#: not the same digit: a flipped 3 reads as an epsilon, 2 and 5 swap looks).
DIGITS_CROP = {"scale": (0.5, 1.0), "ratio": (3.0 / 4.0, 4.0 / 3.0), "flip": False}

#: The 20 Pascal VOC classes in the order of the official devkit (index = label).
VOC_CLASSES = (
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)


class ObjectnessDataset(EpochCropDataset):
    """Annotated images yielding fresh augmented crops with their objectness every epoch.

    Item ``i`` of epoch ``e`` is ``(x, y, objectness, context)``: the crop of image i drawn by
    ``transform`` from a ``torch.Generator`` seeded with a fixed function of ``(seed, e, i)``, so
    the crops of an epoch do not depend on earlier epochs, on the order of access or on
    DataLoader workers (a resumed run sees the same crops). Set the epoch with
    :meth:`set_epoch` (items) or ask for a whole epoch with :meth:`epoch_tensors`.

    Context samples (the paper's "A. L. S. + Context"): with probability ``context_fraction``
    (drawn first from the sample's generator) the object is removed before cropping, its pixels
    (the mask, or the rasterised boxes) replaced by ``fill`` as the paper replaces objects by the
    pixel mean; such a sample has objectness 0 and ``context=True`` (the loss then trains it
    toward the uniform label).

    Args:
        images (Tensor): (N, C, H, W) float images (all of one size).
        labels (Tensor): (N,) int64 class labels.
        boxes (Tensor | Sequence[Tensor], optional): per image, (M_i, 4) xyxy object boxes in
            pixels (a list, or an (N, M, 4) tensor). Give boxes or masks.
        masks (Tensor, optional): (N, H, W) bool object masks.
        transform (ObjectnessCrop, optional): the augmentation. Defaults to ``ObjectnessCrop()``.
        seed (int, optional): seed of the crops, >= 0. Defaults to ``0``.
        context_fraction (float, optional): share of object-free context samples, in [0, 1).
            Defaults to ``0.0``.
        fill (float | Sequence[float], optional): value(s) per channel painted over the object
            of a context sample. Defaults to the per-channel mean of ``images``.

    Raises:
        ValueError: on mismatched lengths or shapes (quoted), neither or both of boxes and
            masks, ``seed`` < 0 or ``context_fraction`` outside [0, 1).
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        *,
        boxes: Tensor | Sequence[Tensor] | None = None,
        masks: Tensor | None = None,
        transform: ObjectnessCrop | None = None,
        seed: int = 0,
        context_fraction: float = 0.0,
        fill: float | Sequence[float] | None = None,
    ) -> None:
        if not isinstance(images, Tensor) or images.ndim != 4 or not images.is_floating_point():
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"`images` must be a float (N, C, H, W) tensor, got {shape}")
        labels = torch.as_tensor(labels)
        if tuple(labels.shape) != (len(images),):
            raise ValueError(
                f"`labels` must have shape ({len(images)},) for {len(images)} images, "
                f"got {tuple(labels.shape)}"
            )
        if (boxes is None) == (masks is None):
            raise ValueError("give exactly one of `boxes` and `masks`")
        if boxes is not None:
            boxes = [_check_boxes(b) for b in boxes]
            if len(boxes) != len(images):
                raise ValueError(f"`boxes` must hold {len(images)} entries, got {len(boxes)}")
        if masks is not None:
            masks = torch.as_tensor(masks)
            expected = (len(images), *images.shape[2:])
            if masks.dtype != torch.bool or tuple(masks.shape) != expected:
                raise ValueError(
                    f"`masks` must be a bool tensor of shape {expected}, "
                    f"got {masks.dtype} {tuple(masks.shape)}"
                )
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"`seed` must be an int >= 0, got {seed!r}")
        if not 0 <= context_fraction < 1:
            raise ValueError(f"`context_fraction` must be in [0, 1), got {context_fraction}")
        self.images = images
        self.labels = labels.to(torch.int64)
        self.boxes = boxes
        self.masks = masks
        self.transform = transform if transform is not None else ObjectnessCrop()
        self.seed = seed
        self.context_fraction = float(context_fraction)
        if fill is None:
            fill = images.mean(dim=(0, 2, 3))
        self.fill = torch.as_tensor(fill, dtype=images.dtype).reshape(-1, 1, 1)
        self.epoch = 1

    def __len__(self) -> int:
        return len(self.images)

    def sample(self, index: int, epoch: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Augment one sample for one epoch.

        Args:
            index (int): sample index in [0, N).
            epoch (int): epoch number (any int; ``fit`` counts from 1).

        Returns:
            tuple: x (C, H, W) float, y int64 scalar, objectness float32 scalar in [0, 1],
            context bool scalar.
        """
        generator = torch.Generator().manual_seed(_sample_seed(self.seed, epoch, index))
        is_context = torch.rand(1, generator=generator).item() < self.context_fraction
        image = self.images[index]
        if self.boxes is not None:
            annotation = {"boxes": self.boxes[index]}
        else:
            annotation = {"mask": self.masks[index]}
        if is_context:
            _, height, width = image.shape
            if self.boxes is not None:
                covered = rasterize_boxes(self.boxes[index], height, width)
                annotation = {"boxes": torch.zeros(0, 4)}
            else:
                covered = self.masks[index]
                annotation = {"mask": torch.zeros_like(covered)}
            image = torch.where(covered, self.fill, image)
        result = self.transform(image, generator=generator, **annotation)
        return (
            result.image,
            self.labels[index],
            torch.tensor(result.objectness, dtype=torch.float32),
            torch.tensor(is_context),
        )

    def epoch_tensors(self, epoch: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """All samples of one epoch, stacked.

        Args:
            epoch (int): epoch number.

        Returns:
            tuple: x (N, C, H, W), y (N,) int64, objectness (N,) float32, context (N,) bool.
        """
        items = [self.sample(i, epoch) for i in range(len(self))]
        xs, ys, objectness, context = zip(*items, strict=True)
        return torch.stack(xs), torch.stack(ys), torch.stack(objectness), torch.stack(context)


def ink_boxes(images: Tensor | np.ndarray, *, background: float | None = None) -> Tensor:
    """Bounding box of the ink (the pixels that differ from the background) of every image.

    For scikit-learn's digits the background is the pixel value 0; after the standardisation of
    :func:`raysearch.training.data.load_dataset` it is ``(0 - mean) / std``, which is still the
    smallest value of every image (every digit has blank pixels), hence the default.

    Args:
        images (Tensor | np.ndarray): (N, H, W) or (N, C, H, W) images.
        background (float, optional): the background value. Defaults to the minimum of each
            image (over its pixels and channels).

    Returns:
        Tensor: (N, 4) float32 xyxy boxes ``(c_min, r_min, c_max + 1, r_max + 1)``; an image
        without ink gets the empty box ``(0, 0, 0, 0)``.

    Raises:
        ValueError: if ``images`` is not 3- or 4-dimensional.
    """
    images = torch.as_tensor(images)
    if images.ndim == 3:
        images = images.unsqueeze(1)
    if images.ndim != 4:
        raise ValueError(f"`images` must be (N, H, W) or (N, C, H, W), got {tuple(images.shape)}")
    if background is None:
        floor = images.amin(dim=(1, 2, 3), keepdim=True)
    else:
        floor = torch.full_like(images[:, :1, :1, :1], float(background))
    ink = (images != floor).any(dim=1)  # (N, H, W)
    boxes = torch.zeros(len(images), 4)
    for n, pixels in enumerate(ink):
        rows = torch.nonzero(pixels.any(dim=1)).flatten()
        cols = torch.nonzero(pixels.any(dim=0)).flatten()
        if len(rows):
            boxes[n] = torch.tensor([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1])
    return boxes


def objectness_train_set(
    splits: DatasetSplits,
    *,
    seed: int,
    context_fraction: float = 0.0,
    transform: ObjectnessCrop | None = None,
) -> ObjectnessDataset:
    """The augmented training set (with objectness) of a dataset, for the training loop.

    - If ``splits.train`` already is an :class:`ObjectnessDataset` (e.g. built with
      :meth:`AnnotatedImages.to_dataset` from Pet or VOC), it is returned unchanged: its own
      transform, seed and context fraction apply.
    - For ``digits`` the object of each image is its ink box (:func:`ink_boxes`) and the crop is
      :data:`DIGITS_CROP` (scale (0.5, 1), no flip) unless ``transform`` is given.

    Args:
        splits (DatasetSplits): the dataset splits.
        seed (int): seed of the crops.
        context_fraction (float, optional): share of object-free context samples, in [0, 1).
            Defaults to ``0.0``.
        transform (ObjectnessCrop, optional): the augmentation. Defaults to the dataset's.

    Returns:
        ObjectnessDataset: yields ``(x, y, objectness, context)``.

    Raises:
        ValueError: if the dataset has no object annotations (not digits, and its training split
            is not an :class:`ObjectnessDataset`).
    """
    if isinstance(splits.train, ObjectnessDataset):
        if splits.train.context_fraction != context_fraction:
            warnings.warn(
                f"the training set's context_fraction={splits.train.context_fraction:g} is "
                f"used, not the requested {context_fraction:g}",
                stacklevel=2,
            )
        return splits.train
    if splits.name == "digits" and isinstance(splits.train, TensorDataset):
        images, labels = splits.train.tensors[0], splits.train.tensors[1]
        return ObjectnessDataset(
            images,
            labels,
            boxes=ink_boxes(images).unsqueeze(1),
            transform=transform if transform is not None else ObjectnessCrop(**DIGITS_CROP),
            seed=seed,
            context_fraction=context_fraction,
        )
    if splits.name == "cub200":  # file-backed crops with the boxes of bounding_boxes.txt
        from raysearch.training.data.cub_objectness import cub_objectness_dataset

        if transform is not None:
            raise ValueError("cub200 uses MbLS's fixed-size random crop; `transform` must be None")
        return cub_objectness_dataset(splits, seed=seed, context_fraction=context_fraction)
    raise ValueError(
        f"dataset {splits.name!r} has no object annotations for objectness training: use "
        "'digits', or pass data=DatasetSplits(train=ObjectnessDataset(...), ...) "
        "(see raysearch.training.data.objectness.load_pet_folder / load_voc_folder)"
    )


@dataclass
class AnnotatedImages:
    """Images with object annotations and labels, as read by the folder loaders.

    Attributes:
        images: per image, (3, H_i, W_i) float32 RGB in [0, 1].
        labels: (N,) int64 class indices into ``classes``.
        classes: class names, index = label.
        names: file stems, in the order of ``images``.
        masks: per image, (H_i, W_i) bool object mask (Pet), or None.
        boxes: per image, (M_i, 4) float32 xyxy object boxes in pixels (VOC), or None.
    """

    images: list[Tensor]
    labels: Tensor
    classes: list[str]
    names: list[str]
    masks: list[Tensor] | None = None
    boxes: list[Tensor] | None = None

    def __len__(self) -> int:
        return len(self.images)

    def to_dataset(
        self,
        *,
        transform: ObjectnessCrop | None = None,
        seed: int = 0,
        context_fraction: float = 0.0,
    ) -> ObjectnessDataset:
        """Stack into an :class:`ObjectnessDataset` (load with ``size=`` so all images match).

        Args:
            transform (ObjectnessCrop, optional): the augmentation. Defaults to
                ``ObjectnessCrop()``.
            seed (int, optional): seed of the crops. Defaults to ``0``.
            context_fraction (float, optional): share of context samples. Defaults to ``0.0``.

        Returns:
            ObjectnessDataset: the images (unnormalised, in [0, 1]) with their annotations.

        Raises:
            ValueError: if the images differ in size (both sizes quoted).
        """
        sizes = {tuple(image.shape) for image in self.images}
        if len(sizes) > 1:
            raise ValueError(
                f"images differ in size ({sorted(sizes)[:2]}); load them with size=(H, W)"
            )
        masks = None if self.masks is None else torch.stack(self.masks)
        return ObjectnessDataset(
            torch.stack(self.images),
            self.labels,
            boxes=self.boxes,
            masks=masks,
            transform=transform,
            seed=seed,
            context_fraction=context_fraction,
        )


def load_pet_folder(root: str | Path, *, size: tuple[int, int] | None = None) -> AnnotatedImages:
    """Read the Oxford-IIIT Pet layout: ``images/*.jpg`` + ``annotations/trimaps/*.png``.

    Each trimap pixel is 1 (foreground, the pet), 2 (background) or 3 (not classified: the
    boundary band around the pet). The object mask is ``trimap in {1, 3}``: the boundary band is
    part of the animal's outline, so it counts as object (with it the mask covers the whole pet;
    without it a thin rim of the pet would count as background).

    The class of an image is its file-name prefix, the breed: ``american_bulldog_10.jpg`` is
    ``american_bulldog`` (everything before the last ``_``). Classes are the breeds present,
    sorted case-insensitively, which is the order of the dataset's CLASS-IDs in ``list.txt``
    (0-based here) when all 37 breeds are present. Nothing is downloaded.

    Args:
        root (str | Path): folder holding ``images/`` and ``annotations/trimaps/``.
        size (tuple[int, int], optional): resize every image (bilinear, antialiased) and mask
            (nearest-exact) to (H, W). Defaults to ``None`` (original sizes).

    Returns:
        AnnotatedImages: images, ``masks``, labels, classes, names (sorted by file name).

    Raises:
        FileNotFoundError: if a folder is missing, it has no ``*.jpg``, or an image has no
            trimap (the path is quoted).
        ValueError: if a trimap's size differs from its image's or it holds values other than
            1, 2 and 3.
    """
    root = Path(root)
    image_dir, trimap_dir = root / "images", root / "annotations" / "trimaps"
    paths = _list_files("Oxford-IIIT Pet", (image_dir, trimap_dir), "*.jpg", "images")
    breeds = [path.stem.rsplit("_", 1)[0] for path in paths]
    classes = sorted(set(breeds), key=lambda name: (name.lower(), name))
    index = {name: k for k, name in enumerate(classes)}
    images, masks = [], []
    for path in paths:
        trimap_path = trimap_dir / f"{path.stem}.png"
        if not trimap_path.is_file():
            raise FileNotFoundError(f"no trimap for {path.name}: {trimap_path}")
        image = _read_rgb(path)
        trimap = torch.from_numpy(np.array(_open_image(trimap_path)).astype(np.int64))
        if trimap.ndim != 2 or tuple(trimap.shape) != tuple(image.shape[1:]):
            raise ValueError(
                f"{trimap_path}: trimap shape {tuple(trimap.shape)} does not match the image "
                f"{tuple(image.shape[1:])}"
            )
        unexpected = sorted(set(torch.unique(trimap).tolist()) - {1, 2, 3})
        if unexpected:
            raise ValueError(f"{trimap_path}: trimap values must be 1, 2 or 3, got {unexpected}")
        mask = (trimap == 1) | (trimap == 3)
        if size is not None:
            image, mask = _resize_image(image, size), _resize_mask(mask, size)
        images.append(image)
        masks.append(mask)
    labels = torch.tensor([index[breed] for breed in breeds], dtype=torch.int64)
    names = [path.stem for path in paths]
    return AnnotatedImages(images, labels, classes, names, masks=masks)


def load_voc_folder(
    root: str | Path,
    *,
    size: tuple[int, int] | None = None,
    classes: Sequence[str] = VOC_CLASSES,
) -> AnnotatedImages:
    """Read the Pascal VOC layout: ``Annotations/*.xml`` + ``JPEGImages/*.jpg``.

    Every ``<object>`` has a ``<name>`` and a ``<bndbox>`` with ``xmin``, ``ymin``, ``xmax``,
    ``ymax``: 1-based, inclusive pixel indices, converted to half-open 0-based pixel boxes
    ``(xmin - 1, ymin - 1, xmax, ymax)``. The label of an image is the class of its LARGEST box
    (by area; ties go to the first in the file); its object annotation is the boxes of THAT class
    (all its instances, ``difficult`` and ``truncated`` included): the objectness measures the
    labelled class, not the other classes in the scene. The image is ``JPEGImages/<filename>``
    from the XML's ``<filename>`` (``<stem>.jpg`` if absent). Nothing is downloaded.

    Args:
        root (str | Path): folder holding ``Annotations/`` and ``JPEGImages/``.
        size (tuple[int, int], optional): resize every image (bilinear, antialiased) to (H, W)
            and scale its boxes. Defaults to ``None`` (original sizes).
        classes (Sequence[str], optional): class names, index = label. Defaults to the 20
            :data:`VOC_CLASSES`.

    Returns:
        AnnotatedImages: images, ``boxes``, labels, classes, names (sorted by XML file name).

    Raises:
        FileNotFoundError: if a folder or an image is missing, or there is no ``*.xml``.
        ValueError: if an XML file has no object, an unknown class or a malformed box (the file
            is named).
    """
    root = Path(root)
    xml_dir, image_dir = root / "Annotations", root / "JPEGImages"
    xml_paths = _list_files("Pascal VOC", (xml_dir, image_dir), "*.xml", "annotations")
    index = {name: k for k, name in enumerate(classes)}
    images, all_boxes, labels, names = [], [], [], []
    for xml_path in xml_paths:
        names_and_boxes, filename = _parse_voc_xml(xml_path, index)
        image_path = image_dir / (filename or f"{xml_path.stem}.jpg")
        if not image_path.is_file():
            raise FileNotFoundError(f"{xml_path}: image not found: {image_path}")
        image = _read_rgb(image_path)
        areas = [(b[2] - b[0]) * (b[3] - b[1]) for _, b in names_and_boxes]
        label = names_and_boxes[int(np.argmax(areas))][0]
        boxes = torch.tensor([b for name, b in names_and_boxes if name == label])
        if size is not None:
            _, height, width = image.shape
            scale = torch.tensor([size[1] / width, size[0] / height] * 2)
            image, boxes = _resize_image(image, size), boxes * scale
        images.append(image)
        all_boxes.append(boxes.to(torch.float32))
        labels.append(index[label])
        names.append(xml_path.stem)
    return AnnotatedImages(
        images,
        torch.tensor(labels, dtype=torch.int64),
        list(classes),
        names,
        boxes=all_boxes,
    )


def _parse_voc_xml(
    path: Path, index: dict[str, int]
) -> tuple[list[tuple[str, list[float]]], str | None]:
    """``([(class, [x1, y1, x2, y2]), ...], filename)`` of one VOC annotation file."""
    try:
        tree = ET.parse(path)
    except ET.ParseError as exc:
        raise ValueError(f"{path}: malformed XML ({exc})") from None
    objects = []
    for obj in tree.getroot().iter("object"):
        name = (obj.findtext("name") or "").strip()
        if name not in index:
            raise ValueError(f"{path}: unknown class {name!r}; known: {', '.join(index)}")
        bndbox = obj.find("bndbox")
        try:
            xmin, ymin, xmax, ymax = (
                float(bndbox.findtext(tag)) for tag in ("xmin", "ymin", "xmax", "ymax")
            )
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"{path}: object {name!r} has a malformed <bndbox>") from None
        if xmax < xmin or ymax < ymin:
            raise ValueError(
                f"{path}: object {name!r} has xmax < xmin or ymax < ymin "
                f"({xmin}, {ymin}, {xmax}, {ymax})"
            )
        objects.append((name, [xmin - 1.0, ymin - 1.0, xmax, ymax]))
    if not objects:
        raise ValueError(f"{path}: no <object> annotation")
    filename = tree.getroot().findtext("filename")
    return objects, filename.strip() if filename else None


def _list_files(dataset: str, folders: tuple[Path, ...], pattern: str, what: str) -> list[Path]:
    """Sorted files of ``folders[0]`` matching `pattern`, after checking every folder exists.

    Raises:
        FileNotFoundError: if a folder is missing or ``folders[0]`` has no file matching
            `pattern`.
    """
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"{dataset} folder not found: {folder}")
    paths = sorted(folders[0].glob(pattern))
    if not paths:
        raise FileNotFoundError(f"no {pattern} {what} in {folders[0]}")
    return paths


def _open_image(path: Path) -> Image.Image:
    with Image.open(path) as image:
        image.load()
        return image


def _read_rgb(path: Path) -> Tensor:
    """(3, H, W) float32 in [0, 1]; grey-scale, palette and RGBA files are converted to RGB."""
    pixels = np.array(_open_image(path).convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def _resize_image(image: Tensor, size: tuple[int, int]) -> Tensor:
    return TF.resize(image, list(size), antialias=True)


def _resize_mask(mask: Tensor, size: tuple[int, int]) -> Tensor:
    resized = TF.resize(
        mask.to(torch.uint8).unsqueeze(0),
        list(size),
        interpolation=TF.InterpolationMode.NEAREST_EXACT,
    )
    return resized[0].bool()


def _check_boxes(boxes: Tensor) -> Tensor:
    boxes = torch.as_tensor(boxes, dtype=torch.float32)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        if boxes.numel() == 0:
            return boxes.reshape(0, 4)
        raise ValueError(f"`boxes` must have shape (M, 4), got {tuple(boxes.shape)}")
    if bool(((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])).any()):
        raise ValueError(f"`boxes` must be xyxy with x1 <= x2 and y1 <= y2, got {boxes.tolist()}")
    return boxes
