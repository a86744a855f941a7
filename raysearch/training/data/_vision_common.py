"""Shared helpers of the on-disk image loaders of :mod:`raysearch.training.data.vision`.

What :mod:`~raysearch.training.data.cifar`, :mod:`~raysearch.training.data.svhn`,
:mod:`~raysearch.training.data.mnist` (array files) and
:mod:`~raysearch.training.data.vision_trees` (Tiny-ImageNet, ImageFolder trees) share: the decoded
official splits (``_RawImages``), the file stamps of the per-process caches, the ``data_dir``
and download checks, and the split helpers (optional long tail, then the stratified validation
carve of the official training split; :class:`~raysearch.training.data.DatasetSplits` of in-memory
images). See :mod:`raysearch.training.data.vision` for the splits and caching conventions.

Imports only :mod:`raysearch.training.data.images` and :mod:`raysearch.training.data.splits` of the
package.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raysearch.training.data.images import CropFlip, ImageTensorDataset
from raysearch.training.data.splits import (
    OFFICIAL_VAL_FRACTION,
    DatasetError,
    DatasetSplits,
    carve_validation,
    class_counts_text,
    long_tail_indices,
)

logger = logging.getLogger(__name__)

#: Decoded datasets each loader keeps per process (``functools.lru_cache`` size).
_IN_MEMORY_CACHE_SIZE = 4


# --------------------------------------------------------------------------------------------
# shared helpers


@dataclass(frozen=True)
class _RawImages:
    """Decoded official splits: uint8 (N, C, H, W) images and int64 (N,) labels."""

    train_images: Tensor
    train_labels: np.ndarray
    test_images: Tensor
    test_labels: np.ndarray
    class_names: tuple[str, ...]


def _stamp(paths: Sequence[Path]) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime_ns) of each existing file: the cache key part that sees file changes."""
    out = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        out.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _require_data_dir(
    name: str, data_dir: str | os.PathLike | None, layout: str, downloadable: bool
) -> Path:
    """`data_dir` as an absolute Path, or a DatasetError when it is None."""
    if data_dir is None:
        hint = "; pass --download to fetch it there" if downloadable else ""
        raise DatasetError(f"{name}: `--data-dir` is required ({layout}){hint}")
    return Path(data_dir).expanduser().absolute()


def _download(name: str, folder: Path, fetch) -> None:
    """Run `fetch()`, turning network and archive errors into a DatasetError."""
    logger.info("%s: downloading into %s", name, folder)
    try:
        fetch()
    except DatasetError:
        raise
    except Exception as err:  # noqa: BLE001 - urllib, tarfile, zipfile, torchvision errors
        raise DatasetError(
            f"{name}: download into {folder} failed ({type(err).__name__}: {err}); check the "
            "network or place the files there by hand"
        ) from err


def _pct(fraction: float) -> str:
    return f"{100 * fraction:g}%"


def _resolve_val_fraction(val_fraction: float | None) -> float:
    return OFFICIAL_VAL_FRACTION if val_fraction is None else float(val_fraction)


def _official_split_indices(
    name: str,
    labels: np.ndarray,
    num_classes: int,
    *,
    seed: int,
    val_fraction: float,
    imbalance_ratio: float | None,
    source: str = "official train split",
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Long tail (optional) then stratified validation carve of an official training split."""
    pool = np.arange(len(labels))
    info: dict[str, Any] = {}
    if imbalance_ratio is not None:
        pool = long_tail_indices(labels, imbalance_ratio, seed=seed, num_classes=num_classes)
        info["imbalance_ratio"] = float(imbalance_ratio)
        info["class_counts"] = class_counts_text(labels[pool], num_classes)
        source = f"long-tailed (ratio {imbalance_ratio:g}) {source}"
    train, val = carve_validation(name, labels, pool, val_fraction=val_fraction, seed=seed)
    info["val_split"] = f"stratified {_pct(val_fraction)} of the {source}, seed {seed}"
    info["val_fraction"] = float(val_fraction)
    return train, val, info


def _in_memory_splits(
    name: str,
    raw: _RawImages,
    *,
    seed: int,
    val_fraction: float | None,
    imbalance_ratio: float | None,
    mean: Sequence[float],
    std: Sequence[float],
    augment: CropFlip | None,
    folder: Path,
    test_source: str,
) -> DatasetSplits:
    """DatasetSplits of ImageTensorDataset from decoded official splits."""
    val_fraction = _resolve_val_fraction(val_fraction)
    k = len(raw.class_names)
    train, val, info = _official_split_indices(
        name,
        raw.train_labels,
        k,
        seed=seed,
        val_fraction=val_fraction,
        imbalance_ratio=imbalance_ratio,
    )
    labels = torch.from_numpy(raw.train_labels)

    def part(index: np.ndarray, aug: CropFlip | None) -> ImageTensorDataset:
        ix = torch.from_numpy(index)
        return ImageTensorDataset(raw.train_images[ix], labels[ix], mean=mean, std=std, augment=aug)

    splits = DatasetSplits(
        train=part(train, augment),
        val=part(val, None),
        test=ImageTensorDataset(
            raw.test_images, torch.from_numpy(raw.test_labels), mean=mean, std=std
        ),
        num_classes=k,
        input_shape=tuple(int(s) for s in raw.train_images.shape[1:]),
        name=name,
        class_names=list(raw.class_names),
    )
    splits.info = {
        "train_size": len(splits.train),
        "val_size": len(splits.val),
        "test_size": len(splits.test),
        **info,
        "test_split": test_source,
        "data_dir": str(folder),
    }
    return splits


def _check_labels(name: str, path: Path, labels: np.ndarray, num_classes: int) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DatasetError(
            f"{name}: {path} holds labels outside [0, {num_classes - 1}] "
            f"(min {labels.min()}, max {labels.max()}); the file is corrupt"
        )


def _resolve_folder(root: Path, base: str, markers: Sequence[str]) -> Path:
    """`root` itself when it is the dataset folder (named `base` or holding a marker file)."""
    if root.name == base or any((root / m).exists() for m in markers):
        return root
    return root / base


def _walk_files(name: str, top: Path) -> list[tuple[str, list[str]]]:
    """(folder, sorted file names) of every folder under `top`, sorted by folder path.

    ``os.walk(top, followlinks=True)`` as torchvision's ``make_dataset`` walks it (links to
    folders are followed, unreadable folders skipped), except that a link back to a folder it
    sits in (a symlink loop, which would be walked without end) is refused.

    Raises:
        DatasetError: naming the link and the folder it loops back to.
    """
    out: list[tuple[str, list[str]]] = []
    # (folder, (device, inode) of the folders above it, the last link on the way to it)
    stack: list[tuple[str, tuple[tuple[int, int], ...], str]] = [(str(top), (), "")]
    while stack:
        folder, ancestors, link = stack.pop()
        try:
            stat = os.stat(folder)
            with os.scandir(folder) as entries:
                listed = [(entry.name, _is_dir(entry), entry.is_symlink()) for entry in entries]
        except OSError:  # as os.walk: an unreadable folder is skipped
            continue
        key = (stat.st_dev, stat.st_ino)
        if key in ancestors:
            raise DatasetError(
                f"{name}: the link {link or folder} leads to {os.path.realpath(link or folder)}, "
                "a folder it is in (a symlink loop); remove it"
            )
        out.append((folder, sorted(n for n, is_dir, _ in listed if not is_dir)))
        for entry, is_dir, is_link in listed:
            if is_dir:
                path = os.path.join(folder, entry)
                stack.append((path, (*ancestors, key), path if is_link else link))
    return sorted(out)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows a link, as os.walk(followlinks=True)
    except OSError:
        return False


def _image_samples(
    name: str, directory: Path, class_to_idx: dict[str, int], extensions: tuple[str, ...]
) -> list[tuple[str, int]]:
    """The files of torchvision's ``make_dataset`` (same order), safe from symlink loops.

    For each class folder ``directory/<class>`` in sorted class order, the files under it
    (:func:`_walk_files`) whose name ends with one of `extensions` (any case).

    Raises:
        FileNotFoundError: if a class has no such file (torchvision's message).
        DatasetError: for a symlink loop.
    """
    samples: list[tuple[str, int]] = []
    empty = []
    for target in sorted(class_to_idx):
        before = len(samples)
        folder = directory / target
        if folder.is_dir():
            for root, files in _walk_files(name, folder):
                samples.extend((os.path.join(root, f), class_to_idx[target])
                               for f in files if f.lower().endswith(extensions))
        if len(samples) == before:
            empty.append(target)
    if empty:
        raise FileNotFoundError(
            f"Found no valid file for the classes {', '.join(sorted(empty))}. Supported "
            f"extensions are: {', '.join(extensions)}"
        )
    return samples
