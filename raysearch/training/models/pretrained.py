"""Start any model from pretrained weights: a local state dict or a torchvision weights name.

:func:`load_pretrained` copies a checkpoint into a model built by
:func:`raysearch.training.models.build_model` (fine-tuning), keeping the model's freshly initialised
classification head when the checkpoint was trained on another number of classes (e.g. the
1000 ImageNet classes into a 200-class CUB model). :func:`head_parameter_names` names the
head's parameters so that a trainer can give them their own learning rate or train them alone
for the first epochs (backbone frozen).

The weights are either a local file, read with ``torch.load(path, map_location="cpu",
weights_only=True)`` (no arbitrary pickles are executed), or a torchvision weights name such as
``"ResNet101_Weights.IMAGENET1K_V1"`` (resolved with ``torchvision.models.get_weight``), read
from torchvision's cache, ``torch.hub.get_dir()/checkpoints/<file name of weights.url>``
(i.e. ``$TORCH_HOME/hub/checkpoints``, by default ``~/.cache/torch/hub/checkpoints``), and
downloaded there only when asked (``download=True``). Every load reports the SHA-256 of the
file, to be logged with the run.

Why: MbLS (Liu et al., CVPR 2022) fine-tunes an ImageNet-pretrained ResNet-101 on
CUB-200-2011 (Table 3; Appendix B: 200 epochs, SGD, lr 0.1 decayed by 0.1 every 80 epochs,
batch 16), and its PASCAL VOC networks (Table 5) start from ImageNet-pretrained encoders, as
does ACLS's DeepLabV3 (Park et al., ICCV 2023, Table 4; its Table 3 also trains a ResNet-50 on
ImageNet itself). ALS (adaptive label smoothing) trains ResNet-50/101 on
ImageNet and fine-tunes them for MS COCO detection. torchvision's ImageNet weights are the usual
starting point; for a segmentation model's backbone alone use
:func:`raysearch.training.models.load_backbone_weights`.

Example:
    >>> from raysearch.training.models import build_model
    >>> from raysearch.training.models.pretrained import head_parameter_names, load_pretrained
    >>> model = build_model("torchvision:resnet101", num_classes=200, input_shape=(3, 224, 224))
    >>> info = load_pretrained(model, "ResNet101_Weights.IMAGENET1K_V1", download=True)
    >>> info.replaced_head, info.head, head_parameter_names(model)
    (True, 'fc', ['fc.weight', 'fc.bias'])

References:
    Liu, Ben Ayed, Galdran, Dolz. "The Devil is in the Margin: Margin-based Label Smoothing
    for Network Calibration". CVPR 2022, arXiv:2111.15430 (MbLS).

    Park, Noh, Oh, Ham. "ACLS: Adaptive and Conditional Label Smoothing for Network
    Calibration". ICCV 2023, arXiv:2308.11911 (ACLS).

    "One Size Doesn't Fit All: Adaptive Label Smoothing" (ALS; the anonymous-review copy in
    ``/work/shared/papers/adaptive_label_smoothing_objectness.md``).

    TorchVision maintainers and contributors. Model weights API (``get_weight``,
    ``WeightsEnum.get_state_dict``): https://pytorch.org/vision/stable/models.html;
    cache layout: ``torch.hub.load_state_dict_from_url``,
    https://pytorch.org/docs/stable/hub.html.
"""

import hashlib
import logging
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import Tensor, nn
from torch.nn.modules.conv import _ConvNd

from raysearch.training.models._common import raise_unfit

__all__ = ["PretrainedInfo", "file_sha256", "head_parameter_names", "load_pretrained"]

logger = logging.getLogger(__name__)

_SHOW = 3  # keys quoted in an error message
_CHUNK = 1 << 20  # bytes per read when hashing
_WEIGHTS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*_Weights\.[A-Za-z0-9_]+")
_HASH_IN_NAME = re.compile(r"-([a-f0-9]{8,})\.")  # torch.hub's convention, name-<sha256[:n]>.ext
_DDP_PREFIX = "module."


@dataclass(frozen=True)
class PretrainedInfo:
    """What :func:`load_pretrained` loaded.

    Attributes:
        source (str): the file path as given, or the resolved torchvision weights name
            (``"ResNet18_Weights.DEFAULT"`` is recorded as ``"ResNet18_Weights.IMAGENET1K_V1"``).
        sha256 (str): hex SHA-256 of the file's bytes (for a weights name, of the cached or
            downloaded file).
        loaded (int): number of tensors copied into the model (parameters and buffers).
        replaced_head (bool): whether the file's classification head had another number of
            classes and the model kept its freshly initialised head.
        head (str): the model's head module name (``"fc"``, ``"classifier.6"``, ``"head"``,
            ``"classifier"`` for a segmentation model); see :func:`head_parameter_names`.
        skipped (tuple[str, ...]): file keys not loaded: the replaced head's
            (``"fc.weight"``, ``"fc.bias"``) and, for a segmentation model, ``aux_classifier.*``.
    """

    source: str
    sha256: str
    loaded: int
    replaced_head: bool
    head: str
    skipped: tuple[str, ...] = ()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks.

    Args:
        path (str | os.PathLike): the file.

    Returns:
        str: 64 lowercase hex digits.

    Raises:
        FileNotFoundError: if `path` does not exist.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


def _out_size(module: nn.Module) -> int:
    return module.out_features if isinstance(module, nn.Linear) else module.out_channels


def _find_head(model: nn.Module) -> tuple[str, nn.Module]:
    """The classification head: a segmentation model's ``classifier``, else the last Linear.

    Falls back to the last convolution for networks without any ``nn.Linear`` (SqueezeNet's
    ``classifier.1``). "Last" is by module registration order (``model.named_modules()``).
    """
    classifier = getattr(model, "classifier", None)
    if getattr(model, "task", None) == "segmentation" and isinstance(classifier, nn.Module):
        return "classifier", classifier
    for kinds in (nn.Linear, _ConvNd):
        found = [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]
        if found:
            return found[-1]
    raise ValueError(
        f"cannot find a classification head in {type(model).__name__}: it has no nn.Linear "
        "or convolution module"
    )


def _output_layers(head_name: str, head: nn.Module) -> list[str]:
    """Names (in the model) of the head's layers that output the K class scores.

    The head itself when it is a Linear or convolution; inside a module head (a segmentation
    ``classifier``), every Linear/convolution with as many outputs as its last one (DeepLabV3
    and FCN: the final 1x1 convolution; LR-ASPP: ``low_classifier`` and ``high_classifier``).
    """
    if isinstance(head, (nn.Linear, _ConvNd)):
        return [head_name]
    layers = [(n, m) for n, m in head.named_modules() if isinstance(m, (nn.Linear, _ConvNd))]
    if not layers:
        return []
    classes = _out_size(layers[-1][1])
    return [_join(head_name, n) for n, m in layers if _out_size(m) == classes]


def head_parameter_names(model: nn.Module) -> list[str]:
    """Parameter names of the classification head, as in ``model.named_parameters()``.

    The head is, in order of precedence: a segmentation model's ``classifier`` (the whole
    decoder, ``model.task == "segmentation"``, e.g. DeepLabV3's ASPP head, trained from scratch
    in MbLS/ACLS); else the model's last ``nn.Linear`` by module registration order (``fc`` of
    ResNets, ``classifier.6`` of VGG, ``classifier.3`` of MobileNetV3, ``heads.head`` of ViT,
    ``fc``/``linear`` of this package's networks); else its last convolution (SqueezeNet's
    ``classifier.1``).

    Use it to split the parameters into two optimiser groups (head learning rate) or to
    freeze everything else (``requires_grad_(False)``) for the first epochs of fine-tuning.

    Args:
        model (nn.Module): any classification model of :func:`raysearch.training.models.build_model`
            (or any torch module), or a segmentation model.

    Returns:
        list[str]: e.g. ``["fc.weight", "fc.bias"]``, in ``named_parameters`` order.

    Raises:
        ValueError: if the model has neither a Linear nor a convolution module.
    """
    name, head = _find_head(model)
    return [_join(name, n) for n, _ in head.named_parameters()]


def _one_line(err: BaseException) -> str:
    found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
    if found:
        return f"it holds {found.group(1)}"
    first_line = (str(err).strip().splitlines() or [""])[0][:120]
    return f"{type(err).__name__}: {first_line}"


def _keys(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:_SHOW])
    return shown + (f" (+{len(keys) - _SHOW} more)" if len(keys) > _SHOW else "")


def _as_state_dict(obj: Any, where: str, what: str = "pretrained weights") -> dict[str, Tensor]:
    """A flat dict of tensors from a loaded checkpoint: unnest, strip DDP's ``module.``."""
    for key in ("state_dict", "model"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping):
        raise ValueError(
            f"{what} in {where} must be a state dict (a dict of tensors), "
            f"got {type(obj).__name__}"
        )
    bad = [str(k) for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad:
        raise ValueError(f"{what} in {where} hold non-tensor entries: {_keys(bad)}")
    state = dict(obj)
    if state and all(k.startswith(_DDP_PREFIX) for k in state):
        state = {k[len(_DDP_PREFIX) :]: v for k, v in state.items()}
    return state


def read_state_dict(path: str, what: str = "pretrained weights") -> dict[str, Tensor]:
    """``torch.load(path, weights_only=True)`` as a flat dict of tensors; one-line errors.

    Raises:
        FileNotFoundError: if `path` is not a file.
        ValueError: if the file is not a state dict of tensors that ``weights_only`` accepts.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # weights_only refusal, not a torch file, truncated, ...
        raise ValueError(
            f"cannot read {what} from {path}: not a state dict of tensors that "
            f"torch.load(weights_only=True) accepts ({_one_line(err)})"
        ) from None
    return _as_state_dict(obj, path, what)


def _resolve_weights(name: str) -> Any:
    import torchvision.models  # imported on use: torchvision is slow to import

    enum_name, value = name.split(".")
    try:
        return torchvision.models.get_weight(name)
    except KeyError:
        enum = next(
            (
                getattr(module, enum_name)
                for module in (torchvision.models, *vars(torchvision.models).values())
                if isinstance(getattr(module, enum_name, None), type)
            ),
            None,
        )
        values = f"; {enum_name} has {', '.join(enum.__members__)}" if enum else ""
        raise ValueError(f"unknown torchvision weights {name!r}{values}") from None
    except ValueError:
        raise ValueError(
            f"unknown torchvision weights {name!r}: no weights enum {enum_name!r} in "
            "torchvision.models (names look like ResNet101_Weights.IMAGENET1K_V1)"
        ) from None


def _cached_weights(name: str, *, download: bool) -> tuple[str, str, dict[str, Tensor]]:
    """(resolved name, cache path, state dict) of torchvision weights, from the cache."""
    weights = _resolve_weights(name)
    resolved = f"{type(weights).__name__}.{weights.name}"
    cache = os.path.join(
        torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(weights.url).path)
    )
    if os.path.isfile(cache):
        state = read_state_dict(cache)
    elif not download:
        raise ValueError(
            f"weights {resolved} are not in torchvision's cache ({cache}): "
            "pass --download or put the file there"
        )
    else:
        logger.info("downloading %s from %s to %s", resolved, weights.url, cache)
        obj = weights.get_state_dict(progress=True, map_location="cpu", weights_only=True)
        state = _as_state_dict(obj, cache)
    return resolved, cache, state


def _check_hash_in_name(path: str, sha256: str) -> None:
    found = _HASH_IN_NAME.search(os.path.basename(path))
    if found and not sha256.startswith(found.group(1)):
        warnings.warn(
            f"SHA-256 of {path} ({sha256[:12]}...) does not start with the hash in its name "
            f"({found.group(1)}): it is not the file torchvision released",
            stacklevel=3,
        )


def _weights_file(weights: str | os.PathLike[str], download: bool
                  ) -> tuple[str, str, str, dict[str, Tensor]]:
    """``(source, path, sha256, state dict)`` of a checkpoint file or a torchvision weights name.

    A weights name is read from torch.hub's cache (downloaded only with `download`) and its
    file's SHA-256 is checked against the hash in its name (a warning when they differ).
    """
    source = os.fspath(weights)
    if not os.path.exists(source) and _WEIGHTS_NAME.fullmatch(source):
        source, path, state = _cached_weights(source, download=download)
        sha256 = file_sha256(path)
        _check_hash_in_name(path, sha256)
    else:
        path, state = source, read_state_dict(source)
        sha256 = file_sha256(path)
    return source, path, sha256, state


def _fitting_tensors(model: nn.Module, state: dict[str, Tensor], replaceable: set[str], path: str
                     ) -> tuple[dict[str, Tensor], list[str]]:
    """The file's tensors that fit `model`, and the keys skipped (a replaceable head, ``aux``).

    A key of `replaceable` (the head's class-score layer) whose shape differs only in dim 0 is
    skipped; a segmentation model skips the file's ``aux_classifier.*``; BatchNorm
    ``num_batches_tracked`` buffers may be absent from the file.

    Raises:
        ValueError: one line naming `path` and the first unexpected keys, missing keys and
            shape mismatches.
    """
    expected = model.state_dict()
    is_segmentation = getattr(model, "task", None) == "segmentation"
    accepted: dict[str, Tensor] = {}
    skipped: list[str] = []
    unexpected: list[str] = []
    shapes: list[str] = []
    for key, value in state.items():
        if key not in expected:
            if is_segmentation and key.startswith("aux_classifier."):
                skipped.append(key)
            else:
                unexpected.append(key)
            continue
        want = expected[key].shape
        if value.shape == want:
            accepted[key] = value
        elif key in replaceable and value.dim() == len(want) and value.shape[1:] == want[1:]:
            skipped.append(key)
        else:
            shapes.append(f"{key} {tuple(value.shape)} vs {tuple(want)}")
    missing = [k for k in expected if k not in state and not k.endswith(".num_batches_tracked")]
    raise_unfit(
        f"pretrained weights in {path} do not fit {type(model).__name__}",
        [
            ("unexpected keys: ", unexpected),
            ("missing keys: ", missing),
            ("shape mismatches (file vs model): ", shapes),
        ],
        _keys,
    )
    return accepted, skipped


def load_pretrained(
    model: nn.Module, weights: str | os.PathLike[str], *, download: bool = False
) -> PretrainedInfo:
    """Copy pretrained weights into `model`, keeping a fresh head if the class count differs.

    `weights` is a local file or a torchvision weights name:

    - a file: ``torch.load(weights, map_location="cpu", weights_only=True)`` must give a
      state dict of tensors, or a dict holding one under ``"state_dict"`` or ``"model"``; a
      ``"module."`` prefix on every key (a DistributedDataParallel checkpoint) is stripped;
    - a name ``<Enum>_Weights.<VALUE>`` (not an existing path), e.g.
      ``"ResNet101_Weights.IMAGENET1K_V1"``: resolved with ``torchvision.models.get_weight``
      and read from ``torch.hub.get_dir()/checkpoints/<basename of weights.url>``; if the
      file is not there it is downloaded with ``weights.get_state_dict(progress=True)`` when
      `download` is true, else a ValueError says where to put it. A warning is issued if
      the file's SHA-256 does not start with the hash in its name (torch.hub's
      ``name-<sha256 prefix>.pth`` convention), i.e. it is not torchvision's release.

    The file's keys must be exactly the model's state-dict keys with the model's shapes,
    except that BatchNorm ``num_batches_tracked`` buffers may be absent (torchvision's
    released files predate them; the model keeps its own) and the head (see
    :func:`head_parameter_names`): the weight/bias of its class-score layer (``fc`` of a
    ResNet, ``classifier.6`` of VGG; the final K-channel convolutions of a segmentation head)
    is skipped when its shape differs only in the number of classes (dim 0), and the model
    keeps its freshly initialised head (``replaced_head=True``). A segmentation model (no
    auxiliary head) also ignores the file's ``aux_classifier.*``. Everything is checked
    before anything is copied: on error the model is unchanged.

    Args:
        model (nn.Module): the model to initialise, e.g. ``build_model("torchvision:resnet101",
            num_classes=200, input_shape=(3, 224, 224))``; modified in place.
        weights (str | os.PathLike): a checkpoint file, or a torchvision weights name.
        download (bool, optional): allow downloading a torchvision weights file missing from
            the cache. Defaults to ``False`` (never touch the network).

    Returns:
        PretrainedInfo: source, SHA-256 of the file, number of tensors loaded, whether the
        head was replaced, the head's name and the skipped file keys.

    Raises:
        FileNotFoundError: if `weights` is neither an existing file nor a weights name.
        ValueError: (one line, naming the file) if the file is not a state dict of tensors
            readable with ``weights_only=True``; if its keys or shapes do not fit the model
            (the first 3 unexpected keys, missing keys and shape mismatches are named); if
            the weights name is unknown, or not cached and `download` is false.

    A failed download raises what ``torch.hub.load_state_dict_from_url`` raises (e.g.
    ``urllib.error.URLError``).
    """
    source, path, sha256, state = _weights_file(weights, download)
    head_name, head = _find_head(model)
    replaceable = {
        _join(layer, n)
        for layer in _output_layers(head_name, head)
        for n, _ in model.get_submodule(layer).named_parameters(recurse=False)
    }
    accepted, skipped = _fitting_tensors(model, state, replaceable, path)

    result = model.load_state_dict(accepted, strict=False)
    left = [
        k for k in result.missing_keys if k not in skipped and not k.endswith("num_batches_tracked")
    ]
    if result.unexpected_keys or left:
        raise RuntimeError(  # the checks above should make this unreachable
            f"loading {path} left keys other than the head's: "
            f"{_keys(list(result.unexpected_keys) + left)}"
        )
    replaced = any(k in replaceable for k in skipped)
    logger.info(
        "loaded %d tensors from %s (sha256 %s) into %s; head %r %s",
        len(accepted),
        source,
        sha256,
        type(model).__name__,
        head_name,
        "kept fresh (other number of classes)" if replaced else "loaded",
    )
    return PretrainedInfo(
        source=source,
        sha256=sha256,
        loaded=len(accepted),
        replaced_head=replaced,
        head=head_name,
        skipped=tuple(skipped),
    )
