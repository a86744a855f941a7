"""Pieces shared by the image classifiers: their weight initialisation and their named presets.

Imports nothing of the package.
"""

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from torch import nn


def init_conv_bn(model: nn.Module) -> None:
    """He (Kaiming) normal fan-out weights for every convolution, BN weight 1 and bias 0.

    Visits ``model.modules()`` in registration order, so the random draws (and with a fixed
    seed the weights) follow the order in which the layers were created. Convolution biases and
    all other layers keep PyTorch's default initialisation.

    Args:
        model (nn.Module): the network, changed in place.

    Reference:
        Kaiming He, Xiangyu Zhang, Shaoqing Ren, Jian Sun. "Delving Deep into Rectifiers".
        ICCV 2015. arXiv:1502.01852 (as in fb.resnet.torch and torchvision).
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class Preset:
    """Mixin of a fixed configuration of a model class: ``Preset, Base`` with `_preset`.

    ``class ResNet18(Preset, ResNet)`` with ``_preset = {"block": ..., "layers": ...}`` is built
    as ``ResNet(num_classes=K, input_shape=shape, **_preset)``; the registry's factories then
    take only `num_classes` and `input_shape`.
    """

    _preset: ClassVar[dict[str, Any]] = {}

    def __init__(self, *, num_classes: int, input_shape: Sequence[int]) -> None:
        super().__init__(num_classes=num_classes, input_shape=input_shape, **self._preset)


def raise_unfit(
    head: str, found: Sequence[tuple[str, Sequence[str]]], keys: Callable[[Sequence[str]], str]
) -> None:
    """Raise one ValueError naming every non-empty key list of a checkpoint that does not fit.

    Args:
        head (str): the start of the message, e.g. ``"pretrained weights in f.pt do not fit X"``.
        found (Sequence[tuple[str, Sequence[str]]]): (label, keys) pairs, e.g.
            ``("missing keys: ", [...])``; empty lists are left out.
        keys (Callable[[Sequence[str]], str]): how a list of keys is shown (shortened).

    Raises:
        ValueError: ``"<head>: <label><keys>; <label><keys>"`` if any list is non-empty.
    """
    problems = [f"{label}{keys(items)}" for label, items in found if items]
    if problems:
        raise ValueError(f"{head}: " + "; ".join(problems))
