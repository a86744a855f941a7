"""Mean, SEM, Cohen's d and the two selections over seeds, against values derived by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from raysearch.metrics.repeats import (
    cohens_d,
    compare_methods,
    seed_summary,
    select_on_means,
    select_robust,
    sem,
)


def test_sem_by_hand():
    # values 1, 2, 3, 6: mean 3, squared gaps 4+1+0+9 = 14, s^2 = 14/3, SEM = sqrt(14/3)/2
    assert sem([1, 2, 3, 6]) == pytest.approx(math.sqrt(14 / 3) / 2)
    assert math.isnan(sem([0.5]))  # one seed: no estimate of the noise
    with pytest.raises(ValueError, match="finite"):
        sem([1.0, float("nan")])


def test_cohens_d_by_hand():
    # baseline ECEs 0.05, 0.07 (mean 0.06, ss 2e-4); method 0.02, 0.03, 0.04 (mean 0.03,
    # ss 2e-4); pooled s = sqrt(4e-4 / 3); d = 0.03 / s = 0.03 / 0.011547 = 2.598
    d = cohens_d([0.05, 0.07], [0.02, 0.03, 0.04])
    assert d == pytest.approx(0.03 / math.sqrt(4e-4 / 3))
    assert d == pytest.approx(2.598, abs=1e-3)
    assert cohens_d([0.02, 0.03, 0.04], [0.05, 0.07]) == pytest.approx(-d)  # worse: negative
    assert cohens_d([0.1, 0.1], [0.1, 0.1]) == 0.0
    assert cohens_d([0.2, 0.2], [0.1, 0.1]) == math.inf
    with pytest.raises(ValueError, match=">= 3"):
        cohens_d([0.1], [0.2])


def _seeds() -> pd.DataFrame:
    # three configurations, seed runs in arbitrary order
    rows = [
        ("a", "ce", 0.97, 0.030), ("a", "ce", 0.95, 0.050),        # acc .96, ece .04
        ("b", "acls", 0.960, 0.020), ("b", "acls", 0.956, 0.060),  # acc .958, ece .04
        ("c", "mbls", 0.955, 0.034), ("c", "mbls", 0.957, 0.036),  # acc .956, ece .035
    ]
    return pd.DataFrame(rows, columns=["config_id", "method", "val_accuracy", "val_ece"]) \
        .sample(frac=1.0, random_state=3).reset_index(drop=True)


def test_seed_summary_by_hand():
    table = seed_summary(_seeds(), ["val_accuracy", "val_ece"], keep=["method"])
    table = table.set_index("config_id").loc[["a", "b", "c"]]
    assert list(table["n_seeds"]) == [2, 2, 2]
    assert list(table["method"]) == ["ce", "acls", "mbls"]
    assert table["val_accuracy_mean"].tolist() == pytest.approx([0.96, 0.958, 0.956])
    assert table["val_ece_mean"].tolist() == pytest.approx([0.04, 0.04, 0.035])
    # two values x, y: SEM = |x - y| / 2
    assert table["val_ece_sem"].tolist() == pytest.approx([0.01, 0.02, 0.001])
    assert table["val_accuracy_sem"].tolist() == pytest.approx([0.01, 0.002, 0.001])


def test_selection_on_means_and_robust_by_hand():
    table = seed_summary(_seeds(), ["val_accuracy", "val_ece"], keep=["method"])
    ids = list(table["config_id"])
    # all three within 1 point of the best mean accuracy (0.96): lowest mean ECE is c (0.035)
    assert ids[select_on_means(table, tolerance=0.01)] == "c"
    # a tolerance of 0.003 keeps a (0.96) and b (0.958): tied mean ECE 0.04 -> higher accuracy
    assert ids[select_on_means(table, tolerance=0.003)] == "a"
    # robust: UCBs a 0.05, b 0.06, c 0.036 -> c; with tolerance 0.003: a (0.05) beats b (0.06)
    assert ids[select_robust(table, tolerance=0.01)] == "c"
    assert ids[select_robust(table, tolerance=0.003)] == "a"
    # z = 0 is the selection on means
    assert select_robust(table, tolerance=0.01, z=0.0) == select_on_means(table, tolerance=0.01)


def test_robust_penalises_a_lucky_low_mean():
    # x: mean ECE 0.030 but seeds spread 0.00..0.06 (SEM 0.03): UCB 0.060
    # y: mean ECE 0.035, seeds agree (SEM 0.001): UCB 0.036 -> robust picks y, means pick x
    rows = [("x", 0.95, 0.0), ("x", 0.95, 0.06), ("y", 0.95, 0.034), ("y", 0.95, 0.036)]
    table = seed_summary(pd.DataFrame(rows, columns=["config_id", "val_accuracy", "val_ece"]),
                         ["val_accuracy", "val_ece"])
    assert table["config_id"][select_on_means(table)] == "x"
    assert table["config_id"][select_robust(table)] == "y"


def test_robust_needs_two_seeds():
    one = seed_summary(pd.DataFrame({"config_id": ["a", "b"], "val_accuracy": [0.9, 0.91],
                                     "val_ece": [0.02, 0.03]}), ["val_accuracy", "val_ece"])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        select_robust(one)
    with pytest.raises(ValueError, match=">= 0"):
        select_robust(seed_summary(_seeds(), ["val_accuracy", "val_ece"]), z=-1)
    with pytest.raises(KeyError, match="val_nll"):
        seed_summary(_seeds(), ["val_nll"])


def _runs() -> pd.DataFrame:
    # ce: two configs (c1 better on val), 3 seeds each; acls: one config, 3 seeds
    rows = []
    for cfg, acc, vece, teces in (("c1", 0.95, 0.05, [0.05, 0.06, 0.07]),
                                  ("c2", 0.90, 0.02, [0.01, 0.01, 0.01])):
        for t in teces:
            rows.append(("ce", cfg, acc, vece, 0.94, t, True))
    for t in (0.02, 0.03, 0.04):
        rows.append(("acls", "a1", 0.951, 0.03, 0.945, t, True))
    rows.append(("acls", "a2", 0.99, 0.0, 0.99, 0.0, False))  # incomplete: ignored
    return pd.DataFrame(rows, columns=["method", "config", "val_accuracy", "val_ece",
                                       "test_accuracy", "test_ece", "complete"])


def test_compare_methods_by_hand():
    table = compare_methods(_runs(), tolerance=0.01)
    rows = table.set_index("method")
    # ce: c2 is 5 points less accurate (outside the tolerance): c1 is ce's pick
    assert rows.loc["ce", "config"] == "c1"
    assert rows.loc["acls", "config"] == "a1"
    assert rows.loc["ce", "test_ece_mean"] == pytest.approx(0.06)
    assert rows.loc["ce", "test_ece_sem"] == pytest.approx(0.01 / math.sqrt(3))  # s = 0.01
    assert rows.loc["acls", "test_ece_mean"] == pytest.approx(0.03)
    assert list(rows["n_seeds"]) == [3, 3]
    # d = (0.06 - 0.03) / pooled s (both s = 0.01) = 3
    assert rows.loc["acls", "cohens_d"] == pytest.approx(3.0)
    assert math.isnan(rows.loc["ce", "cohens_d"])
    assert list(table["method"]) == ["acls", "ce"]  # sorted by mean test ECE


def test_compare_after_a_single_seed_sweep():
    one = _runs().groupby("config").head(1)  # one seed per configuration
    table = compare_methods(one).set_index("method")
    assert list(table["n_seeds"]) == [1, 1]
    assert math.isnan(table.loc["acls", "test_ece_sem"])
    assert math.isnan(table.loc["acls", "cohens_d"])  # 1 + 1 values: no pooled variance
