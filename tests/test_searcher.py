"""Trials stopped early must never reach Optuna as COMPLETE (Ray reports them so today)."""

from __future__ import annotations

import json

import optuna
import pytest
from ray.tune.search.optuna import OptunaSearch

from raysearch.tune.searchers import CompletedOnlyOptunaSearch, make_sampler
from raysearch.tune.spaces import load_space

OBJ = {"metric": ["val_accuracy", "val_ece"], "mode": ["max", "min"]}


def _searcher(cls):
    return cls(space=load_space("acls").define_by_run, sampler=make_sampler("tpe", 0), **OBJ)


def test_plain_optuna_search_counts_partial_trials_as_complete():
    # the pitfall this project works around: a partial result is told as COMPLETE
    s = _searcher(OptunaSearch)
    s.suggest("partial")
    s.on_trial_complete("partial", {"val_accuracy": 0.99, "val_ece": 0.01})
    assert s._ot_study.trials[0].state == optuna.trial.TrialState.COMPLETE


def test_partial_trials_are_pruned_and_stay_off_optunas_front():
    s = _searcher(CompletedOnlyOptunaSearch)
    for tid in ("full", "partial", "failed", "diverged"):
        cfg = s.suggest(tid)
        assert cfg["method"] == "acls"
        assert 6.0 <= cfg["margin"] <= 10.0
    s.on_trial_complete("full", {"val_accuracy": 0.90, "val_ece": 0.05, "completed": True})
    # stopped by a scheduler after epoch 1: better-looking partial values, no `completed`
    s.on_trial_complete("partial", {"val_accuracy": 0.99, "val_ece": 0.01})
    s.on_trial_complete("failed", None, error=True)
    s.on_trial_complete("diverged", {"diverged": "training loss is nan", "completed": False})
    states = {t.number: t.state for t in s._ot_study.trials}
    assert states == {0: optuna.trial.TrialState.COMPLETE, 1: optuna.trial.TrialState.PRUNED,
                      2: optuna.trial.TrialState.FAIL, 3: optuna.trial.TrialState.FAIL}
    front = s._ot_study.best_trials
    assert [t.number for t in front] == [0]
    assert front[0].values == [0.90, 0.05]


def test_ended_trials_leave_the_searchers_memory_but_stay_in_the_study(tmp_path):
    s = _searcher(CompletedOnlyOptunaSearch)
    for i in range(6):
        s.suggest(f"t{i}")
    for i in range(5):
        s.on_trial_complete(f"t{i}", {"val_accuracy": 0.5 + i / 100, "val_ece": 0.1,
                                      "completed": True})
    assert set(s._ot_trials) == {"t5"}  # the running trial only
    assert len(s._ot_study.trials) == 6
    assert [t.state for t in s._ot_study.trials].count(optuna.trial.TrialState.COMPLETE) == 5
    s.on_trial_complete("t0", {"val_accuracy": 0.9, "val_ece": 0.0, "completed": True})
    assert s._ot_study.trials[0].values == [0.5, 0.1]  # a second completion changes nothing
    s.on_trial_result("t5", {"val_accuracy": 0.7, "val_ece": 0.2, "training_iteration": 1})
    s.on_trial_complete("t5", {"val_accuracy": 0.7, "val_ece": 0.2, "completed": True})
    assert s._ot_trials == {}
    assert s._ot_study.trials[5].values == [0.7, 0.2]
    # a searcher saved with a running trial (Tune's snapshot) and restored ends it in the study
    assert s.suggest("t6")["method"] == "acls"
    assert set(s._ot_trials) == {"t6"}
    s.save(str(tmp_path / "searcher.pkl"))
    again = _searcher(CompletedOnlyOptunaSearch)
    again.restore(str(tmp_path / "searcher.pkl"))
    again.on_trial_complete("t6", {"val_accuracy": 0.8, "val_ece": 0.3, "completed": True})
    assert again._ot_trials == {}
    assert again._ot_study.trials[6].values == [0.8, 0.3]


def test_max_failures_default_and_the_settings_record(monkeypatch):
    from raysearch.tune.settings import SweepSettings

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert SweepSettings().resolved_max_failures() == 0
    assert SweepSettings(address="local").resolved_max_failures() == 0
    assert SweepSettings(address="10.0.0.1:6379").resolved_max_failures() == 2
    assert SweepSettings(address="10.0.0.1:6379", max_failures=0).resolved_max_failures() == 0
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what Ray sets in a Ray Job
    assert SweepSettings().resolved_max_failures() == 2

    settings = SweepSettings(num_samples=3, posthoc=("ts", "ets"), max_failures=1, epochs=4)
    again = SweepSettings.from_record(json.loads(json.dumps(settings.to_record())))
    assert again == settings
    assert again.posthoc == ("ts", "ets")
    with pytest.raises(ValueError, match="max_failures"):
        SweepSettings(max_failures=-1)
