"""Model factory: networks for digits and 32x32 images, and segmentation networks, built by name.

Every model is built as ``build_model(name, num_classes=K, input_shape=(C, H, W))``. The
classification models map a float32 batch (N, C, H, W) to logits (N, K):

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

The segmentation models (:mod:`raysearch.models.segmentation`) map (N, 3, H, W) to per-pixel
logits (N, K, H, W), have ``model.task == "segmentation"`` (see :func:`is_segmentation_model`)
and take ImageNet backbone weights from a local file (:func:`load_backbone_weights`, or
``build_model(..., pretrained_backbone=path)``):

- ``deeplabv3_resnet34``, ``deeplabv3_resnet50``, ``deeplabv3_resnet101``: DeepLabV3, Chen
  et al., arXiv:1706.05587, 2017 (output stride 8; the networks of MbLS Table 5 and ACLS
  Table 4 on PASCAL VOC).
- ``fcn_resnet50``: Long et al., CVPR 2015, arXiv:1411.4038.
- ``lraspp_mobilenet_v3_large``: LR-ASPP, Howard et al., ICCV 2019, arXiv:1905.02244.

The classification networks other than ``cnn`` and ``mlp`` use global average pooling and accept any
H, W >= 8. The registry is the plain dict ``_MODELS`` below: to add a model, write an
``nn.Module`` whose constructor takes keyword-only ``num_classes`` and ``input_shape`` in its
family file and add one line here.

Example:
    >>> from raysearch.models import build_model
    >>> model = build_model("cnn", num_classes=10, input_shape=(1, 8, 8))
    >>> model = build_model("resnet20", num_classes=100, input_shape=(3, 32, 32))
    >>> model = build_model("deeplabv3_resnet50", num_classes=21, input_shape=(3, 512, 512))
"""

import os
from collections.abc import Callable, Sequence

from torch import nn

from raysearch.models.densenet import DenseNet40, DenseNetBC100
from raysearch.models.resnet import ResNet18, ResNet34, ResNet50, ResNet101
from raysearch.models.resnet_cifar import ResNet20, ResNet32, ResNet56, ResNet110
from raysearch.models.segmentation import (
    BackboneLoadSummary,
    DeepLabV3ResNet34,
    DeepLabV3ResNet50,
    DeepLabV3ResNet101,
    FCNResNet50,
    LRASPPMobileNetV3Large,
    SegmentationModel,
    load_backbone_weights,
)
from raysearch.models.small import MLP, SmallCNN
from raysearch.models.text import GlobalPoolingCNN, build_gpool_cnn, load_glove
from raysearch.models.torchvision_models import TORCHVISION_PREFIX, torchvision_factory
from raysearch.models.wide_resnet import WRN28_10

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
    "SegmentationModel",
    "SmallCNN",
    "WRN28_10",
    "GlobalPoolingCNN",
    "available_models",
    "build_model",
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


def available_models(task: str | None = None) -> list[str]:
    """Names accepted by :func:`build_model`, sorted (``torchvision:<name>`` not listed).

    Args:
        task (str | None, optional): ``"classification"`` (image classifiers),
            ``"segmentation"`` or ``"text"`` (token-sequence classifiers: ``gpool_cnn``) for the
            models of that task only. Defaults to ``None`` (all models).

    Returns:
        list[str]: the registered names, sorted.

    Raises:
        ValueError: if `task` is not ``None``, ``"classification"`` or ``"segmentation"``.
    """
    if task is None:
        return sorted([*_MODELS, *_SEGMENTATION_MODELS, *_TEXT_MODELS])
    if task not in _TASKS:
        raise ValueError(f"`task` must be None or one of {', '.join(_TASKS)}, got {task!r}")
    return sorted({"classification": _MODELS, "segmentation": _SEGMENTATION_MODELS,
                   "text": _TEXT_MODELS}[task])


def is_segmentation_model(name: str) -> bool:
    """Whether `name` is a registered segmentation model (its output is (N, K, H, W) logits).

    Args:
        name (str): a model name as given to :func:`build_model`.

    Returns:
        bool: ``True`` for the names of :func:`available_models` ``(task="segmentation")``,
        ``False`` for any other name (classification, ``torchvision:<name>``, unknown).
    """
    return isinstance(name, str) and name in _SEGMENTATION_MODELS


def build_model(
    name: str,
    *,
    num_classes: int,
    input_shape: Sequence[int],
    pretrained_backbone: str | os.PathLike[str] | None = None,
    vocabulary: Sequence[str] | None = None,
    embeddings_path: str | os.PathLike[str] | None = None,
) -> nn.Module:
    """Build a freshly initialised model by name.

    Initialisation uses each model's initialisers (PyTorch's defaults for ``cnn`` and ``mlp``,
    He normal convolutions for the others, torchvision's for the segmentation models; see each
    class) and the global torch RNG: seed it (``torch.manual_seed``) first for a reproducible
    model. Nothing is downloaded.

    Args:
        name (str): model name, one of :func:`available_models`, or ``"torchvision:<name>"``
            for a torchvision classification model (e.g. ``"torchvision:resnet18"``).
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (C, H, W) of one sample.
        pretrained_backbone (str | os.PathLike | None, optional): for a segmentation model, a
            local ImageNet checkpoint of its backbone, loaded with
            :func:`load_backbone_weights` after initialisation. Defaults to ``None`` (none).
        vocabulary (Sequence[str] | None, optional): a text model's vocabulary (token i + 1 is
            ``vocabulary[i]``; the text datasets' ``splits.vocabulary``). Ignored by other
            models. Defaults to ``None``.
        embeddings_path (str | os.PathLike | None, optional): a GloVe-format text file whose
            vectors initialise (frozen) a text model's embedding (:func:`load_glove`); None:
            learned embeddings. Defaults to ``None``.

    Returns:
        nn.Module: a classification model maps (N, C, H, W) float inputs to (N, K) float
        logits; a segmentation model (:func:`is_segmentation_model`) maps (N, 3, H, W) to
        (N, K, H, W) float logits.

    Raises:
        TypeError: if `name` is not a str or `num_classes` is not an int.
        ValueError: if `name` is not registered and not a torchvision classification model,
            on invalid `num_classes` / `input_shape` (H, W < 8 for the convolutional
            networks other than ``cnn``; C != 3 for torchvision and segmentation models;
            H, W < 32 for segmentation models), if `pretrained_backbone` is given for a
            classification model, or (from :func:`load_backbone_weights`) if the file does
            not fit the backbone.
        FileNotFoundError: if `pretrained_backbone` is not a file.
    """
    if not isinstance(name, str):
        raise TypeError(f"`name` must be a str, got {type(name).__name__}")
    factory: Callable[..., nn.Module]
    if name.startswith(TORCHVISION_PREFIX):
        factory = torchvision_factory(name[len(TORCHVISION_PREFIX) :])
    elif name in _MODELS:
        factory = _MODELS[name]
    elif name in _SEGMENTATION_MODELS:
        factory = _SEGMENTATION_MODELS[name]
    elif name in _TEXT_MODELS:
        return _TEXT_MODELS[name](num_classes=num_classes, input_shape=input_shape,
                                  vocabulary=vocabulary, embeddings_path=embeddings_path)
    else:
        raise ValueError(
            f"Unknown model {name!r}; available: "
            f"{', '.join(available_models(task='classification'))}, "
            f"or {TORCHVISION_PREFIX}<name> for any torchvision classification model; "
            f"segmentation: {', '.join(available_models(task='segmentation'))}; "
            f"text: {', '.join(available_models(task='text'))}"
        )
    if embeddings_path is not None:
        raise ValueError(f"--embeddings applies to text models "
                         f"({', '.join(available_models(task='text'))}), not {name!r}")
    if pretrained_backbone is not None and not is_segmentation_model(name):
        raise ValueError(
            "--pretrained-backbone applies to segmentation models "
            f"({', '.join(available_models(task='segmentation'))}), not {name!r}"
        )
    model = factory(num_classes=num_classes, input_shape=input_shape)
    if pretrained_backbone is not None:
        load_backbone_weights(model, pretrained_backbone)
    return model
