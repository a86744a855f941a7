"""Semantic-segmentation datasets: PASCAL VOC 2012 and a user's own image/mask folder.

Loaders (registered in :mod:`raysearch.training.data` as ``voc`` and ``segfolder``):
:func:`load_voc` and :func:`load_segfolder`. Each takes the keyword-only arguments of
:func:`raysearch.training.data.load_dataset` (`imbalance_ratio` must be ``None``: a long tail is
defined on image labels, not pixels) plus `crop_size` and `verify`, and returns a
:class:`~raysearch.training.data.DatasetSplits` with ``task="segmentation"``, ``ignore_index=255``
and :class:`SegmentationDataset` splits of ``(x float32 (3, S, S), y int64 (S, S))``,
``S = crop_size`` (default 512). Nothing is ever downloaded.

Layouts.

- ``voc``: the extracted official tar (:data:`VOC_URL`), ``data_dir`` being the folder above
  ``VOCdevkit``, ``VOCdevkit`` itself, or ``VOC2012`` itself::

      VOCdevkit/VOC2012/JPEGImages/<id>.jpg
      VOCdevkit/VOC2012/SegmentationClass/<id>.png      palette PNG, index = class id, 255 = void
      VOCdevkit/VOC2012/ImageSets/Segmentation/train.txt, val.txt   one <id> per line

  With the SBD augmentation (Hariharan et al. 2011) unpacked beside it, that is both
  ``VOC2012/SegmentationClassAug/<id>.png`` (single-channel PNGs of class ids and 255) and
  ``VOC2012/ImageSets/Segmentation/train_aug.txt`` (one ``<id>`` per line, or DeepLab's
  ``/JPEGImages/<id>.jpg /SegmentationClassAug/<id>.png`` lines), the training list is
  ``train_aug.txt`` (10,582 images in the real set) minus any image of ``val.txt``, with its
  masks from ``SegmentationClassAug/``. 21 classes, :data:`VOC_CLASSES` (0 = background).
  Lists are resolved into file paths by ``torchvision.datasets.VOCSegmentation(root,
  year="2012", image_set=..., download=False)``; where it cannot (``data_dir`` is a ``VOC2012``
  folder not inside a ``VOCdevkit`` folder, or the ``train_aug`` list), a subclass of it builds
  the same lists from the folder given.
- ``segfolder``::

      images/<stem>.jpg|.jpeg|.png     RGB (grey-scale and palette images are converted)
      masks/<stem>.png                 single-channel or palette PNG, value = class id, 255 = ignore
      classes.txt                      one class name per line; K = number of lines (<= 255)
      splits/train.txt, test.txt       optional: one <stem> per line (val.txt optional too)

Splits. ``voc``: VOC's ``val.txt`` (1,449 images) is the TEST split (the labels of VOC's own
test set are not public; the MbLS and ACLS papers report on ``val``). Validation for model
selection is `val_fraction` (default 0.1) of the training list, drawn at random
(``sklearn.model_selection.train_test_split(..., random_state=seed)``, not stratified: the
labels are pixels, not one class per image). ``segfolder`` with ``splits/``: the listed stems;
without ``val.txt`` validation is carved from ``train.txt`` as for VOC. Without ``splits/``: all
images with a mask are split at random by seed, `test_fraction` (default 0.2) of all as test,
then `val_fraction` (default 0.1) of all as validation. ``info`` records how
(``val_split``, ``test_split``, sizes, ``train_list`` for VOC).

Transforms (:func:`segmentation_transforms`, ``torchvision.transforms.v2`` on a
``tv_tensors.Image`` and a ``tv_tensors.Mask`` together; masks are resized with nearest
neighbour and padded with 255, so padding is ignored by the loss and the metrics):

- train: ``ScaleJitter``: resize so the LONGEST side is ``S * s``, ``s ~ U(0.5, 2.0)`` (the
  scale augmentation of the DeepLab training pipelines); pad bottom/right to at least S x S
  (image 0, mask 255); random S x S crop; random horizontal flip; colour jitter (brightness,
  contrast, saturation 0.2; image only); float32 in [0, 1]; ImageNet mean/std. The random draws
  use the global torch RNG (the trainer seeds it; DataLoader workers get their own seeds).
- val and test: no crop: resize the longest side to S, pad bottom/right to S x S (mask 255),
  normalise. Every sample then has the same shape, so batches stack; metrics (mIoU, pixel ECE)
  are therefore computed at that resolution, not at the original image size.

Checks. Loading always checks the folders, the split files and that every listed image and mask
exists (one directory listing per folder). Mask values are checked lazily, when a sample is read
(a :class:`~raysearch.training.data.DatasetError` naming the file), and for every mask at once with
``verify=True`` (:func:`verify_segmentation`: every mask is decoded, its mode and values checked
against {0..K-1, 255}, and its size compared with its image's header). Measured on 1,000
synthetic VOC-sized (500x375) palette PNGs (three objects with 255 borders each): 0.43 s of CPU
per 1,000 masks (decoding is most of it), 0.6 to 1.0 s of wall time on a busy 2-core machine
(up to 4 s for a first call in a fresh process there); so roughly 5 to 12 s for the 12,031 masks
of VOC with the SBD list. One thread: PNG decoding holds the GIL, threads did not help. The
sweep's driver does it once, before Ray starts; trials load without it.

Modules. This module holds the PASCAL VOC 2012 loader (:func:`load_voc`, :func:`voc_palette`,
the ``VOC_*`` constants) and gathers the public names of the other two:
:mod:`raysearch.training.data.segmentation_common` (the transforms, mask reading,
:class:`SegmentationDataset`, :func:`verify_segmentation` and the helpers the loaders share)
and :mod:`raysearch.training.data.segfolder` (:func:`load_segfolder`). Neither imports this module.

References:
    Everingham et al., "The PASCAL Visual Object Classes (VOC) Challenge", IJCV 2010.
    Hariharan et al., "Semantic Contours from Inverse Detectors", ICCV 2011 (SBD).
    Chen et al., "Rethinking Atrous Convolution for Semantic Image Segmentation" (DeepLabV3),
    arXiv:1706.05587, 2017. Liu et al., "The Devil is in the Margin: Margin-based Label Smoothing
    for Network Calibration" (MbLS), CVPR 2022: DeepLabV3 on VOC 2012, batch 8, 100 epochs.
    Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network Calibration", ICCV
    2023: MbLS's protocol with the SBD-augmented list (10,582 training, 1,449 validation images).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from torchvision.datasets import VisionDataset, VOCSegmentation

from raysearch.training.data.objectness import VOC_CLASSES as _VOC_OBJECTS
from raysearch.training.data.segfolder import SEGFOLDER_LAYOUT, load_segfolder
from raysearch.training.data.segmentation_common import (
    COLOR_JITTER,
    DEFAULT_CROP_SIZE,
    IGNORE_INDEX,
    SCALE_RANGE,
    PadToSize,
    SegmentationDataset,
    _listing,
    _pct,
    _random_carve,
    _read_stems,
    _reject_unsupported,
    _require_dir,
    _resolve_crop_size,
    _splits,
    logger,
    segmentation_transforms,
    verify_segmentation,
)
from raysearch.training.data.splits import OFFICIAL_VAL_FRACTION, DatasetError, DatasetSplits

__all__ = [
    "COLOR_JITTER",
    "DEFAULT_CROP_SIZE",
    "IGNORE_INDEX",
    "SCALE_RANGE",
    "SEGFOLDER_LAYOUT",
    "VOC_CLASSES",
    "VOC_LAYOUT",
    "VOC_URL",
    "PadToSize",
    "SegmentationDataset",
    "load_segfolder",
    "load_voc",
    "segmentation_transforms",
    "verify_segmentation",
]


def voc_palette() -> np.ndarray:
    """The PASCAL VOC colour map of the devkit's ``labelcolormap``: (256, 3) uint8 RGB.

    Class id i (0..255, 255 = the boundary label) gets the colour whose bits interleave the
    bits of i; the ``SegmentationClass`` PNGs of VOC carry this palette.
    """
    colours = np.zeros((256, 3), np.uint8)
    for i in range(256):
        c, r, g, b = i, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        colours[i] = (r, g, b)
    return colours


#: The 21 PASCAL VOC segmentation classes, index = class id in the masks: the background and
#: the devkit's 20 object classes.
VOC_CLASSES = ("background", *_VOC_OBJECTS)

VOC_URL = "http://host.robots.ox.ac.uk/pascal/VOC/voc2012/VOCtrainval_11-May-2012.tar"
VOC_LAYOUT = (
    "VOCdevkit/VOC2012/{JPEGImages/<id>.jpg, SegmentationClass/<id>.png, "
    "ImageSets/Segmentation/{train,val}.txt}"
)


# --------------------------------------------------------------------------------------------
# PASCAL VOC 2012


class _VOCSegmentationLists(VOCSegmentation):
    """``VOCSegmentation`` over a ``VOC2012`` folder anywhere, with any list and mask folder.

    ``VOCSegmentation(root, year="2012", image_set=...)`` wants ``root/VOCdevkit/VOC2012``, a list
    in ``{train, trainval, val}`` and masks in ``SegmentationClass/``. This builds ``images`` and
    ``targets`` exactly as its constructor does (``JPEGImages/<id>.jpg``,
    ``<mask_dir>/<id>.png``) from `voc_root` itself, for a ``VOC2012`` folder outside a
    ``VOCdevkit`` folder and for SBD's ``train_aug`` list with ``SegmentationClassAug/``.
    """

    def __init__(self, voc_root: Path, image_set: str, mask_dir: str, stems: list[str]) -> None:
        VisionDataset.__init__(self, str(voc_root))
        self.year = "2012"
        self.image_set = image_set
        self.images = [os.path.join(voc_root, "JPEGImages", s + ".jpg") for s in stems]
        self.targets = [os.path.join(voc_root, mask_dir, s + ".png") for s in stems]


def _find_voc_root(root: Path) -> Path:
    """The ``VOC2012`` folder of `data_dir` (above ``VOCdevkit``, ``VOCdevkit``, or itself)."""
    for candidate in (root / "VOCdevkit" / "VOC2012", root / "VOC2012", root):
        if (candidate / "ImageSets" / "Segmentation").is_dir() or (
            candidate / "JPEGImages"
        ).is_dir():
            return candidate
    raise DatasetError(
        f"voc: no PASCAL VOC 2012 folder in {root}/; expected {root}/{VOC_LAYOUT} (or pass the "
        f"VOCdevkit or VOC2012 folder itself); download and extract {VOC_URL} there"
    )


def _voc_pairs(
    voc_root: Path, image_set: str, mask_dir: str, stems: list[str]
) -> list[tuple[str, str]]:
    """(image, mask) paths of `stems`, through VOCSegmentation where it can read the folder."""
    tv_root = voc_root.parent.parent
    if (
        mask_dir == "SegmentationClass"
        and image_set in ("train", "val")
        and voc_root.name == "VOC2012"
        and voc_root.parent.name == "VOCdevkit"
    ):
        reader: VOCSegmentation = VOCSegmentation(
            str(tv_root), year="2012", image_set=image_set, download=False
        )
        # VOCSegmentation keeps blank lines as empty ids; the stems parsed here do not
        pairs = [
            (image, mask)
            for image, mask in zip(reader.images, reader.masks, strict=True)
            if Path(mask).name != ".png"
        ]
        if [Path(mask).stem for _, mask in pairs] == stems:
            return pairs
    reader = _VOCSegmentationLists(voc_root, image_set, mask_dir, stems)
    return list(zip(reader.images, reader.masks, strict=True))


def _check_present(
    name: str, pairs: list[tuple[str, str]], listings: dict[Path, set[str]], layout: str
) -> None:
    """Raise naming the first listed image or mask that is not on disk."""
    for pair in pairs:
        for path in map(Path, pair):
            folder = path.parent
            if folder not in listings:
                listings[folder] = _listing(folder) if folder.is_dir() else set()
            if path.name not in listings[folder]:
                raise DatasetError(
                    f"{name}: {path} is listed but missing ({len(pairs)} images listed); "
                    f"expected {layout}"
                )


def _reject_voc_options(name: str, download: bool, imbalance_ratio: float | None, verify: bool,
                        test_fraction: float | None) -> None:
    """Refuse the loader options VOC has no use for (one-line DatasetError each)."""
    if download:
        raise DatasetError(
            f"voc: raysearch does not download PASCAL VOC 2012; download {VOC_URL} (about 2 GB), "
            f"extract it and pass the folder holding {VOC_LAYOUT} as --data-dir, without "
            "--download"
        )
    _reject_unsupported(name, imbalance_ratio, verify)
    if test_fraction is not None:
        raise DatasetError(
            f"voc tests on VOC's val.txt; `test_fraction` applies to digits and to folder "
            f"datasets without their own test split (got test_fraction={test_fraction})"
        )


def _voc_lists(name: str, voc_root: Path, layout: str
               ) -> tuple[str, str, list[str], list[str], int | None]:
    """The training list, its mask folder, the training and test stems, and what SBD dropped.

    The training list is ``train_aug.txt`` minus the stems of ``val.txt`` (masks in
    ``SegmentationClassAug/``) when both exist, else ``train.txt`` (masks in
    ``SegmentationClass/``); the test stems are those of ``val.txt``. The last item is the number
    of ``train_aug.txt`` stems left out for being in ``val.txt``, or None without ``train_aug``.

    Raises:
        DatasetError: if a folder of the layout or a split file is missing or unreadable.
    """
    sets = voc_root / "ImageSets" / "Segmentation"
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        if not (voc_root / folder).is_dir():
            raise DatasetError(
                f"voc: the folder {voc_root / folder}/ is missing; expected {layout}"
            )
    test_stems = _read_stems(name, sets / "val.txt", layout)
    if not ((voc_root / "SegmentationClassAug").is_dir() and (sets / "train_aug.txt").is_file()):
        train_stems = _read_stems(name, sets / "train.txt", layout)
        return "train", "SegmentationClass", train_stems, test_stems, None
    test_set = set(test_stems)
    listed = _read_stems(name, sets / "train_aug.txt", layout)
    train_stems = [s for s in listed if s not in test_set]
    removed = len(listed) - len(train_stems)
    if removed:
        logger.info("voc: %d images of train_aug.txt are in val.txt: left out", removed)
    return "train_aug", "SegmentationClassAug", train_stems, test_stems, removed


def load_voc(
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
    """PASCAL VOC 2012 segmentation (21 classes), optionally with the SBD training list.

    See the module docstring for the layout, the splits and the transforms: ``val.txt`` is the
    test split, validation is a random `val_fraction` of the training list (``train.txt``, or
    ``train_aug.txt`` minus ``val.txt`` when ``SegmentationClassAug/`` and ``train_aug.txt``
    exist).

    Args:
        seed (int): seed of the validation carve.
        val_fraction (float, optional): share of the training list held out for validation, in
            (0, 1). Defaults to ``None`` (0.1).
        test_fraction (float, optional): must be ``None`` (the test split is ``val.txt``).
        data_dir (str | os.PathLike, optional): the folder above ``VOCdevkit``, ``VOCdevkit`` or
            ``VOC2012``; required.
        download (bool, optional): must be ``False``; raysearch does not download VOC.
        imbalance_ratio (float, optional): must be ``None``.
        crop_size (int, optional): side S of the crops and evaluation canvases, >= 1. Defaults
            to ``None`` (:data:`DEFAULT_CROP_SIZE`, 512).
        verify (bool, optional): decode and check every mask now (:func:`verify_segmentation`,
            roughly 5 to 12 s for the SBD list). Defaults to ``False`` (masks are checked when
            read).

    Returns:
        DatasetSplits: :class:`SegmentationDataset` splits of ``(x float32 (3, S, S), y int64
        (S, S))``, ``task="segmentation"``, ``ignore_index=255``; ``info`` has ``train_list``
        (``"train"`` or ``"train_aug"``), ``val_split``, ``val_fraction``, ``test_split``,
        ``data_dir``, ``crop_size`` and the sizes.

    Raises:
        DatasetError: if `data_dir` is None or holds no VOC 2012 folder, a split file or folder
            is missing, a listed image or mask is missing, `download`, `imbalance_ratio` or
            `test_fraction` is given, the training list is too small to carve, or (with
            `verify`, or when a sample is read) a mask is unreadable, has a value outside
            {0..20, 255} or another size than its image.
        ValueError: if `crop_size` < 1.
    """
    name = "voc"
    _reject_voc_options(name, download, imbalance_ratio, verify, test_fraction)
    crop_size = _resolve_crop_size(crop_size)
    val_fraction = OFFICIAL_VAL_FRACTION if val_fraction is None else float(val_fraction)
    root = _require_dir(name, data_dir, VOC_LAYOUT)
    voc_root = _find_voc_root(root)
    layout = f"{voc_root}/{{JPEGImages/<id>.jpg, SegmentationClass/<id>.png, ImageSets/...}}"
    train_list, mask_dir, train_stems, test_stems, removed = _voc_lists(name, voc_root, layout)
    use_aug = removed is not None
    train_pairs = _voc_pairs(voc_root, train_list, mask_dir, train_stems)
    test_pairs = _voc_pairs(voc_root, "val", "SegmentationClass", test_stems)
    listings: dict[Path, set[str]] = {}
    _check_present(name, train_pairs, listings, layout)
    _check_present(name, test_pairs, listings, layout)
    source = f"{train_list}.txt" + (" minus val.txt" if use_aug else "")
    train, val = _random_carve(name, len(train_pairs), val_fraction, seed, "validation", source)
    info = {
        "train_list": train_list,
        "val_split": (
            f"random {_pct(val_fraction)} of the {source} list ({len(train_pairs)} images), "
            f"seed {seed}; not stratified"
        ),
        "val_fraction": val_fraction,
        "test_split": "VOC2012 ImageSets/Segmentation/val.txt",
        "data_dir": str(voc_root),
    }
    if use_aug:
        info["train_aug_in_val"] = removed
    return _splits(
        name,
        {
            "train": [train_pairs[i] for i in train],
            "val": [train_pairs[i] for i in val],
            "test": test_pairs,
        },
        classes=VOC_CLASSES,
        crop_size=crop_size,
        info=info,
        verify=verify,
    )
