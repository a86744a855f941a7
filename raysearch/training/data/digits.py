"""scikit-learn's bundled digits: 1797 real 8x8 grey-scale images of 10 classes (no download)."""

from __future__ import annotations

import os

import numpy as np
import sklearn.datasets
import torch
from torch.utils.data import TensorDataset

from raysearch.training.data.splits import (
    DatasetSplits,
    check_fraction_sum,
    class_counts_text,
    three_way_split,
)

__all__ = ["DIGITS_TEST_FRACTION", "DIGITS_VAL_FRACTION", "load_digits"]

#: Default shares of all 1797 samples held out for validation and test.
DIGITS_VAL_FRACTION = 0.2
DIGITS_TEST_FRACTION = 0.2


def load_digits(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
) -> DatasetSplits:
    """Load ``sklearn.datasets.load_digits`` as stratified, standardised splits.

    The split is :func:`~raysearch.training.data.stratified_split_indices` (60/20/20 with the
    default fractions: 1077/360/360 samples). With `imbalance_ratio`, test is carved first (as
    without), the remaining samples are long-tailed
    (:func:`~raysearch.training.data.long_tail_indices`,
    same seed) and ``val_fraction / (1 - test_fraction)`` of what is left becomes validation
    (:func:`~raysearch.training.data.splits.three_way_split`). Pixels (integers 0..16) are
    standardised with ONE scalar mean and ONE scalar standard deviation computed over all pixels of
    the training split (a per-pixel std would be 0 for the always-blank border pixels), so train
    has mean 0 and std 1 and val/test are transformed identically.

    Args:
        seed (int): seed of the split, in [0, 2**32 - 1].
        val_fraction (float, optional): share of all samples for validation, in (0, 1).
            Defaults to ``None`` (0.2).
        test_fraction (float, optional): share of all samples for test, in (0, 1). Defaults to
            ``None`` (0.2).
        data_dir (str, optional): ignored (the data ships with scikit-learn). Defaults to ``None``.
        download (bool, optional): ignored (nothing to download). Defaults to ``False``.
        imbalance_ratio (float, optional): long-tail ratio >= 1 of the train + val pool, or
            ``None``. Defaults to ``None``.

    Returns:
        DatasetSplits: ``TensorDataset`` splits of x float32 (N, 1, 8, 8) and y int64 (N,),
        ``num_classes=10``, ``info`` describing the split.

    Raises:
        ValueError: if `val_fraction` + `test_fraction` >= 1.
        DatasetError: if the long tail leaves a class too small to stratify.
    """
    del data_dir, download  # bundled with scikit-learn
    val_fraction = DIGITS_VAL_FRACTION if val_fraction is None else float(val_fraction)
    test_fraction = DIGITS_TEST_FRACTION if test_fraction is None else float(test_fraction)
    check_fraction_sum(val_fraction, test_fraction)
    raw = sklearn.datasets.load_digits()
    x = raw.data.astype(np.float64)
    y = raw.target.astype(np.int64)
    train, val, test, pool = three_way_split(
        "digits",
        y,
        seed=seed,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        imbalance_ratio=imbalance_ratio,
        num_classes=10,
    )
    mean = x[train].mean()
    std = x[train].std()

    def tensors(index: np.ndarray) -> TensorDataset:
        images = ((x[index] - mean) / std).astype(np.float32).reshape(-1, 1, 8, 8)
        return TensorDataset(torch.from_numpy(images), torch.from_numpy(y[index]))

    info = {
        "train_size": len(train),
        "val_size": len(val),
        "test_size": len(test),
        "val_split": (
            f"stratified {100 * val_fraction:g}% val / {100 * test_fraction:g}% test "
            f"of all {len(y)} samples, seed {seed}"
        ),
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
    }
    if imbalance_ratio is not None:
        info["val_split"] += f", train+val long-tailed (ratio {imbalance_ratio:g})"
        info["imbalance_ratio"] = float(imbalance_ratio)
        info["class_counts"] = class_counts_text(y[pool], 10)
    return DatasetSplits(
        train=tensors(train),
        val=tensors(val),
        test=tensors(test),
        num_classes=10,
        input_shape=(1, 8, 8),
        name="digits",
        class_names=[str(d) for d in range(10)],
        info=info,
    )
