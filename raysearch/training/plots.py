"""Accuracy–ECE Pareto plots and shift box plots (matplotlib, headless).

The only module that imports matplotlib. Figures are written to PNG files; the Agg backend is
used, so no display is needed. Reliability diagrams are drawn with Pillow by
:mod:`raysearch.training.reliability_plot` instead (every trial of a sweep draws one).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

if TYPE_CHECKING:
    import pandas as pd


def _save(fig: plt.Figure, path: str | Path, dpi: int = 110, **savefig_kwargs) -> Path:
    """Write `fig` to the PNG `path` at `dpi` and close it; returns the path as a Path."""
    path = Path(path)
    fig.savefig(path, dpi=dpi, **savefig_kwargs)
    plt.close(fig)
    return path


def pareto_plot(
    accuracy: Sequence[float],
    ece: Sequence[float],
    on_front: Sequence[bool],
    path: str | Path,
    *,
    selected: int | None = None,
    labels: Sequence[str] | None = None,
    groups: Sequence[str] | None = None,
    title: str = "",
    ece_label: str = "validation ECE",
    accuracy_label: str = "validation accuracy",
    accuracy_sem: Sequence[float] | None = None,
    ece_sem: Sequence[float] | None = None,
) -> Path:
    """Scatter every trial in the (ECE, accuracy) plane, highlight the Pareto front, mark the pick.

    Args:
        accuracy: accuracy per trial (fractions).
        ece: ECE per trial (fractions; plotted in percent).
        on_front: whether each trial is on the Pareto front.
        path: output PNG path.
        selected: position of the selected trial, marked with a star.
        labels: short text per trial, written next to front points.
        groups: method name per trial; one colour per method.
        title: figure title.
        ece_label: x-axis label.
        accuracy_label: y-axis label.
        accuracy_sem: standard error of each point's accuracy over its seeds (fractions; a
            repeated sweep's configurations): drawn as ±1 SEM vertical error bars; NaN: none.
        ece_sem: the same for ECE, as horizontal error bars.

    Returns:
        The path written.
    """
    acc = np.asarray(accuracy, dtype=float) * 100
    err = np.asarray(ece, dtype=float) * 100
    front = np.asarray(on_front, dtype=bool)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    if accuracy_sem is not None or ece_sem is not None:
        def bars(values: Sequence[float] | None) -> np.ndarray:
            if values is None:
                return np.zeros(len(acc))
            out = np.asarray(values, dtype=float) * 100
            return np.where(np.isfinite(out), out, 0.0)

        ax.errorbar(err, acc, xerr=bars(ece_sem), yerr=bars(accuracy_sem), fmt="none",
                    ecolor="0.55", elinewidth=0.9, capsize=2.5, zorder=2, label="±1 SEM")
    group_names = list(dict.fromkeys(groups)) if groups is not None else [None]
    cmap = plt.get_cmap("tab10")
    for g_i, g in enumerate(group_names):
        mask = np.ones(len(acc), bool) if g is None else np.array([x == g for x in groups])
        ax.scatter(err[mask], acc[mask], s=28, alpha=0.7, color=cmap(g_i % 10),
                   label=g if g is not None else "trials")
    order = np.argsort(err[front])
    ax.plot(err[front][order], acc[front][order], "-", color="black", lw=1.2, zorder=3)
    ax.scatter(err[front], acc[front], s=60, facecolors="none", edgecolors="black", lw=1.4,
               zorder=4, label="Pareto front")
    if labels is not None:
        for i in np.flatnonzero(front):
            ax.annotate(labels[i], (err[i], acc[i]), fontsize=7, xytext=(4, -8),
                        textcoords="offset points")
    if selected is not None:
        ax.scatter([err[selected]], [acc[selected]], marker="*", s=260, color="gold",
                   edgecolors="black", zorder=5, label="selected")
    ax.set_xlabel(f"{ece_label} (%)")
    ax.set_ylabel(f"{accuracy_label} (%)")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if len(group_names) > 3:  # many methods: the legend goes beside the axes, not over points
        fig.set_size_inches(7.6, 4.5)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    bars = accuracy_sem is not None or ece_sem is not None
    # the PNG says what it shows (read by `PIL.Image.open(path).text["Description"]`)
    return _save(fig, path, metadata={"Description": (
        "Pareto front of validation accuracy vs. ECE" + (
            "; points are means over seeds with ±1 SEM error bars" if bars else ""))})


def compare_plot(
    methods: Sequence[str],
    ece_mean: Sequence[float],
    ece_sem: Sequence[float],
    accuracy_mean: Sequence[float],
    path: str | Path,
    *,
    effect: Sequence[float] | None = None,
    baseline: str = "ce",
    title: str = "",
    ece_label: str = "test ECE",
) -> Path:
    """Bars of each method's mean ECE with ±1 SEM error bars (the soft calibration paper's Fig. 5).

    Args:
        methods: method names, one bar each.
        ece_mean: mean ECE per method (fractions; plotted in percent).
        ece_sem: SEM of that ECE per method (NaN: no error bar, e.g. a single seed).
        accuracy_mean: mean accuracy per method (fractions), written under each bar.
        path: output PNG path.
        effect: Cohen's d of each method's ECE against `baseline` (NaN: not written).
        baseline: the method the effect sizes refer to.
        title: figure title.
        ece_label: y-axis label.

    Returns:
        The path written.
    """
    x = np.arange(len(methods))
    err = np.asarray(ece_mean, dtype=float) * 100
    sem = np.nan_to_num(np.asarray(ece_sem, dtype=float) * 100, nan=0.0)
    fig, ax = plt.subplots(figsize=(max(3.5, 1.1 * len(methods) + 1.5), 4.0))
    ax.bar(x, err, yerr=sem, capsize=4, color="tab:blue", edgecolor="black")
    ax.set_xticks(x, [f"{m}\nacc {100 * a:.2f}%" for m, a in
                      zip(methods, accuracy_mean, strict=True)], fontsize=8)
    ax.set_ylabel(f"{ece_label} (%)")
    if effect is not None:
        for xi, (e, s, d) in enumerate(zip(err, sem, effect, strict=True)):
            if d is not None and np.isfinite(d):
                ax.annotate(f"d={d:.2f}", (xi, e + s), textcoords="offset points", xytext=(0, 3),
                            ha="center", fontsize=8)
        title = title or f"Cohen's d against {baseline} (positive: lower ECE)"
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def shift_plot(
    frame: pd.DataFrame,
    path: str | Path,
    *,
    title: str = "",
    calibrator: str | None = None,
) -> Path:
    """Box plots of ECE and accuracy over corruptions per shift severity (Ovadia et al. 2019).

    As Karandikar et al. (NeurIPS 2021) Fig. 2: x = severity 0..5 (0 = clean), left panel ECE in
    percent, the uncalibrated model and, side by side, the model after the post-hoc calibrator
    (when ``frame`` has ``ece_cal``); right panel accuracy in percent (the calibrated boxes only
    where the calibrator changes accuracy). Each box spans the corruptions at one severity
    (whiskers 1.5 IQR, outliers as points), a white dot marks their mean (the quantity Fig. 2
    plots, there with the equal-mass l2 ECE); severity 0 is the single clean value.

    Args:
        frame: :meth:`raysearch.metrics.shift.ShiftReport.to_frame`: columns ``severity``, ``ece``,
            ``accuracy`` (fractions) and optionally ``ece_cal``, ``accuracy_cal``,
            ``calibrator``.
        path: output PNG path.
        title: figure title (e.g. the trial name).
        calibrator: legend name of the calibrator; defaults to the ``calibrator`` column, else
            ``"calibrated"``.

    Returns:
        The path written.

    Raises:
        ValueError: if ``frame`` is empty or lacks ``severity``, ``ece`` or ``accuracy``.
    """
    missing = [c for c in ("severity", "ece", "accuracy") if c not in frame.columns]
    if missing:
        raise ValueError(f"`frame` lacks column(s) {', '.join(missing)}; got {list(frame.columns)}")
    if len(frame) == 0:
        raise ValueError("`frame` must hold at least one row, got an empty DataFrame")
    severities = sorted(int(s) for s in frame["severity"].unique())
    has_cal = "ece_cal" in frame.columns and bool(frame["ece_cal"].notna().any())
    if calibrator is None:
        named = frame["calibrator"].dropna() if "calibrator" in frame.columns else []
        calibrator = str(named.iloc[0]) if len(named) else "calibrated"

    fig, (ax_ece, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    panels = ((ax_ece, "ece", "ECE (%)"), (ax_acc, "accuracy", "accuracy (%)"))
    for ax, metric, label in panels:
        series = _shift_series(frame, metric, calibrator, has_cal)
        _shift_panel(ax, frame, severities, series, metric, label)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def _shift_series(frame: pd.DataFrame, metric: str, calibrator: str, has_cal: bool
                  ) -> list[tuple[str, str, str]]:
    """``(legend name, column, color)`` of each box series of one panel of :func:`shift_plot`.

    The calibrated column of ECE always; of accuracy only where the calibrator changes it (else
    one series, named for both).
    """
    series = [("uncalibrated", metric, "tab:blue")]
    cal_column = f"{metric}_cal"
    if has_cal and cal_column in frame.columns:
        changed = not np.allclose(
            frame[metric].to_numpy(float), frame[cal_column].to_numpy(float), equal_nan=True
        )
        if metric == "ece" or changed:
            series.append((calibrator, cal_column, "tab:orange"))
        else:
            series = [(f"uncalibrated (= {calibrator})", metric, "tab:blue")]
    return series


def _shift_panel(ax: plt.Axes, frame: pd.DataFrame, severities: list[int],
                 series: list[tuple[str, str, str]], metric: str, label: str) -> None:
    """One panel of :func:`shift_plot`: side-by-side box plots per severity, in percent."""

    def values(column: str, severity: int) -> np.ndarray:
        column_values = frame.loc[frame["severity"] == severity, column].to_numpy(dtype=float)
        return column_values[np.isfinite(column_values)] * 100

    width = 0.7 / len(series)
    handles = []
    for j, (name, column, color) in enumerate(series):
        offset = (j - (len(series) - 1) / 2) * width
        ax.boxplot(
            [values(column, s) for s in severities],
            positions=np.asarray(severities, dtype=float) + offset,
            widths=width * 0.85,
            patch_artist=True,
            manage_ticks=False,
            showmeans=True,
            boxprops={"facecolor": color, "alpha": 0.6},
            medianprops={"color": "black"},
            meanprops={"marker": "o", "markerfacecolor": "white",
                       "markeredgecolor": "black", "markersize": 4},
            flierprops={"marker": ".", "markersize": 4},
        )
        handles.append(Patch(facecolor=color, alpha=0.6, edgecolor="black", label=name))
    ax.set_xticks(severities)
    ax.set_xticklabels(["clean" if s == 0 else str(s) for s in severities])
    ax.set_xlim(min(severities) - 0.6, max(severities) + 0.6)
    ax.set_xlabel("corruption severity")
    ax.set_ylabel(label)
    ax.grid(axis="y", alpha=0.3)
    location = "upper left" if metric == "ece" else "lower left"
    ax.legend(handles=handles, fontsize=8, loc=location)


#: ImageNet normalisation of the segmentation transforms, undone to show the images.
_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
_IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def confidence_maps(
    images: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    path: str | Path,
    *,
    title: str = "",
    ignore_index: int = 255,
) -> Path:
    """Image | ground truth | prediction | confidence, one row per image (MbLS Fig. 3 (a)).

    Args:
        images: ``(image float (3, H, W) normalised with the ImageNet mean/std, ground truth
            int (H, W), prediction int (H, W), confidence float (H, W) in [0, 1])`` per row.
        path: output PNG path.
        title: figure title.
        ignore_index: the ground-truth label drawn white (VOC's object boundaries).

    Returns:
        The path written.

    Raises:
        ValueError: if `images` is empty.
    """
    if not images:
        raise ValueError("confidence maps of no image")
    from raysearch.training.data.segmentation import voc_palette

    palette = voc_palette() / 255.0
    rows = len(images)
    fig, axes = plt.subplots(rows, 4, figsize=(9.6, 2.5 * rows), squeeze=False)
    shown = None
    for r, (image, truth, pred, conf) in enumerate(images):
        rgb = np.clip(np.transpose(image, (1, 2, 0)) * _IMAGENET_STD + _IMAGENET_MEAN, 0, 1)
        gt = palette[np.clip(truth, 0, 255)]
        gt[truth == ignore_index] = 1.0
        panels = (rgb, gt, palette[np.clip(pred, 0, 255)])
        for c, panel in enumerate(panels):
            axes[r, c].imshow(panel, interpolation="nearest")
        shown = axes[r, 3].imshow(conf, cmap="viridis", vmin=0.0, vmax=1.0,
                                  interpolation="nearest")
        for c, name in enumerate(("image", "ground truth", "prediction", "confidence")):
            axes[r, c].set_xticks([])
            axes[r, c].set_yticks([])
            if r == 0:
                axes[r, c].set_title(name, fontsize=9)
    fig.colorbar(shown, ax=axes[:, 3].tolist(), fraction=0.05, pad=0.02)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path, dpi=90)
