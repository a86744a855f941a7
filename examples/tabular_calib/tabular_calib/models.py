"""A multilayer perceptron for tabular rows whose forward returns a dict."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class TabularMLP(nn.Module):
    """``depth`` hidden layers of ``hidden`` units (ReLU, dropout), then a linear head.

    Shape:
        x: (N, F) float32 features; returns ``{"logits": (N, K), "features": (N, hidden)}``.
    """

    def __init__(self, in_features: int, num_classes: int, hidden: int = 64, depth: int = 2,
                 dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{"logits": (N, K), "features": (N, hidden)}`` of (N, F) rows."""
        features = self.body(x)
        return {"logits": self.head(features), "features": features}


def make_mlp(num_classes: int, input_shape: Sequence[int], hidden: int = 64, depth: int = 2,
             dropout: float = 0.0) -> TabularMLP:
    """Raysearch's model contract: ``f(num_classes, input_shape, **model_params)``.

    Raises:
        ValueError: if `input_shape` is not ``(F,)`` or `hidden`/`depth` are not positive.
    """
    if len(input_shape) != 1:
        raise ValueError(f"make_mlp takes tabular rows (F,), got input_shape {tuple(input_shape)}")
    if hidden < 1 or depth < 1:
        raise ValueError(f"hidden and depth must be >= 1, got {hidden} and {depth}")
    return TabularMLP(int(input_shape[0]), num_classes, hidden=hidden, depth=depth,
                      dropout=dropout)
