"""Reports on sweeps in an MLflow store: the text the ``raysearch`` commands print.

Each function reads the store (through :mod:`raysearch.tracking` or, where Ray must not be
imported, :mod:`raysearch.tracking.runs`) and returns plain text: a string, a list of lines, or an
iterator of lines that a caller prints as they come (the slow parts, a bootstrap interval or a
plot, come after the lines that do not wait for them). Percentages are ECE and accuracy
fractions in [0, 1] shown as percent points with two decimals (``0.0123`` -> ``1.23%``).

Importing this module imports neither MLflow, Ray, pandas nor NumPy; the functions that need
them import them when called.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysearch.tracking.searched import SEARCHED_TAG, searched_values, shown_value

__all__ = ["SweepLinks", "compare_lines", "describe_trial", "export_line", "failure_line",
           "mean_sem", "metrics_line", "pareto_table", "percent", "quiet_mlflow", "report_lines",
           "searched_of", "sweep_links", "sweep_result_lines", "ece_interval_line"]


def quiet_mlflow() -> None:
    """Lower MLflow's and alembic's loggers to WARNING.

    MLflow configures its loggers when it is imported, so this imports it first; afterwards
    its INFO lines ("Creating initial MLflow database tables...") no longer show.
    """
    import mlflow  # noqa: F401  (configures its loggers on import; then we lower them)

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


# ---------------------------------------------------------------------------------------------
# formatting

def percent(value: Any) -> str:
    """A fraction in [0, 1] as ``12.34%``; ``-`` when it is missing, not a number or NaN."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if v != v else f"{100 * v:.2f}%"


def mean_sem(mean: Any, sem: Any) -> str:
    """``12.34% ± 0.56`` (percent points), or just the mean when the SEM is unknown."""
    text = percent(mean)
    try:
        s = float(sem)
    except (TypeError, ValueError):
        return text
    return text if s != s else f"{text} ± {100 * s:.2f}"


def _hp_text(row: Any, searched: Iterable[str] | None = None) -> str:
    """A trial's searched values as ``k=v k=v``.

    See :func:`~raysearch.tracking.searched.searched_values`. Without `searched` (a sweep
    recorded before the parent run's tag ``raysearch.searched``, or one of a trainable of the
    user's own): the loss's parameters, ``lr`` and the model's scalar parameters.
    """
    try:
        cfg = json.loads(row.get("config", "{}"))
    except (TypeError, ValueError):
        cfg = {}
    if searched is not None:
        values = searched_values(cfg, searched)
        return " ".join(f"{k}={shown_value(v)}" for k, v in values.items())
    from raysearch.tracking.sweeps import stored_sections

    cfg = stored_sections(cfg)
    params = dict((cfg.get("loss") or {}).get("params") or {})
    lr = (cfg.get("optimizer") or {}).get("lr")
    params.update({f"model.{k}": v for k, v in
                   ((cfg.get("model") or {}).get("params") or {}).items()
                   if isinstance(v, (int, float, str, bool))})
    params.pop("variant", None)
    if lr is not None:
        params["lr"] = lr
    return " ".join(f"{k}={shown_value(v)}" for k, v in params.items())


def pareto_table(frame: Any, show_all: bool = False, suffix: str = "",
                 metric: str = "ece", accuracy: str | None = None,
                 searched: Iterable[str] | None = None) -> str:
    """The trials of a sweep as a text table, best validation accuracy first.

    Args:
        frame: the sweep's trials (a DataFrame as :func:`raysearch.tracking.load_sweep`
            returns: ``trial``, ``method``, ``config``, ``val_*``/``test_*`` metrics,
            ``complete``, ``on_front``, ``selected``; ``*_sem`` and ``n_seeds`` for a repeated
            sweep), or None.
        show_all: every trial instead of the Pareto front only.
        suffix: ``_<calibrator>`` to show the ECE after that post-hoc calibrator.
        metric: the calibration error shown (``ece``, ``ece_100``, ...).
        accuracy: ``accuracy`` or ``miou`` (default: ``miou`` when the trials log it).
        searched: the sweep's searched names: the hyperparameters column shows these
            (:func:`~raysearch.tracking.searched.searched_values`); None: the loss's
            parameters, ``lr`` and the model's scalar parameters.

    Returns:
        A title line and the table (columns in percent points), or a one-line note when there
        is nothing to show.
    """
    if frame is None or frame.empty:
        return "(no trials)"
    rows = frame if show_all else frame[frame["on_front"]]
    if rows.empty:
        return "(no complete trial on the Pareto front)"
    if accuracy is None:  # segmentation trials log val_miou
        accuracy = "miou" if "val_miou" in rows else "accuracy"
    cols = [f"val_{accuracy}", f"val_{metric}{suffix}", f"test_{accuracy}",
            f"test_{metric}{suffix}"]
    if cols[0] in rows and cols[1] in rows:
        rows = rows.sort_values([cols[0], cols[1]], ascending=[False, True])
    tag = f" ({suffix[1:]})" if suffix else ""
    label = "ECE" if metric == "ece" else metric
    acc = "mIoU" if accuracy == "miou" else "acc"
    header = ["trial", "method", "hyperparameters", f"val {acc}", f"val {label}{tag}",
              f"test {acc}", f"test {label}{tag}", ""]
    repeated = "n_seeds" in rows
    if repeated:
        header.insert(3, "seeds")
    lines = []
    for _, row in rows.iterrows():
        mark = "selected" if row.get("selected") else ("front" if row.get("on_front") else "")
        if not row.get("complete"):
            mark = row.get("status", "").lower() if row.get("status") != "FINISHED" else "partial"
        line = [str(row["trial"]), str(row.get("method", "")), _hp_text(row, searched),
                *(mean_sem(row.get(c), row.get(c + "_sem")) for c in cols), mark]
        if repeated:
            n = row.get("n_seeds")
            line.insert(3, "-" if n is None or n != n else str(int(n)))
        lines.append(line)
    widths = [max(len(h), *(len(r[i]) for r in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in lines]
    what = "mIoU" if accuracy == "miou" else "accuracy"
    title = "all trials" if show_all else f"Pareto front (validation {what} vs. validation ECE)"
    if "n_seeds" in frame:
        title += ", mean ± SEM over seeds (percent points)"
    return title + "\n" + "\n".join(out)


def describe_trial(row: Any, searched: Iterable[str] | None = None) -> str:
    """One trial (a row of a sweep's trials, or a mapping) on one line: its values and metrics.

    The values are the method and the sweep's `searched` ones
    (:func:`~raysearch.tracking.searched.searched_values`).
    """
    def show(key: str) -> str:
        return mean_sem(row.get(key), row.get(key + "_sem"))

    seeds = ""
    if row.get("n_seeds") == row.get("n_seeds") and row.get("n_seeds") is not None:
        n = int(row["n_seeds"])
        seeds = f" | mean ± SEM over {n} seeds" if n != 1 else " | 1 complete seed"
    miou = row.get("val_miou")
    if miou is not None and miou == miou:  # a segmentation trial
        return (f"{row['trial']} {row.get('method', '')} {_hp_text(row, searched)} | val mIoU "
                f"{show('val_miou')} pixel ECE {show('val_ece')} | test mIoU "
                f"{show('test_miou')} pixel ECE {show('test_ece')}{seeds}")
    return (f"{row['trial']} {row.get('method', '')} {_hp_text(row, searched)} | val acc "
            f"{show('val_accuracy')} ECE {show('val_ece')} | test acc "
            f"{show('test_accuracy')} ECE {show('test_ece')}{seeds}")


def metrics_line(metrics: dict[str, float]) -> str:
    """A run's final validation and test metrics on one line (accuracy, ECE, AECE, NLL)."""
    parts = []
    for split in ("val", "test"):
        miou = f"mIoU {percent(metrics[f'{split}_miou'])} " if f"{split}_miou" in metrics else ""
        parts.append(f"{split}: {miou}acc {percent(metrics.get(f'{split}_accuracy'))} "
                     f"ECE {percent(metrics.get(f'{split}_ece'))} "
                     f"AECE {percent(metrics.get(f'{split}_aece'))} "
                     f"NLL {metrics.get(f'{split}_nll', float('nan')):.4f}")
    return " | ".join(parts)


def sweep_result_lines(result: Any) -> list[str]:
    """What a finished (or interrupted) sweep prints: its front, the selection, the links.

    When a trial failed or none completed, the last line is :func:`failure_line`.

    Args:
        result: a :class:`~raysearch.tune.engine.SweepResult`.

    Returns:
        The lines, the first one empty.
    """
    searched = getattr(result, "searched", None)
    lines = ["", pareto_table(result.trials, searched=searched)]
    if result.selected is not None:
        lines.append(f"\nselected: {describe_trial(result.selected, searched)}")
        lines.append(f"next: raysearch report {result.name}   |   "
                     f"raysearch export {result.name} -o best.yaml")
    else:
        lines.append("\nno trial ran all its epochs: nothing selected")
    lines.append(f"open it in MLflow{result.mlflow_hint}: {result.mlflow_link}")
    if result.interrupted:
        lines.append(f"interrupted: `raysearch sweep --resume {result.name}` continues the "
                     "sweep")
    failure = failure_line(result)
    if failure:
        lines.append(failure)
    return lines


def failure_line(result: Any) -> str:
    """One line on a sweep whose trials did not all complete: how many, the most common error.

    ``sweep NAME: 1 of 2 trials completed, 1 failed; most common error (1 of 1): RuntimeError:
    ...`` (``none of 2 trials completed, 2 failed; ...`` when none did; configurations and seed
    trials for a sweep with ``repeats`` > 1). Trials stopped early by a scheduler or interrupted
    are counted apart; they are not failures.

    Args:
        result: a :class:`~raysearch.tune.engine.SweepResult` (its ``trials``, ``failed``
            and ``name``).

    Returns:
        The line, or ``""`` when every trial completed and none failed.
    """
    frame, failed = result.trials, list(getattr(result, "failed", None) or [])
    total = len(frame)
    if total == 0:
        return f"sweep {result.name}: no trial ran"
    done = int(frame["complete"].sum()) if "complete" in frame else 0
    if done == total and not failed:
        return ""
    repeated = "n_seeds" in frame
    unit = "configurations" if repeated else "trials"
    parts = [f"{done or 'none'} of {total} {unit} completed"]
    if failed:
        parts.append(f"{len(failed)}{' seed trials' if repeated else ''} failed")
    outcomes = frame["outcome"].value_counts() if "outcome" in frame else {}
    for outcome, what in (("stopped_early", "stopped early"), ("interrupted", "interrupted")):
        if outcomes.get(outcome):
            parts.append(f"{int(outcomes[outcome])} {what}")
    line = f"sweep {result.name}: " + ", ".join(parts)
    if failed:
        error, count = Counter(f.error for f in failed).most_common(1)[0]
        error = error if len(error) <= 200 else error[:197] + "..."
        line += f"; most common error ({count} of {len(failed)}): {error}"
    return line


def export_line(doc: dict[str, Any], searched: Iterable[str] | None = None) -> str:
    """The exported trial of :func:`raysearch.api.export`'s document, described on one line.

    `searched`: the sweep's searched names (:func:`searched_of`), shown with the method.
    """
    row = {**doc["metrics"], "trial": doc["trial"], "config": json.dumps(doc["config"]),
           "method": (doc["config"].get("loss") or {}).get("name", "")}
    return describe_trial(row, searched)


def _searched_tag(parent: Any) -> list[str] | None:
    """The searched names a sweep's parent run holds (its tag ``raysearch.searched``)."""
    try:
        names = json.loads(parent.data.tags.get(SEARCHED_TAG, "null"))
    except ValueError:
        return None
    return [str(n) for n in names] if isinstance(names, list) else None


def searched_of(name: str, *, tracking_uri: str | None = None,
                experiment: str = "raysearch") -> list[str] | None:
    """The names sweep `name` searched (its parent's tag ``raysearch.searched``), or None.

    Raises:
        ValueError: if the sweep is unknown.
    """
    from raysearch.tracking import find_sweep, get_client

    client, _ = get_client(tracking_uri)
    return _searched_tag(find_sweep(client, name, experiment))


# ---------------------------------------------------------------------------------------------
# reports read from the store

def ece_interval_line(client: Any, run_id: str, calibrated: str | None = None) -> str:
    """Bootstrap 95% interval of a trial's test ECE (after `calibrated` if given), as a line.

    The calibrator is fitted on the trial's stored validation logits; the interval comes from
    1000 bootstrap replicates of the test set (seed 0, :func:`raysearch.metrics.ece_ci`).

    Args:
        client: an ``MlflowClient`` on the sweep's store.
        run_id: the trial's run.
        calibrated: a post-hoc calibrator name (``ts``, ...) or None.

    Returns:
        ``"test ECE: 1.23% (95% bootstrap CI 0.98-1.50%, N test samples, 1000 replicates)"``,
        or ``""`` when the run stored no split logits.
    """
    import numpy as np

    from raysearch.metrics import ece_ci, softmax
    from raysearch.tracking import trial_outputs

    outputs = trial_outputs(client, run_id)
    if outputs is None or outputs.split is None:
        return ""
    test = outputs.split == "test"
    probs = softmax(outputs.logits[test])
    what = "test ECE"
    if calibrated:
        from raysearch.calibration import fit_calibrator

        val = outputs.split == "val"
        cal = fit_calibrator(calibrated, outputs.logits[val], outputs.labels[val])
        probs = cal.predict_proba(outputs.logits[test])
        what = f"test ECE after {calibrated}"
    point, low, high = ece_ci(probs, outputs.labels[test], n_boot=1000, seed=0)
    n = int(np.sum(test))
    return (f"{what}: {100 * point:.2f}% (95% bootstrap CI {100 * low:.2f}-{100 * high:.2f}%, "
            f"{n} test samples, 1000 replicates)")


def report_lines(name: str, *, tracking_uri: str | None = None, experiment: str = "raysearch",
                 tolerance: float | None = None, calibrated: str | None = None,
                 ece_metric: str | None = None, selection: str | None = None,
                 show_all: bool = False, plot: str | Path | None = None) -> Iterator[str]:
    """The report of sweep `name`: its rule, its Pareto table, the selected trial.

    Args:
        name: the sweep's name.
        tracking_uri: its MLflow store (default: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///<cwd>/mlruns.db``).
        experiment: its experiment.
        tolerance: the rule's accuracy tolerance (default: the sweep's).
        calibrated: judge the front on the validation ECE after this post-hoc calibrator.
        ece_metric: calibration error of the front and the rule (default: the sweep's).
        selection: ``mean`` or ``robust`` for a repeated sweep (default: the sweep's).
        show_all: list every trial, not just the front.
        plot: also write the Pareto plot to this PNG file.

    Yields:
        The report's lines (some hold several), in order; the selected trial's bootstrap
        interval of the test ECE comes last.

    Raises:
        ValueError: if the sweep is unknown.
    """
    from raysearch.tracking import find_sweep, get_client, load_sweep

    quiet_mlflow()
    suffix = f"_{calibrated}" if calibrated else ""
    client, _ = get_client(tracking_uri)
    if ece_metric is None:
        ece_metric = find_sweep(client, name, experiment).data.params.get("ece_metric", "ece")
    parent, frame, tol = load_sweep(client, name, experiment, tolerance,
                                    ece_key=f"val_{ece_metric}{suffix}", selection=selection)
    n_complete = int(frame["complete"].sum()) if not frame.empty else 0
    searched = _searched_tag(parent)
    which = f" after {calibrated}" if calibrated else ""
    repeats = int(parent.data.params.get("repeats", 1))
    acc = parent.data.params.get("accuracy_metric", "accuracy")
    acc_name = "mIoU" if acc == "miou" else "accuracy"
    if repeats > 1:
        rule = selection or parent.data.params.get("selection", "mean")
        bound = "mean + 1 SEM of" if rule == "robust" else "mean"
        yield (f"sweep {name} (run {parent.info.run_id}, {parent.info.status}): "
               f"{len(frame)} configurations x {repeats} seeds, {n_complete} complete; "
               f"rule ({rule}): lowest {bound} val_{ece_metric}{which} within {tol:g} of "
               f"the best mean val {acc_name}")
    else:
        yield (f"sweep {name} (run {parent.info.run_id}, {parent.info.status}): "
               f"{len(frame)} trials, {n_complete} complete; rule: lowest "
               f"val_{ece_metric}{which} within {tol:g} of the best val {acc_name}")
    yield pareto_table(frame, show_all=show_all, suffix=suffix, metric=ece_metric, accuracy=acc,
                       searched=searched)
    if plot:
        from raysearch.training import plots
        acc_col = f"val_{acc}"
        shown = frame[frame["on_front"] | (frame["complete"] & frame[acc_col].notna())]
        sel = [i for i, s in enumerate(shown["selected"]) if s]
        ece_col = f"val_{ece_metric}{suffix}"
        bars = ({"accuracy_sem": shown[acc_col + "_sem"], "ece_sem": shown[ece_col + "_sem"]}
                if acc_col + "_sem" in shown and ece_col + "_sem" in shown else {})
        plots.pareto_plot(shown[acc_col], shown[ece_col],
                          shown["on_front"], plot, selected=sel[0] if sel else None,
                          groups=list(shown["method"].astype(str)), title=f"sweep {name}",
                          ece_label=f"validation ECE{which}",
                          accuracy_label=f"validation {acc_name}", **bars)
        yield f"wrote {plot}"
    chosen = frame[frame["selected"]] if not frame.empty else frame
    if len(chosen):
        yield f"\nselected: {describe_trial(chosen.iloc[0], searched)}"
        ci = ece_interval_line(client, chosen.iloc[0]["run_id"], calibrated)
        if ci:
            yield ci
    else:
        yield "\nno complete trial: nothing selected"


def compare_lines(name: str, *, by: str = "method", baseline: str = "ce",
                  tolerance: float | None = None, tracking_uri: str | None = None,
                  experiment: str = "raysearch") -> Iterator[str]:
    """Compare the groups (methods) of sweep `name` on test data; attach the table and a plot.

    Per group the selection rule picks a configuration on validation data
    (:func:`raysearch.metrics.repeats.compare_methods`); its test accuracy and ECE are shown as
    mean ± SEM over its seeds, with Cohen's d of its test ECE against `baseline` (positive:
    lower ECE). ``compare.csv`` and ``compare.png`` are logged to the sweep's parent run.

    Args:
        name: the sweep's name.
        by: the trials' column the groups are taken from.
        baseline: the group the effect sizes are computed against.
        tolerance: the rule's accuracy tolerance (default: the sweep's).
        tracking_uri: the sweep's MLflow store.
        experiment: its experiment.

    Yields:
        The title line, the table's header and rows, and the line naming the run the
        artifacts were attached to.

    Raises:
        ValueError: if the sweep is unknown, has no `by` column or no complete trial.
    """
    from raysearch.metrics.repeats import compare_methods
    from raysearch.tracking import get_client, load_sweep, seed_trials
    from raysearch.training import plots

    quiet_mlflow()
    client, _ = get_client(tracking_uri)
    parent, frame, tol = load_sweep(client, name, experiment, tolerance)
    if not frame.empty and "n_seeds" in frame:  # a repeated sweep: the seed runs
        frame = seed_trials(client, parent)
    if frame.empty or by not in frame:
        raise ValueError(f"sweep '{name}' has no trials with a '{by}' column to compare")
    table = compare_methods(frame, by=by, baseline=baseline, tolerance=tol)
    if table.empty:
        raise ValueError(f"sweep '{name}' has no complete trial to compare")
    names = dict(zip(frame["config"], frame["trial"], strict=False))
    yield (f"sweep {name}: per {by}, the configuration the rule selects (lowest val ECE "
           f"within {tol:g} of the best val accuracy), on test data, mean ± SEM over seeds")
    header = [by, "selected", "seeds", "test acc", "test ECE", f"Cohen's d vs {baseline}"]
    lines = [[str(r[by]), str(names.get(r["config"], "?")), str(r["n_seeds"]),
              mean_sem(r["test_accuracy_mean"], r["test_accuracy_sem"]),
              mean_sem(r["test_ece_mean"], r["test_ece_sem"]),
              "" if r["cohens_d"] != r["cohens_d"] else f"{r['cohens_d']:.2f}"]
             for _, r in table.iterrows()]
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]
    for row in [header, *lines]:
        yield "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
    with tempfile.TemporaryDirectory() as d:
        table.to_csv(Path(d) / "compare.csv", index=False)
        plots.compare_plot(list(table[by].astype(str)), table["test_ece_mean"],
                           table["test_ece_sem"], table["test_accuracy_mean"],
                           Path(d) / "compare.png", effect=list(table["cohens_d"]),
                           baseline=baseline)
        for f in ("compare.csv", "compare.png"):
            client.log_artifact(parent.info.run_id, str(Path(d) / f))
    yield f"attached compare.csv and compare.png to the parent run {parent.info.run_id}"


@dataclass
class SweepLinks:
    """Where the MLflow UI shows a store's latest (or a named) sweep.

    Attributes:
        uri: the resolved tracking URI.
        base: the UI's address (the server's for http(s) URIs, else ``http://host:port``).
        lines: the link lines to print (the sweep's run and its Pareto plot, or the
            experiment and a note when it has no sweep yet).
    """

    uri: str
    base: str
    lines: list[str] = field(default_factory=list)

    @property
    def remote(self) -> bool:
        """True for an MLflow server (http/https), whose UI is already running."""
        return self.uri.startswith(("http://", "https://"))


def sweep_links(tracking_uri: str | None = None, experiment: str = "raysearch",
                sweep_name: str | None = None, *, host: str = "127.0.0.1",
                port: int = 5000) -> SweepLinks:
    """Links into the MLflow UI to sweep `sweep_name` (default: the experiment's latest).

    Reads the store without importing Ray (:mod:`raysearch.tracking.runs`,
    :mod:`raysearch.tracking.ui`).

    Args:
        tracking_uri: the MLflow store (default: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///<cwd>/mlruns.db``).
        experiment: the experiment.
        sweep_name: the sweep to link; None: the latest.
        host: interface of a local UI.
        port: port of a local UI.

    Returns:
        SweepLinks: the URI, the UI's base address and the lines to print.

    Raises:
        ValueError: one line for a local store that does not exist (checked before any client
            is made, which would create an empty SQLite file), a server that does not answer,
            a store MLflow refuses, an unknown experiment or sweep.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from raysearch.tracking import ui
    from raysearch.tracking.runs import (
        SWEEP_TAG,
        check_tracking_uri,
        find_sweep,
        resolve_tracking_uri,
    )

    quiet_mlflow()
    uri = resolve_tracking_uri(tracking_uri)
    ui.require_store(uri)  # before any client: MLflow would create an empty SQLite file
    check_tracking_uri(uri)
    try:
        client = MlflowClient(tracking_uri=uri)
        exp_id = ui.get_experiment_id(client, experiment)
        parent = (find_sweep(client, sweep_name, experiment) if sweep_name
                  else ui.latest_sweep(client, experiment))
    except MlflowException as exc:  # a store MLflow refuses (e.g. a file store): one line
        raise ValueError(f"{uri}: {exc.message}") from None
    base = ui.ui_base_url(uri, host, port)
    if parent is None:
        lines = [f"experiment {experiment}: {ui.experiment_link(base, exp_id)}",
                 f"note: experiment '{experiment}' has no sweep yet (raysearch sweep SPACE "
                 "runs one)"]
    else:
        name = parent.data.tags.get(SWEEP_TAG, parent.info.run_name)
        run_id = parent.info.run_id
        lines = [f"{'sweep' if sweep_name else 'latest sweep'} {name}: "
                 f"{ui.run_link(base, parent.info.experiment_id, run_id)}"]
        if ui.has_artifact(client, run_id, "pareto.png"):
            lines.append("Pareto plot: " + ui.run_link(base, parent.info.experiment_id, run_id,
                                                       artifact="pareto.png"))
    return SweepLinks(uri, base, lines)
