"""Reproduction report: our numbers beside the papers' published ones, on real network outputs.

Some papers we implement published calibration numbers on network outputs that their authors
released. Where such outputs are at hand, :func:`reproduce` refits our calibrators on them with
the settings the paper used and compares, row by row of
:data:`~raysearch.calibration.published.PUBLISHED` (the published numbers, their calls and
kinds: :mod:`raysearch.calibration.published`).

A ``default`` or ``explicit`` row that misses its published ECE by more than ``tolerance`` (0.3
ECE points unless told otherwise), or fails to compute, fails the report: ``raysearch reproduce
DIR`` then exits with status 1.

Every file under the data folder is listed in the report, used or skipped with the reason: a
name that is no released output file of :data:`PUBLISHED`, a pickle read without
``allow_pickle``, an unreadable file, arrays of the wrong layout or number of classes, or a
second copy of outputs already read. File names are matched case-insensitively.

The fits run one by one or in spawned worker processes (``processes``), each with torch on
one thread. The module is NumPy and torch: no Ray, no MLflow.
"""

import logging
import math
import multiprocessing
import os
import pickle
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from raysearch.calibration.published import KINDS, PUBLISHED, PublishedNumber
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
#: Bins of the ECE in every published number checked here (15 equal-width bins).
N_BINS = 15
#: With ``processes=None``, fits run in worker processes only when their validation logits
#: hold at least this many entries in all (a worker's start, importing torch, costs ~2 s).
_PARALLEL_MIN_ENTRIES = 1_000_000


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
    from raysearch.calibration.outputs import _PICKLE_SUFFIXES, load_outputs

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


@contextmanager
def _one_thread() -> Iterator[None]:
    """Torch on one thread inside, the caller's thread count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _evaluate_row(
    published: PublishedNumber, data: tuple[np.ndarray, ...]
) -> tuple[float, float] | str:
    """:func:`_evaluate` on one torch thread, or the one-line error of a failed fit.

    One thread makes a fit's numbers the same in this process and in a worker, whatever the
    machine's number of cores.
    """
    try:
        with _one_thread():
            return _evaluate(published, data)
    except (ValueError, RuntimeError, ArithmeticError, np.linalg.LinAlgError) as exc:
        return " ".join(str(exc).split())


_FitKey = tuple[Path, str | None, str]
_FitTask = tuple[_FitKey, PublishedNumber, tuple[np.ndarray, ...]]


def _fit_key(published: PublishedNumber, path: Path) -> _FitKey:
    """What a row's number depends on: the file, the calibrator and its parameters."""
    return path, published.calibrator, repr(sorted(published.params.items()))


def _fit_tasks(
    published: Sequence[PublishedNumber],
    loaded: dict[tuple[str, ...], tuple[Path, tuple[np.ndarray, ...]]],
) -> list[_FitTask]:
    """One (key, row, data) per distinct fit of the rows of the used files, in row order."""
    tasks: dict[_FitKey, _FitTask] = {}
    for pub in published:
        if pub.files in loaded and not pub.average_of:
            path, data = loaded[pub.files]
            key = _fit_key(pub, path)
            tasks.setdefault(key, (key, pub, data))
    return list(tasks.values())


def _fit_results(
    tasks: Sequence[_FitTask], processes: int | None,
) -> Iterator[tuple[_FitKey, tuple[float, float] | str]]:
    """(key, result of :func:`_evaluate_row`) of every task, in the order of ``tasks``.

    The fits run here one by one, or in ``processes`` spawned workers (``None``: one per CPU
    core, where the fits are big enough to pay for the workers' start); each result is the
    same either way.
    """
    if processes is None:
        entries = sum(data[0].size for _, _, data in tasks)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        processes = (cores or os.cpu_count() or 1) if entries >= _PARALLEL_MIN_ENTRIES else 1
    workers = min(processes, len(tasks))
    if workers <= 1:
        for key, pub, data in tasks:
            yield key, _evaluate_row(pub, data)
        return
    # spawn, not fork: the caller may hold torch/OpenMP threads that a fork would break
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [(key, pool.submit(_evaluate_row, pub, data)) for key, pub, data in tasks]
        for key, future in futures:
            yield key, future.result()


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
    processes: int | None = None,
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
        processes: number of worker processes the fits run in (>= 1; 1 runs them in this
            process), or ``None`` for one per CPU core when the fits are big (validation
            logits of 10^6 entries in all, e.g. the Table 2 files), else 1. Every fit runs
            with torch on one thread, so the numbers do not depend on it. Defaults to
            ``None``.

    Returns:
        The :class:`ReproductionReport`; ``report.passed`` is False when a checked row misses.

    Raises:
        FileNotFoundError: if ``data_dir`` is not a directory.
        ValueError: if ``tolerance`` is negative or NaN, ``processes`` is below 1, or no file
            under ``data_dir`` can be used (none has a released name, or each one is skipped:
            the message names them with the reasons).
    """
    folder = Path(data_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such directory: {folder}")
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0):
        raise ValueError(f"`tolerance` must be a number >= 0 (ECE points), got {tolerance!r}")
    if processes is not None and not (isinstance(processes, int) and not isinstance(processes, bool)
                                            and processes >= 1):
        raise ValueError(f"`processes` must be an integer >= 1 or None, got {processes!r}")
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
    results = _fit_results(_fit_tasks(published, loaded), processes)
    cache: dict[_FitKey, tuple[float, float] | str] = {}
    rows: list[ReproductionRow] = []
    for pub in published:
        if pub.files not in loaded:
            rows.append(ReproductionRow(pub, None))
            continue
        path, data = loaded[pub.files]
        if pub.average_of:
            row = _average(pub, rows)
        else:
            key = _fit_key(pub, path)
            while key not in cache:  # the fits come in the order of their first row
                done, result = next(results)
                cache[done] = result
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
