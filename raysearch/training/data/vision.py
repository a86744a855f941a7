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

Layout: the loaders live in one module per file format, over the shared helpers of
:mod:`raysearch.training.data._vision_common`: :mod:`~raysearch.training.data.cifar` (CIFAR-10/100),
:mod:`~raysearch.training.data.svhn` (SVHN) and :mod:`~raysearch.training.data.mnist` (MNIST,
Fashion-MNIST) decode array files in memory; :mod:`~raysearch.training.data.vision_trees`
(Tiny-ImageNet, ImageFolder trees) reads trees of image files. This module gathers their loaders
and statistics (the registry of :mod:`raysearch.training.data` imports
``raysearch.training.data.vision:load_<name>``) and holds :func:`clear_cache`, which empties the
caches of all of them.
"""

from __future__ import annotations

from raysearch.training.data import cifar, mnist, svhn, vision_trees
from raysearch.training.data.cifar import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    load_cifar10,
    load_cifar100,
)
from raysearch.training.data.mnist import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    MNIST_MEAN,
    MNIST_STD,
    load_fashion_mnist,
    load_mnist,
)
from raysearch.training.data.splits import IMAGEFOLDER_TEST_FRACTION, IMAGEFOLDER_VAL_FRACTION
from raysearch.training.data.svhn import SVHN_MEAN, SVHN_STD, load_svhn
from raysearch.training.data.vision_trees import (
    IMAGE_SIZE,
    TINY_IMAGENET_MEAN,
    TINY_IMAGENET_STD,
    TINY_IMAGENET_URL,
    load_imagefolder,
    load_tiny_imagenet,
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


def clear_cache() -> None:
    """Drop the per-process cache of decoded datasets (frees their memory)."""
    for module in (cifar, svhn, mnist, vision_trees):
        module.clear_cache()
