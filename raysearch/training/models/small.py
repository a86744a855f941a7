"""Small networks for the digits default: a two-layer CNN (``cnn``) and an MLP (``mlp``).

Moved unchanged from the former ``raysearch/training/models.py`` (same layers, parameter counts and
PyTorch-default initialisation, so seeded runs give the same numbers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["MLP", "SmallCNN"]


def _check_args(num_classes: int, input_shape: Sequence[int]) -> tuple[int, int, int]:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int):
        raise TypeError(f"`num_classes` must be an int, got {type(num_classes).__name__}")
    if num_classes < 2:
        raise ValueError(f"`num_classes` must be >= 2, got {num_classes}")
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape
    ):
        raise ValueError(f"`input_shape` must be three positive ints (C, H, W), got {input_shape}")
    return shape  # type: ignore[return-value]


class SmallCNN(nn.Module):
    """Two 3x3 convolutions, a 2x2 max-pool and two linear layers (no dropout, no batch norm).

    ``conv(C→32, 3x3, pad 1) → ReLU → conv(32→64, 3x3, pad 1) → ReLU → maxpool 2 → flatten →
    linear(64·4·4 → 128) → ReLU → linear(128 → K)``. For 8x8 inputs the pooled map is 4x4
    (151,306 parameters for digits: 1x8x8, K=10). Other sizes are brought to 4x4 by an
    adaptive average pool after the max-pool, so the head is the same for any (C, H, W).

    Args:
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample; H, W >= 2.

    Shape:
        x: (N, C, H, W) float; returns logits (N, K).

    Raises:
        ValueError: if `num_classes` < 2 or `input_shape` is not three positive ints with
            H, W >= 2.
    """

    def __init__(self, *, num_classes: int, input_shape: Sequence[int]) -> None:
        super().__init__()
        channels, height, width = _check_args(num_classes, input_shape)
        if height < 2 or width < 2:
            raise ValueError(f"`input_shape` must have H, W >= 2 for 'cnn', got {input_shape}")
        pooled = (height // 2, width // 2)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Identity() if pooled == (4, 4) else nn.AdaptiveAvgPool2d((4, 4)),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(64 * 4 * 4, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Logits (N, K) of a batch (N, C, H, W)."""
        return self.classifier(self.features(x))


class MLP(nn.Module):
    """Flatten → linear(C·H·W → 256) → ReLU → linear(256 → 128) → ReLU → linear(128 → K).

    50,826 parameters for digits (1x8x8, K=10).

    Args:
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample.

    Shape:
        x: (N, C, H, W) float; returns logits (N, K).

    Raises:
        ValueError: if `num_classes` < 2 or `input_shape` is not three positive ints.
    """

    def __init__(self, *, num_classes: int, input_shape: Sequence[int]) -> None:
        super().__init__()
        shape = _check_args(num_classes, input_shape)
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(shape), 256),
            nn.ReLU(inplace=True),
            nn.Linear(256, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Logits (N, K) of a batch (N, C, H, W)."""
        return self.net(x)


def _check_image_args(
    name: str, num_classes: int, input_shape: Sequence[int], *, min_size: int = 8
) -> tuple[int, int, int]:
    """Validate the arguments of a convolutional network with global average pooling.

    Args:
        name (str): registry name of the model, quoted in the error message.
        num_classes (int): number of classes K (>= 2).
        input_shape (Sequence[int]): (C, H, W) of one sample.
        min_size (int, optional): smallest H and W accepted. Defaults to ``8``.

    Returns:
        tuple[int, int, int]: ``(C, H, W)``.

    Raises:
        TypeError: if `num_classes` is not an int.
        ValueError: if `num_classes` < 2, `input_shape` is not three positive ints, or
            H or W < `min_size`.
    """
    channels, height, width = _check_args(num_classes, input_shape)
    if height < min_size or width < min_size:
        raise ValueError(
            f"`input_shape` must have H, W >= {min_size} for {name!r}, got {input_shape}"
        )
    return channels, height, width
