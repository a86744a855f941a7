"""End to end: `raysearch sweep` -> report -> export -> train, with real Ray, MLflow and files."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from ray.tune import ExperimentAnalysis

import raysearch
from raysearch.cli.commands import main
from raysearch.config import RunConfig
from raysearch.losses import build_loss
from raysearch.metrics.selection import pareto_front, select_best

pytestmark = pytest.mark.integration

EPOCHS = 2
N_TRIALS = 4


def _cli(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


@pytest.fixture(scope="module")
def acls_sweep(ray_session, tmp_path_factory):
    """One short ACLS sweep on digits shared by the tests of this module."""
    root = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    result = _cli("sweep", "acls", "--num-samples", str(N_TRIALS), "--epochs", str(EPOCHS),
                  "--max-concurrent", "2", "--name", "e2e-acls", "--tracking-uri", uri,
                  "--storage-path", str(root / "ray"), "--seed", "0")
    assert result.exit_code == 0, result.output
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    return {"root": root, "uri": uri, "output": result.output, "client": client, "runs": runs}


def _parent_and_children(runs):
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return parent, children


def test_one_parent_and_a_child_per_trial(acls_sweep):
    parent, children = _parent_and_children(acls_sweep["runs"])
    assert parent.info.run_name == "e2e-acls"
    assert parent.data.tags["raysearch.sweep"] == "e2e-acls"
    assert parent.info.status == "FINISHED"
    assert len(children) == N_TRIALS
    for child in children:
        assert child.info.status in ("FINISHED", "FAILED")
        params = child.data.params
        for name in ("method", "margin", "lambda1", "lambda2", "lr", "dataset", "model",
                     "epochs", "seed"):
            assert name in params, name
        assert params["method"] == "acls"
        assert params["dataset"] == "digits"
        assert params["epochs"] == str(EPOCHS)
        assert 6.0 <= float(params["margin"]) <= 10.0
    # MLflow 3's UI treats the experiment as model training, not GenAI
    exp = acls_sweep["client"].get_experiment_by_name("raysearch")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    # the sweep ends with a link to its parent run in the UI's model-training view
    link = (f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs/"
            f"{parent.info.run_id}?workflowType=machine_learning")
    last = acls_sweep["output"].rstrip().splitlines()[-1]
    assert last == (f"open it in MLflow (serve it with `raysearch ui --tracking-uri "
                    f"{acls_sweep['uri']}`): {link}")


def test_an_existing_experiment_gets_the_model_training_kind(sqlite_uri):
    from raysearch.tracking import ensure_experiment

    client = MlflowClient(sqlite_uri)
    exp_id = client.create_experiment("older")  # made before raysearch tagged experiments
    assert "mlflow.experimentKind" not in client.get_experiment(exp_id).tags
    assert ensure_experiment(client, "older", sqlite_uri) == exp_id
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == \
        "custom_model_development"


def test_progress_line_per_trial(acls_sweep):
    """One line per trial, named by its run's number; the searched values and only those."""
    lines = [ln for ln in acls_sweep["output"].splitlines() if ln.startswith("[")]
    assert len(lines) == N_TRIALS
    assert re.match(rf"\[trial \d{{3}}, {N_TRIALS} of {N_TRIALS} done\] acls ", lines[-1]), lines
    numbers = sorted(re.match(r"\[trial (\d{3}),", ln).group(1) for ln in lines)
    assert numbers == [f"{i:03d}" for i in range(N_TRIALS)]
    for name in ("margin=", "lambda1=", "lambda2=", "optimizer.lr="):
        assert name in lines[-1], lines[-1]
    assert "variant" not in lines[-1]


def test_child_metrics_per_epoch_and_test_metrics(acls_sweep):
    client = acls_sweep["client"]
    _, children = _parent_and_children(acls_sweep["runs"])
    finished = [c for c in children if c.data.tags.get("raysearch.complete") == "true"]
    assert finished, "no trial finished"
    for child in finished:
        history = client.get_metric_history(child.info.run_id, "val_ece")
        assert sorted(m.step for m in history) == list(range(1, EPOCHS + 1))
        for key in ("test_accuracy", "test_ece", "test_aece", "test_cece", "test_mce",
                    "test_nll", "test_brier", "val_accuracy", "val_ece"):
            assert key in child.data.metrics, key
        assert 0.0 <= child.data.metrics["test_ece"] <= 1.0
        arts = [a.path for a in client.list_artifacts(child.info.run_id)]
        assert "reliability.png" in arts
        cfg = RunConfig.from_dict(json.loads(child.data.tags["raysearch.config"]))
        assert cfg.loss.name == "acls"
        assert cfg.epochs == EPOCHS
        # the dataset is an MLflow dataset input (the UI's "Dataset" column)
        (inp,) = child.inputs.dataset_inputs
        assert inp.dataset.name == "digits"
        assert json.loads(inp.dataset.profile)["train_size"] == 1077
        assert len(inp.dataset.digest) == 12
    # without a scheduler the epochs of a short trial reach Tune in one report (its last)
    # and MLflow still has every epoch (above)
    tune_trials = ExperimentAnalysis(str(acls_sweep["root"] / "ray" / "e2e-acls")).trials
    assert len(tune_trials) == N_TRIALS
    assert {t.last_result["training_iteration"] for t in tune_trials} == {1}


def test_parent_artifacts_and_selection(acls_sweep, tmp_path):
    client = acls_sweep["client"]
    parent, children = _parent_and_children(acls_sweep["runs"])
    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"pareto.png", "trials.parquet", "best_config.yaml"} <= arts
    assert "pareto.html" in arts
    local = client.download_artifacts(parent.info.run_id, "trials.parquet", str(tmp_path))
    table = pq.read_table(local).to_pandas()
    assert len(table) == N_TRIALS
    assert {"on_front", "selected", "complete", "val_accuracy", "val_ece", "test_ece",
            "margin", "lambda1", "method"} <= set(table.columns)
    assert table["selected"].sum() == 1
    # the table's flags follow the selection rule applied to the complete trials only
    done = table[table["complete"]].reset_index(drop=True)
    assert table[table["selected"]].iloc[0]["run_id"] == \
        done.iloc[select_best(done, tolerance=0.01)]["run_id"]
    front_ids = set(done.iloc[pareto_front(done)]["run_id"])
    assert set(table[table["on_front"]]["run_id"]) == front_ids
    # the selected trial is within 1 point of the best validation accuracy
    best_acc = done["val_accuracy"].max()
    sel = table[table["selected"]].iloc[0]
    assert sel["val_accuracy"] >= best_acc - 0.01 - 1e-12
    assert parent.data.tags["raysearch.selected_run"] == sel["run_id"]


def test_children_carry_post_ts_metrics_and_parquet_logits(acls_sweep, tmp_path):
    from raysearch.calibration.posthoc import load_outputs

    client = acls_sweep["client"]
    _, children = _parent_and_children(acls_sweep["runs"])
    done = [c for c in children if c.data.tags.get("raysearch.complete") == "true"]
    assert done
    for child in done:
        m = child.data.metrics
        for key in ("test_ece_ts", "test_nll_ts", "test_accuracy_ts", "val_ece_ts"):
            assert key in m, key
        # TS never changes predictions
        assert m["test_accuracy_ts"] == pytest.approx(m["test_accuracy"])
        local = client.download_artifacts(child.info.run_id, "logits.parquet", str(tmp_path))
        outputs = load_outputs(local)
        assert set(outputs.split) == {"val", "test"}
        assert (outputs.split == "test").sum() == 360
        assert (outputs.split == "val").sum() == 360
        # the stored test logits give back the logged test metrics
        from raysearch.metrics import ece, softmax

        test = outputs.split == "test"
        assert ece(softmax(outputs.logits[test]), outputs.labels[test]) == \
            pytest.approx(m["test_ece"], abs=1e-6)


def test_report_calibrated_and_calibrate_a_trial(acls_sweep, tmp_path):
    uri = acls_sweep["uri"]
    rep = _cli("report", "e2e-acls", "--tracking-uri", uri, "--calibrated", "ts",
               "--plot", str(tmp_path / "front.png"))
    assert rep.exit_code == 0, rep.output
    assert "val ECE (ts)" in rep.output
    assert "test ECE after ts" in rep.output
    assert "95% bootstrap CI" in rep.output
    assert (tmp_path / "front.png").stat().st_size > 1000
    bad = _cli("report", "e2e-acls", "--tracking-uri", uri, "--calibrated", "pts")
    assert bad.exit_code == 2
    assert "val_ece_pts" in bad.stderr
    _, children = _parent_and_children(acls_sweep["runs"])
    run_id = next(c.info.run_id for c in children
                  if c.data.tags.get("raysearch.complete") == "true")
    cal = _cli("calibrate", run_id, "--methods", "ts,ets", "--tracking-uri", uri,
               "--output-dir", str(tmp_path / "cal"))
    assert cal.exit_code == 0, cal.output
    assert "uncalibrated" in cal.output
    assert "ets" in cal.output
    assert (tmp_path / "cal" / "reliability_ts.png").exists()
    # the file's own val/test split is used: 360 calibration, 360 evaluation samples
    assert "360 evaluation samples" in cal.output


def test_report_export_train_reproduce(acls_sweep, tmp_path):
    uri = acls_sweep["uri"]
    rep = _cli("report", "e2e-acls", "--tracking-uri", uri)
    assert rep.exit_code == 0, rep.output
    assert "selected" in rep.output
    assert "val ECE" in rep.output
    assert "test ECE" in rep.output

    out = tmp_path / "best.yaml"
    exp = _cli("export", "e2e-acls", "-o", str(out), "--tracking-uri", uri)
    assert exp.exit_code == 0, exp.output
    doc = yaml.safe_load(out.read_text())
    cfg = RunConfig.from_yaml(out)
    assert cfg.loss.name == "acls"
    loss = build_loss(cfg.loss.name, **cfg.loss.params)  # a Python user can build the loss
    assert loss.margin == pytest.approx(doc["config"]["loss"]["params"]["margin"])
    # the export names what it needs to train again
    assert doc["requires"]["raysearch"] == raysearch.__version__
    assert doc["requires"]["torch"] == str(torch.__version__)

    tr = _cli("train", str(out), "--tracking-uri", uri, "--name", "retrain")
    assert tr.exit_code == 0, tr.output
    client = acls_sweep["client"]
    runs = client.search_runs([client.get_experiment_by_name("raysearch").experiment_id],
                              filter_string="attributes.run_name = 'retrain'")
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED"
    retrained = runs[0].data.metrics
    # same seed, same thread count: the selected trial is reproduced exactly
    for key in ("test_accuracy", "test_ece", "val_accuracy", "val_ece", "test_nll"):
        assert retrained[key] == pytest.approx(doc["metrics"][key], abs=1e-9), key
    assert runs[0].data.tags["raysearch.source_sweep"] == "e2e-acls"


def test_sweep_against_a_real_mlflow_server(ray_session, mlflow_server, tmp_path):
    result = _cli("sweep", "ce", "--num-samples", "2", "--epochs", "1", "--name", "srv",
                  "--tracking-uri", mlflow_server, "--storage-path", str(tmp_path / "ray"))
    assert result.exit_code == 0, result.output
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id])
    parent, children = _parent_and_children(runs)
    assert len(children) == 2
    assert all(c.info.status == "FINISHED" for c in children)
    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert "trials.parquet" in arts
    assert "pareto.png" in arts
    rep = _cli("report", "srv", "--tracking-uri", mlflow_server)
    assert rep.exit_code == 0
    assert "selected" in rep.output


def test_diverging_trial_is_failed_and_sweep_goes_on(ray_session, tmp_path, sqlite_uri):
    space = tmp_path / "unstable.yaml"
    space.write_text(
        "method: ce\n"
        "description: one lr that diverges\n"
        "train:\n"
        "  lr: {choices: [0.05, 1.0e+6]}\n"
        "  epochs: 2\n")
    result = _cli("sweep", str(space), "--num-samples", "4", "--sampler", "random",
                  "--seed", "2", "--tracking-uri", sqlite_uri, "--name", "unstable",
                  "--storage-path", str(tmp_path / "ray"))
    assert result.exit_code == 3, result.output  # ran, selected, but a trial failed
    assert re.match(r"sweep unstable: 3 of 4 trials completed, 1 failed; most common error "
                    r"\(1 of 1\): .*training loss is", result.output.rstrip().splitlines()[-1])
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name("raysearch").experiment_id])
    _, children = _parent_and_children(runs)
    statuses = {c.data.params["lr"]: c.info.status for c in children}
    lrs = pd.Series([float(c.data.params["lr"]) for c in children])
    assert len(children) == 4
    assert set(lrs) == {0.05, 1e6}, "seed 2 draws both learning rates (0.05 x3, 1e6 x1)"
    for c in children:
        lr = float(c.data.params["lr"])
        assert c.info.status == ("FAILED" if lr == 1e6 else "FINISHED"), statuses
        if lr == 1e6:
            assert "training loss is" in c.data.tags["raysearch.error"]
    assert "FAILED" in result.output
    rep = _cli("report", "unstable", "--tracking-uri", sqlite_uri, "--all")
    assert rep.exit_code == 0
    assert "failed" in rep.output


def test_asha_stopped_trials_never_selected(ray_session, tmp_path, sqlite_uri):
    result = _cli("sweep", "ls", "--num-samples", "6", "--epochs", "4", "--scheduler", "asha",
                  "--tracking-uri", sqlite_uri, "--name", "asha", "--max-concurrent", "2",
                  "--storage-path", str(tmp_path / "ray"))
    assert result.exit_code == 0, result.output
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name("raysearch").experiment_id])
    parent, children = _parent_and_children(runs)
    local = client.download_artifacts(parent.info.run_id, "trials.parquet", str(tmp_path))
    table = pq.read_table(local).to_pandas()
    partial = table[~table["complete"]]
    assert not partial["on_front"].any()
    assert not partial["selected"].any()
    for c in children:
        epochs_run = len(client.get_metric_history(c.info.run_id, "val_ece"))
        complete = c.data.tags["raysearch.complete"] == "true"
        assert complete == (epochs_run == 4)
        assert ("test_ece" in c.data.metrics) == complete
    assert np.isfinite(table[table["selected"]]["val_ece"]).all()
    # ASHA saw every epoch of every trial: one Tune result per epoch
    for t in ExperimentAnalysis(str(tmp_path / "ray" / "asha")).trials:
        assert t.last_result["training_iteration"] == t.last_result["epoch"]


def test_compare_methods_of_a_single_seed_sweep(acls_sweep, tmp_path):
    result = _cli("compare", "e2e-acls", "--tracking-uri", acls_sweep["uri"])
    assert result.exit_code == 0, result.output
    client = acls_sweep["client"]
    parent, _ = _parent_and_children(acls_sweep["runs"])
    table = pd.read_csv(client.download_artifacts(parent.info.run_id, "compare.csv",
                                                  str(tmp_path)))
    # one method, whose pick is the sweep's selected trial (same rule, same tolerance); one
    # seed: its test ECE is the trial's, with no SEM and no effect size (no ce in the sweep)
    local = client.download_artifacts(parent.info.run_id, "trials.parquet", str(tmp_path))
    trials = pq.read_table(local).to_pandas()
    best = trials[trials["selected"]].iloc[0]
    assert list(table["method"]) == ["acls"]
    assert table["config"][0] == best["config"]
    assert table["n_seeds"][0] == 1
    assert table["test_ece_mean"][0] == pytest.approx(best["test_ece"])
    assert np.isnan(table["test_ece_sem"][0])
    assert np.isnan(table["cohens_d"][0])
    assert best["trial"] in result.output
    arts = [a.path for a in client.list_artifacts(parent.info.run_id)]
    assert "compare.png" in arts
    # an unknown sweep is one line, exit 2
    bad = CliRunner().invoke(main, ["compare", "nope", "--tracking-uri", acls_sweep["uri"]])
    assert bad.exit_code == 2
    assert bad.stderr.count("\n") == 1


def test_estimators_are_logged_and_report_selects_on_one(acls_sweep):
    _, children = _parent_and_children(acls_sweep["runs"])
    finished = [c for c in children if c.data.tags.get("raysearch.complete") == "true"]
    for child in finished:
        for split in ("val", "test"):
            for key in ("ece_l2em", "debiased_ce", "sweep_ce", "marginal_ece", "ks"):
                assert 0.0 <= child.data.metrics[f"{split}_{key}"] <= 1.0, (split, key)
    # report --ece-metric debiased_ce: the rule on val_debiased_ce
    result = _cli("report", "e2e-acls", "--tracking-uri", acls_sweep["uri"], "--all",
                  "--ece-metric", "debiased_ce")
    assert result.exit_code == 0, result.output
    assert "rule: lowest val_debiased_ce within 0.01" in result.output
    rows = [{"name": c.info.run_name, **c.data.metrics} for c in finished]
    pick = rows[select_best(rows, ece="val_debiased_ce")]["name"]
    selected = [ln for ln in result.output.splitlines() if ln.startswith("selected:")]
    assert selected
    assert pick in selected[0]


def test_sweep_with_another_ece_metric(ray_session, tmp_path, sqlite_uri):
    result = _cli("sweep", "ce", "--num-samples", "2", "--epochs", "2", "--ece-metric", "ks",
                  "--tracking-uri", sqlite_uri, "--name", "ks-rule",
                  "--storage-path", str(tmp_path / "ray"))
    assert result.exit_code == 0, result.output
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name("raysearch").experiment_id])
    parent, children = _parent_and_children(runs)
    assert parent.data.params["ece_metric"] == "ks"
    assert parent.data.params["selection_rule"].startswith("lowest val_ks within")
    rows = [{"id": c.info.run_id, **c.data.metrics} for c in children]
    assert parent.data.tags["raysearch.selected_run"] == \
        rows[select_best(rows, ece="val_ks")]["id"]
    bad = CliRunner().invoke(main, ["sweep", "ce", "--ece-metric", "nope",
                                    "--tracking-uri", sqlite_uri])
    assert bad.exit_code == 2
    assert "--ece-metric nope: the trials report no metric val_nope" in bad.stderr
    assert bad.stderr.count("\n") == 1


def test_repeated_sweep_end_to_end(ray_session, tmp_path, sqlite_uri):
    """--repeats 2: a configuration run per sampled point with its two seed runs under it."""
    from PIL import Image

    from raysearch.metrics.repeats import cohens_d

    space = tmp_path / "two.yaml"
    space.write_text("methods: [ce, ls]\ndescription: two methods\n"
                     "train:\n  lr: {low: 0.03, high: 0.1, log: true}\n")
    result = _cli("sweep", str(space), "-n", "2", "--repeats", "2", "--epochs", "2",
                  "--name", "rep", "--tracking-uri", sqlite_uri,
                  "--storage-path", str(tmp_path / "ray"))
    assert result.exit_code == 0, result.output
    assert "2 configurations x 2 seeds (4 trials)" in result.output
    assert "mean ± SEM over seeds" in result.output
    client = MlflowClient(sqlite_uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parent, configs = _parent_and_children(runs)
    assert parent.data.params["repeats"] == "2"
    assert parent.data.params["selection"] == "mean"
    assert sorted(c.data.params["method"] for c in configs) == ["ce", "ls"]  # warm start
    seeds_of = {}
    for config in configs:
        seeds = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == config.info.run_id]
        seeds_of[config.data.params["method"]] = seeds
        assert sorted(s.data.params["seed"] for s in seeds) == ["0", "1"]
        assert sorted(s.data.params["seed_index"] for s in seeds) == ["0", "1"]
        for s in seeds:  # the seeds differ only in their seed; the split stays that of seed 0
            assert s.data.params["data_seed" if s.data.params["seed"] == "1" else "seed"] == "0"
            assert s.data.params["lr"] == config.data.params["lr"]
            assert s.data.tags["raysearch.complete"] == "true"
        # the configuration run holds mean and SEM; for two values SEM = |a - b| / 2
        for key in ("val_ece", "val_accuracy", "test_ece"):
            a, b = (s.data.metrics[key] for s in seeds)
            m = config.data.metrics
            assert m[key] == pytest.approx((a + b) / 2, abs=1e-12)
            assert m[f"{key}_mean"] == pytest.approx((a + b) / 2, abs=1e-12)
            assert m[f"{key}_sem"] == pytest.approx(abs(a - b) / 2, abs=1e-12)
        assert config.data.metrics["n_seeds"] == 2
        assert config.data.tags["raysearch.seeds"] == "2/2"
    trials = pq.read_table(client.download_artifacts(parent.info.run_id, "trials.parquet",
                                                     str(tmp_path))).to_pandas()
    assert len(trials) == 2
    for col in ("val_ece_mean", "val_ece_sem", "val_accuracy_mean", "val_accuracy_sem",
                "test_ece_mean", "test_ece_sem"):
        assert trials[col].notna().all(), col
    # selection on means: the rule over the configurations' mean metrics
    assert trials["selected"].tolist().index(True) == select_best(trials.to_dict("records"))
    png = client.download_artifacts(parent.info.run_id, "pareto.png", str(tmp_path))
    assert "±1 SEM error bars" in Image.open(png).text["Description"]
    seeds_table = pq.read_table(client.download_artifacts(
        parent.info.run_id, "seeds.parquet", str(tmp_path))).to_pandas()
    assert len(seeds_table) == 4
    # report: the table shows mean ± SEM
    report = _cli("report", "rep", "--tracking-uri", sqlite_uri)
    assert report.exit_code == 0, report.output
    assert "2 configurations x 2 seeds" in report.output
    assert "rule (mean)" in report.output
    assert " ± " in report.output
    # compare: per method mean ± SEM over its seeds and Cohen's d of ls against ce
    compared = _cli("compare", "rep", "--tracking-uri", sqlite_uri)
    assert compared.exit_code == 0, compared.output
    table = pd.read_csv(client.download_artifacts(parent.info.run_id, "compare.csv",
                                                  str(tmp_path)))
    row = table.set_index("method")
    assert (row["n_seeds"] == 2).all()
    expected = cohens_d([s.data.metrics["test_ece"] for s in seeds_of["ce"]],
                        [s.data.metrics["test_ece"] for s in seeds_of["ls"]])
    assert row.loc["ls", "cohens_d"] == pytest.approx(expected, rel=1e-9)
    assert np.isnan(row.loc["ce", "cohens_d"])
    assert f"{expected:.2f}" in compared.output
