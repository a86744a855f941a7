r"""Reproduction report: our numbers beside the papers' published ones, on real network outputs.

Some papers we implement published calibration numbers on network outputs that their authors
released. Where such outputs are at hand, :func:`reproduce` refits our calibrators on them with
the settings the paper used and compares. :data:`PUBLISHED` lists every published number we
check: the paper and table, the released output file it belongs to, the call that gives our
number, and its kind:

* ``"default"``: the call uses only our defaults (the method as the paper ran it);
* ``"explicit"``: the paper's row ran a different implementation than our method of that name
  (e.g. its own re-implementation of a baseline); a named setting reproduces it;
* ``"info"``: shown for comparison, not expected to match (the note says why). The
  ``Average`` rows of a table are ``info`` rows too: ours is the mean of our four rows above.

A ``default`` or ``explicit`` row that misses its published ECE by more than ``tolerance`` (0.3
ECE points unless told otherwise), or fails to compute, fails the report: ``raysearch reproduce
DIR`` then exits with status 1.

Every file under the data folder is listed in the report, used or skipped with the reason: a
name that is no released output file of :data:`PUBLISHED`, a pickle read without
``allow_pickle``, an unreadable file, arrays of the wrong layout or number of classes, or a
second copy of outputs already read. File names are matched case-insensitively.

Published numbers checked (ECE in %, 15 equal-width bins, calibrator fitted on the released
validation logits and measured on the released test logits):

* Jung et al., "Scaling of Class-wise Training Losses for Post-hoc Calibration", ICML 2023,
  Table 2 (CIFAR-10-LT and CIFAR-100-LT): DenseNet-40, WideResNet-28, ResNet-110 and
  ResNet-110-SD trained on long-tailed CIFAR (App. C, Eq. 16: :math:`\#D_i = \#D_0
  \rho^{i/(c-1)}` with :math:`\#D_0` = 5,000 (CIFAR-10) or 500 (CIFAR-100) and :math:`\rho`
  = 0.1, i.e. an imbalance ratio :math:`\#D_0 / \#D_{c-1}` of 10: the only value giving the
  paper's 20,431 and 19,573 images). Those images are split about 50/50 into the network's
  training set and the validation set the calibrators are fitted on ("10215/10216/10000 for
  CIFAR10-LT and 9786/9787/10000 for CIFAR100-LT", Sec. 5.1), still long-tailed (2,486 ... 256
  per class on CIFAR-10); the test set is the full balanced test set (10,000). Released with
  github.com/SeungjinJung/SCTL (commit 1f8585e; later moved to a download link in its README)
  under the names its ``models/utils.py`` reads:

  ========================  ==============  ==================================================
  network                   authors' name   file (``c100`` for CIFAR-100-LT)
  ========================  ==============  ==================================================
  DenseNet-40               densenet40      ``probs_densenet40_c10_LT_logits.p``
  WideResNet-28             resnet_wide28   ``probs_resnet_wide28_c10_LT_logits.p``
  ResNet-110                resnet110       ``probs_resnet110_c10_LT_logits.p``
  ResNet-110-SD             resnet110_SD    ``probs_resnet110_SD_c10_LT_logits.p``
  ========================  ==============  ==================================================

  (pickles of ``((val_logits, val_labels), (test_logits, test_labels))``); the same arrays as
  an ``.npz`` with ``val_logits``, ``val_labels``, ``test_logits``, ``test_labels`` are read
  too, named ``sctl_<authors' name>_cifar10_lt_logits.npz`` (``cifar100`` for CIFAR-100-LT),
  e.g. ``sctl_densenet40_cifar10_lt_logits.npz``. Table 2 has no ResNet-32 (its Table 1's
  WideResNet-32 outputs are balanced CIFAR, not checked here). Rows, for each network: the
  twenty of the table (uncalibrated, TS, ETS, PTS, CTS, each also with LS, with FL and with
  class-wise scaling, "Ours" in the table, and the four averages).

The module is plain NumPy (torch through the calibrators): no Ray, no MLflow.
"""

import logging
import math
import pickle
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysearch.metrics import softmax, table_summary

__all__ = [
    "DEFAULT_TOLERANCE",
    "KINDS",
    "PUBLISHED",
    "FoundFile",
    "PublishedNumber",
    "ReproductionReport",
    "ReproductionRow",
    "find_output_file",
    "reproduce",
]

logger = logging.getLogger(__name__)

#: Largest |ours - published| ECE difference, in ECE points (percent), that a checked row may
#: miss by.
DEFAULT_TOLERANCE = 0.3
#: Kinds of :class:`PublishedNumber` (module docstring); the first two are checked.
KINDS = ("default", "explicit", "info")
#: Bins of the ECE in every published number checked here (15 equal-width bins).
N_BINS = 15

_JUNG = "Jung et al. 2023, Table 2"


@dataclass(frozen=True)
class PublishedNumber:
    """One published calibration result on released network outputs.

    Attributes:
        source: the paper and table, e.g. ``"Jung et al. 2023, Table 2 (CIFAR-10-LT)"``.
        network: the network whose outputs were calibrated, e.g. ``"DenseNet-40"``.
        files: accepted names of the released output file, first the ``.npz`` layout, then the
            authors' own file name; looked up anywhere under the report's data folder,
            case-insensitively.
        label: the row as the paper names it, e.g. ``"TS + class-wise scaling"``.
        calibrator: a :func:`raysearch.calibration.fit_calibrator` name, or None for the
            uncalibrated outputs (and for an average row).
        params: keyword arguments of ``fit_calibrator`` beyond the name and the data.
        ece_pct: the published ECE in percent (15 bins).
        accuracy_pct: the published accuracy in percent, or None.
        kind: ``"default"``, ``"explicit"`` or ``"info"`` (module docstring).
        note: why the row is not a default, shown under the table.
        n_classes: the number of classes K the file's logits must have, or None for any.
        average_of: for an average row, the labels of the rows (same source and network) whose
            mean it is; empty otherwise.
    """

    source: str
    network: str
    files: tuple[str, ...]
    label: str
    calibrator: str | None
    params: Mapping[str, Any]
    ece_pct: float
    accuracy_pct: float | None = None
    kind: str = "default"
    note: str = ""
    n_classes: int | None = None
    average_of: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"`kind` must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.average_of and self.calibrator is not None:
            raise ValueError(f"an average row has no calibrator, got {self.calibrator!r}")

    @property
    def checked(self) -> bool:
        """Whether a miss fails the report (``default`` and ``explicit`` rows)."""
        return self.kind != "info"

    @property
    def call(self) -> str:
        """The call that gives our number, e.g. ``fit_calibrator("ts", classwise_scaling=True)``."""
        if self.average_of:
            return f"(mean of the {len(self.average_of)} rows above)"
        if self.calibrator is None:
            return "(uncalibrated)"
        args = [_literal(self.calibrator)]
        args += [f"{key}={_literal(value)}" for key, value in self.params.items()]
        return f"fit_calibrator({', '.join(args)})"


def _literal(value: Any) -> str:
    """A Python literal with double-quoted strings, as the docs write calls."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


#: Table 2's networks: (name in the table, the authors' file-name part).
_SCTL_NETWORKS = (
    ("DenseNet-40", "densenet40"),
    ("WideResNet-28", "resnet_wide28"),
    ("ResNet-110", "resnet110"),
    ("ResNet-110-SD", "resnet110_SD"),
)


def _sctl_files(net: str, cifar: int) -> tuple[str, str]:
    """Accepted names of one released Table 2 file: our ``.npz`` name, the authors' pickle."""
    short = "c10" if cifar == 10 else "c100"
    return (
        f"sctl_{net.lower()}_cifar{cifar}_lt_logits.npz",
        f"probs_{net}_{short}_LT_logits.p",
    )


_CS = {"classwise_scaling": True}
_LS = {"loss": "ls", "epsilon": 0.05}
_FL = {"loss": "focal", "gamma": 3.0}
_ETS_NOTE = (
    "the paper's ETS (its released code) mixes LOGITS, w1 z/t + w2 z + w3/K with free weights, "
    "which is one temperature again: our `ts` reproduces it; our `ets` is Mix-n-Match's ETS "
    "(an ensemble of probabilities, the method of Zhang et al.)"
)
_PTS_NOTE = (
    "the paper's PTS is its released re-implementation (10-2-2-2-2-1 ReLU MLP on raw logits, "
    "seed 1, Adam 0.02 x 1000, NLL): `pts_sctl`; our `pts` is Tomani et al.'s method"
)
_SCHEDULE_NOTE = (
    "not reproduced by design: the released LS/FL fits of TS, ETS and CTS run a fixed L-BFGS "
    "schedule (lr 0.005/0.003/0.001 for 200/400/400 iterations) that stops far from the "
    "minimum; ours minimise the objective to convergence"
)
_PTS_FL_NOTE = (
    "not reproduced by design: the released PTS + FL fit runs a fixed Adam schedule (lr "
    "0.005/0.003/0.001 for 200/400/400 steps); `pts_sctl` runs Adam 0.02 x 1000 on the focal "
    "loss, which ends at the focal-loss temperature"
)
_AVERAGE_NOTE = "the table's average of the four rows above; ours is the mean of our four"
_WRN100_NOTE = (
    "a misprint in Table 2: it repeats the CIFAR-10-LT value 9.11; the authors' released logs "
    "(log/TS_CE.log) give 18.08 for these outputs"
)

#: Rows of Table 2: (label, calibrator, fit_calibrator params, kind, note); an average row has
#: the calibrator None and the note ``_AVERAGE_NOTE``.
_TABLE2_ROWS: tuple[tuple[str, str | None, Mapping[str, Any], str, str], ...] = (
    ("uncalibrated", None, {}, "default", ""),
    ("TS", "ts", {}, "default", ""),
    ("ETS", "ts", {}, "explicit", _ETS_NOTE),
    ("PTS", "pts_sctl", {}, "explicit", _PTS_NOTE),
    ("CTS", "cts", {}, "default", ""),
    ("Average: baseline", None, {}, "info", _AVERAGE_NOTE),
    ("TS + LS", "ts", _LS, "info", _SCHEDULE_NOTE),
    ("ETS + LS", "ts", _LS, "info", _SCHEDULE_NOTE),
    ("PTS + LS", "pts_sctl", _LS, "explicit", _PTS_NOTE),
    ("CTS + LS", "cts", _LS, "info", _SCHEDULE_NOTE),
    ("Average: + LS", None, {}, "info", _AVERAGE_NOTE),
    ("TS + FL", "ts", _FL, "info", _SCHEDULE_NOTE),
    ("ETS + FL", "ts", _FL, "info", _SCHEDULE_NOTE),
    ("PTS + FL", "pts_sctl", _FL, "info", _PTS_FL_NOTE),
    ("CTS + FL", "cts", _FL, "info", _SCHEDULE_NOTE),
    ("Average: + FL", None, {}, "info", _AVERAGE_NOTE),
    ("TS + class-wise scaling", "ts", _CS, "default", ""),
    ("ETS + class-wise scaling", "ts", _CS, "explicit", _ETS_NOTE),
    ("PTS + class-wise scaling", "pts_sctl", _CS, "explicit", _PTS_NOTE),
    ("CTS + class-wise scaling", "cts", _CS, "default", ""),
    ("Average: + class-wise", None, {}, "info", _AVERAGE_NOTE),
)


def _table2(
    cifar: int,
    network: str,
    net: str,
    ece_pct: Sequence[float],
    acc_pct: Sequence[float],
    overrides: Mapping[str, tuple[str, str]] | None = None,
) -> list[PublishedNumber]:
    """One column of Table 2: ECE and accuracy (%) in the row order of ``_TABLE2_ROWS``.

    ``overrides`` maps a row label to its (kind, note) where the table itself is wrong.
    """
    source = f"{_JUNG} (CIFAR-{cifar}-LT)"
    files = _sctl_files(net, cifar)
    rows = []
    for i, ((label, cal, params, kind, note), value, acc) in enumerate(
        zip(_TABLE2_ROWS, ece_pct, acc_pct, strict=True)
    ):
        kind, note = (overrides or {}).get(label, (kind, note))
        average_of = ()
        if note == _AVERAGE_NOTE:
            average_of = tuple(row[0] for row in _TABLE2_ROWS[i - 4 : i])
        rows.append(
            PublishedNumber(
                source, network, files, label, cal, dict(params), value, acc, kind, note,
                cifar, average_of,
            )
        )
    return rows


#: Every published number the report checks (module docstring): Jung et al. 2023, Table 2,
#: each column in the row order of ``_TABLE2_ROWS`` (ECE %, then accuracy %).
PUBLISHED: tuple[PublishedNumber, ...] = (
    *_table2(
        10, "DenseNet-40", "densenet40",
        (21.08, 6.16, 6.15, 6.10, 6.02, 6.11, 8.16, 0.74, 1.02, 8.13, 4.51,
         7.24, 9.57, 10.52, 9.82, 9.29, 3.22, 3.08, 3.13, 2.79, 3.06),
        (72.11, 72.11, 72.11, 72.11, 72.37, 72.18, 72.11, 72.11, 72.11, 72.00, 72.08,
         72.11, 72.11, 72.11, 72.12, 72.11, 72.11, 72.11, 72.11, 74.99, 72.83),
    ),
    *_table2(
        10, "WideResNet-28", "resnet_wide28",
        (9.11, 4.47, 4.46, 4.43, 4.16, 4.38, 2.24, 1.54, 1.67, 2.59, 2.01,
         1.68, 11.69, 12.42, 1.35, 6.79, 3.19, 3.17, 3.16, 1.99, 2.88),
        (85.38, 85.38, 85.38, 85.38, 86.42, 85.64, 85.38, 85.38, 85.38, 86.03, 85.54,
         85.38, 85.38, 85.38, 86.01, 85.54, 85.38, 85.38, 85.38, 88.00, 86.04),
    ),
    *_table2(
        10, "ResNet-110", "resnet110",
        (19.14, 5.94, 5.93, 5.90, 5.74, 5.88, 8.99, 1.49, 1.12, 8.94, 5.14,
         8.45, 9.51, 10.20, 10.58, 9.69, 3.53, 3.40, 3.47, 2.96, 3.34),
        (75.97, 75.97, 75.97, 75.97, 76.17, 76.02, 75.97, 75.97, 75.97, 76.08, 76.00,
         75.97, 75.97, 75.97, 76.16, 76.02, 75.97, 75.97, 75.97, 78.55, 76.62),
    ),
    *_table2(
        10, "ResNet-110-SD", "resnet110_SD",
        (14.43, 6.84, 6.84, 6.76, 7.36, 6.95, 2.90, 1.63, 1.50, 4.59, 2.66,
         4.33, 9.85, 10.24, 2.60, 6.76, 2.53, 2.39, 2.40, 2.19, 2.38),
        (64.90, 64.90, 64.90, 64.90, 64.10, 64.70, 64.90, 64.90, 64.90, 63.76, 64.62,
         64.90, 64.90, 64.90, 65.26, 64.99, 64.90, 64.90, 64.90, 67.43, 65.53),
    ),
    *_table2(
        100, "DenseNet-40", "densenet40",
        (38.40, 8.89, 8.85, 8.77, 11.54, 9.51, 12.37, 4.40, 3.62, 14.35, 8.69,
         10.01, 0.96, 1.25, 11.26, 5.87, 4.44, 4.18, 4.29, 3.44, 4.09),
        (37.97, 37.97, 37.97, 37.97, 36.72, 37.66, 37.97, 37.97, 37.97, 37.27, 37.80,
         37.97, 37.97, 37.97, 37.78, 37.92, 37.97, 37.97, 37.97, 40.13, 38.51),
    ),
    *_table2(
        100, "WideResNet-28", "resnet_wide28",
        (9.11, 9.62, 9.60, 9.60, 8.06, 9.22, 7.43, 6.89, 6.72, 6.76, 6.95,
         6.04, 6.15, 6.17, 5.40, 5.94, 6.99, 6.92, 6.90, 5.56, 6.59),
        (53.57, 53.57, 53.57, 53.57, 56.03, 54.19, 53.57, 53.57, 53.57, 53.75, 53.62,
         53.57, 53.57, 53.57, 55.86, 54.14, 53.57, 53.57, 53.57, 57.62, 54.58),
        overrides={"uncalibrated": ("info", _WRN100_NOTE)},
    ),
    *_table2(
        100, "ResNet-110", "resnet110",
        (41.98, 8.46, 8.38, 8.29, 11.43, 9.14, 15.02, 4.64, 3.85, 16.94, 10.11,
         12.91, 1.24, 1.76, 14.48, 7.60, 4.50, 4.23, 4.33, 3.85, 4.23),
        (38.57, 38.57, 38.57, 38.57, 36.55, 38.07, 38.57, 38.57, 38.57, 37.77, 38.37,
         38.57, 38.57, 38.57, 38.10, 38.45, 38.57, 38.57, 38.57, 39.79, 38.88),
    ),
    *_table2(
        100, "ResNet-110-SD", "resnet110_SD",
        (30.32, 4.81, 4.76, 4.69, 7.43, 5.42, 5.85, 1.74, 1.54, 8.47, 4.40,
         2.31, 3.56, 4.53, 4.52, 3.73, 1.48, 1.56, 1.45, 1.50, 1.50),
        (34.87, 34.87, 34.87, 34.87, 33.27, 34.47, 34.87, 34.87, 34.87, 33.64, 34.56,
         34.87, 34.87, 34.87, 34.06, 34.67, 34.87, 34.87, 34.87, 36.32, 35.23),
    ),
)


@dataclass(frozen=True)
class ReproductionRow:
    """Our number beside a published one.

    Attributes:
        published: the published result.
        file: the output file used, or None when none of ``published.files`` was usable.
        ece_pct: our ECE in percent (NaN when not computed).
        accuracy_pct: our accuracy in percent (NaN when not computed).
        error: why our number could not be computed ("" when it was).
    """

    published: PublishedNumber
    file: Path | None
    ece_pct: float = math.nan
    accuracy_pct: float = math.nan
    error: str = ""

    @property
    def difference(self) -> float:
        """Ours minus published, in ECE points (NaN when not computed)."""
        return self.ece_pct - self.published.ece_pct

    def status(self, tolerance: float) -> str:
        """``"ok"``, ``"MISS"`` (beyond ``tolerance``), ``"error"`` or ``"no file"``."""
        if self.file is None:
            return "no file"
        if self.error or math.isnan(self.ece_pct):
            return "error"
        return "ok" if abs(self.difference) <= tolerance + 1e-9 else "MISS"


@dataclass(frozen=True)
class FoundFile:
    """One file found under the data folder, and what the report did with it.

    Attributes:
        path: the file.
        used: whether its outputs were used for published rows.
        reason: what it was used for, or why it was skipped (one line).
    """

    path: Path
    used: bool
    reason: str


@dataclass
class ReproductionReport:
    """The rows of a reproduction run, the files seen, and the tolerance they were judged by.

    Attributes:
        rows: one :class:`ReproductionRow` per published number.
        tolerance: the largest allowed |ours - published| in ECE points.
        data_dir: the folder the output files were looked up in.
        files: every file found under ``data_dir``, used or skipped, in path order.
    """

    rows: list[ReproductionRow]
    tolerance: float = DEFAULT_TOLERANCE
    data_dir: Path | None = None
    files: list[FoundFile] | None = None

    @property
    def found(self) -> list[ReproductionRow]:
        """Rows whose output file was found and used."""
        return [row for row in self.rows if row.file is not None]

    @property
    def checked(self) -> list[ReproductionRow]:
        """Found rows whose miss fails the report (``default`` and ``explicit`` kinds)."""
        return [row for row in self.found if row.published.checked]

    @property
    def failures(self) -> list[ReproductionRow]:
        """Checked rows that missed by more than the tolerance or could not be computed."""
        return [row for row in self.checked if row.status(self.tolerance) in ("MISS", "error")]

    @property
    def passed(self) -> bool:
        """True when at least one row was checked and none of them failed."""
        return bool(self.checked) and not self.failures

    @property
    def skipped(self) -> list[FoundFile]:
        """Files found under ``data_dir`` and not used."""
        return [found for found in self.files or [] if not found.used]

    def format_files(self) -> str:
        """Every file found under ``data_dir``: ``used`` or ``skipped``, and why."""
        files = self.files or []
        lines = [f"files under {self.data_dir}: {len(files)} found, "
                 f"{sum(f.used for f in files)} used"]
        for found in files:
            name = found.path
            if self.data_dir is not None and found.path.is_relative_to(self.data_dir):
                name = found.path.relative_to(self.data_dir)
            lines.append(f"  {'used' if found.used else 'skipped':<8} {name}: {found.reason}")
        return "\n".join(lines)

    def format_table(self) -> str:
        """The report as text: the files, the rows of the used files, the notes, a summary."""
        header = (
            f"{'network':<{_NET_W}} {'method':<{_LABEL_W}} {'ours':>6} {'paper':>6} {'diff':>6} "
            f"{'acc ours/paper':>14}  {'kind':<9} {'status':<8} call"
        )
        lines = [self.format_files(), ""] if self.files is not None else []
        notes: dict[str, str] = {}
        for source in dict.fromkeys(row.published.source for row in self.found):
            lines += [f"{source}: ECE % (15 bins), fitted on val, measured on test", header]
            for row in (r for r in self.found if r.published.source == source):
                pub = row.published
                acc_pub = "-" if pub.accuracy_pct is None else f"{pub.accuracy_pct:.2f}"
                acc = f"{_fmt(row.accuracy_pct)}/{acc_pub}"
                status = row.status(self.tolerance)
                if not pub.checked and status in ("ok", "MISS"):
                    status = "-"
                diff = row.difference
                diff_text = "" if math.isnan(diff) else f"{round(diff, 2) + 0.0:+.2f}"
                mark = ""
                if pub.note:
                    mark = notes.setdefault(pub.note, f"[{len(notes) + 1}]")
                lines.append(
                    f"{pub.network:<{_NET_W}} {pub.label:<{_LABEL_W}} {_fmt(row.ece_pct):>6} "
                    f"{pub.ece_pct:>6.2f} {diff_text:>6} {acc:>14}  {pub.kind:<9} "
                    f"{status:<8} {pub.call} {mark}".rstrip()
                )
                if row.error:
                    lines.append(f"{'':<{_NET_W}} error: {row.error}")
            lines.append("")
        lines += [f"{mark} {note}" for note, mark in notes.items()]
        missing = sorted({row.published.files[-1] for row in self.rows if row.file is None})
        summary = (
            f"{len(self.checked) - len(self.failures)} of {len(self.checked)} checked results "
            f"(default and explicit settings) within {self.tolerance:g} ECE points of the "
            f"published number"
        )
        if missing:
            summary += f"; not found (skipped): {', '.join(missing)}"
        if notes:
            lines.append("")
        lines.append(summary)
        return "\n".join(lines)


#: Widths of the network and method columns of :meth:`ReproductionReport.format_table`.
_NET_W = 13
_LABEL_W = 25


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def find_output_file(data_dir: Path, names: Iterable[str]) -> Path | None:
    """The first file under ``data_dir`` (recursively) named one of ``names``, or None.

    Names are compared case-insensitively; ``names`` are tried in order, and the first match in
    path order is returned.
    """
    files = sorted(path for path in Path(data_dir).rglob("*") if path.is_file())
    for name in names:
        for path in files:
            if path.name.lower() == name.lower():
                return path
    return None


def _load_split(
    path: Path, allow_pickle: bool, n_classes: int | None
) -> tuple[np.ndarray, ...]:
    """(val_logits, val_labels, test_logits, test_labels) of a released output file.

    Raises:
        ValueError: with the reason the file cannot be used, one line.
    """
    from raysearch.calibration.posthoc import _PICKLE_SUFFIXES, load_outputs

    if path.suffix.lower() in _PICKLE_SUFFIXES and not allow_pickle:
        raise ValueError(
            "a pickle, not read without --allow-pickle (allow_pickle=True): unpickling can run "
            "code, so only for files you trust"
        )
    try:
        outputs = load_outputs(path, allow_pickle=allow_pickle)
    except ValueError as exc:
        text = " ".join(str(exc).split()).removeprefix(f"{path}: ")
        raise ValueError(f"wrong layout or array shapes: {text}") from exc
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, OSError) as exc:
        kind = "pickle" if path.suffix.lower() in _PICKLE_SUFFIXES else "file"
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"unreadable {kind} ({type(exc).__name__}: {text})") from exc
    except Exception as exc:  # any other unpickling failure (e.g. a class that is missing)
        kind = "pickle" if path.suffix.lower() in _PICKLE_SUFFIXES else "file"
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"unreadable {kind} ({type(exc).__name__}: {text})") from exc
    if outputs.split is None:
        raise ValueError(
            "wrong layout: no val/test split (needs val_* and test_* arrays, or the pair "
            "((val_logits, val_labels), (test_logits, test_labels)))"
        )
    if n_classes is not None and outputs.n_classes != n_classes:
        raise ValueError(
            f"wrong array shapes: logits of {outputs.n_classes} classes, the published outputs "
            f"have {n_classes}"
        )
    val, test = outputs.split == "val", outputs.split == "test"
    return outputs.logits[val], outputs.labels[val], outputs.logits[test], outputs.labels[test]


def _evaluate(
    published: PublishedNumber, data: tuple[np.ndarray, ...]
) -> tuple[float, float]:
    """Our (ECE %, accuracy %) for one published row (not an average row)."""
    from raysearch.calibration import fit_calibrator

    val_logits, val_labels, test_logits, test_labels = data
    if published.calibrator is None:
        probs = softmax(test_logits)
    else:
        calibrator = fit_calibrator(
            published.calibrator, val_logits, val_labels, **dict(published.params)
        )
        probs = calibrator.predict_proba(test_logits)
    values = table_summary(probs, test_labels, n_bins=N_BINS, keys=("ece", "accuracy"))
    return 100.0 * values["ece"], 100.0 * values["accuracy"]


def _average(published: PublishedNumber, rows: Sequence[ReproductionRow]) -> ReproductionRow:
    """Our row for an average row: the mean of our rows it averages (NaN if one is missing)."""
    parts = [
        row for row in rows
        if row.published.source == published.source
        and row.published.network == published.network
        and row.published.label in published.average_of
    ]
    path = parts[0].file if parts else None
    if len(parts) != len(published.average_of) or any(row.error for row in parts):
        return ReproductionRow(published, path, error="a row it averages was not computed")
    return ReproductionRow(
        published,
        path,
        float(np.mean([row.ece_pct for row in parts])),
        float(np.mean([row.accuracy_pct for row in parts])),
    )


def _scan(
    folder: Path, published: Sequence[PublishedNumber], allow_pickle: bool
) -> tuple[dict[tuple[str, ...], tuple[Path, tuple[np.ndarray, ...]]], list[FoundFile]]:
    """Read every released file under ``folder``; list every file with what was done with it.

    Returns:
        (the data of each used file by its ``files`` key, every file found in path order).
    """
    groups: dict[tuple[str, ...], list[PublishedNumber]] = {}
    for pub in published:
        groups.setdefault(pub.files, []).append(pub)
    by_name: dict[str, tuple[tuple[str, ...], int]] = {}
    for files in groups:
        for rank, name in enumerate(files):
            by_name.setdefault(name.lower(), (files, rank))
    paths = sorted(path for path in folder.rglob("*") if path.is_file())
    # the preferred name of each group first (the .npz before the pickle), then path order
    order = sorted(
        (by_name[path.name.lower()][1] if path.name.lower() in by_name else 0, path)
        for path in paths
    )
    loaded: dict[tuple[str, ...], tuple[Path, tuple[np.ndarray, ...]]] = {}
    verdicts: dict[Path, FoundFile] = {}
    for _, path in order:
        key = by_name.get(path.name.lower())
        if key is None:
            verdicts[path] = FoundFile(
                path, False, "unknown name: not a released output file of a published table"
            )
            continue
        files = key[0]
        rows = groups[files]
        what = f"{rows[0].network}, {rows[0].source}"
        if files in loaded:
            verdicts[path] = FoundFile(
                path, False, f"{what}: a second copy; {loaded[files][0].name} was used"
            )
            continue
        try:
            data = _load_split(path, allow_pickle, rows[0].n_classes)
        except ValueError as exc:
            verdicts[path] = FoundFile(path, False, f"{what}: {exc}")
            continue
        loaded[files] = (path, data)
        sizes = f"{len(data[1])} val / {len(data[3])} test samples, {data[0].shape[1]} classes"
        verdicts[path] = FoundFile(path, True, f"{what}: {len(rows)} rows ({sizes})")
    return loaded, [verdicts[path] for path in paths]


def reproduce(
    data_dir: str | Path,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    published: Sequence[PublishedNumber] = PUBLISHED,
    allow_pickle: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ReproductionReport:
    """Compute our number for every published result whose output file is under ``data_dir``.

    Every file under ``data_dir`` is listed in the report (``report.files``): used, or
    skipped with the reason (unknown name, a pickle without ``allow_pickle``, unreadable, wrong
    layout or number of classes, a second copy). Each used file is read once; every row of it
    fits its calibrator on the validation logits and measures ECE (15 bins, a fraction reported
    in percent) and accuracy on the test logits. A row whose calibrator fails records the error
    and the others go on.

    Args:
        data_dir: folder searched (recursively) for the files named in ``published``.
        tolerance: largest allowed |ours - published| in ECE points (percent), >= 0.
            Defaults to ``0.3``.
        published: the results to check. Defaults to :data:`PUBLISHED`.
        allow_pickle: read the authors' pickle files (``.p``); only for files you trust.
            Defaults to ``False``.
        progress: called with one line per file found and per row as it is computed (e.g.
            ``click.echo``). Defaults to ``None``.

    Returns:
        The :class:`ReproductionReport`; ``report.passed`` is False when a checked row misses.

    Raises:
        FileNotFoundError: if ``data_dir`` is not a directory.
        ValueError: if ``tolerance`` is negative or NaN, or no file under ``data_dir`` can be
            used (none has a released name, or each one is skipped: the message names them
            with the reasons).
    """
    folder = Path(data_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such directory: {folder}")
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0):
        raise ValueError(f"`tolerance` must be a number >= 0 (ECE points), got {tolerance!r}")
    loaded, found = _scan(folder, published, allow_pickle)
    if not loaded:
        expected = ", ".join(dict.fromkeys(name for pub in published for name in pub.files))
        skipped = [f for f in found if not f.reason.startswith("unknown name")]
        detail = "; ".join(f"{f.path.name}: {f.reason}" for f in skipped[:5])
        more = f" (and {len(skipped) - 5} more)" if len(skipped) > 5 else ""
        raise ValueError(
            f"no released output file under {folder} could be used"
            + (f": {detail}{more}" if skipped else f"; expected any of: {expected}")
            + f" ({len(found)} file(s) found)"
        )
    if progress is not None:
        used = ", ".join(str(f.path.relative_to(folder)) for f in found if f.used)
        progress(f"{len(found)} file(s) under {folder}, {len(loaded)} used: {used}")
    cache: dict[tuple[Path, str | None, str], tuple[float, float] | str] = {}
    rows: list[ReproductionRow] = []
    for pub in published:
        if pub.files not in loaded:
            rows.append(ReproductionRow(pub, None))
            continue
        path, data = loaded[pub.files]
        if pub.average_of:
            row = _average(pub, rows)
        else:
            key = (path, pub.calibrator, repr(sorted(pub.params.items())))
            if key not in cache:
                try:
                    cache[key] = _evaluate(pub, data)
                except (ValueError, RuntimeError, ArithmeticError, np.linalg.LinAlgError) as exc:
                    cache[key] = " ".join(str(exc).split())
            result = cache[key]
            if isinstance(result, str):
                row = ReproductionRow(pub, path, error=result)
            else:
                row = ReproductionRow(pub, path, *result)
        rows.append(row)
        if progress is not None:
            progress(
                f"  {pub.network} {pub.label}: {_fmt(row.ece_pct)} (paper {pub.ece_pct:.2f})"
            )
    return ReproductionReport(rows, float(tolerance), folder, found)
