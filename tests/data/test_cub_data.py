"""CUB-200-2011 loader and its objectness dataset, on a tiny tree written in the real format.

The tree has 3 classes x 12 images (ids 1..36, class c holding ids 12c + 1..12c + 12); the first
10 images of each class are official training images, the last 2 official test images. Nothing
is downloaded.
"""

import shutil
import socket

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as TF

from raysearch.training.data import DatasetError, dataset_defaults, load_dataset
from raysearch.training.data.cub import CUB_URL, CUBImageDataset, cub_transforms, load_cub200
from raysearch.training.data.cub_objectness import CUBObjectnessDataset, cub_objectness_dataset
from raysearch.training.data.images import IMAGENET_MEAN, IMAGENET_STD
from raysearch.training.data.objectness import _sample_seed

CLASSES = ["001.Red_bird", "002.Green_bird", "003.Blue_bird"]
PER_CLASS, TRAIN_PER_CLASS = 12, 10
SIZES = [(300, 260), (260, 300), (320, 240), (256, 256), (400, 300)]  # (W, H), by id cycling
CONSTANT_ID, CONSTANT_RGB = 3, (200, 100, 50)
MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _size(image_id):
    return SIZES[(image_id - 1) % len(SIZES)]


def _box_xywh(image_id):
    """Id 1: the left half (300x260 image); id 2: the whole image; id 5: fractional; else a box."""
    w, h = _size(image_id)
    if image_id == 1:
        return (0.0, 0.0, w / 2, float(h))
    if image_id == 2:
        return (0.0, 0.0, float(w), float(h))
    if image_id == 5:
        return (12.5, 20.0, 100.0, 80.5)
    return (0.2 * w, 0.1 * h, 0.5 * w, 0.6 * h)


def write_cub(root, *, inner=True):
    """The tiny CUB tree under `root` (in ``root/CUB_200_2011/`` when `inner`); returns it."""
    folder = root / "CUB_200_2011" if inner else root
    rng = np.random.default_rng(0)
    lines = {name: [] for name in ("images", "labels", "split", "boxes")}
    for c, name in enumerate(CLASSES):
        (folder / "images" / name).mkdir(parents=True)
        for j in range(PER_CLASS):
            image_id = c * PER_CLASS + j + 1
            w, h = _size(image_id)
            if image_id == CONSTANT_ID:
                pixels = np.empty((h, w, 3), dtype=np.uint8)
                pixels[:] = CONSTANT_RGB
            else:
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            rel = f"{name}/{name.split('.')[1]}_{image_id:04d}.jpg"
            Image.fromarray(pixels).save(folder / "images" / rel, quality=95)
            lines["images"].append(f"{image_id} {rel}")
            lines["labels"].append(f"{image_id} {c + 1}")
            lines["split"].append(f"{image_id} {int(j < TRAIN_PER_CLASS)}")
            lines["boxes"].append(
                f"{image_id} " + " ".join(f"{v:.1f}" for v in _box_xywh(image_id))
            )
    (folder / "images.txt").write_text("\n".join(lines["images"]) + "\n")
    (folder / "image_class_labels.txt").write_text("\n".join(lines["labels"]) + "\n")
    (folder / "train_test_split.txt").write_text("\n".join(lines["split"]) + "\n")
    (folder / "bounding_boxes.txt").write_text("\n".join(lines["boxes"]) + "\n")
    (folder / "classes.txt").write_text(
        "".join(f"{c + 1} {name}\n" for c, name in enumerate(CLASSES))
    )
    return folder


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Root holding CUB_200_2011/ (read-only for the tests that use it)."""
    root = tmp_path_factory.mktemp("cub")
    write_cub(root)
    return root


def _path(folder, image_id):
    line = (folder / "images.txt").read_text().splitlines()[image_id - 1]
    return str(folder / "images" / line.split()[1])


def _pixels(path):
    """uint8 (3, H, W) of a file, as the pipelines decode it."""
    with Image.open(path) as image:
        return TF.pil_to_tensor(image.convert("RGB"))


def _normalise(uint8):
    return (uint8.to(torch.float32) / 255 - MEAN) / STD


# --------------------------------------------------------------------------------------------
# splits


def test_splits_official_test_and_stratified_validation(tree):
    splits = load_cub200(seed=0, data_dir=tree)
    ids = {name: getattr(splits, name).image_ids for name in ("train", "val", "test")}
    official_test = [c * PER_CLASS + j + 1 for c in range(3) for j in range(10, 12)]
    np.testing.assert_array_equal(ids["test"], official_test)
    official_train = sorted(set(range(1, 37)) - set(official_test))
    assert sorted([*ids["train"], *ids["val"]]) == official_train
    # 10% of 30 training images = 3, stratified: one per class
    np.testing.assert_array_equal(np.bincount(splits.val.labels, minlength=3), [1, 1, 1])
    assert (len(splits.train), len(splits.val), len(splits.test)) == (27, 3, 6)
    info = splits.info
    assert (info["train_size"], info["val_size"], info["test_size"]) == (27, 3, 6)
    assert "MbLS selected on test; raysearch carves validation from train" in info["val_split"]
    assert info["val_fraction"] == 0.1
    assert info["num_boxes"] == 36
    assert info["data_dir"] == str(tree / "CUB_200_2011")
    assert all(isinstance(v, (str, int, float)) for v in info.values())
    # deterministic by seed; other seeds carve other images
    again = load_cub200(seed=0, data_dir=tree)
    np.testing.assert_array_equal(again.val.image_ids, ids["val"])
    others = [tuple(load_cub200(seed=s, data_dir=tree).val.image_ids) for s in range(1, 6)]
    assert any(o != tuple(ids["val"]) for o in others)
    # another fraction: 20% of 30 = 6, two per class
    bigger = load_cub200(seed=0, data_dir=tree, val_fraction=0.2)
    np.testing.assert_array_equal(np.bincount(bigger.val.labels, minlength=3), [2, 2, 2])


def test_metadata_labels_and_boxes(tree):
    splits = load_cub200(seed=0, data_dir=tree)
    assert splits.name == "cub200"
    assert splits.num_classes == 3
    assert splits.input_shape == (3, 224, 224)
    assert splits.class_names == CLASSES
    assert splits.task == "classification"
    for ds in (splits.train, splits.val, splits.test):
        assert isinstance(ds, CUBImageDataset)
        assert ds.labels.dtype == np.int64
        # label = class id - 1 = (id - 1) // 12 here
        np.testing.assert_array_equal(ds.labels, (ds.image_ids - 1) // PER_CLASS)
        assert ds.boxes.dtype == np.float32
        assert ds.boxes.shape == (len(ds), 4)
        for row, image_id in enumerate(ds.image_ids):
            x, y, w, h = _box_xywh(int(image_id))
            np.testing.assert_allclose(ds.boxes[row], [x, y, x + w, y + h], atol=0.051)
            assert ds.samples[row][0] == _path(tree / "CUB_200_2011", int(image_id))
    everything = np.concatenate([splits.train.boxes, splits.val.boxes, splits.test.boxes])
    ids = np.concatenate([splits.train.image_ids, splits.val.image_ids, splits.test.image_ids])
    # id 5: x, y, w, h = 12.5, 20.0, 100.0, 80.5 -> xyxy (12.5, 20.0, 112.5, 100.5)
    np.testing.assert_array_equal(everything[ids == 5][0], [12.5, 20.0, 112.5, 100.5])
    # subsets keep boxes and ids aligned with the samples
    sub = splits.train.subset([2, 0])
    np.testing.assert_array_equal(sub.boxes, splits.train.boxes[[2, 0]])
    np.testing.assert_array_equal(sub.image_ids, splits.train.image_ids[[2, 0]])
    assert sub.samples == [splits.train.samples[2], splits.train.samples[0]]


def test_both_data_dir_forms(tree):
    outer = load_cub200(seed=0, data_dir=tree)
    inner = load_cub200(seed=0, data_dir=tree / "CUB_200_2011")
    assert outer.train.samples == inner.train.samples
    assert outer.test.samples == inner.test.samples
    assert inner.info["data_dir"] == outer.info["data_dir"]


def test_folder_with_another_name(tmp_path):
    folder = write_cub(tmp_path / "birds", inner=False)
    splits = load_cub200(seed=0, data_dir=folder)
    assert len(splits.test) == 6


# --------------------------------------------------------------------------------------------
# items and transforms


def test_items_shapes_and_dtypes(tree):
    splits = load_cub200(seed=0, data_dir=tree)
    for ds in (splits.train, splits.val, splits.test):
        x, y = ds[0]
        assert x.dtype == torch.float32
        assert tuple(x.shape) == (3, 224, 224)
        assert isinstance(y, int)
        assert y == ds.labels[0]
    small = load_cub200(seed=0, data_dir=tree, image_size=32)
    assert small.input_shape == (3, 32, 32)
    assert tuple(small.train[0][0].shape) == (3, 32, 32)


@pytest.mark.parametrize(
    ("resize", "size", "described"),
    [("square", [256, 256], "Resize((256, 256))"), ("shorter", [256], "Resize(256) (shorter")],
)
def test_eval_is_a_deterministic_centre_crop(tree, resize, size, described):
    splits = load_cub200(seed=0, data_dir=tree, resize=resize)
    for ds in (splits.val, splits.test):
        path = ds.samples[0][0]
        x = ds[0][0]
        torch.testing.assert_close(ds[0][0], x, rtol=0, atol=0)
        expected = _normalise(TF.center_crop(TF.resize(_pixels(path), size, antialias=True), 224))
        torch.testing.assert_close(x, expected)
    assert f"eval: {described}" in splits.info["transform"]
    assert splits.info["resize"] == resize


def test_normalisation_of_a_constant_image(tree):
    splits = load_cub200(seed=0, data_dir=tree)
    pool = splits.train.with_transform(cub_transforms(train=False))
    if CONSTANT_ID not in pool.image_ids:
        pool = splits.val
    row = int(np.flatnonzero(pool.image_ids == CONSTANT_ID)[0])
    x = pool[row][0]
    expected = (torch.tensor(CONSTANT_RGB).view(3, 1, 1) / 255 - MEAN) / STD
    # JPEG keeps a constant colour within a level or two: 2/255/0.224 < 0.04
    torch.testing.assert_close(x, expected.expand_as(x), rtol=0, atol=0.04)


def test_training_items_are_augmented(tree):
    splits = load_cub200(seed=0, data_dir=tree)
    torch.manual_seed(0)
    draws = [splits.train[0][0] for _ in range(4)]
    assert any(not torch.equal(draws[0], d) for d in draws[1:])
    torch.manual_seed(0)
    torch.testing.assert_close(splits.train[0][0], draws[0], rtol=0, atol=0)


def test_registered(tree):
    assert dataset_defaults("cub200") == {"val_fraction": 0.1, "test_fraction": None}
    splits = load_dataset("cub200", seed=0, data_dir=tree)
    np.testing.assert_array_equal(
        splits.val.image_ids, load_cub200(seed=0, data_dir=tree).val.image_ids
    )


# --------------------------------------------------------------------------------------------
# objectness


def _window(seed, epoch, index, height, width, context_fraction=0.0):
    """(context, top, left, flip) drawn as CUBObjectnessDataset draws them, for a 224 crop."""
    g = torch.Generator().manual_seed(_sample_seed(seed, epoch, index))
    context = torch.rand(1, generator=g).item() < context_fraction
    top = int(torch.randint(0, height - 224 + 1, (1,), generator=g))
    left = int(torch.randint(0, width - 224 + 1, (1,), generator=g))
    return context, top, left, bool(torch.rand(1, generator=g).item() < 0.5)


@pytest.mark.parametrize(
    ("resize", "resized", "covered_cols"),
    # 300x260 image, box = left half x in [0, 150), all rows.
    # square: resized to 256x256, box x2 = 150 * 256 / 300 = 128 -> columns 0..127 covered.
    # shorter: resized to 295x256 (int(256 * 300 / 260) = 295), x2 = 150 * 295 / 300 = 147.5
    # -> columns 0..146 (centre c + 0.5 < 147.5) covered.
    # The box spans every row, so objectness = max(0, covered_cols - left) / 224.
    [("square", (256, 256), 128), ("shorter", (256, 295), 147)],
)
def test_objectness_of_the_left_half_by_hand(tree, resize, resized, covered_cols):
    path = _path(tree / "CUB_200_2011", 1)
    ds = CUBObjectnessDataset([(path, 0)], [[0.0, 0.0, 150.0, 260.0]], seed=7, resize=resize)
    for epoch in range(1, 6):
        _, top, left, flip = _window(7, epoch, 0, *resized)
        result, context = ds.crop(0, epoch)
        assert not context
        assert (result.top, result.left, result.height, result.width) == (top, left, 224, 224)
        assert result.flipped == flip
        # e.g. square, left = 5: (128 - 5) / 224 = 123 / 224
        assert result.objectness == pytest.approx(max(0, covered_cols - left) / 224, abs=1e-12)
        # the image is the training pipeline's crop of this window
        window = TF.resize(_pixels(path), list(resized) if resize == "square" else [256])
        window = window[:, top : top + 224, left : left + 224].to(torch.float32) / 255
        torch.testing.assert_close(result.image, window.flip(-1) if flip else window)
        # the box follows the crop: x in [0, 128 - left) (mirrored when flipped), all rows
        x2 = covered_cols - left if resize == "square" else 147.5 - left
        expected_box = [224 - x2, 0, 224, 224] if flip else [0, 0, x2, 224]
        np.testing.assert_allclose(result.boxes.numpy(), [expected_box], atol=1e-4)
        x, y, o, c = ds.sample(0, epoch)
        torch.testing.assert_close(x, (result.image - MEAN) / STD)
        assert y.dtype == torch.int64
        assert o.dtype == torch.float32
        assert o.item() == pytest.approx(result.objectness)
        assert c.dtype == torch.bool
        assert not c.item()


@pytest.mark.parametrize("resize", ["square", "shorter"])
def test_whole_image_box_has_objectness_one_and_context_zero(tree, resize):
    path = _path(tree / "CUB_200_2011", 2)  # 260x300, box = the whole image
    w, h = _size(2)
    ds = CUBObjectnessDataset([(path, 1)], [[0.0, 0.0, w, h]], seed=3, resize=resize)
    for epoch in range(1, 4):
        assert ds.sample(0, epoch)[2].item() == 1.0
    ctx = CUBObjectnessDataset(
        [(path, 1)], [[0.0, 0.0, w, h]], seed=3, resize=resize, context_fraction=0.999
    )
    x, y, o, c = ctx.sample(0, 1)
    assert c.item()
    assert o.item() == 0.0
    assert y.item() == 1
    # the bird (here the whole image) is painted with the ImageNet mean: about 0 once normalised
    assert x.abs().max().item() < 0.01
    assert len(ctx.crop(0, 1)[0].boxes) == 0


def test_objectness_dataset_from_splits(tree):
    splits = load_cub200(seed=0, data_dir=tree)
    ds = cub_objectness_dataset(splits, seed=1, context_fraction=0.25)
    assert len(ds) == len(splits.train)
    assert ds.samples == splits.train.samples
    np.testing.assert_array_equal(ds.boxes, splits.train.boxes)
    assert ds.labels.dtype == torch.int64
    np.testing.assert_array_equal(ds.labels.numpy(), splits.train.labels)
    assert ds.context_fraction == 0.25
    x, y, o, c = ds.epoch_tensors(2)
    assert tuple(x.shape) == (len(ds), 3, 224, 224)
    assert x.dtype == torch.float32
    assert ((o >= 0) & (o <= 1)).all()
    assert (o[c] == 0).all()
    # context draws are those of ObjectnessDataset: rand() < context_fraction, drawn first
    expected_context = [
        _window(1, 2, i, 256, 256, context_fraction=0.25)[0] for i in range(len(ds))
    ]
    assert c.tolist() == expected_context
    # independent of threads and access order; set_epoch selects the epoch of __getitem__
    ds.num_threads = 1
    x1, y1, o1, c1 = ds.epoch_tensors(2)
    torch.testing.assert_close(x1, x, rtol=0, atol=0)
    torch.testing.assert_close(o1, o, rtol=0, atol=0)
    ds.set_epoch(2)
    last = len(ds) - 1
    torch.testing.assert_close(ds[last][0], x[last], rtol=0, atol=0)
    assert not torch.equal(ds.sample(last, 3)[0], x[last])
    small = load_cub200(seed=0, data_dir=tree, image_size=64, resize="shorter")
    ds_small = cub_objectness_dataset(small, seed=0)
    assert (ds_small.size, ds_small.resize) == (64, "shorter")
    assert tuple(ds_small[0][0].shape) == (3, 64, 64)


def test_objectness_dataset_rejects_other_splits(tree):
    splits = load_cub200(seed=0, data_dir=tree)
    splits.train = splits.train.samples  # not a CUBImageDataset
    with pytest.raises(ValueError, match="CUBImageDataset"):
        cub_objectness_dataset(splits, seed=0)
    with pytest.raises(ValueError, match="context_fraction"):
        CUBObjectnessDataset([("a.jpg", 0)], [[0, 0, 1, 1]], context_fraction=1.0)
    with pytest.raises(ValueError, match="boxes"):
        CUBObjectnessDataset([("a.jpg", 0)], [[2, 0, 1, 1]])
    with pytest.raises(ValueError, match="resize"):
        load_cub200(seed=0, data_dir=tree, resize="crop")


# --------------------------------------------------------------------------------------------
# errors: one line each, naming the path and the layout


def _one_line(err):
    text = str(err.value)
    assert "\n" not in text
    return text


def test_download_is_refused(tmp_path):
    with pytest.raises(DatasetError, match="does not download") as err:
        load_cub200(seed=0, data_dir=tmp_path, download=True)
    text = _one_line(err)
    assert CUB_URL in text
    assert "bounding_boxes.txt" in text


def test_missing_images_txt(tmp_path):
    folder = write_cub(tmp_path)
    (folder / "images.txt").unlink()
    with pytest.raises(DatasetError, match="missing images.txt") as err:
        load_cub200(seed=0, data_dir=tmp_path)
    text = _one_line(err)
    assert str(folder) in text
    assert "image_class_labels.txt" in text  # the layout


def test_mismatched_ids(tmp_path):
    folder = write_cub(tmp_path)
    labels = folder / "image_class_labels.txt"
    lines = labels.read_text().splitlines()
    labels.write_text("\n".join([*lines[:-1], "99 1"]) + "\n")  # id 36 -> 99
    with pytest.raises(DatasetError, match="does not list the image ids") as err:
        load_cub200(seed=0, data_dir=tmp_path)
    text = _one_line(err)
    assert str(labels) in text
    assert "[36]" in text
    assert "[99]" in text


def test_missing_image_file(tmp_path):
    folder = write_cub(tmp_path)
    gone = _path(folder, 14)
    (tmp_path / "CUB_200_2011" / "images" / gone).unlink()
    with pytest.raises(DatasetError, match="is missing") as err:
        load_cub200(seed=0, data_dir=tmp_path)
    text = _one_line(err)
    assert gone in text
    assert "id 14" in text
    assert "1 of 36" in text


def test_other_errors(tmp_path):
    with pytest.raises(DatasetError, match="--data-dir") as err:
        load_cub200(seed=0)
    _one_line(err)
    with pytest.raises(DatasetError, match="holds neither CUB_200_2011/ nor images.txt"):
        load_cub200(seed=0, data_dir=tmp_path)
    with pytest.raises(DatasetError, match="is not a folder"):
        load_cub200(seed=0, data_dir=tmp_path / "nope")
    folder = write_cub(tmp_path)
    with pytest.raises(DatasetError, match="not supported") as err:
        load_cub200(seed=0, data_dir=tmp_path, imbalance_ratio=10.0)
    _one_line(err)
    with pytest.raises(DatasetError, match="own test split"):
        load_cub200(seed=0, data_dir=tmp_path, test_fraction=0.2)
    boxes = folder / "bounding_boxes.txt"
    lines = boxes.read_text().splitlines()
    boxes.write_text("\n".join([*lines[:2], "3 1.0 2.0 oops 4.0", *lines[3:]]) + "\n")
    with pytest.raises(DatasetError, match="line 3 is malformed") as err:
        load_cub200(seed=0, data_dir=tmp_path)
    _one_line(err)
    shutil.rmtree(folder / "images")
    with pytest.raises(DatasetError, match="missing images/"):
        load_cub200(seed=0, data_dir=tmp_path)
