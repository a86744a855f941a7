"""The trials table a sweep's callback keeps is the one the store holds, so the end reads no run."""

from __future__ import annotations

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from raysearch.tracking.live_table import LiveTable


def test_a_table_stands_for_the_store_only_when_it_saw_every_trial_end():
    table = LiveTable()
    table.start("a", "s-000-ce", {"lr": 0.1, "note": "x" * 2000}, "{}")
    table.start("b", "s-001-ce", {"lr": "0.2"}, "{}")
    table.metrics("a", {"val_ece": 0.2, "val_accuracy": 0.5})
    table.metrics("a", {"val_ece": 0.1, "test_ece": 0.3})  # a later step: the latest values
    table.end("b", "rb", status="FAILED", complete=False, outcome="error")
    assert table.frame(["a", "b"]) is None  # "a" still runs
    table.end("a", "ra", status="FINISHED", complete=True, outcome="complete")
    assert table.frame(["a"]) is None  # Tune has a trial the table does not, or the reverse
    frame = table.frame(["b", "a"])
    assert list(frame["trial"]) == ["s-000-ce", "s-001-ce"]  # the order the runs were created
    assert list(frame["run_id"]) == ["ra", "rb"]
    row = frame.iloc[0]
    assert row["val_ece"] == 0.1
    assert row["val_accuracy"] == 0.5
    assert row["test_ece"] == 0.3
    assert row["lr"] == 0.1
    assert frame.iloc[1]["lr"] == 0.2
    assert len(row["note"]) == 1000
    assert row["note"].endswith("...")
    assert pd.isna(frame.iloc[1]["val_ece"])
    table.spoiled = True  # e.g. a resumed sweep adopted runs it never saw start
    assert table.frame(["a", "b"]) is None


@pytest.mark.integration
def test_a_sweep_of_ones_own_trainable_selects_on_the_table_its_callback_kept(
        ray_session, tmp_path, monkeypatch):
    from ray import tune

    from raysearch.tracking import export
    from raysearch.tracking.own_sweep import SweepCallback
    from raysearch.tracking.sweeps import sweep_trials

    def read_back(*args, **kwargs):
        raise AssertionError("the end of the sweep read its runs back from the store")

    monkeypatch.setattr(export, "_read_table", read_back)

    def trainable(config):  # one completes, one is stopped early, one fails in epoch 2
        for epoch in (1, 2):
            if config["x"] == 2 and epoch == 2:
                raise RuntimeError("out of memory")
            tune.report({"epoch": epoch, "val_accuracy": 0.5 + config["x"] / 10 + epoch / 100,
                         "val_ece": 0.1 / (1 + config["x"]) + epoch / 1000,
                         "train_loss": 1.0 / epoch, "completed": config["x"] != 1 or epoch < 2})

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    callback = SweepCallback("own-live", tracking_uri=uri, progress=None)
    tune.Tuner(trainable, param_space={"x": tune.grid_search([0, 1, 2]), "lr": 0.1},
               tune_config=tune.TuneConfig(max_concurrent_trials=2),
               run_config=tune.RunConfig(name="own-live", storage_path=str(tmp_path / "ray"),
                                         verbose=0, callbacks=[callback])).fit()
    frame = callback.trials
    assert len(frame) == 3
    assert sorted(frame["status"]) == ["FAILED", "FINISHED", "FINISHED"]
    assert sorted(frame["outcome"]) == ["complete", "error", "stopped_early"]
    client = MlflowClient(uri)
    stored = sweep_trials(client, client.get_run(callback.parent_run_id))
    pd.testing.assert_frame_equal(frame.drop(columns=["on_front", "selected"]), stored,
                                  check_like=True)
    assert frame["selected"].sum() == 1
    assert frame.loc[frame["selected"], "x"].item() == 0  # the only complete trial


def test_the_table_is_the_frame_its_rows_dicts_make():
    # rows kept as value tuples beside shared column tuples; a later row may lack a column
    # (NaN), add one (NaN in the rows before) or list them in another order: the frame has the
    # columns in order of first appearance and the dtypes pandas gives a list of the dicts
    import math

    from raysearch.tracking.live_table import _table

    a = ("trial", "lr", "batch_size", "val_ece", "complete", "outcome")
    b = ("trial", "batch_size", "complete", "outcome", "note")  # no lr, no val_ece; a note
    c = tuple(reversed(a))
    rows = [(0, a, ("t0", 0.1, 64, 0.05, True, "complete")),
            (1, b, ("t1", 32, False, "diverged", None)),
            (2, c, ("complete", True, math.nan, 128, 0.01, "t2")),
            (3, a, ("t3", 0.3, 16, 0.07, True, "complete")),
            (4, b, ("t4", 8, True, "complete", "kept"))]
    table = _table(rows)
    expected = pd.DataFrame([dict(zip(columns, values, strict=True))
                             for _, columns, values in rows])
    pd.testing.assert_frame_equal(table, expected)
    assert list(table.columns) == [*a, "note"]
    assert table["batch_size"].tolist() == [64, 32, 128, 16, 8]
    assert table["val_ece"].isna().tolist() == [False, True, True, False, True]
    assert table["note"].isna().tolist() == [True, True, True, True, False]
    assert table["note"].iloc[4] == "kept"
