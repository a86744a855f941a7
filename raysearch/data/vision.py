"""Image datasets from a local ``data_dir`` in their standard on-disk formats.

Loaders (registered in :mod:`raysearch.data`): :func:`load_cifar10`, :func:`load_cifar100`,
:func:`load_svhn`, :func:`load_mnist`, :func:`load_fashion_mnist`, :func:`load_tiny_imagenet`,
:func:`load_imagefolder`. Each takes the keyword-only arguments of
:func:`raysearch.data.load_dataset` and returns a :class:`~raysearch.data.DatasetSplits`.

Files are read through torchvision's readers (``CIFAR10``/``CIFAR100``, ``SVHN``, ``MNIST``/
``FashionMNIST``, ``ImageFolder``'s ``find_classes``/``make_dataset``). torchvision's integrity
checks compare md5 sums, which only the official files match; the subclasses here replace them
by a presence and structure check, so a real download still works, small files written by tests
load, and a missing or corrupt file is a one-line :class:`~raysearch.data.DatasetError` naming
it. Nothing is downloaded unless ``download=True``.

Splits. These datasets have an official test split (Tiny-ImageNet: its labelled ``val/``;
ImageFolder: ``val/`` when the tree has ``train/`` and ``val/``), which is the test set here.
Validation is a stratified share of the official training split (default 10%,
``random_state=seed``), carved AFTER the optional long tail (:func:`~raysearch.data.
long_tail_indices` on the whole training split, as Jung et al., App. C); test stays balanced.

In-memory datasets (all but ``imagefolder``) are decoded once per process: the raw readers are
cached (``functools.lru_cache``) by resolved path and file sizes/modification times, so a Ray
worker that runs several trials reads the files once. The cached tensors are shared by the
returned test splits; do not modify them in place.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.datasets as tvd
from torch import Tensor
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from raysearch.data.images import (
    CropFlip,
    ImageFileDataset,
    ImageTensorDataset,
    imagenet_transforms,
    read_rgb,
)
from raysearch.data.splits import (
    IMAGEFOLDER_TEST_FRACTION,
    IMAGEFOLDER_VAL_FRACTION,
    OFFICIAL_VAL_FRACTION,
    DatasetError,
    DatasetSplits,
    carve_validation,
    check_fraction_sum,
    class_counts_text,
    long_tail_indices,
    reject_test_fraction,
    three_way_split,
)

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "IMAGEFOLDER_TEST_FRACTION",
    "IMAGEFOLDER_VAL_FRACTION",
    "IMAGE_SIZE",
    "MNIST_MEAN",
    "MNIST_STD",
    "SVHN_MEAN",
    "SVHN_STD",
    "TINY_IMAGENET_MEAN",
    "TINY_IMAGENET_STD",
    "TINY_IMAGENET_URL",
    "clear_cache",
    "load_cifar10",
    "load_cifar100",
    "load_fashion_mnist",
    "load_imagefolder",
    "load_mnist",
    "load_svhn",
    "load_tiny_imagenet",
]

logger = logging.getLogger(__name__)

#: Per-channel statistics in [0, 1] pixel units (of the training splits).
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
SVHN_MEAN, SVHN_STD = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
TINY_IMAGENET_MEAN, TINY_IMAGENET_STD = (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821)

#: Side of the square crops of ``imagefolder`` images (train and eval), in pixels.
IMAGE_SIZE = 224

TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_TINY_FOLDER = "tiny-imagenet-200"
_TINY_SIZE = 64

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


def clear_cache() -> None:
    """Drop the per-process cache of decoded datasets (frees their memory)."""
    for reader in (_read_cifar, _read_svhn, _read_idx, _read_tiny_imagenet):
        reader.cache_clear()


# --------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100


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


def _resolve_folder(root: Path, base: str, markers: Sequence[str]) -> Path:
    """`root` itself when it is the dataset folder (named `base` or holding a marker file)."""
    if root.name == base or any((root / m).exists() for m in markers):
        return root
    return root / base


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


# --------------------------------------------------------------------------------------------
# SVHN

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


# --------------------------------------------------------------------------------------------
# MNIST / Fashion-MNIST

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
        train = make_dataset(str(folder / "train"), class_to_idx, extensions=IMG_EXTENSIONS)
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
    """The ``find_classes`` + ``make_dataset`` with DatasetError instead of OSError."""
    try:
        classes, class_to_idx = find_classes(str(directory))
        samples = make_dataset(str(directory), class_to_idx, extensions=IMG_EXTENSIONS)
    except FileNotFoundError as err:
        raise DatasetError(
            f"{name}: expected class folders of images ({', '.join(IMG_EXTENSIONS)}) in "
            f"{directory}/; {err}"
        ) from err
    return classes, samples


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
      :func:`~raysearch.data.splits.three_way_split` into train/val/test, `val_fraction` and
      `test_fraction` (defaults 0.1 and 0.2) being shares of all images; the long tail applies
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
    has_train, has_val = (root / "train").is_dir(), (root / "val").is_dir()
    info: dict[str, Any] = {"data_dir": str(root)}
    if has_train or has_val:
        if not (has_train and has_val):
            raise DatasetError(
                f"{name}: {root}/ has {'train/' if has_train else 'val/'} but no "
                f"{'val/' if has_train else 'train/'}; a split tree needs both (val/ is the test "
                "split), a flat tree has only class folders"
            )
        reject_test_fraction(f"{name} {root}/ (train/ + val/)", test_fraction)
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
    else:
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
