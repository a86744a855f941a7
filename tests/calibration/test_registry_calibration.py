"""Tests of the raysearch.calibration registry, input validation and the shared API."""

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from raysearch.calibration import (
    _CALIBRATORS,
    available_calibrators,
    calibrator_parameters,
    fit_calibrator,
)
from raysearch.calibration.objectives import build_objective
from raysearch.metrics import ece, nll, softmax

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "cifar_outputs"
SKIP_REASON = f"real CIFAR outputs not found at {DATA} (see shared/data/README.md)"
NAMES = ["cts", "dirichlet", "ets", "pts", "pts_sctl", "ts", "ts_hb_ece", "ts_sbece"]
FAST = {"pts": {"steps": 30}}


def _synthetic(n=1200, k=4, seed=0):
    rng = np.random.default_rng(seed)
    z_true = rng.normal(size=(n, k)) * 2.0
    p = softmax(z_true)
    u = rng.random(n)
    labels = np.minimum((np.cumsum(p, axis=1) < u[:, None]).sum(axis=1), k - 1)
    return 2.5 * z_true, labels


class TestRegistry:
    def test_names(self):
        assert available_calibrators() == NAMES
        assert sorted(_CALIBRATORS) == NAMES
        assert all(_CALIBRATORS[name].name == name for name in NAMES)

    def test_unknown_name(self):
        with pytest.raises(
            ValueError,
            match="Unknown calibrator 'platt'; available: cts, dirichlet, ets, pts, pts_sctl, ts, "
            "ts_hb_ece, ts_sbece",
        ):
            fit_calibrator("platt", np.zeros((2, 2)), np.array([0, 1]))

    def test_unknown_loss(self):
        with pytest.raises(ValueError, match="Unknown calibration loss 'hinge'"):
            fit_calibrator("ts", np.zeros((2, 2)), np.array([0, 1]), loss="hinge")

    def test_unknown_parameter_lists_accepted(self):
        with pytest.raises(ValueError, match="unexpected parameter.*gamma; accepted: t_min, t_max"):
            fit_calibrator("ts", np.zeros((2, 2)), np.array([0, 1]), gamma=2.0)

    def test_parameters_routed(self):
        logits, labels = _synthetic()
        cal = fit_calibrator("ets", logits, labels, loss="focal", gamma=1.0, t_max=10.0)
        assert cal.objective.gamma == 1.0
        assert cal.t_max == 10.0
        assert calibrator_parameters("pts")["steps"] == 300

    def test_classwise_must_be_bool(self):
        with pytest.raises(TypeError, match="classwise_scaling"):
            fit_calibrator("ts", np.zeros((2, 2)), np.array([0, 1]), classwise_scaling="yes")

    @pytest.mark.parametrize("name", NAMES)
    def test_defaults_build_fit_and_predict(self, name):
        logits, labels = _synthetic(seed=1)
        cal = fit_calibrator(name, logits, labels, **FAST.get(name, {}))
        probs = cal.predict_proba(logits)
        assert probs.dtype == np.float64
        assert probs.shape == logits.shape
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-12)
        assert isinstance(cal.params_, dict)
        assert cal.params_
        assert ece(probs, labels) < ece(softmax(logits), labels)

    @pytest.mark.parametrize("name", NAMES)
    def test_rank_preserving_calibrators_keep_predictions(self, name):
        logits, labels = _synthetic(seed=2)
        cal = fit_calibrator(name, logits, labels, **FAST.get(name, {}))
        if cal.rank_preserving:
            np.testing.assert_array_equal(cal.predict_proba(logits).argmax(1), logits.argmax(1))
        else:  # per-class temperatures; an unconstrained per-sample temperature; a matrix
            assert name in ("cts", "pts_sctl", "dirichlet")

    @pytest.mark.parametrize(
        ("name", "objective"),
        [
            ("ts", "nll"),
            ("cts", "nll"),
            ("ets", "mse"),
            ("pts", "mse"),
            ("pts_sctl", "nll"),
            ("ts_sbece", "sbece"),
            ("ts_hb_ece", "hbece"),
            ("dirichlet", "nll"),
        ],
    )
    def test_default_objective_is_the_authors(self, name, objective):
        # ets: Mix-n-Match's ets_calibrate fits both stages with MSE; pts: Tomani et al.'s
        # Keras model is compiled with MeanSquaredError; pts_sctl: Jung et al.'s code uses CE
        logits, labels = _synthetic(seed=9)
        cal = fit_calibrator(name, logits, labels, **FAST.get(name, {}))
        assert cal.objective.name == objective
        explicit = fit_calibrator(name, logits, labels, loss=objective, **FAST.get(name, {}))
        np.testing.assert_array_equal(cal.predict_proba(logits), explicit.predict_proba(logits))

    @pytest.mark.parametrize("name", ["ts", "ts_sbece", "ts_hb_ece"])
    def test_temperature_attribute(self, name):
        logits, labels = _synthetic(seed=3)
        cal = fit_calibrator(name, logits, labels)
        assert isinstance(cal.temperature, float)
        assert cal.params_["temperature"] == cal.temperature

    def test_torch_tensors_accepted(self):
        logits, labels = _synthetic(seed=4)
        a = fit_calibrator("ts", torch.from_numpy(logits).float(), torch.from_numpy(labels))
        b = fit_calibrator("ts", logits.astype(np.float32), labels)
        assert a.temperature == pytest.approx(b.temperature, rel=1e-12)

    def test_probs_inputs_match_log_probs(self):
        logits, labels = _synthetic(seed=5)
        probs = softmax(logits)
        a = fit_calibrator("ets", probs, labels, inputs="probs")
        b = fit_calibrator("ets", np.log(np.clip(probs, 1e-12, None)), labels)
        np.testing.assert_allclose(
            a.predict_proba(probs), b.predict_proba(np.log(probs)), atol=1e-8
        )

    def test_no_infrastructure_imports(self):
        code = (
            "import sys, raysearch.calibration\n"
            "bad = [m for m in ('ray', 'mlflow', 'optuna', 'matplotlib', 'raysearch.cli.commands') "
            "if m in sys.modules]\nprint(','.join(bad))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert out == ""


BAD_INPUTS = [
    (np.array([[0.1, np.nan], [0.2, 0.3]]), np.array([0, 1]), {}, "must be finite; row 0"),
    (np.array([[0.1, 0.2], [np.inf, 0.3]]), np.array([0, 1]), {}, "must be finite; row 1"),
    (np.zeros(4), np.array([0, 1, 0, 1]), {}, r"must be 2-D \(N, K\), got shape \(4,\)"),
    (np.zeros((2, 2, 2)), np.array([0, 1]), {}, r"must be 2-D \(N, K\), got shape \(2, 2, 2\)"),
    (np.zeros((3, 2)), np.array([0, 1]), {}, r"must have shape \(3,\).*got \(2,\)"),
    (np.zeros((2, 3)), np.array([0, 3]), {}, r"must lie in \[0, 3\).*\[0, 3\]"),
    (np.zeros((2, 3)), np.array([-1, 0]), {}, r"must lie in \[0, 3\)"),
    (np.zeros((2, 3)), np.array([0.0, 1.0]), {}, "integer class indices"),
    (np.zeros((2, 1)), np.array([0, 0]), {}, "K >= 2 classes"),
    (np.zeros((0, 3)), np.zeros(0, dtype=int), {}, "at least one sample"),
    (np.array([[1.2, -0.2], [0.5, 0.5]]), np.array([0, 1]), {"inputs": "probs"}, r"\[0, 1\]"),
    (np.array([[0.6, 0.6], [0.5, 0.5]]), np.array([0, 1]), {"inputs": "probs"}, "sum to 1"),
]


class TestInputValidation:
    @pytest.mark.parametrize(("logits", "labels", "kwargs", "match"), BAD_INPUTS)
    @pytest.mark.parametrize("name", NAMES)
    def test_bad_inputs(self, name, logits, labels, kwargs, match):
        with pytest.raises(ValueError, match=match):
            fit_calibrator(name, logits, labels, **kwargs)

    def test_bad_inputs_string(self):
        with pytest.raises(ValueError, match="`inputs` must be one of 'logits', 'probs'"):
            fit_calibrator("ts", np.zeros((2, 2)), np.array([0, 1]), inputs="scores")

    @pytest.mark.parametrize("classwise", [False, True])
    def test_missing_class(self, classwise):
        logits = np.random.default_rng(0).normal(size=(4, 3))
        name = "ts" if classwise else "cts"
        with pytest.raises(ValueError, match="needs every class.*missing classes: 1"):
            fit_calibrator(name, logits, np.array([0, 2, 0, 2]), classwise_scaling=classwise)

    @pytest.mark.parametrize("name", NAMES)
    def test_unfitted_raises_runtime_error(self, name):
        cal = _CALIBRATORS[name](build_objective(_CALIBRATORS[name].default_objective))
        with pytest.raises(RuntimeError, match="not fitted yet"):
            cal.predict_proba(np.zeros((2, 3)))
        with pytest.raises(RuntimeError, match="not fitted yet"):
            _ = cal.params_

    def test_wrong_k_at_predict(self):
        logits, labels = _synthetic(seed=6)
        cal = fit_calibrator("ts", logits, labels)
        with pytest.raises(ValueError, match=r"K=4 columns.*got shape \(2, 3\)"):
            cal.predict_proba(np.zeros((2, 3)))

    def test_predict_validates_probs(self):
        logits, labels = _synthetic(seed=7)
        cal = fit_calibrator("ts", softmax(logits), labels, inputs="probs")
        with pytest.raises(ValueError, match="sum to 1"):
            cal.predict_proba(np.full((2, 4), 0.5))

    def test_inputs_not_modified(self):
        logits, labels = _synthetic(seed=8)
        copy = logits.copy()
        fit_calibrator("cts", logits, labels).predict_proba(logits)
        np.testing.assert_array_equal(logits, copy)


class TestRealData:
    """netcal WRN-16-4 CIFAR-10 probabilities, stratified 5k/5k split (seed 0)."""

    @pytest.fixture(scope="class")
    def split(self):
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
        logits = np.log(np.clip(probs, 1e-12, None))
        return logits[cal_idx], labels[cal_idx], logits[test_idx], labels[test_idx]

    @pytest.mark.parametrize("classwise", [False, True])
    @pytest.mark.parametrize("name", NAMES)
    def test_every_calibrator_improves(self, split, name, classwise):
        cal_z, cal_y, test_z, test_y = split
        if classwise and name in ("dirichlet", "ts_hb_ece"):
            # their class-wise rounds refit the whole calibrator (about 20 s each on two cores
            # with 5k samples): fit on every 2nd calibration sample, still measured on all test
            cal_z, cal_y = cal_z[::2], cal_y[::2]
        before_p = softmax(test_z)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no bound hit, no unsettled weights on real data
            if classwise and name == "ts_hb_ece":  # a piecewise-constant ECE need not settle
                warnings.filterwarnings("ignore", message=".*did not settle.*")
            cal = fit_calibrator(name, cal_z, cal_y, classwise_scaling=classwise)
        probs = cal.predict_proba(test_z)
        assert nll(probs, test_y) < nll(before_p, test_y) - 0.05  # 0.370 before
        assert ece(probs, test_y) < 0.5 * ece(before_p, test_y)  # 0.054 before
        if cal.rank_preserving:
            np.testing.assert_array_equal(probs.argmax(1), test_z.argmax(1))
