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
