"""How a trial reports to Tune: cadence of reports and checkpoints, and the epoch history.

:class:`~raysearch.tune.trial_reports.TrialReports` is driven with a plain collecting `send`
(what ``tune.report`` receives
in a trial), on real digits training: the epochs a report leaves out travel in the next one
(``epoch_history``), with the very metrics a report per epoch would have carried.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raysearch.config import RunConfig
from raysearch.training.records import COMPLETED, EPOCH_HISTORY, RELIABILITY_PLOT
from raysearch.tune.checkpoints import load_state
from raysearch.tune.drills import InjectedFault
from raysearch.tune.trial_options import TrialContext, TrialOptions
from raysearch.tune.trial_reports import TrialReports

EPOCHS = 5


def _reports(checkpoint_every, every_epoch=False, **extra):
    reports = []

    def send(metrics, files: Path | None = None, last: bool = False) -> bool:
        state = None
        names = []
        if files is not None:
            names = sorted(p.name for p in files.iterdir())
            state = load_state((files / "state.pt").read_bytes())
        reports.append({"metrics": metrics, "files": names, "state": state, "last": last})
        return True

    # no report for want of time: what is reported does not depend on the machine's speed
    options = TrialOptions(posthoc=(), checkpoint_every=checkpoint_every,
                           report_every_epoch=every_epoch, precision="fp32",
                           **{"report_seconds": 1e9, "checkpoint_seconds": 1e9, **extra})
    cfg = RunConfig(epochs=EPOCHS, seed=3)
    TrialReports(cfg, options, TrialContext(trial_id="t0"), send).run(torch.device("cpu"), 0)
    return reports


@pytest.fixture(scope="module")
def every_epoch():
    return _reports(1, every_epoch=True)


def _per_epoch(reports):
    """epoch -> metrics, from the reports' own epochs and their histories."""
    out = {}
    for r in reports:
        for entry in [*r["metrics"].get(EPOCH_HISTORY, []), r["metrics"]]:
            if "epoch" in entry:
                assert entry["epoch"] not in out, "an epoch was reported twice"
                out[entry["epoch"]] = {k: v for k, v in entry.items()
                                       if k.startswith(("train_", "val_"))}
    return out


def test_every_epoch_when_a_scheduler_needs_it(every_epoch):
    assert [r["metrics"]["epoch"] for r in every_epoch] == list(range(1, EPOCHS + 1))
    assert all(EPOCH_HISTORY not in r["metrics"] for r in every_epoch)
    assert all(r["files"] for r in every_epoch)  # checkpoint_every=1
    assert [r["state"]["epoch"] for r in every_epoch] == list(range(1, EPOCHS + 1))


def test_short_trial_reports_once_with_its_history(every_epoch):
    # time-based cadence with no time passing (a digits trial of a few seconds against the
    # default minute and 10 s): one report, its last, carrying epochs 1..4
    reports = _reports(None)
    assert len(reports) == 1
    final = reports[0]
    assert final["last"]
    assert final["metrics"][COMPLETED] is True
    assert [e["epoch"] for e in final["metrics"][EPOCH_HISTORY]] == list(range(1, EPOCHS))
    assert RELIABILITY_PLOT in final["files"]
    assert "state.pt" in final["files"]
    # the same numbers as a report per epoch (training is deterministic for a seed)
    assert _per_epoch(reports) == _per_epoch(every_epoch)


def test_checkpoint_every_n_epochs_reports_with_each_checkpoint(every_epoch):
    reports = _reports(2)
    assert [r["metrics"]["epoch"] for r in reports] == [2, 4, EPOCHS]
    assert [[e["epoch"] for e in r["metrics"].get(EPOCH_HISTORY, [])] for r in reports] == \
        [[1], [3], []]
    assert [r["state"]["epoch"] for r in reports] == [2, 4, EPOCHS]
    assert _per_epoch(reports) == _per_epoch(every_epoch)


def test_time_based_checkpoints():
    # checkpoint_every=None checkpoints once `checkpoint_seconds` of training passed: with 0
    # every epoch is due
    reports = _reports(None, checkpoint_seconds=0.0)
    assert [r["state"]["epoch"] for r in reports] == list(range(1, EPOCHS + 1))


def test_fault_drill_reports_its_epoch_first():
    reports = []

    def send(metrics, files=None, last=False):
        reports.append(metrics)
        return True

    options = TrialOptions(posthoc=(), precision="fp32", fault_epoch=3, report_seconds=1e9,
                           checkpoint_seconds=1e9)
    with pytest.raises(InjectedFault):
        TrialReports(RunConfig(epochs=EPOCHS), options, TrialContext(trial_id="t0"),
                     send).run(torch.device("cpu"), 0)
    assert [r["epoch"] for r in reports] == [3]
    assert [e["epoch"] for e in reports[0][EPOCH_HISTORY]] == [1, 2]
