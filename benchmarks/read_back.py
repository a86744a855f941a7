"""Read-back: `report`, `export`, `compare` and the end-of-sweep selection on a big sweep.

A team's store, started here as the test suite starts it: PostgreSQL on 127.0.0.1, moto's S3
server and ``mlflow server --backend-store-uri postgresql://... --artifacts-destination
s3://...`` (all stopped by their pids at the end). One real sweep runs against it
(``raysearch sweep all``, a few one-epoch digits trials, the CLI in a subprocess); its child runs
are then replicated under the same parent up to each size of ``--trials``: the same params and
tags (a run name and trial id of their own), the same metric history with the values perturbed
(a few percent, the same perturbation for a metric at every step), start and end times after
the original's, the artifact location of the original. The copies are written by SQL inside the
PostgreSQL database (``INSERT ... SELECT`` over MLflow's ``runs``, ``tags``, ``params``,
``metrics`` and ``latest_metrics`` tables), which takes seconds, not the hour that 10,000 runs
through the server's REST API would.

Per size, timed as a user runs them (wall time of the command in a subprocess, Python's
start and imports included):

- ``report (stale table)``: ``raysearch report NAME`` right after the copies were written: the
  parent's ``trials.parquet`` predates them, so the trials are read from the server's search
  (as for a sweep that is still running, or between a ``raysearch sync`` and its selection;
  printed, not held to the goal);
- ``selection``: the end of a sweep, :func:`raysearch.tracking.finalize_sweep` with the sweep's
  own settings and :func:`raysearch.tune.outcome.failed_trials` (in a subprocess; the calls
  themselves are timed) on the trials table the sweep's callback kept as its trials ended (here
  the same table, read from the store beforehand): the winner picked,
  ``pareto.png``/``pareto.html``, ``trials.parquet`` and ``best_config.yaml`` attached, the
  failed trials searched for. ``selection (read back)``, printed beside it and not held to the
  goal, is the same end reading every run from the store first: the end of a resumed sweep, or
  of one whose callback lost a write;
- ``report``, ``export`` (``-o best.yaml``) and ``compare``: after the selection, as users read
  a finished sweep.

Also printed: the time the copies took to write, and each command's output's first line.

Goal: each command at most 30 s at every size (PASS/FAIL each), meant for 10,000 trials; the
two reads of every run (``report (stale table)``, ``selection (read back)``) are printed beside
them and not held to it.

Run time: the servers and the real sweep take 1-2 minutes on 2 cores; writing 10,000 runs
about a minute; the commands at 10,000 trials a few minutes in all.

Usage: python benchmarks/read_back.py [--trials 1000,10000] [--seed-trials 4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's server helpers (tests/clusters.py)

from clusters import (  # noqa: E402
    free_port,
    start_mlflow_server,
    start_postgres,
    start_s3_server,
    stop_process,
)

GOAL_S = 30.0  # seconds per command, at most
NAME = "readback"
EXPERIMENT = "readback"
RAYSEARCH = [sys.executable, "-m", "raysearch.cli"]


def start_team_store(stack: ExitStack, root: Path) -> tuple[str, Any, dict[str, str]]:
    """PostgreSQL, S3 and an ``mlflow server`` on both; stopped when `stack` closes.

    Returns the tracking URI, the PostgreSQL server and the environment of a client.
    """
    import boto3

    postgres = start_postgres(free_port())
    stack.callback(postgres.stop)
    s3_proc, s3 = start_s3_server(root)
    stack.callback(stop_process, s3_proc)
    boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(
        Bucket="team")
    port = free_port()
    server = start_mlflow_server(root, port, backend_store_uri=postgres.create_database("mlflow"),
                                 artifacts_destination="s3://team/mlflow",
                                 env={**s3, **postgres.env,
                                      "MLFLOW_S3_ENDPOINT_URL": s3["AWS_ENDPOINT_URL"]})
    stack.callback(stop_process, server)
    return f"http://127.0.0.1:{port}", postgres, {**s3, **postgres.env}


def run_cli(args: list[str], env: dict[str, str], cwd: Path,
            timeout: float = 1800) -> tuple[float, str]:
    """Run ``raysearch ARGS``; its wall time and output (raises with the output on failure)."""
    t0 = time.perf_counter()
    done = subprocess.run([*RAYSEARCH, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **env}, timeout=timeout)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"raysearch {' '.join(args)} exited {done.returncode}:\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def small_sweep(uri: str, env: dict[str, str], tmp: Path, trials: int) -> str:
    """The real sweep the copies are made from; its first output line."""
    _, out = run_cli(["sweep", "all", "--num-samples", str(trials), "--epochs", "1",
                      "--max-concurrent", "2", "--seed", "0", "--name", NAME,
                      "--tracking-uri", uri, "--experiment", EXPERIMENT,
                      "--storage-path", str(tmp / "ray"), "--optuna-storage",
                      str(tmp / "optuna.db")], env, tmp)
    return out.strip().splitlines()[-1]


#: A copy's value of metric row ``m``: within +-2 % of the original's, the same at every step
#: (a pseudo-random draw from the copy's run id and the metric's key); accuracies stay <= 1.
_FACTOR = "(1 + 0.04 * ((hashtext(c.new || m.key)::float8 + 2147483648) / 4294967296 - 0.5))"
_PERTURBED = (f"CASE WHEN m.key LIKE '%accuracy%' OR m.key LIKE '%miou%' "
              f"THEN LEAST(1.0, m.value * {_FACTOR}) ELSE m.value * {_FACTOR} END")


def populate(postgres: Any, parent_id: str, total: int) -> int:
    """Copy the sweep's original child runs until the parent has `total` children.

    Runs, tags, params, metric history and latest metrics are copied with ``INSERT ...
    SELECT`` inside the database. Returns how many runs were written.
    """
    conn = postgres.connect("mlflow")
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                        "AND t.key = 'mlflow.parentRunId' AND t.value = %s "
                        "WHERE NOT EXISTS (SELECT 1 FROM tags o WHERE o.run_uuid = r.run_uuid "
                        "AND o.key = 'raysearch.copy_of') ORDER BY r.start_time", (parent_id,))
            originals = [row[0] for row in cur.fetchall()]
            cur.execute("SELECT count(*) FROM tags WHERE key = 'mlflow.parentRunId' "
                        "AND value = %s", (parent_id,))
            have = cur.fetchone()[0]
            wanted = total - have
            if wanted <= 0:
                return 0
            cur.execute("SELECT count(*) FROM tags WHERE key = 'raysearch.copy_of' "
                        "AND run_uuid IN (SELECT run_uuid FROM tags WHERE "
                        "key = 'mlflow.parentRunId' AND value = %s)", (parent_id,))
            first = cur.fetchone()[0]
            cur.execute(
                "CREATE TEMP TABLE copies ON COMMIT DROP AS "
                "SELECT o.id AS orig, md5(o.id || '-' || n.i) AS new, n.i "
                "FROM generate_series(%(first)s, %(last)s) AS n(i) "
                "JOIN unnest(%(ids)s::text[]) WITH ORDINALITY AS o(id, pos) "
                "  ON o.pos = (n.i %% %(originals)s) + 1",
                {"originals": len(originals), "first": first, "last": first + wanted - 1,
                 "ids": originals})
            cur.execute(
                "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, "
                "user_id, status, start_time, end_time, deleted_time, source_version, "
                "lifecycle_stage, artifact_uri, experiment_id) "
                "SELECT c.new, r.name || '-c' || c.i, r.source_type, r.source_name, "
                "r.entry_point_name, r.user_id, r.status, "
                "(extract(epoch FROM clock_timestamp()) * 1000)::bigint + c.i, "
                "(extract(epoch FROM clock_timestamp()) * 1000)::bigint + c.i + "
                "(r.end_time - r.start_time), r.deleted_time, r.source_version, "
                "r.lifecycle_stage, r.artifact_uri, r.experiment_id "
                "FROM copies c JOIN runs r ON r.run_uuid = c.orig")
            cur.execute(
                "INSERT INTO tags (key, value, run_uuid) "
                "SELECT t.key, CASE WHEN t.key = 'mlflow.runName' THEN t.value || '-c' || c.i "
                "WHEN t.key = 'raysearch.trial_id' THEN t.value || '_c' || c.i "
                "ELSE t.value END, c.new FROM copies c JOIN tags t ON t.run_uuid = c.orig "
                "UNION ALL SELECT 'raysearch.copy_of', c.orig, c.new FROM copies c")
            cur.execute("INSERT INTO params (key, value, run_uuid) SELECT p.key, p.value, c.new "
                        "FROM copies c JOIN params p ON p.run_uuid = c.orig")
            cur.execute(
                "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
                f"SELECT m.key, {_PERTURBED}, m.timestamp, c.new, m.step, m.is_nan "
                "FROM copies c JOIN metrics m ON m.run_uuid = c.orig")
            cur.execute(
                "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                f"SELECT m.key, {_PERTURBED}, m.timestamp, m.step, m.is_nan, c.new "
                "FROM copies c JOIN latest_metrics m ON m.run_uuid = c.orig")
            cur.execute("ANALYZE")
        return wanted
    finally:
        conn.close()


_SELECTION = """
import sys, time
from raysearch import tracking
from raysearch.tune.outcome import failed_trials
from raysearch.tune.settings import SweepSettings
from raysearch.tune.sweep_record import load_record
client, _ = tracking.get_client(sys.argv[1])
parent = tracking.find_sweep(client, sys.argv[2], sys.argv[3])
record = load_record(client, parent.info.run_id, sys.argv[2])
settings = SweepSettings.from_record(record["settings"])
select = dict(tolerance=settings.tolerance, ece_key=settings.ece_key, status=parent.info.status,
              selection=settings.selection, accuracy_key=settings.accuracy_key)
t0 = time.perf_counter()
frame = tracking.finalize_sweep(client, parent.info.run_id, **select)
failed_trials(client, parent.info.run_id)
read = time.perf_counter() - t0
kept = frame.drop(columns=["on_front", "selected"])  # the table the sweep's callback kept
t0 = time.perf_counter()
frame = tracking.finalize_sweep(client, parent.info.run_id, table=kept, **select)
failed_trials(client, parent.info.run_id)
live = time.perf_counter() - t0
print(f"{live:.3f} {read:.3f} {len(frame)} {int(frame['selected'].sum())}")
"""


#: The two informative figures, not held to the goal: reads of every run of the sweep.
STALE, READ_BACK = "report (stale table)", "selection (read back)"


def selection_seconds(uri: str, env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """Seconds of the end-of-sweep selection on the kept table and read from the store."""
    done = subprocess.run([sys.executable, "-c", _SELECTION, uri, NAME, EXPERIMENT],
                          capture_output=True, text=True, cwd=cwd, env={**os.environ, **env},
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"selection failed:\n{done.stderr[-3000:]}")
    live, read, rows, selected = done.stdout.split()[-4:]
    return float(live), float(read), f"{rows} trials, {selected} selected"


def one_size(uri: str, postgres: Any, env: dict[str, str], tmp: Path, parent_id: str,
             total: int) -> dict[str, float]:
    """Grow the sweep to `total` trials, time the commands; print and return the seconds."""
    t0 = time.perf_counter()
    written = populate(postgres, parent_id, total)
    print(f"\n{total} trials: {written} copied runs written in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    store = ["--tracking-uri", uri, "--experiment", EXPERIMENT]
    times: dict[str, float] = {}

    def show(label: str, seconds: float, first: str) -> None:
        times[label] = seconds
        verdict = "PASS" if seconds <= GOAL_S else "FAIL"
        print(f"  {label:<22s} {seconds:7.1f} s  {verdict}  | {first[:90]}", flush=True)

    seconds, out = run_cli(["report", NAME, *store], env, tmp)
    times[STALE] = seconds  # a sweep read before its end's selection (e.g. while it runs)
    print(f"  {STALE:<22s} {seconds:7.1f} s  (informative) | {out.splitlines()[0][:90]}",
          flush=True)
    live, read, line = selection_seconds(uri, env, tmp)
    show("selection", live, line)
    times[READ_BACK] = read  # a resumed sweep's end, or one that lost a write
    print(f"  {READ_BACK:<22s} {read:7.1f} s  (informative)", flush=True)
    seconds, out = run_cli(["report", NAME, *store], env, tmp)
    show("report", seconds, out.splitlines()[0])
    seconds, out = run_cli(["export", NAME, "-o", str(tmp / "best.yaml"), *store], env, tmp)
    show("export", seconds, out.splitlines()[0])
    seconds, out = run_cli(["compare", NAME, *store], env, tmp)
    show("compare", seconds, out.splitlines()[-1])
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", default="10000", help="comma-separated sweep sizes, increasing")
    ap.add_argument("--seed-trials", type=int, default=4,
                    help="trials of the real sweep the others are copied from")
    args = ap.parse_args()
    sizes = [int(s) for s in args.trials.split(",")]
    if min(sizes) <= args.seed_trials or sizes != sorted(set(sizes)):
        ap.error(f"--trials needs increasing sizes above --seed-trials ({args.seed_trials})")
    from mlflow.tracking import MlflowClient

    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d, ExitStack() as stack:
        tmp = Path(d)
        t0 = time.perf_counter()
        uri, postgres, env = start_team_store(stack, tmp)
        print(f"team store up in {time.perf_counter() - t0:.1f} s: {uri} (PostgreSQL, S3)")
        t0 = time.perf_counter()
        last = small_sweep(uri, env, tmp, args.seed_trials)
        print(f"real sweep '{NAME}' ({args.seed_trials} one-epoch digits trials) in "
              f"{time.perf_counter() - t0:.1f} s: {last}", flush=True)
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(EXPERIMENT)
        parent = client.search_runs([exp.experiment_id],
                                    filter_string="tags.`mlflow.parentRunId` IS NULL")[0]
        for total in sizes:
            results[total] = one_size(uri, postgres, env, tmp, parent.info.run_id, total)
    print(f"\nseconds per command (goal <= {GOAL_S:g} s each)")
    labels = list(next(iter(results.values())))
    print(f"{'trials':>7s} " + " ".join(f"{label:>21s}" for label in labels))
    for total, times in results.items():
        print(f"{total:>7d} " + " ".join(f"{times[label]:>21.1f}" for label in labels))
    worst = max(v for k, v in results[sizes[-1]].items() if k not in (STALE, READ_BACK))
    print(f"goal (every command <= {GOAL_S:g} s at {sizes[-1]} trials): slowest {worst:.1f} s: "
          f"{'PASS' if worst <= GOAL_S else 'FAIL'}")


if __name__ == "__main__":
    main()
