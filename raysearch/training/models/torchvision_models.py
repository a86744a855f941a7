"""Any torchvision classification network by name (``torchvision:<name>``), randomly initialised.

``build_model("torchvision:resnet18", num_classes=K, input_shape=(3, H, W))`` returns
``torchvision.models.get_model("resnet18", weights=None, num_classes=K)``: the ImageNet
architecture unchanged (including a 7x7 stride-2 stem where it has one), with torchvision's
initialisation and no pretrained weights (nothing is downloaded). The names are those of
``torchvision.models.list_models(module=torchvision.models)``; detection, segmentation, video
and optical-flow models are refused. ``googlenet`` and ``inception_v3`` are built without
auxiliary classifiers (``aux_logits=False``, ``init_weights=True``) so that they return
logits in training mode too.

These networks take 3 input channels, and some have minimum input sizes of their own
(``inception_v3`` needs H, W >= 75; the ViTs need exactly their ``image_size``, 224); the
32x32 networks of this package (``resnet18``, ``resnet20``, ...) suit CIFAR-size images better.

Reference:
    TorchVision maintainers and contributors. "TorchVision: PyTorch's Computer Vision
    library". https://github.com/pytorch/vision (2016), models documented at
    https://pytorch.org/vision/stable/models.html#classification.
"""

from collections.abc import Callable, Sequence

from torch import nn

from raysearch.training.models.small import _check_args

__all__ = ["TORCHVISION_PREFIX", "torchvision_factory", "torchvision_names"]

TORCHVISION_PREFIX = "torchvision:"

_WHERE = (
    "see torchvision.models.list_models(module=torchvision.models) or "
    "https://pytorch.org/vision/stable/models.html#classification for the names"
)

# models whose default builder returns (logits, aux logits) in training mode and warns about
# its default initialisation: build them without auxiliary heads, with today's initialisation
_EXTRA_KWARGS: dict[str, dict[str, bool]] = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}


def torchvision_names() -> list[str]:
    """Return the torchvision classification model names, sorted.

    Returns:
        list[str]: names accepted after the ``torchvision:`` prefix.
    """
    import torchvision.models  # imported on use: torchvision is slow to import

    return sorted(torchvision.models.list_models(module=torchvision.models))


def torchvision_factory(name: str) -> Callable[..., nn.Module]:
    """Return a constructor ``(*, num_classes, input_shape) -> nn.Module`` for a torchvision model.

    Args:
        name (str): a torchvision classification model name, without the ``torchvision:``
            prefix (e.g. ``"resnet18"``).

    Returns:
        Callable[..., nn.Module]: a function taking keyword-only ``num_classes`` (int, >= 2)
        and ``input_shape`` ((3, H, W)) that builds ``torchvision.models.get_model(name,
        weights=None, num_classes=num_classes)``; the model maps (N, 3, H, W) float to logits
        (N, K) float.

    Raises:
        ValueError: if `name` is not a torchvision classification model (the message says
            where to find the names). The returned function raises ValueError if
            `num_classes` < 2 or `input_shape` is not three positive ints or has C != 3.
    """
    import torchvision.models  # imported on use: torchvision is slow to import

    if name not in torchvision.models.list_models(module=torchvision.models):
        if name in torchvision.models.list_models():
            raise ValueError(f"torchvision model {name!r} is not a classification model; {_WHERE}")
        raise ValueError(f"Unknown torchvision classification model {name!r}; {_WHERE}")

    def build(*, num_classes: int, input_shape: Sequence[int]) -> nn.Module:
        channels, _, _ = _check_args(num_classes, input_shape)
        if channels != 3:
            raise ValueError(
                f"torchvision model {name!r} takes 3 input channels, got {channels} channels "
                f"(`input_shape`={tuple(input_shape)})"
            )
        return torchvision.models.get_model(
            name, weights=None, num_classes=num_classes, **_EXTRA_KWARGS.get(name, {})
        )

    build.__name__ = build.__qualname__ = f"torchvision_{name}"
    return build
