"""A running trial's epochs reach MLflow in batches: at most one write per METRICS_EVERY_S
seconds, the last ones with the trial's end; every epoch once, stamped when it was reported."""

from __future__ import annotations

import time

import pytest
from mlflow.tracking import MlflowClient

EPOCHS = 4


def _sweep(tmp_path, name, every_s, wait, gap=0.05):
    from ray import tune

    from raysearch.tracking.own_sweep import SweepCallback

    def trainable(config):  # defined here: Ray pickles it by value
        """Reports EPOCHS epochs; each report says how many of its epochs the store held then."""
        from mlflow.tracking import MlflowClient
        from ray import tune

        client = MlflowClient(config["uri"])
        tid = tune.get_context().get_trial_id()

        def stored() -> int:
            runs = client.search_runs([config["experiment_id"]],
                                      f"tags.`raysearch.trial_id` = '{tid}'")
            return len(client.get_metric_history(runs[0].info.run_id, "val_accuracy")) \
                if runs else 0

        for epoch in range(1, EPOCHS + 1):
            seen = stored()
            deadline = time.monotonic() + 30.0
            # every report is sent at once: wait for the writer (its 0.25-s delay) to store the
            # epochs reported before this one
            while config["wait"] and seen < epoch - 1 and time.monotonic() < deadline:
                time.sleep(0.1)
                seen = stored()
            tune.report({"epoch": epoch, "val_accuracy": 0.5 + epoch / 100, "val_ece": 0.1 / epoch,
                         "train_loss": 1.0 / epoch, "train_stored_before": seen,
                         "completed": epoch == EPOCHS})
            # reports apart: each epoch has its own timestamp; with `gap` longer than the
            # writer's delay (0.25 s), an epoch sent when reported is stored before the next
            time.sleep(config["gap"])

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    callback = SweepCallback(name, tracking_uri=uri, progress=None)
    callback.METRICS_EVERY_S = every_s
    tune.Tuner(tune.with_resources(trainable, {"cpu": 1}),
               param_space={"uri": uri, "experiment_id": callback.experiment_id, "wait": wait,
                            "gap": gap, "x": tune.grid_search([0, 1])},
               tune_config=tune.TuneConfig(max_concurrent_trials=2),
               run_config=tune.RunConfig(name=name, storage_path=str(tmp_path / "ray"),
                                         verbose=0, callbacks=[callback])).fit()
    client = MlflowClient(uri)
    runs = client.search_runs([callback.experiment_id],
                              f"tags.`mlflow.parentRunId` = '{callback.parent_run_id}'")
    assert len(runs) == 2
    return client, runs


def _check_every_epoch_once(client, run):
    history = sorted(client.get_metric_history(run.info.run_id, "val_accuracy"),
                     key=lambda m: m.step)
    assert [m.step for m in history] == list(range(1, EPOCHS + 1))
    assert [m.value for m in history] == pytest.approx([0.5 + e / 100
                                                        for e in range(1, EPOCHS + 1)])
    stamps = [m.timestamp for m in history]
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == EPOCHS  # stamped as each was reported, not when sent
    assert run.data.tags["raysearch.outcome"] == "complete"
    assert run.info.status == "FINISHED"
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id,
                                                               "train_stored_before")}


@pytest.mark.integration
def test_short_epochs_reach_the_store_with_the_trials_end(ray_session, tmp_path):
    client, runs = _sweep(tmp_path, "held", every_s=3600.0, wait=False, gap=0.8)
    for run in runs:
        stored_before = _check_every_epoch_once(client, run)
        # nothing of the trial was written while it ran: all of it came with its end
        assert stored_before == {e: 0.0 for e in range(1, EPOCHS + 1)}


@pytest.mark.integration
def test_each_report_is_sent_when_the_last_write_is_old_enough(ray_session, tmp_path):
    client, runs = _sweep(tmp_path, "each", every_s=0.0, wait=True)
    for run in runs:
        stored_before = _check_every_epoch_once(client, run)
        # every epoch reported before one was in the store while the trial ran
        assert stored_before == {e: float(e - 1) for e in range(1, EPOCHS + 1)}
