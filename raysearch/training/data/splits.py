"""Split results and split helpers shared by every loader.

:class:`DatasetSplits`, :class:`DatasetError`, the checks of a factory's splits
(:func:`check_splits`, :func:`check_finite_inputs`), stratified train/val/test indices and
long-tailed subsets.

Kept apart from ``raysearch/training/data/__init__.py`` so that the loader modules can import these
names at module level without a circular import; ``raysearch.training.data`` re-exports all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset

__all__ = [
    "OFFICIAL_VAL_FRACTION",
    "TASKS",
    "DatasetError",
    "DatasetSplits",
    "FINITE_CHECK_SAMPLES",
    "carve_validation",
    "check_finite_inputs",
    "class_counts_text",
    "long_tail_counts",
    "long_tail_indices",
    "reject_test_fraction",
    "stratified_split_indices",
    "three_way_split",
]

#: Items read at each end of a split held in files by :func:`check_finite_inputs`.
FINITE_CHECK_SAMPLES = 32

#: Values of :attr:`DatasetSplits.task`.
TASKS = ("classification", "segmentation")

#: Default share of an official training split carved out as validation (CIFAR: 5,000 of 50,000).
OFFICIAL_VAL_FRACTION = 0.1
#: ``imagefolder`` trees without train/ and val/: default validation and test shares of all images.
IMAGEFOLDER_VAL_FRACTION = 0.1
IMAGEFOLDER_TEST_FRACTION = 0.2


@dataclass
class DatasetSplits:
    """Train, validation and test splits of one dataset: what every dataset factory returns.

    Only `train`, `val`, `test` and `num_classes` are required; the rest is optional or
    inferred. Items are ``(x, y)`` pairs of any shape: images ``(C, H, W)``, token sequences
    ``(L,)``, tabular features ``(F,)``; ``y`` an int class (classification) or an int mask
    (segmentation). The loop, the metrics, post-hoc calibration and the plots take them as
    they come: nothing downstream depends on the dataset's name.

    Attributes:
        train: training split, a map-style ``Dataset`` of ``(x, y)`` (``digits``: a
            ``TensorDataset``; in-memory image sets: an
            :class:`~raysearch.training.data.images.ImageTensorDataset` that augments;
            ``imagefolder``: an :class:`~raysearch.training.data.images.ImageFileDataset`;
            segmentation sets: a :class:`~raysearch.training.data.segmentation.SegmentationDataset`
            of ``(x float32 (3, S, S), y int64 (S, S))``). A ``TensorDataset`` is moved to the
            training device once and batched by indexing; any other dataset goes through a
            ``DataLoader``.
        val: validation split (same layout, never augmented); used for per-epoch metrics and
            model selection.
        test: test split (same layout, never augmented); evaluated once after training.
        num_classes: number of classes K (>= 2); labels are in [0, K) (segmentation: or
            `ignore_index`).
        input_shape: shape of one ``x`` as the model receives it ((C, H, W), (L,), (F,));
            ``None``: inferred from the first training item.
        name: dataset name (the registry name or import string; ``load_dataset`` fills it in
            when empty).
        class_names: name of class i at position i, or ``None`` when unknown.
        info: how the split was made, for MLflow params (plain str/int/float values):
            ``train_size``, ``val_size``, ``test_size``, ``val_split`` (readable), ``val_fraction``
            (the value used), and with a long tail ``imbalance_ratio`` and ``class_counts``
            (comma-separated per-class training counts before the validation carve, class 0
            first). Sizes are filled in when missing.
        task: ``"classification"`` (the default: one label per sample, items ``(x, y int)``) or
            ``"segmentation"`` (one label per pixel, items ``(x float32 (C, H, W), y int64
            (H, W))``; its primary metric is mIoU, see :mod:`raysearch.training.data.segmentation`).
        ignore_index: target value that marks pixels to leave out of the loss and the metrics
            (``255`` for the segmentation datasets: VOC object boundaries, void and padding), or
            ``None`` when every target counts (classification).
        model_kwargs: keyword arguments the data offers to the model factory, passed when the
            factory takes them (a text dataset's ``vocabulary``); empty by default.

    Raises:
        ValueError: if `task` is neither ``"classification"`` nor ``"segmentation"``.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, ...] | None = None
    name: str = ""
    class_names: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    task: str = "classification"
    ignore_index: int | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"`task` must be one of {', '.join(TASKS)}, got {self.task!r}")

    @property
    def primary_metric(self) -> str:
        """The accuracy axis of the front and the rule: ``miou`` (segmentation) or ``accuracy``.

        Logged as ``val_<name>`` and ``test_<name>``.
        """
        return "miou" if self.task == "segmentation" else "accuracy"


def _labels_of(dataset: Any) -> Any:
    """All labels of a split when they are at hand without reading its inputs, else None."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, tuple) and len(tensors) >= 2:
        return tensors[1]
    for attr in ("labels", "targets"):
        value = getattr(dataset, attr, None)
        if value is not None and not callable(value):
            return value
    return None


def check_splits(splits: Any, label: str, *, items: bool = True) -> DatasetSplits:
    """Check what a dataset factory returned against the contract; fill in what is inferred.

    Fills `name` (with `label`), `input_shape` (the first training item's shape) and the
    ``*_size`` entries of `info` when missing.

    Args:
        splits: the factory's return value.
        label: the dataset's name or import string, for messages.
        items: check labels and items; False checks only the type, `num_classes` and the
            splits' sizes (for loaders that check their own files).

    Returns:
        DatasetSplits: `splits`, completed.

    Raises:
        ValueError: one line naming the dataset and what is wrong: not a
            :class:`DatasetSplits`; `num_classes` not an int >= 2; a split that is not a sized
            map-style dataset or is empty; an item that is not an ``(x, y)`` pair; labels
            outside [0, num_classes) (every label where the split holds them as a tensor or
            a ``labels``/``targets`` attribute, else the first items).
    """
    if not isinstance(splits, DatasetSplits):
        raise ValueError(f"dataset {label!r} returned {type(splits).__name__}, expected "
                         "raysearch.DatasetSplits(train=..., val=..., test=..., num_classes=...)")
    k = splits.num_classes
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise ValueError(f"dataset {label!r} returned num_classes={k!r}, expected an int >= 2")
    splits.num_classes = int(k)
    for part in ("train", "val", "test"):
        dataset = getattr(splits, part)
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise ValueError(f"dataset {label!r}: its {part} split is a "
                             f"{type(dataset).__name__}, expected a map-style torch Dataset "
                             "(with __len__ and __getitem__), e.g. a TensorDataset")
        if len(dataset) == 0:
            raise ValueError(f"dataset {label!r}: its {part} split is empty")
        splits.info.setdefault(f"{part}_size", len(dataset))
        if items:
            _check_labels(dataset, splits, label, part)
    if not splits.name:
        splits.name = label
    if splits.input_shape is None:
        first = splits.train[0][0]
        splits.input_shape = tuple(int(d) for d in getattr(first, "shape", ()))
    else:
        splits.input_shape = tuple(int(d) for d in splits.input_shape)
    return splits


def _check_labels(dataset: Any, splits: DatasetSplits, label: str, part: str) -> None:
    k, ignore = splits.num_classes, splits.ignore_index
    labels = _labels_of(dataset)
    if labels is None:  # a file-backed split: look at its first items only
        items = [dataset[i] for i in range(min(len(dataset), 4))]
        for item in items:
            if not isinstance(item, (tuple, list)) or len(item) < 2:
                raise ValueError(f"dataset {label!r}: an item of its {part} split is a "
                                 f"{type(item).__name__}, expected an (x, y) pair")
        labels = [np.asarray(item[1]) for item in items]
        values = np.concatenate([v.reshape(-1) for v in labels]) if labels else np.zeros(0)
    else:
        values = np.asarray(labels.cpu() if hasattr(labels, "cpu") else labels).reshape(-1)
    if values.size == 0:
        return
    if not np.issubdtype(values.dtype, np.integer):
        if not np.all(np.mod(values, 1) == 0):
            raise ValueError(f"dataset {label!r}: its {part} labels are {values.dtype} values "
                             f"such as {values[np.mod(values, 1) != 0][0]!r}, expected class "
                             "indices (ints)")
    bad = (values < 0) | (values >= k)
    if ignore is not None:
        bad &= values != ignore
    if bad.any():
        raise ValueError(f"dataset {label!r}: its {part} split has label "
                         f"{int(values[bad][0])}, outside [0, {k}) (num_classes={k})")


def _inputs_in_memory(dataset: Any) -> Any:
    """All inputs of a split held in memory (a tensor or array), else None.

    A ``TensorDataset``'s first tensor, a dataset's ``images`` tensor or array (such as an
    :class:`~raysearch.training.data.images.ImageTensorDataset`), or those of the dataset under
    a ``torch.utils.data.Subset``, indexed by it.
    """
    from torch.utils.data import Subset, TensorDataset

    if isinstance(dataset, Subset):
        inner = _inputs_in_memory(dataset.dataset)
        return None if inner is None else inner[np.asarray(dataset.indices, dtype=np.int64)]
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[0]
    images = getattr(dataset, "images", None)
    if (hasattr(images, "shape") and hasattr(images, "dtype") and not isinstance(images, np.memmap)
            and len(images) == len(dataset)):
        return images
    return None


def _non_finite(values: Any, rows: int = 4096) -> int:
    """How many values of a tensor, array or nested sequence are NaN or +-inf (by blocks)."""
    import torch

    if isinstance(values, torch.Tensor):
        if not (values.is_floating_point() or values.is_complex()):
            return 0
        if values.ndim == 0:
            return int(not bool(torch.isfinite(values)))
        return sum(int((~torch.isfinite(values[i:i + rows])).sum())
                   for i in range(0, len(values), rows))
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.inexact):
        return 0
    if array.ndim == 0:
        return int(not np.isfinite(array))
    return sum(int((~np.isfinite(array[i:i + rows])).sum()) for i in range(0, len(array), rows))


def check_finite_inputs(splits: DatasetSplits, label: str, *,
                        sample: int = FINITE_CHECK_SAMPLES) -> None:
    """Refuse a split whose inputs hold NaN or inf: every trial would diverge on it.

    A split held in memory (a ``TensorDataset``, a dataset with an ``images`` tensor or array
    that is not a memory map, a ``Subset`` of one) is checked whole, by blocks of rows; any
    other split (read from files item by item) on its first and last `sample` items (none with
    ``sample=0``). Integer inputs (uint8 images, token ids) are finite.

    Args:
        splits: the dataset's splits (checked by :func:`check_splits`).
        label: the dataset's name or import string, for the message.
        sample: items read at each end of a split held in files. Defaults to
            :data:`FINITE_CHECK_SAMPLES` (32).

    Raises:
        ValueError: one line naming the dataset, the split and how many values
            (``dataset 'mypkg.data:load' train split: 12 non-finite input values (NaN or
            inf)``; for a split held in files ``... in its first and last 32 items``).
    """
    for part in ("train", "val", "test"):
        dataset = getattr(splits, part)
        inputs = _inputs_in_memory(dataset)
        where = ""
        if inputs is not None:
            bad = _non_finite(inputs)
        else:
            n = len(dataset)
            index = sorted(set(range(min(sample, n))) | set(range(max(n - sample, 0), n)))
            bad = sum(_non_finite(dataset[i][0]) for i in index)
            where = (f" in its first and last {sample} items" if n > 2 * sample
                     else f" in its {n} items")
        if bad:
            raise ValueError(f"dataset {label!r} {part} split: {bad} non-finite input "
                             f"value{'s' if bad != 1 else ''} (NaN or inf){where}; every trial "
                             "would diverge on them: clean or impute them in the dataset")


class DatasetError(ValueError):
    """A dataset is missing, incomplete or corrupt on disk, or cannot be split as asked.

    The message is one line: the dataset, the expected path and layout, what is missing or
    corrupt, and "pass --download" where the dataset can be downloaded. Newlines in the message
    are replaced by spaces.
    """

    def __init__(self, message: str) -> None:
        super().__init__(str(message).replace("\r", " ").replace("\n", " "))


def reject_test_fraction(name: str, test_fraction: float | None) -> None:
    """Raise if a `test_fraction` is given for a dataset with its own test split.

    Args:
        name (str): dataset name, quoted in the message.
        test_fraction (float, optional): the value the caller passed (``None``: not passed).

    Raises:
        DatasetError: if `test_fraction` is not ``None``.
    """
    if test_fraction is not None:
        raise DatasetError(
            f"{name} has its own test split; `test_fraction` applies to digits and to "
            f"imagefolder trees without val/ (got test_fraction={test_fraction})"
        )


def check_fraction_sum(val_fraction: float, test_fraction: float) -> None:
    """Raise ValueError if `val_fraction` + `test_fraction` >= 1 (shares of all samples)."""
    if val_fraction + test_fraction >= 1:
        raise ValueError(
            f"`val_fraction` + `test_fraction` must be < 1, got {val_fraction} + {test_fraction}"
        )


def stratified_split_indices(
    labels: np.ndarray, *, seed: int, val_fraction: float, test_fraction: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stratified train/val/test indices, in two ``train_test_split`` steps.

    First `test_fraction` of all samples is held out as test, then `val_fraction` of all samples
    (``val_fraction / (1 - test_fraction)`` of the rest) as validation; both steps stratify on the
    labels and use ``random_state=seed``.

    Args:
        labels (np.ndarray): (N,) integer class labels.
        seed (int): ``random_state`` of both steps, in [0, 2**32 - 1].
        val_fraction (float): share of all samples for validation, in (0, 1).
        test_fraction (float): share of all samples for test, in (0, 1).

    Returns:
        tuple[np.ndarray, np.ndarray, np.ndarray]: sorted int64 indices of train, val and test;
        disjoint, and together they cover ``range(N)``.

    Raises:
        ValueError: from scikit-learn, if a class has too few samples to stratify.
    """
    labels = np.asarray(labels)
    index = np.arange(len(labels))
    rest, test = train_test_split(
        index, test_size=test_fraction, stratify=labels, random_state=seed
    )
    train, val = train_test_split(
        rest,
        test_size=val_fraction / (1.0 - test_fraction),
        stratify=labels[rest],
        random_state=seed,
    )
    return np.sort(train), np.sort(val), np.sort(test)


def long_tail_counts(class_counts: Sequence[int], ratio: float) -> list[int]:
    """Per-class sample counts of a long-tailed subset (Jung et al., App. C, Eq. 16).

    ``n_i = min(count_i, floor(n_max * (1 / ratio) ** (i / (K - 1))))`` for class ``i`` of K,
    with ``n_max = max(class_counts)``: class 0 keeps ``n_max`` samples and class K - 1 keeps
    ``n_max / ratio``, exponentially decaying in between (the issue's
    ``n_i = n_max * ratio ** (-i / (K - 1))``). The power is computed as
    ``(1 / ratio) ** (i / (K - 1))`` and floored with ``int()``, exactly as the CIFAR-LT code of
    Cao et al. (LDAM, 2019) and Tang et al. (2020) with ``imb_factor = 1 / ratio``; flooring
    (not rounding) reproduces the totals published by Jung et al.: CIFAR-10 with ratio 10 keeps
    20,431 of 50,000 images and CIFAR-100 with ratio 10 keeps 19,573 (rounding would give 20,434
    and 19,629).

    References:
        Jung et al., "Scaling of Class-wise Training Losses for Post-hoc Calibration", ICML 2023,
        App. C, Eq. 16. Tang et al., "Long-Tailed Classification by Keeping the Good and Removing
        the Bad Momentum Causal Effect", NeurIPS 2020.

    Args:
        class_counts (Sequence[int]): (K,) number of available samples per class, >= 0.
        ratio (float): imbalance ratio ``n_max / n_min`` (rho), finite and >= 1; ``1`` keeps
            every sample.

    Returns:
        list[int]: (K,) counts, each at most the available count of its class.

    Raises:
        ValueError: if `ratio` is not a finite number >= 1, or a count is negative or not an
            integer.
    """
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float, np.integer, np.floating)):
        raise ValueError(f"`ratio` must be a number >= 1, got {ratio!r}")
    if not math.isfinite(ratio) or ratio < 1:
        raise ValueError(f"`ratio` must be a finite number >= 1, got {ratio}")
    counts = [int(c) for c in class_counts]
    if any(c < 0 or c != orig for c, orig in zip(counts, class_counts, strict=True)):
        raise ValueError(f"`class_counts` must be non-negative integers, got {list(class_counts)}")
    k = len(counts)
    if k <= 1:
        return counts
    n_max = max(counts)
    factor = 1.0 / float(ratio)
    return [min(count, int(n_max * factor ** (i / (k - 1.0)))) for i, count in enumerate(counts)]


def long_tail_indices(
    labels: np.ndarray, ratio: float, *, seed: int, num_classes: int | None = None
) -> np.ndarray:
    """Indices of a long-tailed subset: ``long_tail_counts`` samples of each class.

    The samples kept of class i are the first ``counts[i]`` of that class in the order of
    ``numpy.random.default_rng(seed).permutation(N)``.

    Args:
        labels (np.ndarray): (N,) integer class labels in [0, K).
        ratio (float): imbalance ratio (see :func:`long_tail_counts`), >= 1.
        seed (int): seed of the permutation that picks the kept samples, >= 0.
        num_classes (int, optional): K; class i's share decays with i / (K - 1), so pass it when
            the last classes may be absent from `labels`. Defaults to ``labels.max() + 1``.

    Returns:
        np.ndarray: sorted int64 indices into `labels`.

    Raises:
        ValueError: if `labels` is not 1-D, holds negative labels or labels >= `num_classes`, or
            `ratio` is invalid (see :func:`long_tail_counts`).
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"`labels` must be 1-D, got shape {labels.shape}")
    if len(labels) == 0:
        long_tail_counts([], ratio)  # validates `ratio`
        return np.zeros(0, dtype=np.int64)
    labels = labels.astype(np.int64)
    if labels.min() < 0:
        raise ValueError(f"`labels` must be >= 0, got {labels.min()}")
    k = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if labels.max() >= k:
        raise ValueError(f"`labels` must be < `num_classes` ({k}), got {labels.max()}")
    counts = long_tail_counts(np.bincount(labels, minlength=k).tolist(), ratio)
    order = np.random.default_rng(seed).permutation(len(labels))
    kept = [order[labels[order] == c][:n] for c, n in enumerate(counts)]
    return np.sort(np.concatenate(kept)).astype(np.int64)


def class_counts_text(labels: np.ndarray, num_classes: int) -> str:
    """Per-class counts of `labels` as ``"5000,2997,..."`` (class 0 first), for MLflow params."""
    return ",".join(str(int(c)) for c in np.bincount(np.asarray(labels), minlength=num_classes))


def _split(
    name: str,
    index: np.ndarray,
    labels: np.ndarray,
    fraction: float,
    seed: int,
    what: str,
    *,
    words: tuple[str, str, str, str] = ("sample", "samples", "class", "classes"),
    fix: str = "another fraction",
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified ``train_test_split`` of `index` holding out `fraction` (a share or a count).

    `words` (item, items, group, groups) and `fix` only word the DatasetError raised when a
    class is too small to appear on both sides.
    """
    item, items, group, groups = words
    try:
        rest, held = train_test_split(
            index, test_size=fraction, stratify=labels[index], random_state=seed
        )
    except ValueError as err:
        counts = np.bincount(labels[index]) if len(index) else np.zeros(0, dtype=np.int64)
        smallest = int(counts[counts > 0].min()) if (counts > 0).any() else 0
        raise DatasetError(
            f"{name}: cannot carve a stratified {what} split of {fraction:g} from {len(index)} "
            f"{items} of {int((counts > 0).sum())} {groups} (smallest {group}: {smallest}): "
            f"{err}; each {group} needs a {item} on both sides: use more {items} or {fix}"
        ) from err
    return np.asarray(rest, dtype=np.int64), np.asarray(held, dtype=np.int64)


def carve_validation(
    name: str,
    labels: np.ndarray,
    pool: np.ndarray,
    *,
    val_fraction: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified validation carve: `val_fraction` of `pool` (``train_test_split``, seed).

    Args:
        name (str): dataset name, for error messages.
        labels (np.ndarray): (N,) int labels of the whole training set.
        pool (np.ndarray): indices into `labels` to split (all, or a long-tailed subset).
        val_fraction (float): share of `pool` held out, in (0, 1).
        seed (int): ``random_state``.

    Returns:
        tuple[np.ndarray, np.ndarray]: sorted int64 train and val indices into `labels`.

    Raises:
        DatasetError: if a class of `pool` is too small to stratify.
    """
    train, val = _split(
        name, np.asarray(pool), np.asarray(labels), val_fraction, seed, "validation"
    )
    return np.sort(train), np.sort(val)


def three_way_split(
    name: str,
    labels: np.ndarray,
    *,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    imbalance_ratio: float | None = None,
    num_classes: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train/val/test of a dataset without an official test split, optionally long-tailed.

    Test (`test_fraction` of all samples, stratified, ``random_state=seed``) is carved first and
    stays balanced; with `imbalance_ratio` the rest is reduced by :func:`long_tail_indices`; then
    ``val_fraction / (1 - test_fraction)`` of what is left is carved as validation (stratified,
    ``random_state=seed``). Without `imbalance_ratio` this is exactly
    :func:`stratified_split_indices`.

    Args:
        name (str): dataset name, for error messages.
        labels (np.ndarray): (N,) int labels.
        seed (int): seed of both carves and of the long-tail pick.
        val_fraction (float): share of all samples for validation (before the long tail).
        test_fraction (float): share of all samples for test.
        imbalance_ratio (float, optional): long-tail ratio >= 1, or ``None``.
        num_classes (int, optional): K for the long tail. Defaults to ``labels.max() + 1``.

    Returns:
        tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: sorted int64 indices of train,
        val, test, and of the pool the validation was carved from (train + val).

    Raises:
        DatasetError: if a class is too small to stratify.
    """
    labels = np.asarray(labels)
    rest, test = _split(name, np.arange(len(labels)), labels, test_fraction, seed, "test")
    if imbalance_ratio is not None:
        rest = rest[
            long_tail_indices(labels[rest], imbalance_ratio, seed=seed, num_classes=num_classes)
        ]
    # `rest` keeps train_test_split's order: the second carve must see the same order as in
    # stratified_split_indices to give the same split
    train, val = _split(
        name, rest, labels, val_fraction / (1.0 - test_fraction), seed, "validation"
    )
    return np.sort(train), np.sort(val), np.sort(test), np.sort(rest)
