"""Semantic-segmentation networks: DeepLabV3, FCN and LR-ASPP, returning per-pixel logits.

``build_model(name, num_classes=K, input_shape=(3, H, W))`` builds, randomly initialised and
without downloading anything (``weights=None, weights_backbone=None``):

- ``deeplabv3_resnet34``: DeepLabV3 on a ResNet-34 at output stride 8 (see
  :class:`DeepLabV3ResNet34`; torchvision has no builder for it).
- ``deeplabv3_resnet50``, ``deeplabv3_resnet101``: torchvision's DeepLabV3 (output stride 8).
- ``fcn_resnet50``: torchvision's FCN on a dilated ResNet-50 (output stride 8).
- ``lraspp_mobilenet_v3_large``: torchvision's LR-ASPP on MobileNetV3-Large.

Every model is a :class:`SegmentationModel`: ``forward(x)`` maps (N, 3, H, W) float to logits
(N, K, H, W) float (the head's low-resolution logits bilinearly upsampled to the input size,
``align_corners=False`` as in torchvision); it returns a tensor, never torchvision's dict, and
has no auxiliary head (``aux_loss=False``). ``model.task == "segmentation"`` tells trainers
apart from the classification models, and ``model.backbone`` is the feature extractor, whose
ImageNet classification weights :func:`load_backbone_weights` loads from a local file.

MbLS (Liu et al., CVPR 2022, Table 5) trains DeepLabV3 with ResNet-34 and ResNet-50 backbones,
ACLS (Park et al., ICCV 2023, Table 4) DeepLabV3 with a ResNet-50, both on PASCAL VOC 2012
(K = 21) from ImageNet-pretrained backbones (papers in ``/work/shared/papers/``).

References:
    Chen, Papandreou, Schroff, Adam. "Rethinking Atrous Convolution for Semantic Image
    Segmentation". arXiv:1706.05587, 2017 (DeepLabV3).

    Long, Shelhamer, Darrell. "Fully Convolutional Networks for Semantic Segmentation".
    CVPR 2015, arXiv:1411.4038 (FCN).

    Howard et al. "Searching for MobileNetV3". ICCV 2019, arXiv:1905.02244 (LR-ASPP).

    Liu, Ben Ayed, Galdran, Dolz. "The Devil is in the Margin: Margin-based Label Smoothing
    for Network Calibration". CVPR 2022, arXiv:2111.15430 (MbLS).

    Park, Noh, Oh, Ham. "ACLS: Adaptive and Conditional Label Smoothing for Network
    Calibration". ICCV 2023, arXiv:2308.11911 (ACLS).

    TorchVision maintainers and contributors. https://github.com/pytorch/vision,
    ``torchvision.models.segmentation``.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn
from torch.nn import functional as F

from raysearch.training.models._common import raise_unfit
from raysearch.training.models.small import _check_image_args

__all__ = [
    "MIN_SIZE",
    "BackboneLoadSummary",
    "DeepLabV3ResNet34",
    "DeepLabV3ResNet50",
    "DeepLabV3ResNet101",
    "FCNResNet50",
    "LRASPPMobileNetV3Large",
    "SegmentationModel",
    "load_backbone_weights",
]

MIN_SIZE = 32
"""Smallest input H and W accepted by :func:`build_model` for the segmentation models."""

_SHOW = 3  # keys quoted in an error message


class SegmentationModel(nn.Module):
    """A backbone and a head that map images (N, 3, H, W) to per-pixel logits (N, K, H, W).

    ``forward`` computes ``classifier(backbone(x)["out"])`` (or ``classifier(backbone(x))``
    for a head that takes the whole feature dict, as LR-ASPP's) and bilinearly upsamples the
    result to the input's H, W when it is smaller (``align_corners=False``, as torchvision's
    segmentation models do). The state-dict keys are ``backbone.*`` and ``classifier.*``, those
    of torchvision's segmentation models without ``aux_classifier.*``.

    Attributes:
        task (str): ``"segmentation"``, so that trainers can tell these models from the
            classification models (which have no ``task`` attribute).
        backbone (nn.Module): feature extractor returning a dict of feature maps.
        classifier (nn.Module): head mapping the features to logits at the feature resolution.
        output_stride (int): input size / size of the backbone's last feature map.

    Args:
        backbone (nn.Module): returns a dict of feature maps.
        classifier (nn.Module): the head.
        feature_key (str | None, optional): the backbone output the head takes, or ``None``
            for a head that takes the whole dict. Defaults to ``"out"``.
        output_stride (int, optional): recorded as :attr:`output_stride`. Defaults to ``8``.

    Shape:
        x: (N, 3, H, W) float; returns logits (N, K, H, W) float.
    """

    task = "segmentation"

    def __init__(
        self,
        backbone: nn.Module,
        classifier: nn.Module,
        *,
        feature_key: str | None = "out",
        output_stride: int = 8,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.classifier = classifier
        self.feature_key = feature_key
        self.output_stride = output_stride

    def forward(self, x: Tensor) -> Tensor:
        """Logits (N, K, H, W) of a batch (N, 3, H, W)."""
        features = self.backbone(x)
        out = self.classifier(features if self.feature_key is None else features[self.feature_key])
        if out.shape[-2:] != x.shape[-2:]:
            out = F.interpolate(out, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return out


def _check_segmentation_args(
    name: str, num_classes: int, input_shape: Sequence[int]
) -> tuple[int, int, int]:
    """Validate `num_classes` (>= 2) and `input_shape` ((3, H, W), H, W >= :data:`MIN_SIZE`)."""
    shape = _check_image_args(name, num_classes, input_shape, min_size=MIN_SIZE)
    if shape[0] != 3:
        raise ValueError(
            f"{name!r} takes 3 input channels, got {shape[0]} channels "
            f"(`input_shape`={tuple(input_shape)})"
        )
    return shape


class _TorchvisionSegmentation(SegmentationModel):
    """A torchvision segmentation builder's backbone and main head, without the auxiliary head."""

    _name = ""
    _output_stride = 8
    # how an ImageNet classification checkpoint of the backbone network maps onto `backbone`:
    # keys under `_checkpoint_prefix` become backbone keys, keys under `_checkpoint_head` are
    # the classifier and are dropped
    _checkpoint_prefix = ""
    _checkpoint_head = "fc."

    def __init__(self, *, num_classes: int, input_shape: Sequence[int]) -> None:
        _check_segmentation_args(self._name, num_classes, input_shape)
        import torchvision.models.segmentation  # imported on use: torchvision is slow to import

        builder = getattr(torchvision.models.segmentation, self._name)
        kwargs = {} if self._name.startswith("lraspp") else {"aux_loss": False}
        net = builder(weights=None, weights_backbone=None, num_classes=num_classes, **kwargs)
        super().__init__(
            net.backbone,
            net.classifier,
            feature_key=None if self._name.startswith("lraspp") else "out",
            output_stride=self._output_stride,
        )


class DeepLabV3ResNet50(_TorchvisionSegmentation):
    """DeepLabV3 on a ResNet-50 (``deeplabv3_resnet50``): the ACLS Table 4 / MbLS Table 5 network.

    ``torchvision.models.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None,
    num_classes=K, aux_loss=False)``: a ResNet-50 with layer3/layer4 dilated (rates 2, 4;
    output stride 8) and the DeepLabV3 head (ASPP with rates 12, 24, 36 and image pooling,
    256 channels, then 3x3 conv, BN, ReLU, 1x1 conv to K). 39,638,869 parameters for K = 21.

    Args:
        num_classes (int): number of classes K (>= 2).
        input_shape (tuple[int, int, int]): (3, H, W) of one sample; H, W >= 32.

    Shape:
        x: (N, 3, H, W) float; returns logits (N, K, H, W) float.

    Raises:
        TypeError: if `num_classes` is not an int.
        ValueError: if `num_classes` < 2, C != 3 or H, W < 32.
    """

    _name = "deeplabv3_resnet50"


class DeepLabV3ResNet101(_TorchvisionSegmentation):
    """DeepLabV3 on a ResNet-101 (``deeplabv3_resnet101``), output stride 8.

    ``torchvision.models.segmentation.deeplabv3_resnet101(weights=None, weights_backbone=None,
    num_classes=K, aux_loss=False)``; the head is that of :class:`DeepLabV3ResNet50`.
    58,630,997 parameters for K = 21.

    Arguments, shapes and errors: as :class:`DeepLabV3ResNet50`.
    """

    _name = "deeplabv3_resnet101"


class FCNResNet50(_TorchvisionSegmentation):
    """FCN on a dilated ResNet-50 (``fcn_resnet50``), output stride 8 (Long et al., CVPR 2015).

    ``torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None,
    num_classes=K, aux_loss=False)``: the ResNet-50 of :class:`DeepLabV3ResNet50` and an FCN head
    (3x3 conv 2048 -> 512, BN, ReLU, dropout 0.1, 1x1 conv to K). 32,957,013 parameters for
    K = 21.

    Arguments, shapes and errors: as :class:`DeepLabV3ResNet50`.
    """

    _name = "fcn_resnet50"


class LRASPPMobileNetV3Large(_TorchvisionSegmentation):
    """LR-ASPP on MobileNetV3-Large (``lraspp_mobilenet_v3_large``; Howard et al., ICCV 2019).

    ``torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights=None,
    weights_backbone=None, num_classes=K)``: the MobileNetV3-Large features (last stage
    dilated, output stride 16) and the Lite R-ASPP head, which combines the stride-16 features
    (gated by a global-pooling branch) with the stride-8 ones. It has no auxiliary head.
    3,221,538 parameters for K = 21. ImageNet checkpoints of ``mobilenet_v3_large`` load with
    :func:`load_backbone_weights` (keys ``features.*``; ``classifier.*`` dropped).

    Arguments, shapes and errors: as :class:`DeepLabV3ResNet50`.
    """

    _name = "lraspp_mobilenet_v3_large"
    _output_stride = 16
    _checkpoint_prefix = "features."
    _checkpoint_head = "classifier."


def _dilate_stage(stage: nn.Module, dilation: int) -> None:
    """Turn a ResNet stage's strides into `dilation` (stride 1, dilation and padding `dilation`).

    Only stride, dilation and padding of the convolutions change (no parameter does), so the
    stage keeps its state-dict keys and shapes and ImageNet weights still load.
    """
    for conv in stage.modules():
        if isinstance(conv, nn.Conv2d):
            conv.stride = (1, 1)
            if conv.kernel_size == (3, 3):
                conv.dilation = (dilation, dilation)
                conv.padding = (dilation, dilation)


class DeepLabV3ResNet34(SegmentationModel):
    """DeepLabV3 on a ResNet-34 at output stride 8 (``deeplabv3_resnet34``; MbLS Table 5).

    Backbone: ``torchvision.models.resnet34(weights=None)`` with layer3 dilated by 2 and layer4
    by 4 (every 3x3 convolution of the stage gets that dilation and padding, the strided 3x3
    convolution and the 1x1 downsample shortcut stride 1), wrapped in
    ``IntermediateLayerGetter(return_layers={"layer4": "out"})``: 512 channels at 1/8 of the
    input. Head: ``torchvision.models.segmentation.deeplabv3.DeepLabHead(512, K)`` (ASPP with
    rates 12, 24, 36 and image pooling, 256 channels, 3x3 conv, BN, ReLU, 1x1 conv to K).
    26,012,245 parameters for K = 21 (the ResNet-34's 21,284,672 without its fc, plus the head).

    Why output stride 8: it is what DeepLabV3 (Chen et al. 2017) uses for its dense-prediction
    results and what torchvision's ``deeplabv3_resnet50`` does (``replace_stride_with_dilation=
    [False, True, True]``), so ResNet-34 and ResNet-50 rows differ only in the backbone; and
    MbLS trained Table 5 with ``segmentation_models_pytorch.DeepLabV3``, whose encoder is made
    dilated in exactly this way (``make_dilated``: stages 4 and 5 at rates 2 and 4, all 3x3
    convolutions of a stage) and whose decoder is ASPP(12, 24, 36), 3x3 conv, BN, ReLU and a
    1x1 conv, as here. Output stride 32 with the same head would see 4x fewer positions per
    side: 16x16 features for MbLS's 512x512 crops, on which the rate-24 and rate-36 ASPP
    branches see little but padding (the degeneration Chen et al. note in Sec. 3.3). The cost
    is compute: layer3/layer4 run at 1/8 instead of 1/16 and 1/32 of the input size.
    torchvision's ``BasicBlock`` refuses ``dilation > 1`` at construction
    (NotImplementedError), but its forward only calls its convolutions, so the dilation is
    set on the built convolutions (this is the dilated BasicBlock); the state-dict keys and
    shapes stay those of ``resnet34``, whose ImageNet weights load with
    :func:`load_backbone_weights`.

    Arguments, shapes and errors: as :class:`DeepLabV3ResNet50`.
    """

    _checkpoint_prefix = ""
    _checkpoint_head = "fc."

    def __init__(self, *, num_classes: int, input_shape: Sequence[int]) -> None:
        _check_segmentation_args("deeplabv3_resnet34", num_classes, input_shape)
        import torchvision.models  # imported on use: torchvision is slow to import
        from torchvision.models.segmentation.deeplabv3 import DeepLabHead

        resnet = torchvision.models.resnet34(weights=None)
        _dilate_stage(resnet.layer3, 2)
        _dilate_stage(resnet.layer4, 4)
        super().__init__(_ResNetTrunk(resnet), DeepLabHead(512, num_classes), output_stride=8)


class _ResNetTrunk(nn.ModuleDict):
    """A torchvision ResNet's stem and stages, returning ``{"out": layer4 features}``.

    The children keep the ResNet's names (``conv1``, ``bn1``, ..., ``layer4``), so the state-dict
    keys are those of torchvision's own segmentation backbones and of a ResNet checkpoint
    without ``fc.*``; the pooling and the classifier of the ResNet are left out.

    Shape:
        x: (N, 3, H, W) float; returns ``{"out": (N, C, H / s, W / s)}``.
    """

    _STAGES = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")

    def __init__(self, resnet: nn.Module) -> None:
        super().__init__({name: getattr(resnet, name) for name in self._STAGES})

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        """The last stage's feature map under ``"out"``."""
        for stage in self.values():
            x = stage(x)
        return {"out": x}


@dataclass(frozen=True)
class BackboneLoadSummary:
    """What :func:`load_backbone_weights` loaded.

    Attributes:
        path (str): the file.
        loaded (int): number of backbone tensors copied (parameters and buffers).
        ignored (tuple[str, ...]): checkpoint keys of heads that were dropped (``fc.*`` of a
            ResNet checkpoint, ``classifier.*`` of a MobileNetV3 one, ``classifier.*`` and
            ``aux_classifier.*`` of a whole segmentation model).
    """

    path: str
    loaded: int
    ignored: tuple[str, ...]


def _keys(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:_SHOW])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > _SHOW else "")


def _read_state_dict(path: str) -> dict[str, Tensor]:
    """torch.load(path, weights_only=True) as a flat dict of tensors; one-line errors."""
    from raysearch.training.models.pretrained import read_state_dict

    return read_state_dict(path, "backbone weights")


def load_backbone_weights(model: nn.Module, path: str | os.PathLike[str]) -> BackboneLoadSummary:
    """Load a local ImageNet classification checkpoint into a segmentation model's backbone.

    The file is read with ``torch.load(path, map_location="cpu", weights_only=True)``: a state
    dict of tensors (or a dict holding one under ``"state_dict"`` or ``"model"``), as saved by
    ``torch.save(torchvision.models.resnet50(weights=...).state_dict(), path)``. Its keys
    are mapped onto ``model.backbone``:

    - a classification checkpoint of the backbone network (``conv1.weight``,
      ``layer1.0.conv1.weight``, ...; ``features.*`` for MobileNetV3): the classifier
      (``fc.*``; ``classifier.*`` for MobileNetV3) is dropped, the other keys must be exactly
      the backbone's;
    - a segmentation checkpoint (keys ``backbone.*``, e.g. a torchvision segmentation model's
      state dict): ``backbone.`` is stripped, ``classifier.*`` and ``aux_classifier.*`` are
      dropped.

    BatchNorm ``num_batches_tracked`` buffers may be absent (torchvision's released ImageNet
    files predate them); every other backbone key must be present with the backbone's shape.
    Nothing is loaded unless everything matches. The head stays as initialised.

    Args:
        model (nn.Module): a segmentation model of :func:`raysearch.training.models.build_model`
            (``model.task == "segmentation"``).
        path (str | os.PathLike): the checkpoint file.

    Returns:
        BackboneLoadSummary: the file, the number of tensors loaded, the dropped head keys.

    Raises:
        TypeError: if `model` is not a segmentation model.
        FileNotFoundError: if `path` is not a file.
        ValueError: (one line, naming the file) if the file is not a state dict of tensors
            readable with ``weights_only=True``, or has keys the backbone lacks, lacks keys
            it has, or has tensors of other shapes (the first few keys are named).
    """
    if getattr(model, "task", None) != "segmentation" or not hasattr(model, "backbone"):
        raise TypeError(
            "`model` must be a segmentation model of raysearch.training.models.build_model, "
            f"got {type(model).__name__}"
        )
    path = os.fspath(path)
    state = _read_state_dict(path)

    mapped: dict[str, Tensor] = {}
    ignored: list[str] = []
    unexpected: list[str] = []
    if any(k.startswith("backbone.") for k in state):
        prefix, heads = "backbone.", ("classifier.", "aux_classifier.")
    else:
        prefix = getattr(model, "_checkpoint_prefix", "")
        heads = (getattr(model, "_checkpoint_head", "fc."),)
    for key, value in state.items():
        if key.startswith(heads):
            ignored.append(key)
        elif key.startswith(prefix):
            mapped[key[len(prefix) :]] = value
        else:
            unexpected.append(key)

    expected = model.backbone.state_dict()
    unexpected += [prefix + k for k in mapped if k not in expected]
    missing = [
        prefix + k for k in expected if k not in mapped and not k.endswith(".num_batches_tracked")
    ]
    shapes = [
        f"{prefix + k} {tuple(v.shape)} vs {tuple(expected[k].shape)}"
        for k, v in mapped.items()
        if k in expected and v.shape != expected[k].shape
    ]
    raise_unfit(
        f"backbone weights in {path} do not fit {type(model).__name__}.backbone",
        [
            ("unexpected keys ", unexpected),
            ("missing keys ", missing),
            ("shape mismatches (file vs model) ", shapes),
        ],
        _keys,
    )
    model.backbone.load_state_dict(mapped, strict=False)
    return BackboneLoadSummary(path=path, loaded=len(mapped), ignored=tuple(ignored))
