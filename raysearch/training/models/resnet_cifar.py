"""CIFAR ResNets of He et al. (``resnet20`` ... ``resnet110``) and ``resnet110_sd`` (Huang et al.).

The 6n+2-layer networks of Sec. 4.2 ("CIFAR-10 and Analysis"): a 3x3 convolution with 16
filters, then three stages of n basic blocks (two 3x3 convolutions each) on 16, 32 and 64
channels, the first block of stages 2 and 3 subsampling with stride 2, then global average
pooling and a K-way linear layer. Every shortcut is an identity (option A): where a block
halves the resolution and doubles the width, the shortcut subsamples the input with stride 2
and pads the new channels with zeros, so it has no parameters. ResNet-110 is the CIFAR network
of several calibration papers' tables (e.g. focal loss, Mukhoti et al. 2020).
``resnet110_sd`` is ResNet-110 trained with stochastic depth (the "ResNet110SD" of Jung et
al., ICML 2023, Tables 1-2): same weights, blocks randomly skipped in training.

References:
    Kaiming He, Xiangyu Zhang, Shaoqing Ren, Jian Sun. "Deep Residual Learning for Image
    Recognition". CVPR 2016. arXiv:1512.03385, Sec. 4.2.
    Gao Huang, Yu Sun, Zhuang Liu, Daniel Sedra, Kilian Q. Weinberger. "Deep Networks with
    Stochastic Depth". ECCV 2016. arXiv:1603.09382, Sec. 3 (Eq. 4, the linear decay rule).
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raysearch.training.models._common import Preset, init_conv_bn
from raysearch.training.models.small import _check_image_args

__all__ = [
    "CifarResNet",
    "ResNet20",
    "ResNet32",
    "ResNet56",
    "ResNet110",
    "ResNet110SD",
    "ShortcutA",
    "survival_probabilities",
]


class ShortcutA(nn.Module):
    """Parameter-free shortcut of option A: stride-``stride`` subsampling, zero-padded channels.

    ``y[:, :C_in] = x[:, :, ::stride, ::stride]`` and ``y[:, C_in:] = 0``. For odd H the
    subsampled size is ceil(H / 2), the same as that of a stride-2, padding-1 3x3 convolution.

    Args:
        in_channels (int): channels C_in of the input.
        out_channels (int): channels C_out (>= C_in) of the output.
        stride (int): spatial subsampling factor (1 or 2).

    Shape:
        x: (N, C_in, H, W) float; returns (N, C_out, ceil(H / stride), ceil(W / stride)).

    Raises:
        ValueError: if `out_channels` < `in_channels` or `stride` < 1.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        if out_channels < in_channels:
            raise ValueError(
                f"`out_channels` must be >= `in_channels` ({in_channels}), got {out_channels}"
            )
        if stride < 1:
            raise ValueError(f"`stride` must be >= 1, got {stride}")
        self.extra_channels = out_channels - in_channels
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        """Subsample (N, C_in, H, W) and append zero channels up to C_out."""
        if self.stride > 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.extra_channels:
            # F.pad lists the last dimension first: (W: 0, 0), (H: 0, 0), (C: 0, extra)
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))
        return x


class _BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus the option-A shortcut, then ReLU.

    With ``survival_prob`` p < 1 (stochastic depth, Huang et al. 2016, Sec. 3): in training
    the residual branch is skipped (the block is its shortcut, then ReLU) with probability
    1 - p, one draw per forward (mini-batch) from torch's global CPU generator; in eval the
    branch is scaled by p (its expected value). p = 1 is the plain block.
    """

    def __init__(
        self, in_channels: int, out_channels: int, stride: int, survival_prob: float = 1.0
    ) -> None:
        super().__init__()
        self.survival_prob = survival_prob
        self.conv1 = nn.Conv2d(
            in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False
        )
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = (
            ShortcutA(in_channels, out_channels, stride)
            if stride != 1 or in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x: Tensor) -> Tensor:
        p = self.survival_prob
        if p < 1.0 and self.training and float(torch.rand(())) >= p:
            return F.relu(self.shortcut(x))  # dropped: the identity (option-A) path only
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if p < 1.0 and not self.training:
            out = out * p
        return F.relu(out + self.shortcut(x))


def survival_probabilities(n_blocks: int, survival_prob_last: float) -> list[float]:
    r"""Survival probabilities of the linear decay rule (Huang et al., ECCV 2016, Eq. 4).

    .. math::

        p_l = 1 - \frac{l}{L} (1 - p_L), \quad l = 1, \dots, L

    (the input, l = 0, always survives). For ResNet-110, L = 54 and the paper's
    :math:`p_L = 0.5`: :math:`p_1 = 1 - 0.5/54 = 0.99074`, :math:`p_{54} = 0.5`.

    Args:
        n_blocks: number L >= 1 of residual blocks.
        survival_prob_last: :math:`p_L` in (0, 1].

    Returns:
        The L probabilities, first block first.

    Raises:
        ValueError: if ``n_blocks`` < 1 or ``survival_prob_last`` is not in (0, 1].
        TypeError: if ``survival_prob_last`` is not a real number.
    """
    if isinstance(survival_prob_last, bool) or not isinstance(survival_prob_last, (int, float)):
        raise TypeError(
            "`survival_prob_last` must be a real number, got "
            f"{type(survival_prob_last).__name__} {survival_prob_last!r}"
        )
    if not 0.0 < survival_prob_last <= 1.0:
        raise ValueError(f"`survival_prob_last` must be in (0, 1], got {survival_prob_last}")
    if n_blocks < 1:
        raise ValueError(f"`n_blocks` must be >= 1, got {n_blocks}")
    return [1.0 - layer / n_blocks * (1.0 - survival_prob_last) for layer in range(1, n_blocks + 1)]


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for small images (He et al. 2016, Sec. 4.2), option-A shortcuts.

    ``conv3x3(C→16) → BN → ReLU → 3 stages × n basic blocks (16, 32, 64 channels; stride 1, 2,
    2) → global average pool → linear(64 → K)``. Initialisation: convolutions He (Kaiming)
    normal with fan-out (He et al. 2015, as in the authors' fb.resnet.torch and torchvision),
    batch-norm weight 1 and bias 0, the linear layer PyTorch's default.
    :class:`ResNet20`, :class:`ResNet32`, :class:`ResNet56` and :class:`ResNet110` are this
    class with `depth` fixed (their arguments, shapes and errors are these).

    Args:
        depth (int): number of weighted layers, 6n + 2 with n >= 1 (20, 32, 44, 56, 110, ...).
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample; H, W >= 8.
        survival_prob_last (float, optional): stochastic depth's :math:`p_L` in (0, 1] (see
            :func:`survival_probabilities`); 1 disables it. Defaults to ``1.0``.

    Shape:
        x: (N, C, H, W) float; returns logits (N, K) float.

    Raises:
        ValueError: if `depth` is not 6n + 2 with n >= 1, `num_classes` < 2, `input_shape`
            is not three positive ints with H, W >= 8, or `survival_prob_last` not in (0, 1].
    """

    def __init__(
        self,
        *,
        depth: int,
        num_classes: int,
        input_shape: Sequence[int],
        survival_prob_last: float = 1.0,
    ) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
            raise ValueError(f"`depth` must be 6n + 2 with n >= 1 (20, 32, 56, ...), got {depth}")
        channels, _, _ = _check_image_args(f"resnet{depth}", num_classes, input_shape)
        n = (depth - 2) // 6
        survival = survival_probabilities(3 * n, survival_prob_last)
        self.conv1 = nn.Conv2d(channels, 16, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks: list[nn.Module] = []
        in_channels = 16
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                blocks.append(
                    _BasicBlock(
                        in_channels, width, stride if i == 0 else 1, survival[len(blocks)]
                    )
                )
                in_channels = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)
        init_conv_bn(self)

    def forward(self, x: Tensor) -> Tensor:
        """Logits (N, K) of a batch (N, C, H, W)."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.pool(self.blocks(out))
        return self.fc(out.flatten(1))


class ResNet20(Preset, CifarResNet):
    """ResNet-20 (n = 3): 269,722 parameters for 3x32x32, K=10 (published 0.27M)."""

    _preset = {"depth": 20}


class ResNet32(Preset, CifarResNet):
    """ResNet-32 (n = 5): 464,154 parameters for 3x32x32, K=10 (published 0.46M)."""

    _preset = {"depth": 32}


class ResNet56(Preset, CifarResNet):
    """ResNet-56 (n = 9): 853,018 parameters for 3x32x32, K=10 (published 0.85M)."""

    _preset = {"depth": 56}


class ResNet110(Preset, CifarResNet):
    """ResNet-110 (n = 18): 1,727,962 parameters for 3x32x32, K=10 (published 1.7M)."""

    _preset = {"depth": 110}


class ResNet110SD(CifarResNet):
    """ResNet-110 with stochastic depth (Huang et al., ECCV 2016): ``resnet110_sd``.

    The network of :class:`ResNet110` (1,727,962 parameters for 3x32x32, K=10) whose 54
    residual blocks survive with the linear decay rule :math:`p_l = 1 - l/54 (1 - p_L)`,
    :math:`p_L = 0.5` as in the paper (Sec. 3 and 4, CIFAR): in training block l's residual
    branch is skipped with probability :math:`1 - p_l` (one draw per mini-batch), in eval it
    is scaled by :math:`p_l` (Eq. 5). ``survival_prob_last=1`` gives the plain ResNet-110.

    Args:
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample; H, W >= 8.
        survival_prob_last (float, optional): :math:`p_L` in (0, 1]. Defaults to ``0.5``.

    Shape:
        x: (N, C, H, W) float; returns logits (N, K) float.

    Raises:
        ValueError: as :class:`CifarResNet`.
    """

    def __init__(
        self, *, num_classes: int, input_shape: Sequence[int], survival_prob_last: float = 0.5
    ) -> None:
        super().__init__(
            depth=110,
            num_classes=num_classes,
            input_shape=input_shape,
            survival_prob_last=survival_prob_last,
        )
