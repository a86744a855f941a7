import numpy as np
import pytest
import sklearn.datasets
import torch

from raysearch.training.data import (
    DatasetSplits,
    available_datasets,
    load_dataset,
    stratified_split_indices,
)

RAW = sklearn.datasets.load_digits()


@pytest.fixture(scope="module")
def splits() -> DatasetSplits:
    return load_dataset("digits", seed=0)


def _raw_rows(ds, mean, std):
    """Undo the standardisation: pixels are integers 0..16, so rounding recovers them exactly."""
    x = ds.tensors[0].double().numpy().reshape(len(ds), 64)
    return np.rint(x * std + mean).astype(np.int64)


def _train_stats():
    train, _, _ = stratified_split_indices(RAW.target, seed=0, val_fraction=0.2, test_fraction=0.2)
    return RAW.data[train].mean(), RAW.data[train].std()


def test_registry():
    assert available_datasets() == [
        "cifar10",
        "cifar100",
        "cub200",
        "digits",
        "fashion_mnist",
        "imagefolder",
        "mnist",
        "newsgroups20",
        "segfolder",
        "svhn",
        "tiny_imagenet",
        "voc",
    ]


def test_unknown_name():
    with pytest.raises(
        ValueError, match="Unknown dataset 'x'; available: cifar10, cifar100, cub200, digits"
    ):
        load_dataset("x")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "must be < 1"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_dataset("digits", **kwargs)


def test_shapes_and_types(splits):
    assert splits.name == "digits"
    assert splits.num_classes == 10
    assert splits.input_shape == (1, 8, 8)
    for ds in (splits.train, splits.val, splits.test):
        x, y = ds.tensors
        assert x.dtype == torch.float32
        assert y.dtype == torch.int64
        assert x.shape[1:] == (1, 8, 8)
        assert y.shape == (x.shape[0],)
        assert int(y.min()) >= 0
        assert int(y.max()) < 10


def test_sizes(splits):
    # test = ceil(0.2 * 1797) = 360; rest 1437; val = ceil(0.25 * 1437) = 360; train = 1077
    assert (len(splits.train), len(splits.val), len(splits.test)) == (1077, 360, 360)
    assert len(splits.train) + len(splits.val) + len(splits.test) == 1797


def test_custom_fractions():
    s = load_dataset("digits", val_fraction=0.1, test_fraction=0.3)
    n = np.array([len(s.train), len(s.val), len(s.test)]) / 1797
    np.testing.assert_allclose(n, [0.6, 0.1, 0.3], atol=0.002)


def test_stratified(splits):
    overall = np.bincount(RAW.target, minlength=10) / len(RAW.target)
    for ds in (splits.train, splits.val, splits.test):
        share = np.bincount(ds.tensors[1].numpy(), minlength=10) / len(ds)
        # stratification rounds each class count to within one sample of its share
        np.testing.assert_allclose(share, overall, atol=1.5 / len(ds))


def test_no_overlap_and_full_cover(splits):
    mean, std = _train_stats()
    assert len({r.tobytes() for r in RAW.data.astype(np.int64)}) == 1797  # rows are unique
    seen = []
    for ds in (splits.train, splits.val, splits.test):
        rows = _raw_rows(ds, mean, std)
        seen.append({r.tobytes() for r in rows})
        assert len(seen[-1]) == len(ds)
    assert not seen[0] & seen[1]
    assert not seen[0] & seen[2]
    assert not seen[1] & seen[2]
    assert seen[0] | seen[1] | seen[2] == {r.tobytes() for r in RAW.data.astype(np.int64)}


def test_labels_match_images(splits):
    mean, std = _train_stats()
    label_of = {r.tobytes(): t for r, t in zip(RAW.data.astype(np.int64), RAW.target, strict=True)}
    for ds in (splits.train, splits.test):
        rows = _raw_rows(ds, mean, std)
        expected = [label_of[r.tobytes()] for r in rows]
        np.testing.assert_array_equal(ds.tensors[1].numpy(), expected)


def test_split_indices_partition():
    train, val, test = stratified_split_indices(
        RAW.target, seed=3, val_fraction=0.2, test_fraction=0.2
    )
    together = np.concatenate([train, val, test])
    np.testing.assert_array_equal(np.sort(together), np.arange(1797))


def test_standardised_with_train_statistics(splits):
    x = splits.train.tensors[0].double()
    assert abs(float(x.mean())) < 1e-6
    assert abs(float(x.std(unbiased=False)) - 1.0) < 1e-6
    # val/test use the train statistics, so they are close to but not exactly standardised
    for ds in (splits.val, splits.test):
        v = ds.tensors[0].double()
        assert abs(float(v.mean())) < 0.1
        assert abs(float(v.mean())) > 0.0


def test_same_seed_same_split():
    a = load_dataset("digits", seed=7)
    b = load_dataset("digits", seed=7)
    for da, db in ((a.train, b.train), (a.val, b.val), (a.test, b.test)):
        assert torch.equal(da.tensors[0], db.tensors[0])
        assert torch.equal(da.tensors[1], db.tensors[1])


def test_different_seed_different_split():
    a = load_dataset("digits", seed=0)
    b = load_dataset("digits", seed=1)
    assert not torch.equal(a.test.tensors[1], b.test.tensors[1])
    ia = stratified_split_indices(RAW.target, seed=0, val_fraction=0.2, test_fraction=0.2)
    ib = stratified_split_indices(RAW.target, seed=1, val_fraction=0.2, test_fraction=0.2)
    assert not np.array_equal(ia[2], ib[2])


def test_data_dir_ignored():
    a = load_dataset("digits", seed=0, data_dir="/nonexistent")
    b = load_dataset("digits", seed=0)
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
