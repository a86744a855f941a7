"""Model factory: networks for digits and 32x32 images, and segmentation networks, built by name.

Every model is built as ``build_model(name, num_classes=K, input_shape=(C, H, W))``. The
classification models map a float32 batch (N, C, H, W) to logits (N, K):

- ``cnn``, ``mlp`` (:mod:`raysearch.training.models.small`): small networks for the digits default.
- ``resnet20``, ``resnet32``, ``resnet56``, ``resnet110``
  (:mod:`raysearch.training.models.resnet_cifar`):
  He et al., CVPR 2016, arXiv:1512.03385, Sec. 4.2 (option-A shortcuts).
- ``resnet110_sd`` (:mod:`raysearch.training.models.resnet_cifar`): ResNet-110 with stochastic
  depth,
  Huang et al., ECCV 2016, arXiv:1603.09382 (linear decay, ``survival_prob_last=0.5``).
- ``resnet18``, ``resnet34``, ``resnet50``, ``resnet101`` (:mod:`raysearch.training.models.resnet`):
  the ImageNet ResNets of the same paper with a 3x3 stride-1 stem and no max-pool.
- ``wrn28_10`` (:mod:`raysearch.training.models.wide_resnet`): Zagoruyko & Komodakis, BMVC 2016,
  arXiv:1605.07146.
- ``densenet40``, ``densenet_bc100`` (:mod:`raysearch.training.models.densenet`): Huang et al., CVPR
  2017, arXiv:1608.06993.
- ``torchvision:<name>`` (:mod:`raysearch.training.models.torchvision_models`): any torchvision
  classification model, ``weights=None``; resolved on demand, not listed by
  :func:`available_models`.

The segmentation models (:mod:`raysearch.training.models.segmentation`) map (N, 3, H, W) to
per-pixel
logits (N, K, H, W), have ``model.task == "segmentation"`` (see :func:`is_segmentation_model`)
and take ImageNet backbone weights from a local file (:func:`load_backbone_weights`, or
``build_model(..., pretrained_backbone=path)``):

- ``deeplabv3_resnet34``, ``deeplabv3_resnet50``, ``deeplabv3_resnet101``: DeepLabV3, Chen
  et al., arXiv:1706.05587, 2017 (output stride 8; the networks of MbLS Table 5 and ACLS
  Table 4 on PASCAL VOC).
- ``fcn_resnet50``: Long et al., CVPR 2015, arXiv:1411.4038.
- ``lraspp_mobilenet_v3_large``: LR-ASPP, Howard et al., ICCV 2019, arXiv:1905.02244.

The classification networks other than ``cnn`` and ``mlp`` use global average pooling and accept any
H, W >= 8. The built-ins are the plain dicts ``_MODELS`` (and its segmentation and text
siblings) below: to add a model, write an ``nn.Module`` whose constructor takes keyword-only
``num_classes`` and ``input_shape`` in its family file and add one line here. With the installed
plug-ins (entry-point group ``raysearch.models``) they form :data:`MODEL_REGISTRY`; any factory
``f(num_classes, input_shape, **model_params) -> nn.Module`` can also be named by its import
string ``package.module:attr`` (:mod:`raysearch.registry`).

Example:
    >>> from raysearch.training.models import build_model
    >>> model = build_model("cnn", num_classes=10, input_shape=(1, 8, 8))
    >>> model = build_model("resnet20", num_classes=100, input_shape=(3, 32, 32))
    >>> model = build_model("deeplabv3_resnet50", num_classes=21, input_shape=(3, 512, 512))
"""

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from raysearch.registry import Registry, check_keywords, object_label
from raysearch.training.models.densenet import DenseNet40, DenseNetBC100
from raysearch.training.models.resnet import ResNet18, ResNet34, ResNet50, ResNet101
from raysearch.training.models.resnet_cifar import (
    ResNet20,
    ResNet32,
    ResNet56,
    ResNet110,
    ResNet110SD,
)
from raysearch.training.models.segmentation import (
    BackboneLoadSummary,
    DeepLabV3ResNet34,
    DeepLabV3ResNet50,
    DeepLabV3ResNet101,
    FCNResNet50,
    LRASPPMobileNetV3Large,
    SegmentationModel,
    load_backbone_weights,
)
from raysearch.training.models.small import MLP, SmallCNN
from raysearch.training.models.text import GlobalPoolingCNN, build_gpool_cnn, load_glove
from raysearch.training.models.torchvision_models import TORCHVISION_PREFIX, torchvision_factory
from raysearch.training.models.wide_resnet import WRN28_10

__all__ = [
    "BackboneLoadSummary",
    "DeepLabV3ResNet34",
    "DeepLabV3ResNet50",
    "DeepLabV3ResNet101",
    "DenseNet40",
    "DenseNetBC100",
    "FCNResNet50",
    "LRASPPMobileNetV3Large",
    "MLP",
    "ResNet18",
    "ResNet20",
    "ResNet32",
    "ResNet34",
    "ResNet50",
    "ResNet56",
    "ResNet101",
    "ResNet110",
    "ResNet110SD",
    "SegmentationModel",
    "SmallCNN",
    "WRN28_10",
    "GlobalPoolingCNN",
    "MODEL_REGISTRY",
    "available_models",
    "build_model",
    "model_factory",
    "model_label",
    "output_logits",
    "load_glove",
    "is_segmentation_model",
    "load_backbone_weights",
]

_MODELS: dict[str, type[nn.Module]] = {
    "cnn": SmallCNN,
    "mlp": MLP,
    "resnet20": ResNet20,
    "resnet32": ResNet32,
    "resnet56": ResNet56,
    "resnet110": ResNet110,
    "resnet110_sd": ResNet110SD,
    "resnet18": ResNet18,
    "resnet34": ResNet34,
    "resnet50": ResNet50,
    "resnet101": ResNet101,
    "wrn28_10": WRN28_10,
    "densenet40": DenseNet40,
    "densenet_bc100": DenseNetBC100,
}

_SEGMENTATION_MODELS: dict[str, type[nn.Module]] = {
    "deeplabv3_resnet34": DeepLabV3ResNet34,
    "deeplabv3_resnet50": DeepLabV3ResNet50,
    "deeplabv3_resnet101": DeepLabV3ResNet101,
    "fcn_resnet50": FCNResNet50,
    "lraspp_mobilenet_v3_large": LRASPPMobileNetV3Large,
}

_TASKS = ("classification", "segmentation", "text")
#: Text classifiers (token ids in, logits out); they need the dataset's vocabulary.
_TEXT_MODELS: dict[str, Callable[..., nn.Module]] = {"gpool_cnn": build_gpool_cnn}


def _segmentation_factory(cls: type[nn.Module]) -> Callable[..., nn.Module]:
    """``cls`` as a factory that also takes ``pretrained_backbone`` (a local state-dict file)."""

    def build(*, num_classes: int, input_shape: Sequence[int],
              pretrained_backbone: str | os.PathLike[str] | None = None) -> nn.Module:
        model = cls(num_classes=num_classes, input_shape=input_shape)
        if pretrained_backbone is not None:
            load_backbone_weights(model, pretrained_backbone)
        return model

    build.__name__ = build.__qualname__ = cls.__name__
    build.__doc__ = cls.__doc__
    build.task = "segmentation"  # type: ignore[attr-defined]
    return build


def _torchvision(name: str) -> Callable[..., nn.Module]:
    return torchvision_factory(name[len(TORCHVISION_PREFIX):])


#: Built-in models plus the installed plug-ins (entry-point group ``raysearch.models``);
#: ``torchvision:<name>`` is resolved by its prefix.
MODEL_REGISTRY = Registry(
    "models",
    {**_MODELS, **{k: _segmentation_factory(v) for k, v in _SEGMENTATION_MODELS.items()},
     **_TEXT_MODELS},
    prefixes={TORCHVISION_PREFIX: _torchvision},
    hint=f"{TORCHVISION_PREFIX}<name> for any torchvision classification model",
)


def available_models(task: str | None = None) -> list[str]:
    """Names accepted by :func:`build_model`, sorted (``torchvision:<name>`` not listed).

    Args:
        task (str | None, optional): ``"classification"`` (the built-in image classifiers),
            ``"segmentation"`` or ``"text"`` (token-sequence classifiers: ``gpool_cnn``) for the
            built-in models of that task only. Defaults to ``None`` (every registered model:
            built-ins and installed plug-ins).

    Returns:
        list[str]: the registered names, sorted.

    Raises:
        ValueError: if `task` is not ``None``, ``"classification"``, ``"segmentation"`` or
            ``"text"``.
    """
    if task is None:
        return MODEL_REGISTRY.names()
    if task not in _TASKS:
        raise ValueError(f"`task` must be None or one of {', '.join(_TASKS)}, got {task!r}")
    return sorted({"classification": _MODELS, "segmentation": _SEGMENTATION_MODELS,
                   "text": _TEXT_MODELS}[task])


def is_segmentation_model(name: str) -> bool:
    """Whether `name` is a built-in segmentation model (its output is (N, K, H, W) logits).

    Args:
        name (str): a model name as given to :func:`build_model`.

    Returns:
        bool: ``True`` for the names of :func:`available_models` ``(task="segmentation")``,
        ``False`` for any other name (classification, ``torchvision:<name>``, unknown).
    """
    return isinstance(name, str) and name in _SEGMENTATION_MODELS


def model_label(name: Any) -> str:
    """The name a model is recorded under: as given, or a factory's import string."""
    return name if isinstance(name, str) else object_label(name)


def model_factory(name: Any) -> Callable[..., nn.Module]:
    """The factory of a model name, import string, ``torchvision:<name>`` or callable.

    Raises:
        ValueError: for an unknown name (with the closest ones) or an import string that does
            not import.
    """
    return MODEL_REGISTRY.get(name)


def build_model(
    name: Any,
    *,
    num_classes: int,
    input_shape: Sequence[int],
    **model_params: Any,
) -> nn.Module:
    """Build a freshly initialised model by name, import string or factory.

    Initialisation uses each model's initialisers (PyTorch's defaults for ``cnn`` and ``mlp``,
    He normal convolutions for the others, torchvision's for the segmentation models; see each
    class) and the global torch RNG: seed it (``torch.manual_seed``) first for a reproducible
    model. Nothing is downloaded.

    The factory contract (built-ins and a user's code alike) is
    ``factory(num_classes=K, input_shape=shape, **model_params) -> nn.Module``; the model's
    output may be the logits, a tuple/list whose first item is the logits, or a mapping (or an
    object) with ``logits`` (:func:`output_logits`).

    Args:
        name (str | callable): model name, one of :func:`available_models`;
            ``"torchvision:<name>"`` for a torchvision classification model (e.g.
            ``"torchvision:resnet18"``); an import string ``package.module:attr``; or the
            factory itself.
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, ...]): shape of one sample: (C, H, W) for images, (L,) for
            token sequences, (F,) for tabular features.
        **model_params: the factory's own keyword arguments, e.g. ``hidden=64`` for a user's
            model, ``pretrained_backbone=PATH`` for a built-in segmentation model (a local
            ImageNet checkpoint of its backbone, :func:`load_backbone_weights`),
            ``vocabulary=...`` and ``embeddings_path=PATH`` (a GloVe file, frozen) for
            ``gpool_cnn``.

    Returns:
        nn.Module: a classification model maps (N, *input_shape) inputs to (N, K) float
        logits; a segmentation model (:func:`is_segmentation_model`) maps (N, 3, H, W) to
        (N, K, H, W) float logits.

    Raises:
        TypeError: if `num_classes` is not an int (built-ins).
        ValueError: if `name` is unknown (with the closest names) or does not import; if the
            factory takes no keyword of `model_params` (the message lists the ones it takes);
            on invalid `num_classes` / `input_shape` (H, W < 8 for the convolutional networks
            other than ``cnn``; C != 3 for torchvision and segmentation models; H, W < 32 for
            segmentation models); if a user's factory raises or returns something that is not an
            ``nn.Module`` (one line naming it); or (from :func:`load_backbone_weights`) if the
            backbone file does not fit.
        FileNotFoundError: if `pretrained_backbone` is not a file.
    """
    if not isinstance(name, str) and not callable(name):
        raise TypeError(f"`name` must be a str or a callable, got {type(name).__name__}")
    factory = model_factory(name)
    label = model_label(name)
    check_keywords(factory, model_params, what=f"model {label!r}",
                   reserved=("num_classes", "input_shape"))
    builtin = factory in _BUILTIN_FACTORIES or (
        isinstance(name, str) and name.startswith(TORCHVISION_PREFIX))
    if builtin:
        return factory(num_classes=num_classes, input_shape=tuple(input_shape), **model_params)
    try:
        model = factory(num_classes=num_classes, input_shape=tuple(input_shape), **model_params)
    except Exception as exc:  # noqa: BLE001 (a user's factory: one line naming it)
        raise ValueError(f"model {label!r} raised {type(exc).__name__} while being built "
                         f"(num_classes={num_classes}, input_shape={tuple(input_shape)}): "
                         f"{' '.join(str(exc).split())}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {label!r} returned {type(model).__name__}, expected a "
                         "torch.nn.Module")
    return model


_BUILTIN_FACTORIES = frozenset(
    MODEL_REGISTRY._builtins[name] for name in (*_MODELS, *_SEGMENTATION_MODELS, *_TEXT_MODELS))


def output_logits(output: Any, *, model: str = "the model") -> Any:
    """The logits in a model's output: a tensor, a tuple/list's first item, or ``logits``.

    Accepts what common model code returns: the logits tensor itself; a tuple or list whose
    first item is the logits (``(logits, features)``); a mapping with a ``"logits"`` key
    (``{"logits": ..., "embedding": ...}``); or an object with a ``logits`` attribute (a
    Hugging Face ``ModelOutput``).

    Args:
        output: what ``model(x)`` returned.
        model: the model's name, for the message.

    Returns:
        Tensor: the logits, (N, K) or (N, K, *).

    Raises:
        ValueError: one line naming the model and what it returned when no logits tensor can be
            found in it.
    """
    if isinstance(output, Tensor):
        return output
    found = None
    if isinstance(output, Mapping):
        found = output.get("logits")
        if not isinstance(found, Tensor):
            raise ValueError(f"{model} returned a {type(output).__name__} with keys "
                             f"{sorted(map(str, output))[:8]}, expected a 'logits' tensor in it "
                             "(or a tensor, or a tuple whose first item is the logits)")
        return found
    if isinstance(output, (tuple, list)):
        found = output[0] if output else None
        if not isinstance(found, Tensor):
            first = type(found).__name__ if output else "nothing"
            raise ValueError(f"{model} returned a {type(output).__name__} whose first item is "
                             f"{first}, expected the logits tensor")
        return found
    found = getattr(output, "logits", None)
    if isinstance(found, Tensor):
        return found
    raise ValueError(f"{model} returned {type(output).__name__}, expected the logits: a tensor, "
                     "a tuple whose first item is the logits, or a mapping with 'logits'")
