"""The segmentation loaders (voc, segfolder) on small trees written in their real on-disk formats.

Everything goes through ``load_dataset``, the code path users take. Nothing is downloaded.
"""

import importlib
import importlib.abc
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

import raysearch
from raysearch.training.data import (
    DatasetError,
    DatasetSplits,
    dataset_defaults,
    dataset_task,
    load_dataset,
)
from raysearch.training.data import segmentation as seg
from raysearch.training.data.images import IMAGENET_MEAN, IMAGENET_STD

S = 32  # crop_size of every test

# (id, (width, height), class of its object): 6 training and 3 val images of different sizes
TRAIN = [
    ("2007_000032", (40, 30), 1),
    ("2007_000039", (30, 50), 15),
    ("2007_000063", (64, 48), 8),
    ("2007_000068", (20, 20), 12),
    ("2007_000121", (50, 40), 20),
    ("2007_000123", (36, 36), 3),
]
VAL = [
    ("2007_000033", (40, 30), 1),
    ("2007_000042", (30, 50), 19),
    ("2007_000061", (24, 24), 5),
]
# SBD extra training images (SegmentationClassAug only)
AUG = [("2008_000002", (44, 33), 7), ("2008_000003", (33, 44), 11), ("2008_000007", (28, 28), 2)]


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Nothing in these tests may reach the network: a connection attempt fails at once."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# --------------------------------------------------------------------------------------------
# writers of the real formats


def _mask_array(size: tuple[int, int], cls: int) -> np.ndarray:
    """Background 0, an object of class `cls` in the middle, a 1-pixel 255 border around it."""
    w, h = size
    mask = np.zeros((h, w), dtype=np.uint8)
    top, left, bottom, right = h // 4, w // 4, h - h // 4, w - w // 4
    mask[top - 1 : bottom + 1, left - 1 : right + 1] = 255
    mask[top:bottom, left:right] = cls
    return mask


def _write_jpeg(path: Path, size: tuple[int, int], seed: int) -> None:
    w, h = size
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=90)


def _write_palette_png(path: Path, mask: np.ndarray) -> None:
    image = Image.fromarray(mask, mode="P")
    image.putpalette(seg.voc_palette().ravel().tolist())
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def _write_gray_png(path: Path, mask: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(mask, mode="L").save(path)


def write_voc(parent: Path, *, aug: bool = False, voc_root: Path | None = None) -> Path:
    """A VOC 2012 tree at ``parent/VOCdevkit/VOC2012`` (or `voc_root`); returns its VOC2012."""
    voc = voc_root if voc_root is not None else parent / "VOCdevkit" / "VOC2012"
    sets = voc / "ImageSets" / "Segmentation"
    sets.mkdir(parents=True)
    for seed, (stem, size, cls) in enumerate(TRAIN + VAL):
        _write_jpeg(voc / "JPEGImages" / f"{stem}.jpg", size, seed)
        _write_palette_png(voc / "SegmentationClass" / f"{stem}.png", _mask_array(size, cls))
    (sets / "train.txt").write_text("".join(f"{s}\n" for s, _, _ in TRAIN))
    (sets / "val.txt").write_text("".join(f"{s}\n" for s, _, _ in VAL))
    if aug:
        for seed, (stem, size, _) in enumerate(AUG, start=100):
            _write_jpeg(voc / "JPEGImages" / f"{stem}.jpg", size, seed)
        # SBD masks are single-channel class ids; train_aug.txt also holds one val image
        for stem, size, cls in TRAIN + AUG + VAL[:1]:
            _write_gray_png(voc / "SegmentationClassAug" / f"{stem}.png", _mask_array(size, cls))
        lines = [s for s, _, _ in TRAIN] + [VAL[0][0]]
        # DeepLab's list format for the SBD images, plain ids for the rest
        lines += [f"/JPEGImages/{s}.jpg /SegmentationClassAug/{s}.png" for s, _, _ in AUG]
        (sets / "train_aug.txt").write_text("\n".join(lines) + "\n")
    return voc


CLASSES = ["background", "road", "car", "person", "tree"]
# (stem, extension, (width, height), object class)
FOLDER = [
    (f"img{i:02d}", (".jpg", ".png", ".jpeg")[i % 3], (24 + 2 * i, 40 - i), 1 + i % 4)
    for i in range(10)
]


def write_segfolder(root: Path, *, splits: dict[str, list[str]] | None = None) -> Path:
    for seed, (stem, ext, size, cls) in enumerate(FOLDER):
        _write_jpeg(root / "images" / f"{stem}{ext}", size, seed)
        _write_gray_png(root / "masks" / f"{stem}.png", _mask_array(size, cls))
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    for part, stems in (splits or {}).items():
        (root / "splits").mkdir(exist_ok=True)
        (root / "splits" / f"{part}.txt").write_text("\n".join(stems) + "\n")
    return root


# --------------------------------------------------------------------------------------------
# helpers


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def _stems(ds) -> list[str]:
    return [Path(image).stem for image, _ in ds.samples]


def _cls_of(stem: str) -> int:
    return {s: c for s, _, c in TRAIN + VAL + AUG}[stem]


def _check_items(splits: DatasetSplits) -> None:
    for ds in (splits.train, splits.val, splits.test):
        for i in range(len(ds)):
            x, y = ds[i]
            assert type(x) is torch.Tensor
            assert type(y) is torch.Tensor
            assert x.shape == (3, S, S)
            assert x.dtype == torch.float32
            assert y.shape == (S, S)
            assert y.dtype == torch.int64
            # nearest-neighbour masks: only the classes of the sample, and 255
            stem = Path(ds.samples[i][0]).stem
            assert set(y.unique().tolist()) <= {0, _cls_of(stem), 255}


# --------------------------------------------------------------------------------------------
# VOC


def test_voc_splits_items_and_info(tmp_path):
    write_voc(tmp_path)
    splits = load_dataset("voc", seed=3, data_dir=tmp_path, crop_size=S)
    assert splits.task == "segmentation"
    assert splits.ignore_index == 255
    assert splits.num_classes == 21
    assert splits.input_shape == (3, S, S)
    assert splits.class_names[0] == "background"
    assert splits.class_names[-1] == "tvmonitor"
    assert len(splits.class_names) == 21
    # test = val.txt in order; val = ceil(0.1 * 6) = 1 image carved from train.txt
    assert _stems(splits.test) == [s for s, _, _ in VAL]
    assert len(splits.val) == 1
    assert len(splits.train) == 5
    assert sorted(_stems(splits.train) + _stems(splits.val)) == sorted(s for s, _, _ in TRAIN)
    assert splits.info["train_list"] == "train"
    assert splits.info["val_fraction"] == 0.1
    assert splits.info["crop_size"] == S
    assert (splits.info["train_size"], splits.info["val_size"], splits.info["test_size"]) == (
        5,
        1,
        3,
    )
    assert "seed 3" in splits.info["val_split"]
    assert "not stratified" in splits.info["val_split"]
    assert all(isinstance(v, (str, int, float)) for v in splits.info.values())
    _check_items(splits)
    # the carve is by seed: the same seed gives the same split, the others differ somewhere
    again = load_dataset("voc", seed=3, data_dir=tmp_path, crop_size=S)
    assert _stems(again.val) == _stems(splits.val)
    vals = {tuple(_stems(load_dataset("voc", seed=k, data_dir=tmp_path).val)) for k in range(6)}
    assert len(vals) > 1
    # a larger val_fraction: ceil(0.5 * 6) = 3
    assert len(load_dataset("voc", seed=0, data_dir=tmp_path, val_fraction=0.5).val) == 3


def test_voc_default_crop_size_and_registry(tmp_path):
    write_voc(tmp_path)
    splits = load_dataset("voc", seed=0, data_dir=tmp_path)
    assert splits.input_shape == (3, 512, 512)
    assert splits.info["crop_size"] == 512
    assert isinstance(splits.train, raysearch.training.data.SegmentationDataset)
    assert raysearch.training.data.SegmentationDataset is seg.SegmentationDataset
    assert dataset_task("voc") == dataset_task("segfolder") == "segmentation"
    assert dataset_task("cifar10") == "classification"
    assert dataset_defaults("voc") == {"val_fraction": 0.1, "test_fraction": None}
    assert dataset_defaults("segfolder") == {"val_fraction": 0.1, "test_fraction": 0.2}


def test_eval_pads_with_255_and_batches_stack(tmp_path):
    write_voc(tmp_path)
    splits = load_dataset("voc", seed=0, data_dir=tmp_path, crop_size=S)
    # VAL[0] is 40x30 (w x h): the longest side 40 -> 32, so 32 wide and 24 high; rows 24..31
    # are padding: mask 255, image 0 before normalisation, i.e. -mean / std
    x, y = splits.test[0]
    assert (y[24:] == 255).all()
    assert (y[:24] != 255).any()
    assert (y[:24] == 0).any()
    pad = (-torch.tensor(IMAGENET_MEAN) / torch.tensor(IMAGENET_STD)).view(3, 1, 1)
    torch.testing.assert_close(x[:, 24:, :], pad.expand(3, S - 24, S))
    # VAL[1] is 30x50: 50 -> 32 high, 30 * 32 / 50 = 19.2 -> 19 wide; columns 19.. are padding
    _, y = splits.test[1]
    assert (y[:, 19:] == 255).all()
    assert (y[:, :19] != 255).any()
    # evaluation is deterministic
    torch.testing.assert_close(splits.test[2], splits.test[2])
    xb, yb = next(iter(DataLoader(splits.test, batch_size=3)))
    assert xb.shape == (3, 3, S, S)
    assert yb.shape == (3, S, S)
    assert yb.dtype == torch.int64


def test_training_crop_is_random_but_reproducible(tmp_path):
    write_voc(tmp_path)
    train = load_dataset("voc", seed=0, data_dir=tmp_path, crop_size=S).train
    draws = []
    for seed in range(4):
        torch.manual_seed(seed)
        first = train[0]
        torch.manual_seed(seed)
        second = train[0]
        torch.testing.assert_close(first, second)
        draws.append(first)
    assert any(not torch.equal(draws[0][0], d[0]) for d in draws[1:])


def test_training_transform_keeps_mask_aligned(tmp_path):
    # an image whose red channel draws the object of the mask (lossless PNG): after scale
    # jitter, pad, crop and flip the image pixels still sit on their labels; colour jitter is
    # turned off here so that pixel values can be compared
    mask = np.zeros((30, 40), dtype=np.uint8)
    mask[10:20, 5:25] = 3
    image = np.zeros((30, 40, 3), dtype=np.uint8)
    image[..., 0] = np.where(mask == 3, 200, 0)
    Image.fromarray(image).save(tmp_path / "x.png")
    _write_gray_png(tmp_path / "y.png", mask)
    transform = seg.segmentation_transforms(S, train=True)
    transform.transforms = [
        t for t in transform.transforms if not isinstance(t, v2.ColorJitter)
    ]
    ds = seg.SegmentationDataset(
        [(str(tmp_path / "x.png"), str(tmp_path / "y.png"))], transform, num_classes=5
    )
    mean, std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
    padded = []
    for seed in range(12):
        torch.manual_seed(seed)
        x, y = ds[0]
        assert set(y.unique().tolist()) <= {0, 3, 255}
        # 255 only where the resized image was padded: there the image is exactly 0
        pad = y == 255
        torch.testing.assert_close(x[:, pad], (-mean / std)[:, None].expand(3, int(pad.sum())))
        padded.append(int(pad.sum()))
        # pixels whose 3x3 neighbourhood has one label: the image is bilinear (antialiased)
        # and the mask nearest, so they may disagree by a pixel at the object's edge only
        red = x[0] * std[0] + mean[0]
        inside = -torch.nn.functional.max_pool2d(-(y == 3)[None].float(), 3, 1, 1)[0] > 0
        outside = -torch.nn.functional.max_pool2d(-(y == 0)[None].float(), 3, 1, 1)[0] > 0
        if inside.any() and outside.any():
            assert red[inside].min() > red[outside].max() + 0.2
    # the scale jitter draws: 40 * s < 32 (padding) for s < 0.8, no padding above
    assert min(padded) == 0
    assert max(padded) > 0


def test_voc_data_dir_forms(tmp_path, monkeypatch):
    write_voc(tmp_path)
    calls = []

    class Spy(seg.VOCSegmentation):
        def __init__(self, root, **kwargs):
            calls.append((Path(root), kwargs["image_set"], kwargs["download"]))
            super().__init__(root, **kwargs)

    monkeypatch.setattr(seg, "VOCSegmentation", Spy)
    forms = [tmp_path, tmp_path / "VOCdevkit", tmp_path / "VOCdevkit" / "VOC2012"]
    loaded = [load_dataset("voc", seed=1, data_dir=d, crop_size=S) for d in forms]
    for splits in loaded[1:]:
        for part in ("train", "val", "test"):
            assert getattr(splits, part).samples == getattr(loaded[0], part).samples
    # torchvision's reader resolved the lists, from the root it expects, never downloading
    assert set(calls) == {(tmp_path, "train", False), (tmp_path, "val", False)}
    image, mask = loaded[0].test.samples[0]
    assert image == str(tmp_path / "VOCdevkit/VOC2012/JPEGImages" / f"{VAL[0][0]}.jpg")
    assert mask == str(tmp_path / "VOCdevkit/VOC2012/SegmentationClass" / f"{VAL[0][0]}.png")


def test_voc2012_folder_outside_vocdevkit(tmp_path):
    voc = write_voc(tmp_path, voc_root=tmp_path / "pascal")
    splits = load_dataset("voc", seed=1, data_dir=voc, crop_size=S)
    assert _stems(splits.test) == [s for s, _, _ in VAL]
    assert splits.test.samples[0][1] == str(voc / "SegmentationClass" / f"{VAL[0][0]}.png")
    assert len(splits.train) + len(splits.val) == len(TRAIN)
    _check_items(splits)


def test_voc_train_aug(tmp_path):
    write_voc(tmp_path, aug=True)
    splits = load_dataset("voc", seed=0, data_dir=tmp_path, crop_size=S)
    assert splits.info["train_list"] == "train_aug"
    assert splits.info["train_aug_in_val"] == 1  # VAL[0] is listed in train_aug.txt: left out
    pool = sorted(_stems(splits.train) + _stems(splits.val))
    assert pool == sorted(s for s, _, _ in TRAIN + AUG)
    # 9 images: ceil(0.1 * 9) = 1 for validation
    assert (len(splits.train), len(splits.val), len(splits.test)) == (8, 1, 3)
    for _, mask in splits.train.samples + splits.val.samples:
        assert Path(mask).parent.name == "SegmentationClassAug"
    assert all(Path(m).parent.name == "SegmentationClass" for _, m in splits.test.samples)
    assert "train_aug.txt minus val.txt" in splits.info["val_split"]
    _check_items(splits)
    # without the list the SBD masks are not used
    (tmp_path / "VOCdevkit/VOC2012/ImageSets/Segmentation/train_aug.txt").unlink()
    assert load_dataset("voc", seed=0, data_dir=tmp_path).info["train_list"] == "train"


def test_voc_verify(tmp_path):
    voc = write_voc(tmp_path)
    splits = load_dataset("voc", seed=0, data_dir=tmp_path, crop_size=S, verify=True)
    assert seg.verify_segmentation(splits) == len(TRAIN) + len(VAL)
    # palette index 21 is not a VOC class: verify names the file; without verify, reading does
    bad = voc / "SegmentationClass" / f"{VAL[2][0]}.png"
    mask = _mask_array(VAL[2][1], VAL[2][2])
    mask[0, 0] = 21
    _write_palette_png(bad, mask)
    with pytest.raises(DatasetError, match="21") as err:
        load_dataset("voc", seed=0, data_dir=tmp_path, verify=True)
    assert str(bad) in _one_line(err)
    splits = load_dataset("voc", seed=0, data_dir=tmp_path, crop_size=S)
    with pytest.raises(DatasetError, match="outside the class ids 0..20") as err:
        splits.test[2]
    assert str(bad) in _one_line(err)


# --------------------------------------------------------------------------------------------
# segfolder


def test_segfolder_split_by_seed(tmp_path):
    write_segfolder(tmp_path)
    splits = load_dataset("segfolder", seed=2, data_dir=tmp_path, crop_size=S, verify=True)
    assert splits.task == "segmentation"
    assert splits.ignore_index == 255
    assert splits.num_classes == 5
    assert splits.class_names == CLASSES
    # test ceil(0.2 * 10) = 2, then val ceil(0.125 * 8) = 1 of the rest
    assert (len(splits.train), len(splits.val), len(splits.test)) == (7, 1, 2)
    parts = [set(_stems(getattr(splits, p))) for p in ("train", "val", "test")]
    assert set.union(*parts) == {s for s, *_ in FOLDER}
    assert sum(map(len, parts)) == len(FOLDER)
    assert splits.info["test_fraction"] == 0.2
    assert "seed 2" in splits.info["val_split"]
    classes = {s: c for s, _, _, c in FOLDER}
    for ds in (splits.train, splits.val, splits.test):
        for i in range(len(ds)):
            x, y = ds[i]
            assert x.shape == (3, S, S)
            assert y.shape == (S, S)
            assert y.dtype == torch.int64
            assert set(y.unique().tolist()) <= {0, classes[_stems(ds)[i]], 255}
    again = load_dataset("segfolder", seed=2, data_dir=tmp_path, crop_size=S)
    assert again.test.samples == splits.test.samples


def test_segfolder_with_split_files(tmp_path):
    stems = [s for s, *_ in FOLDER]
    write_segfolder(tmp_path, splits={"train": stems[:6], "val": stems[6:8], "test": stems[8:]})
    splits = load_dataset("segfolder", seed=0, data_dir=tmp_path, crop_size=S)
    assert _stems(splits.train) == stems[:6]
    assert _stems(splits.val) == stems[6:8]
    assert _stems(splits.test) == stems[8:]
    with pytest.raises(DatasetError, match="val_fraction"):
        load_dataset("segfolder", seed=0, data_dir=tmp_path, val_fraction=0.2)
    with pytest.raises(DatasetError, match="test_fraction"):
        load_dataset("segfolder", seed=0, data_dir=tmp_path, test_fraction=0.2)
    # without val.txt validation is carved from train.txt: ceil(0.1 * 6) = 1
    (tmp_path / "splits" / "val.txt").unlink()
    splits = load_dataset("segfolder", seed=0, data_dir=tmp_path, crop_size=S)
    assert (len(splits.train), len(splits.val)) == (5, 1)
    assert sorted(_stems(splits.train) + _stems(splits.val)) == stems[:6]
    assert _stems(splits.test) == stems[8:]


def test_segfolder_mask_values_checked(tmp_path):
    write_segfolder(tmp_path)
    bad = tmp_path / "masks" / "img03.png"
    mask = _mask_array(FOLDER[3][2], FOLDER[3][3])
    mask[2, 2] = 7  # K = 5: class ids 0..4 and 255
    _write_gray_png(bad, mask)
    with pytest.raises(DatasetError, match="values 7 outside the class ids 0..4") as err:
        load_dataset("segfolder", seed=0, data_dir=tmp_path, verify=True)
    assert str(bad) in _one_line(err)
    # without verify: loads, and reading that sample raises naming the file
    splits = load_dataset("segfolder", seed=0, data_dir=tmp_path, crop_size=S)
    ds = next(d for d in (splits.train, splits.val, splits.test) if "img03" in _stems(d))
    with pytest.raises(DatasetError, match="values 7") as err:
        ds[_stems(ds).index("img03")]
    assert str(bad) in _one_line(err)


# --------------------------------------------------------------------------------------------
# errors: one line, naming the path


def test_voc_errors(tmp_path):
    with pytest.raises(DatasetError, match="data-dir"):
        load_dataset("voc", seed=0)
    with pytest.raises(DatasetError, match="is not a folder") as err:
        load_dataset("voc", seed=0, data_dir=tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in _one_line(err)
    with pytest.raises(DatasetError, match="no PASCAL VOC 2012 folder") as err:
        load_dataset("voc", seed=0, data_dir=tmp_path)
    assert "VOCdevkit/VOC2012" in _one_line(err)
    with pytest.raises(DatasetError, match="does not download") as err:
        load_dataset("voc", seed=0, data_dir=tmp_path, download=True)
    assert seg.VOC_URL in _one_line(err)
    assert "JPEGImages" in _one_line(err)
    voc = write_voc(tmp_path)
    with pytest.raises(DatasetError, match="imbalance_ratio"):
        load_dataset("voc", seed=0, data_dir=tmp_path, imbalance_ratio=10.0)
    with pytest.raises(DatasetError, match="test_fraction"):
        load_dataset("voc", seed=0, data_dir=tmp_path, test_fraction=0.2)
    # a listed image, then a listed mask, missing
    image = voc / "JPEGImages" / f"{TRAIN[2][0]}.jpg"
    image.rename(image.with_suffix(".bak"))
    with pytest.raises(DatasetError, match="listed but missing") as err:
        load_dataset("voc", seed=0, data_dir=tmp_path)
    assert str(image) in _one_line(err)
    image.with_suffix(".bak").rename(image)
    mask = voc / "SegmentationClass" / f"{VAL[1][0]}.png"
    mask.unlink()
    with pytest.raises(DatasetError, match="listed but missing") as err:
        load_dataset("voc", seed=0, data_dir=tmp_path)
    assert str(mask) in _one_line(err)
    # a missing split file
    split = voc / "ImageSets" / "Segmentation" / "val.txt"
    split.unlink()
    with pytest.raises(DatasetError, match="split file") as err:
        load_dataset("voc", seed=0, data_dir=tmp_path)
    assert str(split) in _one_line(err)


def test_voc_missing_mask_folder(tmp_path):
    voc = write_voc(tmp_path)
    for path in (voc / "SegmentationClass").iterdir():
        path.unlink()
    (voc / "SegmentationClass").rmdir()
    with pytest.raises(DatasetError, match="is missing") as err:
        load_dataset("voc", seed=0, data_dir=tmp_path)
    assert str(voc / "SegmentationClass") in _one_line(err)


def test_segfolder_errors(tmp_path):
    with pytest.raises(DatasetError, match="nothing to download"):
        load_dataset("segfolder", seed=0, data_dir=tmp_path, download=True)
    with pytest.raises(DatasetError, match="classes.txt") as err:
        load_dataset("segfolder", seed=0, data_dir=tmp_path)
    assert str(tmp_path / "classes.txt") in _one_line(err)
    write_segfolder(tmp_path)
    with pytest.raises(DatasetError, match="imbalance_ratio"):
        load_dataset("segfolder", seed=0, data_dir=tmp_path, imbalance_ratio=2)
    # an image without its mask
    mask = tmp_path / "masks" / "img04.png"
    mask.rename(tmp_path / "img04.png")
    with pytest.raises(DatasetError, match="is missing") as err:
        load_dataset("segfolder", seed=0, data_dir=tmp_path)
    assert str(mask) in _one_line(err)
    (tmp_path / "img04.png").rename(mask)
    # a missing split file, and a listed stem without an image
    (tmp_path / "splits").mkdir()
    (tmp_path / "splits" / "train.txt").write_text("img00\nimg01\nimg99\n")
    with pytest.raises(DatasetError, match="split file") as err:
        load_dataset("segfolder", seed=0, data_dir=tmp_path)
    assert str(tmp_path / "splits" / "test.txt") in _one_line(err)
    (tmp_path / "splits" / "test.txt").write_text("img02\n")
    with pytest.raises(DatasetError, match="img99") as err:
        load_dataset("segfolder", seed=0, data_dir=tmp_path)
    assert str(tmp_path / "images" / "img99") in _one_line(err)
    (tmp_path / "splits" / "test.txt").write_text("img01\n")
    with pytest.raises(DatasetError, match="disjoint"):
        load_dataset("segfolder", seed=0, data_dir=tmp_path)


def test_segfolder_bad_masks_and_classes(tmp_path):
    write_segfolder(tmp_path)
    # an RGB mask, and a mask of another size than its image
    rgb = tmp_path / "masks" / "img00.png"
    Image.new("RGB", FOLDER[0][2]).save(rgb)
    with pytest.raises(DatasetError, match="single-channel") as err:
        load_dataset("segfolder", seed=0, data_dir=tmp_path, verify=True)
    assert str(rgb) in _one_line(err)
    _write_gray_png(rgb, np.zeros((5, 5), dtype=np.uint8))
    with pytest.raises(DatasetError, match="must match") as err:
        load_dataset("segfolder", seed=0, data_dir=tmp_path, verify=True)
    assert str(rgb) in _one_line(err)
    (tmp_path / "classes.txt").write_text("a\n\nb\n")
    with pytest.raises(DatasetError, match="empty line 2"):
        load_dataset("segfolder", seed=0, data_dir=tmp_path)


def test_argument_checks(tmp_path):
    write_voc(tmp_path)
    with pytest.raises(ValueError, match="crop_size"):
        load_dataset("voc", seed=0, data_dir=tmp_path, crop_size=0)
    with pytest.raises(TypeError, match="verify"):
        load_dataset("voc", seed=0, data_dir=tmp_path, verify=1)
    # classification datasets keep their own size and are called exactly as before
    with pytest.raises(ValueError, match="digits.*takes no argument 'crop_size'"):
        load_dataset("digits", seed=0, crop_size=S)
    assert load_dataset("digits", seed=0, verify=True).task == "classification"
    assert load_dataset("digits", seed=0).ignore_index is None
    with pytest.raises(ValueError, match="task"):
        DatasetSplits(None, None, None, 2, (1, 1, 1), "x", task="detection")


def test_package_import_does_not_load_torchvision(monkeypatch):
    # in-process (a subprocess would import torch again, seconds): re-import raysearch.training.data
    # with torchvision unimportable; monkeypatch puts the original modules back afterwards
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "torchvision":
                raise ImportError(f"torchvision blocked in this test ({name})")
            return None

    monkeypatch.setattr(raysearch.training, "data", raysearch.training.data)
    for name in list(sys.modules):
        if name.partition(".")[0] == "torchvision" or name.startswith("raysearch.training.data"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Block(), *sys.meta_path])
    fresh = importlib.import_module("raysearch.training.data")
    assert {"voc", "segfolder"} <= set(fresh.available_datasets())
    assert "torchvision" not in sys.modules
