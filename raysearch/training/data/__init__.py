"""Datasets and their train/validation/test splits.

A dataset is a factory ``f(data_dir=..., seed=..., val_fraction=..., **data_params) ->
DatasetSplits`` (``None`` fractions meaning the dataset's defaults, listed in ``_DEFAULTS`` for the
built-ins). The built-in loaders also take ``test_fraction``, ``download`` and
``imbalance_ratio``; the segmentation loaders ``crop_size`` and ``verify``; ``cub200``
``image_size`` and ``resize``. To add a built-in, write its loader in a module of this package
(``digits.py``; the on-disk image datasets are in ``vision.py``, the segmentation datasets
``voc`` and ``segfolder`` in ``segmentation.py``) and add it to ``_DATASETS`` and
``_DEFAULTS``. A user's factory needs no registration: name it by its import string
``package.module:attr``, or declare it as an entry point of the group ``raysearch.datasets``
(:data:`DATASET_REGISTRY`, :mod:`raysearch.registry`).

Splits. ``digits`` (no official test split) is split by seed into train/val/test (shares of all
samples, default 0.6/0.2/0.2). Datasets with an official test split (``cifar10``, ``cifar100``,
``svhn``, ``mnist``, ``fashion_mnist``, ``tiny_imagenet`` (its labelled ``val/``), and
``imagefolder`` trees with ``train/`` and ``val/``) test on it; `val_fraction` (default 0.1) of
their official training split is carved as validation, stratified with ``random_state=seed``.
With `imbalance_ratio` the training pool is long-tailed first (:func:`long_tail_indices`, Jung
et al. App. C); test stays balanced. Segmentation (``task="segmentation"``, one label per pixel,
``ignore_index=255``): ``voc`` tests on VOC 2012's ``val.txt`` and carves validation at random
(not stratified) from its training list; ``segfolder`` uses its ``splits/`` files or a random
split by seed (see :mod:`raysearch.training.data.segmentation`).

Example:
    >>> from raysearch.training.data import load_dataset
    >>> splits = load_dataset("digits", seed=0)
    >>> splits.num_classes, splits.input_shape, len(splits.train)
    (10, (1, 8, 8), 1077)
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable
from typing import Any

from raysearch.registry import (
    Registry,
    accepted_keywords,
    check_keywords,
    object_label,
)
from raysearch.training.data.digits import DIGITS_TEST_FRACTION, DIGITS_VAL_FRACTION, load_digits
from raysearch.training.data.splits import (
    IMAGEFOLDER_TEST_FRACTION,
    IMAGEFOLDER_VAL_FRACTION,
    OFFICIAL_VAL_FRACTION,
    DatasetError,
    DatasetSplits,
    check_splits,
    long_tail_counts,
    long_tail_indices,
    stratified_split_indices,
)

# torchvision (about a second to import) is imported when an image dataset is first used, not
# by every process that imports this package (each trial worker of a digits sweep)
_LAZY = {
    "CropFlip": "images",
    "ImageFileDataset": "images",
    "ImageTensorDataset": "images",
    "SegmentationDataset": "segmentation",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"raysearch.training.data.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'raysearch.training.data' has no attribute {name!r}")


__all__ = [
    "CropFlip",
    "DatasetError",
    "DatasetSplits",
    "ImageFileDataset",
    "ImageTensorDataset",
    "SegmentationDataset",
    "DATASET_REGISTRY",
    "available_datasets",
    "check_splits",
    "dataset_defaults",
    "dataset_factory",
    "dataset_label",
    "dataset_task",
    "load_dataset",
    "long_tail_counts",
    "long_tail_indices",
    "stratified_split_indices",
]

#: The built-in loaders, as import strings: each module is imported on first use (torchvision,
#: about a second to import, only when an image dataset is asked for).
_DATASETS: dict[str, Any] = {
    "digits": load_digits,
    **{name: f"raysearch.training.data.vision:load_{name}" for name in (
        "cifar10", "cifar100", "svhn", "mnist", "fashion_mnist", "tiny_imagenet", "imagefolder")},
    "voc": "raysearch.training.data.segmentation:load_voc",
    "segfolder": "raysearch.training.data.segmentation:load_segfolder",
    "cub200": "raysearch.training.data.cub:load_cub200",
    "newsgroups20": "raysearch.training.data.text:load_newsgroups20",
}

#: Built-in datasets plus the installed plug-ins (entry-point group ``raysearch.datasets``).
DATASET_REGISTRY = Registry("datasets", _DATASETS)

#: Datasets with one label per pixel (``task="segmentation"``); their loaders take `crop_size`
#: and `verify`.
_SEGMENTATION = frozenset({"voc", "segfolder"})
#: Side of the segmentation crops when ``crop_size=None`` (``segmentation.DEFAULT_CROP_SIZE``,
#: repeated here so that this package does not import torchvision).
_DEFAULT_CROP_SIZE = 512

_OFFICIAL = {"val_fraction": OFFICIAL_VAL_FRACTION, "test_fraction": None}
#: Fractions used when ``None`` is passed. A ``None`` test fraction: the official test split.
_DEFAULTS: dict[str, dict[str, float | None]] = {
    "digits": {"val_fraction": DIGITS_VAL_FRACTION, "test_fraction": DIGITS_TEST_FRACTION},
    **{
        name: dict(_OFFICIAL)
        for name in ("cifar10", "cifar100", "svhn", "mnist", "fashion_mnist", "tiny_imagenet")
    },
    # test_fraction applies to trees without train/ + val/ only
    "imagefolder": {
        "val_fraction": IMAGEFOLDER_VAL_FRACTION,
        "test_fraction": IMAGEFOLDER_TEST_FRACTION,
    },
    # voc: test = VOC's val.txt; validation carved from the training list
    "voc": dict(_OFFICIAL),
    # cub200: test = the official test split; validation carved from the official training
    # split (MbLS selected on test)
    "cub200": dict(_OFFICIAL),
    # newsgroups20: validation min(900, train // 10) messages (MbLS's 900); the 20% test share
    # applies to the original tree only (bydate has its own test split)
    "newsgroups20": {"val_fraction": None, "test_fraction": 0.2},
    # test_fraction applies to folders without splits/ only
    "segfolder": {
        "val_fraction": IMAGEFOLDER_VAL_FRACTION,
        "test_fraction": IMAGEFOLDER_TEST_FRACTION,
    },
}

#: Largest seed accepted (scikit-learn's ``random_state`` is a 32-bit unsigned integer).
_MAX_SEED = 2**32 - 1


def available_datasets() -> list[str]:
    """Names accepted by :func:`load_dataset` (built-ins and plug-ins), sorted."""
    return DATASET_REGISTRY.names()


def _check_name(name: str) -> None:
    if name not in _DATASETS:
        DATASET_REGISTRY.get(name)  # an unknown name: the registry's error, with suggestions
        raise ValueError(f"dataset {name!r} is not a built-in dataset")


def dataset_label(name: Any) -> str:
    """The name a dataset is recorded under: as given, or a factory's import string."""
    return name if isinstance(name, str) else object_label(name)


def dataset_factory(name: Any) -> Callable[..., DatasetSplits]:
    """The factory of a dataset name, import string or callable.

    Raises:
        ValueError: for an unknown name (with the closest ones) or an import string that does
            not import.
    """
    return DATASET_REGISTRY.get(name)


def dataset_defaults(name: str) -> dict[str, float | None]:
    """The fractions :func:`load_dataset` uses for `name` when ``None`` is passed.

    Args:
        name (str): dataset name, one of :func:`available_datasets`.

    Returns:
        dict[str, float | None]: ``{"val_fraction": float, "test_fraction": float | None}``;
        ``test_fraction`` is ``None`` for datasets tested on their official test split. For
        ``imagefolder`` the test fraction applies to trees without ``train/`` + ``val/`` only.

    Raises:
        ValueError: if `name` is not registered.
    """
    _check_name(name)
    return dict(_DEFAULTS[name])


def dataset_task(name: str) -> str:
    """``"segmentation"`` for ``voc`` and ``segfolder``, ``"classification"`` otherwise.

    Lets a caller decide, before loading, whether to pass `crop_size` to :func:`load_dataset`.

    Raises:
        ValueError: if `name` is not registered.
    """
    _check_name(name)
    return "segmentation" if name in _SEGMENTATION else "classification"


def load_dataset(
    name: Any,
    *,
    seed: int = 0,
    val_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    test_fraction: float | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
    crop_size: int | None = None,
    verify: bool = False,
    **data_params: Any,
) -> DatasetSplits:
    """Load a dataset and split it into train, validation and test sets.

    The factory contract (built-ins and a user's code alike) is
    ``factory(data_dir=..., seed=..., val_fraction=..., **data_params) -> DatasetSplits``. The
    keyword arguments after `data_dir` are the factory's own: they are passed only when given
    (not ``None``/``False``), and a factory that does not take one is an error, not a silent
    drop.

    Args:
        name (str | callable): dataset name, one of :func:`available_datasets`, an import string
            ``package.module:attr`` of a factory, or the factory itself.
        seed (int, optional): seed of the split and of the long tail, in [0, 2**32 - 1]. The same
            seed gives the same split. Defaults to ``0``.
        val_fraction (float, optional): validation share in (0, 1): of all samples for
            ``digits``, flat ``imagefolder`` trees and ``segfolder`` folders without
            ``splits/``, of the official training split (list) otherwise. Defaults to ``None``
            (the dataset's default, :func:`dataset_defaults`).
        data_dir (str | os.PathLike, optional): folder of the on-disk dataset (see each loader
            in :mod:`raysearch.training.data.vision` and
            :mod:`raysearch.training.data.segmentation`); unused by ``digits``. Defaults to
            ``None``.
        test_fraction (float, optional): built-ins: test share of all samples in (0, 1), for
            ``digits``, flat ``imagefolder`` trees and ``segfolder`` folders without
            ``splits/`` only. Defaults to ``None``.
        download (bool, optional): built-ins: download into `data_dir` when the files are missing
            (never otherwise). Defaults to ``False``.
        imbalance_ratio (float, optional): built-ins: long-tailed training pool with
            ``n_i = floor(n_max * ratio ** (-i / (K - 1)))`` samples of class i
            (:func:`long_tail_counts`), >= 1; classification only. Defaults to ``None``.
        crop_size (int, optional): segmentation datasets only: side S of the square training
            crops and evaluation canvases (items ``(3, S, S)``, ``(S, S)``), >= 1; ``None``
            means 512. Defaults to ``None``.
        verify (bool, optional): segmentation datasets: decode every mask now and check its
            values and size (the sweep's driver does it once before Ray starts). Passed only to
            factories that take it. Defaults to ``False``.
        **data_params: any other keyword argument of the factory (``image_size`` of
            ``cub200``, a user's ``n_features``, ...).

    Returns:
        DatasetSplits: the three splits, with ``info`` describing the split, ``task`` and
        ``ignore_index``; ``name`` is the dataset's name and ``input_shape`` inferred from the
        first training item when the factory left them out.

    Raises:
        ValueError: if `name` is unknown (with the closest names) or does not import; `seed` is
            out of range; a fraction is outside (0, 1); `imbalance_ratio` < 1; `crop_size` < 1;
            the factory takes no keyword that was given (e.g. `crop_size` for an image
            classification dataset); a user's factory raises, returns something that is not a
            :class:`DatasetSplits`, or labels outside [0, num_classes) (one line naming it).
        TypeError: if `seed` is not an int or `download` or `verify` not a bool.
        DatasetError: (a ValueError) if the files are missing or corrupt, `data_dir` is needed
            and ``None``, `test_fraction` is given for a dataset with an official test split,
            a download fails or is asked for ``imagefolder``, ``segfolder`` or ``voc`` (never
            downloaded), or `imbalance_ratio` is given for a segmentation dataset.
    """
    factory = dataset_factory(name)
    label = dataset_label(name)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"`seed` must be an int, got {type(seed).__name__}")
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"`seed` must be in [0, {_MAX_SEED}], got {seed}")
    for arg, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if value is not None and not (_is_number(value) and 0 < value < 1):
            raise ValueError(f"`{arg}` must be in (0, 1), got {value}")
    if imbalance_ratio is not None and not (
        _is_number(imbalance_ratio) and math.isfinite(imbalance_ratio) and imbalance_ratio >= 1
    ):
        raise ValueError(f"`imbalance_ratio` must be a finite number >= 1, got {imbalance_ratio}")
    if not isinstance(download, bool):
        raise TypeError(f"`download` must be a bool, got {type(download).__name__}")
    if not isinstance(verify, bool):
        raise TypeError(f"`verify` must be a bool, got {type(verify).__name__}")
    if crop_size is not None and (
        isinstance(crop_size, bool) or not isinstance(crop_size, int) or crop_size < 1
    ):
        raise ValueError(f"`crop_size` must be an int >= 1, got {crop_size!r}")
    given = {"test_fraction": test_fraction, "imbalance_ratio": imbalance_ratio,
             "crop_size": crop_size, "download": download or None, **data_params}
    params = {k: v for k, v in given.items() if v is not None}
    check_keywords(factory, params, what=f"dataset {label!r}",
                   reserved=("data_dir", "seed", "val_fraction", "verify"))
    if verify and "verify" in accepted_keywords(factory)[0]:
        params["verify"] = True
    builtin = isinstance(name, str) and name in _DATASETS
    if builtin:
        splits = factory(data_dir=data_dir, seed=seed, val_fraction=val_fraction, **params)
    else:
        try:
            splits = factory(data_dir=data_dir, seed=seed, val_fraction=val_fraction, **params)
        except DatasetError:
            raise
        except Exception as exc:  # noqa: BLE001 (a user's factory: one line naming it)
            raise ValueError(f"dataset {label!r} raised {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())}") from None
    # a user's splits are checked item by item; the built-ins check their own files
    return check_splits(splits, label, items=not builtin)


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))
