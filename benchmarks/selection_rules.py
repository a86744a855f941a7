"""Selection rules on repeated seeds: which one picks configurations that re-train better?

A sweep with repeated seeds trains every configuration with R seeds and then selects one with
a rule of :mod:`raysearch.metrics.repeats`:

- ``mean``: :func:`raysearch.metrics.repeats.select_on_means`, the lowest mean validation ECE
  among the configurations whose mean validation accuracy is within 0.01 of the best mean;
- ``robust``: :func:`raysearch.metrics.repeats.select_robust`, the same with the upper bound
  ``mean + 1 * SEM`` of the validation ECE instead of the mean;
- ``single`` (the R = 1 reference): :func:`raysearch.metrics.selection.select_best` on one seed per
  configuration, what a sweep without repeats does.

What a user gets is the exported configuration trained again with new seeds, so each rule is
scored by the *fresh-seed* test metrics of the configuration it picks.

Protocol:

1. A fixed, varied set of K configurations (``ce`` at several learning rates, ``ls``, ``focal``,
   ``mbls``, ``acls`` at values inside their ``search_spaces/*.yaml`` ranges) is trained with S
   seeds each on digits (``cnn``, one torch thread, two worker processes). The data split is
   the same for every run (``load_dataset("digits", seed=0)`` passed as ``data=``); only the
   initialisation and batch-order seed varies. The per-run metrics are cached in a parquet file
   (``--cache``) so that a re-run only redoes the resampling; ``--retrain`` ignores it.
2. For B draws and each R in ``--repeats``: every configuration's S seeds are shuffled; the
   first R are the sweep's seeds and the other S - R the fresh seeds. Each rule selects on the
   sweep seeds' validation metrics (``single`` on the first sweep seed alone); the chosen
   configuration is scored by its mean test ECE and mean test accuracy over its fresh seeds.
   The oracle is the configuration with the lowest fresh mean test ECE among those whose fresh
   mean test accuracy is within 0.01 of the best fresh mean test accuracy.
3. Printed per R and rule: the mean over draws of the fresh test ECE (percent) and its standard
   error over draws, the fresh test accuracy, the regret against the oracle, how often the
   oracle's configuration is picked and how often the pick's fresh accuracy falls more than
   0.01 below the best; then the ratio of the robust rule's fresh test ECE to the mean rule's,
   and how often robust wins where the two rules disagree. The per-configuration table (mean ±
   SEM over all S seeds) shows the seed noise the rules face.

The standard errors over draws are resampling (Monte Carlo) errors: the draws reuse the same
K x S runs, so they do not include the uncertainty of having trained only those runs; a
difference between rules smaller than the per-configuration SEMs is seed noise, however small
its resampling error.

Usage: python benchmarks/selection_rules.py [--configs 16] [--seeds 6] [--epochs 15]
       [--draws 2000] [--repeats 2,3] [--cache /tmp/selection_rules.parquet] [--retrain]
       [--first-seed 0]

``--first-seed 6`` trains seeds 6-11 into the same cache: an independent replicate of the whole
experiment; ``--seeds 12`` afterwards reuses both halves without training.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

METRICS = ("val_accuracy", "val_ece", "test_accuracy", "test_ece")
TOLERANCE = 0.01  # accuracy tolerance of every rule and of the oracle
Z = 1.0  # SEMs of the robust rule's upper bound

#: The fixed configurations: (method, loss parameters, learning rate), inside the ranges of
#: search_spaces/<method>.yaml (lr in [0.01, 0.2] for all).
BASE_CONFIGS: list[tuple[str, dict[str, float], float]] = [
    ("ce", {}, 0.02),
    ("ce", {}, 0.05),
    ("ce", {}, 0.1),
    ("ce", {}, 0.2),
    ("ls", {"epsilon": 0.02}, 0.05),
    ("ls", {"epsilon": 0.05}, 0.1),
    ("ls", {"epsilon": 0.1}, 0.05),
    ("ls", {"epsilon": 0.2}, 0.02),
    ("focal", {"gamma": 1.0}, 0.05),
    ("focal", {"gamma": 3.0}, 0.1),
    ("focal", {"gamma": 5.0}, 0.02),
    ("mbls", {"margin": 6.0, "alpha": 0.1}, 0.05),
    ("mbls", {"margin": 10.0, "alpha": 0.1}, 0.1),
    ("acls", {"margin": 6.0, "lambda1": 0.1, "lambda2": 0.01}, 0.05),
    ("acls", {"margin": 8.0, "lambda1": 0.05, "lambda2": 0.005}, 0.1),
    ("acls", {"margin": 10.0, "lambda1": 0.2, "lambda2": 0.02}, 0.02),
]


def make_configs(k: int) -> list[tuple[str, dict[str, float], float]]:
    """The first `k` configurations: the fixed list, then random draws from the yaml ranges.

    Args:
        k: number of configurations, >= 2.

    Returns:
        ``(method, loss_params, lr)`` triples; the extra ones (k > 16) come from a fixed-seed
        generator, so the same `k` always gives the same list.
    """
    configs = list(BASE_CONFIGS[:k])
    rng = np.random.default_rng(12345)

    def log_uniform(low: float, high: float) -> float:
        return float(round(math.exp(rng.uniform(math.log(low), math.log(high))), 4))

    while len(configs) < k:
        method = str(rng.choice(["ce", "ls", "focal", "mbls", "acls"]))
        params: dict[str, float] = {
            "ce": lambda: {},
            "ls": lambda: {"epsilon": log_uniform(0.01, 0.2)},
            "focal": lambda: {"gamma": round(float(rng.uniform(1.0, 5.0)), 3)},
            "mbls": lambda: {"margin": round(float(rng.uniform(6.0, 10.0)), 3), "alpha": 0.1},
            "acls": lambda: {"margin": round(float(rng.uniform(6.0, 10.0)), 3),
                             "lambda1": log_uniform(0.01, 0.3),
                             "lambda2": log_uniform(0.001, 0.03)},
        }[method]()
        configs.append((method, params, log_uniform(0.01, 0.2)))
    return configs


def config_key(method: str, params: dict[str, float], lr: float, epochs: int) -> str:
    """Stable identity of a configuration (without its seed): the cache key."""
    return json.dumps({"method": method, "loss_params": params, "lr": lr, "epochs": epochs},
                      sort_keys=True)


def config_label(method: str, params: dict[str, float], lr: float) -> str:
    """Short human-readable name of a configuration, e.g. ``ls eps=0.1 lr=0.05``."""
    short = {"epsilon": "eps", "gamma": "g", "margin": "m", "alpha": "a", "lambda1": "l1",
             "lambda2": "l2"}
    parts = [f"{short.get(k, k)}={v:g}" for k, v in params.items()]
    return " ".join([method, *parts, f"lr={lr:g}"])


_DATA: Any = None


def _init_worker() -> None:
    """Worker start-up: one torch thread, and the fixed digits split loaded once."""
    global _DATA
    import torch

    from raysearch.training.data import load_dataset

    torch.set_num_threads(1)
    _DATA = load_dataset("digits", seed=0)


def _fit_one(key: str, seed: int) -> dict[str, Any]:
    """Train one (configuration, seed) on the fixed split; returns its metrics and seconds."""
    from raysearch.config import RunConfig
    from raysearch.training.run import DivergedError, fit

    spec = json.loads(key)
    cfg = RunConfig(loss={"name": spec["method"], "params": dict(spec["loss_params"])},
                    optimizer={"lr": spec["lr"]}, epochs=spec["epochs"], seed=seed)
    t0 = time.perf_counter()
    try:
        metrics = fit(cfg, data=_DATA).metrics
        row = {m: float(metrics[m]) for m in METRICS}
        diverged = False
    except DivergedError:
        row = {m: math.nan for m in METRICS}
        diverged = True
    return {"key": key, "seed": seed, **row, "diverged": diverged,
            "seconds": time.perf_counter() - t0}


def train_all(configs: list[tuple[str, dict[str, float], float]], seeds: int, epochs: int,
              cache: Path, retrain: bool, workers: int = 2, first_seed: int = 0) -> pd.DataFrame:
    """Every (configuration, seed) run's metrics, trained in `workers` processes or cached.

    Args:
        configs: the ``(method, loss_params, lr)`` triples.
        seeds: seeds per configuration (first_seed .. first_seed + seeds - 1).
        epochs: training epochs of every run.
        cache: parquet file of earlier runs (read unless `retrain`, always rewritten).
        retrain: ignore the cache and train everything again.
        workers: worker processes (spawn context), one torch thread each.
        first_seed: the first seed (another value gives an independent replicate).

    Returns:
        One row per run: ``config_id`` (position in `configs`), ``label``, ``key``, ``seed``,
        the four metrics, ``diverged`` and ``seconds``.
    """
    keys = [config_key(m, p, lr, epochs) for m, p, lr in configs]
    cached = pd.DataFrame()
    if cache.exists() and not retrain:
        cached = pd.read_parquet(cache)
    done = set(zip(cached["key"], cached["seed"], strict=True)) if len(cached) else set()
    wanted = range(first_seed, first_seed + seeds)
    todo = [(k, s) for k in keys for s in wanted if (k, s) not in done]
    print(f"{len(keys)} configurations x {seeds} seeds ({first_seed}-{wanted[-1]}) x {epochs} "
          f"epochs: "
          f"{len(keys) * seeds - len(todo)} runs cached, {len(todo)} to train")
    rows: list[dict[str, Any]] = []
    if todo:
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                                 initializer=_init_worker) as pool:
            futures = [pool.submit(_fit_one, k, s) for k, s in todo]
            for i, fut in enumerate(as_completed(futures), 1):
                row = fut.result()
                rows.append(row)
                cid = keys.index(row["key"])
                note = " DIVERGED" if row["diverged"] else ""
                print(f"  [{i:3d}/{len(todo)}] config {cid:2d} seed {row['seed']}: "
                      f"{row['seconds']:.2f} s{note}", flush=True)
        print(f"trained {len(todo)} runs in {time.perf_counter() - t0:.1f} s wall "
              f"({workers} processes)")
    new = pd.DataFrame(rows)
    table = pd.concat([t for t in (cached, new) if len(t)], ignore_index=True)
    table = table.drop_duplicates(["key", "seed"], keep="last")
    cache.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(cache, index=False)
    runs = table[table["key"].isin(keys) & table["seed"].isin(wanted)].copy()
    runs["config_id"] = runs["key"].map({k: i for i, k in enumerate(keys)})
    runs["label"] = runs["config_id"].map(lambda i: config_label(*configs[i]))
    return runs.sort_values(["config_id", "seed"]).reset_index(drop=True)


def summary_from_arrays(acc: np.ndarray, ece: np.ndarray) -> pd.DataFrame:
    """A :func:`raysearch.metrics.repeats.seed_summary`-shaped table from (K, n) seed arrays.

    Same definitions (mean; SEM = sample std / sqrt(n), NaN for n = 1), computed with NumPy for
    the thousands of resampling draws; checked against ``seed_summary`` on the first draw.
    """
    n = acc.shape[1]
    sem = (lambda x: x.std(axis=1, ddof=1) / math.sqrt(n)) if n > 1 else \
        (lambda x: np.full(x.shape[0], math.nan))
    return pd.DataFrame({"config_id": np.arange(acc.shape[0]), "n_seeds": n,
                         "val_accuracy_mean": acc.mean(axis=1), "val_accuracy_sem": sem(acc),
                         "val_ece_mean": ece.mean(axis=1), "val_ece_sem": sem(ece)})


def oracle(acc: np.ndarray, ece: np.ndarray, tolerance: float = TOLERANCE) -> int:
    """Index of the lowest `ece` among entries whose `acc` is within `tolerance` of the best."""
    ok = acc >= acc.max() - tolerance - 1e-12
    return int(np.flatnonzero(ok)[np.argmin(ece[ok])])


def resample(runs: pd.DataFrame, repeats: int, draws: int, seed: int) -> dict[str, np.ndarray]:
    """Resampling experiment for one R: each rule's pick and its fresh-seed test scores.

    Args:
        runs: :func:`train_all` rows of the configurations that never diverged, every
            configuration with the same S seeds.
        repeats: R, the sweep's seeds per configuration (1 <= R < S).
        draws: number of random sweep/fresh splits.
        seed: seed of the NumPy generator.

    Returns:
        Per rule (``single``, ``mean``, ``robust``, ``oracle``) an int array of the chosen
        ``config_id`` per draw, plus ``{rule}_ece`` / ``{rule}_acc`` (fresh mean test ECE and
        accuracy of the pick) and ``best_acc`` (best fresh mean test accuracy) per draw.
    """
    from raysearch.metrics.repeats import seed_summary, select_on_means, select_robust
    from raysearch.metrics.selection import select_best

    ids = np.sort(runs["config_id"].unique())
    s = int(runs.groupby("config_id").size().iloc[0])
    cube = {m: runs.pivot(index="config_id", columns="seed", values=m).loc[ids].to_numpy()
            for m in METRICS}  # (K, S) per metric
    k = len(ids)
    rng = np.random.default_rng(seed)
    rules = ("single", "mean", "robust", "oracle")
    out: dict[str, np.ndarray] = {r: np.empty(draws, dtype=int) for r in rules}
    out.update({f"{r}_{x}": np.empty(draws) for r in rules for x in ("ece", "acc")})
    out["best_acc"] = np.empty(draws)
    rows = np.arange(k)[:, None]
    for b in range(draws):
        perm = rng.permuted(np.tile(np.arange(s), (k, 1)), axis=1)  # per-config shuffle
        sweep, fresh = perm[:, :repeats], perm[:, repeats:]
        val_acc, val_ece = cube["val_accuracy"][rows, sweep], cube["val_ece"][rows, sweep]
        test_acc = cube["test_accuracy"][rows, fresh].mean(axis=1)
        test_ece = cube["test_ece"][rows, fresh].mean(axis=1)
        summary = summary_from_arrays(val_acc, val_ece)
        if b == 0:  # the NumPy summary is the library's seed_summary
            long = pd.DataFrame({"config_id": np.repeat(np.arange(k), repeats),
                                 "val_accuracy": val_acc.ravel(), "val_ece": val_ece.ravel()})
            ref = seed_summary(long, ["val_accuracy", "val_ece"])
            pd.testing.assert_frame_equal(ref[summary.columns], summary, check_dtype=False)
        single = pd.DataFrame({"val_accuracy": val_acc[:, 0], "val_ece": val_ece[:, 0]})
        picks = {"single": select_best(single, "val_accuracy", "val_ece", TOLERANCE),
                 "mean": select_on_means(summary, tolerance=TOLERANCE),
                 "robust": (select_robust(summary, tolerance=TOLERANCE, z=Z) if repeats > 1
                            else select_on_means(summary, tolerance=TOLERANCE)),
                 "oracle": oracle(test_acc, test_ece)}
        for r, i in picks.items():
            out[r][b] = i
            out[f"{r}_ece"][b] = test_ece[i]
            out[f"{r}_acc"][b] = test_acc[i]
        out["best_acc"][b] = test_acc.max()
    out["ids"] = ids
    return out


def se(x: np.ndarray) -> float:
    """Standard error of the mean of `x` over draws (ddof = 1)."""
    return float(np.std(x, ddof=1) / math.sqrt(len(x)))


def report(res: dict[str, np.ndarray], repeats: int, seeds: int, draws: int) -> None:
    """Print the per-rule table and the robust-vs-mean comparison of one R."""
    print(f"\nR = {repeats} sweep seeds, {seeds - repeats} fresh seeds per configuration, "
          f"{draws} draws (ECE and accuracy in %, fresh-seed test metrics of the pick)")
    head = (f"  {'rule':<22s} {'test ECE':>9s} {'± SE':>7s} {'test acc':>9s} {'regret':>8s} "
            f"{'± SE':>7s} {'=oracle':>8s} {'acc<best-1':>10s}")
    print(head)
    labels = {"single": "single (R=1, 1 seed)", "mean": "mean", "robust": f"robust (z={Z:g})",
              "oracle": "oracle (fresh test)"}
    for r in ("single", "mean", "robust", "oracle"):
        ece, acc = res[f"{r}_ece"], res[f"{r}_acc"]
        regret = ece - res["oracle_ece"]
        same = np.mean(res[r] == res["oracle"])
        low = np.mean(acc < res["best_acc"] - TOLERANCE - 1e-12)
        print(f"  {labels[r]:<22s} {100 * ece.mean():9.3f} {100 * se(ece):7.3f} "
              f"{100 * acc.mean():9.3f} {100 * regret.mean():8.3f} {100 * se(regret):7.3f} "
              f"{100 * same:7.1f}% {100 * low:9.1f}%")
    diff = res["robust_ece"] - res["mean_ece"]
    differ = res["robust"] != res["mean"]
    better = f"{100 * np.mean(diff[differ] < 0):.1f}%" if differ.any() else "n/a"
    ratio = res["robust_ece"].mean() / res["mean_ece"].mean()
    print(f"  robust vs mean: fresh test ECE ratio {ratio:.3f}, robust better in "
          f"{better} of draws where they differ (they differ in "
          f"{100 * differ.mean():.1f}% of draws)")
    for r in ("single", "mean", "robust", "oracle"):
        ids, counts = np.unique(res[r], return_counts=True)
        top = sorted(zip(counts, ids, strict=True), reverse=True)[:4]
        print(f"  {r} picks: " + ", ".join(f"config {res['ids'][i]} {100 * c / draws:.0f}%"
                                          for c, i in top))
    print(f"  robust - mean (paired over draws): {100 * diff.mean():+.3f} ± {100 * se(diff):.3f} "
          f"points of test ECE; mean vs single: ratio "
          f"{res['mean_ece'].mean() / res['single_ece'].mean():.3f}")


def print_configs(runs: pd.DataFrame) -> None:
    """Per configuration: mean ± SEM over all its seeds of validation/test accuracy and ECE."""
    from raysearch.metrics.repeats import seed_summary

    table = seed_summary(runs, list(METRICS), keep=["label"])
    n = int(runs.groupby("config_id").size().max())
    print(f"\nPer configuration, mean ± SEM over {n} seeds (percent):")
    print(f"  {'id':>2s} {'configuration':<34s} {'val acc':>13s} {'val ECE':>13s} "
          f"{'test acc':>13s} {'test ECE':>13s}")
    for _, row in table.iterrows():
        cells = [f"{100 * row[m + '_mean']:6.2f} ± {100 * row[m + '_sem']:4.2f}" for m in METRICS]
        print(f"  {int(row['config_id']):2d} {row['label']:<34s} " + " ".join(cells))
    sems = table["test_ece_sem"] * 100
    print(f"  seed noise: median SEM of test ECE {sems.median():.3f} points "
          f"(per-seed std {sems.median() * math.sqrt(n):.3f}); spread of the configurations' "
          f"mean test ECE {100 * table['test_ece_mean'].min():.2f}-"
          f"{100 * table['test_ece_mean'].max():.2f}")


def main() -> None:
    """Parse the options, train (or read the cache), run the resampling and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=16, help="number of configurations K")
    ap.add_argument("--seeds", type=int, default=6, help="seeds per configuration S")
    ap.add_argument("--epochs", type=int, default=15, help="epochs of every run")
    ap.add_argument("--draws", type=int, default=2000, help="resampling draws B")
    ap.add_argument("--repeats", default="2,3", help="comma-separated sweep seeds R (< S)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="first training seed (e.g. 6 with --seeds 6: an independent replicate)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/selection_rules.parquet"))
    ap.add_argument("--retrain", action="store_true", help="ignore the cache")
    ap.add_argument("--workers", type=int, default=2, help="training processes")
    args = ap.parse_args()
    repeats = [int(r) for r in args.repeats.split(",")]
    if args.configs < 2 or any(not 1 <= r < args.seeds for r in repeats):
        ap.error("need --configs >= 2 and 1 <= R < --seeds for every R in --repeats")

    t0 = time.perf_counter()
    configs = make_configs(args.configs)
    runs = train_all(configs, args.seeds, args.epochs, args.cache, args.retrain, args.workers,
                     args.first_seed)
    print(f"median fit: {runs['seconds'].median():.2f} s (one thread; cache: {args.cache})")
    print_configs(runs)
    bad = runs.loc[runs["diverged"], "config_id"].unique()
    if len(bad):
        print(f"left out (diverged in some seed): configs {', '.join(map(str, sorted(bad)))}")
    runs = runs[~runs["config_id"].isin(bad)]
    t1 = time.perf_counter()
    for r in repeats:
        res = resample(runs, r, args.draws, args.seed)
        report(res, r, args.seeds, args.draws)
    print(f"\nresampling: {time.perf_counter() - t1:.1f} s; total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
