"""Poly-1: cross-entropy plus epsilon * (1 - p_t) (Leng et al., ICLR 2022, Eq. 3)."""

from __future__ import annotations

import torch
from torch import nn


class Poly1Loss(nn.Module):
    """``CE + epsilon * (1 - p_t)``, batch mean; epsilon = 0 is cross-entropy.

    Shape:
        logits (N, K) float, targets (N,) int64; returns a scalar.
    """

    def __init__(self, epsilon: float = 1.0) -> None:
        super().__init__()
        if epsilon < -1:
            raise ValueError(f"`epsilon` must be >= -1, got {epsilon}")
        self.epsilon = epsilon

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch mean of the objective (a scalar)."""
        log_p = torch.log_softmax(logits, dim=1)
        log_pt = log_p.gather(1, targets[:, None]).squeeze(1)
        return (-log_pt + self.epsilon * (1 - log_pt.exp())).mean()
