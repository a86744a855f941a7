"""ResNet-110 with stochastic depth (Huang et al., ECCV 2016): ``resnet110_sd``."""

import pytest
import torch

from raysearch.training.models import build_model
from raysearch.training.models.resnet_cifar import _BasicBlock, survival_probabilities


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _blocks(model):
    return [m for m in model.modules() if isinstance(m, _BasicBlock)]


def test_survival_probabilities_linear_decay():
    # p_l = 1 - l / L (1 - p_L), L = 54, p_L = 0.5: p_1 = 1 - 0.5 / 54 = 0.990740..., p_54 = 0.5
    p = survival_probabilities(54, 0.5)
    assert len(p) == 54
    assert p[0] == pytest.approx(1.0 - 0.5 / 54, rel=1e-15)
    assert p[0] == pytest.approx(0.9907407407, rel=1e-9)
    assert p[-1] == pytest.approx(0.5, rel=1e-15)
    assert p[26] == pytest.approx(1.0 - 27 / 54 * 0.5)  # the middle block: 0.75
    model = build_model("resnet110_sd", num_classes=10, input_shape=(3, 32, 32))
    assert [b.survival_prob for b in _blocks(model)] == p


def test_parameter_count_equals_resnet110():
    sd = build_model("resnet110_sd", num_classes=10, input_shape=(3, 32, 32))
    plain = build_model("resnet110", num_classes=10, input_shape=(3, 32, 32))
    assert sum(p.numel() for p in sd.parameters()) == 1_727_962
    assert [k for k in sd.state_dict()] == [k for k in plain.state_dict()]


def test_eval_is_the_expected_value_network():
    # in float64: the two networks are equal in exact arithmetic but sum in another order, and
    # untrained ResNet-110 logits reach ~1e3, so float32 rounding of ~1e-4 differs by CPU kernel
    torch.manual_seed(0)
    sd = build_model("resnet110_sd", num_classes=10, input_shape=(3, 16, 16)).double().eval()
    plain = build_model("resnet110", num_classes=10, input_shape=(3, 16, 16)).double()
    plain.load_state_dict(sd.state_dict())
    plain.eval()
    # in eval BN is affine, so p_l * bn2(x) = BN with weight and bias scaled by p_l
    with torch.no_grad():
        for block, p in zip(_blocks(plain), survival_probabilities(54, 0.5), strict=True):
            block.bn2.weight.mul_(p)
            block.bn2.bias.mul_(p)
        x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
        out = sd(x)
        torch.testing.assert_close(out, sd(x), rtol=0, atol=0)  # deterministic
        expected = plain(x)
        # float64 keeps ~16 digits; 54 blocks of re-ordered sums lose a few of them
        scale = expected.abs().max().item()
        assert scale > 1.0  # the comparison is not between zeros
        torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9 * scale)
        # and the stochastic-depth scaling matters: without it the outputs differ
        unscaled = build_model("resnet110", num_classes=10, input_shape=(3, 16, 16)).double()
        unscaled.load_state_dict(sd.state_dict())
        assert not torch.allclose(unscaled.eval()(x), expected, rtol=1e-3, atol=1e-3 * scale)


def test_training_with_survival_one_is_the_plain_resnet110():
    torch.manual_seed(1)
    sd = build_model(
        "resnet110_sd", num_classes=10, input_shape=(3, 32, 32), survival_prob_last=1.0
    ).train()
    plain = build_model("resnet110", num_classes=10, input_shape=(3, 32, 32)).train()
    plain.load_state_dict(sd.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(sd(x), plain(x), rtol=0, atol=0)


def test_training_drops_blocks():
    # p_L = 0.5: in training some blocks are skipped, so two draws differ; eval does not
    torch.manual_seed(2)
    model = build_model("resnet110_sd", num_classes=10, input_shape=(3, 8, 8)).train()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        first, second = model(x), model(x)
    assert not torch.equal(first, second)


@pytest.mark.parametrize(
    ("value", "error"), [(0.0, ValueError), (1.5, ValueError), ("half", TypeError)]
)
def test_bad_survival_prob(value, error):
    with pytest.raises(error, match="survival_prob_last"):
        build_model("resnet110_sd", num_classes=10, input_shape=(3, 32, 32),
                    survival_prob_last=value)
