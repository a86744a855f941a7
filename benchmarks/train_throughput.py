"""Training throughput (images/s) of ResNet-18 on CIFAR-shaped data, on the CPU and on a GPU.

Everything runs through the code path of a sweep trial: `raysearch.training.run.fit` on an
in-memory uint8 image set (`ImageTensorDataset`, random-crop + flip augmentation on the training
device) with random 32x32 images and 10 classes, so no dataset is needed.

Prints:
- **cpu**: images/s of one training process on the CPU (fp32, `--cpu-threads` torch threads).
- **data share**: the share of a training step spent producing the batch (gather, augment,
  normalise), measured by timing the batch pipeline alone against whole steps on the same
  device (target <= 10% of step time).
- **gpu** (when one is visible): Ray Tune trials, each training `--gpu-epochs` epochs:
  (a) 1 trial with 1 GPU, (b) 4 trials at 0.25 GPU each, started together. Throughput of (b) is
  all images of the 4 trials over the wall time from the first start to the last end; the ratio
  (b) / (a) is printed (target >= 3x for a small model; ResNet-18 on 32x32 images in bf16
  leaves an H100 mostly idle in one process).

Usage: python benchmarks/train_throughput.py [--train-images 10000] [--model resnet18]
                                             [--gpu-epochs 3] [--cpu-images 512]
"""

from __future__ import annotations

import argparse
import time

import torch


def synthetic_splits(n_train: int, n_eval: int, *, seed: int = 0):
    """CIFAR-shaped DatasetSplits (uint8 3x32x32, 10 classes) from random pixels."""
    from raysearch.training.data import DatasetSplits
    from raysearch.training.data.images import CropFlip, ImageTensorDataset

    g = torch.Generator().manual_seed(seed)

    def part(n: int, augment):
        images = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
        labels = torch.randint(0, 10, (n,), generator=g)
        return ImageTensorDataset(images, labels, mean=(0.49, 0.48, 0.45),
                                  std=(0.25, 0.24, 0.26), augment=augment)

    return DatasetSplits(train=part(n_train, CropFlip(4, True)), val=part(n_eval, None),
                         test=part(n_eval, None), num_classes=10, input_shape=(3, 32, 32),
                         name="synthetic")


def train_images_per_s(model: str, n_train: int, epochs: int, device: str,
                       precision: str = "auto", batch_size: int = 128) -> tuple[float, float]:
    """(images/s of the training epochs, seconds) of one `fit` run."""
    from raysearch.config import RunConfig
    from raysearch.training.run import fit

    data = synthetic_splits(n_train, 256)
    cfg = RunConfig(loss={"name": "ce"}, model={"name": model}, optimizer={"lr": 0.05},
                    epochs=epochs, batch_size=batch_size)
    marks: list[float] = []
    start = time.perf_counter()
    fit(cfg, data=data, device=device, precision=precision,
        on_epoch=lambda *_: marks.append(time.perf_counter()))
    # the first epoch pays for cuDNN autotuning and allocator warm-up: time the rest
    if len(marks) >= 2:
        return n_train * (len(marks) - 1) / (marks[-1] - marks[0]), time.perf_counter() - start
    return n_train / (marks[0] - start), time.perf_counter() - start


def data_share(model: str, device: str, steps: int = 30, batch_size: int = 128) -> float:
    """Share of a training step spent producing the batch (both timed with device syncs)."""
    from raysearch.training.loop import Amp, Source
    from raysearch.training.models import build_model

    dev = torch.device(device)
    data = synthetic_splits(batch_size * steps, 16)
    source = Source(data.train, dev)
    amp = Amp(dev, "auto")
    net = build_model(model, num_classes=10, input_shape=(3, 32, 32)).to(dev)
    if amp.channels_last:
        net.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    order = torch.randperm(source.n)
    gen = torch.Generator().manual_seed(0)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    # warm-up
    for xb, yb, _ in source.batches(order[: 2 * batch_size], batch_size, gen):
        with amp.autocast():
            loss = torch.nn.functional.cross_entropy(net(amp.prepare(xb)).float(), yb)
        loss.backward()
        opt.step()
    sync()
    t = time.perf_counter()
    for _ in source.batches(order, batch_size, gen):
        pass
    sync()
    fetch = time.perf_counter() - t
    t = time.perf_counter()
    for xb, yb, _ in source.batches(order, batch_size, gen):
        with amp.autocast():
            loss = torch.nn.functional.cross_entropy(net(amp.prepare(xb)).float(), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync()
    total = time.perf_counter() - t
    return fetch / total


def gpu_sharing(model: str, n_train: int, epochs: int) -> tuple[float, float]:
    """(images/s of 1 trial on 1 GPU, images/s of 4 trials at 0.25 GPU) through Ray Tune."""
    import ray
    from ray import tune

    def trial(config: dict) -> None:
        ips, _ = train_images_per_s(config["model"], config["n"], config["epochs"], "cuda")
        tune.report({"images_per_s": ips, "start": config["t0"], "end": time.time(),
                     "images": config["n"] * config["epochs"]})

    ray.init(log_to_driver=False, include_dashboard=False)
    out = []
    for trials, share in ((1, 1.0), (4, 0.25)):
        t0 = time.time()
        tuner = tune.Tuner(
            tune.with_resources(trial, {"cpu": 1, "gpu": share}),
            param_space={"model": model, "n": n_train, "epochs": epochs, "t0": t0},
            tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=trials),
            run_config=tune.RunConfig(verbose=0, storage_path="/tmp/raysearch-bench"),
        )
        results = tuner.fit()
        rates = [r.metrics["images_per_s"] for r in results]
        # steady-state throughput of the concurrent trials: the sum of their own rates
        out.append(sum(rates))
        print(f"  {trials} trial(s) at {share:g} GPU: per-trial images/s "
              f"{', '.join(f'{r:,.0f}' for r in rates)}; sum {sum(rates):,.0f}; "
              f"wall {time.time() - t0:.1f}s")
    ray.shutdown()
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--cpu-images", type=int, default=512)
    ap.add_argument("--cpu-threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--train-images", type=int, default=10000)
    ap.add_argument("--gpu-epochs", type=int, default=3)
    args = ap.parse_args()

    torch.set_num_threads(args.cpu_threads)
    ips, _ = train_images_per_s(args.model, args.cpu_images, 2, "cpu")
    print(f"cpu: {args.model} {ips:,.1f} images/s (fp32, {args.cpu_threads} threads, "
          f"batch 128)")
    share = data_share(args.model, "cpu", steps=4)
    print(f"cpu: data share of step time {100 * share:.1f}% (target <= 10%)")
    if not torch.cuda.is_available():
        print("gpu: no CUDA GPU visible: skipped")
        return
    name = torch.cuda.get_device_name()
    share = data_share(args.model, "cuda")
    print(f"gpu ({name}): data share of step time {100 * share:.1f}% (target <= 10%)")
    one, four = gpu_sharing(args.model, args.train_images, args.gpu_epochs)
    print(f"gpu ({name}): 1 trial {one:,.0f} images/s; 4 trials at 0.25 GPU {four:,.0f} "
          f"images/s in total; ratio {four / one:.2f}x (target >= 3x for a small model)")


if __name__ == "__main__":
    main()
