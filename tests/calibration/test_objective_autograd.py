"""Autograd gradients of the calibration objectives against hand-derived values."""

import math

import numpy as np
import pytest

from raysearch.calibration._autograd import value_and_derivatives
from raysearch.calibration.objectives import build_objective
from raysearch.calibration.temperature_fit import temperature_scaled

# One sample, logits z = (1, 2, 3), label y = 0, K = 3.
Z = np.array([[1.0, 2.0, 3.0]])
Y = np.array([0])
_E = [math.exp(1.0), math.exp(2.0), math.exp(3.0)]
P = np.array(_E) / sum(_E)  # softmax(z) = (0.0900306, 0.2447285, 0.6652410)


def test_ls_logit_gradient_is_p_minus_smoothed_target():
    # l = -sum_k q_k log p_k with q = (1 - eps) Y + eps / K, log p_k = z_k - logsumexp(z):
    # dl/dz_j = -q_j + sum_k q_k p_j = p_j - q_j. eps = 0.1: q = (0.9333, 0.0333, 0.0333),
    # so the gradient is (0.0900 - 0.9333, 0.2447 - 0.0333, 0.6652 - 0.0333)
    # = (-0.8433028, 0.2113951, 0.6319076); the value is -0.9333 log 0.0900 - 0.0333 (log
    # 0.2447 + log 0.6652) = 2.3076060.
    q = np.array([0.9 + 0.1 / 3, 0.1 / 3, 0.1 / 3])
    value, grad = build_objective("ls", epsilon=0.1).value_and_grad_logits(Z, Y)
    assert value == pytest.approx(float(-(q * np.log(P)).sum()), rel=1e-12)
    assert value == pytest.approx(2.3076060, abs=1e-6)
    np.testing.assert_allclose(grad[0], P - q, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(grad[0], [-0.8433028, 0.2113951, 0.6319076], atol=1e-6)


def test_nll_log_temperature_derivatives():
    # L(s) = logsumexp(beta z) - beta z_y with beta = exp(-s). With E, Var under
    # p = softmax(beta z): dL/ds = -beta (E[z] - z_y) and
    # d2L/ds2 = beta (E[z] - z_y) + beta^2 Var[z]. At s = 0: E[z] = 2.5752104,
    # Var[z] = 0.4244045, so dL/ds = -1.5752104 and d2L/ds2 = 1.9996149.
    mean = float(P @ Z[0])
    var = float(P @ Z[0] ** 2) - mean**2
    loss = temperature_scaled(Z, Y, build_objective("nll"), None)
    value, first, second = value_and_derivatives(loss, 0.0)
    assert value == pytest.approx(-math.log(P[0]), rel=1e-12)
    assert first == pytest.approx(-(mean - 1.0), rel=1e-12)
    assert second == pytest.approx((mean - 1.0) + var, rel=1e-12)
    assert (first, second) == pytest.approx((-1.5752104, 1.9996149), abs=1e-6)
