"""The suite's NaN-aware metric comparisons (tests/compare.py) tell equal from different."""

import math

import pytest
from compare import assert_metrics_close, assert_same_metrics, metric_differences


def test_nan_equals_nan_and_only_nan():
    nan = math.nan
    assert metric_differences({"a": nan, "b": 0.5}, {"a": float("nan"), "b": 0.5}) == {}
    assert set(metric_differences({"a": nan}, {"a": 0.0})) == {"a"}
    assert set(metric_differences({"a": 0.0}, {"a": nan})) == {"a"}
    assert_same_metrics({"val_underconfidence": nan}, {"val_underconfidence": nan})


def test_exact_by_default_and_scaled_when_asked():
    one_ulp = math.nextafter(2800.0, math.inf)  # 4.5e-13 above 2800
    with pytest.raises(AssertionError, match="x"):
        assert_same_metrics({"x": 2800.0}, {"x": one_ulp})
    # rel scales with the magnitude: 1e-12 * 2800 = 2.8e-9 >= one ulp
    assert_metrics_close({"x": 2800.0}, {"x": one_ulp}, rel=1e-12)
    with pytest.raises(AssertionError):
        assert_metrics_close({"x": 2800.0}, {"x": 2800.1}, rel=1e-6)  # 0.1 > 2.8e-3
    assert_metrics_close({"x": 0.0}, {"x": 1e-9}, abs=1e-8)


def test_missing_keys_infinities_and_other_values_differ():
    assert set(metric_differences({"a": 1.0}, {})) == {"a"}
    assert set(metric_differences({}, {"b": 1.0})) == {"b"}
    assert metric_differences({"a": math.inf}, {"a": math.inf}) == {}
    assert set(metric_differences({"a": math.inf}, {"a": -math.inf})) == {"a"}
    assert set(metric_differences({"s": "x"}, {"s": "y"})) == {"s"}
    assert_metrics_close({"a": 1.0, "b": 5.0}, {"a": 1.0, "b": 9.0}, keys=["a"])
