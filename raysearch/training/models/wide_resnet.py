"""Wide residual network WRN-28-10 (``wrn28_10``).

WRN-d-k: a 3x3 convolution with 16 filters, three stages of (d - 4) / 6 pre-activation blocks
(BN-ReLU-conv3x3-BN-ReLU-dropout-conv3x3) with 16k, 32k and 64k channels (strides 1, 2, 2), a
1x1-convolution shortcut where the width or resolution changes (applied to the pre-activated
input, as in the authors' code), then BN-ReLU, global average pooling and a K-way linear layer.
WRN-28-10 has 36.5M parameters on CIFAR-10 (Table 1's 28-10 row).

Reference:
    Sergey Zagoruyko, Nikos Komodakis. "Wide Residual Networks". BMVC 2016.
    arXiv:1605.07146, Sec. 2 and Table 1.
"""

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from raysearch.training.models._common import init_conv_bn
from raysearch.training.models.small import _check_image_args

__all__ = ["WRN28_10", "WideResNet"]


class _PreActBlock(nn.Module):
    """BN-ReLU-conv3x3(stride)-BN-ReLU-dropout-conv3x3, plus identity or 1x1 shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)
            if stride != 1 or in_channels != out_channels
            else None
        )

    def forward(self, x: Tensor) -> Tensor:
        pre = F.relu(self.bn1(x))
        out = self.conv1(pre)
        out = self.conv2(self.dropout(F.relu(self.bn2(out))))
        return out + (x if self.shortcut is None else self.shortcut(pre))


class WideResNet(nn.Module):
    """WRN-depth-widen_factor with pre-activation basic blocks (Zagoruyko & Komodakis 2016).

    ``conv3x3(C→16) → 3 stages × (depth - 4) / 6 blocks (16k, 32k, 64k channels; stride 1, 2,
    2) → BN → ReLU → global average pool → linear(64k → K)``. Initialisation as the authors'
    code: convolutions He (Kaiming) normal with fan-out, batch-norm weight 1 and bias 0, the
    linear layer PyTorch's default weight with zero bias.

    Args:
        depth (int): 6n + 4 with n >= 1 (16, 22, 28, 40, ...).
        widen_factor (int): width multiplier k (>= 1).
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample; H, W >= 8.
        dropout (float, optional): dropout probability between the two convolutions of every
            block, in [0, 1). Defaults to ``0.0`` (the paper uses 0.3 in some runs).

    Shape:
        x: (N, C, H, W) float; returns logits (N, K) float.

    Raises:
        ValueError: if `depth` is not 6n + 4, `widen_factor` < 1, `dropout` is outside [0, 1),
            `num_classes` < 2, or `input_shape` is not three positive ints with H, W >= 8.
    """

    def __init__(
        self,
        *,
        depth: int,
        widen_factor: int,
        num_classes: int,
        input_shape: Sequence[int],
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
            raise ValueError(f"`depth` must be 6n + 4 with n >= 1 (16, 28, 40, ...), got {depth}")
        if isinstance(widen_factor, bool) or not isinstance(widen_factor, int) or widen_factor < 1:
            raise ValueError(f"`widen_factor` must be an int >= 1, got {widen_factor}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {dropout}")
        channels, _, _ = _check_image_args(f"wrn{depth}_{widen_factor}", num_classes, input_shape)
        n = (depth - 4) // 6
        widths = (16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.conv1 = nn.Conv2d(channels, 16, kernel_size=3, padding=1, bias=False)
        blocks: list[nn.Module] = []
        in_channels = 16
        for width, stride in zip(widths, (1, 2, 2), strict=True):
            for i in range(n):
                blocks.append(_PreActBlock(in_channels, width, stride if i == 0 else 1, dropout))
                in_channels = width
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(in_channels)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_classes)
        init_conv_bn(self)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Logits (N, K) of a batch (N, C, H, W)."""
        out = F.relu(self.bn(self.blocks(self.conv1(x))))
        return self.fc(self.pool(out).flatten(1))


class WRN28_10(WideResNet):  # noqa: N801 - the paper's name
    """WRN-28-10: 36,479,194 parameters for 3x32x32, K=10 (published 36.5M).

    See :class:`WideResNet` for the architecture, shapes and errors.

    Args:
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample; H, W >= 8.
        dropout (float, optional): dropout probability inside every block, in [0, 1).
            Defaults to ``0.0``.
    """

    def __init__(
        self, *, num_classes: int, input_shape: Sequence[int], dropout: float = 0.0
    ) -> None:
        super().__init__(
            depth=28,
            widen_factor=10,
            num_classes=num_classes,
            input_shape=input_shape,
            dropout=dropout,
        )
