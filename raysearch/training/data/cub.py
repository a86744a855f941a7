"""CUB-200-2011 (Caltech-UCSD Birds) from its official on-disk layout, with its bounding boxes.

MbLS (Liu et al., CVPR 2022, Table 3) fine-tunes an ImageNet-pretrained ResNet-101 on CUB. This
module reads the extracted ``CUB_200_2011.tgz`` (never downloading it), splits it, and serves its
images lazily from disk (11,788 JPEGs are not held in memory):

- :func:`load_cub200`: the registry loader (``load_dataset("cub200", ...)``), returning
  :class:`CUBImageDataset` splits whose items are ``(x float32 (3, 224, 224), y int)``;
- :func:`cub_transforms`: MbLS's CUB pipelines;
- :mod:`~raysearch.training.data.cub_objectness`: the training split with the objectness of every
  augmented crop (for the objectness-adaptive label smoothing ``als``).

Layout. ``data_dir`` is the folder holding ``CUB_200_2011/`` or that folder itself::

    CUB_200_2011/
        images/<class folder>/<file>.jpg
        images.txt               <image_id> <path relative to images/>
        image_class_labels.txt   <image_id> <class_id in 1..K>
        train_test_split.txt     <image_id> <1: train | 0: test>
        classes.txt              <class_id> <name>
        bounding_boxes.txt       <image_id> <x> <y> <width> <height>   (floats, pixels)

Splits. The official test split (``is_training_image == 0``, 5,794 images) is the TEST split.
CUB has no validation split and MbLS selected its models on the test split; here validation is
a stratified share (`val_fraction`, default 0.1) of the official training split (5,994 images),
``random_state=seed``, so model selection never sees test.

Transforms (MbLS's released ``calibrate/data/cub.py``, albumentations): training
``Resize(256, 256)`` (both sides: the aspect ratio is NOT kept) -> ``RandomCrop(224)`` ->
``HorizontalFlip`` -> ``Normalize`` (ImageNet mean/std); evaluation ``Resize(256, 256)`` ->
``CenterCrop(224)`` -> ``Normalize``. ``resize="shorter"`` resizes the shorter side to 256
instead (torchvision's ``Resize(256)``, aspect ratio kept). Both are built from
``torchvision.transforms.v2`` (bilinear, antialiased; MbLS's cv2 resize is not antialiased).

Boxes. ``bounding_boxes.txt`` gives ``(x, y, width, height)`` of the bird in the ORIGINAL image's
pixels; they are stored as half-open xyxy ``(x, y, x + width, y + height)`` (the convention of
:mod:`raysearch.training.data.objectness`: a pixel ``(r, c)`` is inside when its centre
``(c + 0.5, r + 0.5)`` is).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchvision.transforms import v2

from raysearch.training.data.images import IMAGENET_MEAN, IMAGENET_STD, ImageFileDataset
from raysearch.training.data.splits import (
    OFFICIAL_VAL_FRACTION,
    DatasetError,
    DatasetSplits,
    carve_validation,
    reject_test_fraction,
)

__all__ = [
    "CROP_SIZE",
    "CUB_FOLDER",
    "CUB_URL",
    "RESIZE_MODES",
    "CUBImageDataset",
    "cub_transforms",
    "load_cub200",
]

logger = logging.getLogger(__name__)

#: Official download page of CUB-200-2011 (``CUB_200_2011.tgz``).
CUB_URL = "https://data.caltech.edu/records/65de6-vhp84"
#: Name of the folder inside the official archive.
CUB_FOLDER = "CUB_200_2011"
#: Side of the square crops (train and eval), in pixels.
CROP_SIZE = 224
#: ``"square"``: resize both sides to 256 (MbLS's released code); ``"shorter"``: the shorter side.
RESIZE_MODES = ("square", "shorter")

_NAME = "cub200"
_FILES = (
    "images.txt",
    "image_class_labels.txt",
    "train_test_split.txt",
    "classes.txt",
    "bounding_boxes.txt",
)
_LAYOUT = (
    f"expected {CUB_FOLDER}/ (or the folder above it) with images/<class folder>/<file>.jpg, "
    "images.txt (<image_id> <path>), image_class_labels.txt (<image_id> <class_id>), "
    "train_test_split.txt (<image_id> <1|0>), classes.txt (<class_id> <name>) and "
    "bounding_boxes.txt (<image_id> <x> <y> <width> <height>), as extracted from "
    f"CUB_200_2011.tgz ({CUB_URL})"
)


# --------------------------------------------------------------------------------------------
# transforms


def _scale_size(image_size: int) -> int:
    """Side the image is resized to before the crop: 256 for 224 (``round(size / 0.875)``)."""
    return round(image_size / 0.875)


def _check_size(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1, got {value!r}")
    return value


def _check_resize(resize: str) -> str:
    if resize not in RESIZE_MODES:
        raise ValueError(f"`resize` must be one of {', '.join(RESIZE_MODES)}, got {resize!r}")
    return resize


def _resize_size(image_size: int, resize: str) -> list[int]:
    scale = _scale_size(image_size)
    return [scale, scale] if resize == "square" else [scale]


def cub_transforms(
    image_size: int = CROP_SIZE, *, train: bool, resize: str = "square"
) -> v2.Transform:
    """MbLS's CUB pipelines on a PIL image, ending in an ImageNet-normalised float32 (3, S, S).

    Train: ``Resize`` -> ``RandomCrop(image_size)`` -> ``RandomHorizontalFlip()``; eval:
    ``Resize`` -> ``CenterCrop(image_size)``. The resize goes to ``round(image_size / 0.875)``
    (256 for 224): both sides with ``resize="square"`` (MbLS's ``A.Resize(256, 256)``), the
    shorter side with ``resize="shorter"``. Random draws use the global torch RNG.

    Args:
        image_size (int, optional): output side S in pixels, >= 1. Defaults to ``224``.
        train (bool): the training pipeline (random) or the evaluation pipeline (deterministic).
        resize (str, optional): ``"square"`` or ``"shorter"``. Defaults to ``"square"``.

    Returns:
        v2.Transform: a ``v2.Compose``.

    Raises:
        ValueError: if `image_size` < 1 or `resize` is unknown.
    """
    image_size = _check_size("image_size", image_size)
    size = _resize_size(image_size, _check_resize(resize))
    if train:
        geometry = [v2.RandomCrop(image_size), v2.RandomHorizontalFlip()]
    else:
        geometry = [v2.CenterCrop(image_size)]
    return v2.Compose(
        [
            v2.ToImage(),
            v2.Resize(size, antialias=True),
            *geometry,
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD)),
        ]
    )


def _describe(image_size: int, resize: str) -> str:
    scale = _scale_size(image_size)
    step = (
        f"Resize(({scale}, {scale}))" if resize == "square" else f"Resize({scale}) (shorter side)"
    )
    return (
        f"train: {step} + RandomCrop({image_size}) + RandomHorizontalFlip; "
        f"eval: {step} + CenterCrop({image_size}); ImageNet mean/std"
    )


# --------------------------------------------------------------------------------------------
# datasets


def _as_boxes(boxes: np.ndarray | Tensor | Sequence, n: int) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float32)
    if boxes.shape != (n, 4):
        raise ValueError(f"`boxes` must have shape ({n}, 4), got {boxes.shape}")
    if ((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])).any():
        raise ValueError("`boxes` must be xyxy with x1 <= x2 and y1 <= y2")
    return boxes


class CUBImageDataset(ImageFileDataset):
    """CUB images read from files per sample, with the bird's box of every image.

    Items are those of :class:`~raysearch.training.data.images.ImageFileDataset`: ``(x, y)`` with x
    the transformed image (float32 (3, S, S)) and y the int label.

    Args:
        samples (Sequence[tuple[str, int]]): ``(path, label)`` pairs.
        transform (Callable): PIL image -> float32 (C, H, W) tensor (see :func:`cub_transforms`).
        boxes (np.ndarray | Tensor): (N, 4) xyxy box of each sample, in the original image's
            pixels.
        image_ids (Sequence[int], optional): CUB image id of each sample. Defaults to
            ``1..N``.
        image_size (int, optional): crop side S of `transform`. Defaults to ``224``.
        resize (str, optional): resize mode of `transform` (:data:`RESIZE_MODES`). Defaults
            to ``"square"``.

    Attributes:
        samples (list[tuple[str, int]]): the ``(path, label)`` pairs.
        transform (Callable): the transform.
        boxes (np.ndarray): float32 (N, 4) xyxy boxes in the original images' pixels.
        image_ids (np.ndarray): int64 (N,) CUB image ids.
        image_size (int): crop side S.
        resize (str): resize mode.

    Raises:
        TypeError: if `transform` is not callable.
        ValueError: if `boxes` is not (N, 4) xyxy or `image_ids` does not have N entries.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        transform: Callable,
        *,
        boxes: np.ndarray | Tensor,
        image_ids: Sequence[int] | np.ndarray | None = None,
        image_size: int = CROP_SIZE,
        resize: str = "square",
    ) -> None:
        super().__init__(samples, transform)
        n = len(self.samples)
        self.boxes = _as_boxes(boxes, n)
        ids = np.arange(1, n + 1) if image_ids is None else np.asarray(image_ids)
        if ids.shape != (n,):
            raise ValueError(f"`image_ids` must have shape ({n},), got {ids.shape}")
        self.image_ids = ids.astype(np.int64)
        self.image_size = _check_size("image_size", image_size)
        self.resize = _check_resize(resize)

    def subset(self, index: Sequence[int] | np.ndarray) -> CUBImageDataset:
        """The samples at `index` with their boxes and ids, and the same transform."""
        return self.with_transform(self.transform, index)

    def with_transform(
        self, transform: Callable, index: Sequence[int] | np.ndarray | None = None
    ) -> CUBImageDataset:
        """The same samples (or those at `index`) with another transform."""
        ix = np.arange(len(self)) if index is None else np.asarray(index, dtype=np.int64)
        ix = ix.reshape(-1)
        return CUBImageDataset(
            [self.samples[int(i)] for i in ix],
            transform,
            boxes=self.boxes[ix],
            image_ids=self.image_ids[ix],
            image_size=self.image_size,
            resize=self.resize,
        )

    def __repr__(self) -> str:
        return f"CUBImageDataset(n={len(self)}, resize={self.resize!r}, transform={self.transform})"


# --------------------------------------------------------------------------------------------
# loader


def _error(message: str) -> DatasetError:
    return DatasetError(f"{_NAME}: {message}")


def _text(value: str) -> str:
    if not value:
        raise ValueError("empty")
    return value


def _flag(value: str) -> int:
    flag = int(value)
    if flag not in (0, 1):
        raise ValueError(f"not 0 or 1: {flag}")
    return flag


def _box(value: str) -> tuple[float, float, float, float]:
    x, y, w, h = (float(v) for v in value.split())
    if not all(math.isfinite(v) for v in (x, y, w, h)) or w < 0 or h < 0:
        raise ValueError("not finite, or a negative width/height")
    return x, y, x + w, y + h


def _read_table(path: Path, fields: str, parse: Callable[[str], Any]) -> dict[int, Any]:
    """``{id: parse(rest of line)}`` of a CUB ``<id> <value...>`` text file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise _error(f"cannot read {path} ({type(err).__name__}: {err}); {_LAYOUT}") from err
    table: dict[int, Any] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        parts = line.split(maxsplit=1)
        try:
            key = int(parts[0])
            value = parse(parts[1].strip() if len(parts) > 1 else "")
        except ValueError as err:
            raise _error(
                f"{path} line {number} is malformed ({line[:80]!r}: {err}); expected '{fields}'"
            ) from err
        if key in table:
            raise _error(f"{path} lists id {key} twice (line {number}); the file is corrupt")
        table[key] = value
    if not table:
        raise _error(f"{path} is empty; expected lines '{fields}'")
    return table


def _check_ids(path: Path, ids: set[int], images_txt: Path, expected: set[int]) -> None:
    if ids == expected:
        return
    missing, extra = sorted(expected - ids), sorted(ids - expected)
    raise _error(
        f"{path} does not list the image ids of {images_txt}: {len(missing)} missing "
        f"(e.g. {missing[:3]}), {len(extra)} not in images.txt (e.g. {extra[:3]}); {_LAYOUT}"
    )


def _find_folder(data_dir: str | os.PathLike | None) -> Path:
    """The ``CUB_200_2011`` folder: `data_dir` itself or its ``CUB_200_2011/``."""
    if data_dir is None:
        raise _error(f"`--data-dir` is required ({_LAYOUT})")
    root = Path(data_dir).expanduser().absolute()
    if not root.is_dir():
        raise _error(f"{root}/ is not a folder; {_LAYOUT}")
    if (root / CUB_FOLDER).is_dir():
        return root / CUB_FOLDER
    if root.name == CUB_FOLDER or (root / "images.txt").is_file() or (root / "images").is_dir():
        return root
    raise _error(f"{root}/ holds neither {CUB_FOLDER}/ nor images.txt; {_LAYOUT}")


def _read_cub(folder: Path) -> dict[str, Any]:
    """Parse and cross-check the CUB text files; check that every listed image exists."""
    missing = [name for name in _FILES if not (folder / name).is_file()]
    if not (folder / "images").is_dir():
        missing.append("images/")
    if missing:
        raise _error(f"{folder}/ is incomplete: missing {', '.join(missing)}; {_LAYOUT}")
    images_txt = folder / "images.txt"
    paths = _read_table(images_txt, "<image_id> <relative path>", _text)
    labels = _read_table(folder / "image_class_labels.txt", "<image_id> <class_id>", int)
    split = _read_table(folder / "train_test_split.txt", "<image_id> <1 | 0>", _flag)
    classes = _read_table(folder / "classes.txt", "<class_id> <name>", _text)
    boxes = _read_table(folder / "bounding_boxes.txt", "<image_id> <x> <y> <width> <height>", _box)
    k = len(classes)
    if sorted(classes) != list(range(1, k + 1)):
        raise _error(
            f"{folder / 'classes.txt'} must number its classes 1..{k}, got ids "
            f"{sorted(classes)[:5]}...; the file is corrupt"
        )
    expected = set(paths)
    for name, table in (
        ("image_class_labels.txt", labels),
        ("train_test_split.txt", split),
        ("bounding_boxes.txt", boxes),
    ):
        _check_ids(folder / name, set(table), images_txt, expected)
    bad = sorted(i for i, c in labels.items() if not 1 <= c <= k)
    if bad:
        raise _error(
            f"{folder / 'image_class_labels.txt'} has class ids outside 1..{k} (the classes of "
            f"classes.txt) for image ids {bad[:3]}; the file is corrupt"
        )
    ids = sorted(paths)
    image_dir = folder / "images"
    files = [image_dir / paths[i] for i in ids]
    absent = [(i, f) for i, f in zip(ids, files, strict=True) if not f.is_file()]
    if absent:
        first_id, first = absent[0]
        raise _error(
            f"image {first} (id {first_id} in {images_txt}) is missing ({len(absent)} of "
            f"{len(ids)} listed images missing); {_LAYOUT}"
        )
    return {
        "ids": np.array(ids, dtype=np.int64),
        "files": [str(f) for f in files],
        "labels": np.array([labels[i] - 1 for i in ids], dtype=np.int64),
        "train": np.array([split[i] == 1 for i in ids], dtype=bool),
        "boxes": np.array([boxes[i] for i in ids], dtype=np.float32).reshape(-1, 4),
        "classes": [classes[c] for c in range(1, k + 1)],
    }


def load_cub200(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
    image_size: int = CROP_SIZE,
    resize: str = "square",
) -> DatasetSplits:
    """CUB-200-2011 from its official layout: official test split, validation carved from train.

    Test is the official test split (``train_test_split.txt`` 0). Validation is `val_fraction`
    (default 0.1) of the official training split, stratified by class with
    ``random_state=seed``; MbLS selected on test, raysearch never does. Images are listed and
    checked for presence here and read per sample (:class:`CUBImageDataset`); samples are in
    image-id order. Labels are ``class_id - 1``; class names are those of ``classes.txt``
    (e.g. ``"001.Black_footed_Albatross"``). Transforms: :func:`cub_transforms` (train
    augmented, val/test deterministic). Every split carries its boxes (``.boxes``, float32
    (N, 4) xyxy in original pixels);
    :func:`~raysearch.training.data.cub_objectness.cub_objectness_dataset` turns the training split
    into crops with their objectness.

    Args:
        seed (int): seed of the validation carve.
        val_fraction (float, optional): share of the official training split held out for
            validation, in (0, 1). Defaults to ``None`` (0.1).
        test_fraction (float, optional): must be ``None`` (CUB has its own test split).
        data_dir (str | os.PathLike, optional): the folder holding ``CUB_200_2011/``, or that
            folder itself; required.
        download (bool, optional): must be ``False``: raysearch does not download CUB.
        imbalance_ratio (float, optional): must be ``None`` (no long-tailed CUB).
        image_size (int, optional): crop side S, >= 1; images are resized to
            ``round(S / 0.875)`` first. Defaults to ``224``.
        resize (str, optional): ``"square"`` (both sides, MbLS's released code) or
            ``"shorter"`` (shorter side, aspect ratio kept). Defaults to ``"square"``.

    Returns:
        DatasetSplits: ``name="cub200"``, ``input_shape=(3, S, S)``, ``num_classes`` = the
        classes of ``classes.txt`` (200), ``class_names``, and ``info`` with ``train_size``,
        ``val_size``, ``test_size``, ``val_split``, ``val_fraction``, ``test_split``,
        ``data_dir`` (the ``CUB_200_2011`` folder), ``num_boxes``, ``resize``, ``transform``.

    Raises:
        DatasetError: (one line, naming the path and the expected layout) if `download` is
            set, `imbalance_ratio` or `test_fraction` is given, `data_dir` is None or not a
            folder, a file or ``images/`` is missing, a line is malformed, the ids of the files
            disagree, a class id is outside ``classes.txt``, a listed image is missing, or a
            class is too small to stratify.
        ValueError: if `image_size` < 1 or `resize` is unknown.
    """
    _reject_options(download, imbalance_ratio, test_fraction)
    image_size = _check_size("image_size", image_size)
    resize = _check_resize(resize)
    folder = _find_folder(data_dir)
    cub = _read_cub(folder)
    val_fraction = OFFICIAL_VAL_FRACTION if val_fraction is None else float(val_fraction)
    pool = np.flatnonzero(cub["train"])
    test = np.flatnonzero(~cub["train"])
    if len(pool) == 0 or len(test) == 0:
        raise _error(
            f"{folder / 'train_test_split.txt'} marks {len(pool)} training and {len(test)} "
            "test images; both splits need images"
        )
    train, val = carve_validation(_NAME, cub["labels"], pool, val_fraction=val_fraction, seed=seed)
    splits = _cub_splits(cub, (train, val, test), image_size, resize)
    pct = f"{100 * val_fraction:g}%"
    splits.info = {
        "train_size": len(train),
        "val_size": len(val),
        "test_size": len(test),
        "val_split": (
            f"stratified {pct} of the official training split (train_test_split.txt 1), "
            f"seed {seed}; MbLS selected on test; raysearch carves validation from train"
        ),
        "val_fraction": val_fraction,
        "test_split": "the official test split (train_test_split.txt 0)",
        "data_dir": str(folder),
        "num_boxes": len(cub["boxes"]),
        "resize": resize,
        "transform": _describe(image_size, resize),
    }
    logger.debug("cub200: %s", splits.info)
    return splits


def _reject_options(
    download: bool, imbalance_ratio: float | None, test_fraction: float | None
) -> None:
    """Refuse the loader options CUB has no use for (one-line DatasetError each)."""
    if download:
        raise _error(
            "raysearch does not download CUB-200-2011: download CUB_200_2011.tgz from "
            f"{CUB_URL}, extract it and pass its folder as --data-dir (without --download); "
            f"{_LAYOUT}"
        )
    if imbalance_ratio is not None:
        raise _error(
            f"a long-tailed CUB-200-2011 is not supported (got imbalance_ratio="
            f"{imbalance_ratio}); drop imbalance_ratio"
        )
    reject_test_fraction(_NAME, test_fraction)


def _cub_splits(
    cub: dict[str, Any], parts: tuple[np.ndarray, np.ndarray, np.ndarray], image_size: int,
    resize: str,
) -> DatasetSplits:
    """The (train, val, test) index arrays of `cub` (:func:`_read_cub`) as CUBImageDatasets."""
    samples = list(zip(cub["files"], cub["labels"].tolist(), strict=True))

    def part(index: np.ndarray, training: bool) -> CUBImageDataset:
        return CUBImageDataset(
            [samples[i] for i in index],
            cub_transforms(image_size, train=training, resize=resize),
            boxes=cub["boxes"][index],
            image_ids=cub["ids"][index],
            image_size=image_size,
            resize=resize,
        )

    train, val, test = parts
    return DatasetSplits(
        train=part(train, True),
        val=part(val, False),
        test=part(test, False),
        num_classes=len(cub["classes"]),
        input_shape=(3, image_size, image_size),
        name=_NAME,
        class_names=list(cub["classes"]),
    )
