"""ImageNet-C corruptions of a batch of images, and the argument checks of the shift modules.

:func:`corrupt_images` corrupts uint8 (N, H, W, C) images with one corruption of the
``imagecorruptions`` library (imported on first use, not with this module) at one severity,
seeding NumPy's global ``RandomState`` from (``seed``, corruption, severity) and restoring it on
exit (see :mod:`raysearch.metrics.shift` for the determinism and the constants' scale). The
checks of images, integers and index arrays defined here are shared by
:mod:`raysearch.metrics.shift.sets`,
:mod:`raysearch.metrics.shift.released` and :mod:`raysearch.metrics.shift.evaluation`.

The leaf of the shift modules: it imports nothing from the package (NumPy only), so the worker
processes of ``build_shift_set(processes=...)`` stay light. :mod:`raysearch.metrics.shift`
gathers its public names.
"""

from __future__ import annotations

import contextlib
import numbers
import re
import zlib
from collections.abc import Iterator
from types import ModuleType

import numpy as np

__all__ = ["DEFAULT_CORRUPTIONS", "MIN_IMAGE_SIZE", "SEVERITIES", "corrupt_images"]

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
#: Smallest height and width (pixels) the corruption library accepts.
MIN_IMAGE_SIZE = 32

#: Corruptions that draw from their own generator, seeded through a ``seed`` keyword.
_SEEDED_BY_KEYWORD = ("glass_blur", "impulse_noise")
#: Calibrator names must be usable inside flat MLflow metric names.
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+$")


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _library() -> ModuleType:
    """Import ``imagecorruptions`` on first use (it pulls in numba, OpenCV and scikit-image)."""
    try:
        import imagecorruptions
    except ImportError as err:  # pragma: no cover - the dependency is declared
        raise ImportError(
            "raysearch.metrics.shift needs the `imagecorruptions` package: pip install "
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
