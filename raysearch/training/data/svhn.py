"""SVHN cropped digits from ``train_32x32.mat`` and ``test_32x32.mat``, decoded in memory.

:func:`load_svhn` (registered in :mod:`raysearch.training.data` through
:mod:`raysearch.training.data.vision`) reads the two ``.mat`` files through torchvision's
``SVHN``, with the per-channel normalisation statistics. Each file is checked from its header
(``scipy.io.whosmat``) instead of torchvision's md5 sums, decoded once per process
(``functools.lru_cache`` keyed by path and file stamps; :func:`clear_cache`) and split by
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
import torch
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

__all__ = ["SVHN_MEAN", "SVHN_STD", "clear_cache", "load_svhn"]

#: Per-channel statistics in [0, 1] pixel units (of the training split).
SVHN_MEAN, SVHN_STD = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)


_SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}


def _svhn_file_problem(path: Path) -> str | None:
    """Cheap check of a ``*_32x32.mat`` file from its header (``scipy.io.whosmat``)."""
    import scipy.io

    if not path.is_file():
        return f"missing: {path.name}"
    try:
        variables = {name: (shape, cls) for name, shape, cls in scipy.io.whosmat(str(path))}
    except Exception as err:  # noqa: BLE001 - scipy raises many types on garbage
        return f"{path} is corrupt ({type(err).__name__}: {err})"
    if "X" not in variables or "y" not in variables:
        return f"{path} is corrupt (needs variables X and y, has {', '.join(variables) or 'none'})"
    (x_shape, x_cls), (y_shape, _) = variables["X"], variables["y"]
    n = x_shape[3] if len(x_shape) == 4 else None
    if len(x_shape) != 4 or tuple(x_shape[:3]) != (32, 32, 3) or x_cls != "uint8":
        return f"{path} is corrupt (X must be uint8 (32, 32, 3, N), got {x_cls} {x_shape})"
    if tuple(y_shape) not in ((n, 1), (1, n), (n,)):
        return f"{path} is corrupt (y must be ({n}, 1) to match X, got {y_shape})"
    return None


class _CheckedSVHN(tvd.SVHN):
    """torchvision's SVHN with a presence + header check instead of md5."""

    def _check_integrity(self) -> bool:
        return _svhn_file_problem(Path(self.root) / self.filename) is None


@functools.lru_cache(maxsize=_IN_MEMORY_CACHE_SIZE)
def _read_svhn(folder: str, stamp: tuple) -> _RawImages:
    del stamp  # part of the cache key only
    parts = []
    for split in ("train", "test"):
        path = Path(folder) / _SVHN_FILES[split]
        try:
            ds = _CheckedSVHN(folder, split=split, download=False)
        except Exception as err:  # noqa: BLE001 - scipy.io read errors of a truncated file
            raise DatasetError(
                f"svhn: {path} is corrupt ({type(err).__name__}: {err}); download it again or "
                "pass --download"
            ) from err
        labels = ds.labels.astype(np.int64).reshape(-1)
        _check_labels("svhn", path, labels, 10)
        parts += [torch.from_numpy(np.ascontiguousarray(ds.data)), labels]
    return _RawImages(*parts, class_names=tuple(str(d) for d in range(10)))


def load_svhn(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
) -> DatasetSplits:
    """SVHN cropped digits (``train_32x32.mat``, ``test_32x32.mat``) via torchvision's ``SVHN``.

    `data_dir` holds the two ``.mat`` files (or a ``svhn/`` folder holding them). torchvision
    maps label 10 to digit 0. Train images get ``CropFlip(padding=4, flip=False)`` (a flip
    changes digits); :data:`SVHN_MEAN`/:data:`SVHN_STD`. The ``extra`` split is not used.
    Arguments as :func:`load_cifar10`.

    Returns:
        DatasetSplits: :class:`ImageTensorDataset` splits, x float32 (3, 32, 32), K = 10.

    Raises:
        DatasetError: as :func:`load_cifar10`.
    """
    name = "svhn"
    reject_test_fraction(name, test_fraction)
    root = _require_data_dir(
        name, data_dir, "the folder holding train_32x32.mat and test_32x32.mat", True
    )
    files = tuple(_SVHN_FILES.values())
    folder = root
    if not any((root / f).exists() for f in files) and (root / "svhn").is_dir():
        folder = root / "svhn"

    def problem() -> str | None:
        if not folder.is_dir():
            return f"the folder {folder}/ does not exist"
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            return f"missing: {', '.join(missing)}"
        return next((p for p in map(_svhn_file_problem, (folder / f for f in files)) if p), None)

    if download and problem() is not None:

        def fetch() -> None:
            for split in ("train", "test"):
                if _svhn_file_problem(folder / _SVHN_FILES[split]) is not None:
                    tvd.SVHN(str(folder), split=split, download=True)

        _download(name, folder, fetch)
    found = problem()
    if found:
        raise DatasetError(
            f"svhn: expected the cropped-digits SVHN files under {folder}/ (train_32x32.mat, "
            f"test_32x32.mat with X uint8 (32, 32, 3, N) and y (N, 1)); {found}. Download them "
            "from http://ufldl.stanford.edu/housenumbers/ into that folder or pass --download"
        )
    raw = _read_svhn(str(folder), _stamp([folder / f for f in files]))
    return _in_memory_splits(
        name,
        raw,
        seed=seed,
        val_fraction=val_fraction,
        imbalance_ratio=imbalance_ratio,
        mean=SVHN_MEAN,
        std=SVHN_STD,
        augment=CropFlip(padding=4, flip=False),
        folder=folder,
        test_source="the official test split (test_32x32.mat)",
    )


def clear_cache() -> None:
    """Drop this module's per-process cache of decoded files (frees their memory)."""
    _read_svhn.cache_clear()
