"""CalibrationMeter(keep_samples=True) is the one evaluator of the result table."""

import math

import numpy as np
import pytest
import torch

from raysearch.metrics import (
    CALIBRATED_KEYS,
    TABLE_KEYS,
    CalibrationMeter,
    calibration_summary,
    estimator_summary,
    softmax,
    table_summary,
)

# Four samples, K = 2: confidences 0.9 (hit), 0.8 (miss), 0.7 (hit), 0.6 (miss).
PROBS = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
LABELS = np.array([0, 1, 1, 0])


def _fed(batches, **kwargs):
    meter = CalibrationMeter(batches[0][0].shape[1], keep_samples=True, **kwargs)
    for probs, labels in batches:
        meter.update(probs, labels)
    return meter


def test_batches_equal_one_update_by_hand():
    # 5 equal-width bins (b/5, (b+1)/5]: 0.6 and 0.8 lie on edges, so 0.6 is in (0.4, 0.6],
    # 0.8 and 0.7 share (0.6, 0.8], 0.9 is in (0.8, 1]. Gaps |acc_b - conf_b|:
    # {0.6 miss} |0 - 0.6| = 0.6, {0.8 miss, 0.7 hit} |0.5 - 0.75| = 0.25, {0.9 hit} 0.1;
    # ECE = 1/4 * 0.6 + 2/4 * 0.25 + 1/4 * 0.1 = 0.15 + 0.125 + 0.025 = 0.3, MCE = 0.6.
    whole = _fed([(PROBS, LABELS)], n_bins=5).table()
    parts = _fed([(PROBS[:1], LABELS[:1]), (PROBS[1:3], LABELS[1:3]), (PROBS[3:], LABELS[3:])],
                 n_bins=5).table()
    assert parts == whole
    assert whole["ece"] == pytest.approx(0.3, abs=1e-12)
    assert whole["mce"] == pytest.approx(0.6, abs=1e-12)
    assert whole["accuracy"] == 0.5
    # o(f) = E[c | wrong] = (0.8 + 0.6) / 2 = 0.7
    assert whole["overconfidence"] == pytest.approx(0.7, abs=1e-12)
    assert {key: whole[key] for key in CALIBRATED_KEYS} == table_summary(
        PROBS, LABELS, n_bins=5, keys=CALIBRATED_KEYS
    )


def test_meter_table_is_every_summary_on_random_batches():
    rng = np.random.default_rng(3)
    probs = softmax(2.5 * rng.normal(size=(301, 7))).astype(np.float32)
    labels = rng.integers(0, 7, size=301)
    cuts = (0, 50, 51, 200, 301)
    batches = [(probs[a:b], labels[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    # torch batches too: the kept arrays are those of the metric functions
    batches[1] = (torch.from_numpy(batches[1][0]), torch.from_numpy(batches[1][1]))
    meter = _fed(batches, n_bins=9)
    table = meter.table()
    assert table == _fed([(probs, labels)], n_bins=9).table()
    assert {k: table[k] for k in TABLE_KEYS} == table_summary(probs, labels, n_bins=9)
    assert {k: table[k] for k in ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier")} == (
        calibration_summary(probs, labels, n_bins=9)
    )
    estimators = estimator_summary(probs, labels, n_bins=9)
    assert {k: table[k] for k in estimators} == estimators
    # the streaming sums of the same meter agree to float rounding
    sums = meter.compute()
    for key in ("accuracy", "ece", "cece", "mce", "nll", "brier"):
        assert sums[key] == pytest.approx(table[key], abs=1e-12)
    assert sums["n"] == 301.0
    # merging two kept meters keeps every sample
    first, second = _fed(batches[:2], n_bins=9), _fed(batches[2:], n_bins=9, seed=1)
    assert first.merge(second).table() == table


def test_logits_inputs():
    logits = np.log(PROBS) + 1.5
    meter = CalibrationMeter(2, n_bins=5, keep_samples=True, inputs="logits")
    meter.update(logits[:2], LABELS[:2])
    meter.update(logits[2:], LABELS[2:])
    assert meter.table(TABLE_KEYS) == table_summary(softmax(logits, axis=1), LABELS, n_bins=5)
    assert meter.table("ece")["ece"] == pytest.approx(0.3, abs=1e-12)


def test_one_evaluator_errors():
    with pytest.raises(ValueError, match="keep_samples"):
        CalibrationMeter(2).table()
    with pytest.raises(ValueError, match="ignore_index"):
        CalibrationMeter(2, ignore_index=255, keep_samples=True)
    with pytest.raises(ValueError, match="inputs"):
        CalibrationMeter(2, inputs="scores")
    meter = CalibrationMeter(2, keep_samples=True)
    with pytest.raises(ValueError, match="at least one sample"):
        meter.table()
    with pytest.raises(ValueError, match="unknown table metric.*'ece_99'"):
        meter.table(("ece", "ece_99"))
    with pytest.raises(ValueError, match="rows of `probs` must sum to 1"):
        meter.update(PROBS * 0.5, LABELS)
    with pytest.raises(ValueError, match="not in a state_dict"):
        meter.state_dict()
    with pytest.raises(ValueError, match="K=3 classes"):
        CalibrationMeter(3, keep_samples=True).update(PROBS, LABELS)
    # no prediction right (argmaxes 0, 0, 1, 1): u(f) is a mean over nothing
    assert math.isnan(_fed([(PROBS, np.array([1, 1, 0, 0]))]).table()["underconfidence"])
