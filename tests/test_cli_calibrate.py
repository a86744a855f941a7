"""`raysearch calibrate` on real CIFAR outputs and on files written here in each format."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from raysearch.cli.commands import main

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar_outputs"
WRN = SHARED / "netcal_wideresnet-16-4-cifar-10.npz"
SCTL_DENSENET = SHARED / "sctl_densenet40_cifar10_lt_logits.npz"


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.skipif(not WRN.exists(), reason=f"shared CIFAR outputs not found at {SHARED}")
def test_wrn_cifar10_ts_brings_ece_from_5_to_1_percent(tmp_path, sqlite_uri):
    out = tmp_path / "cal"
    result = _run("calibrate", str(WRN), "--methods", "ts,ets", "--output-dir", str(out),
                  "--tracking-uri", sqlite_uri)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "calibration.csv").set_index("method")
    assert 0.045 <= table.loc["uncalibrated", "ece"] <= 0.06   # netcal reference: 5.1%
    assert table.loc["ts", "ece"] <= 0.015                       # about 1% after TS
    assert table.loc["ts", "accuracy"] == table.loc["uncalibrated", "accuracy"]
    assert (out / "reliability_ts.png").exists()
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name("raysearch").experiment_id])
    assert len(runs) == 1
    assert runs[0].data.metrics["test_ece_ts"] <= 0.015
    assert "5000 evaluation samples" in result.output


@pytest.mark.skipif(
    not SCTL_DENSENET.exists(), reason=f"released CIFAR-10-LT logits not found at {SHARED}"
)
def test_classwise_scaling_reproduces_jung_table_2(tmp_path):
    # the file's own split (long-tailed val -> balanced test); Jung et al. Table 2, DenseNet-40:
    # TS 6.16, TS + class-wise scaling 3.22 (ECE %, 15 bins); our defaults within 0.3
    out = tmp_path / "cal"
    result = _run("calibrate", str(SCTL_DENSENET), "--methods", "ts",
                  "--classwise-scaling", "both", "--output-dir", str(out))
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "calibration.csv")
    ts = table[(table["method"] == "ts") & ~table["classwise_scaling"]].iloc[0]
    ts_cw = table[(table["method"] == "ts") & table["classwise_scaling"]].iloc[0]
    assert abs(100 * ts["ece"] - 6.16) <= 0.3
    assert abs(100 * ts_cw["ece"] - 3.22) <= 0.3
    assert ts_cw["accuracy"] == ts["accuracy"]


def test_npz_logits_and_parquet(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 50)
    logits = rng.normal(size=(200, 4)) + 3.0 * np.eye(4)[labels]  # overconfident-ish
    logits *= 2.5
    np.savez(tmp_path / "o.npz", logits=logits, labels=labels)
    r = _run("calibrate", str(tmp_path / "o.npz"), "--methods", "ts",
             "--output-dir", str(tmp_path / "a"))
    assert r.exit_code == 0, r.output
    frame = pd.DataFrame({"label": labels, **{f"logit_{k}": logits[:, k] for k in range(4)}})
    frame.to_parquet(tmp_path / "o.parquet")
    r2 = _run("calibrate", str(tmp_path / "o.parquet"), "--methods", "ts",
              "--output-dir", str(tmp_path / "b"))
    assert r2.exit_code == 0, r2.output
    a = pd.read_csv(tmp_path / "a" / "calibration.csv")
    b = pd.read_csv(tmp_path / "b" / "calibration.csv")
    np.testing.assert_allclose(a["ece"], b["ece"], rtol=1e-9)


def test_pickle_refused_without_flag(tmp_path):
    probs = np.full((20, 2), 0.5)
    labels = np.arange(20) % 2
    path = tmp_path / "p.dat"
    path.write_bytes(pickle.dumps((probs, labels.reshape(-1, 1))))
    refused = _run("calibrate", str(path), "--methods", "ts")
    assert refused.exit_code == 2
    assert "allow-pickle" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    allowed = _run("calibrate", str(path), "--methods", "ts", "--allow-pickle",
                   "--output-dir", str(tmp_path / "c"))
    assert allowed.exit_code == 0, allowed.output


def test_bad_inputs(tmp_path):
    np.savez(tmp_path / "bad.npz", logits=np.zeros((5, 3)), labels=np.array([0, 1, 2, 3, 0]))
    r = _run("calibrate", str(tmp_path / "bad.npz"))
    assert r.exit_code == 2
    assert "error:" in r.stderr
    r = _run("calibrate", str(tmp_path / "missing.npz"))
    assert r.exit_code == 2
    assert "missing.npz" in r.stderr
    np.savez(tmp_path / "ok.npz", logits=np.eye(3)[np.arange(30) % 3], labels=np.arange(30) % 3)
    r = _run("calibrate", str(tmp_path / "ok.npz"), "--methods", "nope")
    assert r.exit_code == 2
    assert "nope" in r.stderr


def test_calibrate_search_sweeps_the_posthoc_space(ray_session, tmp_path, sqlite_uri):
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(5), 80)
    logits = 3.0 * (rng.normal(size=(400, 5)) + 2.0 * np.eye(5)[labels])  # overconfident
    np.savez(tmp_path / "o.npz", logits=logits, labels=labels)
    r = _run("calibrate", str(tmp_path / "o.npz"), "--search", "--num-samples", "4",
             "--tracking-uri", sqlite_uri)
    assert r.exit_code == 0, r.output
    assert "selected:" in r.output
    assert "evaluation part: ECE" in r.output
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name("raysearch").experiment_id])
    parents = [x for x in runs if "mlflow.parentRunId" not in x.data.tags]
    assert len(parents) == 1
    assert parents[0].data.tags["raysearch.kind"] == "posthoc"
    assert len(runs) == 5


def test_spaces_list_shows_the_posthoc_space():
    r = _run("spaces", "list")
    assert r.exit_code == 0
    assert any(line.startswith("posthoc") for line in r.output.splitlines())
    assert _run("spaces", "validate", "posthoc").exit_code == 0
