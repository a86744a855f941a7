"""The on-disk image loaders, on small files written in each dataset's real format.

Everything goes through ``load_dataset``, the code path users take. Nothing is downloaded.
"""

import pickle
import re
import socket
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from formats import (  # noqa: I001  (tests/formats.py)
    _py2_dump,
    _write_idx,
    write_cifar10,
    write_cifar100,
    write_idx_dataset,
    write_image_tree,
    write_svhn,
    write_tiny_imagenet,
)

from raysearch.training.data import (
    DatasetError,
    ImageFileDataset,
    ImageTensorDataset,
    cifar,
    dataset_defaults,
    load_dataset,
    long_tail_counts,
    vision,
)
from raysearch.training.data.vision import load_imagefolder

INFO_KEYS = {"train_size", "val_size", "test_size", "val_split", "val_fraction"}


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Nothing in these tests may reach the network: a connection attempt fails at once."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# --------------------------------------------------------------------------------------------
# helpers


def _pixels(ds: ImageTensorDataset) -> np.ndarray:
    """Undo the normalisation of every sample: uint8 (N, C, H, W) (rounding is exact)."""
    x, _ = ds.with_images(ds.images, augment=None).batch(torch.arange(len(ds)))
    mean = torch.tensor(ds.mean).view(1, -1, 1, 1)
    std = torch.tensor(ds.std).view(1, -1, 1, 1)
    return torch.round((x * std + mean) * 255).to(torch.uint8).numpy()


def _check_official(splits, train_x, train_y, test_x, test_y, shape):
    """Test is the official test split in order; train + val partition the training images."""
    assert isinstance(splits.train, ImageTensorDataset)
    for ds in (splits.train, splits.val, splits.test):
        x, y = ds.batch(torch.arange(min(len(ds), 4)))
        assert x.dtype == torch.float32
        assert x.shape[1:] == shape
        assert y.dtype == torch.int64
    assert splits.val.augment is None
    assert splits.test.augment is None
    np.testing.assert_array_equal(_pixels(splits.test), test_x.reshape(-1, *shape))
    np.testing.assert_array_equal(splits.test.labels.numpy(), test_y)
    label_of = {
        row.tobytes(): int(t)
        for row, t in zip(train_x.reshape(len(train_x), -1), train_y, strict=True)
    }
    seen = []
    for ds in (splits.train, splits.val):
        rows = [r.tobytes() for r in _pixels(ds).reshape(len(ds), -1)]
        assert all(r in label_of for r in rows)  # every image is a training image
        assert [label_of[r] for r in rows] == ds.labels.tolist()  # image i comes with its label
        seen.append(set(rows))
    assert not seen[0] & seen[1]
    assert len(seen[0]) + len(seen[1]) == len(train_x)
    assert INFO_KEYS <= set(splits.info)
    assert splits.info["train_size"] == len(splits.train)
    assert splits.info["val_size"] == len(splits.val)
    assert splits.info["test_size"] == len(splits.test)
    assert all(isinstance(v, (str, int, float)) for v in splits.info.values())


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------------------------
# CIFAR


def test_cifar10(tmp_path):
    folder, train_x, train_y, test_x, test_y, names = write_cifar10(tmp_path)
    splits = load_dataset("cifar10", seed=0, data_dir=str(tmp_path))
    assert splits.name == "cifar10"
    assert splits.num_classes == 10
    assert splits.input_shape == (3, 32, 32)
    assert splits.class_names == names
    # 100 training images: a stratified 10% (one per class) is validation
    assert (len(splits.train), len(splits.val), len(splits.test)) == (90, 10, 20)
    assert sorted(splits.val.labels.tolist()) == list(range(10))
    _check_official(splits, train_x, train_y, test_x, test_y, (3, 32, 32))
    assert splits.train.augment.padding == 4
    assert splits.train.augment.flip
    assert splits.train.mean == vision.CIFAR10_MEAN
    assert splits.train.std == vision.CIFAR10_STD
    assert splits.info["val_fraction"] == 0.1
    assert splits.info["val_split"] == "stratified 10% of the official train split, seed 0"
    # same seed, same split; another seed, another validation set
    again = load_dataset("cifar10", seed=0, data_dir=tmp_path)
    assert torch.equal(again.val.images, splits.val.images)
    other = load_dataset("cifar10", seed=1, data_dir=tmp_path)
    assert not torch.equal(other.val.images, splits.val.images)
    # data_dir may be the batches folder itself, under any name
    moved = folder.rename(tmp_path / "my-cifar")
    direct = load_dataset("cifar10", seed=0, data_dir=moved)
    assert torch.equal(direct.val.images, splits.val.images)


def test_cifar10_val_fraction_and_long_tail(tmp_path):
    _, train_x, train_y, *_ = write_cifar10(tmp_path, per_batch=40)  # 20 per class
    splits = load_dataset("cifar10", seed=3, data_dir=tmp_path, val_fraction=0.25)
    assert (len(splits.train), len(splits.val)) == (150, 50)
    lt = load_dataset("cifar10", seed=3, data_dir=tmp_path, imbalance_ratio=4)
    counts = long_tail_counts([20] * 10, 4)
    # floor(20 * 4 ** (-i / 9)): 20, 17.1, 14.7, 12.6, 10.8, 9.26, 7.94, 6.80, 5.83, 5.0
    assert counts == [20, 17, 14, 12, 10, 9, 7, 6, 5, 5]
    assert lt.info["class_counts"] == ",".join(map(str, counts))
    assert lt.info["imbalance_ratio"] == 4.0
    assert "long-tailed (ratio 4)" in lt.info["val_split"]
    pool = np.bincount(
        np.concatenate([lt.train.labels.numpy(), lt.val.labels.numpy()]), minlength=10
    )
    assert pool.tolist() == counts
    assert all(a >= b for a, b in zip(pool, pool[1:], strict=False))
    val = np.bincount(lt.val.labels.numpy(), minlength=10)
    np.testing.assert_allclose(val, 0.1 * np.array(counts), atol=1)  # stratified
    assert len(lt.test) == 20  # test stays balanced and complete


def test_cifar100(tmp_path):
    folder, out, names = write_cifar100(tmp_path)
    splits = load_dataset("cifar100", seed=0, data_dir=folder)
    assert splits.num_classes == 100
    assert splits.class_names == names
    assert (len(splits.train), len(splits.val), len(splits.test)) == (900, 100, 100)
    assert np.bincount(splits.val.labels.numpy()).tolist() == [1] * 100
    _check_official(splits, *out["train"], *out["test"], (3, 32, 32))
    assert splits.train.mean == vision.CIFAR100_MEAN


def test_cifar_cache_reads_once_and_sees_changes(tmp_path):
    folder, *_ = write_cifar10(tmp_path)
    vision.clear_cache()
    first = load_dataset("cifar10", data_dir=tmp_path)
    load_dataset("cifar10", data_dir=tmp_path, seed=5)
    assert cifar._read_cifar.cache_info()[:2] == (1, 1)  # (hits, misses): read once
    _, _, _, new_test_x, *_ = write_cifar10(tmp_path / "new", seed=1)
    for f in (tmp_path / "new" / "cifar-10-batches-py").iterdir():
        f.replace(folder / f.name)  # other sizes/mtimes: the cache key changes
    changed = load_dataset("cifar10", data_dir=tmp_path)
    assert cifar._read_cifar.cache_info()[:2] == (1, 2)
    np.testing.assert_array_equal(_pixels(changed.test), new_test_x.reshape(-1, 3, 32, 32))
    assert not torch.equal(changed.test.images, first.test.images)


# --------------------------------------------------------------------------------------------
# SVHN, MNIST, Fashion-MNIST


def test_svhn(tmp_path):
    out = write_svhn(tmp_path / "svhn")  # found in the svhn/ subfolder
    splits = load_dataset("svhn", seed=0, data_dir=tmp_path)
    assert splits.num_classes == 10
    assert splits.input_shape == (3, 32, 32)
    x, digits = out["test"]
    np.testing.assert_array_equal(_pixels(splits.test), x.transpose(3, 2, 0, 1))
    np.testing.assert_array_equal(splits.test.labels.numpy(), digits)  # label 10 -> 0
    train_x, train_y = out["train"]
    _check_official(
        splits, train_x.transpose(3, 2, 0, 1), train_y, x.transpose(3, 2, 0, 1), digits, (3, 32, 32)
    )
    assert splits.train.augment.padding == 4
    assert not splits.train.augment.flip
    assert (len(splits.train), len(splits.val)) == (90, 10)
    direct = load_dataset("svhn", seed=0, data_dir=tmp_path / "svhn")
    assert torch.equal(direct.val.images, splits.val.images)


@pytest.mark.parametrize(
    ("name", "folder", "augment", "mean"),
    [("mnist", "MNIST", None, (0.1307,)), ("fashion_mnist", "FashionMNIST", (2, True), (0.286,))],
)
def test_mnist_family(tmp_path, name, folder, augment, mean):
    raw = tmp_path / folder / "raw"
    out = write_idx_dataset(raw)
    splits = load_dataset(name, seed=0, data_dir=tmp_path)
    assert splits.num_classes == 10
    assert splits.input_shape == (1, 28, 28)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (90, 10, 20)
    _check_official(splits, *out["train"], *out["t10k"], (1, 28, 28))
    assert splits.train.mean == mean
    got = splits.train.augment
    assert (got if got is None else (got.padding, got.flip)) == augment
    for variant in (raw, raw.parent):  # the raw folder itself, or <dataset>/ holding raw/
        again = load_dataset(name, seed=0, data_dir=variant)
        assert torch.equal(again.val.images, splits.val.images)
    flat = tmp_path / "flat"
    raw.rename(flat)  # a folder holding the four idx files directly
    assert torch.equal(load_dataset(name, seed=0, data_dir=flat).test.images, splits.test.images)


# --------------------------------------------------------------------------------------------
# Tiny-ImageNet and ImageFolder


def test_tiny_imagenet(tmp_path):
    folder, val = write_tiny_imagenet(tmp_path)
    splits = load_dataset("tiny_imagenet", seed=0, data_dir=tmp_path)
    assert splits.num_classes == 3
    assert splits.input_shape == (3, 64, 64)
    # classes in sorted wnid order; names from words.txt
    assert splits.class_names == ["goldfish", "salamander", "bullfrog"]
    assert (len(splits.train), len(splits.val), len(splits.test)) == (27, 3, 6)
    assert sorted(splits.val.labels.tolist()) == [0, 1, 2]
    assert splits.train.augment.padding == 8
    assert splits.train.augment.flip
    # val/ is the test split: the PNG pixels come back exactly, in annotation order
    expected = np.stack([pixels.transpose(2, 0, 1) for pixels, _ in val.values()])
    np.testing.assert_array_equal(_pixels(splits.test), expected)
    order = {"n01": 0, "n02": 1, "n03": 2}
    assert splits.test.labels.tolist() == [order[w] for _, w in val.values()]
    assert splits.info["test_split"] == "the labelled val/ split"
    direct = load_dataset("tiny_imagenet", seed=0, data_dir=folder)
    assert torch.equal(direct.train.images, splits.train.images)


def test_tiny_imagenet_errors(tmp_path):
    folder, _ = write_tiny_imagenet(tmp_path)
    bad = folder / "train" / "n02" / "images" / "n02_3.JPEG"
    bad.write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(DatasetError, match=re.escape(str(bad))) as err:
        load_dataset("tiny_imagenet", data_dir=tmp_path)
    _one_line(err)
    (folder / "val" / "val_annotations.txt").write_text("val_0.png\tn77\t0\t0\t1\t1\n")
    with pytest.raises(DatasetError, match="val_annotations.txt has 1 line"):
        load_dataset("tiny_imagenet", data_dir=tmp_path)
    (folder / "wnids.txt").unlink()
    with pytest.raises(DatasetError, match=r"tiny_imagenet: expected .* missing: wnids.txt"):
        load_dataset("tiny_imagenet", data_dir=folder)


def test_imagefolder_train_val(tmp_path):
    write_image_tree(tmp_path / "train")
    write_image_tree(tmp_path / "val", per_class=2, seed=1)
    splits = load_dataset("imagefolder", seed=0, data_dir=tmp_path)
    assert isinstance(splits.train, ImageFileDataset)
    assert splits.class_names == ["ant", "bee", "cat"]
    assert splits.num_classes == 3
    assert splits.input_shape == (3, 224, 224)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (27, 3, 6)
    assert {Path(p).parent.parent.name for p, _ in splits.test.samples} == {"val"}
    train_files = {p for p, _ in splits.train.samples}
    assert not train_files & {p for p, _ in splits.val.samples}
    x, y = splits.val[0]
    assert x.shape == (3, 224, 224)
    assert x.dtype == torch.float32
    assert isinstance(y, int)
    assert splits.info["test_split"] == "the val/ folder"
    assert "of the train/ folder" in splits.info["val_split"]
    small = load_imagefolder(seed=0, data_dir=tmp_path, image_size=32)
    assert small.input_shape == (3, 32, 32)
    assert small.train[0][0].shape == (3, 32, 32)
    with pytest.raises(DatasetError, match="has its own test split"):
        load_dataset("imagefolder", data_dir=tmp_path, test_fraction=0.2)


def test_imagefolder_flat_split_by_seed(tmp_path):
    write_image_tree(tmp_path, per_class=10)
    splits = load_dataset("imagefolder", seed=0, data_dir=tmp_path)
    assert dataset_defaults("imagefolder") == {"val_fraction": 0.1, "test_fraction": 0.2}
    assert (len(splits.train), len(splits.val), len(splits.test)) == (21, 3, 6)
    assert np.bincount(splits.test.labels).tolist() == [2, 2, 2]
    files = [{p for p, _ in ds.samples} for ds in (splits.train, splits.val, splits.test)]
    assert not (files[0] & files[1])
    assert not (files[0] & files[2])
    assert not (files[1] & files[2])
    assert sum(map(len, files)) == 30
    again = load_dataset("imagefolder", seed=0, data_dir=tmp_path)
    assert again.test.samples == splits.test.samples
    assert (
        load_dataset("imagefolder", seed=1, data_dir=tmp_path).test.samples != splits.test.samples
    )
    assert splits.info["test_fraction"] == 0.2
    lt = load_dataset(
        "imagefolder",
        seed=0,
        data_dir=tmp_path,
        imbalance_ratio=2,
        val_fraction=0.2,
        test_fraction=0.2,
    )
    # 8 images per class left after the test carve: floor(8 * 2 ** (-i / 2)) = 8, 5 (5.66), 4
    assert lt.info["class_counts"] == "8,5,4"
    assert len(lt.test) == 6


# --------------------------------------------------------------------------------------------
# errors: one line, naming the path


def test_data_dir_required():
    for name in ("cifar10", "svhn", "mnist", "tiny_imagenet", "imagefolder"):
        with pytest.raises(DatasetError, match=rf"{name}: `--data-dir` is required") as err:
            load_dataset(name)
        _one_line(err)


def test_cifar_missing_folder(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_dataset("cifar10", data_dir=tmp_path / "nope")
    assert _one_line(err) == (
        f"cifar10: expected the python version of CIFAR-10 under "
        f"{tmp_path}/nope/cifar-10-batches-py/ (data_batch_1..5, test_batch, batches.meta); the "
        f"folder {tmp_path}/nope/cifar-10-batches-py/ does not exist. Extract "
        f"cifar-10-python.tar.gz into {tmp_path}/nope or pass --download"
    )


def test_cifar_missing_files(tmp_path):
    folder, *_ = write_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    (folder / "test_batch").unlink()
    with pytest.raises(
        DatasetError,
        match=re.escape(
            f"under {folder}/ (data_batch_1..5, test_batch, batches.meta); missing: "
            "data_batch_3, test_batch. Extract cifar-10-python.tar.gz"
        ),
    ):
        load_dataset("cifar10", data_dir=tmp_path)


@pytest.mark.parametrize("target", ["data_batch_2", "batches.meta"])
def test_cifar_truncated_pickle(tmp_path, target):
    folder, *_ = write_cifar10(tmp_path)
    path = folder / target
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError, match=re.escape(f"{path} is corrupt")) as err:
        load_dataset("cifar10", data_dir=tmp_path)
    assert "pass --download" in _one_line(err)


def test_cifar_wrong_shape_and_python3_keys(tmp_path):
    folder, *_ = write_cifar10(tmp_path)
    _py2_dump({"data": np.zeros((20, 1024), np.uint8), "labels": [0] * 20}, folder / "data_batch_4")
    with pytest.raises(
        DatasetError,
        match=re.escape(f"{folder / 'data_batch_4'} is corrupt (`data` must be uint8 (N, 3072)"),
    ):
        load_dataset("cifar10", data_dir=tmp_path)
    with open(folder / "data_batch_4", "wb") as f:  # bytes keys: not the original file
        pickle.dump({b"data": np.zeros((20, 3072), np.uint8), b"labels": [0] * 20}, f, protocol=2)
    with pytest.raises(DatasetError, match=re.escape(f"{folder / 'data_batch_4'} is corrupt")):
        load_dataset("cifar10", data_dir=tmp_path)


def test_test_fraction_rejected_for_official_splits(tmp_path):
    with pytest.raises(
        DatasetError,
        match=re.escape(
            "cifar10 has its own test split; `test_fraction` applies to digits and to "
            "imagefolder trees without val/"
        ),
    ):
        load_dataset("cifar10", data_dir=tmp_path, test_fraction=0.2)
    assert dataset_defaults("cifar10") == {"val_fraction": 0.1, "test_fraction": None}
    assert dataset_defaults("digits") == {"val_fraction": 0.2, "test_fraction": 0.2}


def test_svhn_errors(tmp_path):
    with pytest.raises(
        DatasetError,
        match=re.escape(f"svhn: expected the cropped-digits SVHN files under {tmp_path}/"),
    ) as err:
        load_dataset("svhn", data_dir=tmp_path)
    assert "missing: train_32x32.mat, test_32x32.mat" in _one_line(err)
    write_svhn(tmp_path)
    path = tmp_path / "train_32x32.mat"
    scipy.io.savemat(path, {"X": np.zeros((32, 32, 5), np.uint8), "y": np.ones((5, 1))})
    with pytest.raises(
        DatasetError, match=re.escape(f"{path} is corrupt (X must be uint8 (32, 32, 3, N)")
    ):
        load_dataset("svhn", data_dir=tmp_path)
    path.write_bytes(b"MATLAB 5.0 MAT-file garbage")
    with pytest.raises(DatasetError, match=re.escape(f"{path} is corrupt")):
        load_dataset("svhn", data_dir=tmp_path)


def test_idx_errors(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    write_idx_dataset(raw)
    path = raw / "train-images-idx3-ubyte"
    _write_idx(path, np.zeros((100, 28, 28), np.uint8), magic=2052)
    with pytest.raises(
        DatasetError, match=re.escape(f"{path} has a bad idx magic number 2052 (expected 2051")
    ) as err:
        load_dataset("mnist", data_dir=tmp_path)
    _one_line(err)
    _write_idx(path, np.zeros((100, 28, 28), np.uint8))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DatasetError, match=re.escape(f"{path} is corrupt (header says")):
        load_dataset("mnist", data_dir=tmp_path)
    path.unlink()
    with pytest.raises(DatasetError, match=r"mnist: expected .*missing: train-images-idx3-ubyte"):
        load_dataset("mnist", data_dir=tmp_path)
    with pytest.raises(DatasetError, match=re.escape(f"under {tmp_path}/FashionMNIST/raw/")):
        load_dataset("fashion_mnist", data_dir=tmp_path)


def test_imagefolder_errors(tmp_path):
    with pytest.raises(DatasetError, match="imagefolder: there is nothing to download") as err:
        load_dataset("imagefolder", data_dir=tmp_path, download=True)
    assert str(tmp_path) in _one_line(err)
    with pytest.raises(DatasetError, match=re.escape(f"in {tmp_path}/; Couldn't find any class")):
        load_dataset("imagefolder", data_dir=tmp_path)
    with pytest.raises(DatasetError, match=re.escape(f"{tmp_path / 'nope'}/ is not a folder")):
        load_dataset("imagefolder", data_dir=tmp_path / "nope")
    write_image_tree(tmp_path / "train", per_class=3)
    write_image_tree(tmp_path / "val", classes=("ant", "bee", "dog"), per_class=1)
    with pytest.raises(DatasetError, match=r"missing in val/: cat; not in train/: dog"):
        load_dataset("imagefolder", data_dir=tmp_path)
    empty = tmp_path / "flat"
    (empty / "a").mkdir(parents=True)
    with pytest.raises(DatasetError, match=r"Found no valid file for the classes a"):
        load_dataset("imagefolder", data_dir=empty)
    broken = tmp_path / "broken"
    write_image_tree(broken, per_class=10)
    for path in broken.rglob("*.png"):
        path.write_bytes(b"broken")
    splits = load_dataset("imagefolder", data_dir=broken)
    with pytest.raises(DatasetError, match=re.escape(f"cannot read image {broken}/")):
        splits.train[0]


# --------------------------------------------------------------------------------------------
# download: only when asked, through torchvision (no network in tests: it fails)


def test_missing_dataset_is_not_downloaded_unless_asked(tmp_path):
    with pytest.raises(DatasetError, match="pass --download"):
        load_dataset("cifar10", data_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing fetched, nothing written


@pytest.mark.parametrize("name", ["cifar100", "svhn", "fashion_mnist", "tiny_imagenet"])
def test_failed_download_is_a_dataset_error(tmp_path, name):
    with pytest.raises(DatasetError, match=rf"{name}: download into .* failed") as err:
        load_dataset(name, data_dir=tmp_path / "data", download=True)
    _one_line(err)
