import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from raysearch.metrics.selection import pareto_front, select_best, selection_table


def _trials(points):
    return [
        {"trial_id": f"t{i}", "val_accuracy": a, "val_ece": e} for i, (a, e) in enumerate(points)
    ]


# Hand table for the front:
#   pos  acc   ece
#   0    .90   .05
#   1    .92   .08   dominated by 3 (same accuracy, lower ECE)
#   2    .88   .02
#   3    .92   .06
#   4    .85   .03   dominated by 2 (.88 >= .85 and .02 <= .03)
#   5    .90   .05   duplicate of 0: both on the front
# Front by accuracy descending, ECE ascending, position: 3, 0, 5, 2.
SIX = _trials([(0.90, 0.05), (0.92, 0.08), (0.88, 0.02), (0.92, 0.06), (0.85, 0.03), (0.90, 0.05)])


def test_pareto_front_hand_table():
    assert pareto_front(SIX) == [3, 0, 5, 2]
    assert pareto_front(pd.DataFrame(SIX)) == [3, 0, 5, 2]


def test_select_best_hand_table_tolerances():
    # tol .01: best .92 -> accuracy >= .91: {1 (.08), 3 (.06)} -> 3
    assert select_best(SIX, tolerance=0.01) == 3
    # tol .02: accuracy >= .90: {0, 1, 3, 5}; ECE .05 tie between 0 and 5 (same accuracy) -> 0
    assert select_best(SIX, tolerance=0.02) == 0
    # tol .05: accuracy >= .87 adds 2 (ECE .02) -> 2
    assert select_best(SIX, tolerance=0.05) == 2
    # tol 0: the most accurate trials only (.92): the better calibrated one, 3
    assert select_best(SIX, tolerance=0.0) == 3


def test_rule_prefers_calibrated_trial_inside_tolerance_and_rejects_just_outside():
    # best accuracy .95 with ECE .05; .941 is within one point (>= .94) with ECE .01 -> selected;
    # .939 is outside (< .94) even with a far better ECE .001.
    trials = _trials([(0.95, 0.05), (0.941, 0.01), (0.939, 0.001)])
    assert select_best(trials, tolerance=0.01) == 1
    # exactly on the threshold: .95 - .01 is 0.9399999999999999 in floats; .94 is still in
    trials = _trials([(0.95, 0.05), (0.94, 0.02)])
    assert select_best(trials, tolerance=0.01) == 1
    # 149/300 is exactly 38/75 - 1/100, but in floats 38/75 - 0.01 = 0.4966666666666667 >
    # 149/300 = 0.49666666666666665: only the 1e-12 slack keeps it in
    assert 38 / 75 - 0.01 > 149 / 300
    assert select_best(_trials([(38 / 75, 0.05), (149 / 300, 0.02)]), tolerance=0.01) == 1
    # without the calibrated trial, the .939 one stays out: the best accuracy wins
    assert select_best(_trials([(0.95, 0.05), (0.939, 0.001)]), tolerance=0.01) == 0


def test_tie_breaking():
    # ECE tie -> higher accuracy
    assert select_best(_trials([(0.93, 0.02), (0.95, 0.02), (0.95, 0.04)]), tolerance=0.05) == 1
    # full tie (same accuracy and ECE) -> earlier position
    assert select_best(_trials([(0.9, 0.1), (0.95, 0.03), (0.95, 0.03)])) == 1


def test_missing_values_are_skipped():
    trials = [
        {"val_accuracy": 0.99, "val_ece": float("nan")},  # would be the best accuracy
        {"val_accuracy": None, "val_ece": 0.0},
        {"val_ece": 0.0},  # no accuracy at all
        {"val_accuracy": 0.98},  # no ECE
        {"val_accuracy": pd.NA, "val_ece": 0.01},
        {"val_accuracy": 0.9, "val_ece": 0.05},
        {"val_accuracy": 0.895, "val_ece": 0.02},
        {"val_accuracy": float("inf"), "val_ece": 0.0},  # diverged / broken trial
    ]
    # eligible: 5 (.90, .05) and 6 (.895, .02); best .90 -> threshold .89 -> 6
    assert select_best(trials) == 6
    assert pareto_front(trials) == [5, 6]
    table = selection_table(trials)
    assert table["on_front"].tolist() == [False] * 5 + [True, True, False]
    assert table["selected"].tolist() == [False] * 6 + [True, False]


def test_no_eligible_trial_and_bad_tolerance():
    with pytest.raises(ValueError, match="^no trial has both val_accuracy and val_ece$"):
        select_best([])
    with pytest.raises(ValueError, match="^no trial has both val_accuracy and val_ece$"):
        select_best([{"val_accuracy": 0.9, "val_ece": None}, {"val_accuracy": float("nan")}])
    with pytest.raises(ValueError, match="^no trial has both acc and cal$"):
        select_best(pd.DataFrame({"x": [1.0]}), accuracy="acc", ece="cal")
    with pytest.raises(ValueError, match=r"`tolerance` must be >= 0 and finite, got -0.01"):
        select_best(SIX, tolerance=-0.01)
    with pytest.raises(ValueError, match="`tolerance`"):
        selection_table(SIX, tolerance=float("nan"))
    with pytest.raises(TypeError, match="`tolerance` must be a real number"):
        select_best(SIX, tolerance="0.01")
    assert pareto_front([]) == []
    empty = selection_table([{"val_accuracy": None, "val_ece": 0.1}])
    assert not empty["on_front"].any()
    assert not empty["selected"].any()


def test_dataframe_and_list_of_dicts_agree():
    rng = np.random.default_rng(0)
    acc = np.round(0.85 + 0.1 * rng.random(60), 3)
    cal = np.round(0.1 * rng.random(60), 3)
    acc[[3, 17]] = np.nan
    cal[[5]] = np.nan
    records = [
        {"val_accuracy": a, "val_ece": e, "lr": 0.1 * i}
        for i, (a, e) in enumerate(zip(acc, cal, strict=True))
    ]
    # a DataFrame whose index labels differ from positions: positions are still row order
    frame = pd.DataFrame(records, index=rng.permutation(60) + 1000)
    for tolerance in (0.0, 0.005, 0.01, 0.05):
        assert select_best(frame, tolerance=tolerance) == select_best(records, tolerance=tolerance)
    assert pareto_front(frame) == pareto_front(records)
    from_frame = selection_table(frame)
    from_records = selection_table(records)
    assert list(from_frame.index) == list(frame.index)
    np.testing.assert_array_equal(from_frame["on_front"], from_records["on_front"])
    np.testing.assert_array_equal(from_frame["selected"], from_records["selected"])


def test_selection_table_is_a_copy_with_flags():
    frame = pd.DataFrame(SIX)
    table = selection_table(frame, tolerance=0.01)
    assert "on_front" not in frame.columns  # input untouched
    assert list(table.columns) == ["trial_id", "val_accuracy", "val_ece", "on_front", "selected"]
    assert table["on_front"].dtype == bool
    assert table["selected"].dtype == bool
    assert table["on_front"].tolist() == [True, False, True, True, False, True]
    assert table["selected"].tolist() == [False, False, False, True, False, False]
    assert selection_table(SIX)["trial_id"].tolist() == [t["trial_id"] for t in SIX]


def _brute_force_front(points):
    front = []
    for i, (a_i, e_i) in enumerate(points):
        dominated = any(
            a_j >= a_i and e_j <= e_i and (a_j > a_i or e_j < e_i)
            for j, (a_j, e_j) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return front


@pytest.mark.parametrize("decimals", [None, 2])  # 2 decimals: many ties and duplicates
def test_front_matches_brute_force_and_contains_selection(decimals):
    rng = np.random.default_rng(42)
    acc = 0.85 + 0.1 * rng.random(200)
    cal = 0.1 * rng.random(200)
    if decimals is not None:
        acc, cal = np.round(acc, decimals), np.round(cal, decimals)
    points = list(zip(acc.tolist(), cal.tolist(), strict=True))
    trials = _trials(points)
    front = pareto_front(trials)
    assert sorted(front) == _brute_force_front(points)
    keys = [(-points[i][0], points[i][1], i) for i in front]
    assert keys == sorted(keys)  # accuracy descending, then ECE ascending, then position
    for tolerance in (0.0, 0.001, 0.01, 0.03, 1.0):
        chosen = select_best(trials, tolerance=tolerance)
        assert chosen in front
        best = max(acc)
        assert acc[chosen] >= best - tolerance - 1e-12
        inside = acc >= best - tolerance - 1e-12
        assert cal[chosen] == min(cal[inside])


def test_custom_metric_names_and_test_metric_warning():
    trials = [{"acc": 0.9, "ece_ts": 0.02}, {"acc": 0.91, "ece_ts": 0.04}]
    assert select_best(trials, accuracy="acc", ece="ece_ts") == 0
    with pytest.warns(UserWarning, match="never on test data"):
        select_best([{"test_accuracy": 0.9, "test_ece": 0.1}], "test_accuracy", "test_ece")


def test_bad_trials_type():
    with pytest.raises(TypeError, match="trial 1 is int"):
        select_best([{"val_accuracy": 0.9, "val_ece": 0.1}, 3])
    with pytest.raises(TypeError, match="list of mappings or a pandas DataFrame"):
        pareto_front({"val_accuracy": 0.9, "val_ece": 0.1})
    with pytest.raises(TypeError, match="trial 0: `val_ece` must be a number"):
        select_best([{"val_accuracy": 0.9, "val_ece": "low"}])


def test_numpy_scalars_and_math_nan():
    trials = [
        {"val_accuracy": np.float32(0.9), "val_ece": np.float64(0.03)},
        {"val_accuracy": np.float64(0.905), "val_ece": math.nan},
    ]
    assert select_best(trials) == 0
    assert pareto_front(trials) == [0]


def test_selection_imports_no_ray_mlflow():
    code = (
        "import sys, raysearch.metrics.selection\n"
        "bad = [m for m in ('ray', 'mlflow', 'optuna', 'matplotlib') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
