"""Cost of the papers' table metrics per post-hoc row, next to the summary they replaced.

Every post-hoc row of a trial (``test_*_<calibrator>`` and the honest-half ``val_*_<calibrator>``)
is measured with :func:`raysearch.metrics.table_summary` over
:data:`raysearch.metrics.CALIBRATED_KEYS` (the summary, and every column of the papers' tables:
``ece_100``, ``ece_l2em``, ``sweep_ce``, ``marginal_ece``, ``overconfidence``, ...). Before, a row
was :func:`~raysearch.metrics.calibration_summary` plus :func:`~raysearch.metrics.ks_error`.

Prints, for N validation/test samples and K classes (synthetic over-confident probabilities,
fixed seed): both times (median of ``--repeats``), their ratio, and the slowest single metric.
A trial with ``--posthoc ts`` pays four such rows (test and honest half, uncalibrated and TS).

Usage: python benchmarks/table_metrics.py [--n 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from raysearch.metrics import (
    CALIBRATED_KEYS,
    calibration_summary,
    ks_error,
    softmax,
    table_summary,
)


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"one post-hoc row on N = {args.n} samples (median of {args.repeats})")
    print(f"{'K':>6}  {'summary+ks s':>12}  {'table s':>8}  {'ratio':>6}  slowest metric")
    for k in (10, 100, 1000):
        labels = rng.integers(0, k, args.n)
        logits = rng.standard_normal((args.n, k)) * 3
        logits[np.arange(args.n), labels] += 6
        probs = softmax(logits.astype(np.float32))

        def before(probs=probs, labels=labels):
            summary = calibration_summary(probs, labels)
            summary["ks"] = ks_error(probs, labels)
            return summary

        old = _median_seconds(before, args.repeats)
        new = _median_seconds(lambda probs=probs, labels=labels: table_summary(
            probs, labels, keys=CALIBRATED_KEYS), args.repeats)
        single = {key: _median_seconds(lambda key=key, probs=probs, labels=labels: table_summary(
            probs, labels, keys=(key,)), 1) for key in CALIBRATED_KEYS}
        slowest = max(single, key=single.get)
        print(f"{k:>6}  {old:>12.3f}  {new:>8.3f}  {new / old:>5.1f}x  {slowest} "
              f"({single[slowest]:.3f} s)")


if __name__ == "__main__":
    main()
