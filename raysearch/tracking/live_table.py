"""A sweep's trials table, built row by row as the sweep's callback records its trials.

The end of a sweep selects on the trials table (:func:`raysearch.tracking.finalize_sweep`), which
:func:`~raysearch.tracking.sweeps.sweep_trials` reads from the store: every child run with its
params, tags and last metrics, ~8 ms a run from an ``mlflow server`` (80 s for 10,000 trials).
The sweep's callback wrote all of it, so :class:`LiveTable` keeps each ended trial's row as
its last write succeeds: the same row ``sweep_trials`` builds from the run (run name and id,
trial id, status, ``complete``, ``outcome``, the params as the store returns them, the last
value of every metric, the config JSON). A row is kept as a tuple of values beside its
columns' names, which the rows share (~3 KiB a trial with ~90 columns).

The table stands for the store only while this process wrote every run of the sweep and every
write succeeded: a resumed sweep (runs adopted from the store), a lost write or a repeated
sweep (``--repeats``: the table's rows are configuration runs) mark it :attr:`LiveTable.spoiled`,
and the end reads the store instead.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from typing import Any

import pandas as pd

from raysearch.tracking.client import _param_text
from raysearch.tracking.reconcile import ENDED
from raysearch.tracking.sweeps import _coerce, trial_row


class LiveTable:
    """The trials table of the sweep a callback records, one row per trial whose run ended.

    Called from Tune's event loop (:meth:`start`, :meth:`metrics`) and from the callback's
    writer thread (:meth:`end`, after the run's last write).
    """

    def __init__(self) -> None:
        self.spoiled = False
        self._lock = threading.Lock()
        # running trials: their number (order of creation), run name, params, config JSON
        self._heads: dict[str, tuple[int, str, dict[str, Any], str]] = {}
        self._latest: dict[str, dict[str, float]] = {}
        self._rows: list[tuple[int, tuple[str, ...], tuple[Any, ...]]] = []
        self._columns: dict[tuple[str, ...], tuple[str, ...]] = {}  # one copy of each
        self._ended: set[str] = set()
        self._started = 0

    def start(self, tid: str, run_name: str, params: dict[str, Any], config_json: str) -> None:
        """Trial `tid`'s run was created with this name, these params and config."""
        params = {k: _coerce(_param_text(v)) for k, v in params.items()}
        self._heads[tid] = (self._started, run_name, params, config_json)
        self._started += 1
        self._latest[tid] = {}

    def metrics(self, tid: str, metrics: dict[str, float]) -> None:
        """Metrics of trial `tid` logged at a later step than any before (the latest values)."""
        latest = self._latest.get(tid)
        if latest is not None:
            latest.update(metrics)

    def end(self, tid: str, run_id: str, *, status: str, complete: bool, outcome: str) -> None:
        """Trial `tid`'s run ended with its last write done: its row joins the table."""
        head = self._heads.pop(tid, None)
        latest = self._latest.pop(tid, None)
        if head is None or latest is None:
            self.spoiled = True  # a run this table did not see start
            return
        number, run_name, params, config_json = head
        row = trial_row(run_name, run_id, tid, status, complete=complete, outcome=outcome,
                        params=params, metrics=latest, config=config_json)
        columns = tuple(row)
        with self._lock:
            self._ended.add(tid)
            self._rows.append((number, self._columns.setdefault(columns, columns),
                               tuple(row.values())))

    def drop(self, tid: str) -> None:
        """Forget running trial `tid` (its run is not this table's to describe)."""
        self._heads.pop(tid, None)
        self._latest.pop(tid, None)

    def ended_frame(self, trials: Iterable[Any]) -> pd.DataFrame | None:
        """:meth:`frame` of Tune's `trials` (``trial_id``, ``status``) when every one ended."""
        trials = list(trials)
        if not trials or any(t.status not in ENDED for t in trials):
            return None
        return self.frame(t.trial_id for t in trials)

    def frame(self, trial_ids: Iterable[str]) -> pd.DataFrame | None:
        """The table, when its rows are exactly the runs of `trial_ids` and nothing spoiled it.

        Args:
            trial_ids: the sweep's trials as Tune's records list them (every one ended).

        Returns:
            One row per trial, in the order their runs were created, as
            :func:`~raysearch.tracking.sweeps.sweep_trials` reads them from the store (the same
            values and dtypes; the params' and metrics' columns may come in another order), or
            None: read the store instead.
        """
        with self._lock:
            if self.spoiled or self._heads or not self._rows or set(trial_ids) != self._ended:
                return None
            rows = sorted(self._rows, key=lambda r: r[0])
        return _table(rows)


def _table(rows: list[tuple[int, tuple[str, ...], tuple[Any, ...]]]) -> pd.DataFrame:
    """The frame of `rows` that a list of their dicts makes, without making the dicts.

    The columns are those of the rows in order of first appearance, a row's missing column NaN
    (as pandas builds a frame from dicts); each row's values stay the tuple it is kept as, so
    the frame takes a few bytes a cell beyond its own (the dicts: ~7 KiB a row of ~90 columns).
    """
    union = list(dict.fromkeys(c for _, columns, _ in rows for c in columns))
    # a columns tuple -> its columns' places in `union` (None: the same columns, in order)
    spots: dict[tuple[str, ...], list[int] | None] = {}
    records = []
    for _, columns, values in rows:
        if columns not in spots:
            spots[columns] = None if list(columns) == union else [union.index(c)
                                                                   for c in columns]
        where = spots[columns]
        if where is None:
            records.append(values)
            continue
        record = [math.nan] * len(union)
        for place, value in zip(where, values, strict=True):
            record[place] = value
        records.append(record)
    return pd.DataFrame(records, columns=union)
