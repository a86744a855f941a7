"""The driver-side Ray Tune callback that records a sweep in MLflow.

:class:`MlflowSweepCallback` makes a child run per trial under the sweep's parent run (for
``--repeats``, a configuration run per sampled configuration with its seeds' runs below it),
logs each epoch's metrics, the test metrics and the artifacts, and adopts the runs of a resumed
sweep. The same record for a Tune trainable of the user's own is
:class:`raysearch.tracking.own_sweep.SweepCallback`.

Imports :mod:`raysearch.tracking.book`, :mod:`~raysearch.tracking.client`,
:mod:`~raysearch.tracking.sweeps`, :mod:`~raysearch.tracking.export` and
:mod:`~raysearch.tracking.trial_text`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from ray import tune

from raysearch.tracking.book import _BOOKS, _BOOKS_LOCK, _book_for, _SweepBook
from raysearch.tracking.client import (
    _numeric_metrics,
    last_step,
    log_dataset,
    log_epochs,
    log_files,
    log_params,
    log_reliability,
)
from raysearch.tracking.export import degenerate_line, warm_end_imports
from raysearch.tracking.live_table import LiveTable
from raysearch.tracking.progress import number_of, trial_line
from raysearch.tracking.runs import (
    COMPLETE_TAG,
    CONFIG_TAG,
    CONFIGURATION_TAG,
    ERROR_TAG,
    NODE_TAG,
    OUTCOME_TAG,
    PARENT_TAG,
    RECORDED_TAG,
    REPEATS_TAG,
    RETRIES_TAG,
    SEALED_OUTCOMES,
    SWEEP_TAG,
    TRIAL_TAG,
)
from raysearch.tracking.sweeps import summarize_configuration, sweep_runs
from raysearch.tracking.trial_text import describe, headline, trial_error
from raysearch.training.records import (
    ARTIFACT_FILES,
    COMPLETED,
    CONFIG_ID_KEY,
    DEGENERATE_CALIBRATORS,
    DIVERGED,
    EPOCH_HISTORY,
    RELIABILITY,
    RELIABILITY_PLOT,
    SEED_INDEX_KEY,
)

logger = logging.getLogger("raysearch.tracking")

#: Parent run id -> {trial id, or an adopted run's id: the trial's number in its run's name}
#: (``001``; ``002 seed 1`` for a seed run), which numbers its progress line. Shared by every
#: copy of a sweep's callback in this process, as its book is.
_NUMBERS: dict[str, dict[str, str]] = {}


class MlflowSweepCallback(tune.Callback):
    """Driver-side Tune callback: a child run per trial under the sweep's parent run.

    Params go with a trial's first metrics (or :data:`~raysearch.tracking.book.PARAMS_WAIT_S`
    after it started, if sooner), ``train_*``/``val_*`` metrics every epoch with
    ``step=epoch`` (and the time it was reported), the ``test_*`` metrics and a reliability
    diagram at the end. A running trial's epochs are written in batches, at most one every
    :attr:`METRICS_EVERY_S` seconds (an epoch longer than that is written when it is reported),
    the last ones with the trial's end tags: a 2-s trial of seven epochs costs the store one
    metrics request instead of eight. The child ends
    FINISHED (tag ``raysearch.complete`` says whether it ran all its epochs) or FAILED; the tag
    ``raysearch.outcome`` says why (``complete``, ``stopped_early``, ``diverged``, ``error``,
    ``interrupted``).

    **Faults.** A trial that Tune retries (``--max-failures``) keeps its one child run: the
    tag ``raysearch.retries`` counts the retries, ``raysearch.resumed_from_epoch`` names the
    checkpoint the last attempt started from, and epochs the retry trains again are not logged
    twice (a step is logged once). When a sweep is resumed (``raysearch sweep --resume``),
    :meth:`setup` adopts the existing child runs by their trial id: runs that had ended keep
    their records untouched, interrupted or failed ones are set RUNNING again when their trial
    restarts.

    The MLflow writes run in order on one background thread of the driver, so Tune's event loop
    (and the trials waiting on it after each ``tune.report``) never waits on the store; call
    :meth:`close` after ``Tuner.fit`` to flush them (``on_experiment_end`` flushes too).

    Args:
        client: MLflow client of the sweep's store.
        experiment_id: experiment holding the parent run.
        parent_run_id: the sweep's parent run.
        sweep_name: the sweep's name (prefix of child run names).
        configs: resolves a trial's config into its run config (``configs.resolve(config)``:
            :class:`raysearch.tune.spaces.TrialConfigs`, or a search space); its ``epochs``,
            when it has them, are the epochs of every trial.
        progress: called with one readable line per finished trial, one per retry, and with an
            epoch line for a running trial when its last line is at least
            :attr:`EPOCH_LINE_EVERY_S` seconds old (long epochs on real datasets; digits
            trials finish first).
        total: number of trials of the sweep (for the progress line).
        max_failures: retries Tune grants a failed trial (for the retry line).
        dataset: the sweep's :func:`dataset_record`, logged as each child run's dataset input.
        repeats: seeds per configuration (``--repeats``). With more than one, the child run of
            the parent is a *configuration run* per sampled configuration (its trial configs
            share ``_config_id``); each seed's trial gets its own run nested under it
            (``mlflow.parentRunId`` = the configuration run), and once all its seeds ended the
            configuration run gets the mean and SEM of every metric
            (:func:`summarize_configuration`).
    """

    #: Shortest gap (seconds) between two epoch lines of one running trial.
    EPOCH_LINE_EVERY_S = 30.0
    #: Shortest gap (seconds) between two metric writes of one running trial: a report at least
    #: this long after the trial's last write is sent at once with the epochs reported since
    #: (so an epoch longer than this reaches the store when it is reported); the last ones go
    #: with the trial's end, in the same request as its end tags.
    METRICS_EVERY_S = 5.0
    #: A trial counts as complete only when its last result says ``completed: True`` (what
    #: raysearch's trainable reports); False: unless it says ``completed: False``.
    requires_completed = True

    def __init__(self, client: MlflowClient, experiment_id: str, parent_run_id: str,
                 sweep_name: str, configs: Any,
                 progress: Callable[[str], None] | None = None, total: int | None = None,
                 max_failures: int = 0, dataset: dict[str, Any] | None = None,
                 repeats: int = 1):
        self.dataset = dataset
        self.repeats = repeats
        self.tracking_uri = client.tracking_uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.sweep_name = sweep_name
        self.configs = configs
        self.progress = progress
        self.total = total
        self.max_failures = max_failures
        self._client = client

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks with the experiment (tuner.pkl): the client and the book stay
        state = self.__dict__.copy()
        state.pop("_client", None)
        state.pop("_table", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client = None

    @property
    def client(self) -> MlflowClient:
        """Client of the sweep's store (recreated after unpickling)."""
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    @property
    def book(self) -> _SweepBook:
        """This process's bookkeeping of the sweep (shared by every copy of the callback)."""
        return _book_for(self.parent_run_id, self.client)

    @property
    def children(self) -> dict[str, str]:
        """Trial id -> child run id (complete once :meth:`close` returned)."""
        return self.book.children

    @property
    def numbers(self) -> dict[str, str]:
        """Trial id (or adopted run id) -> the trial's number, as its run's name has it."""
        return _NUMBERS.setdefault(self.parent_run_id, {})

    @property
    def finished(self) -> int:
        """Trials that ended so far (including those recorded before a resume)."""
        return self.book.finished

    def _submit(self, job: Callable[[], None], tid: str | None = None) -> None:
        self.book.submit(job, tid)

    def _send_held(self, book: _SweepBook, tid: str) -> None:
        """Queue one write of what trial `tid` holds (its epochs' metrics and tags), if any."""
        held = book.take(tid)
        book.sent[tid] = time.monotonic()
        if held:
            book.submit(lambda: log_epochs(self.client, book.children[tid], held.epochs,
                                           held.tags, held.times, held.params), tid)

    def close(self) -> None:
        """Wait until every queued MLflow write is done, then stop the writer thread."""
        with _BOOKS_LOCK:
            book = _BOOKS.pop(self.parent_run_id, None)
            _NUMBERS.pop(self.parent_run_id, None)
        if book is not None:
            for tid in list(book.held):
                self._send_held(book, tid)
            book.close()
            healthy = not (book.unrecorded or book.failed_writes or book.table.spoiled)
            self._table = book.table if healthy else None

    @property
    def table(self) -> LiveTable | None:
        """After :meth:`close`: the trials table this process wrote, when it stands for the store.

        None when a write was lost, the sweep adopted runs it did not create (a resume) or is
        repeated (``--repeats``): read the store then
        (:func:`~raysearch.tracking.sweeps.sweep_trials`).
        """
        return getattr(self, "_table", None)

    # -- Tune hooks (event loop thread) ------------------------------------------------------
    def setup(self, **info: Any) -> None:
        """Adopt the child runs the sweep already has (a resumed sweep); no-op on a new one."""
        book = self.book
        if book.adopted:
            return
        book.adopted = True
        runs = sweep_runs(self.client, self.experiment_id, self.parent_run_id)
        now = time.monotonic()
        for run in runs:  # configuration runs first (they are older than their seeds')
            gid = run.data.tags.get(CONFIGURATION_TAG)
            if gid and not run.data.tags.get(TRIAL_TAG):
                book.config_runs[gid] = run.info.run_id
                book.config_index[gid] = len(book.config_index)
        runs = [r for r in runs if r.data.tags.get(TRIAL_TAG)]
        book.table.spoiled = book.table.spoiled or bool(runs)  # rows it never saw
        for run in runs:
            tid = run.data.tags.get(TRIAL_TAG)
            book.count += 1
            book.children[tid] = run.info.run_id
            book.configs[tid] = run.data.tags.get(CONFIG_TAG, "")
            self.numbers[tid] = self.numbers[run.info.run_id] = number_of(
                run.info.run_name or "", self.sweep_name)
            if run.data.tags.get(CONFIGURATION_TAG):
                book.trial_gid[tid] = run.data.tags[CONFIGURATION_TAG]
            book.started[tid] = now
            book.retries[tid] = int(run.data.tags.get(RETRIES_TAG, 0))
            if run.data.tags.get(NODE_TAG):
                book.nodes[tid] = run.data.tags[NODE_TAG]
            outcome = run.data.tags.get(OUTCOME_TAG)
            if run.info.status == "FINISHED" or outcome in SEALED_OUTCOMES:
                book.sealed.add(tid)
                book.finished += 1
                if run.data.tags.get(CONFIGURATION_TAG):
                    config_run = run.data.tags.get(PARENT_TAG, "")
                    book.seeds_ended[config_run] = book.seeds_ended.get(config_run, 0) + 1
            else:
                book.steps[tid] = last_step(self.client, run.info.run_id)
                if run.info.status != "RUNNING":
                    book.reopen.add(tid)
        if runs and self.progress is not None:
            self.progress(f"resuming sweep {self.sweep_name}: {len(book.sealed)} trials already "
                          f"recorded as ended, {len(runs) - len(book.sealed)} to continue")

    def known_trials(self, trial_ids: set[str]) -> None:
        """The trial ids of a restored experiment (``Tuner.restore``): call after :meth:`setup`.

        Adopted unended runs of other trials are orphans: their trials started after Tune's
        last snapshot, so the restored searcher samples them again under new ids. A new trial
        whose configuration equals an orphan's takes over that run (see :meth:`_start`)
        instead of creating a second run for the same configuration.
        """
        book = self.book
        for tid in list(book.children):
            if tid not in trial_ids and tid not in book.sealed:
                run_id = book.children.pop(tid)
                book.orphans[run_id] = book.configs.get(tid, "")
                book.orphan_parents[run_id] = self._adopted_parent(run_id)
                book.started.pop(tid, None)
                book.reopen.discard(tid)

    def _adopted_parent(self, run_id: str) -> str:
        try:
            return self.client.get_run(run_id).data.tags.get(PARENT_TAG, "")
        except Exception:  # noqa: BLE001 (an unreadable run: no configuration to rejoin)
            return ""

    def _start(self, trial: Any) -> None:
        book = self.book
        tid = trial.trial_id
        if tid in book.started:
            if tid in book.reopen:
                book.reopen.discard(tid)
                self._submit(lambda: self._reopen(tid), tid)
            return
        book.started[tid] = time.monotonic()
        cfg_json, params, method = self.describe(trial.config)
        gid = trial.config.get(CONFIG_ID_KEY) if self.repeats > 1 else None
        orphan = next((r for r, c in book.orphans.items() if c == cfg_json), None)
        if orphan is not None:
            book.table.spoiled = True
            del book.orphans[orphan]
            book.children[tid] = orphan
            self.numbers[tid] = self.numbers.get(orphan, "?")
            book.steps[tid] = last_step(self.client, orphan)
            config_run = book.orphan_parents.pop(orphan, "")
            if gid is not None and gid not in book.config_runs and config_run \
                    and config_run != self.parent_run_id:
                # the restored searcher sampled this configuration again under a new id:
                # its seeds rejoin the configuration run they had
                book.config_runs[gid] = config_run
                book.config_index[gid] = len(book.config_index)

            if gid is not None and config_run:
                book.trial_gid[tid] = gid

            def claim() -> None:
                self.client.set_tag(orphan, TRIAL_TAG, tid)
                if gid is not None and book.config_runs.get(gid) == config_run:
                    self.client.set_tag(orphan, CONFIGURATION_TAG, gid)
                    self.client.set_tag(config_run, CONFIGURATION_TAG, gid)
                self._reopen(tid)

            self._submit(claim, tid)
            return
        if gid is not None:
            book.table.spoiled = True  # its rows are configuration runs
            self._start_seed(trial, tid, gid, cfg_json, params, method)
            return
        index = book.count
        book.count += 1
        self.numbers[tid] = f"{index:03d}"
        run_name = f"{self.sweep_name}-{index:03d}-{method}"
        book.table.start(tid, run_name, params, cfg_json)
        book.hold_params(tid, params)  # sent with the trial's first metrics (PARAMS_WAIT_S)

        def create() -> None:
            run = self.client.create_run(
                self.experiment_id, run_name=run_name,
                tags={PARENT_TAG: self.parent_run_id, SWEEP_TAG: self.sweep_name,
                      TRIAL_TAG: tid, CONFIG_TAG: cfg_json})
            book.children[tid], book.artifact_uris[tid] = run.info.run_id, run.info.artifact_uri
            if self.dataset:
                log_dataset(self.client, run.info.run_id, self.dataset)

        self._submit(create, tid)

    def _start_seed(self, trial: Any, tid: str, gid: str, cfg_json: str,
                    params: dict[str, Any], method: str) -> None:
        """A repeated sweep's trial: its run goes under its configuration's run (made once)."""
        book = self.book
        seed_index = trial.config.get(SEED_INDEX_KEY, 0)
        if gid not in book.config_index:
            number = book.config_index[gid] = len(book.config_index)
            base = {k: v for k, v in trial.config.items() if k != SEED_INDEX_KEY}
            base_json, base_params, _ = self.describe(base)

            def create_configuration() -> None:
                run = self.client.create_run(
                    self.experiment_id, run_name=f"{self.sweep_name}-{number:03d}-{method}",
                    tags={PARENT_TAG: self.parent_run_id, SWEEP_TAG: self.sweep_name,
                          CONFIGURATION_TAG: gid, CONFIG_TAG: base_json,
                          REPEATS_TAG: str(self.repeats)})
                book.config_runs[gid] = run.info.run_id
                log_params(self.client, run.info.run_id, {**base_params,
                                                          "repeats": self.repeats})
                if self.dataset:
                    log_dataset(self.client, run.info.run_id, self.dataset)

            self._submit(create_configuration)
        number = book.config_index[gid]
        book.count += 1
        book.trial_gid[tid] = gid
        self.numbers[tid] = f"{number:03d} seed {seed_index}"
        book.hold_params(tid, {**params, "seed_index": seed_index})

        def create() -> None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"{self.sweep_name}-{number:03d}-{method}-seed{seed_index}",
                tags={PARENT_TAG: book.config_runs[gid], SWEEP_TAG: self.sweep_name,
                      TRIAL_TAG: tid, CONFIG_TAG: cfg_json, CONFIGURATION_TAG: gid})
            book.children[tid], book.artifact_uris[tid] = run.info.run_id, run.info.artifact_uri
            if self.dataset:
                log_dataset(self.client, run.info.run_id, self.dataset)

        self._submit(create, tid)

    def _seed_ended(self, tid: str) -> None:
        """Writer thread, after a seed run ended: summarise its configuration once all did."""
        book = self.book
        run_id = book.children.get(tid)
        config_run = book.config_runs.get(book.trial_gid.get(tid, ""))
        if run_id is None or config_run is None:
            return
        book.seeds_ended[config_run] = book.seeds_ended.get(config_run, 0) + 1
        if book.seeds_ended[config_run] >= self.repeats:
            line = summarize_configuration(self.client, self.experiment_id, config_run)
            if line and self.progress is not None:
                self.progress(line)

    def describe(self, config: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
        """(config JSON, MLflow params, short method name) of a trial config.

        See :func:`raysearch.tracking.trial_text.describe`.
        """
        return describe(self.configs, config)

    def headline(self, config: dict[str, Any]) -> str:
        """The method and hyperparameters of a trial, for its progress line (:func:`headline`)."""
        return headline(self.configs, config, self.repeats)

    def _reopen(self, tid: str) -> None:
        run_id = self.book.children[tid]
        self.client.update_run(run_id, status="RUNNING")
        for tag in (ERROR_TAG, OUTCOME_TAG, COMPLETE_TAG, RECORDED_TAG):
            with contextlib.suppress(Exception):  # (absent tags)
                self.client.delete_tag(run_id, tag)

    def _recorded(self, tid: str) -> dict[str, str]:
        """Writer thread, as a run ends: its recorded tag, unless one of its writes was lost."""
        return {} if tid in self.book.unrecorded else {RECORDED_TAG: "true"}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:  # noqa: D102
        self._start(trial)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:  # noqa: D102
        for tid, p in self.book.take_due_params():  # a late first report: the params alone now
            self._submit(lambda t=tid, p=p: log_params(self.client, self.book.children[t], p), tid)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,  # noqa: D102
                        **info: Any) -> None:
        self._start(trial)
        tid = trial.trial_id
        book = self.book
        if tid in book.sealed:
            return
        tags = book.tag_changes(tid, result)
        # the last report in full: what Tune keeps of it may be only what its searcher reads
        book.last_results[tid] = {k: v for k, v in result.items() if k != EPOCH_HISTORY}
        # a report carries its own epoch and the unreported epochs before it (EPOCH_HISTORY)
        epochs = []
        for entry in [*result.get(EPOCH_HISTORY, ()), result]:
            metrics = _numeric_metrics(entry)
            step = int(entry.get("epoch", result.get("training_iteration", 0)))
            if metrics and step > book.steps.get(tid, 0):
                book.steps[tid] = step
                epochs.append((step, metrics))
                book.table.metrics(tid, metrics)
        book.hold(tid, epochs, tags)
        last_sent = book.sent.get(tid, book.started.get(tid, 0.0))
        if time.monotonic() - last_sent >= self.METRICS_EVERY_S:
            self._send_held(book, tid)
        if epochs:
            self._epoch_line(trial, *epochs[-1])

    def _epoch_line(self, trial: Any, epoch: int, metrics: dict[str, float]) -> None:
        now = time.monotonic()
        tid = trial.trial_id
        book = self.book
        last = book.last_line.get(tid, book.started.get(tid, now))
        if self.progress is None or now - last < self.EPOCH_LINE_EVERY_S:
            return
        if "val_accuracy" not in metrics or "val_ece" not in metrics:
            return
        book.last_line[tid] = now
        epochs = getattr(self.configs, "epochs", None) or trial.config.get("epochs", "?")
        self.progress(f"  {tid} epoch {epoch}/{epochs}: val acc "
                      f"{100 * metrics['val_accuracy']:.2f}% ECE {100 * metrics['val_ece']:.2f}%"
                      f" ({now - book.started.get(tid, now):.0f}s)")

    def on_trial_recover(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                         **info: Any) -> None:
        self._start(trial)
        tid = trial.trial_id
        book = self.book
        book.retries[tid] = book.retries.get(tid, 0) + 1
        count = book.retries[tid]
        message = trial_error(trial)
        self._send_held(book, tid)
        self._submit(lambda: self._tag_retry(tid, count, message), tid)
        if self.progress is not None:
            self.progress(f"  {tid} failed ({message.splitlines()[-1][:160]}); retrying from its "
                          f"last checkpoint (retry {count} of {self.max_failures})")

    def _tag_retry(self, tid: str, count: int, message: str) -> None:
        run_id = self.book.children[tid]
        self.client.set_tag(run_id, RETRIES_TAG, str(count))
        self.client.set_tag(run_id, "raysearch.last_failure", message[:4000])

    def on_trial_complete(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                          **info: Any) -> None:
        self._start(trial)
        tid = trial.trial_id
        book = self.book
        result = self._last_result(trial)
        if tid in book.sealed:  # recorded before a resume (Tune's snapshot was older)
            return
        book.hold(tid, [], book.tag_changes(tid, result))
        if result.get(DIVERGED):
            self._fail(trial, str(result[DIVERGED]), result, outcome="diverged")
            return
        complete = bool(result.get(COMPLETED, not self.requires_completed))
        checkpoint = trial.checkpoint if complete else None
        held = book.take(tid)

        def finish() -> None:
            run_id = book.children[tid]
            log_epochs(self.client, run_id, held.epochs, {
                **held.tags, COMPLETE_TAG: str(complete).lower(),
                OUTCOME_TAG: "complete" if complete else "stopped_early", **self._recorded(tid)},
                held.times, held.params)
            drawn = False  # the trial draws its reliability diagram into its last checkpoint
            if checkpoint is not None:
                try:
                    with checkpoint.as_directory() as d:
                        files = [Path(d) / n for n in ARTIFACT_FILES if (Path(d) / n).is_file()]
                        log_files(self.client, run_id, files, book.artifact_uris.get(tid))
                        drawn = any(f.name == RELIABILITY_PLOT for f in files)
                except Exception as exc:  # never lose the run over an artifact
                    logger.warning("logits of %s not attached: %s", tid, exc)
            if complete and not drawn and isinstance(result.get(RELIABILITY), dict):
                title = f"{tid}  test ECE {100 * result.get('test_ece', float('nan')):.2f}%"
                try:
                    log_reliability(self.client, run_id, result[RELIABILITY], title)
                except Exception as exc:  # a plot must never lose the run
                    logger.warning("reliability diagram of %s failed: %s", tid, exc)
            self.client.set_terminated(run_id, "FINISHED")
            book.table.end(tid, run_id, status="FINISHED", complete=complete,
                           outcome="complete" if complete else "stopped_early")
            if tid in book.trial_gid:
                self._seed_ended(tid)
            book.release(tid)

        self._submit(finish, tid)
        self._report(trial, result, "done" if complete else "stopped early")
        if isinstance(result.get(DEGENERATE_CALIBRATORS), str):  # one line (tag: book.tag_changes)
            (self.progress or logger.warning)(degenerate_line(tid, result[DEGENERATE_CALIBRATORS]))

    def on_trial_error(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                       **info: Any) -> None:
        self._start(trial)
        self._fail(trial, trial_error(trial), self._last_result(trial), outcome="error")

    def _last_result(self, trial: Any) -> dict:
        """A trial's last report in full (Tune's ``trial.last_result`` may hold less of it).

        A sweep's Tuner keeps of each report only the metrics its searcher and scheduler read
        (:class:`raysearch.tune.lean_results.LeanResults`); this callback keeps the last one of
        each running trial until the trial ends.
        """
        kept = self.book.last_results.pop(trial.trial_id, None)
        return dict(kept if kept is not None else trial.last_result or {})

    def on_experiment_end(self, trials: list, **info: Any) -> None:  # noqa: D102
        book = self.book
        for tid in list(book.held):  # trials still running (the sweep was stopped)
            self._send_held(book, tid)
        book.flush()

    def _fail(self, trial: Any, message: str, result: dict, *, outcome: str) -> None:
        tid = trial.trial_id
        book = self.book
        held = book.take(tid)

        def fail() -> None:
            run_id = book.children[tid]
            log_epochs(self.client, run_id, held.epochs, {
                **held.tags, COMPLETE_TAG: "false", OUTCOME_TAG: outcome,
                ERROR_TAG: message[:4000], **self._recorded(tid)}, held.times, held.params)
            self.client.set_terminated(run_id, "FAILED")
            book.table.end(tid, run_id, status="FAILED", complete=False, outcome=outcome)
            if tid in book.trial_gid:
                self._seed_ended(tid)
            book.release(tid)

        self._submit(fail, tid)
        self._report(trial, result, f"FAILED: {message.splitlines()[-1][:160]}")

    def _report(self, trial: Any, result: dict, outcome: str) -> None:
        book = self.book
        book.finished += 1
        book.warm_end(self.total, warm_end_imports)
        if self.progress is None:
            return
        elapsed = time.monotonic() - book.started.get(trial.trial_id, time.monotonic())
        retries = book.retries.get(trial.trial_id, 0)
        if retries:
            outcome += f", after {retries} {'retry' if retries == 1 else 'retries'}"
        self.progress(trial_line(
            self.numbers.get(trial.trial_id, "?"), book.finished, self.total,
            self.headline(trial.config), result,
            bool(result.get(COMPLETED, not self.requires_completed)),
            f"{elapsed:.1f}s, {outcome}"))


