"""Cost of every training objective relative to plain cross-entropy.

(1) One training step (forward + backward + SGD step) of the digits CNN on a batch of 64 with
each objective, relative to CE's step (target: every objective <= 1.3x CE). (2) The loss alone
(forward + backward) on (512, 100) logits, relative to CE. Times are medians of repeated runs
with one torch thread, after a warm-up.

Usage: python benchmarks/loss_overhead.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from raysearch.losses import available_losses, build_loss
from raysearch.training.data import load_dataset
from raysearch.training.models import build_model


def _median_time(fn, repeats: int) -> float:
    for _ in range(max(5, repeats // 10)):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    from raysearch.training.data.side import loss_side_inputs

    data = load_dataset("digits")
    x, y = data.train.tensors
    xb, yb = x[:64], y[:64]
    objectness = torch.rand(64)
    big_logits = torch.randn(512, 100) * 3
    big_targets = torch.randint(0, 100, (512,))
    big_objectness = torch.rand(512)

    step_times, loss_times = {}, {}
    for name in available_losses():
        loss_fn = build_loss(name)
        side = {"objectness": objectness} if "objectness" in loss_side_inputs(loss_fn) else {}
        big_side = {"objectness": big_objectness} if side else {}
        model = build_model("cnn", num_classes=10, input_shape=(1, 8, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(loss_fn=loss_fn, model=model, opt=opt, side=side):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb, **side).backward()
            opt.step()

        def loss_only(loss_fn=loss_fn, side=big_side):
            z = big_logits.detach().requires_grad_()
            loss_fn(z, big_targets, **side).backward()

        step_times[name] = _median_time(step, args.repeats)
        loss_times[name] = _median_time(loss_only, args.repeats)

    base_step, base_loss = step_times["ce"], loss_times["ce"]
    print(f"digits CNN training step (batch 64), CE = {1e3 * base_step:.3f} ms; "
          f"loss alone on (512, 100), CE = {1e3 * base_loss:.3f} ms; one torch thread")
    print(f"{'objective':<10s} {'step ms':>9s} {'step / CE':>10s} {'loss ms':>9s} "
          f"{'loss / CE':>10s}")
    worst = 0.0
    for name in available_losses():
        ratio = step_times[name] / base_step
        worst = max(worst, ratio)
        flag = "" if ratio <= 1.3 else "  > 1.3x"
        print(f"{name:<10s} {1e3 * step_times[name]:9.3f} {ratio:9.2f}x "
              f"{1e3 * loss_times[name]:9.3f} {loss_times[name] / base_loss:9.2f}x{flag}")
    print(f"worst training-step ratio: {worst:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
