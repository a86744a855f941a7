"""Tests of raysearch.calibration.temperature (ts, ts_sbece, ets, cts), its fits and objectives."""

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from raysearch.calibration import fit_calibrator
from raysearch.calibration.objectives import build_objective
from raysearch.calibration.sbece import grouped_sbece
from raysearch.calibration.temperature import (
    ClassTemperatureScaling,
    EnsembleTemperatureScaling,
    TemperatureScaling,
)
from raysearch.calibration.temperature_fit import ScalarTemperatureProblem
from raysearch.losses.soft_binning import soft_binned_ece
from raysearch.metrics import ece, nll, softmax

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "cifar_outputs"
SKIP_REASON = f"real CIFAR outputs not found at {DATA} (see shared/data/README.md)"


def _sample_labels(z_true, rng):
    p = softmax(z_true)
    u = rng.random(p.shape[0])
    return np.minimum((np.cumsum(p, axis=1) < u[:, None]).sum(axis=1), p.shape[1] - 1)


def _synthetic(n=20000, k=5, scale=2.0, seed=0):
    """True logits z_true and labels drawn from softmax(z_true) (a perfectly calibrated model)."""
    rng = np.random.default_rng(seed)
    z_true = rng.normal(size=(n, k)) * scale
    return z_true, _sample_labels(z_true, rng)


def _stratified_halves(labels, seed=0):
    rng = np.random.default_rng(seed)
    first, second = [], []
    for k in np.unique(labels):
        idx = np.flatnonzero(labels == k)
        rng.shuffle(idx)
        half = idx.size // 2
        first.append(idx[:half])
        second.append(idx[half:])
    return np.sort(np.concatenate(first)), np.sort(np.concatenate(second))


def _load(name):
    if not DATA.is_dir():
        pytest.skip(SKIP_REASON)
    data = np.load(DATA / name)
    probs = data["predictions"].astype(np.float64)
    labels = data["ground_truth"].astype(np.int64)
    cal, test = _stratified_halves(labels, seed=0)
    logits = np.log(np.clip(probs, 1e-12, None))
    return logits[cal], labels[cal], logits[test], labels[test], probs[test]


# ------------------------------------------------------------------------------------------
# Objectives: hand values, limits, analytic gradients against torch autograd
# ------------------------------------------------------------------------------------------

# Shared 2x3 example. Sample 0: logits (1, 2, 3), label 0; sample 1: (0.5, -1, 2), label 2.
LOGITS = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
LABELS = np.array([0, 2])
LSE = [
    math.log(math.exp(1.0) + math.exp(2.0) + math.exp(3.0)),
    math.log(math.exp(0.5) + math.exp(-1.0) + math.exp(2.0)),
]
LOGP = LOGITS - np.array(LSE)[:, None]  # log p_ik = z_ik - lse_i
P = np.exp(LOGP)  # p_0 = (0.090, 0.245, 0.665), p_1 = (0.175, 0.039, 0.786)


class TestObjectiveValues:
    def test_nll_hand(self):
        # mean of (lse_0 - z_00, lse_1 - z_12) = mean(2.4076, 0.2413)
        expected = ((LSE[0] - 1.0) + (LSE[1] - 2.0)) / 2
        assert build_objective("nll").value(LOGP, LABELS) == pytest.approx(expected, rel=1e-12)

    def test_ls_hand(self):
        # (1 - eps) * nll_i + eps * (1/K) sum_k -log p_ik, eps = 0.1, K = 3
        eps = 0.1
        per = [(1 - eps) * -LOGP[i, LABELS[i]] + eps * -LOGP[i].mean() for i in range(2)]
        value = build_objective("ls", epsilon=eps).value(LOGP, LABELS)
        assert value == pytest.approx(np.mean(per), rel=1e-12)

    def test_focal_hand(self):
        # -(1 - p_y)^gamma log p_y with gamma = 2: p_y = (0.0900, 0.7856)
        py = P[[0, 1], LABELS]
        expected = np.mean(-((1 - py) ** 2) * np.log(py))
        assert build_objective("focal", gamma=2.0).value(LOGP, LABELS) == pytest.approx(
            expected, rel=1e-12
        )

    def test_mse_is_brier(self):
        # sum_k (p_k - Y_k)^2 per sample, mean over samples (raysearch.metrics.brier)
        onehot = np.eye(3)[LABELS]
        expected = np.mean(((P - onehot) ** 2).sum(axis=1))
        assert build_objective("mse").value(LOGP, LABELS) == pytest.approx(expected, rel=1e-12)

    @pytest.mark.parametrize(
        ("name", "params"), [("ls", {"epsilon": 0.0}), ("focal", {"gamma": 0.0})]
    )
    def test_limits_give_nll(self, name, params):
        nll_value = build_objective("nll").value(LOGP, LABELS)
        assert build_objective(name, **params).value(LOGP, LABELS) == pytest.approx(
            nll_value, rel=1e-12
        )

    def test_class_coef_is_weighted_class_means(self):
        # c = (2, 0, 1): 2 * (nll of sample 0) + 1 * (nll of sample 1), each its class's mean
        nll_obj = build_objective("nll")
        value = nll_obj.value(LOGP, LABELS, class_coef=np.array([2.0, 0.0, 1.0]))
        assert value == pytest.approx(2 * -LOGP[0, 0] + -LOGP[1, 2], rel=1e-12)
        losses = nll_obj.class_losses(LOGP, LABELS, 3)
        assert losses[0] == pytest.approx(-LOGP[0, 0])
        assert np.isnan(losses[1])  # no sample of class 1

    @pytest.mark.parametrize(
        ("name", "params"),
        [("epsilon", {"epsilon": 1.0}), ("gamma", {"gamma": -1.0})],
    )
    def test_bad_params(self, name, params):
        loss = "ls" if name == "epsilon" else "focal"
        with pytest.raises(ValueError, match=name):
            build_objective(loss, **params)

    def test_unknown_loss_and_param(self):
        with pytest.raises(ValueError, match="Unknown calibration loss 'hinge'; available"):
            build_objective("hinge")
        with pytest.raises(ValueError, match="unexpected parameter.*gamma"):
            build_objective("nll", gamma=1.0)
        with pytest.raises(ValueError, match="binning"):
            build_objective("sbece", binning="equal_mass")
        with pytest.raises(ValueError, match="sb_temperature"):
            build_objective("sbece", sb_temperature=0.0)


PER_SAMPLE = [("nll", {}), ("ls", {"epsilon": 0.1}), ("focal", {"gamma": 3.0}), ("mse", {})]


def _torch_total(objective, log_p, labels, coef):
    return objective.torch_value(log_p, torch.from_numpy(labels), coef)


class TestObjectiveGradients:
    @pytest.fixture
    def data(self):
        rng = np.random.default_rng(1)
        z = rng.normal(size=(7, 4)) * 3.0
        labels = np.array([0, 1, 2, 3, 0, 1, 1])
        coef = np.array([1.5, 0.5, 1.0, 2.0])
        return z, labels, coef

    @pytest.mark.parametrize(("name", "params"), PER_SAMPLE)
    @pytest.mark.parametrize("weighted", [False, True])
    def test_logits_gradient_matches_autograd(self, data, name, params, weighted):
        z, labels, coef = data
        objective = build_objective(name, **params)
        c = coef if weighted else None
        value, grad = objective.value_and_grad_logits(z, labels, c)
        zt = torch.tensor(z, requires_grad=True)
        ct = None if c is None else torch.tensor(c)
        total = _torch_total(objective, torch.log_softmax(zt, dim=1), labels, ct)
        total.backward()
        assert value == pytest.approx(total.item(), rel=1e-10)
        np.testing.assert_allclose(grad, zt.grad.numpy(), rtol=1e-8, atol=1e-12)

    @pytest.mark.parametrize(("name", "params"), PER_SAMPLE)
    def test_probs_gradient_matches_autograd(self, data, name, params):
        z, labels, coef = data
        objective = build_objective(name, **params)
        p = softmax(z) * 0.8 + 0.05  # a mixture-like point, rows sum to 1
        value, grad = objective.value_and_grad_probs(p, labels, coef)
        pt = torch.tensor(p, requires_grad=True)
        total = _torch_total(objective, pt.log(), labels, torch.tensor(coef))
        total.backward()
        assert value == pytest.approx(total.item(), rel=1e-10)
        np.testing.assert_allclose(grad, pt.grad.numpy(), rtol=1e-8, atol=1e-12)

    @pytest.mark.parametrize(("name", "params"), PER_SAMPLE)
    @pytest.mark.parametrize("log_t", [-0.7, 0.0, 1.3])
    def test_temperature_derivative_matches_autograd(self, data, name, params, log_t):
        # the row-statistics fast path of TS against autograd on d/d(log T)
        z, labels, coef = data
        objective = build_objective(name, **params)
        problem = ScalarTemperatureProblem(z, labels, objective, coef)
        value, grad = problem.value_and_grad(log_t)
        s = torch.tensor(log_t, dtype=torch.float64, requires_grad=True)
        log_p = torch.log_softmax(torch.from_numpy(z) * torch.exp(-s), dim=1)
        total = _torch_total(objective, log_p, labels, torch.tensor(coef))
        total.backward()
        assert value == pytest.approx(total.item(), rel=1e-10)
        assert grad == pytest.approx(s.grad.item(), rel=1e-8, abs=1e-12)

    @pytest.mark.parametrize("name", ["nll", "ls"])
    def test_temperature_curvature_matches_finite_difference(self, data, name):
        z, labels, _ = data
        problem = ScalarTemperatureProblem(z, labels, build_objective(name), None)
        h = 1e-5
        _, _, second = problem.evaluate(0.3, curvature=True)
        numeric = (problem.value_and_grad(0.3 + h)[1] - problem.value_and_grad(0.3 - h)[1]) / (
            2 * h
        )
        assert second == pytest.approx(numeric, rel=1e-5)

    def test_focal_gradient_finite_where_p_is_one(self):
        # p_y == 1 exactly (huge margin): the gamma < 1 focal gradient must stay finite (0)
        z = np.array([[800.0, 0.0, 0.0]])
        value, grad = build_objective("focal", gamma=0.5).value_and_grad_logits(z, np.array([0]))
        assert value == 0.0
        assert np.isfinite(grad).all()


def _sbece_numpy(conf, hits, **kwargs):
    """The NumPy twin on a single group."""
    settings = {"n_bins": 15, "temperature": 0.01, "p": 2.0, "binning": "bin", **kwargs}
    groups = np.zeros(len(conf), dtype=np.intp)
    return grouped_sbece(
        np.asarray(conf, dtype=np.float64), np.asarray(hits), groups, 1, *settings.values()
    )[0]


class TestSoftBinnedECE:
    def test_one_bin_hand_value(self):
        # M = 1: every sample is fully in the bin, so "bin" = |mean(a) - mean(c)| (any p)
        # c = (0.9, 0.6, 0.8), a = (1, 0, 1): |2/3 - 0.7667| = 0.1
        c, a = [0.9, 0.6, 0.8], [True, False, True]
        assert _sbece_numpy(c, a, n_bins=1) == pytest.approx(0.1, abs=1e-12)
        # "lb": (1/N sum_i |A - c_i|^2)^(1/2) with A = 2/3
        expected = math.sqrt(((0.9 - 2 / 3) ** 2 + (0.6 - 2 / 3) ** 2 + (0.8 - 2 / 3) ** 2) / 3)
        assert _sbece_numpy(c, a, n_bins=1, binning="lb") == pytest.approx(expected, rel=1e-12)

    def test_hard_limit_is_ece(self):
        # sb_temperature -> 0: memberships become the equal-width bins, p = 1 gives the ECE
        rng = np.random.default_rng(0)
        conf = rng.uniform(0.501, 0.999, size=400)  # the top-1 of (c, 1 - c)
        hits = rng.random(400) < conf - 0.1
        probs = np.stack([conf, 1 - conf], axis=1)
        labels = np.where(hits, 0, 1)
        soft = _sbece_numpy(conf, hits, n_bins=10, temperature=1e-7, p=1.0)
        assert soft == pytest.approx(ece(probs, labels, n_bins=10), abs=1e-6)

    @pytest.mark.parametrize("binning", ["bin", "lb"])
    @pytest.mark.parametrize("p", [1.0, 2.0])
    def test_numpy_twin_matches_soft_binned_ece_per_group(self, binning, p):
        rng = np.random.default_rng(2)
        conf, hits, groups = rng.random(200), rng.random(200) < 0.6, rng.integers(0, 3, 200)
        values = grouped_sbece(conf, hits, groups, 3, 15, 0.01, p, binning)
        reference = [
            soft_binned_ece(
                torch.from_numpy(conf[groups == g]),
                torch.from_numpy(hits[groups == g]),
                p=p,
                binning=binning,
            ).item()
            for g in range(3)
        ]
        np.testing.assert_allclose(values, reference, rtol=1e-10)

    def test_objective_uses_both_consistently(self):
        rng = np.random.default_rng(3)
        z, labels = rng.normal(size=(300, 4)) * 3, rng.integers(0, 4, 300)
        objective = build_objective("sbece")
        coef = np.array([1.0, 0.5, 2.0, 1.5])
        for c in (None, coef):
            value, _ = objective.value_and_grad_logits(z, labels, c)  # torch
            assert value == pytest.approx(objective.value(np.log(softmax(z)), labels, c), rel=1e-9)


# ------------------------------------------------------------------------------------------
# Temperature scaling
# ------------------------------------------------------------------------------------------


class TestTemperatureScaling:
    def test_hand_prediction(self):
        cal = TemperatureScaling(build_objective("nll"))
        cal.fit(LOGITS, LABELS)
        t = cal.temperature
        np.testing.assert_allclose(cal.predict_proba(LOGITS), softmax(LOGITS / t), rtol=1e-12)
        assert cal.params_["temperature"] == t

    @pytest.mark.parametrize("t0", [0.5, 2.0])
    def test_recovers_known_temperature(self, t0):
        # labels ~ softmax(z_true), observed logits t0 * z_true: the NLL optimum is T = t0
        z_true, labels = _synthetic(n=20000, k=5, seed=3)
        cal = fit_calibrator("ts", t0 * z_true, labels)
        assert cal.temperature == pytest.approx(t0, rel=0.05)

    def test_gradient_is_zero_at_the_fit(self):
        z_true, labels = _synthetic(n=5000, k=4, seed=4)
        logits = 2.5 * z_true
        cal = fit_calibrator("ts", logits, labels)
        t = torch.tensor(cal.temperature, dtype=torch.float64, requires_grad=True)
        loss = torch.nn.functional.cross_entropy(
            torch.from_numpy(logits) / t, torch.from_numpy(labels)
        )
        loss.backward()
        assert abs(t.grad.item()) < 1e-8  # converged, not a fixed number of steps
        # and the NLL is no lower a little to either side
        for factor in (0.999, 1.001):
            other = nll(softmax(logits / (cal.temperature * factor)), labels)
            assert other >= nll(cal.predict_proba(logits), labels)
        assert cal.fit_info_["method"] == "newton"

    def test_biased_case_ends_at_the_bound_and_warns(self):
        # every prediction confidently wrong: NLL decreases all the way to T -> infinity
        logits = np.tile([[4.0, 0.0, -1.0]], (50, 1))
        labels = np.full(50, 1)
        with pytest.warns(UserWarning, match="upper bound T=20"):
            cal = fit_calibrator("ts", logits, labels)
        assert cal.temperature == pytest.approx(20.0)
        assert cal.params_["at_bound"] == "upper"

    @pytest.mark.parametrize(
        ("loss", "params"), [("ls", {"epsilon": 0.1}), ("focal", {}), ("mse", {})]
    )
    def test_other_objectives_reach_the_grid_minimum(self, loss, params):
        z_true, labels = _synthetic(n=4000, k=4, seed=5)
        logits = 3.0 * z_true
        cal = fit_calibrator("ts", logits, labels, loss=loss, **params)
        objective = build_objective(loss, **params)
        grid = np.exp(np.linspace(math.log(0.05), math.log(20), 2001))
        best = min(objective.value(np.log(softmax(logits / t)), labels) for t in grid)
        fitted = objective.value(np.log(cal.predict_proba(logits)), labels)
        assert fitted <= best + 1e-9
        assert abs(cal.fit_info_["grad"]) < 1e-7

    def test_rank_preserving(self):
        z_true, labels = _synthetic(n=2000, k=6, seed=6)
        cal = fit_calibrator("ts", 3 * z_true, labels)
        np.testing.assert_array_equal(cal.predict_proba(z_true).argmax(1), z_true.argmax(1))

    def test_bounds_validated(self):
        with pytest.raises(ValueError, match="`t_min` must be smaller than `t_max`"):
            TemperatureScaling(build_objective("nll"), t_min=2.0, t_max=1.0)
        with pytest.raises(ValueError, match="t_min"):
            TemperatureScaling(build_objective("nll"), t_min=0.0)


class TestTemperatureScalingSBECE:
    def test_lowers_sbece_and_ece_on_synthetic(self):
        z_true, labels = _synthetic(n=5000, k=5, seed=7)
        logits = 3.0 * z_true  # overconfident
        cal = fit_calibrator("ts_sbece", logits, labels)
        objective = build_objective("sbece")
        before = objective.value(np.log(softmax(logits)), labels)
        after = objective.value(np.log(cal.predict_proba(logits)), labels)
        assert after < before
        assert ece(cal.predict_proba(logits), labels) < ece(softmax(logits), labels)
        assert cal.temperature == pytest.approx(3.0, rel=0.15)
        assert cal.fit_info_["method"] == "grid+brent"

    def test_rejects_other_losses(self):
        with pytest.raises(ValueError, match="ts_sbece fits the soft-binned ECE"):
            fit_calibrator("ts_sbece", LOGITS, LABELS, loss="nll")

    def test_params_reach_the_objective(self):
        z_true, labels = _synthetic(n=1000, k=3, seed=8)
        cal = fit_calibrator(
            "ts_sbece", z_true, labels, n_bins=10, sb_temperature=0.02, p=1, binning="lb"
        )
        assert cal.params_["objective_n_bins"] == 10
        assert cal.params_["objective_binning"] == "lb"


# ------------------------------------------------------------------------------------------
# Ensemble temperature scaling
# ------------------------------------------------------------------------------------------


class TestEnsembleTemperatureScaling:
    @pytest.mark.parametrize("loss", ["nll", "mse"])
    def test_weights_on_simplex_and_ece_lowered(self, loss):
        z_true, labels = _synthetic(n=6000, k=5, seed=9)
        logits = 2.5 * z_true
        cal = fit_calibrator("ets", logits, labels, loss=loss)
        w = cal.weights
        assert w.shape == (3,)
        assert (w >= 0).all()
        assert (w <= 1).all()
        assert w.sum() == pytest.approx(1.0, abs=1e-12)
        assert ece(cal.predict_proba(logits), labels) < 0.5 * ece(softmax(logits), labels)

    def test_mse_follows_released_order(self):
        # Mix-n-Match's ets_calibrate: T by MSE first, then the weights with T fixed
        z_true, labels = _synthetic(n=3000, k=4, seed=10)
        logits = 2.0 * z_true
        ets = fit_calibrator("ets", logits, labels, loss="mse")
        ts = fit_calibrator("ts", logits, labels, loss="mse")
        assert ets.temperature == pytest.approx(ts.temperature, rel=1e-9)

    def test_prediction_is_the_mixture_and_rank_preserving(self):
        z_true, labels = _synthetic(n=3000, k=4, seed=11)
        logits = 2.0 * z_true + np.random.default_rng(0).normal(size=z_true.shape)
        cal = fit_calibrator("ets", logits, labels)
        w, t = cal.weights, cal.temperature
        expected = w[0] * softmax(logits / t) + w[1] * softmax(logits) + w[2] / 4
        probs = cal.predict_proba(logits)
        np.testing.assert_allclose(probs, expected, rtol=1e-10, atol=1e-15)
        np.testing.assert_array_equal(probs.argmax(1), logits.argmax(1))

    @pytest.mark.filterwarnings("ignore:ets. the fitted temperature hit")  # random labels
    def test_argmax_preserved_for_any_weights_with_mass_on_a_softmax(self):
        # the proof in the docstring, checked: w1 + w2 > 0 keeps the strict order of z
        rng = np.random.default_rng(12)
        logits = rng.normal(size=(500, 7)) * 4
        cal = EnsembleTemperatureScaling(build_objective("nll"))
        cal.fit(logits, rng.integers(0, 7, 500))
        for w in ([0.0, 1e-6, 1 - 1e-6], [0.3, 0.0, 0.7], [0.2, 0.5, 0.3]):
            cal._weights = np.array(w)
            order_in = np.argsort(logits, axis=1)
            order_out = np.argsort(cal.predict_proba(logits), axis=1)
            np.testing.assert_array_equal(order_in, order_out)


# ------------------------------------------------------------------------------------------
# Class-based temperature scaling
# ------------------------------------------------------------------------------------------


class TestClassTemperatureScaling:
    def test_recovers_per_class_scales(self):
        # logits[:, k] = s_k * z_true[:, k], labels ~ softmax(z_true): optimum T_k = s_k
        scales = np.array([0.5, 1.0, 2.0, 3.0])
        z_true, labels = _synthetic(n=40000, k=4, scale=1.5, seed=13)
        cal = fit_calibrator("cts", z_true * scales, labels)
        np.testing.assert_allclose(cal.temperatures, scales, rtol=0.07)
        assert cal.params_["temperatures"] == pytest.approx(list(cal.temperatures))

    @pytest.mark.filterwarnings("ignore:cts. the temperatures")  # 3 samples: T_0 hits a bound
    def test_divides_each_logit_column(self):
        cal = ClassTemperatureScaling(build_objective("nll"))
        cal.fit(np.array([[1.0, 2.0], [2.0, 0.5], [0.0, 1.0]]), np.array([0, 0, 1]))
        t = cal.temperatures
        z = np.array([[3.0, 1.0]])
        np.testing.assert_allclose(cal.predict_proba(z), softmax(z / t), rtol=1e-12)

    def test_can_change_predictions(self):
        # class 0 is over-predicted: its temperature grows and some argmaxes move to class 1
        rng = np.random.default_rng(14)
        z_true = rng.normal(size=(4000, 2))
        labels = _sample_labels(z_true, rng)
        logits = z_true * np.array([4.0, 1.0]) + np.array([1.0, 0.0])
        cal = fit_calibrator("cts", logits, labels)
        assert not cal.rank_preserving
        assert (cal.predict_proba(logits).argmax(1) != logits.argmax(1)).any()

    def test_missing_class_is_named(self):
        logits = np.random.default_rng(0).normal(size=(6, 5))
        with pytest.raises(ValueError, match="cts needs every class.*missing classes: 2, 4"):
            fit_calibrator("cts", logits, np.array([0, 1, 3, 0, 1, 3]))

    def test_gradient_is_zero_at_the_fit(self):
        z_true, labels = _synthetic(n=3000, k=3, seed=15)
        cal = fit_calibrator("cts", 2 * z_true, labels)
        grad = cal._value_and_grad(np.log(cal.temperatures), 2 * z_true, labels, None)[1]
        assert np.abs(grad).max() < 1e-7


# ------------------------------------------------------------------------------------------
# Real network outputs (netcal WRN-16-4 CIFAR-10, DenseNet-BC-100 CIFAR-100), 5k/5k split
# ------------------------------------------------------------------------------------------


class TestRealData:
    def test_wrn_ts(self):
        cal_z, cal_y, test_z, test_y, test_p = _load("netcal_wideresnet-16-4-cifar-10.npz")
        before = ece(test_p, test_y)
        assert 0.04 <= before <= 0.06
        cal = fit_calibrator("ts", cal_z, cal_y)
        assert ece(cal.predict_proba(test_z), test_y) <= 0.015
        assert 1.5 < cal.temperature < 3.0

    def test_wrn_ts_from_probabilities(self):
        cal_z, cal_y, test_z, test_y, _ = _load("netcal_wideresnet-16-4-cifar-10.npz")
        from_logits = fit_calibrator("ts", cal_z, cal_y)
        from_probs = fit_calibrator("ts", np.exp(cal_z), cal_y, inputs="probs")
        assert from_probs.temperature == pytest.approx(from_logits.temperature, rel=1e-6)
        np.testing.assert_allclose(
            from_probs.predict_proba(np.exp(test_z)),
            from_logits.predict_proba(test_z),
            atol=1e-9,
        )

    def test_wrn_ts_sbece_lowers_ece(self):
        cal_z, cal_y, test_z, test_y, test_p = _load("netcal_wideresnet-16-4-cifar-10.npz")
        cal = fit_calibrator("ts_sbece", cal_z, cal_y)
        assert ece(cal.predict_proba(test_z), test_y) < 0.5 * ece(test_p, test_y)

    def test_densenet_cifar100_ts(self):
        cal_z, cal_y, test_z, test_y, test_p = _load("netcal_densenet-bc-100-cifar-100.npz")
        assert 0.12 <= ece(test_p, test_y) <= 0.16
        cal = fit_calibrator("ts", cal_z, cal_y)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no bound hit
            assert ece(cal.predict_proba(test_z), test_y) < 0.03
