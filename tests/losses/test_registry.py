"""Tests of the loss registry and of behaviour shared by every registered loss."""

import re
import subprocess
import sys

import pytest
import torch

import raysearch.losses as losses
from raysearch.losses import available_losses, build_loss, loss_parameters
from raysearch.training.data.side import loss_side_inputs

ALL = ["acls", "als", "avuc", "avuc_gs", "ce", "cpc", "crl", "ecp", "flsd", "focal", "ls", "mbls",
       "mdca", "mmce", "savuc", "sbece"]
# losses with a regulariser and a terms() method
MARGIN = ("mbls", "acls")
# every loss with parameters that make its regulariser active on logits of scale ~8
ACTIVE = [
    ("ce", {}),
    ("ls", {"epsilon": 0.2}),
    ("focal", {"gamma": 2.0}),
    ("flsd", {}),
    ("mbls", {"margin": 2.0}),
    ("mbls", {"margin": 2.0, "variant": "paper"}),
    ("acls", {"margin": 2.0}),
    ("acls", {"margin": 2.0, "variant": "paper"}),
    ("ecp", {"beta": 0.5}),
    ("ecp", {"beta": 0.5, "variant": "paper"}),
    # secondary objectives (total = primary + beta * secondary): defaults are the released code
    ("sbece", {"temperature": 0.05}),
    ("sbece", {"temperature": 0.05, "binning": "bin"}),
    ("sbece", {"temperature": 0.05, "p": 1, "variant": "paper"}),
    ("savuc", {"kappa": 0.3}),
    ("savuc", {"kappa": 0.3, "variant": "paper"}),
    ("avuc", {"kappa": 1.0}),
    ("avuc_gs", {"kappa": 1.0, "variant": "paper"}),
    ("mmce", {}),
    ("mmce", {"weighted": True}),
    ("mmce", {"variant": "paper"}),
    ("mdca", {}),
    ("cpc", {}),
    ("cpc", {"variant": "paper"}),
]


def _side_info(name, logits):
    """Keyword side information a loss needs (objectness for `als`, index for `crl`)."""
    names = loss_side_inputs(build_loss(name))
    side = {"objectness": torch.linspace(0.1, 0.9, logits.shape[0]),
            "index": torch.arange(logits.shape[0])}
    return {key: side[key] for key in names}


def _random_inputs(shape=(8, 5), scale=8.0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, generator=generator) * scale
    target_shape = shape[:1] + shape[2:]
    targets = torch.randint(0, shape[1], target_shape, generator=generator)
    return logits, targets


class TestRegistry:
    def test_available_losses_sorted_and_complete(self):
        assert available_losses() == ALL
        assert available_losses() == sorted(available_losses())

    def test_unknown_name_lists_available(self):
        message = "Unknown loss 'nope'; available: " + ", ".join(ALL)
        with pytest.raises(ValueError, match=re.escape(message)):
            build_loss("nope")
        with pytest.raises(ValueError, match="Unknown loss"):
            loss_parameters("nope")

    def test_unexpected_parameter(self):
        message = "loss 'ce' got unexpected parameter(s) margin; accepted: (none)"
        with pytest.raises(ValueError, match=re.escape(message)):
            build_loss("ce", margin=1.0)
        message = "loss 'ls' got unexpected parameter(s) alpha, gamma; accepted: epsilon"
        with pytest.raises(ValueError, match=re.escape(message)):
            build_loss("ls", gamma=1.0, alpha=0.1)

    def test_loss_parameters(self):
        assert loss_parameters("ce") == {}
        # defaults = the released code and configs behind the published tables (issue 7)
        assert loss_parameters("ls") == {"epsilon": 0.05}
        assert loss_parameters("focal") == {"gamma": 3.0}
        assert loss_parameters("flsd") == {"threshold": 0.2, "gamma_high": 5.0, "gamma_low": 3.0}
        assert loss_parameters("mbls") == {"margin": 10.0, "alpha": 0.1, "variant": "official"}
        assert loss_parameters("acls") == {
            "margin": 10.0,
            "lambda1": 0.1,
            "lambda2": 0.01,
            "variant": "official",
        }
        assert loss_parameters("ecp") == {"beta": 0.1, "variant": "official"}
        assert loss_parameters("als") == {"beta": 1.0, "context_fraction": 0.0}
        assert loss_parameters("cpc") == {"lambda1": 1.0, "lambda2": 1.0, "variant": "official"}
        assert loss_parameters("crl") == {"rank_weight": 1.0}

    def test_secondary_objective_parameters(self):
        # the released code ("official") is the default variant of every Karandikar et al.
        # objective and of MMCE; MDCA's paper and code agree, so it has no variant
        common = {"beta": 1.0, "primary": "ce", "primary_params": None}
        assert loss_parameters("sbece") == {
            **common,
            "n_bins": 15,
            "temperature": 0.01,
            "p": 2,
            "binning": "lb",
            "variant": "official",
        }
        assert loss_parameters("savuc") == {
            **common,
            "kappa": 0.5,
            "temperature": 1.0,
            "variant": "official",
        }
        for name in ("avuc", "avuc_gs"):
            assert loss_parameters(name) == {**common, "kappa": 0.5, "variant": "official"}
        assert loss_parameters("mmce") == {
            **common,
            "weighted": False,
            "kernel_width": 0.4,
            "variant": "official",
        }
        assert loss_parameters("mdca") == common
        with pytest.raises(ValueError, match=re.escape("unexpected parameter(s) variant")):
            build_loss("mdca", variant="paper")

    def test_design_examples_build_with_released_defaults(self):
        # the API examples of DESIGN.md
        sbece = build_loss(
            "sbece", beta=1.0, primary="ce", n_bins=15, temperature=0.01, p=2, binning="lb"
        )
        assert isinstance(sbece, losses.SoftBinnedECE)
        assert (sbece.variant, sbece.binning, sbece.p) == ("official", "lb", 2.0)
        savuc = build_loss(
            "savuc",
            beta=0.5,
            primary="focal",
            primary_params={"gamma": 3.0},
            kappa=0.3,
            temperature=0.1,
        )
        assert isinstance(savuc, losses.SoftAvUC)
        assert (savuc.variant, savuc.primary_loss.gamma, savuc.beta) == ("official", 3.0, 0.5)
        logits, targets = _random_inputs(scale=3.0)
        for loss_fn in (sbece, savuc):
            assert torch.isfinite(loss_fn(logits, targets))
        # older names of the released code still build
        for name, params in [
            ("sbece", {"variant": "caltrain_lb"}),
            ("sbece", {"binning": "bin", "variant": "caltrain_bin"}),
            ("savuc", {"variant": "caltrain"}),
            ("avuc", {"variant": "caltrain"}),
            ("avuc_gs", {"variant": "caltrain"}),
        ]:
            assert build_loss(name, **params).variant == "official"

    def test_build_passes_parameters(self):
        loss_fn = build_loss("acls", margin=5.0, lambda1=0.2, lambda2=0.02, variant="paper")
        assert isinstance(loss_fn, losses.ACLS)
        assert (loss_fn.margin, loss_fn.lambda1, loss_fn.lambda2) == (5.0, 0.2, 0.02)
        assert loss_fn.variant == "paper"

    def test_build_propagates_validation(self):
        with pytest.raises(ValueError, match="margin"):
            build_loss("acls", margin=-1.0)
        with pytest.raises(TypeError, match="epsilon"):
            build_loss("ls", epsilon="0.1")

    def test_exports(self):
        for name in ALL:
            assert type(build_loss(name)).__name__ in losses.__all__
        for name in ("available_losses", "build_loss", "loss_parameters"):
            assert name in losses.__all__

    def test_no_framework_imports(self):
        code = (
            "import sys, raysearch.losses; "
            "heavy = ('ray', 'mlflow', 'optuna', 'matplotlib'); "
            "print(sorted(m for m in heavy if m in sys.modules))"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("name", available_losses())
class TestEveryLoss:
    def test_defaults_give_finite_scalar(self, name):
        logits, targets = _random_inputs(scale=3.0)
        logits.requires_grad_(True)
        loss = build_loss(name)(logits, targets, **_side_info(name, logits))
        assert isinstance(loss, torch.Tensor)
        assert loss.ndim == 0
        assert torch.isfinite(loss)
        loss.backward()
        assert torch.isfinite(logits.grad).all()

    def test_defaults_from_loss_parameters(self, name):
        logits, targets = _random_inputs()
        torch.testing.assert_close(
            build_loss(name, **loss_parameters(name))(logits, targets, **_side_info(name, logits)),
            build_loss(name)(logits, targets, **_side_info(name, logits)),
        )

    def test_rejects_integer_logits(self, name):
        with pytest.raises(TypeError, match="logits"):
            build_loss(name)(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long))

    def test_rejects_non_int64_targets(self, name):
        with pytest.raises(TypeError, match="targets"):
            build_loss(name)(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int32))

    def test_rejects_one_dimensional_logits(self, name):
        with pytest.raises(ValueError, match=re.escape("got (3,)")):
            build_loss(name)(torch.zeros(3), torch.zeros(3, dtype=torch.long))

    def test_shape_mismatch_quotes_both_shapes(self, name):
        message = "`targets` must have shape (4,) for logits of shape (4, 3), got (3,)"
        with pytest.raises(ValueError, match=re.escape(message)):
            build_loss(name)(torch.zeros(4, 3), torch.zeros(3, dtype=torch.long))
        message = "must have shape (2, 5, 6) for logits of shape (2, 3, 5, 6), got (2, 30)"
        with pytest.raises(ValueError, match=re.escape(message)):
            build_loss(name)(torch.zeros(2, 3, 5, 6), torch.zeros(2, 30, dtype=torch.long))

    def test_rejects_empty_batch(self, name):
        with pytest.raises(ValueError, match="at least one sample"):
            build_loss(name)(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize(("name", "params"), ACTIVE)
def test_dense_logits_equal_flattened(name, params):
    # (N, K, H, W) logits: every location is a sample, as for (N * H * W, K)
    logits, targets = _random_inputs(shape=(2, 5, 3, 4))
    flat_logits = logits.permute(0, 2, 3, 1).reshape(-1, 5)
    flat_targets = targets.reshape(-1)
    loss_fn = build_loss(name, **params)
    torch.testing.assert_close(loss_fn(logits, targets), loss_fn(flat_logits, flat_targets))
    if name in MARGIN:
        dense, flat = loss_fn.terms(logits, targets), loss_fn.terms(flat_logits, flat_targets)
        assert dense["reg"].item() > 0
        torch.testing.assert_close(dense, flat)


@pytest.mark.parametrize(("name", "params"), [case for case in ACTIVE if case[0] in MARGIN])
def test_terms_sum_to_forward(name, params):
    loss_fn = build_loss(name, **params)
    logits, targets = _random_inputs()
    terms = loss_fn.terms(logits, targets)
    torch.testing.assert_close(terms["ce"] + terms["reg"], loss_fn(logits, targets))


@pytest.mark.parametrize(("name", "params"), ACTIVE)
def test_bfloat16_logits_computed_in_float32(name, params):
    logits, targets = _random_inputs()
    low = logits.to(torch.bfloat16).requires_grad_(True)
    loss_fn = build_loss(name, **params)
    loss = loss_fn(low, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, loss_fn(low.detach().float(), targets))
    loss.backward()
    assert low.grad.dtype == torch.bfloat16


@pytest.mark.parametrize(("name", "params"), ACTIVE)
def test_bf16_logits_give_the_float32_value(name, params):
    # under bf16 autocast a model emits bf16 logits: every loss computes in float32 and gives
    # exactly its value on the same logits cast to float32 (training also casts before the loss)
    torch.manual_seed(0)
    logits = (8 * torch.randn(16, 5)).bfloat16()
    targets = torch.randint(0, 5, (16,))
    loss_fn = build_loss(name, **params)
    side = {"objectness": torch.rand(16)} if "objectness" in loss_side_inputs(loss_fn) else {}
    value = loss_fn(logits, targets, **side)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, loss_fn(logits.float(), targets, **side), rtol=0, atol=0)
