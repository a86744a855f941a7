"""Dirichlet calibration with ODIR (Kull et al., NeurIPS 2019): ``dirichlet``."""

import numpy as np
import pytest

from raysearch.calibration import DirichletCalibration, fit_calibrator
from raysearch.calibration.dirichlet import odir_penalty
from raysearch.calibration.objectives import build_objective
from raysearch.metrics import nll, softmax


def _log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


W_TRUE = np.array([[1.6, 0.5, -0.3], [0.2, 0.7, 0.4], [-0.4, 0.3, 1.3]])
B_TRUE = np.array([0.4, -0.3, 0.1])


def _dirichlet_data(n, seed):
    """Logits z and labels drawn from q = softmax(W ln softmax(z) + b), a known Dirichlet map."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 3)) * 2.0
    q = np.exp(_log_softmax(_log_softmax(z) @ W_TRUE.T + B_TRUE))
    labels = (rng.random(n)[:, None] > np.cumsum(q, axis=1)).sum(axis=1)
    return z, np.minimum(labels, 2), q


def test_identity_start_returns_the_uncalibrated_probabilities():
    # W = I, b = 0: softmax(I ln p + 0) = p (to float rounding of log_softmax twice)
    z, labels, _ = _dirichlet_data(50, seed=0)
    cal = fit_calibrator("dirichlet", z, labels, max_iter=0)
    np.testing.assert_array_equal(cal.weights, np.eye(3))
    np.testing.assert_array_equal(cal.intercept, np.zeros(3))
    np.testing.assert_allclose(cal.predict_proba(z), softmax(z), rtol=1e-13, atol=1e-16)
    # the objective at the start is the NLL of the uncalibrated probabilities (ODIR = 0)
    assert cal.fit_info_["objective"] == pytest.approx(nll(softmax(z), labels), rel=1e-12)


def test_odir_by_hand_2x2():
    # K = 2: off-diagonal 2^2 + 3^2 = 13, / (K (K - 1) = 2) = 6.5, * lambda 0.5 = 3.25;
    # intercepts 1 + 1 = 2, / K = 1, * mu 0.2 = 0.2; total 3.45
    w, b = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([1.0, -1.0])
    value, grad_w, grad_b = odir_penalty(w, b, 0.5, 0.2)
    assert value == pytest.approx(3.45, rel=1e-15)
    # dR/dw_ij = 2 lambda / (K (K - 1)) w_ij off the diagonal: 2 * 0.5 / 2 * (2, 3) = (1, 1.5)
    np.testing.assert_allclose(grad_w, [[0.0, 1.0], [1.5, 0.0]], rtol=1e-15)
    np.testing.assert_allclose(grad_b, [0.2, -0.2], rtol=1e-15)  # 2 mu / K b


def test_odir_by_hand_3x3():
    # off-diagonal 1 + 4 + 9 + 16 + 25 + 36 = 91 (diagonal 7, 8, 9 ignored), / 6 * 0.3 = 4.55;
    # intercepts 0.25 + 0 + 2.25 = 2.5, / 3 * 0.6 = 0.5; total 5.05
    w = np.array([[7.0, 1.0, 2.0], [3.0, 8.0, 4.0], [5.0, 6.0, 9.0]])
    value, _, _ = odir_penalty(w, np.array([0.5, 0.0, -1.5]), 0.3, 0.6)
    assert value == pytest.approx(5.05, rel=1e-14)


def test_fit_recovers_a_known_dirichlet_map_better_than_ts():
    z, labels, q = _dirichlet_data(16000, seed=1)
    fit, test = slice(0, 8000), slice(8000, None)
    cal = fit_calibrator("dirichlet", z[fit], labels[fit], reg_lambda=0.0, reg_mu=0.0)
    ts = fit_calibrator("ts", z[fit], labels[fit])
    nll_dir = nll(cal.predict_proba(z[test]), labels[test])
    nll_ts = nll(ts.predict_proba(z[test]), labels[test])
    nll_true = nll(q[test], labels[test])
    assert nll_dir < nll_ts - 0.02  # TS cannot express the off-diagonal terms
    assert nll_dir < nll_true + 0.005  # near the generating map (8000 samples, 12 parameters)
    # the map is identified up to a vector added to every row of [W | b]: compare centred
    w = cal.weights
    np.testing.assert_allclose(w - w.mean(axis=0), W_TRUE - W_TRUE.mean(axis=0), atol=0.12)
    b = cal.intercept
    np.testing.assert_allclose(b - b.mean(), B_TRUE - B_TRUE.mean(), atol=0.12)


def test_regularisation_pulls_towards_diagonal_and_zero_intercept():
    z, labels, _ = _dirichlet_data(2000, seed=2)
    loose = fit_calibrator("dirichlet", z, labels, reg_lambda=0.0, reg_mu=0.0)
    tight = fit_calibrator("dirichlet", z, labels, reg_lambda=1e3, reg_mu=1e3)
    assert tight.params_["off_diagonal_rms"] < 0.05 * loose.params_["off_diagonal_rms"]
    assert tight.params_["intercept_rms"] < 0.05 * loose.params_["intercept_rms"]
    # the fitted representative: every column's off-diagonal entries sum to 0, sum(b) = 0
    w = loose.weights
    np.testing.assert_allclose((w - np.diag(np.diag(w))).sum(axis=0), 0.0, atol=1e-12)
    assert abs(loose.intercept.sum()) < 1e-12


def test_gradient_matches_finite_differences():
    z, labels, _ = _dirichlet_data(200, seed=3)
    cal = DirichletCalibration(build_objective("nll"), reg_lambda=0.7, reg_mu=0.4)
    x = _log_softmax(z)
    mean, std = x.mean(axis=0), x.std(axis=0)
    theta = np.random.default_rng(4).normal(size=12)
    args = ((x - mean) / std, labels, None, mean, std)
    value, grad = cal._value_and_grad(theta, *args)
    h = 1e-6
    def f(t):
        return cal._value_and_grad(t, *args)[0]

    numeric = [(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in np.eye(12)]
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


def test_inputs_probs_match_logits():
    # the features are ln softmax(z): a per-row shift of the logits changes nothing
    z, labels, _ = _dirichlet_data(500, seed=5)
    a = fit_calibrator("dirichlet", z, labels)
    b = fit_calibrator("dirichlet", softmax(z), labels, inputs="probs")
    c = fit_calibrator("dirichlet", z + 3.0, labels)
    np.testing.assert_allclose(a.predict_proba(z), b.predict_proba(softmax(z)), atol=1e-6)
    np.testing.assert_allclose(a.predict_proba(z), c.predict_proba(z + 3.0), atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"reg_lambda": -1.0}, ValueError, "`reg_lambda` must be >= 0, got -1.0"),
        ({"reg_mu": -0.1}, ValueError, "`reg_mu` must be >= 0"),
        ({"reg_lambda": "big"}, TypeError, "`reg_lambda` must be a real number"),
        ({"max_iter": -1}, ValueError, "`max_iter` must be >= 0"),
        ({"max_iter": 2.5}, TypeError, "`max_iter` must be an integer"),
        ({"loss": "hbece"}, ValueError, "'hbece' .*has no gradient"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    z, labels, _ = _dirichlet_data(20, seed=6)
    with pytest.raises(error, match=match):
        fit_calibrator("dirichlet", z, labels, **kwargs)


def test_odir_penalty_bad_shapes():
    with pytest.raises(ValueError, match=r"\(K, K\) matrix"):
        odir_penalty(np.zeros((2, 3)), np.zeros(2), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"`intercept` must have shape \(2,\)"):
        odir_penalty(np.zeros((2, 2)), np.zeros(3), 1.0, 1.0)
