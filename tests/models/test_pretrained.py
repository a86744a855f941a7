"""Pretrained weights into any model: head replacement, strict key checks, torchvision cache."""

import hashlib
import os
import pickle

import pytest
import torch
import torch.hub
import torchvision.models

from raysearch.training.models import build_model
from raysearch.training.models.pretrained import (
    PretrainedInfo,
    file_sha256,
    head_parameter_names,
    load_pretrained,
)

SHAPE = (3, 64, 64)
RESNET18_FILE = "resnet18-f37072fd.pth"  # basename of ResNet18_Weights.IMAGENET1K_V1.url


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: these small models gain nothing from more, and stall on a busy box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _imagenet_resnet18(seed=1):
    torch.manual_seed(seed)
    return torchvision.models.resnet18(weights=None, num_classes=1000).state_dict()


def _save(state, path):
    torch.save(state, path)
    return path


def _model(name="torchvision:resnet18", num_classes=10, seed=0):
    torch.manual_seed(seed)
    return build_model(name, num_classes=num_classes, input_shape=SHAPE)


def _clone_state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_backbone_equal(model, state, head=("fc.",)):
    for key, value in model.state_dict().items():
        if key.startswith(head) or key not in state:
            continue
        torch.testing.assert_close(value, state[key], rtol=0, atol=0, msg=key)


def test_imagenet_resnet18_into_10_classes(tmp_path):
    state = _imagenet_resnet18()
    path = _save(state, tmp_path / "resnet18.pt")
    model = _model()
    fresh_fc = model.fc.weight.detach().clone()

    info = load_pretrained(model, path)

    assert isinstance(info, PretrainedInfo)
    assert info.replaced_head is True
    assert info.head == "fc"
    assert info.source == str(path)
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.skipped == ("fc.weight", "fc.bias")
    assert info.loaded == len(state) - 2
    _assert_backbone_equal(model, state)
    assert model.fc.weight.shape == (10, 512)
    torch.testing.assert_close(model.fc.weight, fresh_fc, rtol=0, atol=0)  # kept fresh
    assert model(torch.randn(2, *SHAPE)).shape == (2, 10)


def test_same_number_of_classes_loads_head(tmp_path):
    torch.manual_seed(3)
    state = torchvision.models.resnet18(weights=None, num_classes=10).state_dict()
    path = _save(state, tmp_path / "resnet18_10.pt")
    model = _model()

    info = load_pretrained(model, path)

    assert info.replaced_head is False
    assert info.skipped == ()
    assert info.loaded == len(state)
    _assert_backbone_equal(model, state, head=())  # fc included


def test_own_cifar_resnet18_100_to_10_classes(tmp_path):
    source = _model("resnet18", num_classes=100, seed=5)
    state = source.state_dict()
    path = _save(state, tmp_path / "cifar_resnet18_c100.pt")
    model = _model("resnet18", num_classes=10)

    info = load_pretrained(model, path)

    assert (info.replaced_head, info.head) == (True, "fc")
    assert model.fc.weight.shape == (10, 512)
    _assert_backbone_equal(model, state)


def test_mobilenet_sequential_classifier(tmp_path):
    """Only the last Linear (classifier.3) is the head; classifier.0 loads."""
    torch.manual_seed(2)
    state = torchvision.models.mobilenet_v3_small(weights=None).state_dict()
    path = _save(state, tmp_path / "mnv3.pt")
    model = _model("torchvision:mobilenet_v3_small")

    info = load_pretrained(model, path)

    assert (info.replaced_head, info.head) == (True, "classifier.3")
    assert info.skipped == ("classifier.3.weight", "classifier.3.bias")
    _assert_backbone_equal(model, state, head=("classifier.3.",))
    torch.testing.assert_close(model.classifier[0].weight, state["classifier.0.weight"])


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda s: {"state_dict": s, "epoch": 7}, id="state_dict"),
        pytest.param(lambda s: {"model": s, "optimizer": {}}, id="model"),
        pytest.param(lambda s: {f"module.{k}": v for k, v in s.items()}, id="ddp"),
        pytest.param(
            lambda s: {k: v for k, v in s.items() if not k.endswith("num_batches_tracked")},
            id="no_num_batches_tracked",
        ),
    ],
)
def test_accepted_layouts(tmp_path, wrap):
    state = _imagenet_resnet18()
    path = _save(wrap(state), tmp_path / "weights.pt")
    model = _model()

    info = load_pretrained(model, os.fspath(path))

    assert info.replaced_head is True
    _assert_backbone_equal(model, state)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: {**s, "extra.weight": torch.zeros(3)}, r"unexpected keys: extra\.weight"),
        (
            lambda s: {**s, "conv1.weight": torch.zeros(64, 3, 3, 3)},
            r"shape mismatches \(file vs model\): conv1\.weight \(64, 3, 3, 3\) vs \(64, 3, 7, 7\)",
        ),
        (
            lambda s: {k: v for k, v in s.items() if not k.startswith("layer4.1.")},
            r"missing keys: layer4\.1\.conv1\.weight, layer4\.1\.bn1\.weight, "
            r"layer4\.1\.bn1\.bias \(\+\d+ more\)",
        ),
        (
            # a head of another input width is not a class-count change
            lambda s: {**s, "fc.weight": torch.zeros(1000, 256)},
            r"fc\.weight \(1000, 256\) vs \(10, 512\)",
        ),
    ],
    ids=["extra_key", "wrong_conv_shape", "missing_keys", "head_in_features"],
)
def test_mismatch_is_one_line_error_and_loads_nothing(tmp_path, edit, match):
    path = _save(edit(_imagenet_resnet18()), tmp_path / "bad.pt")
    model = _model()
    before = _clone_state(model)

    with pytest.raises(ValueError, match=match) as err:
        load_pretrained(model, path)

    assert "\n" not in str(err.value)
    assert str(path) in str(err.value)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_full_resnet18_file_does_not_fit_cifar_resnet18(tmp_path):
    path = _save(_imagenet_resnet18(), tmp_path / "imagenet.pt")
    with pytest.raises(ValueError, match=r"unexpected keys: .*\(\+\d+ more\); missing keys"):
        load_pretrained(_model("resnet18"), path)


class _NotATensor:
    pass


def test_pickle_refused_by_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as file:
        pickle.dump({"x": _NotATensor()}, file, protocol=2)

    with pytest.raises(
        ValueError, match=r"cannot read .*evil\.pt: .*\(it holds .*_NotATensor\)"
    ) as err:
        load_pretrained(_model(), path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ([torch.zeros(2)], "must be a state dict .* got list"),
        ({"w": torch.zeros(2), "epoch": 3}, "non-tensor entries: epoch"),
    ],
)
def test_not_a_state_dict(tmp_path, obj, match):
    path = _save(obj, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=match) as err:
        load_pretrained(_model(), path)
    assert "\n" not in str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("name", ["nowhere.pt", "ResNet18_Weights"])
def test_missing_file(tmp_path, name):
    with pytest.raises(FileNotFoundError, match=name):
        load_pretrained(_model(), tmp_path / name)


@pytest.fixture
def torch_home(tmp_path, monkeypatch):
    """An empty torchvision cache under tmp_path: nothing real is read or written."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    checkpoints = tmp_path / "torch_home" / "hub" / "checkpoints"
    assert os.path.join(torch.hub.get_dir(), "checkpoints") == str(checkpoints)
    return checkpoints


def test_weights_name_not_cached(torch_home):
    with pytest.raises(ValueError, match="not in torchvision's cache") as err:
        load_pretrained(_model(), "ResNet18_Weights.IMAGENET1K_V1")
    message = str(err.value)
    assert "\n" not in message
    assert str(torch_home / RESNET18_FILE) in message
    assert "--download" in message
    assert not (torch_home / RESNET18_FILE).exists()


def test_weights_name_from_cache(torch_home):
    torch_home.mkdir(parents=True)
    state = _imagenet_resnet18()
    path = _save(state, torch_home / RESNET18_FILE)
    model = _model()

    # our stand-in file is not torchvision's: its hash differs from the one in its name
    with pytest.warns(UserWarning, match="f37072fd"):
        info = load_pretrained(model, "ResNet18_Weights.DEFAULT")

    assert info.source == "ResNet18_Weights.IMAGENET1K_V1"
    assert info.sha256 == file_sha256(path)
    assert (info.replaced_head, info.head) == (True, "fc")
    _assert_backbone_equal(model, state)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("ResNet18_Weights.NOPE", "ResNet18_Weights has IMAGENET1K_V1"),
        ("Nope_Weights.IMAGENET1K_V1", "no weights enum 'Nope_Weights'"),
    ],
)
def test_unknown_weights_name(torch_home, name, match):
    with pytest.raises(ValueError, match=match):
        load_pretrained(_model(), name)


def test_segmentation_model_keeps_fresh_class_layers(tmp_path):
    """LR-ASPP has two K-channel output convolutions; both stay fresh for another K."""
    torch.manual_seed(4)
    state = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=21
    ).state_dict()
    path = _save(state, tmp_path / "lraspp21.pt")
    model = _model("lraspp_mobilenet_v3_large", num_classes=5)

    info = load_pretrained(model, path)

    assert (info.replaced_head, info.head) == (True, "classifier")
    assert set(info.skipped) == {
        "classifier.low_classifier.weight",
        "classifier.low_classifier.bias",
        "classifier.high_classifier.weight",
        "classifier.high_classifier.bias",
    }
    _assert_backbone_equal(model, state, head=("classifier.low_", "classifier.high_"))


def test_head_parameter_names():
    assert head_parameter_names(_model()) == ["fc.weight", "fc.bias"]
    assert head_parameter_names(_model("torchvision:mobilenet_v3_small")) == [
        "classifier.3.weight",
        "classifier.3.bias",
    ]
    assert head_parameter_names(_model("torchvision:squeezenet1_1")) == [
        "classifier.1.weight",
        "classifier.1.bias",
    ]
    assert head_parameter_names(_model("resnet20")) == ["fc.weight", "fc.bias"]
    segmentation = _model("lraspp_mobilenet_v3_large", num_classes=5)
    names = head_parameter_names(segmentation)
    assert names == [f"classifier.{n}" for n, _ in segmentation.classifier.named_parameters()]
    params = dict(segmentation.named_parameters())
    assert all(n in params for n in names)


def test_head_parameter_names_vgg11():
    """VGG's classifier is a Sequential; the head is its last Linear, classifier.6."""
    with torch.device("meta"):  # no 130M-parameter initialisation
        model = torchvision.models.vgg11(weights=None, num_classes=10)
    assert head_parameter_names(model) == ["classifier.6.weight", "classifier.6.bias"]


def test_head_parameter_names_without_head():
    with pytest.raises(ValueError, match="no nn.Linear or convolution"):
        head_parameter_names(torch.nn.Sequential(torch.nn.ReLU()))


def test_file_sha256_streams(tmp_path):
    path = tmp_path / "blob.bin"
    data = os.urandom((1 << 20) * 2 + 123)  # crosses the 1 MiB chunk boundary
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
