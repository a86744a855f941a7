r"""Evaluation under dataset shift: a test set corrupted by ImageNet-C-style corruptions.

A trained model's test set (or a stratified subsample of it) is corrupted by each of the 15
ImageNet-C benchmark corruptions at severities 1-5; accuracy, ECE and NLL are measured on every
(corruption, severity) before and after a post-hoc calibrator fitted on clean validation logits,
as in Ovadia et al. (2019) and Karandikar et al. (2021), Fig. 2::

    from raysearch.shift import build_shift_set, evaluate_shift
    shift_set = build_shift_set(test_images_uint8, test_labels, max_samples=1000, seed=0)
    report = evaluate_shift(predict_logits, shift_set, calibrator=cal)
    report.as_metrics()        # {"shift_gaussian_noise_3_ece_ts": 0.12, ...}
    print(report.summary())    # mean accuracy / ECE per severity

The corruptions come from ``imagecorruptions`` (the ``imagecorruptions-imaug`` fork of
bethgelab's package), imported on first use, not with this module. They use the *ImageNet-C*
constants whatever the image size: on 32x32 images the blurs (defocus radius 3-10 px, motion
radius 10-20 px) and noises (Gaussian sigma 0.08-0.38) are much stronger than the CIFAR-10-C
constants of Hendrycks and Dietterich's ``make_cifar_c.py`` (Gaussian sigma 0.04-0.10), so values
are comparable across our trials but not with published CIFAR-10-C curves. The library needs
images of at least 32x32 pixels.

Determinism: most corruptions draw from NumPy's global ``RandomState``. :func:`corrupt_images`
seeds it from (``seed``, corruption, severity) and restores the previous global state on exit,
so equal seeds give identical arrays and the caller's random stream is left untouched. The two
corruptions that draw from their own generators (``glass_blur``, ``impulse_noise``) get a seed
per image from the same key. Because the global state is shared, :func:`corrupt_images` is not
thread-safe (processes are fine: ``build_shift_set(processes=...)``).

Metrics are those of :mod:`raysearch.metrics`: accuracy, ECE (equal-width bins, l1 norm, 15 bins
by default) and NLL, all fractions or nats, never percent. Fig. 2 of Karandikar et al. shows
the equal-mass l2 ECE, mean over corruptions with error bars; :func:`raysearch.plots.shift_plot`
draws the box over corruptions (Ovadia et al.) with the mean as a marker.

Released corrupted test sets (CIFAR-10-C, CIFAR-100-C, Tiny-ImageNet-C, ImageNet-C) are read by
:func:`load_released_shift_set` instead: the same :class:`ShiftSet`, its corrupted entries read
from the files one (corruption, severity) at a time, so the same :func:`evaluate_shift` and the
same metric names apply.

References:
    Hendrycks and Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and
    Perturbations", ICLR 2019, arXiv:1903.12261 (ImageNet-C, CIFAR-10-C).
    Michaelis et al., "Benchmarking Robustness in Object Detection: Autonomous Driving when
    Winter is Coming", 2019, arXiv:1907.07484 (the ``imagecorruptions`` package).
    Ovadia et al., "Can You Trust Your Model's Uncertainty? Evaluating Predictive Uncertainty
    Under Dataset Shift", NeurIPS 2019, arXiv:1906.02530.
    Karandikar et al., "Soft Calibration Objectives for Neural Networks", NeurIPS 2021,
    arXiv:2108.00106, Fig. 2.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import numbers
import os
import re
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

# raysearch.metrics (torch) and pandas are imported where they are used: the worker processes
# of build_shift_set(processes=...) import this module and need neither (~2.5 s less start-up).

__all__ = [
    "CLEAN",
    "DEFAULT_CORRUPTIONS",
    "MIN_IMAGE_SIZE",
    "RELEASED_LABELS_FILE",
    "SEVERITIES",
    "LazyImages",
    "ShiftReport",
    "ShiftSet",
    "build_shift_set",
    "corrupt_images",
    "evaluate_shift",
    "load_released_shift_set",
]

logger = logging.getLogger(__name__)

#: The 15 ImageNet-C benchmark corruptions, in the order of
#: ``imagecorruptions.get_corruption_names("common")`` (written out so that importing this
#: module does not import the library; a test checks the two agree).
DEFAULT_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
#: Corruption severities of ImageNet-C.
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
#: Key of the uncorrupted subsample in :attr:`ShiftSet.images` (severity 0).
CLEAN: tuple[str, int] = ("clean", 0)
#: Smallest height and width (pixels) the corruption library accepts.
MIN_IMAGE_SIZE = 32

#: Corruptions that draw from their own generator, seeded through a ``seed`` keyword.
_SEEDED_BY_KEYWORD = ("glass_blur", "impulse_noise")
#: Metrics of every row, before (``name``) and after (``name_cal``) the calibrator.
_METRICS = ("accuracy", "ece", "nll")
#: Calibrator names must be usable inside flat MLflow metric names.
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+$")
#: Prefix of the image arrays in a saved :class:`ShiftSet`.
_IMAGE_KEY_PREFIX = "images__"


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _library() -> ModuleType:
    """Import ``imagecorruptions`` on first use (it pulls in numba, OpenCV and scikit-image)."""
    try:
        import imagecorruptions
    except ImportError as err:  # pragma: no cover - the dependency is declared
        raise ImportError(
            "raysearch.shift needs the `imagecorruptions` package: pip install "
            "'raysearch[shift]' (or 'imagecorruptions-imaug>=1.1.5')"
        ) from err
    return imagecorruptions


def _known_corruptions() -> tuple[str, ...]:
    """All corruption names of the library (the 15 benchmark ones plus 4 validation ones)."""
    return tuple(_library().get_corruption_names("all"))


def _check_corruption(corruption: object) -> str:
    known = _known_corruptions()
    if not isinstance(corruption, str) or corruption not in known:
        raise ValueError(f"Unknown corruption {corruption!r}; available: {', '.join(known)}")
    return corruption


def _check_int(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"`{name}` must be {bound}, got {value}")
    return int(value)


def _check_severity(severity: object) -> int:
    return _check_int("severity", severity, minimum=SEVERITIES[0], maximum=SEVERITIES[-1])


def _check_images(images: object, name: str = "images") -> np.ndarray:
    """Check a uint8 (N, H, W, C) batch with C in {1, 3} and return it as a NumPy array."""
    if not isinstance(images, np.ndarray):
        raise TypeError(f"`{name}` must be a NumPy array, got {type(images).__name__}")
    if images.dtype != np.uint8:
        raise ValueError(f"`{name}` must have dtype uint8 (pixels 0-255), got {images.dtype}")
    if images.ndim != 4 or images.shape[3] not in (1, 3):
        raise ValueError(
            f"`{name}` must have shape (N, H, W, C) with C in {{1, 3}}, got {images.shape}"
        )
    return images


def _check_size(images: np.ndarray, corruption: str) -> None:
    height, width = images.shape[1:3]
    if height < MIN_IMAGE_SIZE or width < MIN_IMAGE_SIZE:
        raise ValueError(
            f"corruption {corruption!r} needs images of at least {MIN_IMAGE_SIZE}x"
            f"{MIN_IMAGE_SIZE} pixels, got {height}x{width} (H x W)"
        )


def _as_index_array(name: str, value: object, n: int | None = None) -> np.ndarray:
    """An (N,) integer array as int64 (``n`` checks its length)."""
    array = np.asarray(value)
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise ValueError(
            f"`{name}` must be a 1-D integer array, got dtype {array.dtype} shape {array.shape}"
        )
    if n is not None and array.shape[0] != n:
        raise ValueError(f"`{name}` must have shape ({n},), got {array.shape}")
    return array.astype(np.int64)


# --------------------------------------------------------------------------------------------
# Corruption of one batch
# --------------------------------------------------------------------------------------------


def _rng_seeds(seed: int, corruption: str, severity: int, n: int) -> tuple[int, np.ndarray]:
    """Seed of the global ``RandomState`` and (N,) per-image seeds for one (corruption, severity).

    Both derive from ``SeedSequence([seed, crc32(corruption), severity])``: independent of the
    other corruptions, of the order in which they run and of the process that runs them.
    """
    key = np.random.SeedSequence([seed, zlib.crc32(corruption.encode()), severity])
    rng = np.random.default_rng(key)
    global_seed = int(rng.integers(0, 2**32))
    image_seeds = rng.integers(0, 2**31 - 1, size=n)
    return global_seed, image_seeds


@contextlib.contextmanager
def _seeded_global_rng(seed: int) -> Iterator[None]:
    """Seed NumPy's global ``RandomState``; restore its previous state on exit."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _corrupt_checked(images: np.ndarray, corruption: str, severity: int, seed: int) -> np.ndarray:
    """:func:`corrupt_images` after validation."""
    corrupt = _library().corrupt
    n, height, width, channels = images.shape
    global_seed, image_seeds = _rng_seeds(seed, corruption, severity, n)
    out = np.empty_like(images)
    with _seeded_global_rng(global_seed):
        for i in range(n):
            image = images[i] if channels == 3 else np.repeat(images[i], 3, axis=2)
            keywords = {"seed": int(image_seeds[i])} if corruption in _SEEDED_BY_KEYWORD else {}
            try:
                result = corrupt(image, corruption_name=corruption, severity=severity, **keywords)
            except Exception as err:
                raise ValueError(
                    f"imagecorruptions failed on corruption {corruption!r} (severity "
                    f"{severity}) for images of size {height}x{width}x{channels}: {err}"
                ) from err
            result = np.asarray(result)
            if result.shape != (height, width, 3):
                raise ValueError(
                    f"corruption {corruption!r} (severity {severity}) returned shape "
                    f"{result.shape} for an image of size {height}x{width}x3"
                )
            if channels == 3:
                out[i] = result
            else:
                grey = np.rint(result.mean(axis=2, dtype=np.float64))
                out[i, :, :, 0] = np.clip(grey, 0, 255).astype(np.uint8)
    return out


def corrupt_images(images: np.ndarray, corruption: str, severity: int, *, seed: int) -> np.ndarray:
    """Corrupt a batch of images with one ImageNet-C corruption at one severity.

    Grey images (C = 1) are replicated to 3 channels for the library and converted back by the
    mean over channels, rounded (so per-channel noise is averaged over 3 channels). Images are
    corrupted one at a time, in order; NumPy's global ``RandomState`` is seeded from
    (``seed``, ``corruption``, ``severity``) and restored afterwards, so equal arguments give
    identical arrays. Not thread-safe (see the module docstring).

    Args:
        images: uint8 (N, H, W, C) pixels in [0, 255], C in {1, 3}, H and W >= 32.
        corruption: a corruption name of ``imagecorruptions.get_corruption_names("all")``:
            one of :data:`DEFAULT_CORRUPTIONS` or ``speckle_noise``, ``gaussian_blur``,
            ``spatter``, ``saturate``.
        severity: integer in [1, 5].
        seed: integer >= 0.

    Returns:
        uint8 (N, H, W, C), the shape of ``images``.

    Raises:
        ValueError: for an unknown ``corruption`` (the message lists the known names), a
            ``severity`` outside [1, 5], a negative ``seed``, ``images`` not uint8 (N, H, W, C)
            with C in {1, 3}, images smaller than 32x32, or a failure of the library (the
            message names the corruption and the image size).
        TypeError: if ``images`` is not a NumPy array or ``severity`` / ``seed`` is not an
            integer.
    """
    corruption = _check_corruption(corruption)
    severity = _check_severity(severity)
    seed = _check_int("seed", seed, minimum=0)
    images = _check_images(images)
    _check_size(images, corruption)
    return _corrupt_checked(images, corruption, severity, seed)


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


@dataclass(frozen=True, eq=False)
class _NpyRows(LazyImages):
    """Rows of a uint8 (M, H, W, C) ``.npy`` file (memory-mapped; only these rows are read)."""

    path: Path
    rows: np.ndarray
    shape: tuple[int, int, int, int]

    def read(self) -> np.ndarray:
        array = _open_npy(self.path, what="images")
        if array.dtype != np.uint8 or array.ndim != 4 or array.shape[1:] != self.shape[1:]:
            raise ValueError(
                f"{self.path} holds {array.dtype} {array.shape}, expected uint8 "
                f"(M, {', '.join(str(d) for d in self.shape[1:])})"
            )
        if self.rows.size and int(self.rows.max()) >= array.shape[0]:
            raise ValueError(f"{self.path} has {array.shape[0]} rows, row {self.rows.max()} read")
        start = int(self.rows[0]) if self.rows.size else 0
        if np.array_equal(self.rows, np.arange(start, start + self.rows.size)):
            return np.array(array[start : start + self.rows.size])  # one contiguous read
        return np.array(array[self.rows])


@dataclass(frozen=True, eq=False)
class _ImageFiles(LazyImages):
    """Image files ``folder/<file>`` for the relative names ``files``, decoded in threads."""

    folder: Path
    files: tuple[str, ...]
    shape: tuple[int, int, int, int]

    def read(self) -> np.ndarray:
        from concurrent.futures import ThreadPoolExecutor

        out = np.empty(self.shape, dtype=np.uint8)

        def decode(rows: range) -> None:
            for row in rows:
                out[row] = _read_image(self.folder / self.files[row], self.shape[1:])

        chunks = [range(i, min(i + 256, len(self.files))) for i in range(0, len(self.files), 256)]
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            for _ in pool.map(decode, chunks):  # re-raises the first error
                pass
        return out


def _read_image(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """One image file as uint8 (H, W, C) (RGB for C = 3, grey for C = 1) of the given shape."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            array = np.asarray(image.convert("RGB" if shape[2] == 3 else "L"))
    except FileNotFoundError:
        raise ValueError(
            f"{path} does not exist (every <corruption>/<severity>/ folder must hold the same "
            "<class>/<file> names)"
        ) from None
    except (OSError, ValueError, SyntaxError) as err:
        raise ValueError(f"cannot read image {path}: {type(err).__name__}: {err}") from None
    if array.ndim == 2:
        array = array[:, :, None]
    if array.shape != tuple(shape):
        raise ValueError(
            f"{path} is {'x'.join(str(d) for d in array.shape)} (H x W x C), the dataset's "
            f"test images are {'x'.join(str(d) for d in shape)}"
        )
    return array


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

    Raises:
        ValueError: if ``images`` lacks the clean entry, holds a non-uint8 or non-4-D array, a
            key that is not (str, int), or entries whose shapes differ; or if ``labels`` /
            ``index`` is not a 1-D integer array of length N.
        TypeError: if an entry of ``images`` is neither a NumPy array nor :class:`LazyImages`.
    """

    images: dict[tuple[str, int], np.ndarray | LazyImages]
    labels: np.ndarray
    index: np.ndarray

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

    @property
    def corruptions(self) -> tuple[str, ...]:
        """Corruption names of the corrupted entries, in order (without ``"clean"``)."""
        return tuple(dict.fromkeys(key[0] for key in self.images if key != CLEAN))

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
        arrays = {"labels": self.labels, "index": self.index}
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
            return cls(images=images, labels=data["labels"], index=data["index"])


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
    results: dict[str, dict[int, np.ndarray]] = {}

    def report(corruption: str, seconds: float) -> None:
        line = (
            f"shift: corrupted {len(index)} images with {corruption} at {len(severities)} "
            f"severities ({seconds:.1f} s)"
        )
        logger.info(line)
        if progress is not None:
            progress(line)

    workers = min(processes, len(corruptions))
    if workers <= 1:
        for corruption in corruptions:
            _, results[corruption], seconds = _corrupt_severities(
                subsample, corruption, severities, seed
            )
            report(corruption, seconds)
    else:
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

    shifted: dict[tuple[str, int], np.ndarray] = {CLEAN: subsample}
    for corruption in corruptions:
        for severity in severities:
            shifted[(corruption, severity)] = results[corruption][severity]
    return ShiftSet(images=shifted, labels=labels[index], index=index)


# --------------------------------------------------------------------------------------------
# Released corrupted test sets
# --------------------------------------------------------------------------------------------

#: Labels file of a CIFAR-10-C / CIFAR-100-C folder: (5 N,) labels, severities 1-5 stacked.
RELEASED_LABELS_FILE = "labels.npy"
#: Image files of an ImageNet-C-layout folder (torchvision's ``IMG_EXTENSIONS``, any case).
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_LAYOUTS = (
    "expected CIFAR-10-C (<corruption>.npy + labels.npy) or ImageNet-C "
    "(<corruption>/<severity>/<class>/*.JPEG) layout"
)
#: Corruption names that would collide with the clean row and the means in metric names.
_RESERVED_NAMES = ("clean", "mean")


def _open_npy(path: Path, *, what: str) -> np.ndarray:
    """A ``.npy`` file memory-mapped read-only (no pickle); a ValueError naming it otherwise."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"cannot read {path} as a .npy array of {what}: {err}") from None


def _subfolders(folder: Path) -> list[Path]:
    """Visible subfolders of ``folder``, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _corruption_name(folder: Path, name: str) -> str:
    if not _NAME_PATTERN.match(name) or name in _RESERVED_NAMES:
        raise ValueError(
            f"{folder}: the corruption name {name!r} cannot be part of a metric name (letters, "
            f"digits, '_', '.', '-'; not {' or '.join(repr(n) for n in _RESERVED_NAMES)})"
        )
    return name


def _shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in shape)


def _cifar_c_entries(
    folder: Path, hwc: tuple[int, ...], labels: np.ndarray, num_classes: int, index: np.ndarray
) -> dict[tuple[str, int], LazyImages]:
    """The lazy entries of a CIFAR-10-C-layout folder for the test rows ``index``."""
    n = labels.shape[0]
    labels_path = folder / RELEASED_LABELS_FILE
    released = _open_npy(labels_path, what="labels")
    k = len(SEVERITIES)
    if (
        released.ndim != 1
        or not np.issubdtype(released.dtype, np.integer)
        or released.size == 0
        or released.size % k
    ):
        raise ValueError(
            f"{labels_path} must hold ({k} N,) integer labels (severities 1-{k} stacked), got "
            f"{released.dtype} {released.shape}"
        )
    if released.size != k * n:
        raise ValueError(
            f"{labels_path} holds {k} x {released.size // k} labels (severities 1-{k} stacked) "
            f"but the test split has {n} images; the folder was not made from this test split"
        )
    released = np.asarray(released, dtype=np.int64)
    if released.min() < 0 or released.max() >= num_classes:
        raise ValueError(
            f"{labels_path} holds labels in [{released.min()}, {released.max()}] but the "
            f"dataset has {num_classes} classes ([0, {num_classes - 1}])"
        )
    for severity in SEVERITIES:
        block = released[(severity - 1) * n : severity * n]
        wrong = np.flatnonzero(block != labels)
        if wrong.size:
            row = int(wrong[0])
            raise ValueError(
                f"{labels_path} row {(severity - 1) * n + row} (severity {severity}, image "
                f"{row}) has label {block[row]}, image {row} of the test split {labels[row]}; "
                "the folder was not made from this test split"
            )
    files = sorted(
        p
        for p in folder.iterdir()
        if p.suffix == ".npy" and p.name != RELEASED_LABELS_FILE and not p.name.startswith(".")
    )
    if not files:
        raise ValueError(f"{folder}: {RELEASED_LABELS_FILE} but no <corruption>.npy; {_LAYOUTS}")
    entries: dict[tuple[str, int], LazyImages] = {}
    for file in files:
        name = _corruption_name(folder, file.stem)
        array = _open_npy(file, what="images")
        if array.dtype != np.uint8 or array.ndim != 4 or array.shape[3] not in (1, 3):
            raise ValueError(
                f"{file} must hold uint8 ({k} N, H, W, C) images, got {array.dtype} {array.shape}"
            )
        if array.shape[1:] != hwc:
            raise ValueError(
                f"{file} holds {_shape_text(array.shape[1:])} images (H x W x C), the dataset's "
                f"test images are {_shape_text(hwc)}"
            )
        if array.shape[0] != k * n:
            raise ValueError(
                f"{file} holds {array.shape[0]} images, {RELEASED_LABELS_FILE} {k} x {n} labels"
            )
        for severity in SEVERITIES:
            rows = (severity - 1) * n + index
            entries[(name, severity)] = _NpyRows(file, rows, shape=(index.size, *hwc))
    return entries


def _imagenet_c_folders(folder: Path) -> dict[tuple[str, int], Path]:
    """``(corruption, severity) -> <corruption>/<severity>/`` of an ImageNet-C-layout folder."""
    corruptions = _subfolders(folder)
    if not any(p.name.isdigit() for c in corruptions for p in _subfolders(c)):
        found = sorted(p.name for p in folder.glob("*.npy"))
        npy = f" ({len(found)} .npy file(s), e.g. {found[0]})" if found else ""
        raise ValueError(
            f"{folder}: no {RELEASED_LABELS_FILE}{npy} and no <corruption>/<severity>/ folders; "
            f"{_LAYOUTS}"
        )
    out: dict[tuple[str, int], Path] = {}
    for corruption in corruptions:
        name = _corruption_name(folder, corruption.name)
        severities = _subfolders(corruption)
        if not severities:
            raise ValueError(f"{corruption}/ holds no <severity>/ folder (1-5); {_LAYOUTS}")
        for severity in severities:
            if not severity.name.isdigit() or int(severity.name) not in SEVERITIES:
                raise ValueError(
                    f"{severity}/ is not a severity folder (1-{SEVERITIES[-1]}); {_LAYOUTS}"
                )
            out[(name, int(severity.name))] = severity
    return dict(sorted(out.items()))


def _class_indices(
    folders: Sequence[str], class_names: Sequence[str] | None, num_classes: int, where: Path
) -> dict[str, int]:
    """Class index of every class folder: by the dataset's class names, else in sorted order."""
    if class_names is not None:
        position: dict[str, int] = {}
        for i, name in enumerate(class_names[:num_classes]):
            position.setdefault(str(name), i)
        known = [name for name in folders if name in position]
        if len(known) == len(folders):
            return {name: position[name] for name in folders}
        if known:
            other = next(name for name in folders if name not in position)
            raise ValueError(
                f"{where}/ mixes class folders named as the dataset's classes (e.g. "
                f"{known[0]!r}) and others (e.g. {other!r})"
            )
    if len(folders) != num_classes:
        raise ValueError(
            f"{where}/ has {len(folders)} class folders but the dataset has {num_classes} "
            "classes (folders not named as the dataset's classes map to classes in sorted order)"
        )
    return {name: i for i, name in enumerate(sorted(folders))}


def _imagenet_c_files(
    folders: dict[tuple[str, int], Path],
    class_names: Sequence[str] | None,
    num_classes: int,
) -> tuple[list[str], np.ndarray]:
    """``<class>/<file>`` names of the first entry sorted by (class index, name), their labels."""
    (first_key, first), *rest = folders.items()
    classes = [p.name for p in _subfolders(first)]
    if not classes:
        raise ValueError(f"{first}/ holds no <class>/ folder; {_LAYOUTS}")
    for _, path in rest:
        names = {p.name for p in _subfolders(path)}
        if names != set(classes):
            missing = sorted(set(classes) - names)[:3]
            extra = sorted(names - set(classes))[:3]
            raise ValueError(
                f"{path}/ has other class folders than {first}/ (missing: "
                f"{', '.join(missing) or 'none'}; extra: {', '.join(extra) or 'none'})"
            )
    index = _class_indices(classes, class_names, num_classes, first)
    files: list[str] = []
    labels: list[int] = []
    for name in sorted(classes, key=lambda c: (index[c], c)):
        for file in sorted(os.listdir(first / name)):
            if file.lower().endswith(_IMAGE_SUFFIXES) and not file.startswith("."):
                files.append(f"{name}/{file}")
                labels.append(index[name])
    if not files:
        raise ValueError(
            f"{first}/ holds no image file ({', '.join(_IMAGE_SUFFIXES)}) in its class folders"
        )
    return files, np.asarray(labels, dtype=np.int64)


def load_released_shift_set(
    path: str | os.PathLike,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    num_classes: int,
    class_names: Sequence[str] | None = None,
    max_samples: int | None = None,
    seed: int = 0,
) -> ShiftSet:
    """A :class:`ShiftSet` over a released corrupted test set, its entries read lazily.

    Two layouts (Hendrycks and Dietterich, ICLR 2019):

    - **CIFAR-10-C / CIFAR-100-C**: ``path/<corruption>.npy``, uint8 (5 N, 32, 32, 3) with the
      severities 1-5 stacked in order (rows ``[(s - 1) N, s N)``), and ``path/labels.npy``
      (5 N,) (the test labels repeated per severity). Row i of a severity block is test image
      i: ``labels.npy`` must equal ``labels`` in every block. Entries memory-map the files and
      read only the subsample's rows.
    - **Tiny-ImageNet-C / ImageNet-C**: ``path/<corruption>/<severity>/<class>/*.JPEG``. Class
      folders map to class indices by ``class_names`` when every folder is one of them, else in
      sorted order (the order of torchvision's ``ImageFolder`` and of the Tiny-ImageNet wnids),
      which needs one folder per class. Every ``<corruption>/<severity>/`` must hold the same
      ``<class>/<file>`` names (as the released sets do); the files are listed once, in the
      first such folder, and read in order (class index, file name). Images are not paired
      with test images by name: the per-class counts must equal the test split's, and the
      corrupted row at position p (in that order) gets the label of the test image at
      position p of the test split sorted stably by label, which is the same. The per-row
      metrics are unaffected; the clean row is those test images.

    ``max_samples`` draws one class-stratified subsample (as :func:`build_shift_set`) used by
    the clean entry and every corrupted entry. The corruptions are the files or folders found
    (CIFAR-10-C: the 15 benchmark ones plus the 4 held-out ``speckle_noise``,
    ``gaussian_blur``, ``spatter``, ``saturate``; the ``shift_mean_*`` of
    :meth:`ShiftReport.as_metrics` average over all of them), sorted by name; severities as
    found (1-5). Nothing is corrupted here, so ``imagecorruptions`` is not needed.

    Args:
        path: the folder.
        images: uint8 (N, H, W, C) clean test images (as stored, before normalisation); the
            released images must have the same H x W x C.
        labels: (N,) integer test labels in [0, ``num_classes``).
        num_classes: number of classes K of the dataset (>= 1).
        class_names: the dataset's class names (``DatasetSplits.class_names``), or None.
        max_samples: size of the subsample (>= 1); None (or >= N) keeps every image. Defaults
            to None.
        seed: integer >= 0 of the subsample. Defaults to ``0``.

    Returns:
        A :class:`ShiftSet`: the clean test images (subsample) under :data:`CLEAN` as an
        array, then one :class:`LazyImages` per (corruption, severity); ``index`` holds the
        rows of the test split.

    Raises:
        ValueError: one line naming the problem: ``path`` not a folder or in neither layout;
            a ``labels.npy`` that is not (5 N,) integer labels, holds another N than the test
            split or other labels; a ``.npy`` that is not uint8 (5 N, H, W, C); images of
            another size than ``images``; labels outside [0, K); class folders that differ
            between entries, mix class names and other names, or (not named as classes) are
            not K; per-class counts unlike the test split's; a corruption name unusable in
            metric names (or ``clean`` / ``mean``); invalid ``images`` / ``labels``;
            ``max_samples`` < 1 or ``seed`` < 0.
        TypeError: if ``images`` is not a NumPy array or ``num_classes``, ``max_samples`` or
            ``seed`` is not an integer.
    """
    images = _check_images(images)
    labels = _as_index_array("labels", labels, images.shape[0])
    if images.shape[0] == 0:
        raise ValueError(f"`images` must hold at least one image, got shape {images.shape}")
    num_classes = _check_int("num_classes", num_classes, minimum=1)
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(
            f"`labels` must be in [0, {num_classes - 1}], got [{labels.min()}, {labels.max()}]"
        )
    if max_samples is not None:
        max_samples = _check_int("max_samples", max_samples, minimum=1)
    seed = _check_int("seed", seed, minimum=0)
    folder = Path(path).expanduser().absolute()
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder; {_LAYOUTS}")
    hwc = tuple(int(d) for d in images.shape[1:])
    entries: dict[tuple[str, int], LazyImages]
    if (folder / RELEASED_LABELS_FILE).is_file():
        index = _stratified_subsample(labels, max_samples, seed)
        entries = _cifar_c_entries(folder, hwc, labels, num_classes, index)
    else:
        folders = _imagenet_c_folders(folder)
        files, released = _imagenet_c_files(folders, class_names, num_classes)
        first = next(iter(folders.values()))
        have = np.bincount(released, minlength=num_classes)
        want = np.bincount(labels, minlength=num_classes)
        if not np.array_equal(have, want):
            c = int(np.flatnonzero(have != want)[0])
            name = (
                f" ({class_names[c]})" if class_names is not None and c < len(class_names) else ""
            )
            raise ValueError(
                f"{first}/ holds {have[c]} images of class {c}{name}, the test split {want[c]}; "
                "the folder was not made from this test split"
            )
        _read_image(first / files[0], hwc)  # the image size, now rather than in every trial
        positions = _stratified_subsample(released, max_samples, seed)
        index = np.argsort(labels, kind="stable")[positions]
        chosen = tuple(files[p] for p in positions)
        entries = {
            key: _ImageFiles(entry, chosen, shape=(len(chosen), *hwc))
            for key, entry in folders.items()
        }
    clean = np.ascontiguousarray(images[index])
    return ShiftSet(images={CLEAN: clean, **entries}, labels=labels[index], index=index)


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


@dataclass
class ShiftReport:
    """Metrics of a model on a :class:`ShiftSet`.

    Attributes:
        rows: one dict per (corruption, severity), the clean row first (``corruption="clean"``,
            ``severity=0``); keys ``corruption``, ``severity``, ``accuracy``, ``ece``, ``nll``
            and, when a calibrator was given, ``calibrator`` (its name), ``accuracy_cal``,
            ``ece_cal``, ``nll_cal``. Accuracy and ECE are fractions in [0, 1], NLL in nats.
        calibrator: name of the calibrator, or None.
    """

    rows: list[dict[str, Any]]
    calibrator: str | None = None

    def _metric_names(self) -> list[str]:
        names = list(_METRICS)
        if self.calibrator is not None:
            names += [f"{m}_cal" for m in _METRICS]
        return names

    def to_frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (one row per (corruption, severity), clean first).

        Returns:
            Columns ``corruption``, ``severity``, ``accuracy``, ``ece``, ``nll`` and, with a
            calibrator, ``calibrator``, ``accuracy_cal``, ``ece_cal``, ``nll_cal``.
        """
        import pandas as pd

        columns = ["corruption", "severity"]
        if self.calibrator is not None:
            columns.append("calibrator")
        return pd.DataFrame(self.rows, columns=columns + self._metric_names())

    def _means(self) -> dict[int, dict[str, float]]:
        """Per severity (sorted), the mean of every metric over the rows of that severity."""
        by_severity: dict[int, list[dict[str, Any]]] = {}
        for row in self.rows:
            by_severity.setdefault(int(row["severity"]), []).append(row)
        return {
            severity: {
                name: float(np.mean([row[name] for row in by_severity[severity]]))
                for name in self._metric_names()
            }
            for severity in sorted(by_severity)
        }

    def as_metrics(self) -> dict[str, float]:
        """Flat metric names for MLflow.

        ``shift_{corruption}_{severity}_{metric}`` for metric in accuracy, ece, nll (the clean
        row is ``shift_clean_0_{metric}``) and, after the calibrator,
        ``shift_{corruption}_{severity}_{metric}_{calibrator}`` (e.g.
        ``shift_gaussian_noise_3_ece_ts``); then the means over corruptions per severity,
        ``shift_mean_{severity}_{metric}[_{calibrator}]`` (``shift_mean_0_*`` is the clean row).

        Returns:
            Dict of Python floats (fractions; NLL in nats).
        """
        suffix = {m: m for m in _METRICS}
        if self.calibrator is not None:
            suffix |= {f"{m}_cal": f"{m}_{self.calibrator}" for m in _METRICS}
        metrics: dict[str, float] = {}
        for row in self.rows:
            prefix = f"shift_{row['corruption']}_{row['severity']}"
            for key, name in suffix.items():
                metrics[f"{prefix}_{name}"] = float(row[key])
        for severity, means in self._means().items():
            for key, name in suffix.items():
                metrics[f"shift_mean_{severity}_{name}"] = means[key]
        return metrics

    def summary(self) -> str:
        """A small text table of the means over corruptions per severity, in percent.

        Returns:
            Lines ``severity | accuracy (%) | ECE (%) [| ECE {calibrator} (%)]``, one per
            severity (0 = clean), values with 2 decimals.
        """
        headers = ["severity", "accuracy (%)", "ECE (%)"]
        keys = ["accuracy", "ece"]
        if self.calibrator is not None:
            headers.append(f"ECE {self.calibrator} (%)")
            keys.append("ece_cal")
        table = [
            ["0 (clean)" if s == 0 else str(s)] + [f"{100 * means[k]:.2f}" for k in keys]
            for s, means in self._means().items()
        ]
        widths = [max(len(r[i]) for r in [headers, *table]) for i in range(len(headers))]

        def line(cells: list[str]) -> str:
            rest = [cell.rjust(widths[i]) for i, cell in enumerate(cells) if i > 0]
            return "  ".join([cells[0].ljust(widths[0]), *rest])

        return "\n".join([line(headers)] + [line(r) for r in table])


def _logits_array(value: Any, n: int, name: str) -> np.ndarray:
    """Check (N, K) finite float logits; accepts NumPy arrays and (any-device) torch tensors."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().float().numpy()
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"`{name}` must be float logits, got dtype {array.dtype}")
    if array.ndim != 2 or array.shape[0] != n:
        raise ValueError(f"`{name}` must have shape ({n}, K), got {array.shape}")
    return array


def _calibrator_label(calibrator: Any, calibrator_name: str | None) -> str | None:
    if calibrator is None:
        if calibrator_name is not None:
            raise ValueError(
                f"`calibrator_name` was given ({calibrator_name!r}) without a `calibrator`"
            )
        return None
    if not callable(getattr(calibrator, "predict_proba", None)):
        raise TypeError(
            f"`calibrator` must have a predict_proba(logits) method, got "
            f"{type(calibrator).__name__}"
        )
    name = calibrator_name if calibrator_name is not None else getattr(calibrator, "name", None)
    if not isinstance(name, str) or not _NAME_PATTERN.match(name):
        raise ValueError(
            "`calibrator_name` must be a non-empty name of letters, digits, '_', '.' or '-' "
            f"(used in metric names), got {name!r}"
        )
    return name


def _row_metrics(
    probs: np.ndarray, labels: np.ndarray, n_bins: int, suffix: str = ""
) -> dict[str, float]:
    """Accuracy, ECE and NLL of one entry under the keys ``{metric}{suffix}``."""
    from raysearch.metrics import accuracy, ece, nll

    return {
        f"accuracy{suffix}": accuracy(probs, labels),
        f"ece{suffix}": ece(probs, labels, n_bins=n_bins),
        f"nll{suffix}": nll(probs, labels),
    }


def evaluate_shift(
    predict_logits: Callable[[np.ndarray], np.ndarray],
    shift_set: ShiftSet,
    *,
    clean_logits: np.ndarray | None = None,
    calibrator: Any | None = None,
    calibrator_name: str | None = None,
    n_bins: int = 15,
) -> ShiftReport:
    """Accuracy, ECE and NLL on every entry of a shift set, before and after a calibrator.

    Args:
        predict_logits: maps uint8 (N, H, W, C) images to (N, K) float logits (the caller
            normalises and runs the model, batching as it needs); called once per entry of
            ``shift_set.images`` (except the clean one when ``clean_logits`` is given).
        shift_set: from :func:`build_shift_set`, :func:`load_released_shift_set` or
            :meth:`ShiftSet.load`; its entries are read one at a time (:meth:`ShiftSet.read`).
        clean_logits: (N, K) float logits of the uncorrupted subsample, in its order (e.g.
            ``test_logits[shift_set.index]``); None computes them with ``predict_logits``.
        calibrator: a fitted raysearch calibrator (``predict_proba``); it gets the logits, or
            their softmax if it was fitted with ``inputs="probs"``. Defaults to None.
        calibrator_name: its name in the metrics (letters, digits, ``_ . -``); defaults to
            ``calibrator.name`` (e.g. ``"ts"``).
        n_bins: equal-width bins of the ECE. Defaults to ``15``.

    Returns:
        A :class:`ShiftReport`, the clean row (severity 0) first.

    Raises:
        ValueError: if ``clean_logits`` or an output of ``predict_logits`` is not float
            (N, K), K varies between entries, labels fall outside [0, K),
            ``calibrator_name`` is given without a calibrator or is not a valid name,
            ``n_bins`` < 1, or a lazy entry cannot be read (see :meth:`ShiftSet.read`).
        TypeError: if ``predict_logits`` is not callable, ``shift_set`` is not a
            :class:`ShiftSet` or ``calibrator`` has no ``predict_proba``.
    """
    from raysearch.metrics import softmax

    if not callable(predict_logits):
        raise TypeError(f"`predict_logits` must be callable, got {type(predict_logits).__name__}")
    if not isinstance(shift_set, ShiftSet):
        raise TypeError(f"`shift_set` must be a ShiftSet, got {type(shift_set).__name__}")
    name = _calibrator_label(calibrator, calibrator_name)
    n_bins = _check_int("n_bins", n_bins, minimum=1)
    n = shift_set.labels.shape[0]
    labels = shift_set.labels
    use_probs = getattr(calibrator, "inputs", "logits") == "probs"
    n_classes = None
    rows = []
    for key in shift_set.images:
        if key == CLEAN and clean_logits is not None:
            logits = _logits_array(clean_logits, n, "clean_logits")
        else:
            # one entry in memory at a time: a lazy entry is read here and dropped after use
            logits = _logits_array(
                predict_logits(shift_set.read(key)), n, f"predict_logits output for {key}"
            )
        if n_classes is None:
            n_classes = logits.shape[1]
        elif logits.shape[1] != n_classes:
            raise ValueError(
                f"logits for {key} have K={logits.shape[1]} classes, the clean ones K={n_classes}"
            )
        probs = softmax(logits)
        row: dict[str, Any] = {"corruption": key[0], "severity": key[1]}
        row |= _row_metrics(probs, labels, n_bins)
        if calibrator is not None:
            calibrated = calibrator.predict_proba(probs if use_probs else logits)
            row["calibrator"] = name
            row |= _row_metrics(calibrated, labels, n_bins, suffix="_cal")
        rows.append(row)
    return ShiftReport(rows=rows, calibrator=name)
