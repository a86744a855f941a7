"""Tests of raysearch.training.data.objectness: box/mask-aware crops, digits ink boxes, Pet/VOC.
"""

import numpy as np
import pytest
import sklearn.datasets
import torch
from PIL import Image
from torch.utils.data import TensorDataset
from torchvision.transforms import RandomResizedCrop

from raysearch.training.data import DatasetSplits, load_dataset, stratified_split_indices
from raysearch.training.data.objectness import (
    DIGITS_CROP,
    VOC_CLASSES,
    ObjectnessCrop,
    ObjectnessDataset,
    ink_boxes,
    load_pet_folder,
    load_voc_folder,
    objectness_train_set,
    rasterize_boxes,
)

RAW = sklearn.datasets.load_digits()

# 10x10 toy image with one object: box x in [2, 7), y in [3, 8) (columns 2..6, rows 3..7)
BOX = torch.tensor([[2.0, 3.0, 7.0, 8.0]])


def _toy_image():
    return torch.arange(100, dtype=torch.float32).reshape(1, 10, 10)


def _toy_mask():
    mask = torch.zeros(10, 10, dtype=torch.bool)
    mask[3:8, 2:7] = True
    return mask


class TestRasterize:
    def test_box_pixels(self):
        torch.testing.assert_close(rasterize_boxes(BOX, 10, 10), _toy_mask())

    def test_window_and_union(self):
        # window rows 2..4, cols 1..4; boxes (0,0,2,3) and (3,3,5,5) overlap it in
        # (r, c) = (2, 1) and (3..4, 3..4): 1 + 4 = 5 pixels
        boxes = torch.tensor([[0.0, 0.0, 2.0, 3.0], [3.0, 3.0, 5.0, 5.0]])
        covered = rasterize_boxes(boxes, 3, 4, top=2, left=1)
        expected = torch.tensor([[1, 0, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
        torch.testing.assert_close(covered, expected)

    def test_no_boxes(self):
        assert not rasterize_boxes(torch.zeros(0, 4), 3, 2).any()


class TestObjectnessCrop:
    def test_objectness_of_a_crop_by_hand(self):
        # window rows 1..6, cols 4..8 (top=1, left=4, 6x5 = 30 pixels); the box covers cols 4..6
        # (3) and rows 3..6 (4) of it: objectness = 12 / 30 = 0.4
        crop = ObjectnessCrop(flip=False)
        result = crop.apply(_toy_image(), top=1, left=4, height=6, width=5, flip=False, boxes=BOX)
        assert result.objectness == pytest.approx(0.4, abs=1e-12)
        # box in the output (10x10): x (2-4, 7-4) -> clip (0, 3) -> * 10/5 = (0, 6);
        # y (3-1, 8-1) -> clip (2, 6) -> * 10/6 = (3.333, 10)
        torch.testing.assert_close(result.boxes, torch.tensor([[0.0, 10 / 3, 6.0, 10.0]]))
        assert result.image.shape == (1, 10, 10)

    def test_mask_and_boxes_agree(self):
        crop = ObjectnessCrop(scale=(0.2, 1.0), flip=True)
        image, mask = _toy_image(), _toy_mask()
        for seed in range(20):
            by_box = crop(image, boxes=BOX, generator=torch.Generator().manual_seed(seed))
            by_mask = crop(image, mask=mask, generator=torch.Generator().manual_seed(seed))
            assert by_box.objectness == pytest.approx(by_mask.objectness, abs=1e-12)
            torch.testing.assert_close(by_box.image, by_mask.image)
            # the nearest-exact resized mask is the transformed box rasterised on the output
            # (before the flip: a pixel centre on a box edge is inside on the left edge only)
            window = {
                "top": by_box.top,
                "left": by_box.left,
                "height": by_box.height,
                "width": by_box.width,
            }
            unflipped_box = crop.apply(image, **window, flip=False, boxes=BOX)
            unflipped_mask = crop.apply(image, **window, flip=False, mask=mask).mask
            torch.testing.assert_close(unflipped_mask, rasterize_boxes(unflipped_box.boxes, 10, 10))
            flipped = unflipped_mask.flip(-1) if by_mask.flipped else unflipped_mask
            torch.testing.assert_close(by_mask.mask, flipped)
            # objectness is the object share of the window
            window = mask[
                by_box.top : by_box.top + by_box.height, by_box.left : by_box.left + by_box.width
            ]
            assert by_box.objectness == pytest.approx(window.double().mean().item())

    def test_flip_moves_the_box(self):
        # full window, flipped: x -> W - x, so (1, 2, 4, 6) -> (10 - 4, 2, 10 - 1, 6) = (6, 2, 9, 6)
        image = _toy_image()
        crop = ObjectnessCrop()
        box = torch.tensor([[1.0, 2.0, 4.0, 6.0]])
        result = crop.apply(image, top=0, left=0, height=10, width=10, flip=True, boxes=box)
        torch.testing.assert_close(result.boxes, torch.tensor([[6.0, 2.0, 9.0, 6.0]]))
        torch.testing.assert_close(result.image, image.flip(-1))
        assert result.objectness == pytest.approx(12 / 100)  # 3 x 4 pixels
        mask = rasterize_boxes(box, 10, 10)
        flipped = crop.apply(image, top=0, left=0, height=10, width=10, flip=True, mask=mask)
        torch.testing.assert_close(flipped.mask, mask.flip(-1))

    def test_box_outside_the_crop_is_dropped(self):
        result = ObjectnessCrop().apply(
            _toy_image(), top=0, left=0, height=3, width=3, flip=False, boxes=BOX
        )
        assert result.objectness == 0.0
        assert result.boxes.shape == (0, 4)

    def test_full_window_objectness_is_box_area(self):
        crop = ObjectnessCrop(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=False)
        result = crop(_toy_image(), boxes=BOX, generator=torch.Generator().manual_seed(0))
        assert (result.top, result.left, result.height, result.width) == (0, 0, 10, 10)
        assert result.objectness == pytest.approx(25 / 100)
        torch.testing.assert_close(result.image, _toy_image())

    @pytest.mark.parametrize("seed", [0, 1, 7, 123])
    def test_params_match_torchvision(self, seed):
        # same draws as RandomResizedCrop.get_params on the global generator with that seed
        scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
        image = torch.zeros(3, 32, 48)
        torch.manual_seed(seed)
        expected = RandomResizedCrop.get_params(image, list(scale), list(ratio))
        ours = ObjectnessCrop(scale, ratio).get_params(32, 48, torch.Generator().manual_seed(seed))
        assert ours == tuple(expected)

    def test_seeded(self):
        crop = ObjectnessCrop(scale=(0.1, 1.0))
        first = crop(_toy_image(), boxes=BOX, generator=torch.Generator().manual_seed(5))
        again = crop(_toy_image(), boxes=BOX, generator=torch.Generator().manual_seed(5))
        assert first.objectness == again.objectness
        torch.testing.assert_close(first.image, again.image)

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"scale": (0.0, 1.0)}, "scale"),
            ({"scale": (0.9, 0.5)}, "scale"),
            ({"scale": (0.5, 1.5)}, "scale"),
            ({"ratio": (2.0, 1.0)}, "ratio"),
            ({"ratio": (0.0, 1.0)}, "ratio"),
            ({"interpolation": "cubic"}, "interpolation"),
        ],
    )
    def test_bad_arguments(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            ObjectnessCrop(**kwargs)

    def test_bad_annotations(self):
        crop, image = ObjectnessCrop(), _toy_image()
        window = {"top": 0, "left": 0, "height": 5, "width": 5, "flip": False}
        with pytest.raises(ValueError, match="exactly one"):
            crop.apply(image, **window)
        with pytest.raises(ValueError, match="exactly one"):
            crop.apply(image, **window, boxes=BOX, mask=_toy_mask())
        with pytest.raises(ValueError, match="x1 <= x2"):
            crop.apply(image, **window, boxes=torch.tensor([[5.0, 0.0, 2.0, 3.0]]))
        with pytest.raises(ValueError, match=r"\(10, 10\)"):
            crop.apply(image, **window, mask=torch.zeros(4, 4, dtype=torch.bool))
        with pytest.raises(ValueError, match="leaves"):
            crop.apply(image, top=6, left=0, height=5, width=5, flip=False, boxes=BOX)


class TestDigits:
    def test_ink_box_of_known_images(self):
        # RAW.images[0] (a 0): ink in columns 1..6 and rows 0..7 -> (1, 0, 7, 8)
        #   row 2 = [0 3 15 2 0 11 8 0]: first ink column 1, last 6; rows 0 and 7 have ink
        # RAW.images[1] (a 1): columns 1..5 (row 3 = [0 7 15 16 16 2 0 0]) -> (1, 0, 6, 8)
        boxes = ink_boxes(torch.from_numpy(RAW.images[:2]))
        torch.testing.assert_close(boxes, torch.tensor([[1.0, 0, 7, 8], [1.0, 0, 6, 8]]))

    def test_standardised_images_give_the_same_boxes(self):
        raw = torch.from_numpy(RAW.images[:50])
        standardised = ((raw - 4.9) / 6.0).float().unsqueeze(1)
        torch.testing.assert_close(ink_boxes(standardised), ink_boxes(raw))

    def test_blank_image_and_background(self):
        images = torch.zeros(2, 4, 4)
        images[1, 1, 2] = 3.0
        torch.testing.assert_close(
            ink_boxes(images), torch.tensor([[0.0, 0, 0, 0], [2.0, 1, 3, 2]])
        )
        # with an explicit background of 3, everything else is ink in image 1
        torch.testing.assert_close(
            ink_boxes(images, background=3.0)[1], torch.tensor([0.0, 0, 4, 4])
        )

    def test_train_set(self):
        splits = load_dataset("digits", seed=0)
        train = objectness_train_set(splits, seed=0)
        assert len(train) == len(splits.train)
        assert train.transform.flip is False
        assert train.transform.scale == DIGITS_CROP["scale"]
        # the ink boxes of the standardised split are those of the raw 8x8 images
        index, _, _ = stratified_split_indices(
            RAW.target, seed=0, val_fraction=0.2, test_fraction=0.2
        )
        raw_boxes = ink_boxes(torch.from_numpy(RAW.images[index]))
        torch.testing.assert_close(torch.cat(train.boxes), raw_boxes)
        x, y, objectness, context = train.epoch_tensors(1)
        assert x.shape == (len(train), 1, 8, 8)
        torch.testing.assert_close(y, splits.train.tensors[1])
        assert objectness.dtype == torch.float32
        assert bool(((objectness >= 0) & (objectness <= 1)).all())
        assert not context.any()
        # crops of scale >= 0.5 of the ink box's image: objectness is rarely 0
        assert 0.5 < objectness.mean().item() < 1.0

    def test_other_datasets_have_no_annotations(self):
        toy = TensorDataset(torch.zeros(4, 1, 4, 4), torch.zeros(4, dtype=torch.int64))
        splits = DatasetSplits(toy, toy, toy, 2, (1, 4, 4), "toy")
        with pytest.raises(ValueError, match="no object annotations"):
            objectness_train_set(splits, seed=0)


class TestObjectnessDataset:
    def _dataset(self, **kwargs):
        images = torch.from_numpy(RAW.images[:20]).float().unsqueeze(1)
        labels = torch.from_numpy(RAW.target[:20])
        kwargs.setdefault("transform", ObjectnessCrop(**DIGITS_CROP))
        return ObjectnessDataset(images, labels, boxes=ink_boxes(images).unsqueeze(1), **kwargs)

    def test_fresh_crops_each_epoch_and_reproducible(self):
        ds = self._dataset(seed=3)
        x1, _, o1, _ = ds.epoch_tensors(1)
        x1_again, _, o1_again, _ = ds.epoch_tensors(1)
        x2, _, o2, _ = ds.epoch_tensors(2)
        torch.testing.assert_close(x1, x1_again)
        torch.testing.assert_close(o1, o1_again)
        assert not torch.equal(x1, x2)
        assert not torch.equal(o1, o2)
        # items equal the stacked epoch, whatever the order of access
        ds.set_epoch(2)
        for i in (7, 0, 19):
            x, y, o, c = ds[i]
            torch.testing.assert_close(x, x2[i])
            assert o.item() == o2[i].item()
            assert y.item() == RAW.target[i]
            assert c.dtype == torch.bool
        assert not torch.equal(self._dataset(seed=4).epoch_tensors(1)[0], x1)

    def test_whole_image_objectness_is_ink_share(self):
        ds = self._dataset(transform=ObjectnessCrop(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=False))
        _, _, objectness, _ = ds.epoch_tensors(1)
        # image 0: ink box 6 x 8 of 8 x 8 -> 0.75; image 1: 5 x 8 -> 0.625
        assert objectness[:2].tolist() == [0.75, 0.625]

    def test_context_samples(self):
        whole = ObjectnessCrop(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=False)
        ds = self._dataset(transform=whole, context_fraction=0.5, fill=-1.0)
        x, _, objectness, context = ds.epoch_tensors(1)
        assert 0 < int(context.sum()) < len(ds)
        assert bool((objectness[context] == 0).all())
        assert bool((objectness[~context] > 0).all())
        # a context image is the original with its ink box painted with the fill value
        i = int(torch.nonzero(context)[0])
        expected = ds.images[i].clone()
        x1, y1, x2, y2 = (int(v) for v in ds.boxes[i][0])
        expected[:, y1:y2, x1:x2] = -1.0
        torch.testing.assert_close(x[i], expected)
        # the same seed without context gives the same crops on the other samples
        plain = self._dataset(transform=whole).epoch_tensors(1)[0]
        torch.testing.assert_close(x[~context], plain[~context])

    def test_masks(self):
        images = torch.rand(3, 2, 10, 10)
        masks = torch.stack([_toy_mask()] * 3)
        crop = ObjectnessCrop(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=False)
        ds = ObjectnessDataset(images, torch.tensor([0, 1, 0]), masks=masks, transform=crop)
        assert ds.epoch_tensors(1)[2].tolist() == [0.25, 0.25, 0.25]

    def test_bad_arguments(self):
        images, labels = torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.int64)
        boxes = torch.zeros(2, 1, 4)
        with pytest.raises(ValueError, match="exactly one"):
            ObjectnessDataset(images, labels)
        with pytest.raises(ValueError, match="labels"):
            ObjectnessDataset(images, labels[:1], boxes=boxes)
        with pytest.raises(ValueError, match="boxes"):
            ObjectnessDataset(images, labels, boxes=boxes[:1])
        with pytest.raises(ValueError, match="masks"):
            ObjectnessDataset(images, labels, masks=torch.zeros(2, 4, 4))
        with pytest.raises(ValueError, match="context_fraction"):
            ObjectnessDataset(images, labels, boxes=boxes, context_fraction=1.0)
        with pytest.raises(ValueError, match="seed"):
            ObjectnessDataset(images, labels, boxes=boxes, seed=-1)


def _write_pet(root, files):
    """files: {stem: (rgb uint8 (H, W, 3), trimap uint8 (H, W))}, as in Oxford-IIIT Pet."""
    (root / "images").mkdir(parents=True)
    (root / "annotations" / "trimaps").mkdir(parents=True)
    for stem, (rgb, trimap) in files.items():
        Image.fromarray(rgb).save(root / "images" / f"{stem}.jpg", quality=95)
        Image.fromarray(trimap).save(root / "annotations" / "trimaps" / f"{stem}.png")


def _trimap(height, width, fg_rows, fg_cols):
    trimap = np.full((height, width), 2, dtype=np.uint8)  # 2 = background
    trimap[fg_rows, fg_cols] = 1  # 1 = foreground
    return trimap


class TestPetFolder:
    def test_load(self, tmp_path):
        rng = np.random.default_rng(0)
        t0 = _trimap(6, 8, slice(1, 5), slice(2, 6))
        t0[0, 2:6] = 3  # boundary band above the pet: counted as object
        files = {
            "Bengal_3": (rng.integers(0, 255, (6, 8, 3), dtype=np.uint8), t0),
            "Abyssinian_1": (
                np.full((5, 7, 3), 200, np.uint8),
                _trimap(5, 7, slice(0, 5), slice(0, 7)),
            ),
            "american_bulldog_12": (
                np.zeros((4, 4, 3), np.uint8),
                _trimap(4, 4, slice(0, 1), slice(0, 1)),
            ),
        }
        _write_pet(tmp_path, files)
        (tmp_path / "images" / "notes.mat").write_bytes(b"not an image")  # ignored
        data = load_pet_folder(tmp_path)
        # breeds sorted case-insensitively: Abyssinian, american_bulldog, Bengal
        assert data.classes == ["Abyssinian", "american_bulldog", "Bengal"]
        assert data.names == ["Abyssinian_1", "Bengal_3", "american_bulldog_12"]
        assert data.labels.tolist() == [0, 2, 1]
        assert data.boxes is None
        assert [tuple(image.shape) for image in data.images] == [(3, 5, 7), (3, 6, 8), (3, 4, 4)]
        assert data.images[0].dtype == torch.float32
        assert abs(data.images[0].mean().item() - 200 / 255) < 0.02  # JPEG is lossy
        # Bengal_3: foreground rows 1..4 x cols 2..5 (16) + boundary row 0 cols 2..5 (4) = 20
        mask = data.masks[1]
        assert mask.dtype == torch.bool
        assert int(mask.sum()) == 20
        assert bool(mask[0:5, 2:6].all())
        assert int(data.masks[2].sum()) == 1

    def test_resize_and_dataset(self, tmp_path):
        _write_pet(
            tmp_path,
            {
                "beagle_1": (
                    np.zeros((6, 8, 3), np.uint8),
                    _trimap(6, 8, slice(0, 3), slice(0, 8)),
                ),
                "boxer_2": (np.zeros((3, 4, 3), np.uint8), _trimap(3, 4, slice(0, 3), slice(0, 2))),
            },
        )
        data = load_pet_folder(tmp_path, size=(6, 6))
        assert all(tuple(image.shape) == (3, 6, 6) for image in data.images)
        # top half of beagle_1 and left half of boxer_2 are object
        assert [m.double().mean().item() for m in data.masks] == [0.5, 0.5]
        whole = ObjectnessCrop(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=False)
        ds = data.to_dataset(transform=whole)
        assert ds.epoch_tensors(1)[2].tolist() == [0.5, 0.5]
        with pytest.raises(ValueError, match="size"):
            load_pet_folder(tmp_path).to_dataset()

    def test_errors(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="images"):
            load_pet_folder(tmp_path)
        _write_pet(
            tmp_path, {"pug_1": (np.zeros((4, 4, 3), np.uint8), np.full((4, 4), 7, np.uint8))}
        )
        with pytest.raises(ValueError, match="1, 2 or 3"):
            load_pet_folder(tmp_path)
        (tmp_path / "annotations" / "trimaps" / "pug_1.png").unlink()
        with pytest.raises(FileNotFoundError, match="no trimap for pug_1.jpg"):
            load_pet_folder(tmp_path)


VOC_XML = """<annotation>
  <folder>VOC2012</folder>
  <filename>{filename}</filename>
  <size><width>{width}</width><height>{height}</height><depth>3</depth></size>
  {objects}
</annotation>
"""

VOC_OBJECT = """<object>
    <name>{name}</name><pose>Unspecified</pose><truncated>0</truncated><difficult>0</difficult>
    <bndbox><xmin>{xmin}</xmin><ymin>{ymin}</ymin><xmax>{xmax}</xmax><ymax>{ymax}</ymax></bndbox>
  </object>"""


def _write_voc(root, stem, size, objects):
    """objects: [(name, xmin, ymin, xmax, ymax)] with VOC's 1-based inclusive coordinates."""
    (root / "Annotations").mkdir(parents=True, exist_ok=True)
    (root / "JPEGImages").mkdir(parents=True, exist_ok=True)
    width, height = size
    Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(
        root / "JPEGImages" / f"{stem}.jpg"
    )
    body = "\n  ".join(
        VOC_OBJECT.format(name=n, xmin=a, ymin=b, xmax=c, ymax=d) for n, a, b, c, d in objects
    )
    xml = VOC_XML.format(filename=f"{stem}.jpg", width=width, height=height, objects=body)
    (root / "Annotations" / f"{stem}.xml").write_text(xml)


class TestVocFolder:
    def test_load(self, tmp_path):
        # image A: a small dog (3x2 px) and a large person (4x5 px) -> label person, its box only
        _write_voc(tmp_path, "2008_000001", (10, 8), [("dog", 1, 1, 3, 2), ("person", 5, 2, 8, 6)])
        # image B: two cats (areas 4 and 9) and a bird (area 6) -> label cat, both cat boxes
        _write_voc(
            tmp_path,
            "2008_000002",
            (6, 6),
            [("cat", 1, 1, 2, 2), ("bird", 1, 4, 3, 5), ("cat", 4, 4, 6, 6)],
        )
        data = load_voc_folder(tmp_path)
        assert data.classes == list(VOC_CLASSES)
        assert data.names == ["2008_000001", "2008_000002"]
        assert data.labels.tolist() == [VOC_CLASSES.index("person"), VOC_CLASSES.index("cat")]
        assert data.masks is None
        # 1-based inclusive (5, 2, 8, 6) -> half-open 0-based (4, 1, 8, 6): 4 x 5 pixels
        torch.testing.assert_close(data.boxes[0], torch.tensor([[4.0, 1.0, 8.0, 6.0]]))
        torch.testing.assert_close(
            data.boxes[1], torch.tensor([[0.0, 0.0, 2.0, 2.0], [3.0, 3.0, 6.0, 6.0]])
        )
        assert tuple(data.images[0].shape) == (3, 8, 10)
        # objectness of the whole of image A: 20 / 80
        whole = ObjectnessCrop(scale=(1.0, 1.0), ratio=(0.5, 2.0), flip=False)
        result = whole(data.images[0], boxes=data.boxes[0], generator=torch.Generator())
        assert result.objectness == pytest.approx(20 / 80)

    def test_resize_scales_boxes(self, tmp_path):
        _write_voc(tmp_path, "a", (10, 8), [("person", 5, 2, 8, 6)])
        data = load_voc_folder(tmp_path, size=(4, 5))
        # x * 5/10, y * 4/8: (4, 1, 8, 6) -> (2, 0.5, 4, 3)
        torch.testing.assert_close(data.boxes[0], torch.tensor([[2.0, 0.5, 4.0, 3.0]]))
        assert tuple(data.images[0].shape) == (3, 4, 5)

    def test_errors(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="Annotations"):
            load_voc_folder(tmp_path)
        _write_voc(tmp_path, "a", (4, 4), [("unicorn", 1, 1, 2, 2)])
        with pytest.raises(ValueError, match="unknown class 'unicorn'"):
            load_voc_folder(tmp_path)
        _write_voc(tmp_path, "a", (4, 4), [])
        with pytest.raises(ValueError, match="no <object>"):
            load_voc_folder(tmp_path)
        _write_voc(tmp_path, "a", (4, 4), [("cat", 3, 1, 2, 2)])
        with pytest.raises(ValueError, match="xmax < xmin"):
            load_voc_folder(tmp_path)
        _write_voc(tmp_path, "a", (4, 4), [("cat", 1, 1, 2, 2)])
        (tmp_path / "JPEGImages" / "a.jpg").unlink()
        with pytest.raises(FileNotFoundError, match="image not found"):
            load_voc_folder(tmp_path)
