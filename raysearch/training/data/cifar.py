"""CIFAR-10 and CIFAR-100 (python version) from their pickled batch files, decoded in memory.

:func:`load_cifar10` and :func:`load_cifar100` (registered in :mod:`raysearch.training.data`
through :mod:`raysearch.training.data.vision`) read ``cifar-10-batches-py/`` and
``cifar-100-python/`` through torchvision's ``CIFAR10``/``CIFAR100``, with their per-channel
normalisation statistics. Each file is checked for presence and structure (unpickled once)
instead of torchvision's md5 sums, decoded once per process (``functools.lru_cache`` keyed by
path and file stamps; :func:`clear_cache`) and split by
:func:`raysearch.training.data._vision_common._in_memory_splits`. See
:mod:`raysearch.training.data.vision` for the conventions.

Imports only :mod:`raysearch.training.data.images`, :mod:`raysearch.training.data.splits` and
:mod:`raysearch.training.data._vision_common` of the package.
"""

from __future__ import annotations

import functools
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchvision.datasets as tvd

from raysearch.training.data._vision_common import (
    _IN_MEMORY_CACHE_SIZE,
    _download,
    _in_memory_splits,
    _RawImages,
    _require_data_dir,
    _resolve_folder,
    _stamp,
)
from raysearch.training.data.images import CropFlip
from raysearch.training.data.splits import DatasetError, DatasetSplits, reject_test_fraction

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100_MEAN", "CIFAR100_STD", "clear_cache",
           "load_cifar10", "load_cifar100"]

#: Per-channel statistics in [0, 1] pixel units (of the training splits).
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


@dataclass(frozen=True)
class _CifarSpec:
    title: str
    tv_class: type
    folder: str
    archive: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta: str
    meta_key: str
    label_key: str
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train_files, *self.test_files, self.meta)

    @property
    def layout(self) -> str:
        if len(self.train_files) > 1:
            listed = f"data_batch_1..{len(self.train_files)}, {', '.join(self.test_files)}"
        else:
            listed = ", ".join((*self.train_files, *self.test_files))
        return f"{listed}, {self.meta}"


#: Verified CIFAR files: stamp -> problem (None: fine), so each file is unpickled once to check.
_CIFAR_CHECKED: dict[tuple, str | None] = {}


def _cifar_file_problem(path: Path, spec: _CifarSpec, meta: bool) -> str | None:
    key = (str(path), _stamp([path]), meta, spec.folder)
    if key in _CIFAR_CHECKED:
        return _CIFAR_CHECKED[key]
    problem = None
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="latin1")  # noqa: S301 - the CIFAR format is pickle
    except Exception as err:  # noqa: BLE001 - truncated/garbage pickles raise many types
        problem = f"{path} is corrupt ({type(err).__name__}: {err})"
    else:
        if not isinstance(entry, dict):
            problem = f"{path} is corrupt (unpickles to {type(entry).__name__}, not a dict)"
        elif any(isinstance(key, bytes) for key in entry):
            problem = (
                f"{path} is corrupt (bytes keys such as b'data': a pickle re-written by "
                "Python 3, not the original file, whose keys unpickle as str)"
            )
        elif meta:
            names = entry.get(spec.meta_key)
            if not isinstance(names, list) or len(names) != spec.num_classes:
                problem = (
                    f"{path} is corrupt (`{spec.meta_key}` must list "
                    f"{spec.num_classes} class names)"
                )
        else:
            data, labels = entry.get("data"), entry.get(spec.label_key)
            if (
                not isinstance(data, np.ndarray)
                or data.dtype != np.uint8
                or data.ndim != 2
                or data.shape[1] != 3072
            ):
                got = (
                    f"{data.dtype} {data.shape}"
                    if isinstance(data, np.ndarray)
                    else type(data).__name__
                )
                problem = f"{path} is corrupt (`data` must be uint8 (N, 3072), got {got})"
            elif labels is None or len(labels) != data.shape[0]:
                problem = (
                    f"{path} is corrupt (`{spec.label_key}` must hold {data.shape[0]} "
                    f"labels, got {None if labels is None else len(labels)})"
                )
            else:
                arr = np.asarray(labels)
                if arr.size and (arr.min() < 0 or arr.max() >= spec.num_classes):
                    problem = f"{path} is corrupt (labels outside [0, {spec.num_classes - 1}])"
    _CIFAR_CHECKED[key] = problem
    return problem


def _cifar_problem(folder: Path, spec: _CifarSpec) -> str | None:
    """What is missing or corrupt in a CIFAR python folder, or None when it is complete."""
    if not folder.is_dir():
        return f"the folder {folder}/ does not exist"
    missing = [name for name in spec.files if not (folder / name).is_file()]
    if missing:
        return f"missing: {', '.join(missing)}"
    for name in spec.files:
        problem = _cifar_file_problem(folder / name, spec, meta=name == spec.meta)
        if problem:
            return problem
    return None


def _checked_cifar_class(spec: _CifarSpec) -> type:
    """The torchvision CIFAR class with a presence + structure integrity check instead of md5."""

    class Checked(spec.tv_class):
        def __init__(self, folder: Path, *, train: bool, download: bool) -> None:
            # torchvision reads <root>/<base_folder>/<file>; allow any folder name
            self.base_folder = folder.name
            super().__init__(str(folder.parent), train=train, download=download)

        def _check_integrity(self) -> bool:
            return _cifar_problem(Path(self.root) / self.base_folder, spec) is None

        def _load_meta(self) -> None:
            path = Path(self.root) / self.base_folder / spec.meta
            with open(path, "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")[spec.meta_key]  # noqa: S301
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    Checked.__name__ = Checked.__qualname__ = f"_Checked{spec.tv_class.__name__}"
    return Checked


_CIFAR = {
    "cifar10": _CifarSpec(
        title="CIFAR-10",
        tv_class=tvd.CIFAR10,
        folder="cifar-10-batches-py",
        archive="cifar-10-python.tar.gz",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        meta="batches.meta",
        meta_key="label_names",
        label_key="labels",
        num_classes=10,
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
    ),
    "cifar100": _CifarSpec(
        title="CIFAR-100",
        tv_class=tvd.CIFAR100,
        folder="cifar-100-python",
        archive="cifar-100-python.tar.gz",
        train_files=("train",),
        test_files=("test",),
        meta="meta",
        meta_key="fine_label_names",
        label_key="fine_labels",
        num_classes=100,
        mean=CIFAR100_MEAN,
        std=CIFAR100_STD,
    ),
}
_CIFAR_CLASSES = {name: _checked_cifar_class(spec) for name, spec in _CIFAR.items()}


@functools.lru_cache(maxsize=_IN_MEMORY_CACHE_SIZE)
def _read_cifar(name: str, folder: str, stamp: tuple) -> _RawImages:
    """Both CIFAR splits through torchvision (cached per process; `stamp` sees file changes)."""
    del stamp  # part of the cache key only
    cls = _CIFAR_CLASSES[name]
    parts = []
    for train in (True, False):
        ds = cls(Path(folder), train=train, download=False)
        images = torch.from_numpy(np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)))
        parts += [images, np.asarray(ds.targets, dtype=np.int64)]
    return _RawImages(*parts, class_names=tuple(str(c) for c in ds.classes))


def _load_cifar(
    name: str,
    *,
    seed: int,
    val_fraction: float | None,
    test_fraction: float | None,
    data_dir: str | os.PathLike | None,
    download: bool,
    imbalance_ratio: float | None,
) -> DatasetSplits:
    spec = _CIFAR[name]
    reject_test_fraction(name, test_fraction)
    root = _require_data_dir(name, data_dir, f"the folder holding {spec.folder}/", True)
    folder = _resolve_folder(root, spec.folder, spec.files)
    if download and _cifar_problem(folder, spec) is not None:
        folder = root if root.name == spec.folder else root / spec.folder
        cls = _CIFAR_CLASSES[name]
        _download(name, folder.parent, lambda: cls(folder, train=True, download=True))
    problem = _cifar_problem(folder, spec)
    if problem:
        raise DatasetError(
            f"{name}: expected the python version of {spec.title} under {folder}/ "
            f"({spec.layout}); {problem}. Extract {spec.archive} into {folder.parent} or pass "
            "--download"
        )
    files = [folder / f for f in spec.files]
    raw = _read_cifar(name, str(folder), _stamp(files))
    return _in_memory_splits(
        name,
        raw,
        seed=seed,
        val_fraction=val_fraction,
        imbalance_ratio=imbalance_ratio,
        mean=spec.mean,
        std=spec.std,
        augment=CropFlip(padding=4, flip=True),
        folder=folder,
        test_source=f"the official test split ({', '.join(spec.test_files)})",
    )


def load_cifar10(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
) -> DatasetSplits:
    """CIFAR-10 (python version) from `data_dir`, through ``torchvision.datasets.CIFAR10``.

    `data_dir` is the folder holding ``cifar-10-batches-py/`` (``data_batch_1..5``,
    ``test_batch``, ``batches.meta``), or that folder itself. Train images get
    ``CropFlip(padding=4, flip=True)``; normalisation with :data:`CIFAR10_MEAN`/
    :data:`CIFAR10_STD`; class names from ``batches.meta``. The files are pickles (the format
    of the dataset): load only files you trust.

    Args:
        seed (int): seed of the validation carve and of the long tail.
        val_fraction (float, optional): share of the (long-tailed) official training split
            carved as validation, in (0, 1). Defaults to ``None`` (0.1: 5,000 of 50,000).
        test_fraction (float, optional): must be ``None`` (the official test split is used).
        data_dir (str | os.PathLike, optional): see above; required.
        download (bool, optional): download and extract the archive into `data_dir` when the
            files are missing or corrupt. Defaults to ``False``.
        imbalance_ratio (float, optional): long-tailed training split (CIFAR-10-LT), >= 1.

    Returns:
        DatasetSplits: :class:`ImageTensorDataset` splits, x float32 (3, 32, 32), K = 10.

    Raises:
        DatasetError: if `data_dir` is None, a file is missing or corrupt, a download fails, or
            `test_fraction` is given.
    """
    return _load_cifar(
        "cifar10",
        seed=seed,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        data_dir=data_dir,
        download=download,
        imbalance_ratio=imbalance_ratio,
    )


def load_cifar100(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
) -> DatasetSplits:
    """CIFAR-100 (python version, fine labels) through ``torchvision.datasets.CIFAR100``.

    `data_dir` is the folder holding ``cifar-100-python/`` (``train``, ``test``, ``meta``), or
    that folder itself. Same augmentation as CIFAR-10; :data:`CIFAR100_MEAN`/
    :data:`CIFAR100_STD`; class names are ``fine_label_names`` of ``meta``. Arguments as
    :func:`load_cifar10`.

    Returns:
        DatasetSplits: :class:`ImageTensorDataset` splits, x float32 (3, 32, 32), K = 100.

    Raises:
        DatasetError: as :func:`load_cifar10`.
    """
    return _load_cifar(
        "cifar100",
        seed=seed,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        data_dir=data_dir,
        download=download,
        imbalance_ratio=imbalance_ratio,
    )


def clear_cache() -> None:
    """Drop this module's per-process cache of decoded files (frees their memory)."""
    _read_cifar.cache_clear()
