"""Shift sets: a test-set subsample and its corrupted copies, built in memory or read lazily.

:class:`ShiftSet` maps (corruption, severity) to uint8 (N, H, W, C) images (an array, or a
:class:`LazyImages` entry read when :meth:`ShiftSet.read` asks for it), with the clean
subsample :data:`CLEAN` first; :func:`build_shift_set` draws a class-stratified subsample of a
test set and corrupts it at every (corruption, severity), optionally in spawned worker
processes. The worker processes unpickle :func:`_corrupt_severities` from this module: keep its
imports light (NumPy and :mod:`raysearch.metrics.shift.corruptions` only; no torch, no pandas).

Imports the leaf :mod:`raysearch.metrics.shift.corruptions` only;
:mod:`raysearch.metrics.shift.released` and :mod:`raysearch.metrics.shift.evaluation` import this
module, and :mod:`raysearch.metrics.shift` gathers its public names.
"""

from __future__ import annotations

import logging
import multiprocessing
import numbers
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysearch.metrics.shift.corruptions import (
    DEFAULT_CORRUPTIONS,
    SEVERITIES,
    _as_index_array,
    _check_corruption,
    _check_images,
    _check_int,
    _check_severity,
    _check_size,
    _corrupt_checked,
)

__all__ = ["CLEAN", "LazyImages", "ShiftSet", "build_shift_set"]

# log records keep the name of the public module, raysearch.metrics.shift
logger = logging.getLogger("raysearch.metrics.shift")

#: Key of the uncorrupted subsample in :attr:`ShiftSet.images` (severity 0).
CLEAN: tuple[str, int] = ("clean", 0)
#: Prefix of the image arrays in a saved :class:`ShiftSet`.
_IMAGE_KEY_PREFIX = "images__"


# --------------------------------------------------------------------------------------------
# Shift sets
# --------------------------------------------------------------------------------------------


class LazyImages:
    """Images of one shift-set entry, read from files when :meth:`ShiftSet.read` asks for them.

    The entries of :func:`load_released_shift_set` are of this kind, so a shift set over a
    released corrupted test set (CIFAR-10-C: 19 corruptions x 50,000 images, 2.9 GB) holds
    only file names and row numbers: it pickles small (Ray ships it to every trial) and
    :func:`evaluate_shift` holds one (corruption, severity) in memory at a time. A subclass
    sets :attr:`shape` and implements :meth:`read`.

    Attributes:
        shape: ``(N, H, W, C)`` of the array :meth:`read` returns.
    """

    shape: tuple[int, int, int, int]

    def read(self) -> np.ndarray:
        """The images: uint8 (N, H, W, C), pixels 0-255.

        Raises:
            ValueError: naming the file when it is missing, unreadable or of another shape.
        """
        raise NotImplementedError


def _entry_shape(value: object, name: str) -> tuple[int, ...]:
    """Shape of a shift-set entry: a checked uint8 (N, H, W, C) array or a :class:`LazyImages`."""
    if isinstance(value, LazyImages):
        shape = tuple(int(d) for d in value.shape)
        if len(shape) != 4 or shape[3] not in (1, 3):
            raise ValueError(
                f"`{name}` must have shape (N, H, W, C) with C in {{1, 3}}, got {value.shape}"
            )
        return shape
    return _check_images(value, name=name).shape


@dataclass(eq=False)
class ShiftSet:
    """A subsample of a test set and its corrupted copies.

    Attributes:
        images: ``(corruption, severity) -> uint8 (N, H, W, C)`` array or :class:`LazyImages`
            (read by :meth:`read`); holds :data:`CLEAN` (``("clean", 0)``, the uncorrupted
            subsample) first, then the corrupted copies.
        labels: int64 (N,) labels, shared by all entries.
        index: int64 (N,) indices of the subsample into the original test set (sorted
            ascending by :func:`build_shift_set`).
        held_out: corruptions reported apart: each has its own rows and metrics, but the means
            over corruptions leave it out (the four extra corruptions a released CIFAR-10-C or
            ImageNet-C folder holds besides the benchmark's 15,
            :data:`~raysearch.metrics.shift.released.HELD_OUT_CORRUPTIONS`). Defaults to none.

    Raises:
        ValueError: if ``images`` lacks the clean entry, holds a non-uint8 or non-4-D array, a
            key that is not (str, int), or entries whose shapes differ; if ``labels`` /
            ``index`` is not a 1-D integer array of length N; or if ``held_out`` names a
            corruption without entries.
        TypeError: if an entry of ``images`` is neither a NumPy array nor :class:`LazyImages`.
    """

    images: dict[tuple[str, int], np.ndarray | LazyImages]
    labels: np.ndarray
    index: np.ndarray
    held_out: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.images, dict) or CLEAN not in self.images:
            raise ValueError(f"`images` must be a dict holding the clean subsample {CLEAN!r}")
        shape = None
        for key, array in self.images.items():
            if (
                not isinstance(key, tuple)
                or len(key) != 2
                or not isinstance(key[0], str)
                or isinstance(key[1], bool)
                or not isinstance(key[1], numbers.Integral)
            ):
                raise ValueError(f"`images` keys must be (corruption, severity), got {key!r}")
            entry_shape = _entry_shape(array, name=f"images[{key!r}]")
            if shape is None:
                shape = entry_shape
            elif entry_shape != shape:
                raise ValueError(
                    f"`images` arrays must share one shape; images[{key!r}] has {entry_shape}, "
                    f"another has {shape}"
                )
        # the clean subsample first, the rest in the given order
        self.images = {CLEAN: self.images[CLEAN]} | {
            (str(k[0]), int(k[1])): v for k, v in self.images.items() if k != CLEAN
        }
        self.labels = _as_index_array("labels", self.labels, shape[0])
        self.index = _as_index_array("index", self.index, shape[0])
        if isinstance(self.held_out, str):
            raise ValueError(f"`held_out` must be a sequence of corruption names, got the "
                             f"string {self.held_out!r}")
        self.held_out = tuple(str(name) for name in self.held_out)
        unknown = [name for name in self.held_out if name not in self.corruptions]
        if unknown:
            raise ValueError(f"`held_out` names {', '.join(map(repr, unknown))}, which has no "
                             f"entries; the corruptions are {', '.join(self.corruptions)}")

    @property
    def corruptions(self) -> tuple[str, ...]:
        """Corruption names of the corrupted entries, in order (without ``"clean"``)."""
        return tuple(dict.fromkeys(key[0] for key in self.images if key != CLEAN))

    @property
    def benchmark(self) -> tuple[str, ...]:
        """The corruptions the means are taken over: :attr:`corruptions` less :attr:`held_out`."""
        return tuple(name for name in self.corruptions if name not in self.held_out)

    @property
    def severities(self) -> tuple[int, ...]:
        """Severities of the corrupted entries, sorted (without 0)."""
        return tuple(sorted({key[1] for key in self.images if key != CLEAN}))

    def read(self, key: tuple[str, int]) -> np.ndarray:
        """The images of one entry as an array (a :class:`LazyImages` entry is read now).

        Args:
            key: ``(corruption, severity)``, e.g. :data:`CLEAN`.

        Returns:
            uint8 (N, H, W, C), the shape of every entry.

        Raises:
            KeyError: if ``key`` is not an entry.
            ValueError: if a lazy entry's files are missing, unreadable or of another shape.
        """
        value = self.images[key]
        if not isinstance(value, LazyImages):
            return value
        expected = tuple(int(d) for d in value.shape)
        array = _check_images(value.read(), name=f"images[{key!r}]")
        if array.shape != expected:
            raise ValueError(f"images[{key!r}] read {array.shape}, expected {expected}")
        return array

    def save(self, path: str | Path) -> None:
        """Write all arrays to one ``.npz`` file (``np.savez``, no pickle); lazy entries are read.

        Args:
            path: output file, written as given (no suffix is appended).
        """
        arrays = {"labels": self.labels, "index": self.index,
                  "held_out": np.array(self.held_out, dtype=str)}
        for name, severity in self.images:
            arrays[f"{_IMAGE_KEY_PREFIX}{name}__{severity}"] = self.read((name, severity))
        with open(path, "wb") as handle:
            np.savez(handle, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> ShiftSet:
        """Read a file written by :meth:`save`.

        Args:
            path: the ``.npz`` file.

        Returns:
            The shift set, entries in their saved order.

        Raises:
            FileNotFoundError: if ``path`` does not exist.
            ValueError: if the file is not a saved shift set.
        """
        with np.load(path, allow_pickle=False) as data:
            names = list(data.files)
            if "labels" not in names or "index" not in names:
                raise ValueError(f"{str(path)!r} is not a saved ShiftSet (no labels/index)")
            images = {}
            for name in names:
                if not name.startswith(_IMAGE_KEY_PREFIX):
                    continue
                corruption, _, severity = name[len(_IMAGE_KEY_PREFIX) :].rpartition("__")
                if not corruption or not severity.isdigit():
                    raise ValueError(f"{str(path)!r} holds an unexpected array {name!r}")
                images[(corruption, int(severity))] = data[name]
            held_out = tuple(str(n) for n in data["held_out"]) if "held_out" in names else ()
            return cls(images=images, labels=data["labels"], index=data["index"],
                       held_out=held_out)


def _stratified_subsample(labels: np.ndarray, max_samples: int | None, seed: int) -> np.ndarray:
    """Sorted int64 indices of a class-stratified random subsample of at most ``max_samples``.

    Every class gets ``floor(n_c * m / N)`` samples plus one for the classes with the largest
    remainders (ties: smaller label first), so the per-class counts sum to m and each class is
    within one sample of its share. All indices when ``max_samples`` is None or >= N.
    """
    n = labels.shape[0]
    if max_samples is None or n <= max_samples:
        return np.arange(n, dtype=np.int64)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    quotas = counts * max_samples / n
    take = np.floor(quotas).astype(np.int64)
    remainder = max_samples - int(take.sum())
    take[np.argsort(-(quotas - take), kind="stable")[:remainder]] += 1
    rng = np.random.default_rng(seed)
    chosen = [
        rng.choice(np.flatnonzero(inverse == c), size=int(take[c]), replace=False)
        for c in range(classes.size)
    ]
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def _corrupt_severities(
    images: np.ndarray, corruption: str, severities: tuple[int, ...], seed: int
) -> tuple[str, dict[int, np.ndarray], float]:
    """Corrupt ``images`` at every severity (one task of :func:`build_shift_set`)."""
    start = time.perf_counter()
    out = {s: _corrupt_checked(images, corruption, s, seed) for s in severities}
    return corruption, out, time.perf_counter() - start


def _corrupt_all(
    subsample: np.ndarray, corruptions: tuple[str, ...], severities: tuple[int, ...], seed: int,
    processes: int, report: Callable[[str, float], None],
) -> dict[str, dict[int, np.ndarray]]:
    """``{corruption: {severity: images}}``, in this process or in spawned workers.

    `report(corruption, seconds)` is called as each corruption finishes.
    """
    results: dict[str, dict[int, np.ndarray]] = {}
    workers = min(processes, len(corruptions))
    if workers <= 1:
        for corruption in corruptions:
            _, results[corruption], seconds = _corrupt_severities(
                subsample, corruption, severities, seed
            )
            report(corruption, seconds)
        return results
    # spawn, not fork: the caller may hold torch/OpenMP threads that a fork would break
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [
            pool.submit(_corrupt_severities, subsample, corruption, severities, seed)
            for corruption in corruptions
        ]
        for future in as_completed(futures):
            corruption, results[corruption], seconds = future.result()
            report(corruption, seconds)
    return results


def _check_grid(corruptions: Sequence[str], severities: Sequence[int]
                ) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The corruptions and severities of a shift set as tuples, each checked, none repeated.

    Raises:
        TypeError: if `corruptions` is a string, or a severity is not an integer.
        ValueError: for an unknown or repeated corruption, or a bad or repeated severity.
    """
    if isinstance(corruptions, str):
        raise TypeError(
            f"`corruptions` must be a sequence of names, got the string {corruptions!r}"
        )
    corruptions = tuple(_check_corruption(c) for c in corruptions)
    if len(set(corruptions)) != len(corruptions):
        raise ValueError(f"`corruptions` must not repeat a name, got {corruptions}")
    severities = tuple(_check_severity(s) for s in severities)
    if len(set(severities)) != len(severities):
        raise ValueError(f"`severities` must not repeat a value, got {severities}")
    return corruptions, severities


def build_shift_set(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    corruptions: Sequence[str] = DEFAULT_CORRUPTIONS,
    severities: Sequence[int] = SEVERITIES,
    max_samples: int | None = 1000,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    processes: int = 1,
) -> ShiftSet:
    """Subsample a test set (stratified, seeded) and corrupt it at every (corruption, severity).

    The arrays depend only on the arguments, not on ``processes`` or on the order in which the
    corruptions finish. 1000 32x32x3 images x 15 corruptions x 5 severities take about 24 s of
    CPU (``processes=1`` on a 2-core machine; ``zoom_blur`` ~7 s, ``glass_blur`` ~4 s of which
    ~2 s compile its numba kernel once per process, ``motion_blur`` ~3 s, ``snow`` ~2.4 s, the
    others <= 1.7 s each) and 16-21 s with ``processes=2`` there (each spawned worker costs ~1 s
    to start).

    Args:
        images: uint8 (N, H, W, C) test images, C in {1, 3}, H and W >= 32 (the test set as
            stored, before normalisation).
        labels: (N,) integer labels.
        corruptions: corruption names (see :func:`corrupt_images`), without duplicates.
            Defaults to :data:`DEFAULT_CORRUPTIONS`.
        severities: severities in [1, 5], without duplicates. Defaults to 1-5.
        max_samples: size of the subsample (>= 1), classes in proportion to their counts; None
            (or >= N) keeps all N images. Defaults to ``1000``.
        seed: integer >= 0 of the subsample and of the corruptions. Defaults to ``0``.
        progress: called with one line per finished corruption, e.g. ``"shift: corrupted 1000
            images with gaussian_noise at 5 severities (1.2 s)"``. Defaults to None.
        processes: worker processes (spawned, one corruption per task); 1 runs in this process.
            As always with spawned processes, a calling script needs an
            ``if __name__ == "__main__":`` guard (Ray workers and pytest have one). Defaults to
            ``1``.

    Returns:
        A :class:`ShiftSet`: the clean subsample under ``("clean", 0)``, then every corruption
        at every severity in the given order.

    Raises:
        ValueError: for invalid images (see :func:`corrupt_images`), ``labels`` not an (N,)
            integer array, an unknown or repeated corruption, a bad or repeated severity,
            ``max_samples`` < 1, ``seed`` < 0 or ``processes`` < 1.
        TypeError: for non-integer ``max_samples``, ``seed``, ``severities`` or ``processes``,
            or a ``progress`` that is not callable.
    """
    images = _check_images(images)
    labels = _as_index_array("labels", labels, images.shape[0])
    if images.shape[0] == 0:
        raise ValueError(f"`images` must hold at least one image, got shape {images.shape}")
    corruptions, severities = _check_grid(corruptions, severities)
    if max_samples is not None:
        max_samples = _check_int("max_samples", max_samples, minimum=1)
    seed = _check_int("seed", seed, minimum=0)
    processes = _check_int("processes", processes, minimum=1)
    if progress is not None and not callable(progress):
        raise TypeError(f"`progress` must be callable or None, got {type(progress).__name__}")
    for corruption in corruptions:
        _check_size(images, corruption)

    index = _stratified_subsample(labels, max_samples, seed)
    subsample = np.ascontiguousarray(images[index])

    def report(corruption: str, seconds: float) -> None:
        line = (
            f"shift: corrupted {len(index)} images with {corruption} at {len(severities)} "
            f"severities ({seconds:.1f} s)"
        )
        logger.info(line)
        if progress is not None:
            progress(line)

    results = _corrupt_all(subsample, corruptions, severities, seed, processes, report)
    shifted: dict[tuple[str, int], np.ndarray] = {CLEAN: subsample}
    for corruption in corruptions:
        for severity in severities:
            shifted[(corruption, severity)] = results[corruption][severity]
    return ShiftSet(images=shifted, labels=labels[index], index=index)
