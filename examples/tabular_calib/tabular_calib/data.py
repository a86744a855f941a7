"""A scikit-learn tabular dataset as raysearch splits."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

from raysearch import DatasetSplits


def load_table(data_dir: str | None = None, seed: int = 0, val_fraction: float | None = None,
               n_samples: int = 3000, n_features: int = 20, n_classes: int = 4,
               label_noise: float = 0.1) -> DatasetSplits:
    """Raysearch's dataset contract: ``f(data_dir, seed, val_fraction, **data_params)``.

    ``sklearn.datasets.make_classification`` with `label_noise` of the labels flipped at random
    (networks trained on noisy labels are overconfident: something to calibrate), split
    60/20/20 (stratified, by `seed`) and standardised with the training split's statistics.
    `data_dir` is not used: the data is generated.
    """
    val_fraction = 0.2 if val_fraction is None else val_fraction
    x, y = make_classification(n_samples=n_samples, n_features=n_features,
                               n_informative=max(n_features // 2, 2), n_redundant=0,
                               n_classes=n_classes, n_clusters_per_class=2, flip_y=label_noise,
                               class_sep=1.0, random_state=0)
    index = np.arange(len(y))
    rest, test = train_test_split(index, test_size=0.2, stratify=y, random_state=seed)
    train, val = train_test_split(rest, test_size=val_fraction / 0.8, stratify=y[rest],
                                  random_state=seed)
    mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 1e-8
    x = ((x - mean) / std).astype(np.float32)

    def split(rows: np.ndarray) -> TensorDataset:
        return TensorDataset(torch.from_numpy(x[rows]), torch.from_numpy(y[rows]).long())

    return DatasetSplits(train=split(train), val=split(val), test=split(test),
                         num_classes=n_classes)
