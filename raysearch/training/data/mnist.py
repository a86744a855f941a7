"""MNIST and Fashion-MNIST from their uncompressed idx files, decoded in memory.

:func:`load_mnist` and :func:`load_fashion_mnist` (registered in :mod:`raysearch.training.data`
through :mod:`raysearch.training.data.vision`) read the four idx files through torchvision's
``MNIST``/``FashionMNIST``, with their normalisation statistics. Each file is checked from its
header (magic number, dimensions, size) instead of torchvision's md5 sums, decoded once per
process (``functools.lru_cache`` keyed by path and file stamps; :func:`clear_cache`) and split by
:func:`raysearch.training.data._vision_common._in_memory_splits`. See
:mod:`raysearch.training.data.vision` for the conventions.

Imports only :mod:`raysearch.training.data.images`, :mod:`raysearch.training.data.splits` and
:mod:`raysearch.training.data._vision_common` of the package.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import torchvision.datasets as tvd

from raysearch.training.data._vision_common import (
    _IN_MEMORY_CACHE_SIZE,
    _check_labels,
    _download,
    _in_memory_splits,
    _RawImages,
    _require_data_dir,
    _stamp,
)
from raysearch.training.data.images import CropFlip
from raysearch.training.data.splits import DatasetError, DatasetSplits, reject_test_fraction

__all__ = ["FASHION_MNIST_MEAN", "FASHION_MNIST_STD", "MNIST_MEAN", "MNIST_STD", "clear_cache",
           "load_fashion_mnist", "load_mnist"]

#: Per-channel statistics in [0, 1] pixel units (of the training splits).
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)


_IDX_FILES = {
    "train-images-idx3-ubyte": 3,
    "train-labels-idx1-ubyte": 1,
    "t10k-images-idx3-ubyte": 3,
    "t10k-labels-idx1-ubyte": 1,
}


def _idx_header(path: Path, ndim: int) -> tuple[tuple[int, ...] | None, str | None]:
    """Dims of an uncompressed uint8 idx file, or a problem (bad magic, wrong size)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4 + 4 * ndim)
        size = path.stat().st_size
    except OSError as err:
        return None, f"{path} cannot be read ({err})"
    expected_magic = 0x0800 + ndim  # 2051 for images, 2049 for labels
    magic = int.from_bytes(head[:4], "big") if len(head) >= 4 else None
    if magic != expected_magic:
        hint = " (gzip-compressed? extract it)" if head[:2] == b"\x1f\x8b" else ""
        return None, (
            f"{path} has a bad idx magic number {magic} (expected {expected_magic}: "
            f"uint8, {ndim} dims){hint}"
        )
    if len(head) < 4 + 4 * ndim:
        return None, f"{path} is truncated (header shorter than {4 + 4 * ndim} bytes)"
    dims = tuple(int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if size != 4 + 4 * ndim + int(np.prod(dims)):
        return None, (
            f"{path} is corrupt (header says {dims}, i.e. "
            f"{4 + 4 * ndim + int(np.prod(dims))} bytes, file has {size})"
        )
    return dims, None


def _idx_problem(raw: Path) -> str | None:
    """What is missing or corrupt in a folder of the four idx files, or None."""
    if not raw.is_dir():
        return f"the folder {raw}/ does not exist"
    missing = [f for f in _IDX_FILES if not (raw / f).is_file()]
    if missing:
        gz = [f"{f}.gz" for f in missing if (raw / f"{f}.gz").is_file()]
        hint = f" (found {', '.join(gz)}: gunzip them)" if gz else ""
        return f"missing: {', '.join(missing)}{hint}"
    dims = {}
    for name, ndim in _IDX_FILES.items():
        dims[name], problem = _idx_header(raw / name, ndim)
        if problem:
            return problem
    for split in ("train", "t10k"):
        images, labels = dims[f"{split}-images-idx3-ubyte"], dims[f"{split}-labels-idx1-ubyte"]
        if images[1:] != (28, 28):
            return f"{raw / f'{split}-images-idx3-ubyte'} holds {images[1:]} images, not 28x28"
        if images[0] != labels[0]:
            return (
                f"{split}-images-idx3-ubyte holds {images[0]} images but "
                f"{split}-labels-idx1-ubyte {labels[0]} labels"
            )
    return None


class _IdxMixin:
    """MNIST-family reader of torchvision with the idx files in any folder, checked by header."""

    def __init__(self, raw: Path, *, train: bool, download: bool) -> None:
        self._raw = raw
        super().__init__(str(raw), train=train, download=download)

    @property
    def raw_folder(self) -> str:
        return str(self._raw)

    def _check_exists(self) -> bool:
        return _idx_problem(self._raw) is None

    def _check_legacy_exist(self) -> bool:
        return False  # never the pre-0.8 processed/*.pt files: always the idx files


class _CheckedMNIST(_IdxMixin, tvd.MNIST):
    pass


class _CheckedFashionMNIST(_IdxMixin, tvd.FashionMNIST):
    pass


_IDX_DATASETS = {
    "mnist": ("MNIST", _CheckedMNIST, MNIST_MEAN, MNIST_STD, None),
    "fashion_mnist": (
        "FashionMNIST",
        _CheckedFashionMNIST,
        FASHION_MNIST_MEAN,
        FASHION_MNIST_STD,
        CropFlip(padding=2, flip=True),
    ),
}


@functools.lru_cache(maxsize=_IN_MEMORY_CACHE_SIZE)
def _read_idx(name: str, raw: str, stamp: tuple) -> _RawImages:
    del stamp  # part of the cache key only
    cls = _IDX_DATASETS[name][1]
    parts = []
    for train in (True, False):
        try:
            ds = cls(Path(raw), train=train, download=False)
        except Exception as err:  # noqa: BLE001 - torchvision's parser asserts
            raise DatasetError(
                f"{name}: cannot read the {'train' if train else 't10k'} idx files in {raw} "
                f"({type(err).__name__}: {err}); they are corrupt"
            ) from err
        labels = ds.targets.numpy().astype(np.int64)
        _check_labels(
            name, Path(raw) / f"{'train' if train else 't10k'}-labels-idx1-ubyte", labels, 10
        )
        parts += [ds.data.unsqueeze(1).contiguous(), labels]
    return _RawImages(*parts, class_names=tuple(str(c) for c in cls.classes))


def _load_idx(
    name: str,
    *,
    seed: int,
    val_fraction: float | None,
    test_fraction: float | None,
    data_dir: str | os.PathLike | None,
    download: bool,
    imbalance_ratio: float | None,
) -> DatasetSplits:
    title, cls, mean, std, augment = _IDX_DATASETS[name]
    reject_test_fraction(name, test_fraction)
    root = _require_data_dir(name, data_dir, f"the folder holding {title}/raw/", True)
    standard = root / title / "raw"
    raw = next(
        (c for c in (standard, root / "raw", root) if any((c / f).is_file() for f in _IDX_FILES)),
        standard,
    )
    if download and _idx_problem(raw) is not None:
        raw = standard
        _download(name, raw, lambda: cls(raw, train=True, download=True))
    problem = _idx_problem(raw)
    if problem:
        raise DatasetError(
            f"{name}: expected the uncompressed idx files under {raw}/ (train-images-idx3-ubyte, "
            f"train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte); "
            f"{problem}. Put them in {standard}/ or pass --download"
        )
    raw_images = _read_idx(name, str(raw), _stamp([raw / f for f in _IDX_FILES]))
    return _in_memory_splits(
        name,
        raw_images,
        seed=seed,
        val_fraction=val_fraction,
        imbalance_ratio=imbalance_ratio,
        mean=mean,
        std=std,
        augment=augment,
        folder=raw,
        test_source="the official test split (t10k-*)",
    )


def load_mnist(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
) -> DatasetSplits:
    """MNIST from its idx files through ``torchvision.datasets.MNIST``.

    The four uncompressed idx files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``) are looked up in
    ``<data_dir>/MNIST/raw/`` (torchvision's layout), ``<data_dir>/raw/`` and `data_dir` itself,
    in that order. No augmentation; :data:`MNIST_MEAN`/:data:`MNIST_STD`. Arguments as
    :func:`load_cifar10`.

    Returns:
        DatasetSplits: :class:`ImageTensorDataset` splits, x float32 (1, 28, 28), K = 10.

    Raises:
        DatasetError: as :func:`load_cifar10` (a bad idx magic number or size is corrupt).
    """
    return _load_idx(
        "mnist",
        seed=seed,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        data_dir=data_dir,
        download=download,
        imbalance_ratio=imbalance_ratio,
    )


def load_fashion_mnist(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
) -> DatasetSplits:
    """Fashion-MNIST through ``torchvision.datasets.FashionMNIST``.

    As :func:`load_mnist` with ``<data_dir>/FashionMNIST/raw/`` first; train images get
    ``CropFlip(padding=2, flip=True)``; :data:`FASHION_MNIST_MEAN`/:data:`FASHION_MNIST_STD`.

    Returns:
        DatasetSplits: :class:`ImageTensorDataset` splits, x float32 (1, 28, 28), K = 10.

    Raises:
        DatasetError: as :func:`load_mnist`.
    """
    return _load_idx(
        "fashion_mnist",
        seed=seed,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        data_dir=data_dir,
        download=download,
        imbalance_ratio=imbalance_ratio,
    )


def clear_cache() -> None:
    """Drop this module's per-process cache of decoded files (frees their memory)."""
    _read_idx.cache_clear()
