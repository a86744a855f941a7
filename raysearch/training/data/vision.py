"""Image datasets from a local ``data_dir`` in their standard on-disk formats.

Loaders (registered in :mod:`raysearch.training.data`): :func:`load_cifar10`, :func:`load_cifar100`,
:func:`load_svhn`, :func:`load_mnist`, :func:`load_fashion_mnist`, :func:`load_tiny_imagenet`,
:func:`load_imagefolder`. Each takes the keyword-only arguments of
:func:`raysearch.training.data.load_dataset` and returns a
:class:`~raysearch.training.data.DatasetSplits`.

Files are read through torchvision's readers (``CIFAR10``/``CIFAR100``, ``SVHN``, ``MNIST``/
``FashionMNIST``, ``ImageFolder``'s ``find_classes``/``make_dataset``). torchvision's integrity
checks compare md5 sums, which only the official files match; the subclasses here replace them
by a presence and structure check, so a real download still works, small files written by tests
load, and a missing or corrupt file is a one-line :class:`~raysearch.training.data.DatasetError`
naming it. Nothing is downloaded unless ``download=True``.

Splits. These datasets have an official test split (Tiny-ImageNet: its labelled ``val/``;
ImageFolder: ``val/`` when the tree has ``train/`` and ``val/``), which is the test set here.
Validation is a stratified share of the official training split (default 10%,
``random_state=seed``), carved AFTER the optional long tail (:func:`~raysearch.training.data.
long_tail_indices` on the whole training split, as Jung et al., App. C); test stays balanced.

In-memory datasets (all but ``imagefolder``) are decoded once per process: the raw readers are
cached (``functools.lru_cache``) by resolved path and file sizes/modification times, so a Ray
worker that runs several trials reads the files once. The cached tensors are shared by the
returned test splits; do not modify them in place.

Layout: the loaders live in :mod:`raysearch.training.data.vision_arrays` (CIFAR, SVHN, MNIST,
Fashion-MNIST: array files decoded in memory) and :mod:`raysearch.training.data.vision_trees`
(Tiny-ImageNet, ImageFolder trees: trees of image files), over the shared helpers of
:mod:`raysearch.training.data._vision_common`. This module re-exports every name of the three (the
registry of :mod:`raysearch.training.data` imports ``raysearch.training.data.vision:load_<name>``)
and holds :func:`clear_cache`, which empties the caches of both families.
"""

from __future__ import annotations

from raysearch.training.data._vision_common import _check_labels as _check_labels
from raysearch.training.data._vision_common import _download as _download
from raysearch.training.data._vision_common import _in_memory_splits as _in_memory_splits
from raysearch.training.data._vision_common import (
    _official_split_indices as _official_split_indices,
)
from raysearch.training.data._vision_common import _pct as _pct
from raysearch.training.data._vision_common import _RawImages as _RawImages
from raysearch.training.data._vision_common import _require_data_dir as _require_data_dir
from raysearch.training.data._vision_common import _resolve_folder as _resolve_folder
from raysearch.training.data._vision_common import _resolve_val_fraction as _resolve_val_fraction
from raysearch.training.data._vision_common import _stamp as _stamp
from raysearch.training.data._vision_common import logger as logger
from raysearch.training.data.images import CropFlip as CropFlip
from raysearch.training.data.images import ImageFileDataset as ImageFileDataset
from raysearch.training.data.images import ImageTensorDataset as ImageTensorDataset
from raysearch.training.data.images import imagenet_transforms as imagenet_transforms
from raysearch.training.data.images import read_rgb as read_rgb
from raysearch.training.data.splits import IMAGEFOLDER_TEST_FRACTION, IMAGEFOLDER_VAL_FRACTION
from raysearch.training.data.splits import OFFICIAL_VAL_FRACTION as OFFICIAL_VAL_FRACTION
from raysearch.training.data.splits import DatasetError as DatasetError
from raysearch.training.data.splits import DatasetSplits as DatasetSplits
from raysearch.training.data.splits import carve_validation as carve_validation
from raysearch.training.data.splits import check_fraction_sum as check_fraction_sum
from raysearch.training.data.splits import class_counts_text as class_counts_text
from raysearch.training.data.splits import long_tail_indices as long_tail_indices
from raysearch.training.data.splits import reject_test_fraction as reject_test_fraction
from raysearch.training.data.splits import three_way_split as three_way_split
from raysearch.training.data.vision_arrays import _CIFAR as _CIFAR
from raysearch.training.data.vision_arrays import _CIFAR_CHECKED as _CIFAR_CHECKED
from raysearch.training.data.vision_arrays import _CIFAR_CLASSES as _CIFAR_CLASSES
from raysearch.training.data.vision_arrays import _IDX_DATASETS as _IDX_DATASETS
from raysearch.training.data.vision_arrays import _IDX_FILES as _IDX_FILES
from raysearch.training.data.vision_arrays import _IN_MEMORY_CACHE_SIZE as _IN_MEMORY_CACHE_SIZE
from raysearch.training.data.vision_arrays import _SVHN_FILES as _SVHN_FILES
from raysearch.training.data.vision_arrays import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    MNIST_MEAN,
    MNIST_STD,
    SVHN_MEAN,
    SVHN_STD,
    load_cifar10,
    load_cifar100,
    load_fashion_mnist,
    load_mnist,
    load_svhn,
)
from raysearch.training.data.vision_arrays import _checked_cifar_class as _checked_cifar_class
from raysearch.training.data.vision_arrays import _CheckedFashionMNIST as _CheckedFashionMNIST
from raysearch.training.data.vision_arrays import _CheckedMNIST as _CheckedMNIST
from raysearch.training.data.vision_arrays import _CheckedSVHN as _CheckedSVHN
from raysearch.training.data.vision_arrays import _cifar_file_problem as _cifar_file_problem
from raysearch.training.data.vision_arrays import _cifar_problem as _cifar_problem
from raysearch.training.data.vision_arrays import _CifarSpec as _CifarSpec
from raysearch.training.data.vision_arrays import _idx_header as _idx_header
from raysearch.training.data.vision_arrays import _idx_problem as _idx_problem
from raysearch.training.data.vision_arrays import _IdxMixin as _IdxMixin
from raysearch.training.data.vision_arrays import _load_cifar as _load_cifar
from raysearch.training.data.vision_arrays import _load_idx as _load_idx
from raysearch.training.data.vision_arrays import _read_cifar as _read_cifar
from raysearch.training.data.vision_arrays import _read_idx as _read_idx
from raysearch.training.data.vision_arrays import _read_svhn as _read_svhn
from raysearch.training.data.vision_arrays import _svhn_file_problem as _svhn_file_problem
from raysearch.training.data.vision_trees import _TINY_FOLDER as _TINY_FOLDER
from raysearch.training.data.vision_trees import _TINY_SIZE as _TINY_SIZE
from raysearch.training.data.vision_trees import (
    IMAGE_SIZE,
    TINY_IMAGENET_MEAN,
    TINY_IMAGENET_STD,
    TINY_IMAGENET_URL,
    load_imagefolder,
    load_tiny_imagenet,
)
from raysearch.training.data.vision_trees import _decode_all as _decode_all
from raysearch.training.data.vision_trees import _read_tiny_imagenet as _read_tiny_imagenet
from raysearch.training.data.vision_trees import _scan_folder as _scan_folder
from raysearch.training.data.vision_trees import _scan_tiny_imagenet as _scan_tiny_imagenet
from raysearch.training.data.vision_trees import _tiny_imagenet_problem as _tiny_imagenet_problem

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


def clear_cache() -> None:
    """Drop the per-process cache of decoded datasets (frees their memory)."""
    for reader in (_read_cifar, _read_svhn, _read_idx, _read_tiny_imagenet):
        reader.cache_clear()
