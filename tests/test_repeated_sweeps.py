"""Repeated seeds (``--repeats``): the searcher wrapper, the seeds' configs, the configuration
runs' mean and SEM in a real MLflow store, both selections, and the error bars of the plot.

Values are derived by hand in the comments; no Ray cluster is needed here (the end-to-end sweep
is in test_sweep.py).
"""

from __future__ import annotations

import json
import math

import numpy as np
import optuna
import pandas as pd
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from raysearch import tracking
from raysearch.training import plots
from raysearch.training.data import load_dataset
from raysearch.tune.engine import CompletedOnlyOptunaSearch, make_sampler
from raysearch.tune.searchers import RepeatedSearcher, mean_result
from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import CONFIG_ID_KEY, SEED_INDEX_KEY, load_space

OBJ = {"metric": ["val_accuracy", "val_ece"], "mode": ["max", "min"]}
State = optuna.trial.TrialState


def _repeated(repeats: int = 3) -> RepeatedSearcher:
    inner = CompletedOnlyOptunaSearch(space=load_space("acls").define_by_run,
                                      sampler=make_sampler("tpe", 0), **OBJ)
    return RepeatedSearcher(inner, repeats)


def _done(acc: float, ece: float) -> dict:
    return {"val_accuracy": acc, "val_ece": ece, "completed": True, "node_id": "n"}


def test_each_configuration_is_issued_r_times_with_seed_indices():
    s = _repeated(3)
    configs = [s.suggest(f"t{i}") for i in range(6)]
    # t0..t2 are the seeds of one configuration (id t0), t3..t5 of the next (id t3)
    assert [c[CONFIG_ID_KEY] for c in configs] == ["t0"] * 3 + ["t3"] * 3
    assert [c[SEED_INDEX_KEY] for c in configs] == [0, 1, 2, 0, 1, 2]
    strip = [{k: v for k, v in c.items() if k not in (CONFIG_ID_KEY, SEED_INDEX_KEY)}
             for c in configs]
    assert strip[0] == strip[1] == strip[2]
    assert strip[3] == strip[4] == strip[5]
    assert strip[0] != strip[3]
    assert len(s.searcher._ot_study.trials) == 2  # Optuna sampled two configurations


def test_the_sampler_is_told_the_mean_once_all_seeds_ended():
    s = _repeated(3)
    for i in range(3):
        s.suggest(f"t{i}")
    s.on_trial_complete("t0", _done(0.90, 0.02))
    s.on_trial_complete("t2", _done(0.80, 0.04))
    study = s.searcher._ot_study
    assert study.trials[0].state == State.RUNNING  # one seed still running: nothing told
    s.on_trial_complete("t1", _done(0.85, 0.09))
    trial = study.trials[0]
    assert trial.state == State.COMPLETE
    # mean accuracy (0.90 + 0.85 + 0.80) / 3 = 0.85; mean ECE (0.02 + 0.09 + 0.04) / 3 = 0.05
    assert trial.values == pytest.approx([0.85, 0.05], abs=1e-12)


def test_failed_seeds_are_left_out_of_the_mean_and_all_failed_is_a_failure():
    s = _repeated(2)
    for i in range(4):
        s.suggest(f"t{i}")
    s.on_trial_complete("t0", None, error=True)
    s.on_trial_complete("t1", _done(0.7, 0.1))  # the only complete seed: its values
    s.on_trial_complete("t2", {"diverged": "nan loss", "completed": False})
    s.on_trial_complete("t3", None, error=True)
    first, second = s.searcher._ot_study.trials
    assert first.state == State.COMPLETE
    assert first.values == pytest.approx([0.7, 0.1])
    assert second.state == State.FAIL


def test_seeds_stopped_early_make_a_pruned_configuration():
    s = _repeated(2)
    s.suggest("a")
    s.suggest("b")
    s.on_trial_complete("a", {"val_accuracy": 0.99, "val_ece": 0.01})  # ASHA stopped it
    s.on_trial_complete("b", {"val_accuracy": 0.98, "val_ece": 0.01})
    assert s.searcher._ot_study.trials[0].state == State.PRUNED


def test_state_round_trip_keeps_open_configurations():
    s = _repeated(2)
    s.suggest("a")
    state = s.get_state()
    fresh = _repeated(2)
    fresh.set_state(state)
    fresh.searcher = s.searcher  # Tune restores the wrapped searcher on its own
    second = fresh.suggest("b")
    assert second[CONFIG_ID_KEY] == "a"
    assert second[SEED_INDEX_KEY] == 1


def test_mean_result_averages_numbers_only():
    out = mean_result([{"val_ece": 0.1, "completed": True, "node_id": "x", "epoch": 3},
                       {"val_ece": 0.3, "completed": True, "node_id": "y", "epoch": 3}])
    assert out == {"val_ece": pytest.approx(0.2), "completed": True, "node_id": "x",
                   "epoch": 3}
    with pytest.raises(ValueError, match="no results"):
        mean_result([])
    with pytest.raises(ValueError, match="repeats"):
        RepeatedSearcher(_repeated(1).searcher, 0)


def test_seed_k_trains_with_seed_plus_k_on_the_split_of_the_seed():
    space = load_space("acls")
    flat = {"method": "acls", "margin": 8.0, "lambda1": 0.1, "lambda2": 0.01, "lr": 0.05}
    first = space.resolve({**flat, CONFIG_ID_KEY: "t0", SEED_INDEX_KEY: 0}, {"seed": 5})
    third = space.resolve({**flat, CONFIG_ID_KEY: "t0", SEED_INDEX_KEY: 2}, {"seed": 5})
    assert (first.seed, first.data.seed, first.split_seed) == (5, None, 5)
    assert (third.seed, third.data.seed, third.split_seed) == (7, 5, 5)
    a = load_dataset("digits", seed=first.split_seed)
    b = load_dataset("digits", seed=third.split_seed)
    assert np.array_equal(a.test.tensors[1].numpy(), b.test.tensors[1].numpy())
    assert np.array_equal(a.val.tensors[0].numpy(), b.val.tensors[0].numpy())


def test_settings_validate_repeats_and_selection():
    assert SweepSettings(num_samples=4, repeats=3).trials == 12
    with pytest.raises(ValueError, match="repeats"):
        SweepSettings(repeats=0)
    with pytest.raises(ValueError, match="--repeats 2 or more"):
        SweepSettings(selection="robust")
    with pytest.raises(ValueError, match="unknown selection"):
        SweepSettings(repeats=2, selection="median")
    rule = SweepSettings(repeats=3, selection="robust").selection_rule()
    assert rule.startswith("lowest mean + 1 SEM of val_ece over 3 seeds")


# -- configuration runs in a real MLflow store -------------------------------------------------

def _store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(uri)
    exp = tracking.ensure_experiment(client, "raysearch", uri)
    return client, exp


def _configuration(client, exp, parent, name, seeds, method="acls"):
    """A configuration run with seed runs holding the given final metrics and outcomes."""
    cfg = {"method": method, "loss_params": {}, "seed": 0, "lr": 0.1}
    run = client.create_run(exp, run_name=name, tags={
        tracking.PARENT_TAG: parent, tracking.SWEEP_TAG: "s", tracking.CONFIGURATION_TAG: name,
        tracking.CONFIG_TAG: json.dumps(cfg), tracking.REPEATS_TAG: str(len(seeds))})
    tracking.log_params(client, run.info.run_id, {"method": method, "epochs": 3,
                                                  "repeats": len(seeds)})
    for k, (metrics, outcome) in enumerate(seeds):
        seed = client.create_run(exp, run_name=f"{name}-seed{k}", tags={
            tracking.PARENT_TAG: run.info.run_id, tracking.SWEEP_TAG: "s",
            tracking.TRIAL_TAG: f"{name}-{k}", tracking.CONFIGURATION_TAG: name,
            tracking.CONFIG_TAG: json.dumps({**cfg, "seed": k}),
            tracking.COMPLETE_TAG: str(outcome == "complete").lower(),
            tracking.OUTCOME_TAG: outcome})
        tracking.log_params(client, seed.info.run_id, {"method": method, "seed": k})
        tracking.log_metrics(client, seed.info.run_id, metrics, step=3)
        client.set_terminated(seed.info.run_id,
                              "FINISHED" if outcome in ("complete", "stopped_early") else "FAILED")
    return run.info.run_id


def test_configuration_run_gets_mean_and_sem_of_its_complete_seeds(tmp_path):
    client, exp = _store(tmp_path)
    parent = client.create_run(exp, run_name="s", tags={tracking.SWEEP_TAG: "s"}).info.run_id
    run_id = _configuration(client, exp, parent, "c0", [
        ({"val_ece": 0.02, "val_accuracy": 0.90}, "complete"),
        ({"val_ece": 0.04, "val_accuracy": 0.80}, "complete"),
        ({"val_ece": 0.09, "val_accuracy": 0.85}, "complete"),
        ({}, "error"),  # a seed that failed only lowers n_seeds
    ])
    line = tracking.summarize_configuration(client, exp, run_id)
    run = client.get_run(run_id)
    m = run.data.metrics
    # ECE 0.02, 0.04, 0.09: mean 0.05; deviations -0.03, -0.01, 0.04, sum of squares 0.0026,
    # sample variance 0.0013, SEM sqrt(0.0013 / 3) = 0.0208167
    assert m["val_ece"] == pytest.approx(0.05)
    assert m["val_ece_mean"] == pytest.approx(0.05)
    assert m["val_ece_sem"] == pytest.approx(math.sqrt(0.0013 / 3), rel=1e-9)
    # accuracy 0.90, 0.80, 0.85: mean 0.85, sample std 0.05, SEM 0.05 / sqrt(3)
    assert m["val_accuracy_sem"] == pytest.approx(0.05 / math.sqrt(3), rel=1e-9)
    assert m["n_seeds"] == 3
    assert run.info.status == "FINISHED"
    assert run.data.tags[tracking.COMPLETE_TAG] == "true"
    assert run.data.tags[tracking.SEEDS_TAG] == "3/4"
    assert "3/4 seeds complete" in line
    assert "val acc 85.00% ± 2.89" in line


def test_seeds_stopped_early_are_left_out_and_a_diverged_seed_spoils(tmp_path):
    client, exp = _store(tmp_path)
    parent = client.create_run(exp, run_name="s", tags={tracking.SWEEP_TAG: "s"}).info.run_id
    asha = _configuration(client, exp, parent, "c0", [
        ({"val_ece": 0.02, "val_accuracy": 0.9}, "complete"),
        ({"val_ece": 0.01, "val_accuracy": 0.5}, "stopped_early")])
    tracking.summarize_configuration(client, exp, asha)
    run = client.get_run(asha)
    assert run.data.tags[tracking.COMPLETE_TAG] == "true"
    assert run.data.tags[tracking.SEEDS_TAG] == "1/2"
    assert run.data.metrics["val_ece"] == pytest.approx(0.02)  # the complete seed only
    assert "val_ece_sem" not in run.data.metrics  # one complete seed: no SEM
    unstable = _configuration(client, exp, parent, "c1", [
        ({"val_ece": 0.02, "val_accuracy": 0.9}, "complete"),
        ({}, "diverged")])
    tracking.summarize_configuration(client, exp, unstable)
    run = client.get_run(unstable)
    assert run.data.tags[tracking.COMPLETE_TAG] == "false"
    assert run.data.tags[tracking.OUTCOME_TAG] == "diverged"
    assert run.info.status == "FAILED"


def _summary_table():
    # three configurations (mean accuracy, mean ECE, ECE SEM):
    #   a: 0.950, 0.030, 0.020 -> mean + SEM 0.050
    #   b: 0.945, 0.035, 0.005 -> mean + SEM 0.040
    #   c: 0.900, 0.010, 0.001 -> outside the 0.01 tolerance of 0.95
    return pd.DataFrame({
        "trial": ["a", "b", "c"], "complete": [True] * 3, "method": ["ce"] * 3,
        "val_accuracy": [0.950, 0.945, 0.900], "val_accuracy_mean": [0.950, 0.945, 0.900],
        "val_accuracy_sem": [0.002, 0.002, 0.002],
        "val_ece": [0.030, 0.035, 0.010], "val_ece_mean": [0.030, 0.035, 0.010],
        "val_ece_sem": [0.020, 0.005, 0.001], "n_seeds": [3, 3, 3]})


def test_mean_and_robust_selection_on_a_hand_made_table():
    table = _summary_table()
    mean = tracking.annotate_selection(table, tolerance=0.01)
    robust = tracking.annotate_selection(table, tolerance=0.01, selection="robust")
    # mean: a and b are within 0.01 of 0.95; a has the lower mean ECE (0.030 < 0.035)
    assert list(mean["selected"]) == [True, False, False]
    # robust: 0.035 + 0.005 = 0.040 < 0.030 + 0.020 = 0.050, so b
    assert list(robust["selected"]) == [False, True, False]
    assert list(robust["on_front"]) == list(mean["on_front"])  # the front is on means
    with pytest.raises(ValueError, match="--repeats 2"):
        tracking.annotate_selection(table.drop(columns=["val_ece_sem"]), tolerance=0.01,
                                    selection="robust")


def test_finalize_a_repeated_sweep(tmp_path):
    client, exp = _store(tmp_path)
    parent = client.create_run(exp, run_name="s", tags={tracking.SWEEP_TAG: "s"}).info.run_id
    tracking.log_params(client, parent, {"repeats": 2, "selection": "robust"})
    seeds = {  # (val acc, val ECE) per seed; means and SEMs are those of _summary_table's a, b
        "a": [(0.952, 0.010), (0.948, 0.050)],  # ECE mean 0.030, SEM |0.05 - 0.01| / 2 = 0.020
        "b": [(0.947, 0.030), (0.943, 0.040)],  # ECE mean 0.035, SEM 0.005
    }
    for name, values in seeds.items():
        _configuration(client, exp, parent, name, [
            ({"val_accuracy": a, "val_ece": e, "test_accuracy": a, "test_ece": e}, "complete")
            for a, e in values])
    frame = tracking.finalize_sweep(client, parent, tolerance=0.01, selection="robust")
    assert list(frame["trial"]) == ["a", "b"]
    assert list(frame["selected"]) == [False, True]
    assert frame["val_ece_sem"].to_numpy() == pytest.approx([0.020, 0.005])
    d = tmp_path / "artifacts"
    d.mkdir()
    for name in ("trials.parquet", "seeds.parquet", "pareto.png"):
        client.download_artifacts(parent, name, str(d))
    trials = pq.read_table(d / "trials.parquet").to_pandas()
    for col in ("val_ece_mean", "val_ece_sem", "val_accuracy_mean", "test_ece_sem", "n_seeds"):
        assert col in trials, col
    per_seed = pq.read_table(d / "seeds.parquet").to_pandas()
    assert len(per_seed) == 4
    assert set(per_seed["trial"]) == {"a", "b"}
    assert "error bars" in Image.open(d / "pareto.png").text["Description"]
    assert client.get_run(parent).data.tags["raysearch.selected_run"] == frame["run_id"][1]


def test_error_bars_are_drawn(tmp_path):
    args = ([0.95, 0.90], [0.03, 0.02], [True, True])
    plain = plots.pareto_plot(*args, tmp_path / "plain.png")
    bars = plots.pareto_plot(*args, tmp_path / "bars.png", accuracy_sem=[0.01, 0.01],
                             ece_sem=[0.005, 0.005])
    a = np.asarray(Image.open(plain).convert("L"), dtype=float)
    b = np.asarray(Image.open(bars).convert("L"), dtype=float)
    assert a.shape == b.shape
    assert (np.abs(a - b) > 30).sum() > 200  # the bars' pixels
    assert "error bars" not in Image.open(plain).text["Description"]
    assert "±1 SEM error bars" in Image.open(bars).text["Description"]
