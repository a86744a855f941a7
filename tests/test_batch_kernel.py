"""The fused batch kernel of ImageTensorDataset (raysearch.training.data.batch_kernel) on the CPU.

Triton's interpreter (``TRITON_INTERPRET=1``, read when the kernel is defined) runs the kernel
on CPU tensors, so the comparisons run in a fresh Python process with the variable set and the
CPU added to the kernel's devices. Every case builds the same batch (same generator seed) on the
fused path and on the plain-torch path: they must be equal to the bit. The gpu-marked test in
tests/test_gpu.py checks the compiled kernel against the CPU on a real GPU.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton", reason="Triton is not installed (the fused path is then unused)")

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from raysearch.training.data import CropFlip, ImageTensorDataset, batch_kernel

    def batch(ds, index, fused, seed):
        batch_kernel.KERNEL_DEVICES.clear()
        if fused:
            batch_kernel.KERNEL_DEVICES.add("cpu")
        assert batch_kernel.kernel_ready(ds.images) == fused
        return ds.batch(index, generator=torch.Generator().manual_seed(seed))

    g = torch.Generator().manual_seed(0)
    cases = []

    def compare(name, images, index, augment, seed=1):
        c = images.shape[1]
        ds = ImageTensorDataset(images, torch.arange(images.shape[0]) % 5,
                                mean=tuple(0.4 + 0.05 * i for i in range(c)),
                                std=tuple(0.2 + 0.03 * i for i in range(c)), augment=augment)
        (a, ya), (b, yb) = batch(ds, index, False, seed), batch(ds, index, True, seed)
        cases.append({"case": name, "equal": torch.equal(a, b) and torch.equal(ya, yb),
                      "shape": list(b.shape), "contiguous": b.is_contiguous(),
                      "spread": float(b.std()) if b.numel() > 1 else 0.0})

    rgb = torch.randint(0, 256, (7, 3, 9, 11), dtype=torch.uint8, generator=g)
    index = torch.tensor([3, 0, 6, 6, -1, 2])
    compare("crop 4 and flip, repeated and negative indices", rgb, index, CropFlip(4, True))
    compare("no augmentation", rgb, index, None)
    compare("flip only", rgb, index, CropFlip(0, True))
    compare("crop only, padding larger than the image", rgb, index, CropFlip(12, False))
    gray = torch.randint(0, 256, (5, 1, 40, 40), dtype=torch.uint8, generator=g)
    compare("one channel, 1600 pixels (two blocks)", gray, torch.arange(5), CropFlip(3, True))
    compare("channels-last images", rgb.contiguous(memory_format=torch.channels_last), index,
            CropFlip(2, True), seed=5)
    compare("empty batch", rgb, torch.zeros(0, dtype=torch.int64), CropFlip(2, True))

    errors = []
    ds = ImageTensorDataset(rgb, torch.arange(7), mean=(0.5,) * 3, std=(0.25,) * 3,
                            augment=CropFlip(2, True))
    for fused in (False, True):
        try:
            batch(ds, torch.tensor([1, 7]), fused, 0)
        except IndexError as exc:
            errors.append(type(exc).__name__)
    json.dump({"cases": cases, "errors": errors}, sys.stdout)
    """
)


@pytest.fixture(scope="module")
def results() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_fused_batch_equals_the_plain_torch_batch_to_the_bit(results):
    assert [c["case"] for c in results["cases"]] == [
        "crop 4 and flip, repeated and negative indices", "no augmentation", "flip only",
        "crop only, padding larger than the image", "one channel, 1600 pixels (two blocks)",
        "channels-last images", "empty batch",
    ]
    for case in results["cases"]:
        assert case["equal"], case
        assert case["contiguous"], case
    shapes = [c["shape"] for c in results["cases"]]
    assert shapes == [[6, 3, 9, 11]] * 4 + [[5, 1, 40, 40], [6, 3, 9, 11], [0, 3, 9, 11]]
    assert all(c["spread"] > 0.5 for c in results["cases"][:-1])  # real pixels, not zeros


def test_an_index_out_of_range_raises_on_both_paths(results):
    assert results["errors"] == ["IndexError", "IndexError"]


def test_the_fused_path_is_off_the_gpu():
    import torch

    from raysearch.training.data import batch_kernel

    assert batch_kernel.KERNEL_DEVICES == {"cuda"}
    images = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    assert not batch_kernel.kernel_ready(images)  # a CPU tensor: the plain-torch path
    batch_kernel.KERNEL_DEVICES.add("cpu")
    try:
        assert batch_kernel.kernel_ready(images)
        assert not batch_kernel.kernel_ready(images.float())  # float images: plain torch
    finally:
        batch_kernel.KERNEL_DEVICES.discard("cpu")


def test_a_kernel_that_fails_leaves_the_dataset_in_plain_torch(monkeypatch, caplog):
    # Triton builds a C launcher on first use: a machine without a compiler makes the kernel
    # raise. The batch is built in plain torch from the same draws, one warning, the path
    # stays off.
    import torch

    from raysearch.training.data import CropFlip, ImageTensorDataset, batch_kernel

    class Broken:  # launched as kernel[grid](...), as a Triton kernel
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("Failed to find C compiler. Please specify via CC "
                                   "environment variable.")
            return launch

    images = torch.randint(0, 256, (4, 3, 6, 6), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    ds = ImageTensorDataset(images, torch.arange(4), mean=(0.5,) * 3, std=(0.25,) * 3,
                            augment=CropFlip(2, True))
    index = torch.tensor([2, 0, 3])
    expected, _ = ds.batch(index, generator=torch.Generator().manual_seed(9))
    monkeypatch.setattr(batch_kernel, "_kernel", lambda: Broken())
    monkeypatch.setattr(batch_kernel, "KERNEL_DEVICES", {"cpu"})
    with caplog.at_level("WARNING", logger="raysearch.training.data.batch_kernel"):
        got, labels = ds.batch(index, generator=torch.Generator().manual_seed(9))
        again, _ = ds.batch(index, generator=torch.Generator().manual_seed(9))
    assert torch.equal(got, expected)
    assert torch.equal(again, expected)
    assert labels.tolist() == [2, 0, 3]
    assert batch_kernel.KERNEL_DEVICES == set()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "Failed to find C compiler" in warnings[0]
