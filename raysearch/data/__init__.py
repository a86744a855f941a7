"""Datasets and their train/validation/test splits.

A dataset is registered as a plain function in ``_DATASETS`` that takes the keyword-only arguments
``seed``, ``val_fraction``, ``test_fraction``, ``data_dir``, ``download`` and ``imbalance_ratio``
(``None`` fractions meaning the dataset's defaults, listed in ``_DEFAULTS``) and returns a
:class:`DatasetSplits`; the segmentation loaders (``_SEGMENTATION``) also take ``crop_size`` and
``verify``. To add one, write its loader in a module of this package (``digits.py``; the on-disk
image datasets are in ``vision.py``, the segmentation datasets ``voc`` and ``segfolder`` in
``segmentation.py``), import it here and add it to both dicts.

Splits. ``digits`` (no official test split) is split by seed into train/val/test (shares of all
samples, default 0.6/0.2/0.2). Datasets with an official test split (``cifar10``, ``cifar100``,
``svhn``, ``mnist``, ``fashion_mnist``, ``tiny_imagenet`` (its labelled ``val/``), and
``imagefolder`` trees with ``train/`` and ``val/``) test on it; `val_fraction` (default 0.1) of
their official training split is carved as validation, stratified with ``random_state=seed``.
With `imbalance_ratio` the training pool is long-tailed first (:func:`long_tail_indices`, Jung
et al. App. C); test stays balanced. Segmentation (``task="segmentation"``, one label per pixel,
``ignore_index=255``): ``voc`` tests on VOC 2012's ``val.txt`` and carves validation at random
(not stratified) from its training list; ``segfolder`` uses its ``splits/`` files or a random
split by seed (see :mod:`raysearch.data.segmentation`).

Example:
    >>> from raysearch.data import load_dataset
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

from raysearch.data.digits import DIGITS_TEST_FRACTION, DIGITS_VAL_FRACTION, load_digits
from raysearch.data.splits import (
    IMAGEFOLDER_TEST_FRACTION,
    IMAGEFOLDER_VAL_FRACTION,
    OFFICIAL_VAL_FRACTION,
    DatasetError,
    DatasetSplits,
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
        module = importlib.import_module(f"raysearch.data.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'raysearch.data' has no attribute {name!r}")


def _lazy_loader(module: str, loader: str) -> Callable[..., DatasetSplits]:
    """A loader of ``raysearch.data.<module>``, imported on its first call."""

    def load(**kwargs: Any) -> DatasetSplits:
        return getattr(importlib.import_module(f"raysearch.data.{module}"), loader)(**kwargs)

    load.__name__ = load.__qualname__ = loader
    load.__doc__ = f"``raysearch.data.{module}.{loader}`` (imported on first use)."
    return load


def _vision(loader: str) -> Callable[..., DatasetSplits]:
    """A loader of :mod:`raysearch.data.vision`, imported on its first call."""
    return _lazy_loader("vision", loader)


def _segmentation(loader: str) -> Callable[..., DatasetSplits]:
    """A loader of :mod:`raysearch.data.segmentation`, imported on its first call."""
    return _lazy_loader("segmentation", loader)


__all__ = [
    "CropFlip",
    "DatasetError",
    "DatasetSplits",
    "ImageFileDataset",
    "ImageTensorDataset",
    "SegmentationDataset",
    "available_datasets",
    "dataset_defaults",
    "dataset_task",
    "load_dataset",
    "long_tail_counts",
    "long_tail_indices",
    "stratified_split_indices",
]

_DATASETS: dict[str, Callable[..., DatasetSplits]] = {
    "digits": load_digits,
    **{name: _vision(f"load_{name}") for name in (
        "cifar10", "cifar100", "svhn", "mnist", "fashion_mnist", "tiny_imagenet", "imagefolder")},
    "voc": _segmentation("load_voc"),
    "segfolder": _segmentation("load_segfolder"),
    "cub200": _lazy_loader("cub", "load_cub200"),
    "newsgroups20": _lazy_loader("text", "load_newsgroups20"),
}

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
    """Names accepted by :func:`load_dataset`, sorted."""
    return sorted(_DATASETS)


def _check_name(name: str) -> None:
    if name not in _DATASETS:
        raise ValueError(f"Unknown dataset {name!r}; available: {', '.join(available_datasets())}")


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
    name: str,
    *,
    seed: int = 0,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
    crop_size: int | None = None,
    verify: bool = False,
) -> DatasetSplits:
    """Load a dataset and split it into train, validation and test sets.

    Args:
        name (str): dataset name, one of :func:`available_datasets`.
        seed (int, optional): seed of the split and of the long tail, in [0, 2**32 - 1]. The same
            seed gives the same split. Defaults to ``0``.
        val_fraction (float, optional): validation share in (0, 1): of all samples for
            ``digits``, flat ``imagefolder`` trees and ``segfolder`` folders without
            ``splits/``, of the official training split (list) otherwise. Defaults to ``None``
            (:func:`dataset_defaults`).
        test_fraction (float, optional): test share of all samples in (0, 1), for ``digits``,
            flat ``imagefolder`` trees and ``segfolder`` folders without ``splits/`` only.
            Defaults to ``None`` (:func:`dataset_defaults`).
        data_dir (str | os.PathLike, optional): folder of the on-disk dataset (see each loader
            in :mod:`raysearch.data.vision` and :mod:`raysearch.data.segmentation`); unused by
            ``digits``. Defaults to ``None``.
        download (bool, optional): download into `data_dir` when the files are missing (never
            otherwise). Defaults to ``False``.
        imbalance_ratio (float, optional): long-tailed training pool with
            ``n_i = floor(n_max * ratio ** (-i / (K - 1)))`` samples of class i
            (:func:`long_tail_counts`), >= 1; ``None`` keeps every sample; classification
            only. Defaults to ``None``.
        crop_size (int, optional): segmentation only: side S of the square training crops and
            evaluation canvases (items ``(3, S, S)``, ``(S, S)``), >= 1; ``None`` means 512.
            Must be ``None`` for classification datasets. Defaults to ``None``.
        verify (bool, optional): segmentation only: decode every mask now and check its values
            and size (about 0.5 to 1 s per 1,000 VOC masks; the sweep's driver does it once before
            Ray starts); otherwise a bad mask raises when it is read. No effect on
            classification datasets (their loaders check their files anyway). Defaults to
            ``False``.

    Returns:
        DatasetSplits: the three splits (x float32 (C, H, W), y int; segmentation: y int64
        (S, S)), with ``info`` describing the split, ``task`` and ``ignore_index``.

    Raises:
        ValueError: if `name` is not registered, `seed` is out of range, a fraction is outside
            (0, 1), `val_fraction` + `test_fraction` >= 1, `imbalance_ratio` < 1, `crop_size`
            < 1, or `crop_size` is given for a classification dataset.
        TypeError: if `seed` is not an int or `download` or `verify` not a bool.
        DatasetError: (a ValueError) if the files are missing or corrupt, `data_dir` is needed
            and ``None``, `test_fraction` is given for a dataset with an official test split,
            a download fails or is asked for ``imagefolder``, ``segfolder`` or ``voc`` (never
            downloaded), or `imbalance_ratio` is given for a segmentation dataset.
    """
    _check_name(name)
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
    if crop_size is not None and name not in _SEGMENTATION:
        raise ValueError(
            f"`crop_size` applies to the segmentation datasets "
            f"({', '.join(sorted(_SEGMENTATION))}) only; {name} keeps its own image size "
            f"(got crop_size={crop_size})"
        )
    kwargs: dict[str, Any] = {
        "seed": seed,
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "data_dir": data_dir,
        "download": download,
        "imbalance_ratio": imbalance_ratio,
    }
    if name in _SEGMENTATION:
        kwargs["crop_size"] = _DEFAULT_CROP_SIZE if crop_size is None else crop_size
        kwargs["verify"] = verify
    return _DATASETS[name](**kwargs)


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))
