"""The registry of metrics: a built-in metric is one decorated function, logged wherever the
others are; a user's metric is computed wherever a built-in one is, after each post-hoc
calibrator included; every metric has a direction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from raysearch.calibration import fit_calibrator
from raysearch.calibration.posthoc import Outputs, calibrate_outputs
from raysearch.cli.commands import main
from raysearch.config import RunConfig
from raysearch.metrics import (
    BUILTIN_METRICS,
    CALIBRATED_KEYS,
    DENSE_KEYS,
    ESTIMATOR_KEYS,
    METRIC_REGISTRY,
    SUMMARY_KEYS,
    TABLE_KEYS,
    CalibrationMeter,
    group_keys,
    metric,
    metric_direction,
    softmax,
    table_summary,
)
from raysearch.metrics.catalog import Scores, builtin_metric, metric_spec, user_metric_values
from raysearch.training.data import load_dataset
from raysearch.training.registries import metric_functions
from raysearch.training.run import fit
from raysearch.training.tasks import ClassificationTask
from raysearch.tune.settings import SweepSettings

#: Every built-in metric and its direction: only the accuracies are maximised.
DIRECTIONS = {
    "accuracy": "max", "miou": "max", "ece": "min", "ece_100": "min", "aece": "min",
    "cece": "min", "mce": "min", "nll": "min", "brier": "min", "ece_released": "min",
    "overconfidence": "min", "underconfidence": "min", "average_confidence": "min",
    "ece_l2em": "min", "debiased_ce": "min", "marginal_ece": "min", "ks": "min",
    "sweep_ce": "min",
}
# 4 samples, K = 2: conf (0.9, 0.6, 0.7, 0.8), predictions (0, 0, 1, 1), hits (1, 0, 1, 0)
PROBS = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]])
LABELS = np.array([0, 1, 1, 0])
# mean (c - a)^2 = (0.01 + 0.36 + 0.09 + 0.64) / 4
BRIER_TOP1 = 1.10 / 4


def test_every_built_in_is_registered_with_its_direction():
    assert {name: spec.direction for name, spec in BUILTIN_METRICS.items()} == DIRECTIONS
    entries = METRIC_REGISTRY.entries()
    assert {name for name, entry in entries.items() if entry.source == "built-in"} == set(
        DIRECTIONS)
    assert METRIC_REGISTRY.get("ece_100") is BUILTIN_METRICS["ece_100"]
    assert all(spec.reads == "probs" for spec in BUILTIN_METRICS.values())
    assert dict(BUILTIN_METRICS["ece_100"].options) == {
        "bins": 100, "binning": "equal_width", "norm": "l1"}
    assert BUILTIN_METRICS["ece"].options_text() == "bins=M, binning=equal_width, norm=l1"
    assert "ALS Tables 2, 3, 5, 6" in BUILTIN_METRICS["ece_100"].column


def test_the_logged_names_are_read_from_the_registry_in_their_order():
    # the MLflow names and the order of a trials table's columns
    assert SUMMARY_KEYS == ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier")
    assert DENSE_KEYS == ("accuracy", "miou", "ece", "aece", "cece", "mce", "nll", "brier",
                          "ece_released")
    assert TABLE_KEYS == ("accuracy", "ece", "ece_100", "aece", "cece", "mce", "nll",
                          "overconfidence", "underconfidence", "average_confidence", "ece_l2em",
                          "marginal_ece", "ks", "sweep_ce")
    assert CALIBRATED_KEYS == (*SUMMARY_KEYS, "ece_100", "overconfidence", "underconfidence",
                               "average_confidence", "ece_l2em", "marginal_ece", "ks",
                               "sweep_ce")
    assert ESTIMATOR_KEYS == ("ece_l2em", "debiased_ce", "sweep_ce", "marginal_ece", "ks")
    assert group_keys("kernels") == (*CALIBRATED_KEYS, "debiased_ce")
    # the streamed ones are what the meter's sums give
    counts = {"n", "n_aece", "n_released"}
    assert set(DENSE_KEYS) == set(CalibrationMeter.KEYS) - counts
    with pytest.raises(ValueError, match="unknown metric group 'tables'"):
        group_keys("tables")


def test_raysearch_list_metrics_shows_the_built_ins_and_their_direction():
    result = CliRunner().invoke(main, ["list", "metrics"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split()[1:4] for line in result.output.splitlines()[:-1]}
    for name, direction in DIRECTIONS.items():
        assert lines[name][:2] == ["built-in", direction], name
    assert f"{len(METRIC_REGISTRY.entries())} metrics;" in result.output


def test_registrations_are_checked():
    with pytest.raises(ValueError, match="metric 'ece' is registered twice"):
        builtin_metric("ece", "min")(lambda s: 0.0)
    with pytest.raises(ValueError, match="`direction` must be 'min' or 'max', got 'down'"):
        builtin_metric("ece_9", "down")(lambda s: 0.0)
    with pytest.raises(ValueError, match="`reads` must be 'probs' or 'logits'"):
        metric(direction="max", reads="scores")(lambda p, y: 0.0)
    assert "ece_9" not in BUILTIN_METRICS


@pytest.fixture
def brier_top1():
    """The example of docs/extending.md, registered for one test and removed after it."""

    @builtin_metric("brier_top1", "min", table=True, column="none (top-label Brier score)")
    def brier_top1(s: Scores) -> float:
        """Mean squared gap between the top-1 confidence and its hit; in [0, 1]."""
        return float(np.mean((s.conf - s.hits) ** 2))

    try:
        yield brier_top1
    finally:
        del BUILTIN_METRICS["brier_top1"]


def test_a_metric_added_by_one_decorated_function_is_computed_everywhere(brier_top1):
    assert BUILTIN_METRICS["brier_top1"].description.startswith("Mean squared gap")
    assert group_keys("table")[-1] == "brier_top1"
    assert group_keys("calibrated")[-1] == "brier_top1"
    assert table_summary(PROBS, LABELS, keys=("brier_top1",)) == {
        "brier_top1": pytest.approx(BRIER_TOP1, abs=1e-15)}
    meter = CalibrationMeter(2, keep_samples=True)
    meter.update(PROBS[:2], LABELS[:2])
    meter.update(PROBS[2:], LABELS[2:])
    assert meter.table("brier_top1")["brier_top1"] == pytest.approx(BRIER_TOP1, abs=1e-15)
    # raysearch calibrate: a column of every row, before and after the calibrators
    outputs = Outputs(np.log(PROBS), LABELS, split=np.array(["val", "val", "test", "test"]))
    report = calibrate_outputs(outputs, methods=("ts",))
    assert "brier_top1" in report.to_frame().columns
    assert report.row("uncalibrated").metrics["brier_top1"] == pytest.approx(
        float(np.mean((PROBS[2:].max(axis=1) - np.array([1, 0])) ** 2)), abs=1e-15)
    assert "test_brier_top1_ts" in report.as_metrics("test")
    # the sweep accepts it as an objective
    settings = SweepSettings(posthoc=("ts",), objective="val_brier_top1_ts")
    assert settings.objective_metrics() == ("val_brier_top1_ts", "min")


# -- a user's metric ---------------------------------------------------------------------------


@metric(direction="max")
def top2(probs: np.ndarray, labels: np.ndarray) -> float:
    """Top-2 accuracy: the label is one of the two most probable classes."""
    best = np.argsort(-probs, axis=1, kind="stable")[:, :2]
    return float(np.mean((best == labels[:, None]).any(axis=1)))


@metric(direction="min", reads="logits")
def top_logit(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean largest logit (reads the logits, not the probabilities)."""
    return float(np.mean(logits.max(axis=1)))


def test_the_metric_decorator_declares_a_direction():
    assert metric_spec(top2).direction == "max"
    assert metric_spec(top_logit).reads == "logits"
    assert top2(PROBS, LABELS) == 1.0  # K = 2: every label is in the top 2
    functions = {"top2": top2, "top_logit": top_logit}
    assert metric_direction("val_top2", functions=functions) == "max"
    assert metric_direction("val_top2_ts", calibrators=("ts",), functions=functions) == "max"
    assert metric_direction("top_logit", functions=functions) == "min"
    assert metric_direction("test_accuracy_ts", calibrators=("ts",)) == "max"
    assert metric_direction("val_miou") == "max"
    assert metric_direction("val_ece_100") == "min"
    # an undeclared name: maximised when it ends in accuracy or miou
    assert metric_direction("val_balanced_accuracy") == "max"
    assert metric_direction("val_sharpness") == "min"


def test_user_metric_values_pass_probabilities_or_logits():
    logits = np.log(PROBS)
    values = user_metric_values({"top2": top2, "top_logit": top_logit}, PROBS, LABELS,
                                logits=logits + 3.0)
    assert values == {"top2": 1.0, "top_logit": pytest.approx(np.mean(logits.max(1)) + 3.0)}
    # after a calibrator there are only probabilities: the logits are their logs
    assert user_metric_values({"top_logit": top_logit}, PROBS, LABELS) == {
        "top_logit": pytest.approx(np.mean(np.log(PROBS.max(axis=1))))}

    def broken(probs, labels):
        return 1 / 0

    with pytest.raises(ValueError, match=r"metric 'broken' raised ZeroDivisionError on the val "
                                         r"split: division by zero"):
        user_metric_values({"broken": broken}, PROBS, LABELS, where="the val split")


def test_a_user_metric_under_a_built_in_name_is_refused():
    with pytest.raises(ValueError, match="metric 'ece' is built in: every trial logs val_ece"):
        metric_functions(["ece"])

    def overconfidence(probs, labels):
        return 0.0

    with pytest.raises(ValueError, match="would be logged as val_overconfidence, the name of a "
                                         "built-in metric; rename the function"):
        metric_functions([overconfidence])
    assert metric_functions([top2]) == {"top2": top2}


def test_calibrate_outputs_measures_a_user_metric_after_each_calibrator():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 60)
    logits = rng.normal(size=(60, 3)) * 2 + 2 * np.eye(3)[labels]  # right about 3 times in 4
    split = np.array(["val"] * 30 + ["test"] * 30)
    report = calibrate_outputs(Outputs(logits, labels, split=split), methods=("ts", "ets"),
                               metrics={"top2": top2, "top_logit": top_logit})
    test = split == "test"
    assert report.row("uncalibrated").metrics["top2"] == top2(softmax(logits[test]),
                                                               labels[test])
    assert report.row("uncalibrated").metrics["top_logit"] == top_logit(logits[test],
                                                                         labels[test])
    ts = fit_calibrator("ts", logits[~test], labels[~test])
    assert report.row("ts").metrics["top2"] == top2(ts.predict_proba(logits[test]),
                                                    labels[test])
    metrics = report.as_metrics("test")
    assert {"test_top2", "test_top2_ts", "test_top2_ets", "test_top_logit_ts"} <= set(metrics)
    frame = report.to_frame()
    assert list(frame.columns[2:2 + len(CALIBRATED_KEYS)]) == list(CALIBRATED_KEYS)
    assert {"top2", "top_logit"} <= set(frame.columns)

    def broken(probs, labels):
        raise RuntimeError("no")

    # a user's metric that raises fails loudly (it is not mistaken for a calibrator failure)
    with pytest.raises(ValueError, match="metric 'broken' raised RuntimeError on the "
                                         "evaluation part after calibrator 'ts': no"):
        calibrate_outputs(Outputs(logits, labels, split=split), methods=("ts",),
                          uncalibrated=False, metrics={"broken": broken})


def test_the_sweep_knows_a_user_metric_after_each_calibrator():
    settings = SweepSettings(posthoc=("ts",), metrics=["mypkg.metrics:top2"],
                             objective="val_top2_ts")
    known = settings.known_metrics()
    assert {"top2", "top2_ts", "ece_100_ts", "miou", "debiased_ce"} <= known
    assert settings.objective_metrics()[0] == "val_top2_ts"


def test_fit_logs_a_decorated_metric_and_a_users_metric_everywhere(brier_top1, tmp_path):
    torch.set_num_threads(1)
    data = load_dataset("digits", seed=0)
    cfg = RunConfig(loss={"name": "ce"}, model={"name": "cnn"}, epochs=1, seed=0)
    fns = {"top2": top2, "top_logit": top_logit}
    result = fit(cfg, data=data, metrics=fns)
    metrics = result.metrics
    for split, logits, labels in (("val", result.val_logits, result.val_labels),
                                  ("test", result.test_logits, result.test_labels)):
        probs = softmax(logits)
        assert metrics[f"{split}_brier_top1"] == table_summary(
            probs, labels, keys=("brier_top1",))["brier_top1"]
        assert metrics[f"{split}_top2"] == top2(probs, labels)
        assert metrics[f"{split}_top_logit"] == pytest.approx(
            top_logit(logits.astype(np.float64), labels), rel=1e-12)
    final = ClassificationTask().write_artifacts(result, cfg, tmp_path, test=None,
                                                 posthoc=("ts",), metric_fns=fns)
    ts = fit_calibrator("ts", result.val_logits, result.val_labels)
    calibrated = ts.predict_proba(result.test_logits)
    assert final["test_top2_ts"] == top2(calibrated, result.test_labels)
    assert final["test_brier_top1_ts"] == pytest.approx(
        table_summary(calibrated, result.test_labels, keys=("brier_top1",))["brier_top1"],
        rel=1e-12)
    assert {"val_top2_ts", "val_top_logit_ts", "val_brier_top1_ts"} <= set(final)
    assert math.isfinite(final["val_top2_ts"])
