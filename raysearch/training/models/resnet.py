"""ResNet-18/34/50/101 adapted to 32x32 inputs (a 3x3 stride-1 stem, no max-pool).

Registered as ``resnet18``, ``resnet34``, ``resnet50`` and ``resnet101``. The basic and
bottleneck blocks, the 64-128-256-512 stage widths, the block counts (2-2-2-2, 3-4-6-3, 3-4-6-3,
3-4-23-3) and the 1x1-convolution + batch-norm projection shortcuts (option B) are those of the
ImageNet ResNets and of torchvision (stride on the bottleneck's 3x3 convolution, "ResNet v1.5").
For small images the 7x7 stride-2 stem and its 3x3 max-pool are replaced by a 3x3 stride-1
convolution without max-pool, the variant of the CIFAR tables of MbLS, ACLS and most
calibration code bases (derived from kuangliu/pytorch-cifar): on 32x32 inputs the four stages
run at 32, 16, 8 and 4 pixels.

Reference:
    Kaiming He, Xiangyu Zhang, Shaoqing Ren, Jian Sun. "Deep Residual Learning for Image
    Recognition". CVPR 2016. arXiv:1512.03385, Table 1.
"""

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from raysearch.training.models._common import Preset, init_conv_bn
from raysearch.training.models.small import _check_image_args

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "ResNet18", "ResNet34", "ResNet50", "ResNet101"]


def _projection(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    """Option-B shortcut (1x1 convolution + BN) where the shape changes, identity elsewhere."""
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
        nn.BatchNorm2d(out_channels),
    )


class BasicBlock(nn.Module):
    """conv3x3(stride)-BN-ReLU-conv3x3-BN plus shortcut, then ReLU (ResNet-18/34).

    Args:
        in_channels (int): input channels.
        width (int): channels of both convolutions; the block outputs ``width`` channels.
        stride (int): stride of the first convolution and of the shortcut.

    Shape:
        x: (N, in_channels, H, W) float; returns (N, width, ceil(H / stride), ceil(W / stride)).
    """

    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.shortcut = _projection(in_channels, width, stride)

    def forward(self, x: Tensor) -> Tensor:
        """Block output (N, width, H', W')."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """conv1x1-BN-ReLU-conv3x3(stride)-BN-ReLU-conv1x1(×4)-BN plus shortcut, then ReLU.

    Used by ResNet-50/101; the stride sits on the 3x3 convolution as in torchvision.

    Args:
        in_channels (int): input channels.
        width (int): channels of the 1x1 and 3x3 convolutions; the block outputs ``4 * width``.
        stride (int): stride of the 3x3 convolution and of the shortcut.

    Shape:
        x: (N, in_channels, H, W) float; returns
        (N, 4 * width, ceil(H / stride), ceil(W / stride)).
    """

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.shortcut = _projection(in_channels, out_channels, stride)

    def forward(self, x: Tensor) -> Tensor:
        """Block output (N, 4 * width, H', W')."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet with a 3x3 stride-1 stem and no max-pool, for 32x32 inputs.

    ``conv3x3(C→64) → BN → ReLU → 4 stages (64, 128, 256, 512 × expansion channels; stride 1,
    2, 2, 2) → global average pool → linear(512 × expansion → K)``. Initialisation as
    torchvision's ResNet: convolutions He (Kaiming) normal with fan-out, batch-norm weight 1
    and bias 0, the linear layer PyTorch's default. :class:`ResNet18`, :class:`ResNet34`,
    :class:`ResNet50` and :class:`ResNet101` are this class with `block`, `layers` and `name`
    fixed (they take `num_classes` and `input_shape`; shapes and errors are these).

    Args:
        block (type[BasicBlock] | type[Bottleneck]): residual block of every stage.
        layers (Sequence[int]): number of blocks in each of the four stages (each >= 1).
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample; H, W >= 8.
        name (str, optional): model name quoted in error messages. Defaults to ``"resnet"``.

    Shape:
        x: (N, C, H, W) float; returns logits (N, K) float.

    Raises:
        ValueError: if `layers` is not four ints >= 1, `num_classes` < 2, or `input_shape` is
            not three positive ints with H, W >= 8.
    """

    def __init__(
        self,
        *,
        block: type[BasicBlock] | type[Bottleneck],
        layers: Sequence[int],
        num_classes: int,
        input_shape: Sequence[int],
        name: str = "resnet",
    ) -> None:
        super().__init__()
        if len(layers) != 4 or not all(isinstance(n, int) and n >= 1 for n in layers):
            raise ValueError(f"`layers` must be four ints >= 1, got {layers}")
        channels, _, _ = _check_image_args(name, num_classes, input_shape)
        self.conv1 = nn.Conv2d(channels, 64, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages: list[nn.Module] = []
        in_channels = 64
        for width, stride, n_blocks in zip((64, 128, 256, 512), (1, 2, 2, 2), layers, strict=True):
            blocks = []
            for i in range(n_blocks):
                blocks.append(block(in_channels, width, stride if i == 0 else 1))
                in_channels = width * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        init_conv_bn(self)

    def forward(self, x: Tensor) -> Tensor:
        """Logits (N, K) of a batch (N, C, H, W)."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(self.pool(out).flatten(1))


class ResNet18(Preset, ResNet):
    """ResNet-18 (basic blocks 2-2-2-2): 11,173,962 parameters for 3x32x32, K=10."""

    _preset = {"block": BasicBlock, "layers": (2, 2, 2, 2), "name": "resnet18"}


class ResNet34(Preset, ResNet):
    """ResNet-34 (basic blocks 3-4-6-3): 21,282,122 parameters for 3x32x32, K=10."""

    _preset = {"block": BasicBlock, "layers": (3, 4, 6, 3), "name": "resnet34"}


class ResNet50(Preset, ResNet):
    """ResNet-50 (bottlenecks 3-4-6-3): 23,520,842 parameters for 3x32x32, K=10."""

    _preset = {"block": Bottleneck, "layers": (3, 4, 6, 3), "name": "resnet50"}


class ResNet101(Preset, ResNet):
    """ResNet-101 (bottlenecks 3-4-23-3): 42,512,970 parameters for 3x32x32, K=10."""

    _preset = {"block": Bottleneck, "layers": (3, 4, 23, 3), "name": "resnet101"}
