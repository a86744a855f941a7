"""Reading a sweep back from the store: its runs, its trials table and the selection on it.

:func:`sweep_runs` and :func:`child_runs` (every run below a parent, all pages),
:func:`sweep_trials` and :func:`seed_trials` (one row per run), :func:`stored_trials` (the
former from the parent's ``trials.parquet`` while no run changed), :func:`summarize_configuration`
(a repeated sweep's configuration run: mean and SEM over its seeds), :func:`annotate_selection`
and :func:`load_sweep` (the Pareto front and the selected trial), :func:`write_parquet` and
:func:`trial_outputs` (a trial's stored logits).

Imports only :mod:`raysearch.tracking.client` of the package's tracking modules;
:mod:`~raysearch.tracking.export`, :mod:`~raysearch.tracking.callback` and
:mod:`raysearch.tracking` import it.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from mlflow.tracking import MlflowClient

from raysearch.config import SELECTIONS
from raysearch.metrics.selection import selection_table
from raysearch.tracking.client import log_epochs
from raysearch.tracking.runs import (
    COMPLETE_TAG,
    CONFIG_TAG,
    METRIC_PREFIXES,
    OUTCOME_TAG,
    PARENT_TAG,
    SEEDS_TAG,
    SWEEP_TAG,
    TABLE_TAG,
    TRIAL_TAG,
    find_sweep,
)
from raysearch.training.records import LOGITS_FILE


def _coerce(value: str) -> Any:
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def sweep_trials(client: MlflowClient, parent: Any, runs: list[Any] | None = None) -> pd.DataFrame:
    """One row per child run of a sweep: identifiers, status, params and final metrics.

    Columns: ``trial`` (run name), ``run_id``, ``trial_id``, ``status``, ``complete`` (bool: ran
    all its epochs), ``outcome`` (complete, stopped_early, diverged, error, interrupted), the
    params (numbers where they parse), every metric's last value (``val_*`` of the last epoch,
    ``test_*``), and ``config`` (the RunConfig as JSON).

    `runs`: the parent's child runs, oldest first, when the caller has just read them
    (:func:`child_runs` otherwise reads them).
    """
    rows = []
    if runs is None:
        runs = child_runs(client, parent.info.experiment_id, parent.info.run_id)
    for run in runs:
        tags = run.data.tags
        rows.append(trial_row(
            run.info.run_name, run.info.run_id, tags.get(TRIAL_TAG, ""), run.info.status,
            complete=tags.get(COMPLETE_TAG) == "true", outcome=tags.get(OUTCOME_TAG, ""),
            params={k: _coerce(v) for k, v in run.data.params.items()},
            metrics=run.data.metrics, config=tags.get(CONFIG_TAG, "{}")))
    return pd.DataFrame(rows)


def trial_row(name: str, run_id: str, trial_id: str, status: str, *, complete: bool,
              outcome: str, params: dict[str, Any], metrics: dict[str, float],
              config: str) -> dict[str, Any]:
    """One row of :func:`sweep_trials`.

    The run's name and ids, its status, ``complete`` and ``outcome``, its params (as parsed from
    the store's text), its last metrics and its config JSON, in that order.
    """
    return {"trial": name, "run_id": run_id, "trial_id": trial_id, "status": status,
            "complete": complete, "outcome": outcome, **params, **metrics, "config": config}


def sweep_runs(client: MlflowClient, experiment_id: str, parent_run_id: str,
               where: str = "") -> list[Any]:
    """Every run of a sweep below its parent (all pages), oldest first.

    Trial runs, and for ``--repeats`` the configuration runs and the seed runs under them.
    `where`: an MLflow filter clause the runs must also meet (``attributes.status =
    'FAILED'``), so that the server sends only those.
    """
    name = client.get_run(parent_run_id).data.tags.get(SWEEP_TAG, "")
    query = f"tags.`{SWEEP_TAG}` = '{name}'" + (f" and {where}" if where else "")
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=query,
                                  max_results=1000, page_token=token,
                                  order_by=["attributes.start_time ASC"])
        runs.extend(r for r in page if r.info.run_id != parent_run_id
                    and r.data.tags.get(PARENT_TAG))
        token = page.token
        if not token:
            return runs


#: Outcomes that make a configuration incomplete even when other seeds completed: one that
#: diverges on a seed is unstable. (A seed stopped early by ASHA, which compares trials, not
#: configurations, or one that failed with an error is left out of the mean.)
_SPOILING_OUTCOMES = ("diverged",)


def summarize_configuration(client: MlflowClient, experiment_id: str,
                            config_run_id: str) -> str:
    """Log a repeated sweep's configuration run: mean and SEM over its seeds, then end it.

    Every final metric (``train_*``, ``val_*``, ``test_*``, ``shift_*``) that all the complete
    seed runs hold is logged as ``{m}_mean``, ``{m}_sem`` (sample std / sqrt(n), for n >= 2;
    :func:`raysearch.metrics.repeats.sem`) and under its plain name ``{m}`` = the mean, so
    selection,
    ``report`` and ``export`` read a configuration run like a single trial's run; ``n_seeds``
    is the number of complete seeds. The run is complete (tag ``raysearch.complete``) when at
    least one seed completed and none diverged; a seed stopped early (``--scheduler asha``
    judges every seed's trial on its own) or failed with an error only lowers ``n_seeds``. It
    ends FINISHED (also when every seed was stopped early, as a trial run does), else FAILED
    (KILLED when a seed was interrupted).

    Returns:
        A one-line summary for the progress output (empty when the run has no seeds).
    """
    from raysearch.metrics.repeats import sem

    seeds = child_runs(client, experiment_id, config_run_id)
    if not seeds:
        return ""
    complete = [r for r in seeds if r.data.tags.get(COMPLETE_TAG) == "true"]
    outcomes = [r.data.tags.get(OUTCOME_TAG, "") for r in seeds]
    metrics: dict[str, float] = {"n_seeds": float(len(complete))}
    if complete:
        keys = set.intersection(*({k for k in r.data.metrics if k.startswith(METRIC_PREFIXES)}
                                  for r in complete))
        for key in sorted(keys):
            values = [float(r.data.metrics[key]) for r in complete]
            if not all(math.isfinite(v) for v in values):
                continue
            metrics[key] = metrics[key + "_mean"] = sum(values) / len(values)
            if len(values) >= 2:
                metrics[key + "_sem"] = sem(values)
    spoiled = next((o for o in outcomes if o in _SPOILING_OUTCOMES), None)
    is_complete = bool(complete) and spoiled is None
    if is_complete:
        outcome, status = "complete", "FINISHED"
    elif "interrupted" in outcomes or any(r.info.status in ("RUNNING", "KILLED") for r in seeds):
        outcome, status = spoiled or "interrupted", "KILLED"
    elif spoiled is None and "stopped_early" in outcomes:  # ASHA stopped every seed
        outcome, status = "stopped_early", "FINISHED"
    else:
        outcome, status = spoiled or "error", "FAILED"
    run = client.get_run(config_run_id)
    step = int(run.data.params.get("epochs", 0)) if str(
        run.data.params.get("epochs", "")).isdigit() else 0
    log_epochs(client, config_run_id, [(step, metrics)], {
        COMPLETE_TAG: str(is_complete).lower(), OUTCOME_TAG: outcome,
        SEEDS_TAG: f"{len(complete)}/{len(seeds)}"})
    client.set_terminated(config_run_id, status)
    line = f"  configuration {run.info.run_name}: {len(complete)}/{len(seeds)} seeds complete"
    if is_complete and "val_accuracy" in metrics and "val_ece" in metrics:
        parts = []
        for key, label in (("val_accuracy", "val acc"), ("val_ece", "ECE")):
            spread = metrics.get(key + "_sem")
            pm = f" ± {100 * spread:.2f}" if spread is not None else ""
            parts.append(f"{label} {100 * metrics[key]:.2f}%{pm}")
        line += ", mean " + " ".join(parts)
    return line if is_complete else f"{line} ({outcome})"


def seed_trials(client: MlflowClient, parent: Any) -> pd.DataFrame:
    """One row per seed run of a sweep: its trials for a single-seed sweep, else the seed runs.

    For a repeated sweep (``--repeats``) the rows are the seed runs nested under the
    configuration runs, with ``config`` set to their configuration run's config (the same for
    all seeds of a configuration: the seed of its first run) and ``trial`` to that run's name;
    ``seed_run`` keeps the seed run's own name. For a single-seed sweep this is
    :func:`sweep_trials`. This is what :func:`raysearch.metrics.repeats.compare_methods` takes.
    """
    frame = sweep_trials(client, parent)
    if frame.empty or "repeats" not in frame:  # configuration runs carry the param
        return frame
    configs = {r["run_id"]: r for _, r in frame.iterrows()}
    rows = []
    for run in sweep_runs(client, parent.info.experiment_id, parent.info.run_id):
        owner = configs.get(run.data.tags.get(PARENT_TAG, ""))
        if owner is None or not run.data.tags.get(TRIAL_TAG):
            continue
        row = {"trial": owner["trial"], "seed_run": run.info.run_name,
               "run_id": run.info.run_id, "trial_id": run.data.tags.get(TRIAL_TAG, ""),
               "status": run.info.status,
               "complete": run.data.tags.get(COMPLETE_TAG) == "true",
               "outcome": run.data.tags.get(OUTCOME_TAG, "")}
        row.update({k: _coerce(v) for k, v in run.data.params.items()})
        row.update(run.data.metrics)
        row["config"] = owner["config"]
        rows.append(row)
    return pd.DataFrame(rows)


def child_runs(client: MlflowClient, experiment_id: str, parent_run_id: str) -> list[Any]:
    """Every child run of a sweep's parent run (all pages), oldest first."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id],
                                  filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                                  max_results=1000, page_token=token,
                                  order_by=["attributes.start_time ASC"])
        runs.extend(page)
        token = page.token
        if not token:
            return runs


#: The columns of :func:`sweep_trials` that are not params (kept as read from ``trials.parquet``).
_FIXED_COLUMNS = ("trial", "run_id", "trial_id", "status", "complete", "outcome", "config")
#: The columns :func:`annotate_selection` adds (dropped from a stored table: judged again).
_SELECTION_COLUMNS = ("on_front", "selected")
#: The parent's trials table, written by :func:`raysearch.tracking.finalize_sweep`.
TRIALS_FILE = "trials.parquet"


def stored_trials(client: MlflowClient, parent: Any) -> pd.DataFrame | None:
    """:func:`sweep_trials` of `parent`, read from its ``trials.parquet`` while that is current.

    The table is current when the parent run has ended, carries :data:`TABLE_TAG` (the time the
    table's runs were read; :func:`raysearch.tracking.finalize_sweep` writes it with the table,
    ``raysearch sync`` removes it before it writes to a trial run) and no run of the sweep
    (the sweep's name) started or ended after that time, is running or was deleted: four
    searches of at most one run each. Edits made by hand to an ended trial run (its tags or
    metrics in the MLflow UI, a deleted run restored) are not seen; the clocks of the machines
    that write the sweep's runs are taken to agree.

    Returns:
        The same table as :func:`sweep_trials` (columns, dtypes, values), or None when the
        table is not current or cannot be read (the caller reads the runs).
    """
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    stamp = parent.data.tags.get(TABLE_TAG, "")
    if parent.info.status == "RUNNING" or not stamp.isdigit():
        return None
    runs = (f"tags.`{SWEEP_TAG}` = '{parent.data.tags.get(SWEEP_TAG, '')}' "
            f"and tags.`{PARENT_TAG}` IS NOT NULL")
    checks = [(f"{runs} and attributes.start_time > {stamp}", ViewType.ACTIVE_ONLY),
              (f"{runs} and attributes.end_time > {stamp}", ViewType.ACTIVE_ONLY),
              (f"{runs} and attributes.status = 'RUNNING'", ViewType.ACTIVE_ONLY),
              (runs, ViewType.DELETED_ONLY)]
    try:
        for query, view in checks:
            if client.search_runs([parent.info.experiment_id], filter_string=query,
                                  run_view_type=view, max_results=1):
                return None
        with tempfile.TemporaryDirectory() as d:
            frame = pq.read_table(client.download_artifacts(
                parent.info.run_id, TRIALS_FILE, d)).to_pandas()
    except (MlflowException, OSError, pa.ArrowException):
        return None
    columns = [c for c in frame.columns if c not in _SELECTION_COLUMNS]
    params = {c for c in columns if c not in _FIXED_COLUMNS
              and (frame[c].dtype == object or pd.api.types.is_string_dtype(frame[c].dtype))}
    rows = []  # the rows sweep_trials builds: no key for a missing value, params as parsed
    for row in frame[columns].to_dict("records"):
        for key, value in list(row.items()):
            if value is None or (isinstance(value, float) and math.isnan(value)):
                del row[key]
            elif key in params and isinstance(value, str):
                row[key] = _coerce(value)
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def write_parquet(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write a trials table with pyarrow (mixed-type param columns stored as strings).

    The rows are converted and written 1,000 at a time (one Parquet row group each), so the
    memory it takes does not grow with the table.
    """
    frame = frame.copy(deep=False)  # (copy-on-write: the caller's table is not changed)
    for col in frame.columns:
        if frame[col].dtype == object:
            kinds = {type(v) for v in frame[col] if v is not None and v == v}
            if len(kinds) > 1 or kinds - {str, bool}:
                frame[col] = frame[col].map(lambda v: None if v is None or v != v else str(v))
    schema = pa.Schema.from_pandas(frame, preserve_index=False)
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, max(len(frame), 1), _ROW_GROUP):
            writer.write_table(pa.Table.from_pandas(frame.iloc[start:start + _ROW_GROUP],
                                                    schema=schema, preserve_index=False))
    return Path(path)


#: Rows per row group of :func:`write_parquet`.
_ROW_GROUP = 1000


def annotate_selection(
    frame: pd.DataFrame, *, tolerance: float, accuracy_key: str = "val_accuracy",
    ece_key: str = "val_ece", selection: str = "mean",
) -> pd.DataFrame:
    """Add ``on_front`` and ``selected`` columns, judged among the complete trials only.

    Failed and early-stopped trials keep ``on_front = selected = False``. The front is that of
    the (mean) metrics; with ``selection="robust"`` the selected row is the one with the lowest
    ``{ece_key}_mean + {ece_key}_sem`` among those within `tolerance` of the best mean accuracy
    (:func:`raysearch.metrics.repeats.select_robust`; rows of a repeated sweep's configurations).

    Raises:
        ValueError: if `selection` is unknown, or ``robust`` on a table without SEM columns.
    """
    if selection not in SELECTIONS:
        raise ValueError(f"unknown selection '{selection}'; choose from {', '.join(SELECTIONS)}")
    frame = frame.copy(deep=False)  # (copy-on-write: the caller's table is not changed)
    frame["on_front"] = False
    frame["selected"] = False
    if frame.empty or "complete" not in frame or accuracy_key not in frame \
            or ece_key not in frame:
        return frame
    # the rule reads the metric columns only: the other columns are not copied
    metric_columns = [c for c in frame.columns
                      if isinstance(c, str) and c.startswith((accuracy_key, ece_key))]
    eligible = frame.loc[frame["complete"] & frame[accuracy_key].notna()
                         & frame[ece_key].notna(), metric_columns]
    if eligible.empty:
        return frame
    table = selection_table(eligible.reset_index(drop=True), accuracy=accuracy_key, ece=ece_key,
                            tolerance=tolerance)
    frame.loc[eligible.index, "on_front"] = table["on_front"].to_numpy()
    frame.loc[eligible.index, "selected"] = table["selected"].to_numpy()
    if selection == "robust":
        from raysearch.metrics.repeats import MEAN, SEM, select_robust

        if ece_key + SEM not in frame or accuracy_key + MEAN not in frame:
            raise ValueError(f"--selection robust needs the standard error of {ece_key} over "
                             "seeds: run the sweep with --repeats 2 or more")
        rows = eligible.reset_index(drop=True)
        pick = select_robust(rows, accuracy=accuracy_key, ece=ece_key, tolerance=tolerance)
        frame["selected"] = False
        frame.loc[eligible.index[pick], "selected"] = True
    return frame


def load_sweep(client: MlflowClient, name: str, experiment: str | None = None,
               tolerance: float | None = None, ece_key: str = "val_ece",
               selection: str | None = None) -> tuple[Any, pd.DataFrame, float]:
    """Parent run, trials table (with ``on_front``/``selected``) and tolerance of sweep `name`.

    `tolerance` and `selection` (:data:`SELECTIONS`) default to the ones the sweep ran with;
    `ece_key` is the validation ECE the front and the selection use (``val_ece_ts`` for the
    post-TS ECE). A repeated sweep's table has one row per configuration (means, ``_mean`` and
    ``_sem`` columns, ``n_seeds``). The accuracy axis is the sweep's ``accuracy_metric`` param
    (``val_miou`` for a segmentation sweep).

    Raises:
        ValueError: if the sweep is unknown.
    """
    parent = find_sweep(client, name, experiment)
    if tolerance is None:
        tolerance = float(parent.data.params.get("tolerance", 0.01))
    frame = stored_trials(client, parent)
    if frame is None:
        frame = sweep_trials(client, parent)
    if ece_key != "val_ece" and not frame.empty and ece_key not in frame:
        raise ValueError(f"sweep '{name}' has no metric {ece_key}: run it with that post-hoc "
                         "calibrator (--posthoc)")
    if selection is None:
        selection = parent.data.params.get("selection", "mean")
    accuracy_key = f"val_{parent.data.params.get('accuracy_metric', 'accuracy')}"
    frame = annotate_selection(frame, tolerance=tolerance, ece_key=ece_key, selection=selection,
                               accuracy_key=accuracy_key)
    return parent, frame, tolerance


def trial_outputs(client: MlflowClient, run_id: str) -> Any:
    """The val/test logits and labels a trial stored (``logits.parquet``), or None.

    Returns:
        A :class:`raysearch.calibration.posthoc.Outputs` with ``split`` set, or None when the run
        has no such artifact (a failed or early-stopped trial).
    """
    from raysearch.calibration.posthoc import load_outputs

    if LOGITS_FILE not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    with tempfile.TemporaryDirectory() as d:
        local = client.download_artifacts(run_id, LOGITS_FILE, d)
        return load_outputs(local)


def stored_sections(config: Any) -> dict[str, Any]:
    """A trial's stored config (its ``raysearch.config`` tag, an export) as sections.

    A config of an earlier version's flat layout is read into sections
    (:func:`raysearch.config.flat.as_sections`); what is not a readable config is ``{}``.
    """
    from raysearch.config.flat import as_sections

    try:
        return as_sections(config) if isinstance(config, dict) else {}
    except ValueError:
        return {}
