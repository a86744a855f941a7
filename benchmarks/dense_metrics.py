"""Throughput and memory of `CalibrationMeter` on PASCAL-VOC-val-sized segmentation outputs.

Prints:
  (1) the meter's throughput (pixels/s) and time per batch, accumulated over `--images` images
      of K = 21 classes at `--size` x `--size` in batches of `--batch` (VOC val: 1,449 images;
      keeping every pixel's probabilities would take 1449 * 21 * 512**2 * 4 B = 32 GB);
  (2) the memory the meter needs on top of the batch it is fed. CPU: the peak resident set
      size (RSS, /proc/self/statm polled every millisecond from a thread while `update`
      runs) minus the RSS just before the first update, and the process's peak RSS
      (`resource.getrusage`, includes Python, torch and the batches). GPU: the peak of
      `torch.cuda.max_memory_allocated` during the updates minus the allocation before them
      (the batch). Target: under 1 GiB whatever the number of images (run with 16 and 64
      images: the figure should not move), and the size of the meter's state;
  (3) on a GPU (or with `--model` on the CPU): the time of one forward pass of
      torchvision's `deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21,
      aux_loss=False)` in eval mode under `torch.no_grad()` on a batch of the same size,
      next to the meter's time per batch. Target on a GPU: the meter faster than the forward;
  (4) the metrics the meter computed (a sanity check, not a result: the data are random).

Synthetic outputs, made on the target device: probabilities = softmax over the classes of
standard normal logits times 4 (confidences spread over all bins), labels uniform over the 21
classes with ~5% of the pixels set to 255 (ignored), fixed seed; a fresh batch per step, made
outside the timed region. Times are wall clock around `update` (with `torch.cuda.synchronize`
on a GPU); the first batch is not timed (allocator), and a separate meter first scores one
small batch so that one-time costs (kernels, thread pools, libraries loaded on first use) are
neither timed nor counted as the meter's memory. On a shared machine the times vary: read them
as rough.

Usage: python benchmarks/dense_metrics.py [--images 1449] [--batch 8] [--size 512]
       [--device cuda|cpu] [--model] [--aece-samples 1000000]
"""

from __future__ import annotations

import argparse
import os
import resource
import threading
import time

import torch

from raysearch.metrics import CalibrationMeter

NUM_CLASSES = 21
IGNORE_INDEX = 255
GIB = 1024**3
COUNTS = ("n", "n_aece", "n_released")


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class RssPeak:
    """Largest RSS seen by a thread polling /proc/self/statm while the block runs."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def __enter__(self) -> RssPeak:
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def synthetic_batch(
    n: int, size: int, device: torch.device, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(n, NUM_CLASSES, size, size, device=device, generator=generator)
    probs = torch.softmax(logits.mul_(4.0), dim=1)
    del logits
    labels = torch.randint(
        0, NUM_CLASSES, (n, size, size), device=device, generator=generator, dtype=torch.uint8
    )
    ignored = torch.rand(n, size, size, device=device, generator=generator) < 0.05
    labels[ignored] = IGNORE_INDEX
    return probs, labels


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_time(batch: int, size: int, device: torch.device, repeats: int) -> float:
    """Median time of one DeepLabV3-ResNet50 forward pass (eval, no_grad) on random images."""
    from torchvision.models.segmentation import deeplabv3_resnet50

    model = deeplabv3_resnet50(
        weights=None, weights_backbone=None, num_classes=NUM_CLASSES, aux_loss=False
    )
    model = model.to(device).eval()
    images = torch.randn(batch, 3, size, size, device=device)
    times = []
    with torch.no_grad():
        model(images)  # warm-up
        for _ in range(repeats):
            sync(device)
            start = time.perf_counter()
            model(images)["out"]
            sync(device)
            times.append(time.perf_counter() - start)
    del model, images
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return sorted(times)[len(times) // 2]


def state_bytes(meter: CalibrationMeter) -> int:
    return sum(t.numel() * t.element_size() for t in meter.state_dict().values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1449)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", action="store_true", help="time the forward pass on a CPU too")
    parser.add_argument("--aece-samples", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="timed forward passes")
    args = parser.parse_args()
    device = torch.device(args.device)
    generator = torch.Generator(device=device).manual_seed(0)
    meter = CalibrationMeter(NUM_CLASSES, ignore_index=IGNORE_INDEX, aece_samples=args.aece_samples)
    sizes = [args.batch] * (args.images // args.batch)
    if args.images % args.batch:
        sizes.append(args.images % args.batch)

    print(
        f"device {device} ({torch.get_num_threads()} CPU threads), {args.images} images of "
        f"{NUM_CLASSES} x {args.size} x {args.size} float32 in {len(sizes)} batches of "
        f"<= {args.batch}; aece sample {args.aece_samples:,}"
    )
    # Warm-up on a small batch and a separate meter: loads kernels, thread pools and libraries
    # (one-time memory that is not the meter's).
    CalibrationMeter(NUM_CLASSES, ignore_index=IGNORE_INDEX).update(
        *synthetic_batch(1, 32, device, torch.Generator(device=device).manual_seed(1))
    )
    timed, timed_pixels, extra_peak, baseline = 0.0, 0, 0, None
    for step, n in enumerate(sizes):
        probs, labels = synthetic_batch(n, args.size, device, generator)
        sync(device)
        if device.type == "cuda":
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            before = rss_bytes()
            if baseline is None:
                baseline = before
        start = time.perf_counter()
        if device.type == "cuda":
            meter.update(probs, labels)
            sync(device)
            extra = torch.cuda.max_memory_allocated(device) - before
        else:
            with RssPeak() as rss:
                meter.update(probs, labels)
            extra = rss.peak - baseline
        elapsed = time.perf_counter() - start
        extra_peak = max(extra_peak, extra)
        if step > 0 or len(sizes) == 1:  # the first batch warms up, unless it is the only one
            timed += elapsed
            timed_pixels += n * args.size**2
        del probs, labels

    result = meter.compute()
    per_batch = timed / max(1, len(sizes) - 1 if len(sizes) > 1 else 1)
    print(
        f"(1) meter: {timed_pixels / timed / 1e6:.2f} M pixels/s, {per_batch * 1e3:.0f} ms "
        f"per batch of {args.batch} (timed over {timed_pixels:,} pixels, first batch untimed)"
    )
    what = (
        "RSS above the RSS before the first update"
        if device.type == "cpu"
        else ("torch.cuda.max_memory_allocated above the batch")
    )
    verdict = "OK" if extra_peak < GIB else "ABOVE TARGET"
    print(
        f"(2) meter peak memory: {extra_peak / 2**20:.0f} MiB ({what}); target < 1 GiB: "
        f"{verdict}; state {state_bytes(meter) / 2**20:.1f} MiB"
    )
    if device.type == "cpu":
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        print(f"    process peak RSS (Python, torch, batches included): {peak_rss / 2**20:.0f} MiB")
    if device.type == "cuda" or args.model:
        forward = forward_time(args.batch, args.size, device, args.repeats)
        ratio = forward / per_batch
        verdict = "OK" if per_batch < forward else "SLOWER"
        print(
            f"(3) deeplabv3_resnet50 forward (eval, no_grad): {forward * 1e3:.0f} ms per batch "
            f"of {args.batch}; meter {per_batch * 1e3:.0f} ms = forward / {ratio:.1f}; "
            f"target meter faster: {verdict}"
        )
    else:
        print("(3) forward pass not timed on the CPU (pass --model)")
    shown = ", ".join(f"{key} {value:.4f}" for key, value in result.items() if key not in COUNTS)
    print(f"(4) {shown}; n {result['n']:,.0f}, aece on {result['n_aece']:,.0f}")


if __name__ == "__main__":
    main()
