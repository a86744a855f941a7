"""Calibrators on a perfectly classified calibration set: bounded, marked ``degenerate``, warned.

On a separable set (every sample's own class has the largest logit) NLL, Brier, focal and the
ECEs fall towards 0 as T -> 0: temperature scaling has no finite optimum. The fit must stop
at ``t_min`` (a finite temperature), set ``degenerate`` and warn; on ordinary data nothing
changes (same temperature as before, ``degenerate`` False).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from raysearch.calibration import build_objective, fit_calibrator
from raysearch.calibration.base import is_separable
from raysearch.calibration.temperature_fit import (
    ScalarTemperatureProblem,
    fit_log_temperature,
)

PERFECT = "the calibration set is perfectly classified"


def _separable(n: int = 240, k: int = 4, margin: float = 8.0, seed: int = 0):
    """Hand-made logits whose argmax is the label in every row (margins of about `margin`)."""
    rng = np.random.default_rng(seed)
    labels = np.tile(np.arange(k), n // k)
    logits = rng.normal(size=(n, k))
    logits[np.arange(n), labels] += margin
    assert (logits.argmax(axis=1) == labels).all()
    return logits, labels


def _noisy(n: int = 400, k: int = 4, seed: int = 1):
    """Overconfident logits with about a quarter of the argmaxes wrong."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(k), n // k)
    logits = rng.normal(size=(n, k)) * 3.0
    right = rng.random(n) < 0.75
    logits[right, labels[right]] += 6.0
    assert 0.5 < (logits.argmax(axis=1) == labels).mean() < 1.0
    return logits, labels


def _fit(name: str, logits, labels, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibrator = fit_calibrator(name, logits, labels, **kw)
    return calibrator, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_is_separable_needs_every_argmax_right_and_no_ties():
    logits, labels = _separable()
    assert is_separable(logits, labels)
    tied = logits.copy()
    tied[0] = 1.0  # a row of equal logits: its own class is not strictly the largest
    assert not is_separable(tied, labels)
    wrong = logits.copy()
    wrong[3, labels[3]] = -100.0
    assert not is_separable(wrong, labels)


@pytest.mark.parametrize("name", ["ts", "ets", "ts_sbece", "ts_hb_ece"])
def test_a_separable_split_stops_the_temperature_at_its_lower_bound(name):
    logits, labels = _separable()
    calibrator, messages = _fit(name, logits, labels)
    assert calibrator.degenerate is True
    assert math.isfinite(calibrator.temperature)
    assert calibrator.temperature == pytest.approx(0.05, rel=1e-9)  # t_min, the bound
    assert calibrator.params_["at_bound"] == "lower"
    assert any(m.startswith(f"{name}: {PERFECT}") and "t_min=0.05" in m for m in messages), \
        messages
    probs = calibrator.predict_proba(logits)
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)


def test_plain_newton_stops_where_nll_is_flat_not_at_the_bound():
    # what the calibrator corrects: the search alone ends inside the range, where the NLL's
    # derivative underflows (|dL/dlog T| <= 1e-10), although the NLL still falls below it
    logits, labels = _separable()
    problem = ScalarTemperatureProblem(logits, labels, build_objective("nll"), None)
    info = fit_log_temperature(problem, (math.log(0.05), math.log(20.0)), 0.0)
    assert info["at_bound"] == ""
    assert math.exp(info["log_t"]) > 0.06
    assert problem.value(math.log(0.05)) <= problem.value(info["log_t"])


def test_a_wider_range_moves_the_bound_with_it():
    logits, labels = _separable()
    calibrator, _ = _fit("ts", logits, labels, t_min=0.01)
    assert calibrator.degenerate
    assert calibrator.temperature == pytest.approx(0.01, rel=1e-9)


@pytest.mark.parametrize("name", ["cts", "pts"])
def test_per_class_and_parameterized_scaling_are_marked_too(name):
    logits, labels = _separable()
    calibrator, messages = _fit(name, logits, labels, **({"steps": 20} if name == "pts" else {}))
    assert calibrator.degenerate is True
    assert any(PERFECT in m for m in messages), messages
    if name == "cts":
        np.testing.assert_allclose(calibrator.temperatures, 0.05, rtol=1e-9)
    else:
        temperatures = calibrator.temperatures(logits)
        assert np.isfinite(temperatures).all()
        assert (temperatures >= 1e-3 - 1e-12).all()


def test_the_released_pts_baseline_is_marked():
    logits, labels = _separable(n=80)
    calibrator, messages = _fit("pts_sctl", logits, labels, steps=20)
    assert calibrator.degenerate is True
    assert any(m.startswith(f"pts_sctl: {PERFECT}") for m in messages), messages


@pytest.mark.parametrize("name", ["ts", "cts"])
def test_class_wise_scaling_passes_the_flag_on(name):
    logits, labels = _separable()
    calibrator, _ = _fit(name, logits, labels, classwise_scaling=True)
    assert calibrator.degenerate is True
    assert calibrator.base.degenerate is True
    if name == "ts":
        assert calibrator.temperature == pytest.approx(0.05, rel=1e-9)


def test_label_smoothing_keeps_its_finite_optimum_on_a_separable_split():
    logits, labels = _separable()
    calibrator, messages = _fit("ts", logits, labels, loss="ls")
    assert calibrator.degenerate is False
    assert calibrator.temperature > 0.5
    assert not any(PERFECT in m for m in messages)


@pytest.mark.parametrize("name", ["ts", "ets", "cts", "ts_sbece", "ts_hb_ece"])
def test_ordinary_data_is_not_degenerate_and_keeps_its_temperature(name):
    logits, labels = _noisy()
    calibrator, messages = _fit(name, logits, labels)
    assert calibrator.degenerate is False
    assert not any(PERFECT in m for m in messages)
    # the fit is the search's own, untouched: the same as the bare search gives
    if name in ("ts", "ts_sbece"):
        objective = build_objective("nll" if name == "ts" else "sbece")
        problem = ScalarTemperatureProblem(logits, labels, objective, None)
        info = fit_log_temperature(problem, (math.log(0.05), math.log(20.0)), 0.0)
        assert calibrator.temperature == math.exp(info["log_t"])


def test_a_refit_on_ordinary_data_clears_the_flag():
    calibrator, _ = _fit("ts", *_separable())
    assert calibrator.degenerate
    calibrator.fit(*_noisy())
    assert calibrator.degenerate is False
    assert 0.5 < calibrator.temperature < 20.0


def test_dirichlet_has_no_temperature_and_is_never_degenerate():
    logits, labels = _separable(n=120, k=3)
    calibrator, _ = _fit("dirichlet", logits, labels)
    assert calibrator.degenerate is False


def test_the_posthoc_report_names_the_degenerate_calibrators():
    from raysearch.calibration.posthoc import Outputs, calibrate_outputs

    logits, labels = _separable(n=200)
    split = np.array(["val"] * 100 + ["test"] * 100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        report = calibrate_outputs(Outputs(logits, labels, split=split),
                                   methods=("ts", "dirichlet"), classwise_scaling="both")
    assert report.degenerate == ("ts", "ts+cw")
    assert report.row("ts").degenerate
    assert not report.row("dirichlet").degenerate
    assert report.row("ts").params["temperature"] == pytest.approx(0.05, rel=1e-9)
    ordinary = calibrate_outputs(Outputs(*_noisy(), split=np.array(["val", "test"] * 200)),
                                 methods="ts")
    assert ordinary.degenerate == ()


def test_a_trials_last_report_names_them_and_repeats_no_warning(tmp_path):
    # what the sweep's trial writes (ClassificationTask.write_artifacts): the calibrators that
    # could not be fitted, under the result key the tracking turns into the run's tag
    import torch

    from raysearch.config import RunConfig
    from raysearch.training.loop import TrainResult
    from raysearch.training.records import DEGENERATE_CALIBRATORS
    from raysearch.training.tasks import task_for

    logits, labels = _separable(n=200)
    result = TrainResult(metrics={}, epochs_completed=1, model=torch.nn.Identity(),
                         val_logits=logits[:100].astype(np.float32), val_labels=labels[:100],
                         test_logits=logits[100:].astype(np.float32), test_labels=labels[100:])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        final = task_for("classification").write_artifacts(
            result, RunConfig(), tmp_path, None, posthoc=("ts", "cts"))
    assert final[DEGENERATE_CALIBRATORS] == "ts,cts"
    assert final["test_ece_ts"] >= 0.0
    assert not [w for w in caught if PERFECT in str(w.message)]
    noisy, noisy_labels = _noisy()
    result = TrainResult(metrics={}, epochs_completed=1, model=torch.nn.Identity(),
                         val_logits=noisy[:200].astype(np.float32), val_labels=noisy_labels[:200],
                         test_logits=noisy[200:].astype(np.float32),
                         test_labels=noisy_labels[200:])
    final = task_for("classification").write_artifacts(result, RunConfig(), tmp_path, None,
                                                       posthoc=("ts",))
    assert DEGENERATE_CALIBRATORS not in final
