"""Bare Ray Tune's driver memory per trial: a reproducer without raysearch.

A trivial function trainable (one report of 20 metrics), two trials at a time, actors reused,
Tune's default callbacks off, run in a fresh Python process per size. Per size it prints the
driver's peak-RSS growth over the ``Tuner.fit`` (after a 4-trial warm-up ``fit``), the Python
objects the garbage collector tracks after it (the Tuner kept alive, as Tune's controller keeps
its trials until the fit ends) and the number of trials; below, the growth per trial between
consecutive sizes. This is what Ray Tune itself keeps of every ended trial for the whole sweep
(its ``Trial`` objects with their run metadata, checkpoint manager, cached JSON state and
placement-group factory; the controller's per-trial metadata for its experiment snapshots), and
the floor under a raysearch sweep's own figure (``benchmarks/sweep_scale.py``).

Usage: python benchmarks/tune_trial_memory.py [--trials 200,1000,3000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any


def one_size(trials: int) -> dict[str, Any]:
    """One bare Tune sweep of `trials` trials in this process; its memory figures."""
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    import ray
    from ray import tune

    def trainable(config: dict[str, Any]) -> None:
        tune.report({f"m{i}": config["x"] + i for i in range(20)})

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    def tuner(n: int) -> tune.Tuner:
        return tune.Tuner(trainable, param_space={"x": tune.grid_search(list(range(n)))},
                          tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=2),
                          run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(), verbose=0))

    tuner(4).fit()  # imports, Ray's client, the actors' start
    gc.collect()
    rss0, objects0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, len(gc.get_objects())
    t0 = time.perf_counter()
    grid = tuner(trials).fit()
    wall = time.perf_counter() - t0
    gc.collect()
    objects = len(gc.get_objects()) - objects0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    done = sum(1 for r in grid if r.error is None)
    ray.shutdown()
    return {"trials": trials, "done": done, "wall": wall, "rss_growth_mib": (rss - rss0) / 1024,
            "objects": objects}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", default="200,1000,3000", help="comma-separated sweep sizes")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_size(args.one)))
        return
    sizes = [int(s) for s in args.trials.split(",")]
    if len(sizes) < 2 or min(sizes) < 1 or sizes != sorted(set(sizes)):
        ap.error("--trials needs two or more increasing sizes >= 1, e.g. 200,1000,3000")
    import ray

    print(f"bare Ray Tune {ray.__version__}: one report of 20 metrics per trial, 2 at a time")
    print(f"{'trials':>6s} {'done':>5s} {'wall s':>7s} {'RSS growth MiB':>15s} {'objects':>9s}")
    results = []
    for n in sizes:
        out = subprocess.run([sys.executable, __file__, "--one", str(n)], check=True,
                             capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        results.append(r)
        print(f"{r['trials']:>6d} {r['done']:>5d} {r['wall']:7.1f} {r['rss_growth_mib']:+15.1f} "
              f"{r['objects']:>9d}", flush=True)
    for a, b in zip(results, results[1:], strict=False):
        extra = b["trials"] - a["trials"]
        print(f"trials {a['trials']}->{b['trials']}: driver peak RSS "
              f"{(b['rss_growth_mib'] - a['rss_growth_mib']) / extra * 1024:+.1f} KiB/trial, "
              f"{(b['objects'] - a['objects']) / extra:+.0f} tracked objects/trial")


if __name__ == "__main__":
    main()
