"""Tests of the secondary objectives: sbece, savuc, avuc, avuc_gs, mmce, mdca."""

import math

import numpy as np
import pytest
import torch

from raysearch.losses.avuc import AvUC, AvUCGS, SoftAvUC, soft_uncertainty
from raysearch.losses.classification import CrossEntropy, FocalLoss
from raysearch.losses.mmce_mdca import MDCA, MMCE
from raysearch.losses.secondary import BrierLoss
from raysearch.losses.soft_binning import SoftBinnedECE, soft_binned_ece
from raysearch.metrics import ece

# Shared 4x3 example (K = 3).
# probabilities p = softmax(z), rounded:
#   sample 0: z (2, 0.5, -1)     p (0.786, 0.175, 0.039)  pred 0, target 0 -> accurate
#   sample 1: z (0.2, 1.5, 0.1)  p (0.179, 0.658, 0.162)  pred 1, target 2 -> inaccurate
#   sample 2: z (-0.5, 0, 3)     p (0.028, 0.046, 0.926)  pred 2, target 0 -> inaccurate
#   sample 3: z (1, 1.2, 0.8)    p (0.329, 0.402, 0.269)  pred 1, target 1 -> accurate
# confidences c = (0.786, 0.658, 0.926, 0.402), accuracies a = (1, 0, 0, 1),
# entropies h = -sum_k p log p = (0.622, 0.879, 0.313, 1.085) nats, h / log 3 = (0.566, 0.800,
# 0.285, 0.988).
LOGITS = [[2.0, 0.5, -1.0], [0.2, 1.5, 0.1], [-0.5, 0.0, 3.0], [1.0, 1.2, 0.8]]
TARGETS = [0, 2, 0, 1]
N, K = 4, 3


def _np_probs(logits):
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


PROBS = _np_probs(LOGITS)
CONF = PROBS.max(axis=1)
ACC = (PROBS.argmax(axis=1) == np.array(TARGETS)).astype(np.float64)
ENT = -(PROBS * np.log(PROBS)).sum(axis=1)
CE = float(np.mean(-np.log(PROBS[np.arange(N), TARGETS])))


def _inputs(requires_grad=False, logits=LOGITS, targets=TARGETS):
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=requires_grad)
    return z, torch.tensor(targets)


def _random_inputs(n=8, k=4, scale=2.0, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=generator, dtype=dtype) * scale
    targets = torch.randint(0, k, (n,), generator=generator)
    return logits, targets


def _np_soft_memberships(c, centres, temperature):
    g = -((c[:, None] - centres[None, :]) ** 2) / temperature
    u = np.exp(g - g.max(axis=1, keepdims=True))
    return u / u.sum(axis=1, keepdims=True)


def _np_sbece(c, a, n_bins, temperature, p, binning):
    """Eq. 8-12 of Karandikar et al., written out with NumPy."""
    centres = (np.arange(1, n_bins + 1) - 0.5) / n_bins  # xi_j = (j - 1/2) / M
    u = _np_soft_memberships(c, centres, temperature)
    size = u.sum(axis=0)  # S_j (Eq. 8)
    conf = (u * c[:, None]).sum(axis=0) / size  # C_j (Eq. 9)
    acc = (u * a[:, None]).sum(axis=0) / size  # A_j (Eq. 10)
    if binning == "bin":  # Eq. 11
        inner = np.sum(size / len(c) * np.abs(acc - conf) ** p)
    else:  # Eq. 12
        inner = np.sum(u * np.abs(acc[None, :] - c[:, None]) ** p) / len(c)
    return inner ** (1.0 / p)


def _np_caltrain_lb(c, a, num_classes, n_bins, temperature):
    """The released compute_squared_error_label_binning_tensorflow, written out with NumPy."""
    edges = np.linspace(1.0 / num_classes, 1.0, n_bins + 1)
    centres = 0.5 * edges[1:] + 0.5 * edges[:-1]
    u = _np_soft_memberships(c, centres, temperature)
    u = (1 - 1e-5) * u + 1e-5 / n_bins
    acc = (u * a[:, None]).sum(axis=0) / u.sum(axis=0)
    return np.sum(u * (acc[None, :] - c[:, None]) ** 2) / len(c)  # no root


def _np_caltrain_bin(c, a, n_bins, temperature):
    """The released get_soft_binning_ece_tensor, written out with NumPy."""
    centres = np.arange(1.0 / (2.0 * n_bins), 1.0, 1.0 / n_bins)
    u = _np_soft_memberships(c, centres, temperature)
    size = u.sum(axis=0)
    conf = (u * c[:, None]).sum(axis=0) / np.maximum(size, 1e-5)
    acc = (u * a[:, None]).sum(axis=0) / np.maximum(size, 1e-5)
    weights = size / size.sum()
    return math.sqrt(np.sum((conf - acc) ** 2 * weights))


def _np_soft_uncertainty(h_star, kappa, temperature):
    x = np.log(h_star * (1 - kappa) / ((1 - h_star) * kappa)) / temperature
    return 1.0 / (1.0 + np.exp(-x))


def _np_avuc_ratio(a, uncertain, certain, entropy, floor=None):
    """log(1 + (n_AU + n_IC) / (n_AC + n_IU)) from per-sample weights (Eq. 13 / 15)."""
    t = np.tanh(entropy)
    n_au = np.sum(a * uncertain * t)
    n_iu = np.sum((1 - a) * uncertain * t)
    n_ac = np.sum(a * certain * (1 - t))
    n_ic = np.sum((1 - a) * certain * (1 - t))
    denominator = n_ac + n_iu if floor is None else max(n_ac + n_iu, floor)
    return math.log(1 + (n_au + n_ic) / denominator)


# every objective, with parameters that make its secondary term active on the shared example;
# official (released code, the default) and paper variants of each
OBJECTIVES = [
    (SoftBinnedECE, {"temperature": 0.05}),
    (SoftBinnedECE, {"temperature": 0.05, "binning": "bin"}),
    (SoftBinnedECE, {"n_bins": 3, "temperature": 0.05, "variant": "paper"}),
    (SoftBinnedECE, {"n_bins": 3, "temperature": 0.05, "binning": "bin", "variant": "paper"}),
    (SoftAvUC, {"kappa": 0.3, "temperature": 0.5}),
    (SoftAvUC, {"kappa": 0.3, "temperature": 0.5, "variant": "paper"}),
    (AvUC, {"kappa": 0.7}),
    (AvUC, {"kappa": 0.7, "variant": "paper"}),
    (AvUCGS, {"kappa": 0.7}),
    (AvUCGS, {"kappa": 0.7, "variant": "paper"}),
    (MMCE, {}),
    (MMCE, {"variant": "paper"}),
    (MMCE, {"weighted": True}),
    (MMCE, {"weighted": True, "variant": "paper"}),
    (MDCA, {}),
]
OBJECTIVE_IDS = [
    f"{cls.__name__}-{'-'.join(map(str, params.values()))}" for cls, params in OBJECTIVES
]


class TestComposition:
    @pytest.mark.parametrize(("cls", "params"), OBJECTIVES, ids=OBJECTIVE_IDS)
    def test_terms_add_up(self, cls, params):
        loss_fn = cls(beta=0.7, **params)
        terms = loss_fn.terms(*_inputs())
        assert set(terms) == {"primary", "secondary", "total"}
        assert terms["primary"].item() == pytest.approx(CE, rel=1e-12)
        assert terms["secondary"].item() > 0
        expected = terms["primary"] + 0.7 * terms["secondary"]
        assert terms["total"].item() == pytest.approx(expected.item(), rel=1e-12)
        loss = loss_fn(*_inputs())
        assert loss.ndim == 0
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12)

    @pytest.mark.parametrize(("cls", "params"), OBJECTIVES, ids=OBJECTIVE_IDS)
    @pytest.mark.parametrize(
        ("primary", "primary_params", "reference"),
        [
            ("ce", None, CrossEntropy()),
            ("focal", {"gamma": 2.0}, FocalLoss(gamma=2.0)),
            ("mse", {}, BrierLoss()),
        ],
    )
    def test_beta_zero_gives_primary(self, cls, params, primary, primary_params, reference):
        logits, targets = _random_inputs()
        loss_fn = cls(beta=0.0, primary=primary, primary_params=primary_params, **params)
        torch.testing.assert_close(loss_fn(logits, targets), reference(logits, targets))

    @pytest.mark.parametrize(("cls", "params"), OBJECTIVES, ids=OBJECTIVE_IDS)
    def test_primary_none_gives_secondary_alone(self, cls, params):
        # with primary=None the total is the secondary term, not scaled by beta
        with_primary = cls(beta=3.0, **params).terms(*_inputs())
        alone = cls(beta=3.0, primary=None, **params)
        terms = alone.terms(*_inputs())
        assert terms["primary"].item() == 0.0
        torch.testing.assert_close(terms["total"], terms["secondary"])
        torch.testing.assert_close(alone(*_inputs()), with_primary["secondary"])

    def test_mse_primary_hand_value(self):
        # Brier: mean over samples of sum_k (p_k - onehot_k)^2; sample 0 (target 0):
        # (0.786 - 1)^2 + 0.175^2 + 0.039^2 = 0.0780; the four samples give ~0.7053 on average
        onehot = np.eye(K)[TARGETS]
        expected = float(np.mean(np.sum((PROBS - onehot) ** 2, axis=1)))
        assert BrierLoss()(*_inputs()).item() == pytest.approx(expected, rel=1e-12)
        loss_fn = MDCA(beta=0.0, primary="mse")
        assert loss_fn(*_inputs()).item() == pytest.approx(expected, rel=1e-12)

    @pytest.mark.parametrize(("cls", "params"), OBJECTIVES, ids=OBJECTIVE_IDS)
    def test_dense_inputs_count_every_location(self, cls, params):
        # (2, K, 2) logits hold the 4 samples of the shared example, location-major per image
        logits, targets = _inputs()
        dense = logits.reshape(2, 2, K).permute(0, 2, 1).contiguous()
        dense_targets = targets.reshape(2, 2)
        loss_fn = cls(**params)
        torch.testing.assert_close(loss_fn(dense, dense_targets), loss_fn(logits, targets))

    @pytest.mark.parametrize(("cls", "params"), OBJECTIVES, ids=OBJECTIVE_IDS)
    def test_defaults_and_low_precision_are_finite(self, cls, params):
        logits, targets = _random_inputs(n=16, k=5, scale=4.0, dtype=torch.float32)
        assert torch.isfinite(cls()(logits, targets))
        half = cls(**params)(logits.half(), targets)
        assert half.dtype == torch.float32
        assert torch.isfinite(half)

    def test_primary_params_reach_the_primary(self):
        loss_fn = SoftBinnedECE(beta=0.5, primary="focal", primary_params={"gamma": 3.0})
        assert loss_fn.primary_loss.gamma == 3.0
        terms = loss_fn.terms(*_inputs())
        torch.testing.assert_close(terms["primary"], FocalLoss(gamma=3.0)(*_inputs()))

    @pytest.mark.parametrize(
        ("params", "error", "match"),
        [
            ({"primary": "nll"}, ValueError, "primary"),
            ({"primary": "focal", "primary_params": {"alpha": 1.0}}, ValueError, "primary_params"),
            ({"primary": "ce", "primary_params": {"gamma": 1.0}}, ValueError, "primary_params"),
            ({"primary": None, "primary_params": {"gamma": 1.0}}, ValueError, "primary_params"),
            ({"primary": "focal", "primary_params": {"gamma": -1.0}}, ValueError, "gamma"),
            ({"primary_params": [("gamma", 1.0)]}, TypeError, "primary_params"),
            ({"primary": 3}, TypeError, "primary"),
            ({"beta": -0.1}, ValueError, "beta"),
            ({"beta": math.inf}, ValueError, "beta"),
            ({"beta": math.nan}, ValueError, "beta"),
            ({"beta": "1"}, TypeError, "beta"),
        ],
    )
    @pytest.mark.parametrize("cls", [SoftBinnedECE, SoftAvUC, AvUC, AvUCGS, MMCE, MDCA])
    def test_rejects_bad_composition(self, cls, params, error, match):
        with pytest.raises(error, match=match):
            cls(**params)

    def test_error_messages_echo_values(self):
        with pytest.raises(ValueError, match=r"`beta` must be >= 0, got -1.0"):
            MDCA(beta=-1.0)
        with pytest.raises(ValueError, match=r"unexpected key\(s\) alpha .*accepted: gamma"):
            SoftAvUC(primary="focal", primary_params={"alpha": 0.25})


class TestSoftBinnedECE:
    # Hand example for the function: c = (0.9, 0.6, 0.8, 0.3), a = (1, 0, 1, 0), M = 2 bins with
    # centres 0.25 and 0.75, T = 0.1. Since (c - 0.25)^2 - (c - 0.75)^2 = c - 0.5, the membership
    # of bin 2 is u_2 = logistic(10 (c - 0.5)) = logistic(4, 1, 3, -2)
    #   = (0.98201, 0.73106, 0.95257, 0.11920), u_1 = 1 - u_2 = (0.01799, 0.26894, 0.04743, 0.88080)
    # S = (1.21515, 2.78485); A = (u . a) / S = (0.05383, 0.69468); C = (u . c) / S =
    # (0.39479, 0.76136)
    # bin (Eq. 11): sqrt(1.21515/4 * 0.34096^2 + 2.78485/4 * 0.06668^2) = 0.19599
    # lb (Eq. 12): sqrt(1/4 sum_i sum_j u_ij (A_j - c_i)^2) = 0.24998
    C_HAND = [0.9, 0.6, 0.8, 0.3]
    A_HAND = [1.0, 0.0, 1.0, 0.0]

    def _hand_tables(self):
        u2 = [1.0 / (1.0 + math.exp(-10.0 * (c - 0.5))) for c in self.C_HAND]
        u = [[1.0 - v, v] for v in u2]
        size = [sum(row[j] for row in u) for j in range(2)]
        acc = [
            sum(row[j] * a for row, a in zip(u, self.A_HAND, strict=True)) / size[j]
            for j in range(2)
        ]
        conf = [
            sum(row[j] * c for row, c in zip(u, self.C_HAND, strict=True)) / size[j]
            for j in range(2)
        ]
        return u, size, acc, conf

    def test_function_hand_value_bin(self):
        u, size, acc, conf = self._hand_tables()
        assert size[0] == pytest.approx(1.21515, abs=1e-5)
        assert acc[1] == pytest.approx(0.69468, abs=1e-5)
        assert conf[0] == pytest.approx(0.39479, abs=1e-5)
        expected = math.sqrt(sum(size[j] / 4 * (acc[j] - conf[j]) ** 2 for j in range(2)))
        assert expected == pytest.approx(0.19599, abs=1e-5)
        value = soft_binned_ece(
            torch.tensor(self.C_HAND, dtype=torch.float64),
            torch.tensor(self.A_HAND, dtype=torch.float64),
            n_bins=2,
            temperature=0.1,
            p=2,
            binning="bin",
        )
        assert value.ndim == 0
        assert value.item() == pytest.approx(expected, rel=1e-12)
        # p = 1: sum_j S_j / N |A_j - C_j| = 1.21515/4 * 0.34096 + 2.78485/4 * 0.06668
        expected_l1 = sum(size[j] / 4 * abs(acc[j] - conf[j]) for j in range(2))
        value_l1 = soft_binned_ece(
            torch.tensor(self.C_HAND, dtype=torch.float64),
            torch.tensor([True, False, True, False]),
            n_bins=2,
            temperature=0.1,
            p=1,
        )
        assert value_l1.item() == pytest.approx(expected_l1, rel=1e-12)

    def test_function_hand_value_lb(self):
        u, _, acc, _ = self._hand_tables()
        inner = (
            sum(u[i][j] * (acc[j] - self.C_HAND[i]) ** 2 for i in range(4) for j in range(2)) / 4
        )
        assert math.sqrt(inner) == pytest.approx(0.24998, abs=1e-5)
        value = soft_binned_ece(
            torch.tensor(self.C_HAND, dtype=torch.float64),
            torch.tensor(self.A_HAND, dtype=torch.float64),
            n_bins=2,
            temperature=0.1,
            binning="lb",
        )
        assert value.item() == pytest.approx(math.sqrt(inner), rel=1e-12)

    @pytest.mark.parametrize("binning", ["lb", "bin"])
    @pytest.mark.parametrize("p", [1, 2, 3])
    def test_module_hand_value(self, binning, p):
        # shared example: c = (0.786, 0.658, 0.926, 0.402), a = (1, 0, 0, 1), M = 3, T = 0.05
        expected = _np_sbece(CONF, ACC, 3, 0.05, p, binning)
        loss_fn = SoftBinnedECE(
            beta=2.0, n_bins=3, temperature=0.05, p=p, binning=binning, variant="paper"
        )
        terms = loss_fn.terms(*_inputs())
        assert terms["secondary"].item() == pytest.approx(expected, rel=1e-12)
        assert terms["total"].item() == pytest.approx(CE + 2.0 * expected, rel=1e-12)

    def _hard_binning_example(self):
        # K = 2, M = 5 bins (centres 0.1, 0.3, 0.5, 0.7, 0.9); confidences within 0.02 of a
        # centre: 0.91, 0.88 -> bin (0.8, 1]; 0.72, 0.69 -> bin (0.6, 0.8]; 0.52 -> (0.4, 0.6]
        conf = np.array([0.91, 0.88, 0.72, 0.69, 0.52])
        correct = np.array([1, 0, 1, 1, 0])
        probs = np.stack([conf, 1.0 - conf], axis=1)
        labels = np.where(correct == 1, 0, 1)
        logits = torch.tensor(np.log(probs), dtype=torch.float64)
        return conf, correct, probs, labels, logits, torch.tensor(labels)

    def test_tiny_temperature_gives_hard_binned_ece(self):
        conf, correct, probs, labels, logits, targets = self._hard_binning_example()
        # next-nearest centre is >= 0.18 away: its membership is ~exp(-(0.18^2 - 0.02^2) / T)
        loss_fn = SoftBinnedECE(
            primary=None, n_bins=5, temperature=1e-5, binning="bin", variant="paper"
        )
        hard = ece(probs, labels, n_bins=5, norm="l2")
        # bins: (0.8, 1]: A 0.5, C 0.895; (0.6, 0.8]: A 1, C 0.705; (0.4, 0.6]: A 0, C 0.52
        by_hand = math.sqrt((2 * 0.395**2 + 2 * 0.295**2 + 0.52**2) / 5)
        assert hard == pytest.approx(by_hand, rel=1e-12)
        assert loss_fn(logits, targets).item() == pytest.approx(hard, rel=1e-9)

    def test_tiny_temperature_gives_hard_label_binned_ece(self):
        _, _, _, _, logits, targets = self._hard_binning_example()
        # ECE_lb,2 (Eq. 7): sqrt(1/N sum_i (A_{b_i} - c_i)^2) with A = 0.5, 0.5, 1, 1, 0
        by_hand = math.sqrt(
            ((0.5 - 0.91) ** 2 + (0.5 - 0.88) ** 2 + (1 - 0.72) ** 2 + (1 - 0.69) ** 2 + 0.52**2)
            / 5
        )
        loss_fn = SoftBinnedECE(
            primary=None, n_bins=5, temperature=1e-5, binning="lb", variant="paper"
        )
        assert loss_fn(logits, targets).item() == pytest.approx(by_hand, rel=1e-9)

    @pytest.mark.parametrize("variant", ["official", "paper"])
    @pytest.mark.parametrize("binning", ["lb", "bin"])
    def test_empty_bins_give_finite_values_and_gradients(self, binning, variant):
        # T = 1e-6 and M = 15 with 4 samples: most bin sizes underflow to exactly 0
        logits, targets = _inputs(requires_grad=True)
        loss_fn = SoftBinnedECE(primary=None, temperature=1e-6, binning=binning, variant=variant)
        loss = loss_fn(logits, targets)
        assert torch.isfinite(loss)
        loss.backward()
        assert torch.isfinite(logits.grad).all()

    @pytest.mark.parametrize("variant", ["paper", "official"])
    def test_zero_value_has_zero_gradient(self, variant):
        # two samples with equal confidence 0.5 (logits 0, 0), one right and one wrong: every
        # bin has A_j = C_j = 0.5, so SB-ECE is exactly 0 and the root's gradient is set to 0
        logits = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
        targets = torch.tensor([0, 1])
        loss = SoftBinnedECE(primary=None, binning="bin", variant=variant)(logits, targets)
        assert loss.item() == 0.0
        loss.backward()
        assert torch.equal(logits.grad, torch.zeros_like(logits))

    @pytest.mark.parametrize(
        "params",
        [
            {"binning": "lb", "p": 2, "variant": "paper"},
            {"binning": "lb", "p": 3, "variant": "paper"},
            {"binning": "bin", "p": 2, "variant": "paper"},
            {"binning": "bin", "p": 3, "variant": "paper"},
            {"binning": "lb"},
            {"binning": "bin"},
        ],
    )
    def test_gradcheck(self, params):
        logits, targets = _random_inputs(n=6, k=3)
        loss_fn = SoftBinnedECE(beta=1.0, n_bins=5, temperature=0.02, **params)
        assert torch.autograd.gradcheck(
            lambda z: loss_fn(z, targets), (logits.requires_grad_(True),)
        )

    def test_gradient_does_not_flow_through_correctness(self):
        confidences = torch.tensor([0.9, 0.6, 0.8], dtype=torch.float64, requires_grad=True)
        correct = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64, requires_grad=True)
        soft_binned_ece(confidences, correct, n_bins=3, temperature=0.05).backward()
        assert correct.grad is None
        assert confidences.grad.abs().sum() > 0

    def test_default_is_released_lb_hand_value(self):
        # Default = released compute_squared_error_label_binning_tensorflow. K = 2, M = 2,
        # T = 0.05, c = (0.9, 0.6, 0.8, 0.7), a = (1, 0, 1, 0). Bin edges linspace(1/K, 1, M + 1)
        # = (0.5, 0.75, 1): centres (0.625, 0.875). (c - 0.625)^2 - (c - 0.875)^2 = 0.5 c - 0.375,
        # so u_2 = logistic((0.5 c - 0.375) / 0.05) = logistic(10 c - 7.5)
        #   = logistic(1.5, -1.5, 0.5, -0.5) = (0.81757, 0.18243, 0.62246, 0.37754), u_1 = 1 - u_2;
        # u' = (1 - 1e-5) u + 1e-5 / 2. S'_1 = S'_2 = 2 (the u_2 are symmetric about 1/2), so
        # A'_1 = (u'_01 + u'_21) / 2 = (0.18243 + 0.37754) / 2 = 0.27999 and A'_2 = 0.72001.
        # Squared, no root: (1/4) sum_i sum_j u'_ij (A'_j - c_i)^2 = 0.099751
        conf, correct = [0.9, 0.6, 0.8, 0.7], [1.0, 0.0, 1.0, 0.0]
        u2 = [1.0 / (1.0 + math.exp(-(10.0 * c - 7.5))) for c in conf]
        u = [[(1 - 1e-5) * (1.0 - v) + 0.5e-5, (1 - 1e-5) * v + 0.5e-5] for v in u2]
        size = [sum(row[j] for row in u) for j in range(2)]
        acc = [
            sum(row[j] * a for row, a in zip(u, correct, strict=True)) / size[j] for j in range(2)
        ]
        expected = sum(u[i][j] * (acc[j] - conf[i]) ** 2 for i in range(4) for j in range(2)) / 4
        assert size == pytest.approx([2.0, 2.0], rel=1e-12)
        assert acc == pytest.approx([0.27999, 0.72001], abs=1e-5)
        assert expected == pytest.approx(0.099751, abs=1e-6)
        probs = np.stack([conf, 1 - np.array(conf)], axis=1)
        logits = torch.tensor(np.log(probs), dtype=torch.float64)
        targets = torch.tensor([0, 1, 0, 1])
        loss_fn = SoftBinnedECE(beta=2.0, n_bins=2, temperature=0.05)
        assert (loss_fn.variant, loss_fn.binning, loss_fn.p) == ("official", "lb", 2.0)
        terms = loss_fn.terms(logits, targets)
        assert terms["secondary"].item() == pytest.approx(expected, rel=1e-12)
        ce = float(np.mean(-np.log([0.9, 0.4, 0.8, 0.3])))
        assert terms["total"].item() == pytest.approx(ce + 2.0 * expected, rel=1e-12)
        # the paper's Eq. 12 (root, centres 0.25 / 0.75) is a different number
        paper = SoftBinnedECE(primary=None, n_bins=2, temperature=0.05, variant="paper")
        assert paper(logits, targets).item() > 2 * expected

    def test_official_lb_hand_value_on_shared_example(self):
        # released lb code on the shared example: K = 3 so the M = 15 bins span [1/3, 1] (centres
        # 1/3 + (j - 1/2) * (2/3) / 15), memberships mixed as (1 - 1e-5) u + 1e-5 / 15, and the
        # squared value is returned (no root)
        expected = _np_caltrain_lb(CONF, ACC, K, 15, 0.05)
        loss_fn = SoftBinnedECE(primary=None, temperature=0.05)
        assert loss_fn(*_inputs()).item() == pytest.approx(expected, rel=1e-12)

    @pytest.mark.parametrize(
        ("binning", "temperature", "aliases"),
        [("lb", 0.05, ["caltrain", "caltrain_lb"]), ("bin", 0.002, ["caltrain", "caltrain_bin"])],
    )
    def test_caltrain_names_are_official(self, binning, temperature, aliases):
        # T = 0.002 leaves bins below the released bin code's 1e-5 floor, where it differs (by
        # 6e-8 relative here: the floored bins hold little mass)
        official = SoftBinnedECE(
            primary=None, temperature=temperature, binning=binning, variant="official"
        )
        paper = SoftBinnedECE(
            primary=None, temperature=temperature, binning=binning, variant="paper"
        )
        assert official(*_inputs()).item() != pytest.approx(paper(*_inputs()).item(), rel=1e-9)
        for alias in aliases:
            loss_fn = SoftBinnedECE(
                primary=None, temperature=temperature, binning=binning, variant=alias
            )
            assert loss_fn.variant == "official"
            torch.testing.assert_close(loss_fn(*_inputs()), official(*_inputs()))

    def test_official_lb_is_squared_without_root(self):
        # K = 2, M = 2, T = 1e-4; confidences (0.55, 0.6, 0.65, 0.7) all fall in one bin under
        # both binnings (paper centres 0.25 / 0.75, released centres 0.625 / 0.875), so both
        # give one bin with A = mean(a) = 0.5 and official = paper^2 up to the 1e-5 mix:
        # paper lb = sqrt(((0.5-0.55)^2 + (0.5-0.6)^2 + (0.5-0.65)^2 + (0.5-0.7)^2) / 4)
        #          = sqrt(0.075 / 4) = 0.13693
        conf = np.array([0.55, 0.6, 0.65, 0.7])
        logits = torch.tensor(np.log(np.stack([conf, 1 - conf], axis=1)))
        targets = torch.tensor([0, 1, 0, 1])  # a = (1, 0, 1, 0)
        paper = SoftBinnedECE(primary=None, n_bins=2, temperature=1e-4, variant="paper")
        official = SoftBinnedECE(primary=None, n_bins=2, temperature=1e-4)
        paper_value, official_value = paper(logits, targets), official(logits, targets)
        assert paper_value.item() == pytest.approx(math.sqrt(0.075 / 4), rel=1e-9)
        assert official_value.item() == pytest.approx(0.075 / 4, rel=1e-4)
        assert official_value.item() == pytest.approx(paper_value.item() ** 2, rel=1e-4)
        assert official_value.item() < 0.2 * paper_value.item()

    def test_official_bin_equals_paper_when_bins_are_filled(self):
        # M = 3, T = 0.05: every S_j is far above the released floor 1e-5 and sum_j S_j = N
        logits, targets = _inputs()
        paper = SoftBinnedECE(
            primary=None, n_bins=3, temperature=0.05, binning="bin", variant="paper"
        )
        official = SoftBinnedECE(primary=None, n_bins=3, temperature=0.05, binning="bin")
        expected = _np_caltrain_bin(CONF, ACC, 3, 0.05)
        assert official(logits, targets).item() == pytest.approx(expected, rel=1e-12)
        assert paper(logits, targets).item() == pytest.approx(expected, rel=1e-12)

    def test_official_bin_floors_small_bins(self):
        # M = 15, T = 0.002: bins far from every confidence have S_j < 1e-5; the released code
        # divides their sums by 1e-5 instead of S_j, shrinking |A_j - C_j| in those bins
        logits, targets = _inputs()
        temperature = 0.002
        expected = _np_caltrain_bin(CONF, ACC, 15, temperature)
        official = SoftBinnedECE(primary=None, temperature=temperature, binning="bin")(
            logits, targets
        )
        paper = SoftBinnedECE(
            primary=None, temperature=temperature, binning="bin", variant="paper"
        )(logits, targets)
        assert official.item() == pytest.approx(expected, rel=1e-12)
        assert paper.item() == pytest.approx(_np_sbece(CONF, ACC, 15, temperature, 2, "bin"))
        assert official.item() < paper.item()
        assert official.item() != pytest.approx(paper.item(), rel=1e-9)

    def test_official_needs_p_2(self):
        # the released code is l2 only: p = 1 needs the paper variant
        with pytest.raises(ValueError, match=r"`p` must be 2 with `variant`='official'.*got 1"):
            SoftBinnedECE(p=1)
        loss_fn = SoftBinnedECE(p=1, temperature=0.05, n_bins=3, variant="paper")
        expected = _np_sbece(CONF, ACC, 3, 0.05, 1, "lb")
        assert loss_fn.terms(*_inputs())["secondary"].item() == pytest.approx(expected, rel=1e-12)

    @pytest.mark.parametrize(
        ("params", "error", "match"),
        [
            ({"n_bins": 0}, ValueError, "n_bins"),
            ({"n_bins": 2.5}, TypeError, "n_bins"),
            ({"n_bins": True}, TypeError, "n_bins"),
            ({"temperature": 0.0}, ValueError, "temperature"),
            ({"temperature": -0.01}, ValueError, "temperature"),
            ({"temperature": math.inf}, ValueError, "temperature"),
            ({"temperature": math.nan}, ValueError, "temperature"),
            ({"p": 0.5, "variant": "paper"}, ValueError, "p"),
            ({"p": math.inf, "variant": "paper"}, ValueError, "p"),
            ({"p": 3}, ValueError, "p"),
            ({"binning": "hard"}, ValueError, "binning"),
            ({"variant": "Official"}, ValueError, "variant"),
            ({"variant": "caltrain_lb", "binning": "bin"}, ValueError, "binning"),
            ({"variant": "caltrain_bin"}, ValueError, "binning"),
            ({"variant": "caltrain_lb", "p": 1}, ValueError, "p"),
            ({"variant": 2}, TypeError, "variant"),
        ],
    )
    def test_rejects_bad_values(self, params, error, match):
        with pytest.raises(error, match=match):
            SoftBinnedECE(**params)

    def test_error_messages_echo_values(self):
        with pytest.raises(ValueError, match=r"`temperature` must be > 0 and finite, got 0"):
            SoftBinnedECE(temperature=0)
        with pytest.raises(ValueError, match=r"`n_bins` must be >= 1, got 0"):
            SoftBinnedECE(n_bins=0)

    @pytest.mark.parametrize(
        ("params", "match"),
        [
            ({"n_bins": 0}, "n_bins"),
            ({"temperature": 0.0}, "temperature"),
            ({"p": 0.0}, "p"),
            ({"binning": "equal_width"}, "binning"),
        ],
    )
    def test_function_rejects_bad_values(self, params, match):
        with pytest.raises(ValueError, match=match):
            soft_binned_ece(torch.tensor([0.5]), torch.tensor([1.0]), **params)

    def test_function_rejects_bad_inputs(self):
        with pytest.raises(ValueError, match="correct"):
            soft_binned_ece(torch.tensor([0.5, 0.6]), torch.tensor([1.0]))
        with pytest.raises(ValueError, match="confidences"):
            soft_binned_ece(torch.ones(2, 2) / 2, torch.ones(2, 2))
        with pytest.raises(ValueError, match="confidences"):
            soft_binned_ece(torch.ones(0), torch.ones(0))
        with pytest.raises(TypeError, match="confidences"):
            soft_binned_ece(torch.tensor([1, 0]), torch.tensor([1, 0]))
        with pytest.raises(TypeError, match="confidences"):
            soft_binned_ece([0.5], torch.tensor([1.0]))


class TestSoftAvUC:
    def test_soft_uncertainty_identity(self):
        # kappa = 0.5, T = 1: logistic(log(h / (1 - h))) = h, also at the end points 0 and 1
        h = torch.tensor([0.0, 1e-9, 0.1, 0.37, 0.5, 0.93, 1.0], dtype=torch.float64)
        torch.testing.assert_close(soft_uncertainty(h, 0.5, 1.0), h)

    def test_soft_uncertainty_hand_value(self):
        # kappa = 0.3, T = 0.5, h* = 0.6: log(0.6 * 0.7 / (0.4 * 0.3)) = log 3.5, so
        # t = logistic(2 log 3.5) = 3.5^2 / (1 + 3.5^2) = 12.25 / 13.25; t(kappa) = 1/2
        h = torch.tensor([0.6, 0.3], dtype=torch.float64)
        t = soft_uncertainty(h, 0.3, 0.5)
        assert t[0].item() == pytest.approx(12.25 / 13.25, rel=1e-12)
        assert t[1].item() == pytest.approx(0.5, rel=1e-12)

    def test_soft_uncertainty_tends_to_a_hard_threshold(self):
        h = torch.tensor([0.1, 0.29, 0.31, 0.9], dtype=torch.float64)
        t = soft_uncertainty(h, 0.3, 1e-3)
        torch.testing.assert_close(t, torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64))

    def test_hand_value(self):
        # kappa = 0.3, T = 0.5; h* = (0.566, 0.800, 0.285, 0.988), t = logistic(2 log(h* 0.7 /
        # ((1 - h*) 0.3))) ~ (0.902, 0.989, 0.464, 1.000); tanh h = (0.552, 0.706, 0.303, 0.795)
        # accurate (0, 3): n'_AU = sum t tanh h, n'_AC = sum (1 - t)(1 - tanh h)
        # inaccurate (1, 2): n'_IU = sum t tanh h, n'_IC = sum (1 - t)(1 - tanh h)
        t = _np_soft_uncertainty(ENT / math.log(K), 0.3, 0.5)
        assert t == pytest.approx([0.902, 0.989, 0.464, 1.000], abs=1e-3)
        expected = _np_avuc_ratio(ACC, t, 1 - t, ENT)
        loss_fn = SoftAvUC(beta=0.5, kappa=0.3, temperature=0.5, variant="paper")
        terms = loss_fn.terms(*_inputs())
        assert terms["secondary"].item() == pytest.approx(expected, rel=1e-12)
        assert terms["total"].item() == pytest.approx(CE + 0.5 * expected, rel=1e-12)

    def test_identity_limit(self):
        # kappa = 0.5, T = 1: t(h*) = h*, so n'_AU = sum_{a=1} h* tanh h, etc.
        h_star = ENT / math.log(K)
        expected = _np_avuc_ratio(ACC, h_star, 1 - h_star, ENT)
        loss_fn = SoftAvUC(primary=None, kappa=0.5, temperature=1.0, variant="paper")
        assert loss_fn(*_inputs()).item() == pytest.approx(expected, rel=1e-12)

    @pytest.mark.parametrize("variant", [None, "official", "caltrain"])
    def test_official_hand_value(self, variant):
        # default = released get_soft_avuc_loss: entropy of q = (1 - 1e-5) p + 1e-5 / K, in both
        # h* and tanh h, denominator floored at 1e-5 ("caltrain" is an older name of it)
        q = (1 - 1e-5) * PROBS + 1e-5 / K
        entropy = -(q * np.log(q)).sum(axis=1)
        t = _np_soft_uncertainty(entropy / math.log(K), 0.3, 0.5)
        expected = _np_avuc_ratio(ACC, t, 1 - t, entropy, floor=1e-5)
        params = {} if variant is None else {"variant": variant}
        loss_fn = SoftAvUC(primary=None, kappa=0.3, temperature=0.5, **params)
        assert loss_fn.variant == "official"
        value = loss_fn(*_inputs()).item()
        assert value == pytest.approx(expected, rel=1e-12)
        paper = SoftAvUC(primary=None, kappa=0.3, temperature=0.5, variant="paper")
        paper_value = paper(*_inputs()).item()
        assert value != paper_value
        assert value == pytest.approx(paper_value, rel=1e-3)

    def test_official_floors_the_denominator(self):
        # two wrong one-hot predictions (logit gap 1000): h = 0 so t = 0, tanh h = 0, and
        # n'_AC = n'_IU = 0 while n'_IC = 2. The paper's ratio is 2 / 0 = inf; the released code
        # smooths p (h > 0, t tiny) and floors the denominator at 1e-5: about log(1 + 2 / 1e-5)
        logits = torch.tensor([[1000.0, 0.0, 0.0], [0.0, 1000.0, 0.0]], dtype=torch.float64)
        targets = torch.tensor([1, 2])
        paper = SoftAvUC(primary=None, kappa=0.3, temperature=0.5, variant="paper")(logits, targets)
        assert paper.item() == math.inf
        q = (1 - 1e-5) * np.eye(3)[[0, 1]] + 1e-5 / 3
        entropy = -(q * np.log(q)).sum(axis=1)
        t = _np_soft_uncertainty(entropy / math.log(3), 0.3, 0.5)
        expected = _np_avuc_ratio(np.zeros(2), t, 1 - t, entropy, floor=1e-5)
        official = SoftAvUC(primary=None, kappa=0.3, temperature=0.5)
        assert official(logits, targets).item() == pytest.approx(expected, rel=1e-9)
        assert expected == pytest.approx(math.log(1 + 2 / 1e-5), rel=1e-3)

    @pytest.mark.parametrize("variant", ["paper", "official"])
    def test_gradcheck(self, variant):
        logits, targets = _random_inputs(n=6, k=4)
        loss_fn = SoftAvUC(kappa=0.4, temperature=0.3, variant=variant)
        assert torch.autograd.gradcheck(
            lambda z: loss_fn(z, targets), (logits.requires_grad_(True),)
        )

    def test_needs_two_classes(self):
        with pytest.raises(ValueError, match="K >= 2"):
            SoftAvUC()(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long))

    @pytest.mark.parametrize(
        ("params", "error", "match"),
        [
            ({"kappa": 0.0}, ValueError, "kappa"),
            ({"kappa": 1.0}, ValueError, "kappa"),
            ({"kappa": -0.2}, ValueError, "kappa"),
            ({"kappa": math.nan}, ValueError, "kappa"),
            ({"kappa": "0.3"}, TypeError, "kappa"),
            ({"temperature": 0.0}, ValueError, "temperature"),
            ({"temperature": -1.0}, ValueError, "temperature"),
            ({"variant": "caltrain_lb"}, ValueError, "variant"),
            ({"variant": "Official"}, ValueError, "variant"),
            ({"variant": None}, TypeError, "variant"),
        ],
    )
    def test_rejects_bad_values(self, params, error, match):
        with pytest.raises(error, match=match):
            SoftAvUC(**params)

    def test_error_message_echoes_value(self):
        with pytest.raises(ValueError, match=r"`kappa` must be in \(0, 1\), got 1.5"):
            SoftAvUC(kappa=1.5)


class TestAvUC:
    # kappa = 0.7 nats on the shared example: h = (0.622, 0.879, 0.313, 1.085), a = (1, 0, 0, 1)
    # sample 0: certain & accurate -> AC: c (1 - tanh h) = 0.786 * (1 - 0.552)
    # sample 1: uncertain & inaccurate -> IU: (1 - c) tanh h = 0.342 * 0.706
    # sample 2: certain & inaccurate -> IC: (1 - c)(1 - tanh h) = 0.074 * (1 - 0.303)
    # sample 3: uncertain & accurate -> AU: c tanh h = 0.402 * 0.795
    # AvUC = log(1 + (n_AU + n_IC) / (n_AC + n_IU)) = log(1 + (0.320 + 0.052) / (0.352 + 0.241))
    def _expected(self, entropy, floor=None):
        t = np.tanh(entropy)
        n_ac = CONF[0] * (1 - t[0])
        n_iu = (1 - CONF[1]) * t[1]
        n_ic = (1 - CONF[2]) * (1 - t[2])
        n_au = CONF[3] * t[3]
        denominator = n_ac + n_iu if floor is None else max(n_ac + n_iu, floor)
        return math.log(1 + (n_au + n_ic) / denominator)

    @pytest.mark.parametrize("cls", [AvUC, AvUCGS])
    def test_hand_value(self, cls):
        assert (ENT < 0.7).tolist() == [True, False, True, False]
        expected = self._expected(ENT)
        assert expected == pytest.approx(math.log(1 + 0.372 / 0.593), abs=2e-3)
        terms = cls(beta=0.5, kappa=0.7, variant="paper").terms(*_inputs())
        assert terms["secondary"].item() == pytest.approx(expected, rel=1e-12)
        assert terms["total"].item() == pytest.approx(CE + 0.5 * expected, rel=1e-12)

    @pytest.mark.parametrize("variant", [None, "official", "caltrain"])
    @pytest.mark.parametrize("cls", [AvUC, AvUCGS])
    def test_official_hand_value(self, cls, variant):
        # default = released get_avuc_loss: entropy of (1 - 1e-5) p + 1e-5 / K for the split and
        # in tanh h, denominator floored at 1e-5 ("caltrain" is an older name of it)
        q = (1 - 1e-5) * PROBS + 1e-5 / K
        entropy = -(q * np.log(q)).sum(axis=1)
        expected = self._expected(entropy, floor=1e-5)
        params = {} if variant is None else {"variant": variant}
        loss_fn = cls(primary=None, kappa=0.7, **params)
        assert loss_fn.variant == "official"
        value = loss_fn(*_inputs()).item()
        assert value == pytest.approx(expected, rel=1e-12)
        assert value != pytest.approx(self._expected(ENT), rel=1e-9)

    @pytest.mark.parametrize("cls", [AvUC, AvUCGS])
    def test_official_floors_the_denominator(self, cls):
        # two right predictions, both uncertain (uniform over K = 3, h = log 3 > kappa): AU only,
        # n_AC = n_IU = 0. The paper's ratio is n_AU / 0 = inf; the released code floors the
        # denominator at 1e-5: log(1 + n_AU / 1e-5), n_AU = 2 * (1/3) tanh(log 3) = 0.53333
        logits = torch.zeros(2, 3, dtype=torch.float64)
        targets = torch.tensor([0, 0])
        assert cls(primary=None, kappa=0.7, variant="paper")(logits, targets).item() == math.inf
        n_au = 2 * (1 / 3) * math.tanh(math.log(3))
        assert n_au == pytest.approx(0.53333, abs=1e-5)
        value = cls(primary=None, kappa=0.7)(logits, targets).item()
        assert value == pytest.approx(math.log(1 + n_au / 1e-5), rel=1e-9)

    def test_kappa_is_a_raw_entropy_threshold(self):
        # K = 2, p = (0.8, 0.2): h = 0.500 nats, h / log 2 = 0.722. With kappa = 0.6 the sample is
        # certain on the raw entropy (0.500 < 0.6), although uncertain on the normalised one.
        # One accurate (AC) and one inaccurate (IC) copy: AvUC = log(1 + n_IC / n_AC)
        #   = log(1 + (1 - 0.8)(1 - tanh h) / (0.8 (1 - tanh h))) = log(1 + 0.25)
        logits = torch.tensor([[math.log(0.8), math.log(0.2)]] * 2, dtype=torch.float64)
        targets = torch.tensor([0, 1])
        value = AvUC(primary=None, kappa=0.6, variant="paper")(logits, targets)
        assert value.item() == pytest.approx(math.log(1.25), rel=1e-12)
        # on the normalised entropy it would be AU + IU: log(1 + (0.8 tanh h) / (0.2 tanh h))
        assert value.item() != pytest.approx(math.log(5.0))

    @pytest.mark.parametrize(("variant", "eps"), [("paper", 0.0), ("official", 1e-5)])
    def test_gradient_stopping(self, variant, eps):
        # d AvUC / dz by the chain rule: L = log(Num + Den) - log(Den) with Num = n_AU + n_IC,
        # Den = n_AC + n_IU; each sample's term is g(c) * k(h) with
        #   AC: c (1 - tanh h), IU: (1 - c) tanh h, IC: (1 - c)(1 - tanh h), AU: c tanh h
        # dc/dz_k = c (1[k = pred] - p_k). h is the entropy of q = (1 - eps) p + eps / K (eps = 0
        # for the paper, 1e-5 for the released code): dh/dz_k = -(1 - eps) p_k (log q_k -
        # sum_j p_j log q_j), which is -p_k (log p_k + h) for eps = 0.
        # AvUC-GS keeps only the path through h; AvUC adds the path through c.
        q = (1 - eps) * PROBS + eps / K
        h = -(q * np.log(q)).sum(axis=1)
        t, sech2 = np.tanh(h), 1 - np.tanh(h) ** 2
        c = CONF
        terms = [c[0] * (1 - t[0]), (1 - c[1]) * t[1], (1 - c[2]) * (1 - t[2]), c[3] * t[3]]
        d_dc = [1 - t[0], -t[1], -(1 - t[2]), t[3]]
        d_dh = [-c[0] * sech2[0], (1 - c[1]) * sech2[1], -(1 - c[2]) * sech2[2], c[3] * sech2[3]]
        num, den = terms[2] + terms[3], terms[0] + terms[1]
        d_num, d_den = 1 / (num + den), 1 / (num + den) - 1 / den
        outer = [d_den, d_den, d_num, d_num]  # samples 0, 1 in Den; 2, 3 in Num
        pred = PROBS.argmax(axis=1)
        dc_dz = c[:, None] * (np.eye(K)[pred] - PROBS)
        log_q = np.log(q)
        dh_dz = -(1 - eps) * PROBS * (log_q - (PROBS * log_q).sum(axis=1, keepdims=True))
        via_h = np.array([outer[i] * d_dh[i] * dh_dz[i] for i in range(N)])
        via_c = np.array([outer[i] * d_dc[i] * dc_dz[i] for i in range(N)])

        grads = {}
        for cls in (AvUC, AvUCGS):
            logits, targets = _inputs(requires_grad=True)
            cls(primary=None, kappa=0.7, variant=variant)(logits, targets).backward()
            grads[cls] = logits.grad.numpy()
        np.testing.assert_allclose(grads[AvUCGS], via_h, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(grads[AvUC], via_h + via_c, rtol=1e-10, atol=1e-14)
        assert np.abs(grads[AvUC] - grads[AvUCGS]).max() > 1e-3

    @pytest.mark.parametrize("variant", ["paper", "official"])
    def test_gradcheck(self, variant):
        # kappa = 0.7 is far from every entropy of the example (no sample crosses the threshold)
        logits, _ = _inputs()
        targets = torch.tensor(TARGETS)
        loss_fn = AvUC(kappa=0.7, variant=variant)
        assert torch.autograd.gradcheck(
            lambda z: loss_fn(z, targets), (logits.requires_grad_(True),)
        )

    @pytest.mark.parametrize("cls", [AvUC, AvUCGS])
    @pytest.mark.parametrize(
        ("params", "error", "match"),
        [
            ({"kappa": -0.1}, ValueError, "kappa"),
            ({"kappa": math.inf}, ValueError, "kappa"),
            ({"kappa": None}, TypeError, "kappa"),
            ({"variant": "caltrain_lb"}, ValueError, "variant"),
            ({"variant": "released"}, ValueError, "variant"),
        ],
    )
    def test_rejects_bad_values(self, cls, params, error, match):
        with pytest.raises(error, match=match):
            cls(**params)


class TestMMCE:
    # first three samples of the shared example: r = c = (0.786, 0.658, 0.926), correct
    # (1, 0, 0); kernel k_ij = exp(-|r_i - r_j| / 0.4), e.g. k_01 = exp(-0.128 / 0.4) = 0.727
    LOGITS3 = LOGITS[:3]
    TARGETS3 = TARGETS[:3]

    def _kernel(self, r):
        return [[math.exp(-abs(r[i] - r[j]) / 0.4) for j in range(3)] for i in range(3)]

    def test_default_is_ce_plus_lambda_squared_mmce(self):
        # The default is the released form CE + lambda * MMCE^2, with NO square root:
        # logits (2, 0.5, -1), (0.2, 1.5, 0.1), (-0.5, 0, 3), targets (0, 2, 0), lambda = 2.
        # p = softmax(z) = (0.78560, 0.17529, 0.03911), (0.17940, 0.65827, 0.16233),
        #     (0.02796, 0.04610, 0.92594); r = max p = (0.78560, 0.65827, 0.92594)
        # predictions (0, 1, 2) vs targets (0, 2, 0): c = (1, 0, 0), c - r = (0.21440, -0.65827,
        # -0.92594); k_ij = exp(-|r_i - r_j| / 0.4): k_01 = 0.72738, k_02 = 0.70409,
        # k_12 = 0.51213, k_ii = 1
        # sum_ij (c_i - r_i)(c_j - r_j) k_ij = 0.21440^2 + 0.65827^2 + 0.92594^2
        #   + 2 (0.21440 (-0.65827) 0.72738 + 0.21440 (-0.92594) 0.70409
        #        + (-0.65827)(-0.92594) 0.51213) = 1.47609; / N^2 = / 9 -> MMCE^2 = 0.16401
        # CE = mean(-log 0.78560, -log 0.16233, -log 0.02796) = 1.87880
        # total = 1.87880 + 2 * 0.16401 = 2.20682 (with the root: 1.87880 + 2 * 0.40498 = 2.68876)
        logits = [[2.0, 0.5, -1.0], [0.2, 1.5, 0.1], [-0.5, 0.0, 3.0]]
        targets = [0, 2, 0]
        probs = [[math.exp(z) / sum(math.exp(v) for v in row) for z in row] for row in logits]
        r = [max(row) for row in probs]
        c = [
            1.0 if row.index(max(row)) == t else 0.0 for row, t in zip(probs, targets, strict=True)
        ]
        n = 3
        mmce_squared = (
            sum(
                (c[i] - r[i]) * (c[j] - r[j]) * math.exp(-abs(r[i] - r[j]) / 0.4)
                for i in range(n)
                for j in range(n)
            )
            / n**2
        )
        ce = sum(-math.log(probs[i][targets[i]]) for i in range(n)) / n
        expected = ce + 2.0 * mmce_squared
        assert mmce_squared == pytest.approx(0.16401, abs=1e-5)
        assert expected == pytest.approx(2.20682, abs=1e-5)
        loss_fn = MMCE(beta=2.0)
        assert loss_fn.variant == "official"
        value = loss_fn(torch.tensor(logits, dtype=torch.float64), torch.tensor(targets))
        assert value.dtype == torch.float64
        assert value.item() == pytest.approx(expected, abs=1e-7)
        assert value.item() != pytest.approx(ce + 2.0 * math.sqrt(mmce_squared), abs=1e-3)

    def test_paper_variant_is_the_root(self):
        # Kumar et al.'s objective NLL + lambda * (MMCE^2)^(1/2): 1.87880 + 2 * 0.40498 = 2.68876
        r, correct = CONF[:3], ACC[:3]
        k = self._kernel(r)
        squared = (
            sum(
                (correct[i] - r[i]) * (correct[j] - r[j]) * k[i][j]
                for i in range(3)
                for j in range(3)
            )
            / 9
        )
        ce3 = float(np.mean(-np.log(PROBS[np.arange(3), self.TARGETS3])))
        inputs = _inputs(logits=self.LOGITS3, targets=self.TARGETS3)
        paper = MMCE(beta=2.0, variant="paper").terms(*inputs)
        assert paper["secondary"].item() == pytest.approx(math.sqrt(squared), rel=1e-12)
        assert paper["total"].item() == pytest.approx(ce3 + 2 * math.sqrt(squared), rel=1e-12)
        assert paper["total"].item() == pytest.approx(2.68876, abs=1e-5)
        official = MMCE(beta=2.0).terms(*inputs)
        assert official["secondary"].item() == pytest.approx(squared, rel=1e-12)

    def test_paper_weighted_hand_value(self):
        # D_c = {0} (m_c = 1), D_w = {1, 2} (m_w = 2):
        # MMCE_w^2 = (1 - r_0)^2 k_00 / 1 + sum_{i,j in {1,2}} r_i r_j k_ij / 4
        #            - 2 sum_{j in {1,2}} (1 - r_0) r_j k_0j / 2
        #          = 0.04597 + 1.91500 / 4 - 0.24244 = 0.28228; root 0.53130
        r = CONF[:3]
        k = self._kernel(r)
        squared = (
            (1 - r[0]) ** 2 * k[0][0]
            + sum(r[i] * r[j] * k[i][j] for i in (1, 2) for j in (1, 2)) / 4
            - 2 * sum((1 - r[0]) * r[j] * k[0][j] for j in (1, 2)) / 2
        )
        assert math.sqrt(squared) == pytest.approx(0.53130, abs=1e-5)
        loss_fn = MMCE(primary=None, weighted=True, variant="paper")
        value = loss_fn(*_inputs(logits=self.LOGITS3, targets=self.TARGETS3))
        assert value.item() == pytest.approx(math.sqrt(squared), rel=1e-12)

    def test_official_weighted_hand_value(self):
        # released calibration_mmce_w_loss: each block is first averaged over its pairs, then
        # divided again by (pairs + 1e-5), and 1e-10 is added inside the root. With
        # S_cc = (1 - r_0)^2 k_00 = 0.04597 (1 pair), S_ww = sum_{i,j in {1,2}} r_i r_j k_ij =
        # 1.91500 (4 pairs), S_cw = sum_j (1 - r_0) r_j k_0j = 0.24244 (2 pairs):
        # (0.04597 / 1) / (1 + 1e-5) + (1.91500 / 4) / (4 + 1e-5) - 2 (0.24244 / 2) / (2 + 1e-5)
        #   = 0.04444; sqrt(0.04444 + 1e-10) = 0.21080 (the paper's MMCE_w is 0.53130)
        r = CONF[:3]
        k = self._kernel(r)
        s_cc = (1 - r[0]) ** 2 * k[0][0]
        s_ww = sum(r[i] * r[j] * k[i][j] for i in (1, 2) for j in (1, 2))
        s_cw = sum((1 - r[0]) * r[j] * k[0][j] for j in (1, 2))
        squared = (s_cc / 1) / (1 + 1e-5) + (s_ww / 4) / (4 + 1e-5) - 2 * (s_cw / 2) / (2 + 1e-5)
        expected = math.sqrt(squared + 1e-10)
        assert expected == pytest.approx(0.21080, abs=1e-5)
        loss_fn = MMCE(beta=0.5, weighted=True)
        terms = loss_fn.terms(*_inputs(logits=self.LOGITS3, targets=self.TARGETS3))
        assert terms["secondary"].item() == pytest.approx(expected, rel=1e-12)
        ce3 = float(np.mean(-np.log(PROBS[np.arange(3), self.TARGETS3])))
        assert terms["total"].item() == pytest.approx(ce3 + 0.5 * expected, rel=1e-12)

    def test_official_weighted_is_paper_over_m_for_balanced_batches(self):
        # m_c = m_w = m = 2 (shared example): every block of the released form is divided by
        # m^2 once more, so it is MMCE_w / m up to the 1e-5 and 1e-10 constants
        paper = MMCE(primary=None, weighted=True, variant="paper")(*_inputs())
        official = MMCE(primary=None, weighted=True)(*_inputs())
        assert official.item() == pytest.approx(paper.item() / 2, rel=1e-5)

    def test_paper_weighted_is_twice_unweighted_for_balanced_batches(self):
        # m_c = m_w = N / 2 (shared example): v_i = (c_i - r_i) / (N/2) = 2 (c_i - r_i) / N
        unweighted = MMCE(primary=None, variant="paper")(*_inputs())
        weighted = MMCE(primary=None, weighted=True, variant="paper")(*_inputs())
        assert weighted.item() == pytest.approx(2 * unweighted.item(), rel=1e-12)

    @pytest.mark.parametrize("variant", ["official", "paper"])
    def test_weighted_is_zero_without_both_groups(self, variant):
        logits, _ = _inputs(requires_grad=True)
        all_correct = torch.tensor([0, 1, 2, 1])
        value = MMCE(primary=None, weighted=True, variant=variant)(logits, all_correct)
        assert value.item() == 0.0
        value.backward()
        assert torch.equal(logits.grad, torch.zeros_like(logits))
        assert MMCE(primary=None, variant=variant)(logits, all_correct).item() > 0

    def test_calibrated_batch(self):
        # two samples with confidence 0.5 (logits 0, 0), one right, one wrong: k = 1 and
        # (1 - r_0) = r_1 = 0.5, so every form is 0 except the released MMCE_w, which returns
        # sqrt(0 + 1e-10) = 1e-5 (its blocks 0.25/(1 + 1e-5) + 0.25/(1 + 1e-5) - 2 * 0.25/(1 +
        # 1e-5) cancel exactly)
        logits = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
        targets = torch.tensor([0, 1])
        assert MMCE(primary=None)(logits, targets).item() == pytest.approx(0.0, abs=1e-15)
        paper = MMCE(primary=None, weighted=True, variant="paper")(logits, targets)
        assert paper.item() == 0.0
        paper.backward()
        assert torch.equal(logits.grad, torch.zeros_like(logits))
        official = MMCE(primary=None, weighted=True)(logits, targets)
        assert official.item() == pytest.approx(1e-5, rel=1e-9)

    def test_kernel_width_limit(self):
        # a huge width makes k = 1: MMCE^2 = (mean_i (c_i - r_i))^2, its root |mean(a - c)|
        official = MMCE(primary=None, kernel_width=1e12)(*_inputs())
        paper = MMCE(primary=None, kernel_width=1e12, variant="paper")(*_inputs())
        assert official.item() == pytest.approx(np.mean(ACC - CONF) ** 2, rel=1e-9)
        assert paper.item() == pytest.approx(abs(np.mean(ACC - CONF)), rel=1e-9)

    @pytest.mark.parametrize("variant", ["official", "paper"])
    @pytest.mark.parametrize("weighted", [False, True])
    def test_gradcheck(self, weighted, variant):
        logits, targets = _inputs()
        loss_fn = MMCE(weighted=weighted, variant=variant)
        assert torch.autograd.gradcheck(
            lambda z: loss_fn(z, targets), (logits.requires_grad_(True),)
        )

    @pytest.mark.parametrize(
        ("params", "error", "match"),
        [
            ({"kernel_width": 0.0}, ValueError, "kernel_width"),
            ({"kernel_width": -0.4}, ValueError, "kernel_width"),
            ({"kernel_width": math.inf}, ValueError, "kernel_width"),
            ({"weighted": 1}, TypeError, "weighted"),
            ({"variant": "caltrain"}, ValueError, "variant"),
            ({"variant": "root"}, ValueError, "variant"),
        ],
    )
    def test_rejects_bad_values(self, params, error, match):
        with pytest.raises(error, match=match):
            MMCE(**params)


class TestMDCA:
    def test_hand_value(self):
        # mean p over the batch = (0.3305, 0.3204, 0.3492); class frequencies of the targets
        # (0, 2, 0, 1) = (0.5, 0.25, 0.25); MDCA = (1/3)(0.1695 + 0.0704 + 0.0992) = 0.1130
        freq = np.bincount(TARGETS, minlength=K) / N
        expected = float(np.mean(np.abs(PROBS.mean(axis=0) - freq)))
        assert expected == pytest.approx(0.1130, abs=1e-4)
        terms = MDCA(beta=3.0).terms(*_inputs())
        assert terms["secondary"].item() == pytest.approx(expected, rel=1e-12)
        assert terms["total"].item() == pytest.approx(CE + 3.0 * expected, rel=1e-12)

    def test_averages_over_classes(self):
        # (1/K) sum_k, not the sum of ACLS supp. Eq. 9: uniform predictions over K = 4 classes
        # with every target 0 give gaps (0.75, 0.25, 0.25, 0.25): mean 0.375 (sum 1.5)
        logits = torch.zeros(2, 4, dtype=torch.float64)
        targets = torch.tensor([0, 0])
        assert MDCA(primary=None)(logits, targets).item() == pytest.approx(0.375, rel=1e-12)

    def test_gradcheck(self):
        logits, targets = _inputs()
        loss_fn = MDCA()
        assert torch.autograd.gradcheck(
            lambda z: loss_fn(z, targets), (logits.requires_grad_(True),)
        )


@pytest.mark.parametrize(("p", "variant"), [(1, "paper"), (2, "paper"), (2, "official")])
@pytest.mark.parametrize("binning", ["lb", "bin"])
def test_sbece_gradient_finite_with_nearly_empty_bins(p, variant, binning):
    # near-uniform outputs (all confidences ~0.1) with a sharp T leave most soft bins with a
    # mass of ~1e-30: that used to make the backward pass inf * 0 = NaN on the first batches
    torch.manual_seed(0)
    logits = (torch.randn(64, 10) * 0.01).requires_grad_()
    targets = torch.randint(0, 10, (64,))
    loss_fn = SoftBinnedECE(
        primary=None, p=p, temperature=0.00215, binning=binning, variant=variant
    )
    loss = loss_fn(logits, targets)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad).all()
