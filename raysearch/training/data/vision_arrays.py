"""In-memory image datasets stored as array files: CIFAR-10/100, SVHN, MNIST, Fashion-MNIST.

Loaders (registered in :mod:`raysearch.training.data` through :mod:`raysearch.training.data.vision`,
which re-exports everything here): :func:`load_cifar10`, :func:`load_cifar100` (python-version
pickles), :func:`load_svhn` (``*_32x32.mat``), :func:`load_mnist`, :func:`load_fashion_mnist`
(uncompressed idx files), with their per-channel normalisation statistics. Each file is checked
for presence and structure instead of torchvision's md5 sums, decoded once per process
(``functools.lru_cache`` keyed by path and file stamps) and split by
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
    _check_labels,
    _download,
    _in_memory_splits,
    _RawImages,
    _require_data_dir,
    _resolve_folder,
    _stamp,
)
from raysearch.training.data.images import CropFlip
from raysearch.training.data.splits import DatasetError, DatasetSplits, reject_test_fraction

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100_MEAN", "CIFAR100_STD", "FASHION_MNIST_MEAN",
           "FASHION_MNIST_STD", "MNIST_MEAN", "MNIST_STD", "SVHN_MEAN", "SVHN_STD",
           "load_cifar10", "load_cifar100", "load_fashion_mnist", "load_mnist", "load_svhn"]

#: Per-channel statistics in [0, 1] pixel units (of the training splits).
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
SVHN_MEAN, SVHN_STD = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)

_IN_MEMORY_CACHE_SIZE = 4


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

