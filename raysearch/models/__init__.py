"""Model factory: networks for digits and 32x32 images, built by name.

Every model maps a float32 batch (N, C, H, W) to logits (N, K) and is built as
``build_model(name, num_classes=K, input_shape=(C, H, W))``:

- ``cnn``, ``mlp`` (:mod:`raysearch.models.small`): small networks for the digits default.
- ``resnet20``, ``resnet32``, ``resnet56``, ``resnet110`` (:mod:`raysearch.models.resnet_cifar`):
  He et al., CVPR 2016, arXiv:1512.03385, Sec. 4.2 (option-A shortcuts).
- ``resnet18``, ``resnet34``, ``resnet50``, ``resnet101`` (:mod:`raysearch.models.resnet`): the
  ImageNet ResNets of the same paper with a 3x3 stride-1 stem and no max-pool.
- ``wrn28_10`` (:mod:`raysearch.models.wide_resnet`): Zagoruyko & Komodakis, BMVC 2016,
  arXiv:1605.07146.
- ``densenet40``, ``densenet_bc100`` (:mod:`raysearch.models.densenet`): Huang et al., CVPR
  2017, arXiv:1608.06993.
- ``torchvision:<name>`` (:mod:`raysearch.models.torchvision_models`): any torchvision
  classification model, ``weights=None``; resolved on demand, not listed by
  :func:`available_models`.

The networks other than ``cnn`` and ``mlp`` use global average pooling and accept any
H, W >= 8. The registry is the plain dict ``_MODELS`` below: to add a model, write an
``nn.Module`` whose constructor takes keyword-only ``num_classes`` and ``input_shape`` in its
family file and add one line here.

Example:
    >>> from raysearch.models import build_model
    >>> model = build_model("cnn", num_classes=10, input_shape=(1, 8, 8))
    >>> model = build_model("resnet20", num_classes=100, input_shape=(3, 32, 32))
"""

from collections.abc import Callable, Sequence

from torch import nn

from raysearch.models.densenet import DenseNet40, DenseNetBC100
from raysearch.models.resnet import ResNet18, ResNet34, ResNet50, ResNet101
from raysearch.models.resnet_cifar import ResNet20, ResNet32, ResNet56, ResNet110
from raysearch.models.small import MLP, SmallCNN
from raysearch.models.torchvision_models import TORCHVISION_PREFIX, torchvision_factory
from raysearch.models.wide_resnet import WRN28_10

__all__ = [
    "DenseNet40",
    "DenseNetBC100",
    "MLP",
    "ResNet18",
    "ResNet20",
    "ResNet32",
    "ResNet34",
    "ResNet50",
    "ResNet56",
    "ResNet101",
    "ResNet110",
    "SmallCNN",
    "WRN28_10",
    "available_models",
    "build_model",
]

_MODELS: dict[str, type[nn.Module]] = {
    "cnn": SmallCNN,
    "mlp": MLP,
    "resnet20": ResNet20,
    "resnet32": ResNet32,
    "resnet56": ResNet56,
    "resnet110": ResNet110,
    "resnet18": ResNet18,
    "resnet34": ResNet34,
    "resnet50": ResNet50,
    "resnet101": ResNet101,
    "wrn28_10": WRN28_10,
    "densenet40": DenseNet40,
    "densenet_bc100": DenseNetBC100,
}


def available_models() -> list[str]:
    """Names accepted by :func:`build_model`, sorted (``torchvision:<name>`` not listed)."""
    return sorted(_MODELS)


def build_model(name: str, *, num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """Build a freshly initialised model by name.

    Initialisation uses each model's initialisers (PyTorch's defaults for ``cnn`` and ``mlp``,
    He normal convolutions for the others; see each class) and the global torch RNG: seed it
    (``torch.manual_seed``) first for a reproducible model.

    Args:
        name (str): model name, one of :func:`available_models`, or ``"torchvision:<name>"``
            for a torchvision classification model (e.g. ``"torchvision:resnet18"``).
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample.

    Returns:
        nn.Module: maps (N, C, H, W) float inputs to (N, K) float logits.

    Raises:
        TypeError: if `name` is not a str or `num_classes` is not an int.
        ValueError: if `name` is not registered and not a torchvision classification model,
            on invalid `num_classes` / `input_shape` (H, W < 8 for the convolutional
            networks other than ``cnn``; C != 3 for torchvision models).
    """
    if not isinstance(name, str):
        raise TypeError(f"`name` must be a str, got {type(name).__name__}")
    factory: Callable[..., nn.Module]
    if name.startswith(TORCHVISION_PREFIX):
        factory = torchvision_factory(name[len(TORCHVISION_PREFIX) :])
    elif name in _MODELS:
        factory = _MODELS[name]
    else:
        raise ValueError(
            f"Unknown model {name!r}; available: {', '.join(available_models())}, "
            f"or {TORCHVISION_PREFIX}<name> for any torchvision classification model"
        )
    return factory(num_classes=num_classes, input_shape=input_shape)
