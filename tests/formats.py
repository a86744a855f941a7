"""Writers of the real on-disk formats of the image datasets, for tests.

CIFAR python pickle batches (as Python 2 wrote them), SVHN ``.mat``, MNIST idx files,
Tiny-ImageNet and ImageFolder trees of real image files. Imported by the loader tests and the
end-to-end sweep test (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path

import numpy as np
import scipy.io
from PIL import Image


class _Py2Pickler(pickle._Pickler):
    """Pickles str and bytes as Python 2 ``str`` (SHORT_BINSTRING/BINSTRING opcodes).

    The CIFAR python files were written by Python 2's cPickle: ``data_batch_1`` starts with
    ``\\x80\\x02}q\\x01(U\\x0bbatch_label``, and ``pickle.load(f, encoding="latin1")`` (what
    torchvision does) returns str keys ``"data"``, ``"labels"``. A Python 3 ``pickle.dump`` of
    ``{b"data": ...}`` would unpickle with bytes keys, which the real files never have.
    """

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj):
        data = obj.encode("latin1") if isinstance(obj, str) else bytes(obj)
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[str] = _save_py2_str
    dispatch[bytes] = _save_py2_str


def _py2_dump(obj, path: Path) -> None:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    path.write_bytes(buf.getvalue())


def _images(rng, n, shape):
    return rng.integers(0, 256, (n, *shape), dtype=np.uint8)


def _balanced_labels(rng, n, k):
    labels = np.arange(n) % k
    rng.shuffle(labels)
    return labels


def write_cifar10(root: Path, per_batch=20, n_test=20, seed=0):
    """5 train batches of `per_batch` images + a test batch, 10 classes; returns the arrays."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    train_x = _images(rng, 5 * per_batch, (3072,))
    train_y = _balanced_labels(rng, 5 * per_batch, 10)
    for b in range(5):
        part = slice(b * per_batch, (b + 1) * per_batch)
        _py2_dump(
            {
                "batch_label": f"training batch {b + 1} of 5",
                "labels": train_y[part].tolist(),
                "data": train_x[part],
                "filenames": [f"{i}.png" for i in range(per_batch)],
            },
            folder / f"data_batch_{b + 1}",
        )
    test_x, test_y = _images(rng, n_test, (3072,)), _balanced_labels(rng, n_test, 10)
    _py2_dump(
        {
            "batch_label": "testing batch 1 of 1",
            "labels": test_y.tolist(),
            "data": test_x,
            "filenames": [f"{i}.png" for i in range(n_test)],
        },
        folder / "test_batch",
    )
    names = [
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    ]
    _py2_dump(
        {"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072},
        folder / "batches.meta",
    )
    return folder, train_x, train_y, test_x, test_y, names


def write_cifar100(root: Path, per_class=10, seed=0):
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = {}
    for split, n in (("train", 100 * per_class), ("test", 100)):
        x, y = _images(rng, n, (3072,)), _balanced_labels(rng, n, 100)
        _py2_dump(
            {
                "filenames": [f"{i}.png" for i in range(n)],
                "batch_label": split,
                "fine_labels": y.tolist(),
                "coarse_labels": (y // 5).tolist(),
                "data": x,
            },
            folder / split,
        )
        out[split] = (x, y)
    names = [f"class{i:02d}" for i in range(100)]
    _py2_dump(
        {"fine_label_names": names, "coarse_label_names": [f"c{i}" for i in range(20)]},
        folder / "meta",
    )
    return folder, out, names


def write_svhn(folder: Path, n_train=100, n_test=20, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)  # MATLAB (H, W, C, N)
        digits = _balanced_labels(rng, n, 10)
        y = np.where(digits == 0, 10, digits).astype(np.uint8).reshape(n, 1)  # SVHN: 10 for 0
        scipy.io.savemat(folder / f"{split}_32x32.mat", {"X": x, "y": y})
        out[split] = (x, digits)
    return out


def _write_idx(path: Path, array: np.ndarray, magic: int | None = None) -> None:
    magic = (0x0800 + array.ndim) if magic is None else magic  # 2051 images, 2049 labels
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_idx_dataset(raw: Path, n_train=100, n_test=20, seed=0):
    rng = np.random.default_rng(seed)
    raw.mkdir(parents=True, exist_ok=True)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x, y = _images(rng, n, (28, 28)), _balanced_labels(rng, n, 10)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", x)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", y)
        out[prefix] = (x, y)
    return out


def write_tiny_imagenet(
    root: Path, wnids=("n03", "n01", "n02"), per_class=10, val_per_class=2, seed=0
):
    """tiny-imagenet-200/ with JPEG train images and PNG val images (exact pixels)."""
    rng = np.random.default_rng(seed)
    folder = root / "tiny-imagenet-200"
    (folder / "val" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (folder / "words.txt").write_text(
        "n01\tgoldfish, Carassius auratus\nn02\tsalamander\nn03\tbullfrog, Rana catesbeiana\n"
        "n99\tunused\n"
    )
    for wnid in wnids:
        images = folder / "train" / wnid / "images"
        images.mkdir(parents=True)
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        for i in range(per_class):
            mode = "L" if i == 0 else "RGB"  # some real Tiny-ImageNet images are grey-scale
            pixels = _images(rng, 1, (64, 64) if mode == "L" else (64, 64, 3))[0]
            Image.fromarray(pixels, mode).save(images / f"{wnid}_{i}.JPEG", quality=90)
    val = {}
    lines = []
    for number, wnid in enumerate(wnids * val_per_class):
        name = f"val_{number}.png"
        pixels = _images(rng, 1, (64, 64, 3))[0]
        Image.fromarray(pixels).save(folder / "val" / "images" / name)
        lines.append(f"{name}\t{wnid}\t0\t0\t63\t63")
        val[name] = (pixels, wnid)
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return folder, val


def write_image_tree(folder: Path, classes=("cat", "ant", "bee"), per_class=10, seed=0):
    rng = np.random.default_rng(seed)
    for c in classes:
        (folder / c).mkdir(parents=True)
        for i in range(per_class):
            h, w = rng.integers(20, 40, 2)
            Image.fromarray(_images(rng, 1, (h, w, 3))[0]).save(folder / c / f"{c}{i}.png")
