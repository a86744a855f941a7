"""Sweep scale: the driver's cost and memory per trial of `raysearch sweep` at 100 to 10,000 trials.

Each size is one ``raysearch.tune.engine.run_sweep`` on the CPU (digits, the ``mlp`` model,
``--epochs`` epochs, 2 trials at a time, Optuna TPE, MLflow child runs, temperature scaling,
checkpoints, the Pareto plot and trials table at the end: the defaults), run in a fresh Python
process of its own (with a local Ray of its own, never another user's running one) so that its
CPU time and peak RSS are its own. Ray's start-up and the creation of the MLflow store are left
out (paid once per session and per store). Per size it prints:

- ``wall/trial``: the sweep's wall time divided by its trials;
- ``work/trial``: each trial's own time as Tune measured it in the trial (``time_total_s`` of
  its last result: data, model, training, evaluation, post-hoc calibration, reports; not the
  trial processes' start, which is driver-side cost here);
- ``overhead/trial``: what the trials' own work does not explain, ``(wall - sum(work) /
  concurrency) / trials``: the driver's scheduling, the searcher, the MLflow callback, Tune's
  bookkeeping and the sweep's start and end;
- ``cpu/trial``: the driver process's CPU time (user + system, all its threads) over the sweep
  divided by its trials;
- MLflow writes per trial: rows of the SQLite store's ``metrics``, ``params`` and ``tags``
  tables and files in its artifact folder, over the trials;
- ``peak RSS``: the driver's peak resident set (``ru_maxrss``) after the sweep, and how much it
  grew during it;
- ``report`` and ``export``: wall seconds of ``raysearch report NAME`` and ``raysearch export
  NAME -o FILE`` on the finished sweep's store, each in a fresh process as a user runs them
  (Python's start and imports included; goal <= 30 s at 10,000 trials; the same commands on a
  PostgreSQL + S3 store: ``benchmarks/read_back.py``).

Below the table, per pair of consecutive sizes: the marginal overhead and driver CPU per trial,
and the driver's peak-RSS growth per trial, ``(growth(b) - growth(a)) / (b - a)`` in MiB (the
sweep's fixed memory, Ray's client, the imports of its end, cancels out).

Goal: the per-trial driver cost at the largest size is at most 1.5x that at the smallest, for
both ``overhead/trial`` and ``cpu/trial`` (PASS/FAIL each). Both include the sweep's fixed costs
(starting the trial processes, the selection, plot and table at the end), which weigh more at
small sizes; the marginal cost per trial between consecutive sizes, printed below the table,
leaves them out. The machine's other load makes the wall-time figures noisy; run it on a quiet
machine. Memory goal: the driver's peak-RSS growth between the two largest sizes given is at most
0.05 MiB per trial (PASS/FAIL; meant for ``--trials 100,1000,10000``: from 1,000 to 10,000).

Run time: one-epoch digits trials take ~0.25-0.4 s of sweep wall time each, two at a time on 2
cores (256 s for 1,000 trials with TPE, 146 s with ``--sampler random``, measured; Ray's start and
the MLflow store's creation come on top). Optuna's TPE sampler (the default, ``--sampler tpe``)
reads its whole history for every parameter of every trial it proposes: ~27 ms more per ask and
tell per 1,000 trials of history (3 parameters, 2 objectives; measured), ~0.3 s per trial at
10,000, so ``--trials 100,1000,10000`` takes 2-3 hours on 2 cores, nearly all of it the 10,000
point. ``--sampler random`` has no such growth (its 10,000 point took 30 minutes) and the same
driver memory per trial bar Optuna's sampler state; the memory goal is checked with it.

Usage: python benchmarks/sweep_scale.py [--trials 100,300,1000] [--epochs 1] [--space acls]
[--sampler tpe]
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL = 1.5  # per-trial driver cost at the largest size / at the smallest, at most
MEMORY_GOAL_MIB = 0.05  # driver peak-RSS growth per trial between the two largest sizes, at most


def _own_seconds(folder: Path) -> list[float]:
    """``time_total_s`` of the last result of every trial under a Tune experiment folder."""
    seconds = []
    for path in folder.glob("*/result.json"):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        if lines:
            seconds.append(float(json.loads(lines[-1]).get("time_total_s", 0.0)))
    return seconds


def _store_counts(db: Path, artifacts: Path) -> dict[str, int]:
    """Rows of the store's run tables and files of its artifact folder."""
    con = sqlite3.connect(db)
    try:
        counts = {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]  # noqa: S608
                  for t in ("runs", "metrics", "params", "tags")}
    finally:
        con.close()
    counts["artifacts"] = sum(1 for p in artifacts.rglob("*") if p.is_file())
    return counts


def one_size(trials: int, epochs: int, space: str, concurrency: int,
             sampler: str = "tpe") -> dict[str, Any]:
    """Run one sweep of `trials` trials in this process; its figures (see the module docstring)."""
    import ray

    from raysearch import tracking
    from raysearch.tune.cluster import init_ray
    from raysearch.tune.engine import run_sweep
    from raysearch.tune.settings import SweepSettings

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uri = f"sqlite:///{tmp}/bench.db"
        client, uri = tracking.get_client(uri)
        tracking.ensure_experiment(client, tracking.DEFAULT_EXPERIMENT, uri)
        base = _store_counts(tmp / "bench.db", tmp / "mlartifacts")
        init_ray("local")  # a Ray of its own, never another user's running one
        name = f"scale-{trials}"
        settings = SweepSettings(num_samples=trials, max_concurrent=concurrency, epochs=epochs,
                                 seed=0, name=name, tracking_uri=uri, model="mlp",
                                 storage_path=str(tmp / "ray"), sampler=sampler)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        cpu0, t0 = time.process_time(), time.perf_counter()
        result = run_sweep(space, settings, progress=lambda line: None)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ray.shutdown()
        own = _own_seconds(tmp / "ray" / name)
        experiment = client.get_experiment_by_name(tracking.DEFAULT_EXPERIMENT)
        location = experiment.artifact_location.removeprefix("file://")
        counts = _store_counts(tmp / "bench.db", Path(location))
        writes = {k: counts[k] - base[k] for k in counts}
        read = {command: _cli_seconds([command, name, "--tracking-uri", uri, *extra], tmp)
                for command, extra in (("report", []), ("export", ["-o", str(tmp / "b.yaml")]))}
        return {"trials": trials, "complete": int(result.trials["complete"].sum()),
                "results": len(own), "wall": wall, "cpu": cpu, "own": sum(own),
                "rss_mib": rss1 / 1024, "rss_growth_mib": (rss1 - rss0) / 1024,
                "writes": writes, "concurrency": concurrency, "read": read}


def _cli_seconds(args: list[str], cwd: Path) -> float:
    """Wall seconds of ``raysearch <args>`` in a subprocess (Python's start and imports in)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "raysearch.cli", *args], check=True, cwd=cwd,
                   capture_output=True, text=True)
    return time.perf_counter() - t0


def run_size(trials: int, epochs: int, space: str, concurrency: int,
             sampler: str = "tpe") -> dict[str, Any]:
    """:func:`one_size` in a fresh Python process (its own CPU time and peak RSS)."""
    cmd = [sys.executable, __file__, "--one", str(trials), "--epochs", str(epochs),
           "--space", space, "--concurrency", str(concurrency), "--sampler", sampler]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _row(r: dict[str, Any]) -> str:
    n = r["trials"]
    overhead = (r["wall"] - r["own"] / r["concurrency"]) / n
    w = r["writes"]
    return (f"{n:>6d} {r['complete']:>5d} {r['wall']:8.1f} {r['wall'] / n:8.3f} "
            f"{r['own'] / n:8.3f} {overhead:9.3f} {r['cpu'] / n:8.3f} "
            f"{w['metrics'] / n:7.1f} {w['params'] / n:6.1f} {w['tags'] / n:5.1f} "
            f"{w['artifacts'] / n:5.1f} {r['rss_mib']:7.0f} {r['rss_growth_mib']:+7.0f} "
            f"{r['read']['report']:7.1f} {r['read']['export']:7.1f}")


def main() -> None:
    from raysearch.tune.settings import SAMPLERS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", default="100,300,1000", help="comma-separated sweep sizes")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--space", default="acls")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--sampler", default="tpe", choices=SAMPLERS,
                    help="the sweep's Optuna sampler (random: no per-trial cost growing with "
                         "the history; for the memory figures of 10,000 trials)")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_size(args.one, args.epochs, args.space, args.concurrency,
                                  args.sampler)))
        return
    sizes = [int(s) for s in args.trials.split(",")]
    if len(sizes) < 2 or min(sizes) < 1 or sizes != sorted(set(sizes)):
        ap.error("--trials needs two or more increasing sizes >= 1, e.g. 100,1000,10000")

    print(f"'{args.space}' sweeps on digits (mlp, {args.epochs} epoch(s), {args.concurrency} "
          f"trials at a time, Optuna sampler {args.sampler}); seconds per trial; MLflow writes "
          f"per trial")
    print(f"{'trials':>6s} {'done':>5s} {'wall s':>8s} {'wall/tr':>8s} {'work/tr':>8s} "
          f"{'ovh/tr':>9s} {'cpu/tr':>8s} {'metric':>7s} {'param':>6s} {'tag':>5s} "
          f"{'file':>5s} {'RSS MiB':>7s} {'growth':>7s} {'report':>7s} {'export':>7s}")
    results = []
    for n in sizes:
        r = run_size(n, args.epochs, args.space, args.concurrency, args.sampler)
        results.append(r)
        print(_row(r), flush=True)
    for a, b in zip(results, results[1:], strict=False):
        extra = b["trials"] - a["trials"]
        ovh = ((b["wall"] - b["own"] / b["concurrency"])
               - (a["wall"] - a["own"] / a["concurrency"])) / extra
        mib = (b["rss_growth_mib"] - a["rss_growth_mib"]) / extra
        print(f"marginal, trials {a['trials']}->{b['trials']}: overhead {ovh:.3f} s/trial, "
              f"driver cpu {(b['cpu'] - a['cpu']) / extra:.3f} s/trial, "
              f"driver RSS {mib:+.3f} MiB/trial")
    small, large = results[0], results[-1]
    verdicts = []
    for label, key in (("overhead/trial", lambda r: r["wall"] - r["own"] / r["concurrency"]),
                       ("driver cpu/trial", lambda r: r["cpu"])):
        a, b = key(small) / small["trials"], key(large) / large["trials"]
        ratio = b / a if a > 0 else float("inf")
        ok = ratio <= GOAL
        verdicts.append(ok)
        print(f"{label} at {large['trials']} / at {small['trials']}: {b:.3f} s / {a:.3f} s = "
              f"{ratio:.2f} (goal <= {GOAL}): {'PASS' if ok else 'FAIL'}")
    print(f"goal (per-trial driver cost at {large['trials']} <= {GOAL}x that at "
          f"{small['trials']}): {'PASS' if all(verdicts) else 'FAIL'}")
    print(_memory_verdict(*sorted(results, key=lambda r: r["trials"])[-2:]))


def _memory_verdict(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The PASS/FAIL line of the memory goal between sizes `a` and `b` (b the larger)."""
    mib = (b["rss_growth_mib"] - a["rss_growth_mib"]) / (b["trials"] - a["trials"])
    return (f"goal (driver peak RSS growth from {a['trials']} to {b['trials']} trials <= "
            f"{MEMORY_GOAL_MIB} MiB/trial): {mib:+.3f} MiB/trial: "
            f"{'PASS' if mib <= MEMORY_GOAL_MIB else 'FAIL'}")


if __name__ == "__main__":
    main()
