"""A metric of one's own: how much more confident than accurate a model is."""

from __future__ import annotations

import numpy as np


def confidence_gap(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mean top-label confidence minus accuracy (a fraction; > 0: overconfident).

    Args:
        probs: (N, K) probabilities.
        labels: (N,) int labels.
    """
    probs = np.asarray(probs)
    return float(probs.max(axis=1).mean() - (probs.argmax(axis=1) == np.asarray(labels)).mean())
