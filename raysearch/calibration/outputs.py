r"""Stored network outputs: :class:`Outputs`, read from files, written, split in two.

:func:`load_outputs` reads logits or probabilities with their labels, :func:`write_outputs_parquet`
writes the layout the sweep keeps for each trial, and :func:`split_outputs` cuts outputs into a
calibration part and an evaluation part (:mod:`raysearch.calibration.posthoc` fits and measures
the calibrators on them). Plain NumPy (pyarrow for parquet, scikit-learn for the stratified
split); no Ray or MLflow.

File formats (chosen by the suffix):

* ``.npz`` (``np.savez``), one of two layouts:

  - whole: scores under exactly one of ``logits``, ``probs`` or ``predictions`` (the last two
    are probabilities; ``predictions`` / ``ground_truth`` is netcal's layout), labels under
    exactly one of ``labels`` or ``ground_truth``, and optionally ``split``, an (N,) string
    array of ``"val"`` / ``"test"`` per sample;
  - pre-split: ``val_<scores>``, ``val_<labels>``, ``test_<scores>``, ``test_<labels>`` with the
    same names as above (e.g. ``val_logits``, ``val_labels``, ``test_logits``,
    ``test_labels``); loaded as the val rows followed by the test rows, with their ``split``.

  Mixing the two layouts, or two score (or label) keys of one layout, is an error.
* ``.parquet``: a ``label`` column, the scores as ``logit_0`` ... ``logit_{K-1}`` or ``prob_0``
  ... ``prob_{K-1}`` (all K columns, one prefix), an optional ``split`` column of ``"val"`` /
  ``"test"``; other columns are ignored. This is also the format the sweep writes for each
  trial, through :func:`write_outputs_parquet`.
* pickle (``.dat``, ``.p``, ``.pkl``, ``.pickle``), only with ``allow_pickle=True``
  (unpickling can run arbitrary code), read with ``encoding="latin1"`` (Python 2 pickles): a
  dict following the ``.npz`` key convention, a ``(probs, labels)`` pair (the layout of
  p-lambda/verified_calibration's ``cifar_probs.dat``), or a pre-split
  ``((val_scores, val_labels), (test_scores, test_labels))`` pair of pairs (the layout of the
  ``probs_*_logits.p`` files of Kull et al.'s and Jung et al.'s releases; the scores are read
  as probabilities when every row of both parts is one, else as logits).

Labels may be stored as (N,) or (N, 1) integers (integral floats are accepted). Probabilities
become logits :math:`\log \max(p, 10^{-12})`: softmax is unchanged by a per-row constant, so
every calibrator applies to them directly (``Outputs.from_probs`` records it).
"""

import logging
import numbers
import pickle
import re
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysearch.metrics.checks import validate_probs

__all__ = [
    "PROB_FLOOR",
    "SPLITS",
    "Outputs",
    "OutputsSplit",
    "load_outputs",
    "split_outputs",
    "write_outputs_parquet",
]

logger = logging.getLogger(__name__)

#: Values of the ``split`` column / key: calibration part, evaluation part.
SPLITS = ("val", "test")
#: Floor on probabilities before the log that turns them into logits.
PROB_FLOOR = 1e-12

#: Score keys of the ``.npz`` / pickle-dict convention and whether they hold probabilities.
_SCORE_KEYS = {"logits": False, "probs": True, "predictions": True}
_LABEL_KEYS = ("labels", "ground_truth")
_PICKLE_SUFFIXES = (".dat", ".p", ".pkl", ".pickle")
_SUFFIXES = (".npz", ".parquet", *_PICKLE_SUFFIXES)


# --------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------


def _as_labels(value: Any, n: int, k: int) -> np.ndarray:
    """(N,) int64 labels from (N,) or (N, 1) integers or integral floats in [0, K)."""
    labels = np.asarray(value)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.shape != (n,):
        raise ValueError(
            f"`labels` must have shape ({n},) or ({n}, 1) to match logits of shape {(n, k)}, "
            f"got {labels.shape}"
        )
    if np.issubdtype(labels.dtype, np.floating):
        if not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels)):
            raise ValueError("`labels` must hold integer class indices, got non-integral floats")
    elif not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"`labels` must hold integer class indices, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= k:
        raise ValueError(
            f"`labels` must lie in [0, {k}) for K={k} classes, got values in [{low}, {high}]"
        )
    return labels


def _as_split(value: Any, n: int) -> np.ndarray:
    """(N,) unicode array of "val" / "test"."""
    split = np.asarray(value)
    if split.shape != (n,):
        raise ValueError(f"`split` must have shape ({n},) to match the labels, got {split.shape}")
    split = split.astype(str)
    unknown = sorted(set(np.unique(split).tolist()) - set(SPLITS))
    if unknown:
        raise ValueError(f"`split` values must be 'val' or 'test', got {unknown[:5]}")
    return split


def _probs_to_logits(probs: Any) -> np.ndarray:
    """Validate probabilities (rows sum to 1) and return log(max(p, 1e-12)) in float64."""
    p = validate_probs(probs).astype(np.float64)
    return np.log(np.maximum(p, PROB_FLOOR))


@dataclass(frozen=True, eq=False)
class Outputs:
    """Network outputs of N samples over K classes, with labels and an optional split.

    The arrays are validated, read-only copies.

    Attributes:
        logits: (N, K) float64 finite logits (``log(max(p, 1e-12))`` for probability files).
        labels: (N,) int64 class indices in [0, K); (N, 1) is accepted and flattened.
        from_probs: whether the file held probabilities (the logits are their logs).
        split: None, or (N,) str array of ``"val"`` (calibration) / ``"test"`` (evaluation).

    Raises:
        ValueError: if ``logits`` is not (N, K) with N >= 1 and K >= 2 or not finite, or
            ``labels`` / ``split`` have the wrong shape or values.
    """

    logits: np.ndarray
    labels: np.ndarray
    from_probs: bool = False
    split: np.ndarray | None = None

    def __post_init__(self) -> None:
        logits = np.array(self.logits, dtype=np.float64)
        if logits.ndim != 2:
            raise ValueError(f"`logits` must be 2-D (N, K), got shape {logits.shape}")
        n, k = logits.shape
        if n < 1 or k < 2:
            raise ValueError(
                f"`logits` must hold at least 1 sample and 2 classes, got shape {(n, k)}"
            )
        if not np.all(np.isfinite(logits)):
            row = int(np.flatnonzero(~np.isfinite(logits).all(axis=1))[0])
            raise ValueError(f"`logits` must be finite; row {row} holds NaN or inf")
        labels = _as_labels(self.labels, n, k)
        arrays = {"logits": logits, "labels": labels}
        if self.split is not None:
            arrays["split"] = _as_split(self.split, n)
        for name, array in arrays.items():
            array.setflags(write=False)
            object.__setattr__(self, name, array)
        object.__setattr__(self, "from_probs", bool(self.from_probs))

    @property
    def n_samples(self) -> int:
        """Number of samples N."""
        return int(self.logits.shape[0])

    @property
    def n_classes(self) -> int:
        """Number of classes K."""
        return int(self.logits.shape[1])

    def subset(self, index: np.ndarray) -> "Outputs":
        """The samples at ``index`` (integer indices or a boolean mask), without a split."""
        return Outputs(self.logits[index], self.labels[index], from_probs=self.from_probs)


# --------------------------------------------------------------------------------------------
# Reading and writing files
# --------------------------------------------------------------------------------------------


def _one_key(mapping: Mapping[str, Any], candidates: Sequence[str], what: str) -> str | None:
    found = [key for key in candidates if key in mapping]
    if len(found) > 1:
        raise ValueError(f"ambiguous {what}: found keys {found}; keep exactly one")
    return found[0] if found else None


def _from_mapping(mapping: Mapping[str, Any]) -> Outputs:
    """Outputs from a dict following the ``.npz`` key convention (module docstring)."""
    keys = sorted(mapping)
    names = (*_SCORE_KEYS, *_LABEL_KEYS)
    prefixed = [
        key for key in keys if key.split("_", 1)[0] in SPLITS and key.split("_", 1)[-1] in names
    ]
    plain = [key for key in keys if key in names]
    if prefixed and "split" in mapping:
        raise ValueError("a `split` key cannot be combined with val_/test_ prefixed keys")
    if prefixed and plain:
        raise ValueError(
            f"mixes whole-file keys {plain} with pre-split keys {prefixed}; use one layout"
        )
    expected = (
        f"expected scores under one of {', '.join(_SCORE_KEYS)} and labels under one of "
        f"{', '.join(_LABEL_KEYS)} (or val_/test_ prefixed pairs); found keys: {', '.join(keys)}"
    )
    if not prefixed:
        score_key = _one_key(mapping, tuple(_SCORE_KEYS), "scores")
        label_key = _one_key(mapping, _LABEL_KEYS, "labels")
        if score_key is None or label_key is None:
            raise ValueError(f"no {'scores' if score_key is None else 'labels'}: {expected}")
        scores = mapping[score_key]
        from_probs = _SCORE_KEYS[score_key]
        logits = _probs_to_logits(scores) if from_probs else scores
        return Outputs(logits, mapping[label_key], from_probs, mapping.get("split"))

    parts = []
    for split in SPLITS:
        score_key = _one_key(mapping, [f"{split}_{key}" for key in _SCORE_KEYS], "scores")
        label_key = _one_key(mapping, [f"{split}_{key}" for key in _LABEL_KEYS], "labels")
        if score_key is None or label_key is None:
            raise ValueError(
                f"pre-split layout needs {split}_<scores> and {split}_<labels> for both "
                f"'val' and 'test': {expected}"
            )
        from_probs = _SCORE_KEYS[score_key.split("_", 1)[1]]
        scores = np.asarray(mapping[score_key])
        logits = _probs_to_logits(scores) if from_probs else np.asarray(scores, np.float64)
        labels = np.asarray(mapping[label_key])
        parts.append((logits, labels, from_probs, split))
    (val_logits, val_labels, val_probs, _), (test_logits, test_labels, test_probs, _) = parts
    if val_probs != test_probs:
        raise ValueError("val_ and test_ scores must both be logits or both be probabilities")
    if val_logits.ndim != 2 or test_logits.ndim != 2 or val_logits.shape[1] != test_logits.shape[1]:
        raise ValueError(
            f"val_ and test_ scores must be (N, K) with the same K, got shapes "
            f"{val_logits.shape} and {test_logits.shape}"
        )
    val = Outputs(val_logits, val_labels, val_probs)
    test = Outputs(test_logits, test_labels, test_probs)
    split = np.array(["val"] * val.n_samples + ["test"] * test.n_samples)
    return Outputs(
        np.concatenate([val.logits, test.logits]),
        np.concatenate([val.labels, test.labels]),
        val_probs,
        split,
    )


_INDEXED = re.compile(r"^(logit|prob)_(\d+)$")


def _read_parquet(path: Path) -> Outputs:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    columns = table.column_names
    indexed: dict[str, dict[int, str]] = {"logit": {}, "prob": {}}
    for name in columns:
        match = _INDEXED.match(name)
        if match:
            kind, index = match.group(1), int(match.group(2))
            if index in indexed[kind]:
                raise ValueError(
                    f"columns {indexed[kind][index]!r} and {name!r} are the same score"
                )
            indexed[kind][index] = name
    kinds = [kind for kind, found in indexed.items() if found]
    if "label" not in columns or len(kinds) != 1:
        problem = (
            "no `label` column"
            if "label" not in columns
            else ("both logit_* and prob_* columns" if kinds else "no logit_* or prob_* columns")
        )
        shown = ", ".join(columns[:12]) + (", ..." if len(columns) > 12 else "")
        raise ValueError(
            f"{problem}: expected `label` and logit_0..logit_{{K-1}} or prob_0..prob_{{K-1}} "
            f"(optional `split`); found columns: {shown}"
        )
    kind = kinds[0]
    k = max(indexed[kind]) + 1
    missing = [f"{kind}_{i}" for i in range(k) if i not in indexed[kind]]
    if missing:
        raise ValueError(
            f"score columns {kind}_0..{kind}_{k - 1} are incomplete: missing {missing[:5]}"
        )
    scores = np.column_stack(
        [table.column(indexed[kind][i]).to_numpy().astype(np.float64) for i in range(k)]
    )
    labels = table.column("label").to_numpy()
    split = None
    if "split" in columns:
        split = np.asarray(table.column("split").to_pylist(), dtype=object)
    from_probs = kind == "prob"
    logits = _probs_to_logits(scores) if from_probs else scores
    return Outputs(logits, labels, from_probs, split)


def _is_split_pair(content: Any) -> bool:
    """Whether ``content`` is ``((val_scores, val_labels), (test_scores, test_labels))``."""
    return (
        isinstance(content, (tuple, list))
        and len(content) == 2
        and all(isinstance(part, (tuple, list)) and len(part) == 2 for part in content)
    )


def _looks_like_probs(scores: Any) -> bool:
    """Whether (N, K) scores are probabilities: in [0, 1] with rows summing to 1 (1e-3)."""
    array = np.asarray(scores, dtype=np.float64)
    return bool(
        array.ndim == 2
        and np.all((array >= 0.0) & (array <= 1.0))
        and np.allclose(array.sum(axis=1), 1.0, atol=1e-3)
    )


def _read_pickle(path: Path) -> Outputs:
    with path.open("rb") as handle:
        content = pickle.load(handle, encoding="latin1")  # the caller allowed unpickling
    if isinstance(content, Mapping):
        return _from_mapping(content)
    if _is_split_pair(content):
        (val_scores, val_labels), (test_scores, test_labels) = content
        probs = _looks_like_probs(val_scores) and _looks_like_probs(test_scores)
        kind = "probs" if probs else "logits"
        return _from_mapping(
            {
                f"val_{kind}": val_scores,
                "val_labels": val_labels,
                f"test_{kind}": test_scores,
                "test_labels": test_labels,
            }
        )
    if isinstance(content, (tuple, list)) and len(content) == 2:
        probs, labels = content
        try:
            logits = _probs_to_logits(probs)
        except ValueError as exc:
            raise ValueError(
                f"a pickled (scores, labels) pair is read as (probabilities, labels), the "
                f"verified_calibration layout, but {exc}; store logits in a dict under 'logits'"
            ) from exc
        return Outputs(logits, labels, True)
    raise ValueError(
        f"a pickle must hold a dict (npz key convention), a (probs, labels) pair or a "
        f"((val_scores, val_labels), (test_scores, test_labels)) pair of pairs, got "
        f"{type(content).__name__}"
    )


def load_outputs(path: str | Path, *, allow_pickle: bool = False) -> Outputs:
    """Read stored network outputs (logits or probabilities) and labels from a file.

    Formats and key conventions are in the module docstring: ``.npz`` (``logits`` or
    ``probs``/``predictions``, ``labels``/``ground_truth``, optional ``split`` or ``val_*`` /
    ``test_*`` pairs), ``.parquet`` (``label``, ``logit_<k>`` or ``prob_<k>``, optional
    ``split``) and pickle (``.dat``, ``.p``, ``.pkl``, ``.pickle``; only with ``allow_pickle``).
    Probabilities are checked (in [0, 1], rows summing to 1 within 1e-3) and turned into logits
    ``log(max(p, 1e-12))``.

    Args:
        path: the file; its suffix picks the format.
        allow_pickle: allow unpickling (pickle files, object arrays in ``.npz``). Unpickling a
            file can run arbitrary code: only for files you trust. Defaults to ``False``.

    Returns:
        The :class:`Outputs` of the file.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: for an unsupported suffix, a pickle without ``allow_pickle``, missing or
            ambiguous keys/columns, mismatched shapes, labels outside [0, K), non-finite
            logits, or probabilities that are not probabilities. Messages start with the path.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if suffix not in _SUFFIXES:
        raise ValueError(
            f"unsupported file type {suffix or '(none)'!r} of {path}; expected one of "
            f"{', '.join(_SUFFIXES)}"
        )
    if suffix in _PICKLE_SUFFIXES and not allow_pickle:
        raise ValueError(
            f"refusing to unpickle {path}: pickle can run arbitrary code; pass --allow-pickle "
            "if you trust it"
        )
    try:
        if suffix == ".npz":
            if not zipfile.is_zipfile(path):
                raise ValueError("not a .npz archive (no zip directory: truncated or another "
                                 "format)")
            with np.load(path, allow_pickle=allow_pickle) as data:
                outputs = _from_mapping({key: data[key] for key in data.files})
        elif suffix == ".parquet":
            outputs = _read_parquet(path)
        else:
            outputs = _read_pickle(path)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    except (zipfile.BadZipFile, EOFError) as exc:  # a truncated or corrupt .npz archive
        raise ValueError(f"{path}: not a readable {suffix} file ({exc})") from exc
    logger.info(
        "loaded %s: N=%d, K=%d, %s%s",
        path,
        outputs.n_samples,
        outputs.n_classes,
        "probabilities" if outputs.from_probs else "logits",
        ", with its own split" if outputs.split is not None else "",
    )
    return outputs


def write_outputs_parquet(
    path: str | Path, logits: Any, labels: Any, split: Sequence[str] | None = None
) -> Path:
    """Write logits and labels as the ``.parquet`` layout that :func:`load_outputs` reads.

    Columns: ``label`` (int64), ``logit_0`` ... ``logit_{K-1}`` (float32 if ``logits`` is
    float32, else float64) and, when given, ``split`` (string, ``"val"`` / ``"test"``). The sweep
    writes each trial's outputs with it.

    Args:
        path: destination file (its directory must exist); overwritten if present.
        logits: (N, K) finite float logits, NumPy array or anything ``np.asarray`` accepts (call
            ``.cpu().numpy()`` on a tensor first).
        labels: (N,) integer class indices in [0, K).
        split: optional (N,) sequence of ``"val"`` / ``"test"``. Defaults to ``None``.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: for the conditions of :class:`Outputs` (shapes, finiteness, label range,
            split values).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    raw = np.asarray(logits)
    outputs = Outputs(raw, labels, split=None if split is None else np.asarray(split))
    dtype = np.float32 if raw.dtype == np.float32 else np.float64
    columns: dict[str, Any] = {"label": pa.array(outputs.labels, type=pa.int64())}
    for k in range(outputs.n_classes):
        columns[f"logit_{k}"] = pa.array(np.ascontiguousarray(outputs.logits[:, k], dtype=dtype))
    if outputs.split is not None:
        columns["split"] = pa.array(outputs.split.tolist(), type=pa.string())
    pq.write_table(pa.table(columns), path)
    return path


# --------------------------------------------------------------------------------------------
# Splitting
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class OutputsSplit:
    """A calibration part, an evaluation part, and how they were made.

    Attributes:
        calibration: the samples the calibrators are fitted on.
        evaluation: the samples they are measured on.
        description: one line saying how the split was made (for reports).
    """

    calibration: Outputs
    evaluation: Outputs
    description: str


def split_outputs(outputs: Outputs, *, fraction: float = 0.5, seed: int = 0) -> OutputsSplit:
    """Split outputs into a calibration part and an evaluation part.

    If ``outputs.split`` is set (the file's own split), its ``"val"`` rows are the calibration
    part and its ``"test"`` rows the evaluation part, and ``fraction`` and ``seed`` are not used.
    Otherwise a stratified random split (``sklearn.model_selection.train_test_split`` with
    ``train_size=fraction``, ``stratify=labels``, ``random_state=seed``) puts ``fraction`` of
    the samples in the calibration part; if some class is too rare to stratify, it warns and
    splits without stratification. Each part keeps the file order of its samples.

    Args:
        outputs: the loaded outputs.
        fraction: share of the samples used for calibration, in (0, 1). Defaults to ``0.5``.
        seed: random seed of the split, >= 0. Defaults to ``0``.

    Returns:
        An :class:`OutputsSplit`.

    Raises:
        TypeError: if ``fraction`` is not a real number or ``seed`` not an integer.
        ValueError: if ``fraction`` is not in (0, 1), ``seed`` < 0, a part would be empty, or
            the file's split lacks ``"val"`` or ``"test"`` rows.
    """
    if outputs.split is not None:
        val = outputs.split == "val"
        n_val, n_test = int(val.sum()), int((~val).sum())
        if n_val == 0 or n_test == 0:
            raise ValueError(
                f"the file's split must hold both 'val' and 'test' rows, got {n_val} val and "
                f"{n_test} test"
            )
        return OutputsSplit(
            outputs.subset(val),
            outputs.subset(~val),
            f"the file's own split: {n_val} val (calibration) / {n_test} test (evaluation)",
        )

    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
        raise TypeError(f"`fraction` must be a real number, got {type(fraction).__name__}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"`fraction` must be in (0, 1), got {fraction}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"`seed` must be an integer, got {type(seed).__name__} {seed!r}")
    if seed < 0:
        raise ValueError(f"`seed` must be >= 0, got {seed}")
    n = outputs.n_samples
    n_cal = int(np.ceil(fraction * n))  # what train_test_split gives for a float train_size
    if n_cal < 1 or n - n_cal < 1:
        raise ValueError(
            f"`fraction`={fraction} of N={n} samples leaves an empty calibration or evaluation part"
        )

    from sklearn.model_selection import train_test_split

    index = np.arange(n)
    how = "stratified"
    try:
        cal, ev = train_test_split(
            index, train_size=fraction, stratify=outputs.labels, random_state=int(seed)
        )
    except ValueError as exc:  # a class with one sample, or fewer samples than classes
        warnings.warn(
            f"cannot stratify the split ({exc}); splitting without stratification",
            stacklevel=2,
        )
        how = "unstratified"
        cal, ev = train_test_split(index, train_size=fraction, random_state=int(seed))
    cal, ev = np.sort(cal), np.sort(ev)
    return OutputsSplit(
        outputs.subset(cal),
        outputs.subset(ev),
        f"{how} random split of {n} samples (fraction {fraction:g}, seed {seed}): "
        f"{cal.size} calibration / {ev.size} evaluation",
    )
