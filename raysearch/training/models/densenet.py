"""CIFAR DenseNets of Huang et al. (``densenet40``, ``densenet_bc100``).

A 3x3 convolution, three dense blocks separated by transition layers (BN-ReLU-conv1x1-avgpool
2x2), then BN-ReLU, global average pooling and a K-way linear layer. Inside a block every
layer sees the concatenation of all earlier feature maps and adds ``growth_rate`` channels.

- ``densenet40``: DenseNet (L=40, k=12), 12 layers per block, each BN-ReLU-conv3x3; no
  bottleneck, no compression; 16 channels out of the first convolution, as the paper's Sec. 3
  states ("a convolution with 16 (or twice the growth rate for DenseNet-BC) output channels").
  1,019,722 parameters for 3x32x32, K=10 (Table 2: 1.0M). The authors' released Torch code
  and the PyTorch ports derived from it start with 2k = 24 channels instead, which gives
  1,059,298 parameters (the "1.06M" often quoted).
- ``densenet_bc100``: DenseNet-BC (L=100, k=12), 16 layers per block, each
  BN-ReLU-conv1x1(4k)-BN-ReLU-conv3x3(k); compression 0.5 at the transitions; 2k = 24 channels
  out of the first convolution. 769,162 parameters for 3x32x32, K=10 (Table 2: 0.8M).

Dropout (used by the paper only without data augmentation) is not included.

Reference:
    Gao Huang, Zhuang Liu, Laurens van der Maaten, Kilian Q. Weinberger. "Densely Connected
    Convolutional Networks". CVPR 2017. arXiv:1608.06993, Sec. 3-4 and Table 2.
"""

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raysearch.training.models._common import Preset, init_conv_bn
from raysearch.training.models.small import _check_image_args

__all__ = ["DenseNet", "DenseNet40", "DenseNetBC100"]


class _DenseLayer(nn.Module):
    """BN-ReLU-conv3x3 (or BN-ReLU-conv1x1(4k)-BN-ReLU-conv3x3 with a bottleneck), concatenated."""

    def __init__(self, in_channels: int, growth_rate: int, bottleneck: bool) -> None:
        super().__init__()
        if bottleneck:
            inner = 4 * growth_rate
            self.bottleneck = nn.Sequential(
                nn.BatchNorm2d(in_channels),
                nn.ReLU(inplace=True),
                nn.Conv2d(in_channels, inner, kernel_size=1, bias=False),
            )
        else:
            inner = in_channels
            self.bottleneck = nn.Identity()
        self.bn = nn.BatchNorm2d(inner)
        self.conv = nn.Conv2d(inner, growth_rate, kernel_size=3, padding=1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        new = self.conv(F.relu(self.bn(self.bottleneck(x))))
        return torch.cat((x, new), dim=1)


class _Transition(nn.Module):
    """BN-ReLU-conv1x1-avgpool 2x2 (stride 2; an odd last row/column is dropped)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(in_channels)
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.conv(F.relu(self.bn(x))))


class DenseNet(nn.Module):
    """DenseNet / DenseNet-BC with three dense blocks for small images (Huang et al. 2017).

    ``conv3x3(C→init_channels) → [dense block → transition] × 2 → dense block → BN → ReLU →
    global average pool → linear(→ K)``. Initialisation: convolutions He (Kaiming) normal with
    fan-out (as the authors' Torch code), batch-norm weight 1 and bias 0, the linear layer
    PyTorch's default weight with zero bias.

    Args:
        depth (int): total depth L; 3n + 4 without bottleneck (n layers per block), 6n + 4
            with (n two-convolution layers per block).
        growth_rate (int): channels k added by every layer (>= 1).
        bottleneck (bool): use BN-ReLU-conv1x1(4k) before each 3x3 convolution (the "B").
        compression (float): transitions output floor(compression × input) channels, in
            (0, 1]; 1 means no compression, 0.5 is the "C" of DenseNet-BC.
        init_channels (int): channels of the first convolution (>= 1).
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample; H, W >= 8.

    Shape:
        x: (N, C, H, W) float; returns logits (N, K) float.

    Raises:
        ValueError: if `depth` does not fit the layer layout, `growth_rate` or `init_channels`
            < 1, `compression` outside (0, 1], `num_classes` < 2, or `input_shape` is not three
            positive ints with H, W >= 8.
    """

    def __init__(
        self,
        *,
        depth: int,
        growth_rate: int,
        bottleneck: bool,
        compression: float,
        init_channels: int,
        num_classes: int,
        input_shape: Sequence[int],
    ) -> None:
        super().__init__()
        convs_per_layer = 2 if bottleneck else 1
        if (
            isinstance(depth, bool)
            or not isinstance(depth, int)
            or depth < 3 * convs_per_layer + 4
            or (depth - 4) % (3 * convs_per_layer)
        ):
            raise ValueError(
                f"`depth` must be {3 * convs_per_layer}n + 4 with n >= 1 "
                f"(bottleneck={bottleneck}), got {depth}"
            )
        if growth_rate < 1:
            raise ValueError(f"`growth_rate` must be >= 1, got {growth_rate}")
        if not 0.0 < compression <= 1.0:
            raise ValueError(f"`compression` must be in (0, 1], got {compression}")
        if init_channels < 1:
            raise ValueError(f"`init_channels` must be >= 1, got {init_channels}")
        name = f"densenet{'_bc' if bottleneck else ''}{depth}"
        channels, _, _ = _check_image_args(name, num_classes, input_shape)
        n = (depth - 4) // (3 * convs_per_layer)

        self.conv1 = nn.Conv2d(channels, init_channels, kernel_size=3, padding=1, bias=False)
        stages: list[nn.Module] = []
        c = init_channels
        for block in range(3):
            for _ in range(n):
                stages.append(_DenseLayer(c, growth_rate, bottleneck))
                c += growth_rate
            if block < 2:
                out = math.floor(c * compression)
                stages.append(_Transition(c, out))
                c = out
        self.features = nn.Sequential(*stages)
        self.bn = nn.BatchNorm2d(c)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)
        init_conv_bn(self)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Logits (N, K) of a batch (N, C, H, W)."""
        out = F.relu(self.bn(self.features(self.conv1(x))))
        return self.fc(self.pool(out).flatten(1))


class DenseNet40(Preset, DenseNet):
    """DenseNet (L=40, k=12), 16 initial channels: 1,019,722 parameters for 3x32x32, K=10.

    See the module docstring for the 16- versus 24-channel stem and :class:`DenseNet` for the
    architecture, arguments (`num_classes`, `input_shape`), shapes and errors.
    """

    _preset = dict(depth=40, growth_rate=12, bottleneck=False, compression=1.0, init_channels=16)


class DenseNetBC100(Preset, DenseNet):
    """DenseNet-BC (L=100, k=12): 769,162 parameters for 3x32x32, K=10.

    See :class:`DenseNet` for the architecture, arguments (`num_classes`, `input_shape`), shapes
    and errors.
    """

    _preset = dict(depth=100, growth_rate=12, bottleneck=True, compression=0.5, init_channels=24)
