"""TS-HB-ECE (Karandikar et al., NeurIPS 2021, App. C) and its ``hbece`` objective."""

import math

import numpy as np
import pytest

from raysearch.calibration import fit_calibrator
from raysearch.calibration.objectives import build_objective
from raysearch.metrics import ece, softmax


def _two_class_toy():
    # 4 samples, logit margin 2 ln 3, 3 of 4 correct (accuracy 0.75). With one bin,
    # ECE(T) = |0.75 - sigmoid(2 ln 3 / T)|, zero where sigmoid(2 ln 3 / T) = 3/4, i.e.
    # 2 ln 3 / T = logit(3/4) = ln 3: T* = 2, and ECE grows on both sides.
    d = 2.0 * math.log(3.0)
    logits = np.array([[d, 0.0], [d, 0.0], [d, 0.0], [0.0, d]])
    return logits, np.array([0, 0, 0, 0])


def test_hand_derived_minimum_within_the_final_grid_spacing():
    logits, labels = _two_class_toy()
    cal = fit_calibrator("ts_hb_ece", logits, labels, n_bins=1)
    # final spacing in log T: ln(20 / 0.05) / 40 * (2 / 40)^2 = 5.9915 / 40 / 400 = 3.74e-4
    assert cal.final_spacing == pytest.approx(math.log(400.0) / 40 / 400, rel=1e-12)
    assert abs(math.log(cal.temperature) - math.log(2.0)) <= cal.final_spacing
    assert cal.params_["ece"] < 1e-3
    coarse = fit_calibrator("ts_hb_ece", logits, labels, n_bins=1, levels=1)
    # one level: spacing 0.15 in log T; the refinement is at least as good, and closer to T*
    assert coarse.fit_info_["spacings"] == pytest.approx([math.log(400.0) / 40])
    assert abs(math.log(coarse.temperature) - math.log(2.0)) <= math.log(400.0) / 40
    assert cal.params_["ece"] <= coarse.params_["ece"]
    assert abs(math.log(cal.temperature / 2.0)) < abs(math.log(coarse.temperature / 2.0))


def test_each_level_divides_the_spacing():
    logits, labels = _two_class_toy()
    cal = fit_calibrator("ts_hb_ece", logits, labels, n_bins=1, grid_points=11, levels=4)
    # 11 points: level spacing h, then 2h / 10 = h / 5 per level
    spacings = cal.fit_info_["spacings"]
    np.testing.assert_allclose(np.array(spacings[:-1]) / np.array(spacings[1:]), 5.0, rtol=1e-9)
    assert spacings[-1] == pytest.approx(cal.final_spacing, rel=1e-9)
    assert cal.params_["fit_evaluations"] == 44  # V = G L


def test_matches_brute_force_fine_grid_with_metrics_ece():
    # the paper's ECE (equal-mass, l2, 15 bins) by raysearch.metrics.ece on 4001 temperatures
    rng = np.random.default_rng(0)
    z = rng.normal(size=(600, 4)) * 3.0
    labels = np.where(rng.random(600) < 0.7, z.argmax(axis=1), rng.integers(0, 4, 600))
    cal = fit_calibrator("ts_hb_ece", z, labels)
    found = ece(cal.predict_proba(z), labels, 15, "equal_mass", "l2")
    assert cal.params_["ece"] == pytest.approx(found, abs=1e-12)  # same binning as the metric
    grid = np.exp(np.linspace(math.log(0.05), math.log(20.0), 4001))
    brute = [ece(softmax(z / t), labels, 15, "equal_mass", "l2") for t in grid]
    best = int(np.argmin(brute))
    assert found <= brute[best] + 1e-3
    assert abs(math.log(cal.temperature / grid[best])) < 0.05
    assert found < ece(softmax(z), labels, 15, "equal_mass", "l2")


def test_defaults_are_the_papers_ece():
    objective = build_objective("hbece")
    assert objective.params == {"n_bins": 15, "binning": "equal_mass", "norm": "l2"}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"loss": "nll"}, ValueError, "ts_hb_ece fits the hard-binned ECE"),
        ({"grid_points": 2}, ValueError, "`grid_points` must be >= 3"),
        ({"levels": 0}, ValueError, "`levels` must be >= 1"),
        ({"levels": 1.5}, TypeError, "`levels` must be an integer"),
        ({"norm": "l3"}, ValueError, "`norm` must be one of"),
        ({"binning": "bin"}, ValueError, "`binning` must be one of"),
        ({"n_bins": 0}, ValueError, "`n_bins` must be >= 1"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    logits, labels = _two_class_toy()
    with pytest.raises(error, match=match):
        fit_calibrator("ts_hb_ece", logits, labels, **kwargs)


def test_gradient_calibrators_reject_hbece():
    logits, labels = _two_class_toy()
    with pytest.raises(ValueError, match="'hbece' .*has no gradient"):
        fit_calibrator("cts", logits, np.array([0, 0, 1, 1]), loss="hbece")
