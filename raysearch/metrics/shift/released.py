"""Released corrupted test sets (CIFAR-10-C, CIFAR-100-C, Tiny-ImageNet-C, ImageNet-C).

:func:`load_released_shift_set` reads a folder in the CIFAR-10-C layout (``<corruption>.npy``
+ ``labels.npy``) or the ImageNet-C layout (``<corruption>/<severity>/<class>/*.JPEG``) into a
:class:`~raysearch.metrics.shift.sets.ShiftSet` whose corrupted entries are :class:`_NpyRows` or
:class:`_ImageFiles`: lazy entries holding only file names and row numbers, read one
(corruption, severity) at a time by :func:`~raysearch.metrics.shift.evaluation.evaluate_shift`.
Nothing is corrupted here, so ``imagecorruptions`` is not needed.

Imports :mod:`raysearch.metrics.shift.corruptions` and :mod:`raysearch.metrics.shift.sets` (NumPy;
Pillow when an image file is read); :mod:`raysearch.metrics.shift` gathers its public names.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysearch.metrics.shift.corruptions import (
    _NAME_PATTERN,
    SEVERITIES,
    _as_index_array,
    _check_images,
    _check_int,
)
from raysearch.metrics.shift.sets import CLEAN, LazyImages, ShiftSet, _stratified_subsample

__all__ = ["HELD_OUT_CORRUPTIONS", "RELEASED_LABELS_FILE", "load_released_shift_set"]

#: Labels file of a CIFAR-10-C / CIFAR-100-C folder: (5 N,) labels, severities 1-5 stacked.
RELEASED_LABELS_FILE = "labels.npy"
#: The four extra corruptions the released folders hold besides the benchmark's 15
#: (:data:`~raysearch.metrics.shift.corruptions.DEFAULT_CORRUPTIONS`): Hendrycks and
#: Dietterich release them for validation, and the papers' tables average over the 15 only.
#: A shift set of a released folder reports them apart (:attr:`ShiftSet.held_out`).
HELD_OUT_CORRUPTIONS: tuple[str, ...] = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
#: Image files of an ImageNet-C-layout folder (torchvision's ``IMG_EXTENSIONS``, any case).
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_LAYOUTS = (
    "expected CIFAR-10-C (<corruption>.npy + labels.npy) or ImageNet-C "
    "(<corruption>/<severity>/<class>/*.JPEG) layout"
)
#: Corruption names that would collide with the clean row and the means in metric names.
_RESERVED_NAMES = ("clean", "mean")


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


def _check_released_labels(labels_path: Path, labels: np.ndarray, num_classes: int) -> None:
    """Check a CIFAR-10-C ``labels.npy``: the test split's labels, once per severity.

    Raises:
        ValueError: naming the file and what does not match the test split.
    """
    n = labels.shape[0]
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


def _cifar_c_entries(
    folder: Path, hwc: tuple[int, ...], labels: np.ndarray, num_classes: int, index: np.ndarray
) -> dict[tuple[str, int], LazyImages]:
    """The lazy entries of a CIFAR-10-C-layout folder for the test rows ``index``."""
    n = labels.shape[0]
    k = len(SEVERITIES)
    _check_released_labels(folder / RELEASED_LABELS_FILE, labels, num_classes)
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
    the clean entry and every corrupted entry. The corruptions are the files or folders found,
    sorted by name; severities as found (1-5). The released CIFAR-10-C, CIFAR-100-C,
    Tiny-ImageNet-C and ImageNet-C folders hold the benchmark's 15 corruptions plus the four
    of :data:`HELD_OUT_CORRUPTIONS` (``speckle_noise``, ``gaussian_blur``, ``spatter``,
    ``saturate``): those found are the set's :attr:`~ShiftSet.held_out`, so they get their own
    rows and metrics while the ``shift_mean_*`` of :meth:`ShiftReport.as_metrics` average over
    the others (the 15, as the papers' tables do). Nothing is corrupted here, so
    ``imagecorruptions`` is not needed.

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
        rows of the test split, ``held_out`` the corruptions of :data:`HELD_OUT_CORRUPTIONS`
        found.

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
    held_out = tuple(dict.fromkeys(name for name, _ in entries if name in HELD_OUT_CORRUPTIONS))
    return ShiftSet(images={CLEAN: clean, **entries}, labels=labels[index], index=index,
                    held_out=held_out)
