"""Every column of the papers' result tables is a metric of every classification trial.

:data:`raysearch.metrics.TABLE_KEYS` names them; a trial logs ``{val,test}_<key>`` for its final
model and ``{val,test}_<key>_<calibrator>`` after each post-hoc calibrator.
"""

import math

import numpy as np
import pytest
import torch

from raysearch import metrics
from raysearch.calibration import fit_calibrator
from raysearch.calibration.posthoc import METRIC_COLUMNS
from raysearch.config import RunConfig
from raysearch.metrics import (
    CALIBRATED_KEYS,
    ESTIMATOR_KEYS,
    SUMMARY_KEYS,
    TABLE_KEYS,
    softmax,
    table_summary,
)
from raysearch.training.data import load_dataset
from raysearch.training.run import fit
from raysearch.training.tasks import ClassificationTask
from raysearch.tune.settings import SweepSettings

# Four binary predictions, all of class 0, with confidences 0.61, 0.62, 0.9, 0.95 and hits
# 1, 0, 1, 0 (labels 0, 1, 0, 1).
CONF = np.array([0.61, 0.62, 0.9, 0.95])
PROBS = np.stack([CONF, 1.0 - CONF], axis=1)
LABELS = np.array([0, 1, 0, 1])

# The function and keyword arguments each table key stands for (the docstring of TABLE_KEYS).
DIRECT = {
    "accuracy": lambda p, y, m: metrics.accuracy(p, y),
    "ece": lambda p, y, m: metrics.ece(p, y, m),
    "ece_100": lambda p, y, m: metrics.ece(p, y, 100),
    "aece": lambda p, y, m: metrics.adaptive_ece(p, y, m),
    "cece": lambda p, y, m: metrics.classwise_ece(p, y, m),
    "mce": lambda p, y, m: metrics.mce(p, y, m),
    "nll": lambda p, y, m: metrics.nll(p, y),
    "brier": lambda p, y, m: metrics.brier(p, y),
    "overconfidence": lambda p, y, m: metrics.overconfidence(p, y),
    "underconfidence": lambda p, y, m: metrics.underconfidence(p, y),
    "average_confidence": lambda p, y, m: metrics.average_confidence(p),
    "ece_l2em": lambda p, y, m: metrics.ece(p, y, m, binning="equal_mass", norm="l2"),
    "marginal_ece": lambda p, y, m: metrics.marginal_ece(p, y, m),
    "ks": lambda p, y, m: metrics.ks_error(p, y),
    "sweep_ce": lambda p, y, m: metrics.sweep_ece(p, y),
}


def _direct(probs, labels, n_bins):
    return {key: DIRECT[key](probs, labels, n_bins) for key in CALIBRATED_KEYS}


def test_names_keep_the_old_ones_and_add_the_table_columns():
    assert TABLE_KEYS == (
        "accuracy", "ece", "ece_100", "aece", "cece", "mce", "nll", "overconfidence",
        "underconfidence", "average_confidence", "ece_l2em", "marginal_ece", "ks", "sweep_ce",
    )
    # the old post-hoc columns first, in their order; then the rest of the table metrics
    assert CALIBRATED_KEYS[:7] == SUMMARY_KEYS
    assert set(CALIBRATED_KEYS) == set(SUMMARY_KEYS) | set(TABLE_KEYS)
    assert len(CALIBRATED_KEYS) == len(set(CALIBRATED_KEYS))
    assert METRIC_COLUMNS is CALIBRATED_KEYS
    assert {"ks", "ece_l2em", "sweep_ce", "marginal_ece"} <= set(ESTIMATOR_KEYS)


def test_ece_100_by_hand():
    # 100 bins (b/100, (b+1)/100]: 0.61 (on its upper edge), 0.62, 0.9, 0.95 fall in four
    # different bins, so ECE_100 = mean |c_i - a_i| = (0.39 + 0.62 + 0.10 + 0.95) / 4 = 0.515.
    # 15 bins: 0.61 and 0.62 share (0.6, 0.667] (conf 0.615, acc 0.5, gap 0.115, weight 2/4),
    # so ECE_15 = 0.0575 + 0.10 / 4 + 0.95 / 4 = 0.32.
    values = table_summary(PROBS, LABELS, n_bins=15, keys=("ece_100", "ece"))
    assert list(values) == ["ece_100", "ece"]
    assert values["ece_100"] == pytest.approx(0.515, abs=1e-12)
    assert values["ece"] == pytest.approx(0.32, abs=1e-12)
    # ece_100 keeps its 100 bins whatever the trial's n_bins
    assert table_summary(PROBS, LABELS, n_bins=3, keys="ece_100")["ece_100"] == values["ece_100"]


def test_confidence_columns_by_hand():
    # objectness paper Sec. 4.2: o(f) = E[c | wrong] = (0.62 + 0.95) / 2 = 0.785;
    # u(f) = E[1 - c | right] = (0.39 + 0.10) / 2 = 0.245; A.conf = 3.08 / 4 = 0.77.
    values = table_summary(PROBS, LABELS, keys=("overconfidence", "underconfidence",
                                                "average_confidence", "accuracy"))
    assert values["overconfidence"] == pytest.approx(0.785, abs=1e-12)
    assert values["underconfidence"] == pytest.approx(0.245, abs=1e-12)
    assert values["average_confidence"] == pytest.approx(0.77, abs=1e-12)
    assert values["accuracy"] == 0.5
    # no wrong prediction: the mean confidence of the misses is a mean over nothing
    right = table_summary(PROBS, np.zeros(4, dtype=np.int64), keys=("overconfidence",))
    assert math.isnan(right["overconfidence"])


def test_ece_l2em_by_hand():
    # 2 equal-mass bins: {0.61 hit, 0.62 miss} gap |0.615 - 0.5| = 0.115 and {0.9 hit, 0.95
    # miss} gap |0.925 - 0.5| = 0.425, each of weight 1/2: sqrt((0.115^2 + 0.425^2) / 2).
    value = table_summary(PROBS, LABELS, n_bins=2, keys=("ece_l2em",))["ece_l2em"]
    assert value == pytest.approx(math.sqrt((0.115**2 + 0.425**2) / 2), abs=1e-12)


def test_table_summary_is_the_public_functions():
    rng = np.random.default_rng(0)
    probs = softmax(3.0 * rng.normal(size=(300, 6)))
    labels = rng.integers(0, 6, size=300)
    for n_bins in (15, 7):
        values = table_summary(probs, labels, n_bins=n_bins, keys=CALIBRATED_KEYS)
        assert list(values) == list(CALIBRATED_KEYS)
        assert values == _direct(probs, labels, n_bins)
    assert list(table_summary(probs, labels)) == list(TABLE_KEYS)


def test_table_summary_errors():
    with pytest.raises(ValueError, match="unknown table metric.*'ece_99'"):
        table_summary(PROBS, LABELS, keys=("ece", "ece_99"))
    with pytest.raises(ValueError, match="n_bins"):
        table_summary(PROBS, LABELS, n_bins=0)
    with pytest.raises(ValueError, match="labels"):
        table_summary(PROBS, LABELS[:3])


def test_sweep_settings_accept_the_table_names():
    settings = SweepSettings(posthoc=("ts",), ece_metric="ece_100")
    known = settings.known_metrics()
    assert {*TABLE_KEYS, "ece_100_ts", "overconfidence_ts", "sweep_ce_ts", "ece_l2em_ts"} <= known
    assert SweepSettings(objective="val_overconfidence").objective_metrics() == (
        "val_overconfidence", "min")
    assert SweepSettings(posthoc=("ts",), objective="val_ece_100_ts").objective_metrics() == (
        "val_ece_100_ts", "min")


@pytest.fixture(scope="module")
def one_epoch():
    """A 1-epoch CE run of the default CNN on digits, single-threaded (as trials run)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = RunConfig(loss={"name": "ce"}, model={"name": "cnn"}, epochs=1, seed=0)
        result = fit(cfg, data=load_dataset("digits", seed=0))
    finally:
        torch.set_num_threads(previous)
    return cfg, result


def test_trial_logs_every_table_metric(one_epoch):
    cfg, result = one_epoch
    for split, logits, labels in (("val", result.val_logits, result.val_labels),
                                  ("test", result.test_logits, result.test_labels)):
        expected = _direct(softmax(logits), labels, cfg.ece_bins)
        for key in TABLE_KEYS:
            # summary metrics come from the streaming meter: equal to float32 rounding
            assert result.metrics[f"{split}_{key}"] == pytest.approx(
                expected[key], rel=1e-5, abs=1e-7, nan_ok=True), f"{split}_{key}"
    assert 0.0 < result.metrics["test_ece_100"] <= 1.0
    assert result.metrics["test_overconfidence"] > 0.0


def test_posthoc_metrics_of_a_trial(one_epoch, tmp_path):
    cfg, result = one_epoch
    final = ClassificationTask().write_artifacts(result, cfg, tmp_path, test=None,
                                                 posthoc=("ts",))
    # test_*_ts: TS fitted on all validation logits, measured on the test logits
    calibrator = fit_calibrator("ts", result.val_logits, result.val_labels)
    expected = _direct(calibrator.predict_proba(result.test_logits), result.test_labels,
                       cfg.ece_bins)
    for key in CALIBRATED_KEYS:
        assert final[f"test_{key}_ts"] == pytest.approx(expected[key], rel=1e-9, nan_ok=True)
        assert f"val_{key}_ts" in final  # the honest half: fitted and measured on halves
    # the uncalibrated half of the validation set does not replace the trial's val metrics
    assert not {f"val_{key}" for key in CALIBRATED_KEYS} & set(final)
    assert not {f"test_{key}" for key in TABLE_KEYS} & set(final)  # already in result.metrics
