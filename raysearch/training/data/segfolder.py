"""The ``segfolder`` dataset: a user's own folder of images, masks and a class list.

:func:`load_segfolder` (registered in :mod:`raysearch.training.data` as ``segfolder``) and its
folder checks; the layout (:data:`SEGFOLDER_LAYOUT`) and the splits are described in
:mod:`raysearch.training.data.segmentation`, which gathers the public names of this module.

Imports: :mod:`raysearch.training.data.segmentation_common` and
:mod:`raysearch.training.data.splits` only; never :mod:`raysearch.training.data.segmentation` (which
imports this one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from raysearch.training.data.segmentation_common import (
    IGNORE_INDEX,
    _listing,
    _pct,
    _random_carve,
    _read_stems,
    _reject_unsupported,
    _require_dir,
    _resolve_crop_size,
    _splits,
)
from raysearch.training.data.splits import (
    IMAGEFOLDER_TEST_FRACTION,
    IMAGEFOLDER_VAL_FRACTION,
    OFFICIAL_VAL_FRACTION,
    DatasetError,
    DatasetSplits,
    check_fraction_sum,
)

SEGFOLDER_LAYOUT = (
    "images/<stem>.{jpg,jpeg,png}, masks/<stem>.png (class ids, 255 = ignore), classes.txt "
    "(one class name per line), optional splits/{train,val,test}.txt (stems)"
)

_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


# --------------------------------------------------------------------------------------------
# a user's own folder


def _read_classes(path: Path) -> list[str]:
    layout = SEGFOLDER_LAYOUT
    if not path.is_file():
        raise DatasetError(f"segfolder: {path} does not exist; expected {layout}")
    try:
        lines = [line.strip() for line in path.read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(f"segfolder: cannot read {path}: {err}") from err
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise DatasetError(f"segfolder: {path} lists no class; expected one class name per line")
    if "" in lines:
        raise DatasetError(
            f"segfolder: {path} has an empty line {lines.index('') + 1}; line i + 1 names class "
            "id i, so every line needs a name"
        )
    if len(lines) > IGNORE_INDEX:
        raise DatasetError(
            f"segfolder: {path} lists {len(lines)} classes; at most {IGNORE_INDEX} fit in "
            f"8-bit masks with {IGNORE_INDEX} as the ignore value"
        )
    return lines


def _scan_files(folder: Path, extensions: tuple[str, ...]) -> dict[str, Path]:
    """Map stem -> file of the files of `folder` with one of `extensions` (case-insensitive)."""
    if not folder.is_dir():
        raise DatasetError(
            f"segfolder: the folder {folder}/ is missing; expected {SEGFOLDER_LAYOUT}"
        )
    found: dict[str, Path] = {}
    for entry in sorted(_listing(folder)):
        path = folder / entry
        if path.suffix.lower() not in extensions:
            continue
        if path.stem in found:
            raise DatasetError(
                f"segfolder: {found[path.stem]} and {path} share the stem {path.stem!r}; "
                "keep one file per stem"
            )
        found[path.stem] = path
    return found


def _pair(
    stem: str, images: dict[str, Path], masks: dict[str, Path], root: Path, source: str
) -> tuple[str, str]:
    if stem not in images:
        raise DatasetError(
            f"segfolder: {root / 'images' / stem}.{{jpg,jpeg,png}} ({source}) is missing; "
            f"expected {SEGFOLDER_LAYOUT}"
        )
    if stem not in masks:
        raise DatasetError(
            f"segfolder: {root / 'masks' / stem}.png (the mask of {images[stem]}) is missing; "
            f"expected {SEGFOLDER_LAYOUT}"
        )
    return str(images[stem]), str(masks[stem])


def _listed_pairs(
    name: str, root: Path, images: dict[str, Path], masks: dict[str, Path], seed: int,
    val_fraction: float | None, test_fraction: float | None, info: dict[str, Any],
) -> dict[str, list[tuple[str, str]]]:
    """(image, mask) pairs per split of ``splits/*.txt``; the split descriptions go to `info`."""
    splits_dir = root / "splits"
    layout = f"{splits_dir}/train.txt and test.txt (stems; val.txt optional)"
    if test_fraction is not None:
        raise DatasetError(
            f"segfolder: {splits_dir}/ gives the test split; `test_fraction` applies to "
            f"folders without splits/ (got test_fraction={test_fraction})"
        )
    stems = {
        part: _read_stems(name, splits_dir / f"{part}.txt", layout)
        for part in ("train", "test")
    }
    has_val = (splits_dir / "val.txt").is_file()
    if has_val:
        if val_fraction is not None:
            raise DatasetError(
                f"segfolder: {splits_dir / 'val.txt'} gives the validation split; "
                f"`val_fraction` applies without it (got val_fraction={val_fraction})"
            )
        stems["val"] = _read_stems(name, splits_dir / "val.txt", layout)
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        shared = sorted(set(stems.get(a, ())) & set(stems.get(b, ())))
        if shared:
            raise DatasetError(
                f"segfolder: {splits_dir}/{a}.txt and {b}.txt share {len(shared)} stems "
                f"({', '.join(shared[:3])}); the splits must be disjoint"
            )
    pairs = {
        part: [_pair(s, images, masks, root, f"listed in {part}.txt") for s in listed]
        for part, listed in stems.items()
    }
    if has_val:
        info["val_split"] = str(splits_dir / "val.txt")
    else:
        fraction = OFFICIAL_VAL_FRACTION if val_fraction is None else float(val_fraction)
        train, val = _random_carve(
            name, len(pairs["train"]), fraction, seed, "validation", "splits/train.txt"
        )
        pairs["train"], pairs["val"] = (
            [pairs["train"][i] for i in train],
            [pairs["train"][i] for i in val],
        )
        info.update(
            val_split=(
                f"random {_pct(fraction)} of splits/train.txt ({len(train) + len(val)} "
                f"images), seed {seed}; not stratified"
            ),
            val_fraction=fraction,
        )
    info["test_split"] = str(splits_dir / "test.txt")
    return pairs


def _carved_pairs(
    name: str, root: Path, images: dict[str, Path], masks: dict[str, Path], seed: int,
    val_fraction: float | None, test_fraction: float | None, info: dict[str, Any],
) -> dict[str, list[tuple[str, str]]]:
    """(image, mask) pairs per random split of all images; the descriptions go to `info`."""
    val_fraction = IMAGEFOLDER_VAL_FRACTION if val_fraction is None else float(val_fraction)
    test_fraction = IMAGEFOLDER_TEST_FRACTION if test_fraction is None else float(test_fraction)
    check_fraction_sum(val_fraction, test_fraction)
    if not images:
        raise DatasetError(
            f"segfolder: {root / 'images'}/ holds no .jpg/.jpeg/.png image; expected "
            f"{SEGFOLDER_LAYOUT}"
        )
    everything = [_pair(s, images, masks, root, "found in images/") for s in sorted(images)]
    rest, test = _random_carve(name, len(everything), test_fraction, seed, "test", "images/")
    kept, val = _random_carve(
        name, len(rest), val_fraction / (1.0 - test_fraction), seed, "validation", "images/"
    )
    pairs = {
        "train": [everything[i] for i in rest[kept]],
        "val": [everything[i] for i in rest[val]],
        "test": [everything[i] for i in test],
    }
    info.update(
        val_split=(
            f"random {_pct(val_fraction)} val / {_pct(test_fraction)} test of all "
            f"{len(everything)} images, seed {seed}; not stratified"
        ),
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        test_split=f"random {_pct(test_fraction)} of all images, seed {seed}",
    )
    return pairs


def load_segfolder(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
    crop_size: int | None = None,
    verify: bool = False,
) -> DatasetSplits:
    """A user's own segmentation folder: ``images/``, ``masks/``, ``classes.txt``, ``splits/``.

    See the module docstring for the layout, the splits and the transforms.

    Args:
        seed (int): seed of the random splits.
        val_fraction (float, optional): validation share in (0, 1): of all images without
            ``splits/``, of ``splits/train.txt`` when ``splits/val.txt`` is absent; must be
            ``None`` with ``splits/val.txt``. Defaults to ``None`` (0.1).
        test_fraction (float, optional): test share of all images in (0, 1), without ``splits/``
            only. Defaults to ``None`` (0.2).
        data_dir (str | os.PathLike, optional): the folder; required.
        download (bool, optional): must be ``False`` (nothing to download).
        imbalance_ratio (float, optional): must be ``None``.
        crop_size (int, optional): side S of the crops and evaluation canvases, >= 1. Defaults
            to ``None`` (:data:`DEFAULT_CROP_SIZE`, 512).
        verify (bool, optional): decode and check every mask now (:func:`verify_segmentation`).
            Defaults to ``False`` (masks are checked when read).

    Returns:
        DatasetSplits: :class:`SegmentationDataset` splits, ``task="segmentation"``,
        ``ignore_index=255``, K = the lines of ``classes.txt``.

    Raises:
        DatasetError: if `data_dir` is None or not a folder, ``images/``, ``masks/`` or
            ``classes.txt`` is missing, ``classes.txt`` has no or an empty line or more than 255
            classes, ``splits/`` lacks ``train.txt`` or ``test.txt``, a listed or found image
            has no mask, two files share a stem, the split files share a stem, a fraction is
            given where it does not apply, a split would be empty, `download` or
            `imbalance_ratio` is given, or (with `verify`, or when a sample is read) a mask is
            unreadable, has a value outside {0..K-1, 255} or another size than its image.
        ValueError: if `val_fraction` + `test_fraction` >= 1 or `crop_size` < 1.
    """
    name = "segfolder"
    if download:
        raise DatasetError(
            f"segfolder: there is nothing to download for a folder of your own"
            f"{'' if data_dir is None else f' ({data_dir})'}; drop --download"
        )
    _reject_unsupported(name, imbalance_ratio, verify)
    crop_size = _resolve_crop_size(crop_size)
    root = _require_dir(name, data_dir, SEGFOLDER_LAYOUT)
    classes = _read_classes(root / "classes.txt")
    images = _scan_files(root / "images", _IMAGE_EXTENSIONS)
    masks = _scan_files(root / "masks", (".png",))
    info: dict[str, Any] = {"data_dir": str(root)}
    splits_dir = root / "splits"
    if splits_dir.is_dir():
        pairs = _listed_pairs(name, root, images, masks, seed, val_fraction, test_fraction, info)
    else:
        pairs = _carved_pairs(name, root, images, masks, seed, val_fraction, test_fraction, info)
    return _splits(name, pairs, classes=classes, crop_size=crop_size, info=info, verify=verify)
