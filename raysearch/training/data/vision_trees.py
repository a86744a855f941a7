"""Image datasets read from trees of image files: Tiny-ImageNet and ImageFolder trees.

Loaders (registered in :mod:`raysearch.training.data` through
:mod:`raysearch.training.data.vision`): :func:`load_tiny_imagenet` (the extracted
``tiny-imagenet-200.zip``, decoded once per process into uint8 tensors; :func:`clear_cache`) and
:func:`load_imagefolder` (``<class>/<image>`` trees of variable-size images, listed here and
read per sample). See :mod:`raysearch.training.data.vision` for the conventions.

Imports only :mod:`raysearch.training.data.images`, :mod:`raysearch.training.data.splits` and
:mod:`raysearch.training.data._vision_common` of the package.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

from raysearch.training.data._vision_common import (
    _download,
    _image_samples,
    _in_memory_splits,
    _official_split_indices,
    _pct,
    _RawImages,
    _require_data_dir,
    _resolve_folder,
    _resolve_val_fraction,
    _stamp,
)
from raysearch.training.data.images import CropFlip, ImageFileDataset, imagenet_transforms, read_rgb
from raysearch.training.data.splits import (
    IMAGEFOLDER_TEST_FRACTION,
    IMAGEFOLDER_VAL_FRACTION,
    DatasetError,
    DatasetSplits,
    check_fraction_sum,
    class_counts_text,
    reject_test_fraction,
    three_way_split,
)

__all__ = ["IMAGE_SIZE", "TINY_IMAGENET_MEAN", "TINY_IMAGENET_STD", "TINY_IMAGENET_URL",
           "clear_cache", "load_imagefolder", "load_tiny_imagenet"]

#: Per-channel statistics in [0, 1] pixel units (of the training splits).
TINY_IMAGENET_MEAN, TINY_IMAGENET_STD = (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821)

#: Side of the square crops of ``imagefolder`` images (train and eval), in pixels.
IMAGE_SIZE = 224

TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_TINY_FOLDER = "tiny-imagenet-200"
_TINY_SIZE = 64


# --------------------------------------------------------------------------------------------
# Tiny-ImageNet


def _decode_all(name: str, paths: Sequence[str], size: int) -> Tensor:
    """uint8 (N, 3, size, size) from image files, decoded with PIL in a small thread pool."""
    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)

    def decode(rows: range) -> None:
        for row in rows:
            try:
                image = np.asarray(read_rgb(paths[row]))
            except DatasetError as err:
                raise DatasetError(f"{name}: {err}") from err
            if image.shape != (size, size, 3):
                raise DatasetError(
                    f"{name}: {paths[row]} is {image.shape[1]}x{image.shape[0]}, expected "
                    f"{size}x{size}"
                )
            out[row] = image.transpose(2, 0, 1)

    chunks = [range(start, min(start + 512, len(paths))) for start in range(0, len(paths), 512)]
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(decode, chunks):  # re-raises the first error
            pass
    return torch.from_numpy(out)


def _scan_tiny_imagenet(folder: Path) -> tuple[list, list, tuple[str, ...]]:
    """(train samples, test samples, class names) of a Tiny-ImageNet folder."""
    name = "tiny_imagenet"
    wnids = sorted(
        {line.strip() for line in (folder / "wnids.txt").read_text().splitlines() if line.strip()}
    )
    if not wnids:
        raise DatasetError(f"{name}: {folder / 'wnids.txt'} lists no class")
    class_to_idx = {w: i for i, w in enumerate(wnids)}
    try:
        train = _image_samples(name, folder / "train", class_to_idx, IMG_EXTENSIONS)
    except FileNotFoundError as err:
        raise DatasetError(
            f"{name}: no training images under {folder / 'train'}/<wnid>/images/"
            f" for some wnids of wnids.txt: {err}"
        ) from err
    annotations = folder / "val" / "val_annotations.txt"
    test, bad = [], []
    for number, line in enumerate(annotations.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1].strip() not in class_to_idx:
            bad.append(f"line {number}: {line.strip()[:60]!r}")
            continue
        path = folder / "val" / "images" / fields[0].strip()
        if not path.is_file():
            raise DatasetError(
                f"{name}: {annotations} line {number} names {path}, which does not exist"
            )
        test.append((str(path), class_to_idx[fields[1].strip()]))
    if bad:
        raise DatasetError(
            f"{name}: {annotations} has {len(bad)} line(s) without a tab-separated file name and "
            f"a wnid of wnids.txt, first {bad[0]}"
        )
    if not test:
        raise DatasetError(f"{name}: {annotations} lists no image")
    words = {}
    if (folder / "words.txt").is_file():
        for line in (folder / "words.txt").read_text().splitlines():
            wnid, _, text = line.partition("\t")
            words[wnid.strip()] = text.split(",")[0].strip()
    return train, test, tuple(words.get(w) or w for w in wnids)


@functools.lru_cache(maxsize=2)
def _read_tiny_imagenet(folder: str, stamp: tuple) -> _RawImages:
    """Scanned and decoded Tiny-ImageNet, cached per process by path and `stamp`."""
    del stamp  # part of the cache key only
    train, test, class_names = _scan_tiny_imagenet(Path(folder))
    return _RawImages(
        _decode_all("tiny_imagenet", [p for p, _ in train], _TINY_SIZE),
        np.array([label for _, label in train], dtype=np.int64),
        _decode_all("tiny_imagenet", [p for p, _ in test], _TINY_SIZE),
        np.array([label for _, label in test], dtype=np.int64),
        class_names,
    )


def _tiny_imagenet_problem(folder: Path) -> str | None:
    if not folder.is_dir():
        return f"the folder {folder}/ does not exist"
    needed = ["wnids.txt", "train/", "val/images/", "val/val_annotations.txt"]
    missing = [n for n in needed if not (folder / n).exists()]
    if missing:
        return f"missing: {', '.join(missing)}"
    return None


def load_tiny_imagenet(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
) -> DatasetSplits:
    """Tiny-ImageNet-200 (64x64, 200 classes) from the extracted ``tiny-imagenet-200.zip``.

    `data_dir` holds ``tiny-imagenet-200/`` or is that folder: ``wnids.txt``, ``words.txt``
    (optional, class names), ``train/<wnid>/images/*.JPEG`` (scanned with torchvision's
    ``make_dataset``), ``val/images/*.JPEG`` and ``val/val_annotations.txt`` (tab-separated
    file name, wnid, box). The labelled ``val/`` is the TEST split here (``test/`` has no
    labels); validation is carved from ``train/``. Classes are the wnids in sorted order (the
    order of ``ImageFolder`` on ``train/``); ``class_names`` are the first name of each wnid in
    ``words.txt`` (the wnid itself when absent).

    All images are decoded once per process (PIL, thread pool) into uint8 tensors: about
    1.2 GB for the 100,000 training images. Train images get ``CropFlip(padding=8, flip=True)``;
    :data:`TINY_IMAGENET_MEAN`/:data:`TINY_IMAGENET_STD`. Arguments as :func:`load_cifar10`;
    `download` fetches :data:`TINY_IMAGENET_URL` (about 240 MB) into `data_dir`.

    Returns:
        DatasetSplits: :class:`ImageTensorDataset` splits, x float32 (3, 64, 64), K = 200 (the
        number of wnids).

    Raises:
        DatasetError: if `data_dir` is None, a file or folder is missing, an annotation names an
            unknown wnid or a missing file, an image is unreadable or not 64x64, a download
            fails, or `test_fraction` is given.
    """
    name = "tiny_imagenet"
    reject_test_fraction(name, test_fraction)
    root = _require_data_dir(name, data_dir, f"the folder holding {_TINY_FOLDER}/", True)
    folder = _resolve_folder(root, _TINY_FOLDER, ["wnids.txt"])
    if download and _tiny_imagenet_problem(folder) is not None:
        from torchvision.datasets.utils import download_and_extract_archive

        folder = root / _TINY_FOLDER
        _download(name, root, lambda: download_and_extract_archive(TINY_IMAGENET_URL, str(root)))
    layout = "wnids.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG, val/val_annotations.txt"
    problem = _tiny_imagenet_problem(folder)
    if problem:
        raise DatasetError(
            f"{name}: expected Tiny-ImageNet under {folder}/ ({layout}); {problem}. Extract "
            f"tiny-imagenet-200.zip into {folder.parent} or pass --download"
        )
    stamp = _stamp(
        [
            folder / "wnids.txt",
            folder / "words.txt",
            folder / "train",
            folder / "val" / "images",
            folder / "val" / "val_annotations.txt",
        ]
    )
    raw = _read_tiny_imagenet(str(folder), stamp)
    return _in_memory_splits(
        name,
        raw,
        seed=seed,
        val_fraction=val_fraction,
        imbalance_ratio=imbalance_ratio,
        mean=TINY_IMAGENET_MEAN,
        std=TINY_IMAGENET_STD,
        augment=CropFlip(padding=8, flip=True),
        folder=folder,
        test_source="the labelled val/ split",
    )


# --------------------------------------------------------------------------------------------
# ImageFolder trees


def _scan_folder(name: str, directory: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """The classes and samples of an ImageFolder tree, safe from symlink loops.

    torchvision's ``find_classes`` and (:func:`_image_samples`) ``make_dataset``, with
    DatasetError instead of OSError.

    Raises:
        DatasetError: for a folder without class folders of images, or a symlink loop.
    """
    try:
        classes, class_to_idx = find_classes(str(directory))
        samples = _image_samples(name, directory, class_to_idx, IMG_EXTENSIONS)
    except FileNotFoundError as err:
        raise DatasetError(
            f"{name}: expected class folders of images ({', '.join(IMG_EXTENSIONS)}) in "
            f"{directory}/; {err}"
        ) from err
    return classes, samples


#: (classes, (train, val, test), info) of one ImageFolder layout
_Tree = tuple[
    list[str], tuple[ImageFileDataset, ImageFileDataset, ImageFileDataset], dict[str, Any]
]


def _imagefolder_split_tree(
    name: str, root: Path, transforms: dict[bool, Any], seed: int,
    val_fraction: float | None, imbalance_ratio: float | None,
) -> _Tree:
    """Classes, (train, val, test) and info of a ``train/`` + ``val/`` tree (val/ = test)."""
    info: dict[str, Any] = {}
    val_fraction = _resolve_val_fraction(val_fraction)
    classes, train_samples = _scan_folder(name, root / "train")
    test_classes, test_samples = _scan_folder(name, root / "val")
    if test_classes != classes:
        missing = sorted(set(classes) - set(test_classes))
        extra = sorted(set(test_classes) - set(classes))
        raise DatasetError(
            f"{name}: the classes of {root / 'val'}/ differ from {root / 'train'}/ "
            f"(missing in val/: {', '.join(missing[:5]) or 'none'}; "
            f"not in train/: {', '.join(extra[:5]) or 'none'})"
        )
    pool_ds = ImageFileDataset(train_samples, transforms[True])
    labels = pool_ds.labels
    train, val, split_info = _official_split_indices(
        name,
        labels,
        len(classes),
        seed=seed,
        val_fraction=val_fraction,
        imbalance_ratio=imbalance_ratio,
        source="train/ folder",
    )
    info.update(split_info, test_split="the val/ folder")
    train_ds = pool_ds.subset(train)
    val_ds = ImageFileDataset(pool_ds.subset(val).samples, transforms[False])
    test_ds = ImageFileDataset(test_samples, transforms[False])
    return classes, (train_ds, val_ds, test_ds), info


def _imagefolder_flat_tree(
    name: str, root: Path, transforms: dict[bool, Any], seed: int,
    val_fraction: float | None, test_fraction: float | None, imbalance_ratio: float | None,
) -> _Tree:
    """Classes, (train, val, test) and info of a ``<class>/<image>`` tree, split by seed."""
    info: dict[str, Any] = {}
    val_fraction = IMAGEFOLDER_VAL_FRACTION if val_fraction is None else float(val_fraction)
    test_fraction = IMAGEFOLDER_TEST_FRACTION if test_fraction is None else float(test_fraction)
    check_fraction_sum(val_fraction, test_fraction)
    classes, samples = _scan_folder(name, root)
    labels = np.array([label for _, label in samples], dtype=np.int64)
    train, val, test, pool = three_way_split(
        name,
        labels,
        seed=seed,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        imbalance_ratio=imbalance_ratio,
        num_classes=len(classes),
    )
    lt = "" if imbalance_ratio is None else f", long-tailed (ratio {imbalance_ratio:g})"
    info.update(
        val_split=(
            f"stratified {_pct(val_fraction)} val / {_pct(test_fraction)} test of all "
            f"images{lt}, seed {seed}"
        ),
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        test_split=f"stratified {_pct(test_fraction)} of all images, seed {seed}",
    )
    if imbalance_ratio is not None:
        info["imbalance_ratio"] = float(imbalance_ratio)
        info["class_counts"] = class_counts_text(labels[pool], len(classes))
    train_ds = ImageFileDataset([samples[i] for i in train], transforms[True])
    val_ds = ImageFileDataset([samples[i] for i in val], transforms[False])
    test_ds = ImageFileDataset([samples[i] for i in test], transforms[False])
    return classes, (train_ds, val_ds, test_ds), info


def _imagefolder_tree(
    name: str, root: Path, transforms: dict[bool, Any], seed: int,
    val_fraction: float | None, test_fraction: float | None, imbalance_ratio: float | None,
) -> _Tree:
    """Classes, (train, val, test) and info of the tree's layout: ``train/`` + ``val/``, or flat.

    Raises:
        DatasetError: if only one of ``train/`` and ``val/`` exists, or `test_fraction` is
            given for a ``train/`` + ``val/`` tree.
    """
    has_train, has_val = (root / "train").is_dir(), (root / "val").is_dir()
    if not (has_train or has_val):
        return _imagefolder_flat_tree(
            name, root, transforms, seed, val_fraction, test_fraction, imbalance_ratio
        )
    if not (has_train and has_val):
        raise DatasetError(
            f"{name}: {root}/ has {'train/' if has_train else 'val/'} but no "
            f"{'val/' if has_train else 'train/'}; a split tree needs both (val/ is the test "
            "split), a flat tree has only class folders"
        )
    reject_test_fraction(f"{name} {root}/ (train/ + val/)", test_fraction)
    return _imagefolder_split_tree(name, root, transforms, seed, val_fraction, imbalance_ratio)


def load_imagefolder(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
    image_size: int = IMAGE_SIZE,
) -> DatasetSplits:
    """An ImageFolder tree of variable-size images (``<class>/<image>``), read per sample.

    Layouts of `data_dir`:

    - ``train/<class>/...`` and ``val/<class>/...`` (the ImageNet layout): ``val/`` is the TEST
      split; `val_fraction` (default 0.1) of ``train/`` is carved as validation (stratified,
      after the optional long tail); `test_fraction` must be ``None``. The classes of ``val/``
      must equal those of ``train/``.
    - ``<class>/...`` at the top level: split by seed with
      :func:`~raysearch.training.data.splits.three_way_split` into train/val/test, `val_fraction`
      and `test_fraction` (defaults 0.1 and 0.2) being shares of all images; the long tail applies
      to what is left after the test carve.

    Classes are the sorted folder names (torchvision's ``find_classes``); images are found with
    ``make_dataset`` (extensions ``IMG_EXTENSIONS``). Train: ``RandomResizedCrop(image_size)``
    + ``RandomHorizontalFlip``; val/test: ``Resize(round(image_size / 0.875))`` +
    ``CenterCrop(image_size)``; ImageNet mean/std. Images are only listed here; an unreadable
    one raises when it is accessed.

    Args:
        seed (int): seed of the splits and of the long tail.
        val_fraction (float, optional): see above. Defaults to ``None``.
        test_fraction (float, optional): see above. Defaults to ``None``.
        data_dir (str | os.PathLike, optional): the tree; required.
        download (bool, optional): must be ``False`` (nothing to download).
        imbalance_ratio (float, optional): long-tailed training pool, >= 1.
        image_size (int, optional): side of the crops. Defaults to :data:`IMAGE_SIZE` (224).

    Returns:
        DatasetSplits: :class:`ImageFileDataset` splits, x float32 (3, image_size, image_size).

    Raises:
        DatasetError: if `data_dir` is None or not a folder, `download` is set, the tree has no
            class folder or a class folder has no image, the classes of ``val/`` and ``train/``
            differ, ``train/`` exists without ``val/``, `test_fraction` is given for a
            train/val tree, or a class is too small to stratify.
        ValueError: if `val_fraction` + `test_fraction` >= 1 or `image_size` < 1.
    """
    name = "imagefolder"
    if download:
        raise DatasetError(
            f"{name}: there is nothing to download for an ImageFolder tree"
            f"{'' if data_dir is None else f' ({data_dir})'}; drop --download"
        )
    root = _require_data_dir(
        name,
        data_dir,
        "the ImageFolder tree: <class>/<image> or train/<class>/<image> + val/<class>/<image>",
        False,
    )
    transforms = {train: imagenet_transforms(image_size, train=train) for train in (True, False)}
    if not root.is_dir():
        raise DatasetError(
            f"{name}: {root}/ is not a folder; expected an ImageFolder tree "
            "(<class>/<image>, or train/<class>/<image> + val/<class>/<image>)"
        )
    classes, (train_ds, val_ds, test_ds), info = _imagefolder_tree(
        name, root, transforms, seed, val_fraction, test_fraction, imbalance_ratio
    )
    info = {"data_dir": str(root), **info}
    splits = DatasetSplits(
        train=train_ds,
        val=val_ds,
        test=test_ds,
        num_classes=len(classes),
        input_shape=(3, image_size, image_size),
        name=name,
        class_names=list(classes),
    )
    splits.info = {
        "train_size": len(train_ds),
        "val_size": len(val_ds),
        "test_size": len(test_ds),
        **info,
    }
    return splits


def clear_cache() -> None:
    """Drop this module's per-process cache of decoded Tiny-ImageNet files (frees their memory)."""
    _read_tiny_imagenet.cache_clear()
