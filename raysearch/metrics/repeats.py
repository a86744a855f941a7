r"""Repeated seeds: per-configuration mean and standard error, effect sizes, noise-aware selection.

ECE differences between calibration methods are often a fraction of a point, about the size of
seed-to-seed noise. The soft calibration paper (Karandikar et al., NeurIPS 2021) therefore
reports every number as the mean ± standard error of the mean (SEM) over 10 runs (its Tables 1,
2 and 4) and judges methods by Cohen's d (its Figure 1: 0.8 is a large effect, 2.0 a huge one).

Definitions used throughout, for the n seed values x_1..x_n of one configuration:

- mean: :math:`\bar x = \frac1n \sum_i x_i`;
- SEM: :math:`s / \sqrt n` with the sample standard deviation
  :math:`s = \sqrt{\frac{1}{n-1} \sum_i (x_i - \bar x)^2}` (NaN for n = 1: one seed says
  nothing about the noise);
- Cohen's d of a method against a baseline: :math:`d = (\bar x_{base} - \bar x_{method}) /
  s_p` with the pooled standard deviation :math:`s_p = \sqrt{\frac{(n_b - 1) s_b^2 + (n_m - 1)
  s_m^2}{n_b + n_m - 2}}`, so that a method that *lowers* ECE has a *positive* d (the paper's
  convention: "a positive effect").

Plain pandas/NumPy: no Ray, no MLflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from raysearch.metrics.selection import select_best

#: Suffixes of the per-configuration columns :func:`seed_summary` writes.
MEAN, SEM = "_mean", "_sem"
#: Column :func:`seed_summary` writes: how many seeds a configuration has.
SEEDS = "n_seeds"


def sem(values: Sequence[float]) -> float:
    """Standard error of the mean, ``s / sqrt(n)`` with the sample std (ddof = 1).

    Args:
        values: the n finite values (a sequence or 1-D array of floats).

    Returns:
        The SEM (same unit as `values`); NaN when n < 2.

    Raises:
        ValueError: if a value is NaN or infinite.
    """
    x = np.asarray(values, dtype=float).ravel()
    if not np.isfinite(x).all():
        raise ValueError("SEM of values that are not all finite")
    if x.size < 2:
        return math.nan
    return float(np.std(x, ddof=1) / math.sqrt(x.size))


def cohens_d(baseline: Sequence[float], method: Sequence[float]) -> float:
    """Cohen's d of `method` against `baseline`, positive when `method` is lower.

    ``d = (mean(baseline) - mean(method)) / s_pooled`` (module docstring). For ECE (lower is
    better) a positive d is an improvement, as in the soft calibration paper's Figure 1.

    Args:
        baseline: the baseline's values over its seeds (e.g. ``ce``'s test ECEs), n_b >= 1.
        method: the method's values over its seeds, n_m >= 1, with n_b + n_m >= 3.

    Returns:
        d (unitless). ``inf``/``-inf`` when both samples have zero spread and different means,
        ``0.0`` when they are identical constants.

    Raises:
        ValueError: if a value is not finite, or n_b + n_m < 3 (no pooled variance).
    """
    b = np.asarray(baseline, dtype=float).ravel()
    m = np.asarray(method, dtype=float).ravel()
    if not (np.isfinite(b).all() and np.isfinite(m).all()):
        raise ValueError("Cohen's d of values that are not all finite")
    if b.size < 1 or m.size < 1 or b.size + m.size < 3:
        raise ValueError(f"Cohen's d needs n_baseline + n_method >= 3 values (got {b.size} and "
                         f"{m.size})")
    ss = ((b - b.mean()) ** 2).sum() + ((m - m.mean()) ** 2).sum()
    pooled = math.sqrt(ss / (b.size + m.size - 2))
    gap = float(b.mean() - m.mean())
    if pooled == 0.0:
        return 0.0 if gap == 0.0 else math.copysign(math.inf, gap)
    return gap / pooled


def seed_summary(trials: pd.DataFrame, metrics: Sequence[str], *, by: str = "config_id",
                 keep: Sequence[str] = ()) -> pd.DataFrame:
    """One row per configuration: ``{metric}_mean`` and ``{metric}_sem`` over its seeds.

    Args:
        trials: one row per seed run (complete runs only), with the column `by` naming the
            configuration each run belongs to, and the `metrics` columns (floats; NaN rows of a
            metric are left out of that metric's mean and SEM).
        metrics: metric columns to aggregate, e.g. ``["val_accuracy", "val_ece"]``.
        by: the configuration column. Defaults to ``"config_id"``.
        keep: further columns that are constant within a configuration (``method``, ``config``)
            and are copied from its first row.

    Returns:
        A DataFrame with `by`, the `keep` columns, :data:`SEEDS` (runs per configuration) and
        ``{m}_mean`` / ``{m}_sem`` for every metric, in the order configurations first appear.

    Raises:
        KeyError: if `by`, a metric or a `keep` column is missing.
    """
    missing = [c for c in (by, *metrics, *keep) if c not in trials.columns]
    if missing:
        raise KeyError(f"trials table lacks column(s) {', '.join(missing)}")
    rows = []
    for key, group in trials.groupby(by, sort=False):
        row: dict[str, Any] = {by: key, SEEDS: len(group)}
        row.update({c: group[c].iloc[0] for c in keep})
        for m in metrics:
            values = pd.to_numeric(group[m], errors="coerce").dropna().to_numpy(dtype=float)
            values = values[np.isfinite(values)]
            row[m + MEAN] = float(values.mean()) if values.size else math.nan
            row[m + SEM] = sem(values) if values.size else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def select_on_means(summary: pd.DataFrame, *, accuracy: str = "val_accuracy",
                    ece: str = "val_ece", tolerance: float = 0.01) -> int:
    """The selection rule on means: lowest mean ECE within `tolerance` of the best mean accuracy.

    :func:`raysearch.metrics.selection.select_best` applied to the ``_mean`` columns of a
    :func:`seed_summary` table (same ties and tolerance).

    Args:
        summary: a :func:`seed_summary` table holding ``{accuracy}_mean`` and ``{ece}_mean``.
        accuracy: the accuracy metric (validation). Defaults to ``"val_accuracy"``.
        ece: the calibration-error metric (validation). Defaults to ``"val_ece"``.
        tolerance: absolute accuracy tolerance, >= 0. Defaults to ``0.01``.

    Returns:
        0-based row position of the selected configuration.

    Raises:
        ValueError: as :func:`raysearch.metrics.selection.select_best` (bad tolerance, no
            eligible row).
    """
    return select_best(summary, accuracy + MEAN, ece + MEAN, tolerance)


def select_robust(summary: pd.DataFrame, *, accuracy: str = "val_accuracy",
                  ece: str = "val_ece", tolerance: float = 0.01, z: float = 1.0) -> int:
    """Lowest upper confidence bound ``mean + z * SEM`` of ECE within the accuracy tolerance.

    Among the configurations whose mean accuracy is within `tolerance` of the best mean
    accuracy, the one with the lowest ``{ece}_mean + z * {ece}_sem`` wins (ties as in
    :func:`raysearch.metrics.selection.select_best`). A configuration whose ECE is low only because
    its few seeds happened to agree is penalised by its spread. ``z = 1`` is the one-SEM bound
    that the error bars of the Pareto plot show.

    Args:
        summary: a :func:`seed_summary` table with ``_mean`` and ``_sem`` columns.
        accuracy: the accuracy metric. Defaults to ``"val_accuracy"``.
        ece: the calibration-error metric. Defaults to ``"val_ece"``.
        tolerance: absolute accuracy tolerance, >= 0. Defaults to ``0.01``.
        z: SEMs added to the mean, >= 0. Defaults to ``1.0``.

    Returns:
        0-based row position of the selected configuration.

    Raises:
        ValueError: if `z` < 0; if no configuration has at least 2 seeds (no SEM: use
            :func:`select_on_means`); as :func:`raysearch.metrics.selection.select_best` otherwise.
    """
    if not (isinstance(z, (int, float)) and math.isfinite(z) and z >= 0):
        raise ValueError(f"`z` must be a finite number >= 0, got {z!r}")
    table = summary.copy()
    if not table[ece + SEM].notna().any():
        raise ValueError("robust selection needs configurations with at least 2 seeds (no "
                         "standard error otherwise): use the selection on means")
    table["_ece_ucb"] = table[ece + MEAN] + z * table[ece + SEM]
    # the best mean accuracy is taken over every configuration, including single-seed ones
    best = pd.to_numeric(table[accuracy + MEAN], errors="coerce").max()
    table.loc[table[ece + SEM].isna(), "_ece_ucb"] = math.nan  # no SEM: not eligible
    table.loc[table[accuracy + MEAN] < best - tolerance - 1e-12, "_ece_ucb"] = math.nan
    # the tolerance was applied above: every configuration left is a candidate
    span = float(np.nanmax(table[accuracy + MEAN]) - np.nanmin(table[accuracy + MEAN]))
    return select_best(table, accuracy + MEAN, "_ece_ucb", tolerance=span + 1.0)


def compare_methods(trials: pd.DataFrame, *, by: str = "method", baseline: str = "ce",
                    tolerance: float = 0.01, accuracy: str = "val_accuracy",
                    ece: str = "val_ece", config: str = "config",
                    report: Sequence[str] = ("test_accuracy", "test_ece")) -> pd.DataFrame:
    """Per method: its selected configuration, reported as mean ± SEM over that config's seeds.

    For every value of `by` (a method), the selection rule (lowest `ece` within `tolerance` of
    the best `accuracy`, on validation data) picks one configuration among that method's
    complete runs, judged on its mean over seeds (:func:`select_on_means`; a single-seed sweep
    has one run per configuration). Its runs' `report` metrics (test data) are summarised as
    mean and SEM, and the Cohen's d of its last `report` metric (the test ECE) against the
    `baseline` method's selected configuration (:func:`cohens_d`; positive: lower than the
    baseline's) is added: the soft calibration paper's Figures 1 and 5.

    Args:
        trials: one row per seed run with the columns `by`, `config` (the configuration's
            identity, e.g. its RunConfig JSON without the seed), `accuracy`, `ece`, the `report`
            metrics, and ``complete`` (bool) when present (incomplete rows are ignored).
        by: the grouping column. Defaults to ``"method"``.
        baseline: the `by` value the effect sizes are computed against. Defaults to ``"ce"``.
        tolerance: accuracy tolerance of the rule, >= 0. Defaults to ``0.01``.
        accuracy: validation accuracy column. Defaults to ``"val_accuracy"``.
        ece: validation calibration-error column of the rule. Defaults to ``"val_ece"``.
        config: the configuration column. Defaults to ``"config"``.
        report: test metrics to summarise (the last one gets Cohen's d). Defaults to
            ``("test_accuracy", "test_ece")``.

    Returns:
        One row per method (sorted by the mean of the last `report` metric): `by`, `config`,
        :data:`SEEDS`, ``{m}_mean`` and ``{m}_sem`` of every `report` metric, and ``cohens_d``
        (NaN for the baseline itself, when the baseline is absent, or with fewer than 3 values
        between the two).

    Raises:
        KeyError: if a needed column is missing.
    """
    table = trials
    if "complete" in table:
        table = table[table["complete"].astype(bool)]
    metrics = [accuracy, ece, *report]
    rows = []
    seeds_of: dict[Any, np.ndarray] = {}
    for method, runs in table.groupby(by, sort=True):
        summary = seed_summary(runs, metrics, by=config)
        try:
            chosen = summary.iloc[select_on_means(summary, accuracy=accuracy, ece=ece,
                                                  tolerance=tolerance)]
        except ValueError:  # no run with both validation metrics
            continue
        picked = runs[runs[config] == chosen[config]]
        seeds_of[method] = pd.to_numeric(picked[report[-1]], errors="coerce").dropna() \
            .to_numpy(dtype=float)
        row = {by: method, config: chosen[config], SEEDS: int(chosen[SEEDS])}
        row.update({m + s: chosen[m + s] for m in report for s in (MEAN, SEM)})
        rows.append(row)
    out = pd.DataFrame(rows, columns=[by, config, SEEDS,
                                      *(m + s for m in report for s in (MEAN, SEM))])
    base = seeds_of.get(baseline)
    effects = []
    for method in out[by]:
        values = seeds_of[method]
        ok = base is not None and method != baseline and base.size + values.size >= 3 \
            and base.size and values.size
        effects.append(cohens_d(base, values) if ok else math.nan)
    out["cohens_d"] = effects
    return out.sort_values(report[-1] + MEAN, kind="stable").reset_index(drop=True)
