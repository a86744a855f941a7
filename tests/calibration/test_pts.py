"""Tests of raysearch.calibration.pts (``pts`` of Tomani et al. and ``pts_sctl`` of Jung et al.)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from raysearch.calibration import calibrator_parameters, fit_calibrator
from raysearch.calibration.classwise import ClasswiseLossScaling
from raysearch.calibration.objectives import build_objective
from raysearch.calibration.pts import (
    ParameterizedTemperatureScaling,
    SCTLParameterizedTemperatureScaling,
)
from raysearch.metrics import ece, nll, softmax

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "cifar_outputs"
SKIP_REASON = f"real CIFAR outputs not found at {DATA} (see shared/data/README.md)"


def _synthetic(n=3000, k=5, seed=0):
    """Overconfident logits whose confidence also depends on the top-2 margin (PTS can help)."""
    rng = np.random.default_rng(seed)
    z_true = rng.normal(size=(n, k)) * 2.0
    p = softmax(z_true)
    u = rng.random(n)
    labels = np.minimum((np.cumsum(p, axis=1) < u[:, None]).sum(axis=1), k - 1)
    return 3.0 * z_true, labels


class TestPTS:
    def test_deterministic_for_a_seed(self):
        logits, labels = _synthetic()
        a = fit_calibrator("pts", logits, labels, steps=50, seed=3).predict_proba(logits)
        b = fit_calibrator("pts", logits, labels, steps=50, seed=3).predict_proba(logits)
        np.testing.assert_array_equal(a, b)

    def test_output_and_rank_preservation(self):
        logits, labels = _synthetic(seed=1)
        cal = fit_calibrator("pts", logits, labels, steps=100)
        probs = cal.predict_proba(logits)
        assert probs.dtype == np.float64
        assert probs.shape == logits.shape
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-12)
        np.testing.assert_array_equal(np.argsort(probs, axis=1), np.argsort(logits, axis=1))
        temperatures = cal.temperatures(logits)
        assert temperatures.shape == (logits.shape[0],)
        assert (temperatures > 0).all()
        # the per-sample temperature is the one applied: softmax(z / T_n)
        np.testing.assert_allclose(probs, softmax(logits / temperatures[:, None]), rtol=1e-10)

    def test_starts_from_ts_and_lowers_its_training_loss(self):
        logits, labels = _synthetic(seed=2)
        ts = fit_calibrator("ts", logits, labels)
        pts = fit_calibrator("pts", logits, labels, loss="nll", steps=200, lr=0.01)
        assert pts.params_["ts_temperature_start"] == pytest.approx(ts.temperature, rel=1e-9)
        assert nll(pts.predict_proba(logits), labels) < nll(ts.predict_proba(logits), labels)
        assert pts.losses_[-1] < pts.losses_[0]

    def test_invariant_to_a_per_row_shift(self):
        logits, labels = _synthetic(seed=4)
        shift = np.random.default_rng(0).normal(size=(logits.shape[0], 1)) * 5
        a = fit_calibrator("pts", logits, labels, steps=30)
        b = fit_calibrator("pts", logits + shift, labels, steps=30)
        np.testing.assert_allclose(
            a.predict_proba(logits), b.predict_proba(logits + shift), rtol=1e-6, atol=1e-9
        )

    def test_top_k_capped_at_k(self):
        logits, labels = _synthetic(k=3, seed=5)
        cal = fit_calibrator("pts", logits, labels, steps=5, top_k=10)
        assert cal.params_["top_k"] == 3
        assert cal._net.hidden[0].in_features == 3

    @pytest.mark.parametrize("loss", ["mse", "ls", "focal", "sbece"])
    def test_other_objectives_run(self, loss):
        logits, labels = _synthetic(n=800, seed=6)
        cal = fit_calibrator("pts", logits, labels, loss=loss, steps=20)
        assert np.isfinite(cal.predict_proba(logits)).all()
        assert np.isfinite(cal.params_["final_loss"])

    @pytest.mark.parametrize(
        ("params", "match"),
        [
            ({"steps": 0}, "`steps` must be >= 1"),
            ({"lr": 0.0}, "`lr` must be > 0"),
            ({"n_nodes": 0}, "`n_nodes` must be >= 1"),
            ({"weight_decay": -1.0}, "`weight_decay` must be >= 0"),
        ],
    )
    def test_bad_params(self, params, match):
        with pytest.raises(ValueError, match=match):
            ParameterizedTemperatureScaling(build_objective("nll"), **params)

    def test_unfitted(self):
        cal = ParameterizedTemperatureScaling(build_objective("nll"))
        with pytest.raises(RuntimeError, match="not fitted"):
            cal.predict_proba(np.zeros((2, 3)))
        with pytest.raises(RuntimeError, match="not fitted"):
            cal.temperatures(np.zeros((2, 3)))


class TestPTSRealData:
    def test_wrn_lowers_nll_and_ece(self):
        if not DATA.is_dir():
            pytest.skip(SKIP_REASON)
        data = np.load(DATA / "netcal_wideresnet-16-4-cifar-10.npz")
        probs = data["predictions"].astype(np.float64)
        labels = data["ground_truth"].astype(np.int64)
        rng = np.random.default_rng(0)
        cal_idx, test_idx = [], []
        for k in range(probs.shape[1]):
            idx = np.flatnonzero(labels == k)
            rng.shuffle(idx)
            cal_idx.append(idx[: idx.size // 2])
            test_idx.append(idx[idx.size // 2 :])
        cal_idx, test_idx = np.sort(np.concatenate(cal_idx)), np.sort(np.concatenate(test_idx))
        cal = fit_calibrator("pts", probs[cal_idx], labels[cal_idx], inputs="probs")
        calibrated = cal.predict_proba(probs[test_idx])
        assert nll(calibrated, labels[test_idx]) < nll(probs[test_idx], labels[test_idx]) - 0.05
        assert ece(calibrated, labels[test_idx]) < 0.02


class TestSCTLPTS:
    """``pts_sctl``: the PTS baseline as Jung et al.'s released code builds it."""

    def test_initialisation_is_the_released_network_bit_for_bit(self):
        # the released code calls torch.manual_seed(1), then builds Linear(10, 2), three
        # Linear(2, 2) and Linear(2, 1) with torch's default init; here a private generator
        logits, labels = _synthetic(n=50, k=10, seed=7)
        with torch.random.fork_rng():
            torch.manual_seed(1)
            reference = [nn.Linear(10, 2)] + [nn.Linear(2, 2) for _ in range(3)]
            reference.append(nn.Linear(2, 1))
        state = torch.random.get_rng_state()
        cal = SCTLParameterizedTemperatureScaling(build_objective("nll"))
        cal._reset(logits, labels)
        linears = [m for m in cal._sctl_net if isinstance(m, nn.Linear)]
        assert len(linears) == 5
        for ours, theirs in zip(linears, reference, strict=True):
            assert ours.weight.dtype == torch.float64
            assert torch.equal(ours.weight, theirs.weight.double())
            assert torch.equal(ours.bias, theirs.bias.double())
        assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched

    def test_forward_on_hand_logits(self):
        # n_layers=0, weight (1, 0, 0), bias 0: T_n = the largest RAW logit (no shift, no
        # log, no abs).
        # z = (2, 1, 0): T = 2, z / T = (1, 0.5, 0): e / (e + e^0.5 + 1) = 2.718282 / 5.367003
        #   -> (0.506480, 0.307196, 0.186324)
        # z = (4, 0, 0): T = 4, z / T = (1, 0, 0) -> (e, 1, 1) / (e + 2) = (0.576117, 0.211942, x2)
        # z = (-1, -2, -3): T = -1, z / T = (1, 2, 3): the order flips ->
        #   (e, e^2, e^3) / (e + e^2 + e^3) = (0.090031, 0.244728, 0.665241)
        logits = np.array([[2.0, 1.0, 0.0], [4.0, 0.0, 0.0], [-1.0, -2.0, -3.0]])
        cal = fit_calibrator("pts_sctl", logits, np.array([0, 0, 1]), n_layers=0, steps=1)
        linear = cal._sctl_net[0]
        with torch.no_grad():
            linear.weight.copy_(torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
            linear.bias.zero_()
        np.testing.assert_allclose(cal.temperatures(logits), [2.0, 4.0, -1.0])
        expected = [
            [0.506480, 0.307196, 0.186324],
            [0.576117, 0.211942, 0.211942],
            [0.090031, 0.244728, 0.665241],
        ]
        np.testing.assert_allclose(cal.predict_proba(logits), expected, atol=5e-7)
        # raw logits: a per-row shift changes T (here by the shift itself)
        np.testing.assert_allclose(cal.temperatures(logits + 5.0), [7.0, 9.0, 4.0])

    def test_released_defaults(self):
        params = calibrator_parameters("pts_sctl")
        assert params == {
            "top_k": 10,
            "n_layers": 4,
            "n_nodes": 2,
            "steps": 1000,
            "lr": 0.02,
            "weight_decay": 0.0,
            "seed": 1,
        }
        assert SCTLParameterizedTemperatureScaling.default_objective == "nll"
        assert not SCTLParameterizedTemperatureScaling.rank_preserving

    def test_fewer_than_ten_classes_and_step_count(self):
        logits, labels = _synthetic(n=400, k=4, seed=8)
        cal = fit_calibrator("pts_sctl", logits, labels, steps=25)
        assert cal._sctl_net[0].in_features == 4
        assert len(cal.losses_) == 25
        assert np.isfinite(cal.predict_proba(logits)).all()
        assert "ts_temperature_start" not in cal.params_
        assert cal.params_["temperature_min"] <= cal.params_["temperature_max"]

    @pytest.mark.parametrize("loss", ["nll", "ls", "focal", "classwise"])
    def test_the_transposed_softmax_gives_the_plain_softmax_fit(self, loss):
        # pts_sctl takes its softmax over K on (K, N) logits; a fit with the plain (N, K)
        # softmax(z / T[:, None], dim=1) of the released code ends at the same network
        class Plain(SCTLParameterizedTemperatureScaling):
            def _logit_tensor(self, z):
                return torch.from_numpy(z)

            def _log_probs(self, z_t, features):
                return torch.log_softmax(z_t / self._temperature_tensor(features)[:, None], 1)

        logits, labels = _synthetic(n=1500, k=100, seed=11)
        logits = logits + 5.0  # raw logits, as the MLP sees them: not centred at 0
        objective = build_objective("nll" if loss == "classwise" else loss)
        fitted = []
        for cls in (SCTLParameterizedTemperatureScaling, Plain):
            cal = cls(objective, steps=60)
            if loss == "classwise":
                cal = ClasswiseLossScaling(cal)
            fitted.append(cal.fit(logits, labels))
        ours, plain = fitted
        base = ours.base if loss == "classwise" else ours
        plain_base = plain.base if loss == "classwise" else plain
        scale = np.abs(plain_base.losses_).max()
        np.testing.assert_allclose(base.losses_, plain_base.losses_, rtol=0, atol=1e-10 * scale)
        np.testing.assert_allclose(
            ours.predict_proba(logits), plain.predict_proba(logits), rtol=0, atol=1e-10
        )
        temperatures = plain_base.temperatures(logits)
        np.testing.assert_allclose(
            base.temperatures(logits), temperatures, rtol=1e-10, atol=0
        )
        # and the prediction is softmax(z / T_n) of those temperatures
        np.testing.assert_allclose(
            ours.predict_proba(logits), softmax(logits / temperatures[:, None]), rtol=0,
            atol=1e-10,
        )
        assert ours.predict_proba(logits).flags.c_contiguous

    def test_non_finite_training_loss_raises(self):
        # logits near the float64 maximum overflow the MLP (inf - inf = NaN)
        rng = np.random.default_rng(0)
        logits = rng.uniform(0.5, 1.0, (20, 10)) * 1.7e308
        with pytest.raises(FloatingPointError, match="NaN or infinite"):
            fit_calibrator("pts_sctl", logits, rng.integers(0, 10, 20), steps=3)
