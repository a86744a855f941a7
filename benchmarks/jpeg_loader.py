"""JPEG image folders feeding a GPU: the loader's images/s over the training step's images/s.

Writes an ImageFolder tree of JPEG files itself (``--images`` random smooth images of 300-500
pixels a side in 10 classes, ``<class>/<i>.jpg``, quality 90), then measures, side by side:

1. **loader**: images/s of raysearch's training batches of that tree: the ``imagefolder``
   dataset (``RandomResizedCrop(S)`` + flip, ImageNet normalisation, read per sample with PIL)
   through the trial's training feed (``raysearch.training.loop.TrainFeed``: a ``DataLoader``
   with ``--workers`` worker processes, pinned memory on CUDA, batches copied to the device);
   the first batches (the workers' start) are not timed;
2. **training**: images/s of a bare training step of ``--model`` (``resnet50``) at S pixels on
   the device on batches already there (bf16 autocast and channels-last on CUDA, SGD with
   momentum): what the GPU could take.

``loader / training >= 1.0``: the GPU does not wait on data. ``--workers`` defaults to the
machine's CPU count minus one (a trial with that many CPUs: one runs the training loop); a
trial's own count comes from its ``cpus_per_trial`` (``raysearch.tune.trial_options``).

Without a CUDA device and without ``--device cpu`` it prints one line and exits 0; ``--device
cpu`` measures both on the CPU (a smoke run: ``--model cnn --image-size 32``).

Usage: python benchmarks/jpeg_loader.py [--images 2000] [--image-size 224] [--batch-size 128]
                                        [--batches 20] [--workers N] [--model resnet50]
                                        [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

CLASSES = 10


def write_jpeg_tree(root: Path, images: int, *, sides: tuple[int, int] = (300, 500),
                    seed: int = 0) -> int:
    """Write `images` random smooth RGB JPEGs as ``root/<class>/<i>.jpg``; returns the count.

    Each image is a random 8x8 colour grid upsampled bilinearly to a random size in `sides`
    (height and width drawn apart) plus pixel noise, so JPEG compresses it like a photograph
    rather than like white noise.
    """
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    for c in range(CLASSES):
        (root / f"class{c:02d}").mkdir(parents=True, exist_ok=True)
    for i in range(images):
        h, w = (int(v) for v in torch.randint(sides[0], sides[1] + 1, (2,), generator=g))
        grid = torch.rand(1, 3, 8, 8, generator=g)
        image = torch.nn.functional.interpolate(grid, size=(h, w), mode="bilinear")[0]
        image = (image * 220 + torch.rand(3, h, w, generator=g) * 35).clamp(0, 255)
        pixels = image.to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
        Image.fromarray(pixels).save(root / f"class{i % CLASSES:02d}" / f"{i:06d}.jpg",
                                     quality=90)
    return images


def loader_images_per_s(root: Path, *, image_size: int, batch_size: int, batches: int,
                        workers: int, device: torch.device, warmup: int = 2) -> float:
    """Images/s of the training batches of the ``imagefolder`` tree at `root` (see module)."""
    from raysearch.training.data.vision_trees import load_imagefolder
    from raysearch.training.loop import TrainFeed

    n = sum(1 for _ in root.glob("*/*.jpg"))
    held = min(max(0.05, 1.5 * CLASSES / n), 0.3)  # small val and test splits, every class in
    data = load_imagefolder(seed=0, data_dir=root, image_size=image_size, val_fraction=held,
                            test_fraction=held)
    feed = TrainFeed(data.train, device, num_workers=workers)
    g = torch.Generator().manual_seed(0)
    augment = torch.Generator().manual_seed(1)
    seen, start, epoch = 0, None, 0
    while True:
        epoch += 1
        it, _, _ = feed.epoch(epoch, batch_size, g, augment, None)
        for step, batch in enumerate(it):
            x = batch[0]
            if start is None and step + 1 >= warmup:  # the workers are up and running
                _sync(device)
                start = time.perf_counter()
                continue
            if start is not None:
                seen += int(x.shape[0])
                if seen >= batches * batch_size:
                    _sync(device)
                    return seen / (time.perf_counter() - start)


def training_images_per_s(model: str, *, image_size: int, batch_size: int, steps: int,
                          device: torch.device) -> float:
    """Images/s of a bare training step of `model` on device-resident batches (see module)."""
    from raysearch.training.models import build_model

    torch.manual_seed(0)
    net = build_model(model, num_classes=CLASSES, input_shape=(3, image_size, image_size))
    cuda = device.type == "cuda"
    net = net.to(device, memory_format=torch.channels_last if cuda else torch.contiguous_format)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch_size, 3, image_size, image_size, device=device)
    if cuda:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, CLASSES, (batch_size,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = net(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(2):  # cuDNN autotuning, the allocator
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return steps * batch_size / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(*, images: int, image_size: int, batch_size: int, batches: int, workers: int,
            model: str, device: torch.device) -> dict[str, float]:
    """Write the tree to a temporary folder and take both figures; ``{"loader", "training",
    "ratio", "workers"}`` (images/s, images/s, their ratio, the loader's worker processes)."""
    with tempfile.TemporaryDirectory(prefix="jpeg_loader-") as d:
        write_jpeg_tree(Path(d), images)
        loader = loader_images_per_s(Path(d), image_size=image_size, batch_size=batch_size,
                                     batches=batches, workers=workers, device=device)
    training = training_images_per_s(model, image_size=image_size, batch_size=batch_size,
                                     steps=batches, device=device)
    return {"loader": loader, "training": training, "ratio": loader / training,
            "workers": workers}


def default_workers() -> int:
    """The machine's CPU count minus one (one runs the training loop), at least 1."""
    return max((os.cpu_count() or 2) - 1, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--batches", type=int, default=20, help="timed batches of each figure")
    ap.add_argument("--workers", type=int, default=None,
                    help="loader worker processes [default: CPU count - 1]")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"jpeg_loader: no CUDA device found (torch {torch.__version__}); nothing to do "
              "(--device cpu measures both figures on the CPU)")
        return 0
    device = torch.device(args.device)
    workers = default_workers() if args.workers is None else args.workers
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{args.images} JPEGs (300-500 px), {args.image_size}-px crops, batches of "
          f"{args.batch_size}, {workers} loader workers, {args.model} on {where}")
    figures = measure(images=args.images, image_size=args.image_size,
                      batch_size=args.batch_size, batches=args.batches, workers=workers,
                      model=args.model, device=device)
    print(f"  loader     {figures['loader']:10.1f} images/s")
    print(f"  training   {figures['training']:10.1f} images/s")
    print(f"  loader / training: {figures['ratio']:.2f}; goal >= 1.0: "
          f"{'met' if figures['ratio'] >= 1.0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
