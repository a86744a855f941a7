"""Ray Tune keeps of each report only the metrics its searcher and scheduler read."""

from __future__ import annotations

import pytest

from raysearch.training.records import EPOCH_HISTORY
from raysearch.tune.lean_results import LeanResults, kept_metrics


def test_kept_metrics_are_the_searchers_and_the_schedulers():
    assert kept_metrics("val_ece") == {"val_ece"}
    assert kept_metrics(["val_accuracy", "val_ece"], "val_nll") == \
        {"val_accuracy", "val_ece", "val_nll"}
    assert kept_metrics("val_ece", None) == {"val_ece"}


def test_a_report_loses_the_metrics_nobody_reads_and_keeps_tunes_keys():
    result = {"training_iteration": 3, "time_total_s": 1.5, "config": {"x": 1}, "done": False,
              "trial_id": "a", "epoch": 3, "completed": True, "diverged": "",
              "val_ece": 0.1, "val_nll": 0.4, "train_loss": 1.0, "test_ece": 0.2,
              "shift_ece": 0.3, "test_reliability": {"edges": [0, 1]},
              EPOCH_HISTORY: [{"epoch": 2, "val_ece": 0.2}], 7: "not a str"}
    lean = dict(result)
    LeanResults({"val_ece"}).on_trial_result(0, [], None, lean)
    assert lean == {"training_iteration": 3, "time_total_s": 1.5, "config": {"x": 1},
                    "done": False, "trial_id": "a", "epoch": 3, "completed": True,
                    "diverged": "", "val_ece": 0.1, 7: "not a str"}
    # a sweep's: the report's copy of the trial's config goes too (Tune keeps Trial.config)
    LeanResults({"val_ece"}, keep_config=False).on_trial_result(0, [], None, result)
    assert result == {k: v for k, v in lean.items() if k != "config"}


@pytest.mark.integration
def test_tune_holds_the_searched_metric_and_the_records_hold_every_metric(ray_session, tmp_path):
    from ray import tune
    from ray.tune.logger import JsonLoggerCallback
    from ray.tune.schedulers import ASHAScheduler

    from raysearch.tune.sync import read_trials, snapshot_trials

    def many_metrics(config):  # two reports of ~80 metrics, as a raysearch trial's
        import tempfile
        from pathlib import Path

        for epoch in (1, 2):
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / "state.txt").write_text(str(epoch))
                tune.report({"epoch": epoch, "completed": epoch == 2,
                             **{f"val_m{i}": config["x"] + i / 100 + epoch for i in range(80)}},
                            checkpoint=tune.Checkpoint.from_directory(d))

    seen: list[dict] = []

    class Recorder(tune.Callback):  # a callback before LeanResults sees every report whole
        def on_trial_result(self, iteration, trials, trial, result, **info):
            seen.append(dict(result))

    def fit(callbacks, name):
        return tune.Tuner(
            many_metrics, param_space={"x": tune.grid_search([0.0, 10.0, 20.0])},
            tune_config=tune.TuneConfig(scheduler=ASHAScheduler(
                metric="val_m1", mode="max", grace_period=2, max_t=2)),
            run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0,
                                      callbacks=callbacks)).fit()

    lean = fit([JsonLoggerCallback(), Recorder(), LeanResults(kept_metrics("val_m0", "val_m1"))],
               "lean")
    sweep = fit([JsonLoggerCallback(), LeanResults({"val_m1"}, keep_config=False)], "sweep")
    fit([JsonLoggerCallback()], "full")  # the same trials with everything kept
    assert len(seen) == 6
    assert all(len([k for k in r if k.startswith("val_")]) == 80
                                  for r in seen)
    for result in lean:
        assert {k for k in result.metrics if k.startswith("val_")} == {"val_m0", "val_m1"}
        x = result.config["x"]
        assert result.metrics["val_m1"] == pytest.approx(x + 0.01 + 2)
        assert result.metrics["completed"] is True
    # every report whole in the trials' result.json, what the end of a sweep reads
    records = read_trials(str(tmp_path / "lean"))
    assert sorted(r.results[-1]["val_m79"] for r in records) == \
        pytest.approx([0.79 + 2, 10.79 + 2, 20.79 + 2])
    assert all(len(r.results) == 2 for r in records)
    # Tune's statistics of an ended trial (and their cached JSON): none, where Tune without
    # LeanResults keeps them for every numeric key of its reports
    for trial in snapshot_trials(str(tmp_path / "lean")):
        assert trial.status == "TERMINATED"
        assert trial.metric_analysis == {}
        assert trial.metric_n_steps == {}
        # and with its checkpoint: Tune's count to restart a retried trial from, no metrics
        kept = trial.latest_checkpoint_result.metrics
        assert kept["training_iteration"] == 2
        assert "time_total_s" in kept
        assert {k for k in kept if k.startswith("val_")} == {"val_m0", "val_m1"}
        assert kept["config"] == trial.config
    # without the report's config (a sweep's): Tune keeps its own, the reports have none
    assert all(result.config is None for result in sweep)
    assert sorted(r.metrics["val_m1"] for r in sweep) == pytest.approx([2.01, 12.01, 22.01])
    for trial in snapshot_trials(str(tmp_path / "sweep")):
        assert "config" not in trial.last_result
        assert "config" not in trial.latest_checkpoint_result.metrics
        assert trial.config["x"] == pytest.approx(trial.last_result["val_m1"] - 2.01)
    assert sorted(r.results[-1]["config"]["x"] for r in read_trials(str(tmp_path / "sweep"))) \
        == [0.0, 10.0, 20.0]  # result.json has every report whole
    for trial in snapshot_trials(str(tmp_path / "full")):
        assert "val_m79" in trial.latest_checkpoint_result.metrics
        assert "val_m79" in trial.metric_analysis
    lean_json = [len(t.run_metadata.get_json_state()) for t in snapshot_trials(
        str(tmp_path / "lean"))]
    full_json = [len(t.run_metadata.get_json_state()) for t in snapshot_trials(
        str(tmp_path / "full"))]
    assert max(lean_json) * 5 < min(full_json), (lean_json, full_json)
