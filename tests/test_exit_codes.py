"""A failed sweep says so: exit codes, the summary line, ``SweepResult.failed``, the API's error.

- ``raysearch sweep`` exits 0 when every trial completed, 3 when some failed, 4 when none
  completed, 5 when the trials ended while the tracking store was away, 130 on Ctrl-C; its last
  line counts the failed trials and names the most common error. Real sweeps (digits, 1 epoch,
  2 trials, one at a time) with a user's loss, by import string, that raises inside training
  (in a trial's Ray actor, with gradients on; never in the driver's checks);
- ``raysearch.sweep`` raises :class:`raysearch.NoTrialCompletedError` carrying the SweepResult;
- the summaries (the table, ``selected:``, ``report``, ``export``) show every searched value
  with its section and only those; progress lines carry the trial's number;
- ``raysearch train`` names a config's name that does not import before any version note;
  ``examples/own_trainable.py`` takes ``--address``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

import raysearch
from raysearch.cli.base import (
    EXIT_INTERRUPTED,
    EXIT_NONE_COMPLETED,
    EXIT_SOME_FAILED,
    EXIT_TRACKING_AWAY,
)
from raysearch.cli.commands import main, sweep_exit_code
from raysearch.tracking.progress import number_of, trial_line
from raysearch.tracking.reports import describe_trial, failure_line, pareto_table
from raysearch.tracking.searched import searched_values
from raysearch.tune.engine import SweepResult, TrackingUnavailableError
from raysearch.tune.outcome import FailedTrial
from raysearch.tune.spaces import space_from_dict

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "exitcode_losses"  # a name of this file's own: Ray's workers keep modules imported


def _result(complete: list[bool], failed: list[str] = (), interrupted: bool = False,
            **columns) -> SweepResult:
    frame = pd.DataFrame({"trial": [f"s-{i:03d}-ce" for i in range(len(complete))],
                          "complete": complete,
                          "outcome": ["complete" if c else "error" for c in complete],
                          **columns})
    return SweepResult("s", "p", "sqlite:///x.db", frame, None, 1.0, interrupted=interrupted,
                       failed=[FailedTrial(f"s-{i:03d}-ce", f"r{i}", "error", e)
                               for i, e in enumerate(failed)])


# ---------------------------------------------------------------------------------------------
# the codes and the summary line, on SweepResults made by hand

def test_each_ending_of_a_sweep_has_its_exit_code():
    assert sweep_exit_code(_result([True, True])) == 0
    assert sweep_exit_code(_result([True, False], ["RuntimeError: x"])) == EXIT_SOME_FAILED == 3
    assert sweep_exit_code(_result([False, False], ["E: a", "E: b"])) == EXIT_NONE_COMPLETED == 4
    assert sweep_exit_code(_result([])) == EXIT_NONE_COMPLETED  # no trial ran at all
    assert sweep_exit_code(_result([True, False], ["E: a"], interrupted=True)) == \
        EXIT_INTERRUPTED == 130
    assert EXIT_TRACKING_AWAY == 5


def test_the_summary_line_counts_the_trials_and_names_the_most_common_error():
    assert failure_line(_result([True, True])) == ""
    some = _result([True, False, False], ["RuntimeError: b", "RuntimeError: b"])
    assert failure_line(some) == ("sweep s: 1 of 3 trials completed, 2 failed; most common "
                                  "error (2 of 2): RuntimeError: b")
    none = _result([False, False, False], ["ValueError: a", "KeyError: c", "KeyError: c"])
    assert failure_line(none) == ("sweep s: none of 3 trials completed, 3 failed; most common "
                                  "error (2 of 3): KeyError: c")
    stopped = _result([True, False], outcome=["complete", "stopped_early"])
    assert failure_line(stopped) == "sweep s: 1 of 2 trials completed, 1 stopped early"
    long = failure_line(_result([False], ["E: " + "x" * 500]))
    assert len(long) < 300
    assert long.endswith("...")
    repeated = _result([True, True], ["E: a"], n_seeds=[2, 3])
    assert failure_line(repeated) == ("sweep s: 2 of 2 configurations completed, 1 seed trials "
                                      "failed; most common error (1 of 1): E: a")


def test_the_store_away_at_the_end_exits_5_with_its_one_line_not_2(monkeypatch, tmp_path):
    """The mapping of the CLI's sweep command; the outage itself: tests/test_faults.py (slow)."""
    import raysearch.tune.engine as engine

    def away(*args, **kwargs):
        raise TrackingUnavailableError("the sweep's trials ended but MLflow is away; `raysearch "
                                       "sync s` writes them to MLflow once it answers")

    monkeypatch.setattr(engine, "run_sweep", away)  # the engine's end, not Ray or MLflow
    out = CliRunner().invoke(main, ["sweep", "ce", "--tracking-uri",
                                    f"sqlite:///{tmp_path / 'm.db'}"])
    assert out.exit_code == EXIT_TRACKING_AWAY, out.output
    assert out.stderr.count("\n") == 1, out.stderr
    assert "`raysearch sync s`" in out.stderr, out.stderr


def test_sweep_help_documents_the_exit_codes():
    out = CliRunner().invoke(main, ["sweep", "--help"])
    assert out.exit_code == 0
    for code in ("0 ", "2 ", "3 ", "4 ", "5 ", "130 "):
        assert re.search(rf"^\s+{code}\s*\S", out.output, re.M), code
    assert "raysearch sync NAME" in out.output


# ---------------------------------------------------------------------------------------------
# searched values and progress lines

SPACE = {"method": "acls", "params": {"margin": {"low": 6.0, "high": 10.0}, "variant": "official"},
         "optimizer": {"weight_decay": {"low": 1e-5, "high": 1e-3, "log": True}},
         "model": {"hidden": {"low": 16, "high": 64}, "dropout": 0.1},
         "train": {"lr": {"low": 0.01, "high": 0.2, "log": True}, "momentum": 0.9, "epochs": 1}}


def test_the_summaries_show_every_searched_value_with_its_section_and_only_those():
    space = space_from_dict(SPACE, "s")
    searched = list(space.searched())
    config = space.resolve({"method": "acls", "margin": 7.25, "optimizer.weight_decay": 3e-4,
                            "model.hidden": 32, "lr": 0.05}).to_dict()
    assert searched_values(config, searched) == {
        "margin": 7.25, "optimizer.weight_decay": 3e-4, "model.hidden": 32,
        "optimizer.lr": 0.05}
    row = {"trial": "s-000-acls", "method": "acls", "config": json.dumps(config),
           "val_accuracy": 0.9, "val_ece": 0.02, "complete": True, "on_front": True,
           "selected": True}
    line = describe_trial(row, searched)
    assert line.startswith("s-000-acls acls margin=7.25 optimizer.lr=0.05 model.hidden=32 "
                           "optimizer.weight_decay=0.0003 | val acc 90.00%"), line
    for fixed in ("variant", "momentum", "dropout", "epochs"):
        assert fixed not in line
    table = pareto_table(pd.DataFrame([row]), searched=searched)
    assert "optimizer.weight_decay=0.0003" in table
    assert "momentum" not in table


def test_a_conditional_space_shows_the_trials_own_method_parameters():
    from raysearch.tune.spaces import load_space

    space = load_space("all")
    config = space.resolve({"method": "ls", "ls.epsilon": 0.1}).to_dict()
    assert searched_values(config, list(space.searched()) + ["lr"]) == {
        "epsilon": 0.1, "optimizer.lr": config["optimizer"]["lr"]}


def test_a_progress_line_carries_the_trials_number():
    assert number_of("sw-003-acls", "sw") == "003"
    assert number_of("sw-012-Poly1Loss-seed2", "sw") == "012 seed 2"
    line = trial_line("003", 4, 6, "acls   margin=7", {"val_accuracy": 0.95, "val_ece": 0.012,
                                                      "test_accuracy": 0.9, "test_ece": 0.02},
                      True, "3.1s, done")
    assert line == ("[trial 003, 4 of 6 done] acls   margin=7 val acc 95.00% ECE 1.20% | test "
                    "acc 90.00% ECE 2.00% (3.1s, done)")
    assert trial_line("001", 1, None, "h", {}, False, "x").startswith("[trial 001, 1 done] h")


# ---------------------------------------------------------------------------------------------
# train, the example

def test_train_names_a_name_that_does_not_import_before_any_version_note(tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the user's package is not
    doc = {"config": {"loss": {"name": "mycal_absent.losses:Poly1", "params": {}},
                      "data": {"name": "digits"}, "epochs": 1},
           "requires": {"packages": {"mycal_absent": "0.0.1"}, "imports": [
               "mycal_absent.losses:Poly1"]}}
    (tmp_path / "best.yaml").write_text(yaml.safe_dump(doc))
    out = CliRunner().invoke(main, ["train", "best.yaml", "--tracking-uri",
                                    f"sqlite:///{tmp_path / 'm.db'}"])
    assert out.exit_code == 2, out.output
    assert "note:" not in out.output, out.output
    assert out.stderr.startswith("error: "), out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "mycal_absent" in out.stderr
    assert not (tmp_path / "m.db").exists()


def test_the_own_trainable_example_takes_an_address():
    done = subprocess.run([sys.executable, str(REPO / "examples" / "own_trainable.py"),
                           "--help"], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "--address" in done.stdout
    source = (REPO / "examples" / "own_trainable.py").read_text()
    assert 'ray.init(address=args.address or "local")' in source  # never joins by default


# ---------------------------------------------------------------------------------------------
# real sweeps

LOSSES = '''
    import os
    import sys

    import torch
    import torch.nn.functional as F
    from torch import nn


    def _in_a_trial():
        """True in a trial's Ray actor (never in the driver's checks before Ray starts)."""
        ray = sys.modules.get("ray")
        return (ray is not None and ray.is_initialized()
                and ray.get_runtime_context().get_actor_id() is not None)


    class AlwaysFails(nn.Module):
        def __init__(self, scale=1.0):
            super().__init__()
            self.scale = scale

        def forward(self, logits, targets):
            if torch.is_grad_enabled() and _in_a_trial():
                raise RuntimeError("loss refused a training batch")
            return self.scale * F.cross_entropy(logits, targets)


    class FirstFails(AlwaysFails):
        """Fails in the first trial that trains (a flag file), completes in the others."""

        def forward(self, logits, targets):
            if torch.is_grad_enabled() and _in_a_trial() and not os.path.exists(FLAG):
                open(FLAG, "w").close()
                raise RuntimeError("the first trial fails")
            return self.scale * F.cross_entropy(logits, targets)
'''


@pytest.fixture(scope="module")
def user_code(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    source = textwrap.dedent(LOSSES) + f"\nFLAG = {str(root / 'first-failed')!r}\n"
    (root / PACKAGE / "losses.py").write_text(source)
    for loss in ("AlwaysFails", "FirstFails"):
        (root / f"{loss}.yaml").write_text(yaml.safe_dump({
            "method": f"{PACKAGE}.losses:{loss}", "params": {"scale": {"low": 0.5, "high": 2.0}},
            "optimizer": {"weight_decay": {"low": 1e-5, "high": 1e-3, "log": True}}}))
    return root


@pytest.fixture
def in_user_folder(user_code, monkeypatch):
    monkeypatch.chdir(user_code)
    monkeypatch.syspath_prepend(str(user_code))  # what the CLI adds (the cwd); undone after
    return user_code


def _sweep(root: Path, space: str, name: str) -> tuple[object, str]:
    uri = f"sqlite:///{root / 'mlruns.db'}"
    out = CliRunner().invoke(main, ["sweep", space, "-n", "2", "--max-concurrent", "1",
                                    "--epochs", "1", "--name", name, "--tracking-uri", uri,
                                    "--storage-path", str(root / "ray")])
    return out, uri


def _parent(uri: str, name: str):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("raysearch")
    (parent,) = client.search_runs([exp.experiment_id],
                                   filter_string=f"tags.`raysearch.sweep` = '{name}' and "
                                                 f"attributes.run_name = '{name}'")
    return client, parent


@pytest.mark.integration
def test_a_sweep_in_which_no_trial_completes_exits_4(ray_session, in_user_folder):
    out, uri = _sweep(in_user_folder, "AlwaysFails.yaml", "fail-all")
    assert out.exit_code == EXIT_NONE_COMPLETED, out.output + str(out.exception)
    last = out.output.rstrip().splitlines()[-1]
    assert last == ("sweep fail-all: none of 2 trials completed, 2 failed; most common error "
                    "(2 of 2): RuntimeError: loss refused a training batch"), out.output
    assert "no trial ran all its epochs: nothing selected" in out.output
    client, parent = _parent(uri, "fail-all")
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert "trials.parquet" in names
    assert parent.data.tags["raysearch.trials_complete"] == "0"


@pytest.mark.integration
def test_a_sweep_with_a_failed_trial_exits_3_and_keeps_the_completed_one(ray_session,
                                                                        in_user_folder):
    out, uri = _sweep(in_user_folder, "FirstFails.yaml", "fail-some")
    assert out.exit_code == EXIT_SOME_FAILED, out.output + str(out.exception)
    lines = out.output.rstrip().splitlines()
    assert lines[-1] == ("sweep fail-some: 1 of 2 trials completed, 1 failed; most common "
                         "error (1 of 1): RuntimeError: the first trial fails"), out.output
    progress = sorted(ln for ln in lines if ln.startswith("[trial "))
    assert re.match(r"\[trial 000, \d of 2 done\] FirstF.*\(.*FAILED: RuntimeError: the first "
                    r"trial fails\)$", progress[0]), progress
    for name in ("scale=", "optimizer.weight_decay=", "optimizer.lr="):  # searched, no other
        assert name in progress[0], progress
        assert name in progress[1], progress
    assert "momentum" not in progress[1], progress
    assert re.match(r"\[trial 001, \d of 2 done\] .* \(.*done\)", progress[1]), progress
    selected = next(ln for ln in lines if ln.startswith("selected: "))
    assert re.match(r"selected: fail-some-001-\S+ \S+ (\S+=\S+ ){3}\| val acc", selected), selected
    for name in ("scale=", "optimizer.weight_decay=", "optimizer.lr="):
        assert name in selected, selected
    assert "momentum" not in selected
    assert "batch_size" not in selected
    client, parent = _parent(uri, "fail-some")
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"trials.parquet", "pareto.png", "best_config.yaml"} <= names
    report = CliRunner().invoke(main, ["report", "fail-some", "--tracking-uri", uri])
    assert report.exit_code == 0, report.output
    assert "optimizer.weight_decay=" in report.output
    assert "momentum" not in report.output
    export = CliRunner().invoke(main, ["export", "fail-some", "-o",
                                       str(in_user_folder / "best.yaml"), "--tracking-uri", uri])
    assert export.exit_code == 0, export.output
    wrote = export.output.splitlines()[0]
    assert re.match(r"wrote \S+best.yaml: fail-some-001-\S+ \S+ (\S+=\S+ ){3}\| val acc",
                    wrote), wrote
    assert "optimizer.weight_decay=" in wrote
    assert "momentum" not in wrote


@pytest.mark.integration
def test_the_api_raises_no_trial_completed_with_the_result(ray_session, in_user_folder):
    space = {"params": {"scale": 1.0}, "train": {"epochs": 1}}
    with pytest.raises(raysearch.NoTrialCompletedError) as caught:
        raysearch.sweep(space, loss=f"{PACKAGE}.losses:AlwaysFails", num_samples=2,
                        max_concurrent=1, name="api-fail",
                        tracking_uri=f"sqlite:///{in_user_folder / 'api.db'}",
                        storage_path=str(in_user_folder / "ray"), progress=None)
    assert isinstance(caught.value, RuntimeError)
    result = caught.value.result
    assert isinstance(result, raysearch.SweepResult)
    assert result.completed == 0
    assert result.selected is None
    assert len(result.trials) == 2
    assert [(f.trial[:13], f.outcome, f.error) for f in result.failed] == [
        ("api-fail-000-", "error", "RuntimeError: loss refused a training batch"),
        ("api-fail-001-", "error", "RuntimeError: loss refused a training batch")]
    assert {f.run_id for f in result.failed} == set(result.trials["run_id"])
    assert str(caught.value).startswith("sweep api-fail: none of 2 trials completed, 2 failed")
