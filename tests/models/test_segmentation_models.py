"""Segmentation networks: (N, K, H, W) logits, parameter counts, backbone weights from a file."""

import functools
import re

import pytest
import torch
import torchvision.models
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from raysearch.training.models import (
    BackboneLoadSummary,
    SegmentationModel,
    available_models,
    build_model,
    is_segmentation_model,
    load_backbone_weights,
)

SEGMENTATION = [
    "deeplabv3_resnet101",
    "deeplabv3_resnet34",
    "deeplabv3_resnet50",
    "fcn_resnet50",
    "lraspp_mobilenet_v3_large",
]
SHAPE = (3, 64, 64)
K = 5


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: these small forwards gain nothing from more, and stall on a busy box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _n_params(model):
    return sum(p.numel() for p in model.parameters())


@functools.cache
def _cached(name, num_classes=K):
    """One build per (name, K) for the tests that neither train nor load weights."""
    torch.manual_seed(0)
    return build_model(name, num_classes=num_classes, input_shape=SHAPE).eval()


def _fresh(name, num_classes=K):
    torch.manual_seed(0)
    return build_model(name, num_classes=num_classes, input_shape=SHAPE)


def _resnet_state(arch="resnet34", seed=1):
    torch.manual_seed(seed)
    return getattr(torchvision.models, arch)(weights=None).state_dict()


def _one_line_value_error(call, needle, *more):
    with pytest.raises(ValueError, match=re.escape(needle)) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    for other in more:
        assert other in message, (other, message)
    return message


# --- registry --------------------------------------------------------------------------------


def test_registry():
    assert available_models(task="segmentation") == SEGMENTATION
    assert set(SEGMENTATION) <= set(available_models())
    classification = available_models(task="classification")
    assert not set(SEGMENTATION) & set(classification)
    assert sorted(classification + SEGMENTATION + available_models(task="text")) == \
        available_models()
    assert available_models(task="text") == ["gpool_cnn"]
    assert all(is_segmentation_model(name) for name in SEGMENTATION)
    for name in ["resnet50", "cnn", "torchvision:resnet18", "torchvision:fcn_resnet50", "x", 3]:
        assert not is_segmentation_model(name)


def test_unknown_name_lists_segmentation_models():
    with pytest.raises(ValueError, match="Unknown model 'nope'") as err:
        build_model("nope", num_classes=K, input_shape=SHAPE)
    assert all(name in str(err.value) for name in [*SEGMENTATION, "gpool_cnn"])


def test_build_on_meta_device():
    # the sweep checks names and shapes this way, without memory or initialisation
    with torch.device("meta"):
        model = build_model("deeplabv3_resnet34", num_classes=21, input_shape=(3, 512, 512))
    assert all(p.device.type == "meta" for p in model.parameters())
    assert _n_params(model) == 26_012_245


def test_available_models_bad_task():
    with pytest.raises(ValueError, match="`task` must be None or one of .*got 'detection'"):
        available_models(task="detection")


# --- every segmentation model: (N, K, H, W) logits -------------------------------------------


@pytest.mark.parametrize("name", SEGMENTATION)
def test_train_forward_backward(name):
    model = _fresh(name).train()
    x = torch.randn(2, *SHAPE)  # batch 2: BatchNorm of the pooled ASPP branch in train mode
    out = model(x)
    assert isinstance(out, torch.Tensor)
    assert out.shape == (2, K, 64, 64)
    assert out.dtype == torch.float32
    targets = torch.randint(0, K, (2, 64, 64))
    nn.functional.cross_entropy(out, targets).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
    # the gradient reaches the first convolution of the backbone
    first = next(m for m in model.backbone.modules() if isinstance(m, nn.Conv2d))
    assert first.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", SEGMENTATION)
def test_eval_forward_and_attributes(name):
    model = _cached(name)
    with torch.no_grad():
        out = model(torch.randn(2, *SHAPE))
        odd = model(torch.randn(1, 3, 33, 47))  # not a multiple of the output stride
    assert out.shape == (2, K, 64, 64)
    assert odd.shape == (1, K, 33, 47)
    assert torch.isfinite(out).all()
    assert isinstance(model, SegmentationModel)
    assert model.task == "segmentation"
    # no auxiliary head: nothing named aux, the backbone returns the head's inputs only
    assert not any("aux" in key for key in model.state_dict())
    with torch.no_grad():
        features = model.backbone(torch.randn(1, *SHAPE))
    assert "aux" not in features
    assert set(features) == ({"low", "high"} if name.startswith("lraspp") else {"out"})
    # the classification models have no task attribute
    assert not hasattr(build_model("cnn", num_classes=10, input_shape=(1, 8, 8)), "task")


@pytest.mark.parametrize(
    ("name", "count", "per_class"),
    [
        # torchvision's documented num_params (K=21, with the auxiliary FCNHead(1024, 21) of
        # 1024*256*9 + 2*256 + 256*21 + 21 = 2,365,205 parameters) minus that head; per class
        # the last 1x1 convolution has in + 1 parameters (256 + 1 for DeepLabV3, 512 + 1 for
        # FCN, 40 + 1 and 128 + 1 for LR-ASPP's two classifiers)
        ("deeplabv3_resnet50", 42_004_074 - 2_365_205, 257),
        ("deeplabv3_resnet101", 60_996_202 - 2_365_205, 257),
        ("fcn_resnet50", 35_322_218 - 2_365_205, 513),
        ("lraspp_mobilenet_v3_large", 3_221_538, 41 + 129),  # no auxiliary head
    ],
)
def test_parameter_counts_match_torchvision(name, count, per_class):
    # built at K=5 (shared with the forward tests); K=21 adds 16 classes
    assert _n_params(_cached(name)) + 16 * per_class == count


def _deeplab_head_params(in_channels, k):
    # ASPP: 1x1 conv, three 3x3 atrous convs and the pooling branch's 1x1 conv, each
    # in -> 256 with BN (512); projection 5*256 -> 256 + BN; 3x3 conv 256 -> 256 + BN;
    # 1x1 conv 256 -> K with bias
    aspp = 2 * (in_channels * 256 + 512) + 3 * (9 * in_channels * 256 + 512)
    return aspp + (5 * 256 * 256 + 512) + (9 * 256 * 256 + 512) + 256 * k + k


def test_deeplabv3_resnet34_is_resnet34_at_output_stride_8():
    model = _cached("deeplabv3_resnet34")
    blocks = [m for m in model.backbone.modules() if isinstance(m, BasicBlock)]
    assert len(blocks) == 3 + 4 + 6 + 3
    assert not any(isinstance(m, Bottleneck) for m in model.modules())
    # the ResNet-34 without fc (21,797,672 - 512*1000 - 1000) and DeepLabHead(512, 21)
    resnet34 = torchvision.models.resnet34(weights=None)
    backbone = _n_params(resnet34) - 512 * 1000 - 1000
    assert _n_params(model.backbone) == backbone == 21_284_672
    assert _n_params(model) == backbone + _deeplab_head_params(512, K)
    assert _n_params(model) + 16 * 257 == 26_012_245  # K=21
    # same keys and shapes as torchvision's resnet34 less fc: ImageNet weights fit
    expected = {k: v.shape for k, v in resnet34.state_dict().items() if not k.startswith("fc.")}
    assert {k: v.shape for k, v in model.backbone.state_dict().items()} == expected
    # output stride 8: layer3 dilated by 2, layer4 by 4, no stride there
    with torch.no_grad():
        assert model.backbone(torch.randn(1, *SHAPE))["out"].shape == (1, 512, 8, 8)
    assert model.output_stride == 8
    for stage, dilation in [(model.backbone.layer3, 2), (model.backbone.layer4, 4)]:
        convs = [m for m in stage.modules() if isinstance(m, nn.Conv2d)]
        assert all(c.stride == (1, 1) for c in convs)
        assert all(c.dilation == (dilation, dilation) for c in convs if c.kernel_size == (3, 3))
    assert model.backbone.layer2[0].conv1.stride == (2, 2)


def test_deeplab_resnet50_head_formula():
    assert _n_params(_cached("deeplabv3_resnet50").classifier) == _deeplab_head_params(2048, K)


def test_seeded_build_is_reproducible():
    a, b = _fresh("deeplabv3_resnet34").state_dict(), _fresh("deeplabv3_resnet34").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_classes": 1, "input_shape": SHAPE}, "num_classes"),
        ({"num_classes": K, "input_shape": (1, 64, 64)}, "takes 3 input channels, got 1"),
        ({"num_classes": K, "input_shape": (3, 31, 64)}, r"H, W >= 32 .*\(3, 31, 64\)"),
        ({"num_classes": K, "input_shape": (64, 64)}, "input_shape"),
    ],
)
@pytest.mark.parametrize("name", ["deeplabv3_resnet34", "lraspp_mobilenet_v3_large"])
def test_bad_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_model(name, **kwargs)


def test_num_classes_type():
    with pytest.raises(TypeError, match="num_classes"):
        build_model("deeplabv3_resnet34", num_classes=5.0, input_shape=SHAPE)


# --- backbone weights from a file ------------------------------------------------------------


def test_load_resnet50_imagenet_state_dict(tmp_path):
    state = _resnet_state("resnet50")
    path = tmp_path / "resnet50.pt"
    torch.save(state, path)
    model = _fresh("deeplabv3_resnet50")
    head = {k: v.clone() for k, v in model.classifier.state_dict().items()}
    summary = load_backbone_weights(model, path)
    backbone = model.backbone.state_dict()
    assert backbone  # every backbone tensor equals the file's
    assert all(torch.equal(v, state[k]) for k, v in backbone.items())
    assert summary == BackboneLoadSummary(
        path=str(path), loaded=len(backbone), ignored=("fc.weight", "fc.bias")
    )
    # the head is untouched
    assert all(torch.equal(v, head[k]) for k, v in model.classifier.state_dict().items())


def test_build_model_pretrained_backbone(tmp_path):
    state = _resnet_state()
    path = tmp_path / "resnet34.pt"
    torch.save(state, path)
    model = build_model(
        "deeplabv3_resnet34", num_classes=K, input_shape=SHAPE, pretrained_backbone=str(path)
    )
    assert all(torch.equal(v, state[k]) for k, v in model.backbone.state_dict().items())


@pytest.mark.parametrize("wrap", ["state_dict", "model", "backbone_prefix", "no_bn_counters"])
def test_accepted_layouts(tmp_path, wrap):
    state = _resnet_state()
    if wrap == "backbone_prefix":  # a whole segmentation model's state dict
        donor = _fresh("deeplabv3_resnet34")
        donor.backbone.load_state_dict({k: v for k, v in state.items() if k[:3] != "fc."})
        saved = {**donor.state_dict(), "aux_classifier.0.weight": torch.zeros(1)}
    elif wrap == "no_bn_counters":  # torchvision's released files predate num_batches_tracked
        saved = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    else:
        saved = {wrap: state, "epoch": 3}
    path = tmp_path / "weights.pt"
    torch.save(saved, path)
    model = _fresh("deeplabv3_resnet34")
    summary = load_backbone_weights(model, path)
    for key, value in model.backbone.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            assert torch.equal(value, state[key]), key
    if wrap == "backbone_prefix":
        assert "aux_classifier.0.weight" in summary.ignored
        assert "classifier.4.weight" in summary.ignored
        assert summary.loaded == len(model.backbone.state_dict())


def test_load_mobilenet_v3_state_dict(tmp_path):
    torch.manual_seed(1)
    state = torchvision.models.mobilenet_v3_large(weights=None).state_dict()
    torch.save(state, tmp_path / "mnv3.pt")
    model = _fresh("lraspp_mobilenet_v3_large")
    summary = load_backbone_weights(model, tmp_path / "mnv3.pt")
    for key, value in model.backbone.state_dict().items():
        assert torch.equal(value, state["features." + key]), key
    assert summary.ignored
    assert all(k.startswith("classifier.") for k in summary.ignored)


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (
            lambda s: s.update({"layer1.0.conv1.weight": torch.zeros(64, 64, 1, 1)}),
            ["shape mismatches", "layer1.0.conv1.weight (64, 64, 1, 1) vs (64, 64, 3, 3)"],
        ),
        (lambda s: s.update({"extra.weight": torch.zeros(2)}), ["unexpected keys extra.weight"]),
        (lambda s: s.pop("conv1.weight"), ["missing keys conv1.weight"]),
    ],
    ids=["shape", "unknown_key", "missing_key"],
)
def test_mismatched_file(tmp_path, edit, needles):
    state = _resnet_state()
    edit(state)
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    model = _fresh("deeplabv3_resnet34")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _one_line_value_error(lambda: load_backbone_weights(model, path), *needles, str(path))
    # nothing was loaded
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_wrong_architecture_names_first_keys(tmp_path):
    torch.save(_resnet_state("resnet18"), tmp_path / "r18.pt")
    message = _one_line_value_error(
        lambda: load_backbone_weights(_fresh("deeplabv3_resnet34"), tmp_path / "r18.pt"),
        "missing keys layer1.2.conv1.weight",
    )
    assert "in all)" in message  # only the first few of the many keys are quoted


class _NotATensor:
    pass


def test_non_tensor_pickle(tmp_path):
    path = tmp_path / "object.pt"
    torch.save({"conv1.weight": _NotATensor()}, path)
    _one_line_value_error(
        lambda: load_backbone_weights(_fresh("deeplabv3_resnet34"), path),
        str(path),
        "weights_only=True",
        "_NotATensor",
    )


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"not a checkpoint", "weights_only=True"),
        ([1, 2], "must be a state dict (a dict of tensors), got list"),
        ({"conv1.weight": 3}, "non-tensor entries: conv1.weight"),
    ],
    ids=["junk", "list", "int_entry"],
)
def test_unreadable_file(tmp_path, content, needle):
    path = tmp_path / "weights.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    _one_line_value_error(
        lambda: load_backbone_weights(_fresh("deeplabv3_resnet34"), path), str(path), needle
    )


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_backbone_weights(_fresh("deeplabv3_resnet34"), tmp_path / "nope.pt")


def test_load_into_classification_model(tmp_path):
    with pytest.raises(TypeError, match="segmentation model"):
        load_backbone_weights(build_model("resnet18", num_classes=10, input_shape=SHAPE), "x")


@pytest.mark.parametrize("name", ["resnet18", "torchvision:resnet18"])
def test_pretrained_backbone_refused_for_classification(tmp_path, name):
    path = tmp_path / "resnet18.pt"  # never read
    _one_line_value_error(
        lambda: build_model(name, num_classes=10, input_shape=SHAPE, pretrained_backbone=path),
        "takes no argument 'pretrained_backbone'",
        repr(name),
    )
