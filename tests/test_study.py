"""The sweep's Optuna study in a journal file: where it lives, what it holds, its importances."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from raysearch.cli.commands import main
from raysearch.tune import study as sweep_study
from raysearch.tune.engine import CompletedOnlyOptunaSearch, run_sweep
from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import SearchSpace, load_space

SEARCHED = {"margin", "lr"}


def test_a_sqlite_store_gets_the_journal_beside_it(tmp_path):
    assert sweep_study.optuna_storage_url("sqlite:////data/runs/m.db", "/elsewhere/ray") == \
        "/data/runs/optuna.log"


def test_a_relative_sqlite_store_is_taken_against_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert sweep_study.optuna_storage_url("sqlite:///sub/mlruns.db", "/elsewhere/ray") == \
        f"{tmp_path.resolve()}/sub/optuna.log"


def test_a_tracking_server_puts_the_study_under_the_storage_path(tmp_path, monkeypatch):
    assert sweep_study.optuna_storage_url("http://127.0.0.1:5000", "/data/ray") == \
        "/data/ray/optuna.log"
    assert sweep_study.optuna_storage_url("https://mlflow.example.org", "file:///data/ray") == \
        "/data/ray/optuna.log"
    # remote Tune storage: the journal is a local file, in the current directory
    monkeypatch.chdir(tmp_path)
    assert sweep_study.optuna_storage_url("http://127.0.0.1:5000", "s3://bucket/ray") == \
        f"{tmp_path.resolve()}/optuna.log"


def test_optuna_storage_given_wins_and_never_holds_a_password(tmp_path, monkeypatch):
    # a team's database (tests/test_team_store.py runs sweeps against a real one)
    url = "postgresql://alice@db.internal:5432/optuna"
    assert sweep_study.optuna_storage_url("http://127.0.0.1:5000", "s3://bucket/ray", url) == url
    # a journal file of one's choosing (an NFS mount), made absolute
    monkeypatch.chdir(tmp_path)
    assert sweep_study.optuna_storage_url("sqlite:////data/m.db", "/data/ray", "shared/o.log") \
        == f"{tmp_path.resolve()}/shared/o.log"
    with pytest.raises(ValueError, match=r"postgresql://alice:\*\*\*@db\.internal:5432/optuna "
                                         r"holds a password") as caught:
        sweep_study.optuna_storage_url("http://127.0.0.1:5000", "/data/ray",
                                       "postgresql://alice:s3cret@db.internal:5432/optuna")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_study_name_is_taken_once_per_storage(tmp_path, kind):
    # a journal file for new sweeps; the SQLite URL older sweeps recorded still opens
    url = str(tmp_path / "optuna.log") if kind == "journal" else f"sqlite:///{tmp_path / 'o.db'}"
    storage = sweep_study.create_sweep_study(url, "s1", ["val_accuracy", "val_ece"], ["max", "min"])
    assert isinstance(storage, optuna.storages.JournalStorage if kind == "journal"
                      else optuna.storages.RDBStorage)
    study = optuna.load_study(study_name="s1", storage=storage)
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE,
                                optuna.study.StudyDirection.MINIMIZE]
    assert study.metric_names == ["val_accuracy", "val_ece"]
    sweep_study.check_new_study(url, "s2")  # another name is free
    with pytest.raises(ValueError, match="already holds a study named 's1'"):
        sweep_study.check_new_study(url, "s1")
    missing = tmp_path / "missing" / "dir" / "optuna.log"
    with pytest.raises(ValueError, match="cannot open the Optuna storage"):
        sweep_study.open_storage(str(missing) if kind == "journal" else f"sqlite:///{missing}")


def test_importances_need_two_complete_trials(tmp_path):
    url = str(tmp_path / "optuna.log")
    storage = sweep_study.create_sweep_study(url, "s", "val_ece", "min")
    study = optuna.load_study(study_name="s", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    with pytest.raises(ValueError, match="has 1 complete trials; .* at least 2"):
        sweep_study.param_importances(study)
    # y does not change the objective (x**2): fANOVA gives it (almost) nothing; the
    # importances of one objective sum to 1
    study.optimize(lambda t: t.suggest_float("x", 0, 1) ** 2 + 0 * t.suggest_float("y", 0, 1),
                   n_trials=12)
    table = sweep_study.param_importances(study)
    assert list(table) == ["val_ece"]
    assert math.fsum(table["val_ece"].values()) == pytest.approx(1.0)
    assert table["val_ece"]["x"] > 0.9


def _x_space(trial: optuna.Trial) -> None:
    trial.suggest_float("x", 0.0, 1.0)


def test_a_restored_searcher_goes_on_with_the_same_study(tmp_path):
    # what `sweep --resume` does: Tune pickles the searcher (OptunaSearch.save) and a restored
    # copy (OptunaSearch.restore) tells the trials that were running to the study in the file
    url = str(tmp_path / "optuna.log")

    def searcher():
        return CompletedOnlyOptunaSearch(
            space=_x_space, metric="val_ece", mode="min", study_name="s",
            sampler=optuna.samplers.RandomSampler(seed=0),
            storage=sweep_study.create_sweep_study(url, "s", "val_ece", "min"))

    first = searcher()
    x1 = first.suggest("t1")["x"]
    first.on_trial_complete("t1", {"val_ece": 0.25, "completed": True})
    x2 = first.suggest("t2")["x"]  # running when the driver stopped
    first.save(str(tmp_path / "searcher.pkl"))
    first.suggest("t-lost")  # asked after Tune's last snapshot: the restored copy never knew it
    del first

    restored = CompletedOnlyOptunaSearch(space=_x_space, metric="val_ece", mode="min")
    restored.restore(str(tmp_path / "searcher.pkl"))
    restored.on_trial_complete("t2", {"val_ece": 0.125, "completed": True})
    x3 = restored.suggest("t3")["x"]
    restored.on_trial_complete("t3", {"val_ece": 0.5, "completed": True})

    # once the resumed sweep ended, the lost ask is ended FAIL (it would stay RUNNING)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    parent = client.create_run(client.create_experiment("e"), tags={
        sweep_study.STORAGE_TAG: url, sweep_study.STUDY_TAG: "s"})
    assert sweep_study.fail_stale_trials(parent) == 1
    study = optuna.load_study(study_name="s", storage=sweep_study.open_storage(url))
    assert [(t.number, t.state.name, t.value, t.params["x"]) for t in study.trials[:2]] == [
        (0, "COMPLETE", 0.25, x1), (1, "COMPLETE", 0.125, x2)]
    assert [t.state.name for t in study.trials[2:]] == ["FAIL", "COMPLETE"]
    assert (study.trials[3].value, study.trials[3].params["x"]) == (0.5, x3)
    assert study.best_value == 0.125


def _two_param_acls() -> SearchSpace:
    """The bundled acls space with only the margin and the learning rate searched."""
    spec = load_space("acls").to_dict()
    spec["name"] = "acls2"
    spec["branches"]["acls"]["lambda1"] = {"kind": "fixed", "value": 0.1}
    spec["branches"]["acls"]["lambda2"] = {"kind": "fixed", "value": 0.01}
    return SearchSpace.from_dict(spec)


@pytest.mark.integration
def test_a_sweep_keeps_its_study_beside_the_mlflow_store(ray_session, tmp_path, monkeypatch):
    from raysearch.tracking import export

    def read_back(*args, **kwargs):
        raise AssertionError("the end of the sweep read its runs back from the store")

    # the end selects on the table the sweep's callback kept: no run is read back
    monkeypatch.setattr(export, "_read_table", read_back)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    settings = SweepSettings(num_samples=4, max_concurrent=2, epochs=1, posthoc=(), seed=0,
                             name="study-e2e", storage_path=str(tmp_path / "ray"),
                             tracking_uri=uri)
    import gc

    unfrozen = gc.get_freeze_count()
    frozen: list[int] = []  # the freeze count as each progress line is said
    result = run_sweep(_two_param_acls(), settings,
                       progress=lambda line: frozen.append(gc.get_freeze_count()))
    # the heap is frozen from the first line (said after the data are prepared, before any
    # MLflow write) to the last, and given back when the sweep returns (engine.frozen_heap)
    assert len(frozen) >= 3
    assert min(frozen) > unfrozen
    assert gc.get_freeze_count() == unfrozen
    url = str(tmp_path / "optuna.log")
    assert (tmp_path / "optuna.log").is_file()
    parent = MlflowClient(uri).get_run(result.parent_run_id)
    assert parent.data.tags[sweep_study.STORAGE_TAG] == url
    assert parent.data.tags[sweep_study.STUDY_TAG] == "study-e2e"

    # ... and that table is the one the store holds (values and dtypes; columns in any order)
    import pandas as pd

    from raysearch.tracking.sweeps import sweep_trials

    stored = sweep_trials(MlflowClient(uri), MlflowClient(uri).get_run(result.parent_run_id))
    pd.testing.assert_frame_equal(result.trials.drop(columns=["on_front", "selected"]), stored,
                                  check_like=True)

    # Tune kept of each report the searched metrics only; the records and MLflow hold all
    from raysearch.tune.sync import read_trials, snapshot_trials

    tune_path = str(tmp_path / "ray" / "study-e2e")
    for trial in snapshot_trials(tune_path):
        assert {"val_accuracy", "val_ece", "completed"} <= set(trial.last_result)
        assert not {"val_nll", "test_ece", "train_loss"} & set(trial.last_result)
    assert all({"val_nll", "test_ece"} <= set(r.results[-1]) for r in read_trials(tune_path))
    assert result.trials["test_ece"].notna().all()
    assert result.trials["val_nll"].notna().all()

    study = optuna.load_study(study_name="study-e2e", storage=sweep_study.open_storage(url))
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == 4 == len(study.trials)
    assert all(set(t.params) == SEARCHED for t in trials)
    assert study.metric_names == ["val_accuracy", "val_ece"]
    # the study's trials are the sweep's: same margins, same objective values as MLflow's
    frame = result.trials
    assert sorted(t.params["margin"] for t in trials) == \
        pytest.approx(sorted(float(m) for m in frame["margin"]))
    assert sorted(t.values[1] for t in trials) == pytest.approx(sorted(frame["val_ece"]))

    out = CliRunner().invoke(main, ["report", "study-e2e", "--importance",
                                    "--tracking-uri", uri])
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert "over 4 complete trials" in lines[0]
    assert url in lines[0]
    assert lines[1].split() == ["parameter", "val_accuracy", "val_ece"]
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in lines[2:]}
    assert set(rows) == SEARCHED
    for col in range(2):  # each objective's importances sum to 1 (to the printed 3 decimals)
        assert sum(r[col] for r in rows.values()) == pytest.approx(1.0, abs=2e-3)

    # a sweep name taken in this storage by another experiment is refused before Ray starts
    again = SweepSettings(num_samples=1, epochs=1, posthoc=(), name="study-e2e",
                          experiment="other", storage_path=str(tmp_path / "ray"),
                          tracking_uri=uri)
    with pytest.raises(ValueError, match="already holds a study named 'study-e2e'"):
        run_sweep(_two_param_acls(), again, progress=lambda line: None)


def test_report_importance_of_a_sweep_without_study_is_one_line(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("raysearch")
    client.create_run(exp, run_name="old", tags={"raysearch.sweep": "old"})
    out = CliRunner().invoke(main, ["report", "old", "--importance", "--tracking-uri", uri])
    assert out.exit_code == 2
    assert "has no Optuna study recorded" in out.output
    assert len(out.output.strip().splitlines()) == 1
    assert not Path(tmp_path / "optuna.log").exists()
