"""Loading stored outputs, splitting them, and post-hoc calibration reports."""

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from compare import assert_same_metrics

from raysearch.calibration import posthoc
from raysearch.calibration.posthoc import (
    METRIC_COLUMNS,
    CalibrationReport,
    Outputs,
    calibrate_outputs,
    load_outputs,
    split_outputs,
    write_outputs_parquet,
)
from raysearch.metrics import ece, softmax

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
WRN = SHARED_DATA / "cifar_outputs" / "netcal_wideresnet-16-4-cifar-10.npz"
VGG = SHARED_DATA / "cifar_outputs" / "verified_calibration_vgg_cifar10_probs.dat"


def _needs(path):
    if not path.is_file():
        pytest.skip(f"real network outputs not found at {path} (the shared data folder is absent)")


def _synthetic(n=300, k=4, seed=0, scale=3.0):
    """Over-confident logits: the true class gets a bonus, then everything is scaled up."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k))
    logits[np.arange(n), labels] += 1.0
    return logits * scale, labels


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------


def test_npz_logits(tmp_path):
    logits, labels = _synthetic()
    np.savez(tmp_path / "out.npz", logits=logits.astype(np.float32), labels=labels)
    out = load_outputs(tmp_path / "out.npz")
    assert isinstance(out, Outputs)
    assert out.logits.dtype == np.float64
    assert out.labels.dtype == np.int64
    np.testing.assert_array_equal(out.logits, logits.astype(np.float32))
    np.testing.assert_array_equal(out.labels, labels)
    assert (out.from_probs, out.split, out.n_samples, out.n_classes) == (False, None, 300, 4)
    assert not out.logits.flags.writeable


def test_npz_predictions_ground_truth_become_log_probs(tmp_path):
    # netcal's layout: probabilities under `predictions`, labels under `ground_truth`.
    probs = np.array([[0.7, 0.2, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=np.float32)
    np.savez(tmp_path / "p.npz", predictions=probs, ground_truth=np.array([0, 3]))
    out = load_outputs(tmp_path / "p.npz")
    assert out.from_probs
    # logits = log(max(p, 1e-12)): the 0 becomes log(1e-12) ~ -27.63, softmax gives p back
    assert out.logits[0, 3] == pytest.approx(np.log(1e-12))
    assert out.logits[0, 0] == pytest.approx(np.log(0.7))
    np.testing.assert_allclose(softmax(out.logits), probs, atol=1e-6)
    np.savez(tmp_path / "q.npz", probs=probs, labels=np.array([[0], [3]]))  # (N, 1) labels
    np.testing.assert_array_equal(load_outputs(tmp_path / "q.npz").labels, [0, 3])


def test_npz_split_key_and_pre_split_layout(tmp_path):
    logits, labels = _synthetic(n=6, k=3)
    split = np.array(["val", "test", "val", "test", "test", "val"])
    np.savez(tmp_path / "s.npz", logits=logits, labels=labels, split=split)
    out = load_outputs(tmp_path / "s.npz")
    np.testing.assert_array_equal(out.split, split)

    np.savez(
        tmp_path / "pre.npz",
        val_logits=logits[:2],
        val_labels=labels[:2],
        test_logits=logits[2:],
        test_labels=labels[2:],
    )
    pre = load_outputs(tmp_path / "pre.npz")
    np.testing.assert_array_equal(pre.logits, logits)
    np.testing.assert_array_equal(pre.labels, labels)
    np.testing.assert_array_equal(pre.split, ["val", "val", "test", "test", "test", "test"])
    parts = split_outputs(pre)
    np.testing.assert_array_equal(parts.calibration.logits, logits[:2])
    np.testing.assert_array_equal(parts.evaluation.labels, labels[2:])
    assert "own split" in parts.description


def test_parquet_roundtrip_with_and_without_split(tmp_path):
    logits, labels = _synthetic(n=50, k=5)
    path = write_outputs_parquet(tmp_path / "t.parquet", logits.astype(np.float32), labels)
    frame = pd.read_parquet(path)
    assert list(frame.columns) == ["label"] + [f"logit_{k}" for k in range(5)]
    assert frame["logit_0"].dtype == np.float32
    assert frame["label"].dtype == np.int64
    out = load_outputs(path)
    np.testing.assert_array_equal(out.logits, logits.astype(np.float32))
    np.testing.assert_array_equal(out.labels, labels)
    assert out.split is None
    assert not out.from_probs

    split = ["val"] * 20 + ["test"] * 30
    out = load_outputs(write_outputs_parquet(tmp_path / "s.parquet", logits, labels, split=split))
    np.testing.assert_array_equal(out.logits, logits)
    np.testing.assert_array_equal(out.split, split)
    parts = split_outputs(out, fraction=0.9)  # the file's split wins over `fraction`
    assert (parts.calibration.n_samples, parts.evaluation.n_samples) == (20, 30)


def test_parquet_probability_columns_and_extra_columns(tmp_path):
    probs = softmax(_synthetic(n=12, k=3)[0])
    frame = pd.DataFrame({f"prob_{k}": probs[:, k] for k in (2, 0, 1)})  # any column order
    frame["label"] = np.arange(12) % 3
    frame["sample_id"] = np.arange(12)  # ignored
    frame.to_parquet(tmp_path / "p.parquet")
    out = load_outputs(tmp_path / "p.parquet")
    assert out.from_probs
    np.testing.assert_allclose(softmax(out.logits), probs, atol=1e-12)


def test_pickle_refused_then_allowed(tmp_path):
    probs = softmax(_synthetic(n=10, k=3)[0])
    labels = np.arange(10) % 3
    for suffix in (".dat", ".pkl", ".pickle"):
        path = tmp_path / f"o{suffix}"
        path.write_bytes(pickle.dumps((probs, labels[:, None])))
        with pytest.raises(ValueError, match="refusing to unpickle .*--allow-pickle"):
            load_outputs(path)
    out = load_outputs(tmp_path / "o.dat", allow_pickle=True)
    assert out.from_probs
    assert out.labels.shape == (10,)
    (tmp_path / "d.pkl").write_bytes(pickle.dumps({"logits": probs, "labels": labels}))
    assert not load_outputs(tmp_path / "d.pkl", allow_pickle=True).from_probs
    # a pair holding logits is not silently read as probabilities
    (tmp_path / "bad.pkl").write_bytes(pickle.dumps((probs * 5 - 2, labels)))
    with pytest.raises(ValueError, match="under 'logits'"):
        load_outputs(tmp_path / "bad.pkl", allow_pickle=True)


def test_pickled_pair_of_pairs_is_a_pre_split_file(tmp_path):
    # ((val_scores, val_labels), (test_scores, test_labels)): Kull et al.'s and Jung et al.'s
    # probs_*_logits.p files, whose scores are logits
    (val_z, val_y), (test_z, test_y) = _synthetic(n=12, k=3), _synthetic(n=8, k=3, seed=1)
    path = tmp_path / "probs_net_c10_logits.p"
    path.write_bytes(pickle.dumps(((val_z, val_y[:, None]), (test_z, test_y))))
    with pytest.raises(ValueError, match="refusing to unpickle"):
        load_outputs(path)
    out = load_outputs(path, allow_pickle=True)
    assert not out.from_probs
    assert out.split.tolist() == ["val"] * 12 + ["test"] * 8
    np.testing.assert_array_equal(out.logits, np.concatenate([val_z, test_z]))
    np.testing.assert_array_equal(out.labels, np.concatenate([val_y, test_y]))
    # the same layout holding probabilities in both parts is read as probabilities
    path.write_bytes(pickle.dumps(((softmax(val_z), val_y), (softmax(test_z), test_y))))
    out = load_outputs(path, allow_pickle=True)
    assert out.from_probs
    np.testing.assert_allclose(softmax(out.logits), softmax(np.concatenate([val_z, test_z])))


def test_real_vgg_pickle():
    _needs(VGG)
    with pytest.raises(ValueError, match="refusing to unpickle"):
        load_outputs(VGG)
    out = load_outputs(VGG, allow_pickle=True)
    assert (out.n_samples, out.n_classes, out.from_probs) == (10000, 10, True)
    assert out.labels.shape == (10000,)


# ---------------------------------------------------------------------------------------------
# Input errors
# ---------------------------------------------------------------------------------------------


def test_load_errors(tmp_path):
    logits, labels = _synthetic(n=8, k=3)
    cases = {
        "nokeys.npz": ({"scores": logits, "labels": labels}, "no scores.*found keys: labels"),
        "twokeys.npz": ({"logits": logits, "probs": softmax(logits), "labels": labels}, "ambig"),
        "nolabels.npz": ({"logits": logits, "y": labels}, "no labels"),
        "shape.npz": ({"logits": logits, "labels": labels[:5]}, r"shape \(8,\)"),
        "range.npz": ({"logits": logits, "labels": labels + 3}, r"\[0, 3\)"),
        "notprobs.npz": ({"probs": logits, "labels": labels}, r"\[0, 1\]"),
        "nan.npz": ({"logits": np.where(logits > 2, np.nan, logits), "labels": labels}, "finite"),
        "mixed.npz": ({"logits": logits, "labels": labels, "val_logits": logits}, "one layout"),
        "halfsplit.npz": ({"val_logits": logits, "val_labels": labels}, "test_<scores>"),
        "badsplit.npz": (
            {"logits": logits, "labels": labels, "split": np.array(["train"] * 8)},
            "'val' or 'test'",
        ),
    }
    for name, (arrays, message) in cases.items():
        np.savez(tmp_path / name, **arrays)
        with pytest.raises(ValueError, match=message) as info:
            load_outputs(tmp_path / name)
        assert str(info.value).startswith(str(tmp_path / name))  # the path leads the message
    with pytest.raises(FileNotFoundError):
        load_outputs(tmp_path / "missing.npz")
    (tmp_path / "x.csv").write_text("label\n0\n")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        load_outputs(tmp_path / "x.csv")


def test_parquet_errors(tmp_path):
    frame = pd.DataFrame({"logit_0": [0.0, 1.0], "logit_2": [1.0, 0.0], "label": [0, 1]})
    frame.to_parquet(tmp_path / "gap.parquet")
    with pytest.raises(ValueError, match="missing.*logit_1"):
        load_outputs(tmp_path / "gap.parquet")
    frame.drop(columns="label").to_parquet(tmp_path / "nolabel.parquet")
    with pytest.raises(ValueError, match="no `label` column"):
        load_outputs(tmp_path / "nolabel.parquet")
    both = pd.DataFrame({"logit_0": [0.0], "logit_1": [1.0], "prob_0": [0.5], "label": [0]})
    both.to_parquet(tmp_path / "both.parquet")
    with pytest.raises(ValueError, match="both logit_"):
        load_outputs(tmp_path / "both.parquet")
    with pytest.raises(ValueError, match="split"):
        write_outputs_parquet(tmp_path / "w.parquet", np.zeros((2, 2)), [0, 1], split=["a", "b"])
    with pytest.raises(ValueError, match=r"labels.*shape"):
        write_outputs_parquet(tmp_path / "w.parquet", np.zeros((2, 2)), [0, 1, 1])


# ---------------------------------------------------------------------------------------------
# Splitting
# ---------------------------------------------------------------------------------------------


def test_stratified_split():
    logits, labels = _synthetic(n=400, k=4, seed=1)
    out = Outputs(logits, labels)
    parts = split_outputs(out, fraction=0.25, seed=0)
    cal, ev = parts.calibration, parts.evaluation
    assert (cal.n_samples, ev.n_samples) == (100, 300)
    # stratified: each class keeps its share (within one sample of 25% of its count)
    for k in range(4):
        assert abs((cal.labels == k).sum() - 0.25 * (labels == k).sum()) <= 1
    # a partition of the rows, each part in file order
    rows = {tuple(row) for row in np.concatenate([cal.logits, ev.logits])}
    assert len(rows) == 400
    again = split_outputs(out, fraction=0.25, seed=0)
    np.testing.assert_array_equal(again.calibration.logits, cal.logits)
    other = split_outputs(out, fraction=0.25, seed=1)
    assert not np.array_equal(other.calibration.logits, cal.logits)
    assert "stratified" in parts.description
    assert "seed 0" in parts.description


def test_split_errors_and_unstratified_fallback():
    logits, labels = _synthetic(n=10, k=3)
    out = Outputs(logits, labels)
    for fraction in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            split_outputs(out, fraction=fraction)
    with pytest.raises(ValueError, match="seed"):
        split_outputs(out, seed=-1)
    with pytest.raises(ValueError, match="'val' and 'test'"):
        split_outputs(Outputs(logits, labels, split=["val"] * 10))
    rare = Outputs(logits, np.array([0] * 9 + [1]))  # class 1 has one sample
    with pytest.warns(UserWarning, match="without stratification"):
        parts = split_outputs(rare)
    assert "unstratified" in parts.description


# ---------------------------------------------------------------------------------------------
# Calibration reports (need raysearch.calibration)
# ---------------------------------------------------------------------------------------------


def test_calibrate_outputs_report(tmp_path):
    logits, labels = _synthetic(n=600, k=4, seed=2)
    path = write_outputs_parquet(tmp_path / "o.parquet", logits, labels)
    report = calibrate_outputs(load_outputs(path), ["ts"], classwise_scaling="both", n_bins=10)
    assert isinstance(report, CalibrationReport)
    assert [row.name for row in report.rows] == ["uncalibrated", "ts", "ts+cw"]
    assert (report.n_calibration, report.n_evaluation, report.n_bins) == (300, 300, 10)
    raw, ts = report.row("uncalibrated"), report.row("ts")
    assert set(raw.metrics) == set(METRIC_COLUMNS)
    assert ts.metrics["ece"] < raw.metrics["ece"]  # over-confident logits: TS helps
    assert ts.metrics["accuracy"] == raw.metrics["accuracy"]  # TS keeps the argmax
    assert raw.reliability.n_bins == 10
    assert raw.reliability.ece == pytest.approx(raw.metrics["ece"])
    assert ts.fit_seconds is not None
    assert raw.fit_seconds is None
    # the class-wise rows run the released code's variant (the default, issue 7)
    assert report.row("ts", classwise_scaling=True).params["variant"] == "official"

    frame = report.to_frame()
    assert list(frame.columns) == [
        "method",
        "classwise_scaling",
        *METRIC_COLUMNS,
        "fit_seconds",
        "params",
        "error",
    ]
    assert frame["method"].tolist() == ["uncalibrated", "ts", "ts"]
    assert frame["classwise_scaling"].tolist() == [False, False, True]

    table = report.format_table()
    assert "ECE %" in table
    assert "ts+cw" in table
    assert f"{100 * raw.metrics['ece']:.2f}" in table  # percentages with 2 decimals
    metrics = report.as_metrics("test")
    assert metrics["test_ece"] == raw.metrics["ece"]
    assert metrics["test_ece_ts"] == ts.metrics["ece"]
    assert "test_ks_ts_cw" in metrics


def test_calibrate_outputs_without_the_uncalibrated_row():
    # a sweep trial measured the raw split already: the calibrators' rows alone, the same
    logits, labels = _synthetic(n=600, k=4, seed=2)
    outputs = Outputs(logits, labels)
    full = calibrate_outputs(outputs, ["ts", "ets"], seed=3)
    short = calibrate_outputs(outputs, ["ts", "ets"], seed=3, uncalibrated=False)
    assert [row.name for row in short.rows] == ["ts", "ets"]
    for name in ("ts", "ets"):
        assert_same_metrics(short.row(name).metrics, full.row(name).metrics)
        assert short.row(name).params == full.row(name).params
    assert_same_metrics(short.as_metrics("val"), full.as_metrics("val", calibrated_only=True))
    assert "ts" in short.format_table()


def test_failing_calibrator_becomes_a_row(monkeypatch):
    from raysearch import calibration

    real = calibration.fit_calibrator

    def flaky(name, *args, **kwargs):
        if name == "ets":
            raise ValueError("simulated failure")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(calibration, "fit_calibrator", flaky)
    logits, labels = _synthetic(n=200, k=3)
    report = calibrate_outputs(Outputs(logits, labels), ["ets", "ts"])
    failed, ts = report.row("ets"), report.row("ts")
    assert not failed.ok
    assert failed.error == "ValueError: simulated failure"
    assert failed.metrics == {}
    assert failed.reliability is None
    assert ts.ok
    assert "ece" in ts.metrics
    assert "FAILED: ValueError: simulated failure" in report.format_table()
    assert np.isnan(report.to_frame().set_index("method").loc["ets", "ece"])


def test_calibrate_outputs_errors():
    from raysearch.calibration import available_calibrators

    out = Outputs(*_synthetic(n=40, k=3))
    listed = ", ".join(available_calibrators())
    with pytest.raises(ValueError, match=f"Unknown calibrator 'platt'; available: {listed}"):
        calibrate_outputs(out, ["ts", "platt"])
    with pytest.raises(ValueError, match="classwise_scaling"):
        calibrate_outputs(out, ["ts"], classwise_scaling="yes")
    with pytest.raises(ValueError, match="at least one"):
        calibrate_outputs(out, [])
    with pytest.raises(ValueError, match="repeats"):
        calibrate_outputs(out, ["ts", "ts"])
    with pytest.raises(ValueError, match="n_bins"):
        calibrate_outputs(out, "ts", n_bins=0)


def test_every_calibrator_runs_on_a_small_file():
    from raysearch.calibration import available_calibrators

    logits, labels = _synthetic(n=400, k=5, seed=3)
    report = calibrate_outputs(Outputs(logits, labels), available_calibrators())
    for row in report.rows:
        assert row.ok, f"{row.name}: {row.error}"
        assert 0.0 <= row.metrics["ece"] <= 1.0


def test_real_wrn_temperature_scaling():
    # netcal WRN-16-4 on CIFAR-10 test outputs, 5k/5k stratified split with seed 0: ECE (15
    # bins) about 5% before TS and about 1% after (README of the shared data).
    _needs(WRN)
    report = calibrate_outputs(load_outputs(WRN), ["ts"], fraction=0.5, seed=0)
    assert (report.n_calibration, report.n_evaluation) == (5000, 5000)
    raw, ts = report.row("uncalibrated"), report.row("ts")
    assert 0.04 <= raw.metrics["ece"] <= 0.06
    assert ts.metrics["ece"] <= 0.015
    assert ts.metrics["nll"] < raw.metrics["nll"]
    assert ts.metrics["accuracy"] == pytest.approx(raw.metrics["accuracy"])
    # the uncalibrated row is the file's own probabilities (up to the 1e-12 floor)
    parts = split_outputs(load_outputs(WRN))
    probs = np.load(WRN)["predictions"]
    assert probs.shape == (10000, 10)
    assert raw.metrics["ece"] == pytest.approx(
        ece(softmax(parts.evaluation.logits), parts.evaluation.labels), abs=1e-9
    )


def test_posthoc_imports_no_infrastructure():
    code = (
        "import sys, raysearch.calibration.posthoc\n"
        "bad = [m for m in ('ray', 'mlflow', 'optuna', 'matplotlib', 'raysearch.cli.commands') "
        "if m in sys.modules]\nprint(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""
    assert posthoc.__name__ == "raysearch.calibration.posthoc"
