"""ImageTensorDataset / CropFlip / ImageFileDataset, long-tail counts and the split helpers."""

import numpy as np
import pytest
import sklearn.datasets
import torch
from PIL import Image

from raysearch.training.data import (
    CropFlip,
    DatasetError,
    ImageFileDataset,
    ImageTensorDataset,
    load_dataset,
    long_tail_counts,
    long_tail_indices,
    stratified_split_indices,
)
from raysearch.training.data.images import imagenet_transforms
from raysearch.training.data.splits import three_way_split

# --------------------------------------------------------------------------------------------
# ImageTensorDataset.batch: crop, flip, normalisation


def _tiny_image() -> torch.Tensor:
    """1 x 1 x 3 x 3 with distinct non-zero pixels 1..9, so every padded window is unique."""
    return torch.arange(1, 10, dtype=torch.uint8).reshape(1, 1, 3, 3)


class _Pixels:
    """Batches of a dataset with mean 0 and std 1/255, rounded: x is the uint8 window, as float."""

    def __init__(self, images, augment=None):
        self.ds = ImageTensorDataset(
            images,
            torch.zeros(len(images), dtype=torch.int64),
            mean=(0.0,),
            std=(1.0 / 255,),
            augment=augment,
        )

    def batch(self, index, **kwargs):
        x, y = self.ds.batch(index, **kwargs)
        return x.round(), y


def _dataset(images, augment=None):
    return _Pixels(images, augment)


def test_batch_crop_matches_documented_draws():
    # padding 1 -> offsets (dy, dx) in {0, 1, 2}; the padded image is
    #   0 0 0 0 0
    #   0 1 2 3 0
    #   0 4 5 6 0
    #   0 7 8 9 0
    #   0 0 0 0 0
    # offset (0, 0) gives [[0,0,0],[0,1,2],[0,4,5]], (1, 1) the image,
    # (2, 2) [[5,6,0],[8,9,0],[0,0,0]]
    ds = _dataset(_tiny_image(), CropFlip(padding=1, flip=False))
    index = torch.zeros(6, dtype=torch.int64)
    x, y = ds.batch(index, generator=torch.Generator().manual_seed(3))
    offsets = torch.randint(0, 3, (2, 6), generator=torch.Generator().manual_seed(3))
    padded = torch.nn.functional.pad(_tiny_image()[0, 0], (1, 1, 1, 1))
    for b in range(6):
        dy, dx = offsets[:, b].tolist()
        assert torch.equal(x[b, 0], padded[dy : dy + 3, dx : dx + 3].float())
    assert y.tolist() == [0] * 6
    by_hand = {
        (0, 0): [[0, 0, 0], [0, 1, 2], [0, 4, 5]],
        (1, 1): [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
        (2, 2): [[5, 6, 0], [8, 9, 0], [0, 0, 0]],
    }
    for (dy, dx), window in by_hand.items():
        assert torch.equal(
            padded[dy : dy + 3, dx : dx + 3], torch.tensor(window, dtype=torch.uint8)
        )


def test_batch_every_output_is_a_window_and_all_offsets_occur():
    ds = _dataset(_tiny_image(), CropFlip(padding=1, flip=True))
    x, _ = ds.batch(torch.zeros(400, dtype=torch.int64), generator=torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(_tiny_image()[0, 0], (1, 1, 1, 1)).float()
    windows = {
        (dy, dx, f): (
            padded[dy : dy + 3, dx : dx + 3].flip(-1) if f else padded[dy : dy + 3, dx : dx + 3]
        )
        for dy in range(3)
        for dx in range(3)
        for f in (False, True)
    }
    seen = set()
    for out in x[:, 0]:
        match = [k for k, w in windows.items() if torch.equal(out, w)]
        assert len(match) == 1  # windows are unique since pixels 1..9 are distinct and non-zero
        seen.add(match[0])
    assert seen == set(windows)  # 9 offsets x 2 flips, all drawn in 400 samples


def test_flip_only_and_no_draws_without_augment():
    image = _tiny_image()
    ds = _dataset(image, CropFlip(padding=0, flip=True))
    g = torch.Generator().manual_seed(1)
    x, _ = ds.batch(torch.zeros(50, dtype=torch.int64), generator=g)
    # padding 0: no offsets are drawn, only the flips
    flips = torch.rand(50, generator=torch.Generator().manual_seed(1)) < 0.5
    for b in range(50):
        expected = image[0, 0].flip(-1) if flips[b] else image[0, 0]
        assert torch.equal(x[b, 0], expected.float())
    assert 0 < int(flips.sum()) < 50
    # no augmentation: the generator is not touched
    g3 = torch.Generator().manual_seed(5)
    state = g3.get_state()
    _dataset(image).batch(torch.tensor([0]), generator=g3)
    assert torch.equal(g3.get_state(), state)


def test_normalisation_values():
    images = torch.tensor([[[[0, 255]], [[51, 102]]]], dtype=torch.uint8)  # (1, 2, 1, 2)
    ds = ImageTensorDataset(images, torch.tensor([3]), mean=(0.5, 0.2), std=(0.25, 0.1))
    x, y = ds.batch(torch.tensor([0]))
    # channel 0: (0 - 0.5) / 0.25 = -2, (1 - 0.5) / 0.25 = 2; channel 1: 51/255 = 0.2 -> 0,
    # 102/255 = 0.4 -> (0.4 - 0.2) / 0.1 = 2
    torch.testing.assert_close(x, torch.tensor([[[[-2.0, 2.0]], [[0.0, 2.0]]]]))
    assert x.dtype == torch.float32
    assert y.dtype == torch.int64
    assert y.tolist() == [3]


def test_same_generator_same_batch_and_getitem_matches_batch():
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (10, 3, 8, 8), dtype=np.uint8))
    labels = torch.arange(10)
    aug = ImageTensorDataset(
        images, labels, mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25), augment=CropFlip(4, True)
    )
    index = torch.tensor([3, 1, 4, 1, 5, 9])
    a = aug.batch(index, generator=torch.Generator().manual_seed(7))
    b = aug.batch(index, generator=torch.Generator().manual_seed(7))
    c = aug.batch(index, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    plain = ImageTensorDataset(images, labels, mean=aug.mean, std=aug.std)
    xb, yb = plain.batch(index.numpy())  # numpy index accepted
    for row, i in enumerate(index.tolist()):
        x, y = plain[i]
        assert torch.equal(x, xb[row])
        assert y == int(yb[row]) == i
    assert plain[-1][1] == 9
    with pytest.raises(IndexError, match="out of range"):
        plain[10]
    torch.manual_seed(0)
    x1 = aug[2][0]
    torch.manual_seed(0)
    assert torch.equal(x1, aug[2][0])  # __getitem__ augments with the global RNG


def test_dataloader_collates():
    images = torch.zeros(6, 1, 4, 4, dtype=torch.uint8)
    ds = ImageTensorDataset(
        images, torch.arange(6), mean=(0.0,), std=(1.0,), augment=CropFlip(1, True)
    )
    x, y = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert x.shape == (4, 1, 4, 4)
    assert y.tolist() == [0, 1, 2, 3]


def test_to_subset_with_images_images_hwc():
    rng = np.random.default_rng(1)
    images = torch.from_numpy(rng.integers(0, 256, (5, 3, 4, 6), dtype=np.uint8))
    ds = ImageTensorDataset(
        images,
        torch.arange(5),
        mean=(0.1, 0.2, 0.3),
        std=(1.0, 2.0, 3.0),
        augment=CropFlip(2, False),
    )
    sub = ds.subset(np.array([4, 0]))
    assert torch.equal(sub.images, images[[4, 0]])
    assert sub.labels.tolist() == [4, 0]
    assert (sub.mean, sub.std, sub.augment) == (ds.mean, ds.std, ds.augment)
    hwc = ds.images_hwc()
    assert hwc.shape == (5, 4, 6, 3)
    assert hwc.dtype == np.uint8
    np.testing.assert_array_equal(hwc, images.permute(0, 2, 3, 1).numpy())
    corrupted = ds.with_images(255 - hwc)  # numpy (N, H, W, C) is transposed back
    assert torch.equal(corrupted.images, 255 - images)
    assert corrupted.augment is None
    assert torch.equal(corrupted.labels, ds.labels)
    assert torch.equal(ds.with_images(images).images, images)
    moved = ds.to("cpu")
    assert moved.images.dtype == torch.uint8
    assert moved.augment == ds.augment
    with pytest.raises(ValueError, match=r"`images` must be \(5, 3, H, W\)"):
        ds.with_images(images[:2])
    with pytest.raises(TypeError, match="uint8"):
        ds.with_images(hwc.astype(np.float32))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"images": torch.zeros(2, 1, 3, 3)}, TypeError, "uint8"),
        ({"images": torch.zeros(2, 3, 3, dtype=torch.uint8)}, ValueError, r"\(N, C, H, W\)"),
        ({"labels": torch.zeros(3, dtype=torch.int64)}, ValueError, "labels"),
        ({"labels": torch.zeros(2)}, TypeError, "integers"),
        ({"mean": (0.1, 0.2)}, ValueError, "1 entries"),
        ({"std": (0.0,)}, ValueError, "std"),
        ({"augment": "crop"}, TypeError, "CropFlip"),
    ],
)
def test_image_tensor_dataset_rejects(kwargs, error, match):
    args = {
        "images": torch.zeros(2, 1, 3, 3, dtype=torch.uint8),
        "labels": torch.zeros(2, dtype=torch.int64),
        "mean": (0.5,),
        "std": (0.5,),
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ImageTensorDataset(args.pop("images"), args.pop("labels"), **args)


def test_cropflip_rejects():
    with pytest.raises(ValueError, match="padding"):
        CropFlip(padding=-1, flip=True)
    with pytest.raises(TypeError, match="flip"):
        CropFlip(padding=1, flip=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_same_batch_on_cpu_and_cuda():
    rng = np.random.default_rng(2)
    images = torch.from_numpy(rng.integers(0, 256, (20, 3, 32, 32), dtype=np.uint8))
    cpu = ImageTensorDataset(
        images, torch.arange(20), mean=(0.5,) * 3, std=(0.25,) * 3, augment=CropFlip(4, True)
    )
    cuda = cpu.to("cuda")
    index = torch.arange(20).flip(0)
    xc, yc = cpu.batch(index, generator=torch.Generator().manual_seed(11))
    xg, yg = cuda.batch(index.cuda(), generator=torch.Generator().manual_seed(11))
    assert xg.device.type == "cuda"
    assert xg.dtype == torch.float32
    torch.testing.assert_close(xg.cpu(), xc, rtol=0, atol=1e-6)
    assert torch.equal(yg.cpu(), yc)


# --------------------------------------------------------------------------------------------
# ImageFileDataset


def test_image_file_dataset(tmp_path):
    paths = []
    for i, size in enumerate([(40, 30), (20, 50)]):
        path = tmp_path / f"{i}.png"
        Image.new("L", size, color=100 + i).save(path)  # grey-scale is converted to RGB
        paths.append((str(path), i))
    ds = ImageFileDataset(
        paths, imagenet_transforms(16, train=False, mean=(0.0,) * 3, std=(1.0,) * 3)
    )
    assert len(ds) == 2
    assert ds.labels.tolist() == [0, 1]
    assert ds.labels.dtype == np.int64
    x, y = ds[1]
    assert x.shape == (3, 16, 16)
    assert x.dtype == torch.float32
    assert y == 1
    torch.testing.assert_close(x, torch.full((3, 16, 16), 101 / 255))
    train = ImageFileDataset(paths, imagenet_transforms(16, train=True))
    assert train[0][0].shape == (3, 16, 16)
    hwc = ds.images_hwc(8)
    assert hwc.shape == (2, 8, 8, 3)
    assert hwc.dtype == np.uint8
    assert int(hwc[0, 0, 0, 0]) == 100
    assert ds.subset([1]).samples == [paths[1]]
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(DatasetError, match=f"cannot read image {bad}"):
        ImageFileDataset([(str(bad), 0)], ds.transform)[0]


# --------------------------------------------------------------------------------------------
# long tail


def test_long_tail_published_totals():
    # Jung et al. (ICML 2023) App. C: CIFAR-10-LT keeps 20431 of 50000, CIFAR-100-LT 19573
    assert sum(long_tail_counts([5000] * 10, 10)) == 20431
    assert sum(long_tail_counts([500] * 100, 10)) == 19573
    # the usual ratio-100 benchmarks (Cao et al. 2019): 12406 and 10847
    assert sum(long_tail_counts([5000] * 10, 100)) == 12406
    assert sum(long_tail_counts([500] * 100, 100)) == 10847


def test_long_tail_counts_shape():
    counts = long_tail_counts([5000] * 10, 10)
    assert counts[0] == 5000
    assert counts[-1] == 500
    assert all(a >= b for a, b in zip(counts, counts[1:], strict=False))
    assert long_tail_counts([7, 3, 5], 1) == [7, 3, 5]  # ratio 1: unchanged
    assert long_tail_counts([10, 10, 2], 4) == [10, 5, 2]  # capped by what is available
    assert long_tail_counts([9], 10) == [9]
    for bad in (0.5, float("inf"), float("nan"), True, "10"):
        with pytest.raises(ValueError, match="ratio"):
            long_tail_counts([10, 10], bad)
    with pytest.raises(ValueError, match="class_counts"):
        long_tail_counts([10, -1], 2)


def test_long_tail_indices():
    labels = np.repeat(np.arange(4), 30)
    np.random.default_rng(0).shuffle(labels)
    kept = long_tail_indices(labels, 8, seed=0)
    assert np.all(np.diff(kept) > 0)
    assert kept.dtype == np.int64
    assert np.bincount(labels[kept]).tolist() == long_tail_counts([30] * 4, 8) == [30, 15, 7, 3]
    assert np.array_equal(kept, long_tail_indices(labels, 8, seed=0))
    assert not np.array_equal(kept, long_tail_indices(labels, 8, seed=1))
    # the decay uses K from num_classes even when the last class is absent
    no_last = labels[labels < 3]
    assert np.bincount(no_last[long_tail_indices(no_last, 8, seed=0, num_classes=4)]).tolist() == [
        30,
        15,
        7,
    ]
    with pytest.raises(ValueError, match="num_classes"):
        long_tail_indices(labels, 2, seed=0, num_classes=3)


def test_three_way_split_without_tail_is_stratified_split_indices():
    y = sklearn.datasets.load_digits().target
    expected = stratified_split_indices(y, seed=4, val_fraction=0.2, test_fraction=0.2)
    got = three_way_split("digits", y, seed=4, val_fraction=0.2, test_fraction=0.2)
    for a, b in zip(expected, got[:3], strict=True):
        np.testing.assert_array_equal(a, b)


def test_digits_long_tail_and_info():
    full = load_dataset("digits", seed=0)
    assert full.info["train_size"] == 1077
    assert full.info["val_fraction"] == 0.2
    assert "imbalance_ratio" not in full.info
    lt = load_dataset("digits", seed=0, imbalance_ratio=10)
    # test is carved first, exactly as without the tail, and stays balanced
    assert torch.equal(lt.test.tensors[1], full.test.tensors[1])
    counts = [int(c) for c in lt.info["class_counts"].split(",")]
    train_val = np.bincount(
        np.concatenate([lt.train.tensors[1].numpy(), lt.val.tensors[1].numpy()]), minlength=10
    )
    assert counts == train_val.tolist()
    assert counts[0] >= counts[-1] * 9
    assert counts[-1] > 0
    # validation is a stratified 0.25 of the long-tailed pool
    val = np.bincount(lt.val.tensors[1].numpy(), minlength=10)
    np.testing.assert_allclose(val, 0.25 * np.array(counts), atol=1)
    assert lt.info["imbalance_ratio"] == 10.0
    assert "long-tailed" in lt.info["val_split"]
    assert all(isinstance(v, (str, int, float)) for v in lt.info.values())


@pytest.mark.parametrize("ratio", [0.5, float("nan"), "3"])
def test_load_dataset_rejects_bad_ratio(ratio):
    with pytest.raises(ValueError, match="imbalance_ratio"):
        load_dataset("digits", imbalance_ratio=ratio)
