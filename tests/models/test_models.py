"""Model registry and networks: shapes, parameter counts against hand formulas and the papers."""

import functools
import subprocess
import sys

import pytest
import torch
import torchvision.models
from torch import nn

from raysearch.training.models import MLP, SmallCNN, available_models, build_model
from raysearch.training.models.densenet import DenseNet
from raysearch.training.models.resnet import BasicBlock, ResNet
from raysearch.training.models.resnet_cifar import CifarResNet, ShortcutA
from raysearch.training.models.wide_resnet import WideResNet

REGISTERED = [
    "cnn",
    "densenet40",
    "densenet_bc100",
    "mlp",
    "resnet101",
    "resnet110",
    "resnet110_sd",
    "resnet18",
    "resnet20",
    "resnet32",
    "resnet34",
    "resnet50",
    "resnet56",
    "wrn28_10",
]


def _n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: small forwards gain nothing from two, and suffer on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def _cached(name, num_classes, input_shape):
    """One build per (name, K, shape) for the read-only tests (eval mode, never trained)."""
    torch.manual_seed(0)
    return build_model(name, num_classes=num_classes, input_shape=input_shape).eval()


# --- registry --------------------------------------------------------------------------------


def test_registry():
    assert available_models(task="classification") == REGISTERED
    assert not any(name.startswith("torchvision") for name in available_models())


def test_unknown_name():
    # one registry: every name with its source, the torchvision prefix, import strings
    with pytest.raises(ValueError, match="Unknown model 'nope'") as err:
        build_model("nope", num_classes=10, input_shape=(1, 8, 8))
    message = str(err.value)
    assert message.startswith("Unknown model 'nope'; available: ")
    assert ", ".join(sorted(available_models())) + " (built-in)" in message
    assert all(name in message for name in REGISTERED)
    assert "torchvision:<name> for any torchvision classification model" in message
    assert message.endswith("or an import string package.module:attr")
    assert "\n" not in message


def test_unknown_name_suggests_the_closest():
    with pytest.raises(ValueError, match=r"Unknown model 'resnet2O' \(did you mean [^)]*resnet20"):
        build_model("resnet2O", num_classes=10, input_shape=(1, 8, 8))


def test_name_type():
    with pytest.raises(TypeError, match="name"):
        build_model(None, num_classes=10, input_shape=(1, 8, 8))


def test_classes():
    assert isinstance(build_model("cnn", num_classes=10, input_shape=(1, 8, 8)), SmallCNN)
    assert isinstance(build_model("mlp", num_classes=10, input_shape=(1, 8, 8)), MLP)


# --- every registered model: shapes ----------------------------------------------------------


@pytest.mark.parametrize("name", REGISTERED)
@pytest.mark.parametrize(
    ("num_classes", "input_shape"),
    [(10, (3, 32, 32)), (100, (3, 32, 32)), (10, (1, 28, 28))],
    ids=["cifar10", "cifar100", "mnist"],
)
def test_forward_shape(name, num_classes, input_shape):
    model = _cached(name, num_classes, input_shape)
    with torch.no_grad():
        out = model(torch.randn(2, *input_shape))
    assert out.shape == (2, num_classes)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", REGISTERED)
def test_head_grows_with_num_classes(name):
    # only the last linear layer depends on K: K=100 adds 90 * (features + 1) parameters
    small, big = _cached(name, 10, (3, 32, 32)), _cached(name, 100, (3, 32, 32))
    head = [m for m in big.modules() if isinstance(m, nn.Linear)][-1]
    assert head.out_features == 100
    assert _n_params(big) - _n_params(small) == 90 * (head.in_features + 1)


# the big networks (resnet34/50/101, wrn28_10) share their code with resnet18 and the
# WideResNet of test_wide_resnet_dropout; their 32x32 and 28x28 passes are in test_forward_shape
@pytest.mark.parametrize(
    "name",
    ["densenet40", "densenet_bc100", "resnet18", "resnet20", "resnet32", "resnet56", "resnet110"],
)
def test_smallest_and_odd_inputs(name):
    for shape in [(3, 8, 8), (3, 9, 13)]:
        with torch.no_grad():
            out = _cached(name, 10, shape)(torch.randn(2, *shape))
        assert out.shape == (2, 10)


@pytest.mark.parametrize("name", [n for n in REGISTERED if n not in ("cnn", "mlp")])
def test_too_small_input(name):
    with pytest.raises(ValueError, match=r"`input_shape` must have H, W >= 8 .*\(3, 7, 32\)"):
        build_model(name, num_classes=10, input_shape=(3, 7, 32))


@pytest.mark.parametrize("name", ["mlp", "resnet20", "resnet18", "densenet40", "densenet_bc100"])
def test_seeded_init_is_reproducible(name):
    def weights(seed):
        torch.manual_seed(seed)
        return build_model(name, num_classes=10, input_shape=(3, 32, 32)).state_dict()

    a, b, c = weights(0), weights(0), weights(1)
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


# --- CIFAR ResNets (He et al. 2016, Sec. 4.2) ------------------------------------------------


def _cifar_resnet_params(n, k, c=3):
    # stem conv 3x3 (c->16) + BN; stage 1: n blocks of two 16->16 convs + 2 BN;
    # stages 2/3: a first block 16->32 (32->64) plus n-1 blocks 32->32 (64->64);
    # option-A shortcuts have no parameters; head 64*K + K
    stem = 9 * c * 16 + 2 * 16
    stage1 = n * (2 * 9 * 16 * 16 + 2 * 2 * 16)
    stage2 = 9 * 16 * 32 + 9 * 32 * 32 + 2 * 2 * 32 + (n - 1) * (2 * 9 * 32 * 32 + 2 * 2 * 32)
    stage3 = 9 * 32 * 64 + 9 * 64 * 64 + 2 * 2 * 64 + (n - 1) * (2 * 9 * 64 * 64 + 2 * 2 * 64)
    return stem + stage1 + stage2 + stage3 + 64 * k + k


@pytest.mark.parametrize(
    ("name", "n", "published", "count"),
    [
        ("resnet20", 3, 0.27e6, 269_722),
        ("resnet32", 5, 0.46e6, 464_154),
        ("resnet56", 9, 0.85e6, 853_018),
        ("resnet110", 18, 1.7e6, 1_727_962),
    ],
)
def test_cifar_resnet_parameter_counts(name, n, published, count):
    model = _cached(name, 10, (3, 32, 32))
    assert _n_params(model) == _cifar_resnet_params(n, 10) == count
    assert abs(count / published - 1) < 0.03  # Table 6 of He et al. rounds to 2 digits
    # 6n + 2 weighted layers: 6n + 1 convolutions and the linear head
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) + 1 == 6 * n + 2
    assert all(c.kernel_size == (3, 3) for c in convs)  # no 1x1 projection shortcuts


def test_option_a_shortcut():
    shortcut = ShortcutA(16, 32, stride=2)
    assert list(shortcut.parameters()) == []
    x = torch.randn(2, 16, 9, 8)
    y = shortcut(x)
    assert y.shape == (2, 32, 5, 4)  # ceil(9 / 2), as a stride-2 padded 3x3 convolution
    assert torch.equal(y[:, :16], x[:, :, ::2, ::2])
    assert torch.equal(y[:, 16:], torch.zeros(2, 16, 5, 4))
    # resnet20 has exactly the two downsampling shortcuts, both parameter-free
    model = _cached("resnet20", 10, (3, 32, 32))
    shortcuts = [m for m in model.modules() if isinstance(m, ShortcutA)]
    assert len(shortcuts) == 2
    assert sum(_n_params(s) for s in shortcuts) == 0


def test_option_a_shortcut_bad_arguments():
    with pytest.raises(ValueError, match="out_channels"):
        ShortcutA(32, 16, stride=2)
    with pytest.raises(ValueError, match="stride"):
        ShortcutA(16, 32, stride=0)


def test_resnet20_backward_finite_grads():
    torch.manual_seed(0)
    model = build_model("resnet20", num_classes=10, input_shape=(3, 32, 32))
    loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


def test_resnet20_bf16_autocast_channels_last():
    torch.manual_seed(0)
    model = build_model("resnet20", num_classes=10, input_shape=(3, 32, 32))
    model = model.to(memory_format=torch.channels_last).eval()
    x = torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    assert out.shape == (2, 10)
    assert torch.isfinite(out.float()).all()


def test_cifar_resnet_bad_depth():
    with pytest.raises(ValueError, match=r"`depth` must be 6n \+ 2 .*got 21"):
        CifarResNet(depth=21, num_classes=10, input_shape=(3, 32, 32))


# --- ResNet-18/34/50/101 with the CIFAR stem -------------------------------------------------


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("resnet18", 11_173_962),  # the count of kuangliu/pytorch-cifar, MbLS and ACLS
        ("resnet34", 21_282_122),
        ("resnet50", 23_520_842),
        ("resnet101", 42_512_970),
    ],
)
def test_resnet_parameter_counts(name, count):
    model = _cached(name, 10, (3, 32, 32))
    assert _n_params(model) == count
    # the CIFAR stem: 3x3 stride-1 convolution, no max-pool
    assert model.conv1.kernel_size == (3, 3)
    assert model.conv1.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())


def test_resnet18_against_torchvision_formula():
    # torchvision's resnet18 (7x7 stem) minus the 7x7 conv plus a 3x3 conv (64 * 3 * (49 - 9))
    tv = torchvision.models.resnet18(weights=None, num_classes=10)
    assert _n_params(_cached("resnet18", 10, (3, 32, 32))) == _n_params(tv) - 64 * 3 * 40


def test_resnet50_is_about_23_5m():
    assert abs(_n_params(_cached("resnet50", 10, (3, 32, 32))) / 23.5e6 - 1) < 0.005


def test_resnet_bad_layers():
    with pytest.raises(ValueError, match="layers"):
        ResNet(block=BasicBlock, layers=(2, 2, 2), num_classes=10, input_shape=(3, 32, 32))


# --- WRN-28-10 -------------------------------------------------------------------------------


def test_wrn28_10_parameter_count():
    # widths 160, 320, 640, 4 blocks each; a block (in -> out) has BN(in) 2*in, conv 9*in*out,
    # BN(out) 2*out, conv 9*out*out, and a 1x1 shortcut in*out when in != out.
    # stage 1: 256,352 + 3 * 461,440; stage 2: 1,434,560 + 3 * 1,844,480;
    # stage 3: 5,736,320 + 3 * 7,375,360; stem 432, final BN 1,280, head 6,410 -> 36,479,194
    model = _cached("wrn28_10", 10, (3, 32, 32))
    assert _n_params(model) == 36_479_194
    assert abs(_n_params(model) / 36.5e6 - 1) < 0.01


def test_wide_resnet_dropout():
    model = WideResNet(
        depth=10, widen_factor=1, num_classes=10, input_shape=(3, 16, 16), dropout=0.3
    )
    with torch.no_grad():
        assert model.eval()(torch.randn(2, 3, 9, 9)).shape == (2, 10)
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert len(drops) == 3
    assert all(d.p == 0.3 for d in drops)
    default = _cached("wrn28_10", 10, (3, 32, 32))
    assert not any(isinstance(m, nn.Dropout) for m in default.modules())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"depth": 27, "widen_factor": 10}, r"`depth` must be 6n \+ 4.*got 27"),
        ({"depth": 28, "widen_factor": 0}, r"`widen_factor` .*got 0"),
        ({"depth": 28, "widen_factor": 10, "dropout": 1.0}, r"`dropout` .*got 1.0"),
    ],
)
def test_wide_resnet_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WideResNet(num_classes=10, input_shape=(3, 32, 32), **kwargs)


# --- DenseNets -------------------------------------------------------------------------------


def _densenet_params(init, growth, n, k, c=3):
    # no bottleneck, no compression: a layer on `ch` channels has BN 2*ch + conv 9*ch*growth;
    # a transition on `ch` channels has BN 2*ch + 1x1 conv ch*ch; final BN + linear head
    total, ch = 9 * c * init, init
    for block in range(3):
        for _ in range(n):
            total += 2 * ch + 9 * ch * growth
            ch += growth
        if block < 2:
            total += 2 * ch + ch * ch
    return total + 2 * ch + ch * k + k


def test_densenet40_parameter_count():
    # 16 channels out of the first convolution (paper, Sec. 3): blocks 108,240 + 298,320 +
    # 488,400, transitions 25,920 + 93,024, stem 432, final BN 896, head 4,490 -> 1,019,722
    count = _n_params(_cached("densenet40", 10, (3, 32, 32)))
    assert count == _densenet_params(16, 12, 12, 10) == 1_019_722
    assert abs(count / 1.0e6 - 1) < 0.1  # Table 2: 1.0M
    # the released code's 24-channel stem gives the 1.06M often quoted
    released = DenseNet(
        depth=40,
        growth_rate=12,
        bottleneck=False,
        compression=1.0,
        init_channels=24,
        num_classes=10,
        input_shape=(3, 32, 32),
    )
    assert _n_params(released) == _densenet_params(24, 12, 12, 10) == 1_059_298


def test_densenet_bc100_parameter_count():
    # 16 layers per block, each BN 2*ch + conv1x1 ch*48 + BN 96 + conv3x3 48*12*9;
    # transitions halve the channels (216 -> 108, 300 -> 150); final 342 channels:
    # blocks 175,680 + 242,880 + 276,480, transitions 23,760 + 45,600, stem 648,
    # final BN 684, head 3,430 -> 769,162
    count = _n_params(_cached("densenet_bc100", 10, (3, 32, 32)))
    assert count == 769_162
    assert abs(count / 0.8e6 - 1) < 0.1  # Table 2: 0.8M
    assert _cached("densenet_bc100", 10, (3, 32, 32)).fc.in_features == 342


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"depth": 41}, r"`depth` must be 3n \+ 4 .*got 41"),
        ({"depth": 43, "bottleneck": True}, r"`depth` must be 6n \+ 4 .*got 43"),
        ({"growth_rate": 0}, r"`growth_rate` .*got 0"),
        ({"compression": 0.0}, r"`compression` .*got 0.0"),
        ({"init_channels": 0}, r"`init_channels` .*got 0"),
    ],
)
def test_densenet_bad_arguments(kwargs, match):
    args = {
        "depth": 40,
        "growth_rate": 12,
        "bottleneck": False,
        "compression": 1.0,
        "init_channels": 16,
        "num_classes": 10,
        "input_shape": (3, 32, 32),
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        DenseNet(**args)


# --- torchvision:<name> ----------------------------------------------------------------------


def test_torchvision_resnet18():
    torch.manual_seed(5)
    model = build_model("torchvision:resnet18", num_classes=10, input_shape=(3, 32, 32))
    torch.manual_seed(5)
    untrained = torchvision.models.resnet18(weights=None, num_classes=10)
    assert isinstance(model, torchvision.models.ResNet)
    # the same seeded initialisation as torchvision's own untrained model: no weights loaded
    reference = untrained.state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in model.state_dict().items())
    # torchvision's resnet18: 11,689,512 for K=1000; the head shrinks by 513 * 990
    assert _n_params(model) == 11_689_512 - 513 * 990
    with torch.no_grad():
        out = model.eval()(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_torchvision_googlenet_returns_logits_in_training():
    model = build_model("torchvision:googlenet", num_classes=10, input_shape=(3, 32, 32))
    out = model.train()(torch.randn(2, 3, 32, 32))
    assert isinstance(out, torch.Tensor)
    assert out.shape == (2, 10)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("torchvision:notamodel", "Unknown torchvision classification model 'notamodel'"),
        ("torchvision:", "Unknown torchvision classification model ''"),
        ("torchvision:fcn_resnet50", "'fcn_resnet50' is not a classification model"),
    ],
)
def test_torchvision_bad_name(name, match):
    with pytest.raises(ValueError, match=match) as err:
        build_model(name, num_classes=10, input_shape=(3, 32, 32))
    assert "torchvision.models.list_models(module=torchvision.models)" in str(err.value)


def test_torchvision_needs_three_channels():
    with pytest.raises(ValueError, match=r"'resnet18' takes 3 input channels, got 1 channels"):
        build_model("torchvision:resnet18", num_classes=10, input_shape=(1, 28, 28))


def test_torchvision_num_classes_checked():
    with pytest.raises(ValueError, match="num_classes"):
        build_model("torchvision:resnet18", num_classes=1, input_shape=(3, 32, 32))


def test_import_does_not_load_torchvision():
    code = "import sys, raysearch.training.models\nprint('torchvision' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "False"


# --- cnn and mlp (unchanged from raysearch/training/models.py)
# ----------------------------------------


@pytest.mark.parametrize("name", ["cnn", "mlp"])
@pytest.mark.parametrize(
    ("num_classes", "input_shape"), [(10, (1, 8, 8)), (3, (3, 32, 32)), (5, (2, 7, 9))]
)
def test_output_shape(name, num_classes, input_shape):
    model = build_model(name, num_classes=num_classes, input_shape=input_shape)
    out = model(torch.randn(4, *input_shape))
    assert out.shape == (4, num_classes)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_cnn_parameter_count():
    # conv1 1*32*9+32 = 320; conv2 32*64*9+64 = 18,496; fc1 1024*128+128 = 131,200;
    # fc2 128*10+10 = 1,290; total 151,306
    model = build_model("cnn", num_classes=10, input_shape=(1, 8, 8))
    assert _n_params(model) == 151_306
    # the head does not grow with the image: only conv1 (3 channels) and fc2 (K=100) change
    big = build_model("cnn", num_classes=100, input_shape=(3, 32, 32))
    assert _n_params(big) == 151_306 + (3 - 1) * 32 * 9 + 128 * 90 + 90


def test_mlp_parameter_count():
    # 64*256+256 = 16,640; 256*128+128 = 32,896; 128*10+10 = 1,290; total 50,826
    model = build_model("mlp", num_classes=10, input_shape=(1, 8, 8))
    assert _n_params(model) == 50_826


def test_cnn_seeded_init_is_reproducible():
    torch.manual_seed(0)
    a = build_model("cnn", num_classes=10, input_shape=(1, 8, 8))
    torch.manual_seed(0)
    b = build_model("cnn", num_classes=10, input_shape=(1, 8, 8))
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_gradients_flow():
    model = build_model("cnn", num_classes=10, input_shape=(1, 8, 8))
    model(torch.randn(2, 1, 8, 8)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name", REGISTERED)
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_classes": 1, "input_shape": (1, 8, 8)}, "num_classes"),
        ({"num_classes": 10, "input_shape": (8, 8)}, "input_shape"),
        ({"num_classes": 10, "input_shape": (1, 0, 8)}, "input_shape"),
    ],
)
def test_bad_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_model(name, **kwargs)


def test_cnn_too_small_input():
    with pytest.raises(ValueError, match="H, W >= 2"):
        build_model("cnn", num_classes=10, input_shape=(1, 1, 8))


@pytest.mark.parametrize("name", ["mlp", "resnet20"])
def test_num_classes_type(name):
    with pytest.raises(TypeError, match="num_classes"):
        build_model(name, num_classes=10.0, input_shape=(1, 8, 8))
