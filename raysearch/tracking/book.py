"""A sweep's child-run bookkeeping and its MLflow writer thread, one per driver process.

:class:`_SweepBook` holds what :class:`~raysearch.tracking.callback.MlflowSweepCallback` knows of
a sweep's child runs (trial id -> run id, epochs logged, retries, adopted and orphaned runs) and
runs the MLflow writes in order on one background thread; :func:`_book_for` gives every copy of a
sweep's callback in a process the same book (``_BOOKS``, keyed by the parent run id).

**A store that went away.** A write that fails after the MLflow client's own retries marks the
book *down* and its trial *unrecorded* (:attr:`_SweepBook.unrecorded`); while down, each queued
write first asks the store whether it answers (one quick request, no retries) and is dropped if
not, so a long outage costs the sweep no more than one client's retries, and the end of the
sweep does not wait for them again. Tune's own records hold everything dropped: ``raysearch
sync`` (run at the end of the sweep and by ``--resume``) writes it once the store answers.

It imports :mod:`raysearch.tracking.runs`, :mod:`~raysearch.tracking.live_table` and
:mod:`raysearch.training.records`;
:mod:`raysearch.tracking.callback` imports it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from mlflow.tracking import MlflowClient

from raysearch.tracking.live_table import LiveTable
from raysearch.tracking.runs import (
    DEGENERATE_TAG,
    NODE_KEY,
    NODE_TAG,
    RESUMED_TAG,
    SKIPPED_TAG,
    check_tracking_uri,
)
from raysearch.training.records import CHECKPOINT_SKIPPED, DEGENERATE_CALIBRATORS, RESUMED_FROM

logger = logging.getLogger("raysearch.tracking")

#: Seconds a queued write waits before the writer thread runs it (:meth:`_SweepBook.flush`
#: ends the wait). Tune's control loop queues a trial's last writes and its successor's first
#: ones while it hands a worker from one trial to the next; run at once, they held the driver's
#: GIL (SQLAlchemy, in this process for a SQLite store) and made that hand-off ~35 ms slower per
#: trial, ~4% of a sweep of 2-s trials on two cores (``benchmarks/sweep_overhead.py``).
WRITE_DELAY_S = 0.25

#: A trial's params go to its run with its first metrics (one request fewer per trial, ~10 ms
#: of the driver's CPU on a SQLite store), or on their own once they waited this many seconds
#: (:meth:`_SweepBook.take_due_params`): a trial with long epochs shows them as it starts.
PARAMS_WAIT_S = 5.0


class _SweepBook:
    """One sweep's child-run bookkeeping and its MLflow writer thread, one per driver process.

    Tune pickles callbacks with its state (``tuner.pkl``) and ``Tuner.restore`` brings back a
    copy; every copy of a sweep's :class:`MlflowSweepCallback` in a process shares this book
    (keyed by the parent run id), so the copy Tune calls and the one the driver flushes agree.
    """

    def __init__(self, client: MlflowClient) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.children: dict[str, str] = {}  # trial id -> run id (set by the writer thread)
        self.artifact_uris: dict[str, str] = {}  # running trial id -> its run's artifact URI
        self.started: dict[str, float] = {}
        self.last_line: dict[str, float] = {}
        self.nodes: dict[str, str] = {}  # trial id -> Ray node id its (rank-0) process ran on
        self.steps: dict[str, int] = {}  # trial id -> last epoch logged (no duplicate steps)
        self.last_results: dict[str, dict] = {}  # running trial id -> its last report
        # running trial id -> its epochs and tags not yet sent to the store (see `hold`), and
        # when it last sent some (monotonic seconds)
        self.held: dict[str, _Held] = {}
        self.sent: dict[str, float] = {}
        self.table = LiveTable()  # the ended trials' rows, as the store has them
        self.retries: dict[str, int] = {}
        self.resumed: dict[str, int] = {}  # trial id -> checkpoint epoch its attempt resumed
        self.sealed: set[str] = set()  # runs ended before a resume: left exactly as they are
        self.reopen: set[str] = set()  # runs to set RUNNING again when their trial restarts
        self.configs: dict[str, str] = {}  # trial id -> its RunConfig JSON (adopted runs)
        self.orphans: dict[str, str] = {}  # run id -> config JSON: trials Tune's snapshot lost
        self.count = 0  # child runs created or adopted (numbers the run names)
        # repeated sweeps (--repeats): configuration id -> its run id / its number
        self.config_runs: dict[str, str] = {}
        self.config_index: dict[str, int] = {}
        self.orphan_parents: dict[str, str] = {}  # orphaned seed run -> its configuration run
        self.seeds_ended: dict[str, int] = {}  # configuration run id -> seeds that ended
        self.trial_gid: dict[str, str] = {}  # a seed's trial id -> its configuration id
        self.finished = 0
        self.adopted = False
        self.warming: threading.Thread | None = None  # the end's imports (warm_end)
        self.unrecorded: set[str] = set()  # trial ids with a write that failed or was dropped
        self.failed_writes = 0
        self.down = False  # the last write failed: probe the store before the next one
        self.queue: queue.Queue = queue.Queue()
        self.hurry = threading.Event()  # set by flush(): queued writes run without waiting
        self.writer = threading.Thread(target=self._drain, name="raysearch-mlflow", daemon=True)
        self.writer.start()

    def _drain(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                job, tid, queued = item
                wait = queued + WRITE_DELAY_S - time.monotonic()
                if wait > 0:
                    self.hurry.wait(wait)
                if self.down and not self.answers():
                    self._lost(tid)  # dropped: Tune's records keep it for `raysearch sync`
                    continue
                job()
                self.down = False
            except Exception as exc:  # a failed write must not stop the sweep or later writes
                if not self.down:
                    logger.warning("MLflow write failed (`raysearch sync` writes what is "
                                   "missing once the store answers): %s",
                                   " ".join(str(exc).split())[:300])
                self.down = True
                self._lost(tid)
            finally:
                self.queue.task_done()

    def release(self, tid: str) -> None:
        """Drop what only a running trial needs: its epochs logged, node, checkpoint epoch, report.

        Called by the writer thread once trial `tid`'s run has its last record; what stays of
        the trial is its run id, start time and number (a few hundred bytes).
        """
        for kept in (self.steps, self.nodes, self.resumed, self.last_line, self.last_results,
                     self.sent, self.artifact_uris):
            kept.pop(tid, None)

    def tag_changes(self, tid: str, result: dict) -> dict[str, str]:
        """Tags to set: the node and the checkpoint epoch of `result` where they changed.

        And the line of a skipped unreadable checkpoint or of degenerate calibrators, when
        `result` carries one.
        """
        tags = {}
        for key, tag, seen, kind in ((NODE_KEY, NODE_TAG, self.nodes, str),
                                     (RESUMED_FROM, RESUMED_TAG, self.resumed, int)):
            value = result.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) or seen.get(tid) == value:
                continue
            seen[tid] = value
            tags[tag] = str(value)
        if isinstance(result.get(CHECKPOINT_SKIPPED), str):
            tags[SKIPPED_TAG] = result[CHECKPOINT_SKIPPED]
        if isinstance(result.get(DEGENERATE_CALIBRATORS), str):
            tags[DEGENERATE_TAG] = result[DEGENERATE_CALIBRATORS]
        return tags

    def hold(self, tid: str, epochs: list[tuple[int, dict[str, float]]],
             tags: dict[str, str]) -> None:
        """Keep trial `tid`'s reported `epochs` (stamped now) and `tags` until :meth:`take`."""
        held = self.held.setdefault(tid, _Held())
        now = int(time.time() * 1000)
        for epoch in epochs:
            held.epochs.append(epoch)
            held.times.append(now)
        held.tags.update(tags)

    def hold_params(self, tid: str, params: dict[str, Any]) -> None:
        """Keep trial `tid`'s params until :meth:`take` (its first write sends them)."""
        self.held.setdefault(tid, _Held()).params = params

    def take_due_params(self) -> list[tuple[str, dict[str, Any]]]:
        """``(trial id, params)`` of trials started :data:`PARAMS_WAIT_S` seconds ago or more.

        Those params are no longer held; the epochs and tags held beside them stay.
        """
        now, taken = time.monotonic(), []
        for tid, held in self.held.items():
            if held.params and now - self.started.get(tid, now) >= PARAMS_WAIT_S:
                taken.append((tid, held.params))
                held.params = {}
        return taken

    def take(self, tid: str) -> _Held:
        """What trial `tid` holds (:meth:`hold`), no longer held; empty when nothing is."""
        return self.held.pop(tid, None) or _Held()

    def warm_end(self, total: int | None, imports: Callable[[], None]) -> None:
        """Once all `total` trials started and one more ended, run `imports` on a thread, once.

        `imports` loads what the sweep's end draws with
        (:func:`~raysearch.tracking.export.warm_end_imports`); a worker is idle from then on
        (no trial is left to start), so they take no trial's CPU and the end does not wait.
        """
        if self.warming is not None or not total or len(self.started) < total:
            return

        def warm() -> None:
            with contextlib.suppress(Exception):  # the end imports them itself if this fails
                imports()

        self.warming = threading.Thread(target=warm, name="raysearch-warm", daemon=True)
        self.warming.start()

    def _lost(self, tid: str | None) -> None:
        self.failed_writes += 1
        if tid is not None:
            self.unrecorded.add(tid)

    def answers(self) -> bool:
        """True when the tracking store answers one quick request now (no client retries)."""
        try:
            check_tracking_uri(self.client.tracking_uri, timeout=2.0)
        except ValueError:
            return False
        return True

    def submit(self, job: Callable[[], None], tid: str | None = None) -> None:
        """Queue `job` (an MLflow write of trial `tid`, or of the sweep when None).

        The writer thread runs it :data:`WRITE_DELAY_S` seconds later at the earliest (at once
        during a :meth:`flush`), after the writes queued before it.
        """
        self.queue.put((job, tid, time.monotonic()))

    def flush(self) -> None:
        """Wait until every queued write is done (they run without their delay meanwhile)."""
        if self.writer.is_alive():
            self.hurry.set()
            try:
                self.queue.join()
            finally:
                self.hurry.clear()

    def close(self) -> None:
        if self.writer.is_alive():
            self.hurry.set()
            self.queue.put(None)
            self.writer.join()


class _Held:
    """A running trial's epochs (with when each was reported, ms), tags and params not yet sent."""

    __slots__ = ("epochs", "times", "tags", "params")

    def __init__(self) -> None:
        self.epochs: list[tuple[int, dict[str, float]]] = []
        self.times: list[int] = []
        self.tags: dict[str, str] = {}
        self.params: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return bool(self.epochs or self.tags or self.params)


_BOOKS: dict[str, _SweepBook] = {}
_BOOKS_LOCK = threading.Lock()


def _book_for(parent_run_id: str, client: MlflowClient) -> _SweepBook:
    with _BOOKS_LOCK:
        book = _BOOKS.get(parent_run_id)
        if book is None or not book.writer.is_alive():
            book = _BOOKS[parent_run_id] = _SweepBook(client)
        return book
