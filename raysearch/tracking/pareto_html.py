"""A sweep's interactive Pareto front: ``pareto.html``, one self-contained Plotly page.

:func:`pareto_html` draws the rows of a sweep's trials table (:func:`~raysearch.tracking.sweeps.
sweep_trials` with :func:`~raysearch.tracking.sweeps.annotate_selection`'s ``on_front`` and
``selected``) in the (calibration error, accuracy) plane, as ``pareto.png`` does, with a
dropdown for the metric pair and every trial's run name, params and metrics on hover. The page
inlines plotly.js and loads nothing from the network (no CDN, no MathJax), so it opens from the
MLflow artifact store, a laptop or an air-gapped cluster alike.

Imports :mod:`raysearch.metrics.selection` and :mod:`raysearch.metrics.table` (metric names);
:mod:`raysearch.tracking.export` imports it.
"""

from __future__ import annotations

import functools
import html
import importlib.resources
import json
import math
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raysearch.metrics.selection import pareto_front
from raysearch.metrics.table import CALIBRATED_KEYS, DENSE_KEYS, ESTIMATOR_KEYS
from raysearch.tracking.runs import METRIC_PREFIXES

#: Calibration errors a trials table may hold as ``{split}_{key}`` (or ``{split}_{key}_{cal}``
#: after a post-hoc calibrator): every metric name of :mod:`raysearch.metrics.table` that is
#: lower-is-better, in its order.
ERROR_KEYS = tuple(dict.fromkeys(
    k for k in (*CALIBRATED_KEYS, *ESTIMATOR_KEYS, *DENSE_KEYS)
    if k not in ("accuracy", "miou", "overconfidence", "underconfidence", "average_confidence")))
#: Metrics in nats or on another scale than [0, 1]: drawn and shown as plain numbers, not %.
_NOT_FRACTIONS = ("nll", "brier", "loss", "seconds")
_LABELS = {"accuracy": "accuracy", "miou": "mIoU", "ece": "ECE", "ece_100": "ECE (100 bins)",
           "aece": "adaptive ECE", "cece": "classwise ECE", "mce": "MCE", "nll": "NLL",
           "brier": "Brier score", "ece_l2em": "ECE (l2, equal mass)", "ks": "KS error",
           "marginal_ece": "marginal ECE", "sweep_ce": "sweep CE", "debiased_ce": "debiased CE",
           "ece_released": "ECE (released code)"}
#: Columns of a trials table that are neither params nor metrics.
_NOT_PARAMS = ("trial", "run_id", "trial_id", "status", "complete", "outcome", "config",
               "on_front", "selected", "seed_run", "n_seeds")
_SPLITS = ("val", "test")
#: Plotly's default colour cycle (one colour per method, as ``pareto.png``).
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")


def _split_key(column: str) -> tuple[str, str, str] | None:
    """``(split, error key, calibrator)`` of a calibration-error column, else None."""
    split, _, rest = column.partition("_")
    if split not in _SPLITS:
        return None
    for key in sorted(ERROR_KEYS, key=len, reverse=True):
        if rest == key:
            return split, key, ""
        if rest.startswith(key + "_"):
            cal = rest[len(key) + 1:]
            return None if cal in ("mean", "sem") or cal.endswith(("_mean", "_sem")) else (
                split, key, cal)
    return None


def metric_pairs(frame: pd.DataFrame, accuracy_key: str = "val_accuracy",
                 ece_key: str = "val_ece") -> list[tuple[str, str]]:
    """The (accuracy, calibration error) column pairs :func:`pareto_html` offers for a table.

    The selection's pair comes first; then, per split (``val``, ``test``), each calibration
    error of :data:`ERROR_KEYS` the table holds with a value, paired with that split's accuracy
    (the one after the same post-hoc calibrator, ``test_accuracy_ts`` with ``test_ece_ts``,
    where the table has it).

    Args:
        frame: trials table (:func:`~raysearch.tracking.sweeps.sweep_trials`).
        accuracy_key: the selection's accuracy column (``val_accuracy``; ``val_miou`` for
            segmentation). Defaults to ``"val_accuracy"``.
        ece_key: the selection's calibration-error column. Defaults to ``"val_ece"``.

    Returns:
        ``[(accuracy column, error column), ...]``, one pair per error column.
    """
    accuracy = accuracy_key.partition("_")[2] or "accuracy"
    valued = {c for c, any_value in frame.notna().any().items() if any_value}  # one pass
    found = []
    for column in frame.columns:
        parts = _split_key(str(column)) if column in valued else None
        if parts is None:
            continue
        split, key, cal = parts
        acc = f"{split}_{accuracy}_{cal}" if cal else f"{split}_{accuracy}"
        if acc not in valued:
            acc = f"{split}_{accuracy}"
        if acc in valued:
            found.append(((_SPLITS.index(split), cal != "", cal, ERROR_KEYS.index(key)),
                          (acc, str(column))))
    pairs = {ece_key: accuracy_key}  # one pair per error column: the selection's first
    for _, (acc, err) in sorted(found):
        pairs.setdefault(err, acc)
    return [(acc, err) for err, acc in pairs.items()]


def _label(column: str) -> str:
    """``val_ece_ts`` -> ``val ECE (ts)``; ``test_accuracy`` -> ``test accuracy``."""
    split, _, rest = column.partition("_")
    parts = _split_key(column)
    key, cal = (parts[1], parts[2]) if parts else next(
        ((k, rest[len(k) + 1:]) for k in ("accuracy", "miou")
         if rest == k or rest.startswith(k + "_")), (rest, ""))
    return f"{split} {_LABELS.get(key, key)}" + (f" ({cal})" if cal else "")


def _flag(value: Any) -> bool:
    """A table's bool cell (numpy or Python; None and NaN are False)."""
    return value is not None and value == value and bool(value)


@functools.cache
def _is_fraction(column: str) -> bool:
    return column.startswith(METRIC_PREFIXES) and not any(
        f"_{n}" in column for n in _NOT_FRACTIONS)


def _value(column: str, value: Any) -> str:
    """A hover text's value, HTML-escaped (a number needs no escaping)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{100 * value:.2f}%" if _is_fraction(column) else f"{value:.4g}"
    return html.escape(str(value))


def _hover(row: dict[str, Any], params: list[str], metrics: list[str]) -> str:
    """A trial's hover text: run name, outcome, params, then metrics, a few per line."""
    def missing(v: Any) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    marks = [m for m, on in (("selected", row.get("selected")),
                             ("on the Pareto front", row.get("on_front"))) if _flag(on)]
    head = f"<b>{html.escape(str(row.get('trial', '')))}</b>"
    if marks:
        head += " (" + ", ".join(marks) + ")"
    lines = [head]
    if "outcome" in row and not missing(row["outcome"]):
        lines.append(f"outcome: {html.escape(str(row['outcome']))}")

    def block(title: str, columns: list[str]) -> None:
        items = [f"{_escaped(c)}={_value(c, row[c])}" for c in columns if not missing(row[c])]
        for i in range(0, len(items), 4):
            lines.append((f"{title}: " if i == 0 else "    ") + ", ".join(items[i:i + 4]))

    block("params", params)
    for prefix in METRIC_PREFIXES:
        block(prefix.rstrip("_"), [c for c in metrics if c.startswith(prefix)])
    return "<br>".join(lines)


@functools.cache
def _escaped(text: str) -> str:
    return html.escape(text)


def _pair_label(acc: str, err: str) -> str:
    """A metric pair's dropdown entry: ``val accuracy vs val ECE``."""
    return f"{_label(acc)} vs {_label(err)}"


def _axis(name: str, column: str) -> dict[str, Any]:
    """Relayout keys of axis `name` (``xaxis``, ``yaxis``) for a metric column."""
    unit = " (nats)" if "_nll" in column else ""
    return {f"{name}.title.text": _label(column) + unit,
            f"{name}.tickformat": ".1%" if _is_fraction(column) else ".3~g"}


def _numbers(frame: pd.DataFrame, column: str) -> np.ndarray:
    """The column as float64 (NaN where it is missing, not a number or infinite)."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float) \
        if column in frame else np.full(len(frame), math.nan)
    return np.where(np.isfinite(values), values, math.nan)


def _drawn(values: np.ndarray) -> np.ndarray:
    """Values as the page draws them: 6 significant digits (hover texts show their own).

    Full-precision floats (~18 characters each) of every metric pair would be most of a
    page's size and of the memory its writing takes. NaN stays NaN.
    """
    return np.array([float(f"{v:.6g}") for v in values.tolist()], dtype=float)


def _column_numbers(frame: pd.DataFrame) -> Any:
    """``(column, drawn=False) -> [float | None]`` (None: missing), converting each column once.

    The metric pairs of a table (46 for a classification sweep) read each column several
    times; each is kept as float64 arrays (8 bytes a value, not ~32 as a list of floats): its
    values and the values the page draws (:func:`_drawn`). The lists are made per call.
    """
    arrays: dict[tuple[str, bool], np.ndarray] = {}

    def numbers(column: str, drawn: bool = False) -> list[float | None]:
        """The column's numbers; `drawn`: as the page draws them (:func:`_drawn`)."""
        if (column, False) not in arrays:
            arrays[column, False] = _numbers(frame, column)
        if (column, drawn) not in arrays:
            arrays[column, drawn] = _drawn(arrays[column, False])
        return [v if v == v else None for v in arrays[column, drawn].tolist()]

    return numbers


def pareto_html(frame: pd.DataFrame, path: str | Path, *, accuracy_key: str = "val_accuracy",
                ece_key: str = "val_ece", title: str = "") -> Path:
    """Write a sweep's interactive Pareto front: one self-contained HTML page (Plotly).

    One point per row of `frame` (a trial, or a repeated sweep's configuration), x the
    calibration error and y the accuracy (both in percent but NLL, in nats, and the Brier
    score), coloured by ``method``; a line joins the Pareto front and a star marks the selected
    trial. A dropdown switches the metric pair (:func:`metric_pairs`: the selection's pair
    first, then the validation and test calibration errors the table holds); the front of the
    selection's pair is ``on_front``, that of another pair is recomputed on it
    (:func:`~raysearch.metrics.selection.pareto_front`). Hovering a point shows the trial's
    child-run name, its params and its final metrics. ``_sem`` columns (a repeated sweep) are
    drawn as ±1 SEM error bars. plotly.js is inlined and no MathJax is used, so the page loads
    nothing from the network.

    Args:
        frame: trials table with ``trial`` (the child run's name), ``on_front`` and
            ``selected`` (:func:`~raysearch.tracking.sweeps.annotate_selection`); usually the
            complete trials only, as ``pareto.png`` draws.
        path: output ``.html`` path.
        accuracy_key: accuracy column of the selection (a fraction in [0, 1]). Defaults to
            ``"val_accuracy"``.
        ece_key: calibration-error column of the selection (a fraction in [0, 1]). Defaults
            to ``"val_ece"``.
        title: page and figure title.

    Returns:
        The path written.

    Raises:
        ValueError: if `frame` has no rows, or lacks ``trial``, ``on_front``, ``selected``,
            `accuracy_key` or `ece_key`.
    """
    import plotly.io as pio

    if frame.empty:
        raise ValueError("pareto_html: the trials table has no rows")
    missing = [c for c in ("trial", "on_front", "selected", accuracy_key, ece_key)
               if c not in frame]
    if missing:
        raise ValueError(f"pareto_html: the trials table has no column {missing[0]!r}")
    metrics = [str(c) for c in frame.columns if str(c).startswith(METRIC_PREFIXES)]
    params = [str(c) for c in frame.columns
              if str(c) not in _NOT_PARAMS and str(c) not in metrics]
    groups = frame["method"].astype(str) if "method" in frame else pd.Series(
        ["trials"] * len(frame))
    names = list(dict.fromkeys(groups))
    members = [[i for i, g in enumerate(groups) if g == name] for name in names]
    selected = [i for i, s in enumerate(frame["selected"]) if _flag(s)]
    points = _Points(frame, _column_numbers(frame), members, selected, (accuracy_key, ece_key),
                     params, metrics)
    pairs = metric_pairs(frame, accuracy_key, ece_key)
    data = _scatter_traces(points, names, points.traces(*pairs[0]))

    def title_text(label: str) -> str:
        return f"{title}<br><sup>{label}</sup>" if title else label

    def buttons() -> Iterator[dict[str, Any]]:
        # one metric pair's traces at a time, as the page is written
        for acc, err in pairs:
            label = _pair_label(acc, err)
            yield {"label": label, "method": "update",
                   "args": [points.traces(acc, err),
                            {**_axis("xaxis", err), **_axis("yaxis", acc),
                             "title.text": title_text(label)}]}

    layout = {
        "title": {"text": title_text(_pair_label(*pairs[0]))},
        "template": pio.templates["plotly_white"].to_plotly_json(),
        "hoverlabel": {"align": "left"}, "legend": {"title": {"text": "method"}},
        "updatemenus": [{"buttons": buttons(), "direction": "down", "showactive": True,
                         "x": 1.0, "xanchor": "right", "y": 1.02, "yanchor": "bottom"}],
        "margin": {"t": 110}}
    for axis, column in (("xaxis", pairs[0][1]), ("yaxis", pairs[0][0])):
        keys = _axis(axis, column)
        layout[axis] = {"title": {"text": keys[f"{axis}.title.text"]},
                        "tickformat": keys[f"{axis}.tickformat"]}
    return _write_page(Path(path), data, layout, title)


@dataclass(frozen=True)
class _Points:
    """What the traces of every metric pair are drawn from (:func:`pareto_html`).

    Attributes:
        frame: the trials table (rows are read by position).
        numbers: ``(column, drawn=False) -> [float | None]`` (:func:`_column_numbers`).
        members: the row indices of each method, in legend order.
        selected: the rows marked ``selected``.
        selection: the selection's (accuracy, error) columns, whose front is ``on_front``.
        params: the param columns a hover text shows.
        metrics: the metric columns a hover text shows.
    """

    frame: pd.DataFrame
    numbers: Any
    members: list[list[int]]
    selected: list[int]
    selection: tuple[str, str]
    params: list[str]
    metrics: list[str]

    def texts(self, rows: list[int]) -> Iterator[str]:
        """The hover texts of `rows`, made as they are read (the rows a thousand at a time)."""
        for start in range(0, len(rows), 1000):
            for row in self.frame.iloc[rows[start:start + 1000]].to_dict("records"):
                yield _hover(row, self.params, self.metrics)

    def front(self, acc: str, err: str, x: list[Any], y: list[Any]) -> list[int]:
        """The rows on the Pareto front of one pair, sorted by error then accuracy."""
        if (acc, err) == self.selection:
            front = [i for i, f in enumerate(self.frame["on_front"]) if _flag(f)]
        else:
            with warnings.catch_warnings():  # a drawn front of test metrics selects nothing
                warnings.filterwarnings("ignore", "selecting on", UserWarning)
                front = pareto_front([{acc: a, err: e} for a, e in zip(y, x, strict=True)],
                                     accuracy=acc, ece=err)
        return sorted((i for i in front if x[i] is not None and y[i] is not None),
                      key=lambda i: (x[i], y[i]))

    def traces(self, acc: str, err: str) -> dict[str, list[Any]]:
        """Per-trace x, y and error bars for one metric pair (the order of the figure's data).

        One trace per method, then the front's line, then the selected star.
        """
        x, y = self.numbers(err), self.numbers(acc)
        front = self.front(acc, err, x, y)
        sem_x, sem_y = self.numbers(err + "_sem"), self.numbers(acc + "_sem")
        bars = any(v is not None for v in sem_x + sem_y)
        x, y = self.numbers(err, drawn=True), self.numbers(acc, drawn=True)
        out: dict[str, list[Any]] = {"x": [], "y": [], "error_x": [], "error_y": []}

        def bar(sem: list[float | None], rows: list[int]) -> dict[str, Any]:
            # without bars (a sweep that is not repeated) the page carries no SEM arrays
            return ({"type": "data", "visible": True, "array": [sem[i] for i in rows]}
                    if bars else {"visible": False})

        for rows in self.members:
            out["x"].append([x[i] for i in rows])
            out["y"].append([y[i] for i in rows])
            out["error_x"].append(bar(sem_x, rows))
            out["error_y"].append(bar(sem_y, rows))
        for rows in (front, self.selected[:1]):
            out["x"].append([x[i] for i in rows])
            out["y"].append([y[i] for i in rows])
            out["error_x"].append({"visible": False})
            out["error_y"].append({"visible": False})
        return out


def _scatter_traces(points: _Points, names: list[str], first: dict[str, list[Any]]
                    ) -> list[dict[str, Any]]:
    """The figure's traces for the first metric pair: one per method, the front, the star.

    Their hover texts are iterators (:meth:`_Points.texts`), made as the page is written.
    """
    data: list[dict[str, Any]] = []
    on_front = points.frame["on_front"].tolist()
    for k, (name, rows) in enumerate(zip(names, points.members, strict=True)):
        data.append({
            "type": "scatter", "x": first["x"][k], "y": first["y"][k], "mode": "markers",
            "name": name, "text": points.texts(rows),
            "hovertemplate": "%{text}<extra></extra>",
            "error_x": first["error_x"][k], "error_y": first["error_y"][k],
            "marker": {"size": 9, "color": _COLOURS[k % len(_COLOURS)], "opacity": 0.85,
                       "line": {"width": [2 if _flag(on_front[i]) else 0
                                          for i in rows], "color": "black"}}})
    data.append({"type": "scatter", "x": first["x"][-2], "y": first["y"][-2], "mode": "lines",
                 "name": "Pareto front", "hoverinfo": "skip",
                 "line": {"color": "black", "width": 1.5, "dash": "dash"}})
    data.append({"type": "scatter", "x": first["x"][-1], "y": first["y"][-1],
                 "mode": "markers", "name": "selected",
                 "text": points.texts(points.selected[:1]),
                 "hovertemplate": "%{text}<extra></extra>",
                 "marker": {"symbol": "star", "size": 20, "color": "gold",
                            "line": {"width": 1.5, "color": "black"}}})
    return data


def _write_page(path: Path, data: list[dict[str, Any]], layout: dict[str, Any], title: str
                ) -> Path:
    """Write the figure as one self-contained HTML page (plotly.js inlined, no MathJax).

    The page calls plotly.js's ``Plotly.newPlot(div, data, layout, config)`` on the figure's
    JSON, which is written a part at a time (each trace's field, each dropdown entry): the
    memory it takes is that of its largest part, not of the page (34 MB at 10,000 trials, which
    Plotly's ``to_html`` held several times over); plotly.js is copied a MiB at a time.
    ``<``, ``>`` and ``/`` in its strings are written as JSON escapes, as Plotly writes them,
    so no text ends the page's ``<script>``.
    """
    head = f"<title>{html.escape(title)}</title>" if title else ""
    with path.open("w", encoding="utf-8") as f:  # ~5 MB of it plotly.js
        f.write(f'<!doctype html>\n<html>\n<head><meta charset="utf-8" />{head}\n'
                "<style>html, body {height: 100%;}</style>\n</head>\n<body>\n<script>")
        # plotly.js, the file plotly.offline.get_plotlyjs() reads
        with (importlib.resources.files("plotly") / "package_data" / "plotly.min.js").open(
                encoding="utf-8", newline="") as js:
            shutil.copyfileobj(js, f, 1 << 20)
        f.write('</script>\n<div style="height:90vh; width:100%;"><div id="pareto" '
                'class="plotly-graph-div" style="height:100%; width:100%;"></div></div>\n'
                '<script>\nPlotly.newPlot("pareto", ')
        _write_json(f, data, depth=3)
        f.write(", ")
        _write_json(f, layout, depth=4)
        f.write(', {"displaylogo": false, "responsive": true});\n</script>\n</body>\n</html>\n')
    return path


def _script_safe(text: str) -> str:
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("/", "\\u002f")


def _write_json(f: Any, value: Any, depth: int) -> None:
    """Write `value` as JSON to `f`, its dicts and lists `depth` levels deep a member at a time.

    An iterator there (a generator) is written as a list, each member made as it is written.

    Missing numbers are None (``null``); a NaN or infinity is a ValueError (not JSON).
    """
    if depth and isinstance(value, dict):
        f.write("{")
        for i, (key, member) in enumerate(value.items()):
            f.write(("," if i else "") + _script_safe(json.dumps(str(key))) + ":")
            _write_json(f, member, depth - 1)
        f.write("}")
    elif depth and isinstance(value, list | Iterator):
        f.write("[")
        for i, member in enumerate(value):
            if i:
                f.write(",")
            _write_json(f, member, depth - 1)
        f.write("]")
    else:
        f.write(_script_safe(json.dumps(value, separators=(",", ":"), allow_nan=False)))
