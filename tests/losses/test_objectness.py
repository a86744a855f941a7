"""Tests of raysearch.losses.objectness: als (objectness-adaptive label smoothing)."""

import math

import pytest
import torch

from raysearch.losses.classification import CrossEntropy, LabelSmoothing
from raysearch.losses.objectness import ObjectnessLabelSmoothing

# 3 samples, K = 3. Sample 0: (1, 2, 3), t=0; sample 1: (0.5, -1, 2), t=2; sample 2: (0, 1, 0), t=1.
LOGITS = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [0.0, 1.0, 0.0]]
TARGETS = [0, 2, 1]
OBJECTNESS = [0.25, 1.0, 0.0]
LSE = [math.log(sum(math.exp(z) for z in row)) for row in LOGITS]
# -log p_{i, k} = lse_i - z_{i, k}
NEG_LOG_P = [[LSE[i] - z for z in row] for i, row in enumerate(LOGITS)]


def _inputs(requires_grad=False):
    logits = torch.tensor(LOGITS, dtype=torch.float64, requires_grad=requires_grad)
    return logits, torch.tensor(TARGETS), torch.tensor(OBJECTNESS, dtype=torch.float64)


def _random_inputs(n=6, k=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=generator, dtype=torch.float64) * 2.0
    targets = torch.randint(0, k, (n,), generator=generator)
    objectness = torch.rand(n, generator=generator, dtype=torch.float64)
    return logits.requires_grad_(True), targets, objectness


class TestObjectnessLabelSmoothing:
    def test_side_inputs_declare_objectness(self):
        from raysearch.training.data.side import loss_side_inputs

        assert ObjectnessLabelSmoothing.side_inputs == ("objectness",)
        assert loss_side_inputs(ObjectnessLabelSmoothing()) == ("objectness",)
        assert not hasattr(ObjectnessLabelSmoothing, "needs_objectness")

    def test_side_inputs_the_forward_does_not_take_are_refused(self):
        from raysearch.training.data.side import loss_side_inputs

        class Wrong(torch.nn.Module):
            side_inputs = ("objectness", "weights")

            def forward(self, logits, targets, *, objectness=None):
                return logits.sum()

        with pytest.raises(ValueError, match="name weights, which its forward does not take"):
            loss_side_inputs(Wrong())
        Wrong.side_inputs = "objectness"  # a string, not a tuple of names
        with pytest.raises(ValueError, match="must be a tuple of keyword names"):
            loss_side_inputs(Wrong())

    def test_hand_value(self):
        # beta = 0.5; alpha_i = 1 - o_i; target gets 1 - beta*alpha, others beta*alpha/(K-1)
        # sample 0: alpha = 0.75, beta*alpha = 0.375 -> q = (0.625, 0.1875, 0.1875)
        # sample 1: alpha = 0 -> q = (0, 0, 1): plain CE
        # sample 2: alpha = 1, beta*alpha = 0.5 -> q = (0.25, 0.5, 0.25)
        q = [[0.625, 0.1875, 0.1875], [0.0, 0.0, 1.0], [0.25, 0.5, 0.25]]
        per_sample = [sum(q[i][k] * NEG_LOG_P[i][k] for k in range(3)) for i in range(3)]
        expected = sum(per_sample) / 3
        logits, targets, objectness = _inputs()
        loss = ObjectnessLabelSmoothing(beta=0.5)(logits, targets, objectness=objectness)
        assert loss.ndim == 0
        assert loss.item() == pytest.approx(expected, rel=1e-12)

    def test_soft_targets_follow_the_paper(self):
        # q = beta * [pi (1 - alpha) + (1 - pi) alpha / (K - 1)] + (1 - beta) pi, rows sum to 1
        beta, k = 0.75, 3
        _, targets, objectness = _inputs()
        q = ObjectnessLabelSmoothing(beta=beta).soft_targets(targets, k, objectness=objectness)
        for i, (t, o) in enumerate(zip(TARGETS, OBJECTNESS, strict=True)):
            alpha = 1 - o
            for j in range(k):
                pi = 1.0 if j == t else 0.0
                paper = beta * (pi * (1 - alpha) + (1 - pi) * alpha / (k - 1)) + (1 - beta) * pi
                assert q[i, j].item() == pytest.approx(paper, abs=1e-12)
        torch.testing.assert_close(q.sum(dim=1), torch.ones(3, dtype=torch.float64))

    def test_beta_zero_is_ce(self):
        logits, targets, objectness = _random_inputs()
        torch.testing.assert_close(
            ObjectnessLabelSmoothing(beta=0.0)(logits, targets, objectness=objectness),
            CrossEntropy()(logits, targets),
        )

    @pytest.mark.parametrize("beta", [0.25, 1.0])
    def test_full_objectness_is_ce(self, beta):
        # o = 1 -> alpha = 0 -> one-hot label whatever beta
        logits, targets, _ = _random_inputs()
        ones = torch.ones(len(targets), dtype=torch.float64)
        torch.testing.assert_close(
            ObjectnessLabelSmoothing(beta=beta)(logits, targets, objectness=ones),
            CrossEntropy()(logits, targets),
        )

    def test_no_object_puts_mass_on_other_classes(self):
        # beta = 1, o = 0: alpha = 1, q = 0 on the target and 1/(K-1) on each other class (Eq. 5)
        logits, targets, _ = _inputs()
        loss = ObjectnessLabelSmoothing(beta=1.0)(
            logits, targets, objectness=torch.zeros(3, dtype=torch.float64)
        )
        others = [sum(NEG_LOG_P[i][k] for k in range(3) if k != TARGETS[i]) / 2 for i in range(3)]
        assert loss.item() == pytest.approx(sum(others) / 3, rel=1e-12)

    def test_constant_smoothing_is_label_smoothing(self):
        # LS(eps) puts 1 - eps + eps/K on the target and eps/K elsewhere: the same soft label as
        # ALS with beta * alpha = eps (K - 1) / K, i.e. beta = 1, o = 1 - eps (K - 1) / K
        eps, k = 0.2, 4
        logits, targets, _ = _random_inputs(k=k)
        o = torch.full((len(targets),), 1 - eps * (k - 1) / k, dtype=torch.float64)
        torch.testing.assert_close(
            ObjectnessLabelSmoothing(beta=1.0)(logits, targets, objectness=o),
            LabelSmoothing(epsilon=eps)(logits, targets),
        )

    def test_context_samples_get_uniform_label(self):
        # sample 2 flagged as context: q = (1/3, 1/3, 1/3) whatever beta and objectness
        beta = 0.5
        logits, targets, objectness = _inputs()
        context = torch.tensor([False, False, True])
        loss = ObjectnessLabelSmoothing(beta=beta, context_fraction=0.15)(
            logits, targets, objectness=objectness, context=context
        )
        q0 = [0.625, 0.1875, 0.1875]
        expected = (
            sum(q0[k] * NEG_LOG_P[0][k] for k in range(3)) + NEG_LOG_P[1][2] + sum(NEG_LOG_P[2]) / 3
        ) / 3
        assert loss.item() == pytest.approx(expected, rel=1e-12)

    def test_gradient_is_p_minus_soft_label(self):
        # d/dz of -(1/N) sum_k q_k log p_k is (p - q) / N
        loss_fn = ObjectnessLabelSmoothing(beta=0.5)
        logits, targets, objectness = _inputs(requires_grad=True)
        loss_fn(logits, targets, objectness=objectness).backward()
        q = loss_fn.soft_targets(targets, 3, objectness=objectness)
        probs = torch.softmax(logits.detach(), dim=1)
        torch.testing.assert_close(logits.grad, (probs - q) / 3)

    def test_gradcheck(self):
        logits, targets, objectness = _random_inputs()
        loss_fn = ObjectnessLabelSmoothing(beta=0.6)
        assert torch.autograd.gradcheck(
            lambda z: loss_fn(z, targets, objectness=objectness), (logits,)
        )

    def test_dense_logits_share_the_sample_objectness(self):
        # (N=2, K=3, 2, 2): each of the 4 locations of sample i uses o_i
        generator = torch.Generator().manual_seed(1)
        dense = torch.randn(2, 3, 2, 2, generator=generator, dtype=torch.float64)
        targets = torch.randint(0, 3, (2, 2, 2), generator=generator)
        o = torch.tensor([0.3, 0.9], dtype=torch.float64)
        loss_fn = ObjectnessLabelSmoothing(beta=1.0)
        flat = dense.movedim(1, -1).reshape(8, 3)
        expected = loss_fn(flat, targets.reshape(8), objectness=o.repeat_interleave(4))
        torch.testing.assert_close(loss_fn(dense, targets, objectness=o), expected)

    def test_float32_objectness_with_float64_logits(self):
        logits, targets, objectness = _inputs()
        loss_fn = ObjectnessLabelSmoothing(beta=0.5)
        torch.testing.assert_close(
            loss_fn(logits, targets, objectness=objectness.float()),
            loss_fn(logits, targets, objectness=objectness),
        )

    def test_missing_objectness(self):
        logits, targets, _ = _inputs()
        with pytest.raises(ValueError, match="`objectness` is required"):
            ObjectnessLabelSmoothing()(logits, targets)

    @pytest.mark.parametrize("bad", [1.5, -0.1, float("nan")])
    def test_objectness_out_of_range(self, bad):
        logits, targets, objectness = _inputs()
        objectness[1] = bad
        with pytest.raises(ValueError, match=r"`objectness` must be in \[0, 1\]"):
            ObjectnessLabelSmoothing()(logits, targets, objectness=objectness)

    def test_objectness_shape_mismatch(self):
        logits, targets, _ = _inputs()
        with pytest.raises(ValueError, match=r"`objectness` must have shape \(3,\).*got \(2,\)"):
            ObjectnessLabelSmoothing()(logits, targets, objectness=torch.ones(2))

    def test_objectness_wrong_type(self):
        logits, targets, _ = _inputs()
        with pytest.raises(TypeError, match="objectness"):
            ObjectnessLabelSmoothing()(logits, targets, objectness=torch.ones(3, dtype=torch.int64))
        with pytest.raises(TypeError, match="objectness"):
            ObjectnessLabelSmoothing()(logits, targets, objectness=[1.0, 1.0, 1.0])

    def test_context_checks(self):
        logits, targets, objectness = _inputs()
        loss_fn = ObjectnessLabelSmoothing()
        with pytest.raises(TypeError, match="context"):
            loss_fn(logits, targets, objectness=objectness, context=torch.zeros(3))
        with pytest.raises(ValueError, match="context"):
            loss_fn(logits, targets, objectness=objectness, context=torch.zeros(2).bool())

    def test_single_class_rejected(self):
        with pytest.raises(ValueError, match="K >= 2"):
            ObjectnessLabelSmoothing()(
                torch.zeros(2, 1), torch.zeros(2, dtype=torch.int64), objectness=torch.ones(2)
            )

    @pytest.mark.parametrize("beta", [-0.1, 1.1, float("nan")])
    def test_rejects_beta_out_of_range(self, beta):
        with pytest.raises(ValueError, match="beta"):
            ObjectnessLabelSmoothing(beta=beta)

    @pytest.mark.parametrize("fraction", [-0.1, 1.0])
    def test_rejects_context_fraction_out_of_range(self, fraction):
        with pytest.raises(ValueError, match="context_fraction"):
            ObjectnessLabelSmoothing(context_fraction=fraction)

    def test_rejects_beta_wrong_type(self):
        with pytest.raises(TypeError, match="beta"):
            ObjectnessLabelSmoothing(beta="1")
