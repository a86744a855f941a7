"""Soft-binned ECE of groups of samples: values in NumPy, per-class values in torch.

The kernels of the ``sbece`` calibration objective
(:class:`~raysearch.calibration.objectives.SoftBinnedECE`): :func:`grouped_sbece` computes the
soft-binned ECE (Karandikar et al., NeurIPS 2021, arXiv:2108.00106, Eq. 11 ``"bin"`` and Eq. 12
``"lb"``) of every group of samples in one vectorised NumPy pass, a value-only twin of
:func:`raysearch.losses.soft_binning.soft_binned_ece`; :func:`per_class_sbece` calls that torch
function on each class's samples, for gradients.
"""

import numpy as np
import torch

from raysearch.losses.soft_binning import soft_binned_ece

__all__ = ["grouped_sbece", "per_class_sbece"]

#: Soft-bin mass below which a bin counts as empty (as in raysearch.losses.soft_binning).
_EMPTY_BIN = 1e-12


def _sbece_centers(n_bins: int) -> np.ndarray:
    return (np.arange(n_bins, dtype=np.float64) + 0.5) / n_bins


def grouped_sbece(
    confidences: np.ndarray,
    correct: np.ndarray,
    groups: np.ndarray,
    n_groups: int,
    n_bins: int,
    temperature: float,
    p: float,
    binning: str,
) -> np.ndarray:
    """SB-ECE of every group of samples at once in NumPy, (G,) (0 for empty groups).

    A value-only twin of :func:`raysearch.losses.soft_binning.soft_binned_ece` (the tests
    check that they agree): the derivative-free TS search evaluates SB-ECE ~80 times, and
    per-class values for the class-wise scaling come out in one vectorised pass instead of K
    small torch calls (which crawl on a busy two-core machine).
    """
    c = confidences
    a = correct.astype(np.float64)
    scores = -((c[:, None] - _sbece_centers(n_bins)[None, :]) ** 2) / temperature
    scores -= scores.max(axis=1, keepdims=True)
    u = np.exp(scores)
    u /= u.sum(axis=1, keepdims=True)  # (N, M) soft memberships
    slots = (groups[:, None] * n_bins + np.arange(n_bins)[None, :]).ravel()
    size = n_groups * n_bins

    def group_sum(values: np.ndarray) -> np.ndarray:
        total = np.bincount(slots, weights=values.ravel(), minlength=size)
        return total.reshape(n_groups, n_bins)

    sizes = group_sum(u)
    filled = sizes > _EMPTY_BIN  # as soft_binned_ece: a near-empty bin contributes 0
    safe = np.where(filled, sizes, 1.0)
    counts = np.maximum(np.bincount(groups, minlength=n_groups), 1)
    if binning == "bin":
        gaps = group_sum(u * (a - c)[:, None])  # S_j (A_j - C_j)
        terms = np.where(filled, safe * (np.abs(gaps) / safe) ** p, 0.0)
        total = terms.sum(axis=1) / counts
    else:
        acc_bins = np.where(filled, group_sum(u * a[:, None]) / safe, 0.0)
        per_sample = (u * np.abs(acc_bins[groups] - c[:, None]) ** p).sum(axis=1)
        total = np.bincount(groups, weights=per_sample, minlength=n_groups) / counts
    return np.maximum(total, 0.0) ** (1.0 / p)


def per_class_sbece(
    confidences: torch.Tensor,
    correct: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    settings: tuple[int, float, float, str],
) -> torch.Tensor:
    """SB-ECE of each class's samples (:func:`soft_binned_ece`), (K,), 0 for empty classes."""
    values = []
    for k in range(n_classes):
        mask = labels == k
        if bool(mask.any()):
            values.append(soft_binned_ece(confidences[mask], correct[mask], *settings))
        else:
            values.append(confidences.new_zeros(()))
    return torch.stack(values)
