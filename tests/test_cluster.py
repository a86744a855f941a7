"""Sweeps on Ray clusters: 2 nodes on this machine, a Ray Job, checkpoints in S3 (real servers).

- a 2-node ``ray.cluster_utils.Cluster`` (1 CPU each): ``raysearch sweep --address`` runs 2
  concurrent trials, one per node (each child run is tagged with its node id);
- the same cluster takes the sweep as a Ray Job (``JobSubmissionClient``, the dashboard of
  the head node), as ``ray job submit -- raysearch sweep ...`` does;
- ``--storage-path s3://bucket/prefix`` against moto's standalone S3 server on 127.0.0.1: the
  trials write their checkpoints there and the driver reads the logits back from it.

Every sweep runs as a ``raysearch`` subprocess (the command users run), so it connects to its
cluster as its own Ray driver.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow.fs as pafs
import pytest
from clusters import free_port, start_cluster
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.integration

RAYSEARCH = [sys.executable, "-m", "raysearch.cli"]


def _sweep(*args: str, env: dict | None = None, timeout: int = 300):
    return subprocess.run([*RAYSEARCH, "sweep", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _children(uri: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    return client, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


@pytest.fixture(scope="module")
def two_nodes():
    cluster = start_cluster(1, 1, dashboard=True)
    yield cluster
    cluster.shutdown()


def test_trials_spread_over_two_nodes(two_nodes, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    # trials long enough (15 digits epochs, ~10 s) that the second node's trial actor is up
    # before the first trial ends (else Tune reuses the first actor for the second trial)
    done = _sweep("ce", "--num-samples", "2", "--max-concurrent", "2", "--epochs", "15",
                  "--address", two_nodes.address, "--tracking-uri", uri,
                  "--storage-path", str(tmp_path / "ray"), "--posthoc", "none")
    assert done.returncode == 0, done.stdout + done.stderr
    _, children = _children(uri)
    assert len(children) == 2
    assert all(c.info.status == "FINISHED" for c in children)
    nodes = {c.data.tags["raysearch.node_id"] for c in children}
    cluster_nodes = {node.node_id for node in two_nodes.list_all_nodes()}
    # 1 CPU per node and 2 concurrent 1-CPU trials: one trial on each node
    assert nodes == cluster_nodes


def test_sweep_as_a_ray_job(two_nodes, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"  # absolute: the job's cwd is a temp copy
    client = JobSubmissionClient(f"http://{two_nodes.head_node.address_info['webui_url']}")
    entrypoint = (f"raysearch sweep ce --num-samples 1 --epochs 1 --posthoc none "
                  f"--name job-sweep --tracking-uri {uri} --storage-path {tmp_path / 'ray'}")
    deadline = time.monotonic() + 90
    while True:  # the head's job agent registers a few seconds after the dashboard is up
        try:
            job = client.submit_job(entrypoint=entrypoint)
            break
        except RuntimeError as exc:
            if "No available agent" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(2)
    deadline = time.monotonic() + 240
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    while (status := client.get_job_status(job)) not in terminal:
        assert time.monotonic() < deadline, client.get_job_logs(job)[-3000:]
        time.sleep(1)
    logs = client.get_job_logs(job)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    assert "sweep job-sweep finished" in logs
    _, children = _children(uri)
    assert [c.info.status for c in children] == ["FINISHED"]


def test_checkpoints_in_s3(s3_server, tmp_path):
    s3 = pafs.S3FileSystem(endpoint_override=s3_server["AWS_ENDPOINT_URL"],
                           access_key="testing", secret_key="testing", region="us-east-1",
                           allow_bucket_creation=True)
    s3.create_dir("sweeps")
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    done = _sweep("ce", "--num-samples", "1", "--epochs", "2", "--name", "s3-sweep",
                  "--storage-path", "s3://sweeps/ray", "--tracking-uri", uri, env=s3_server)
    assert done.returncode == 0, done.stdout + done.stderr
    files = [f.path for f in s3.get_file_info(pafs.FileSelector("sweeps/ray", recursive=True))
             if f.type == pafs.FileType.File]
    # Tune's experiment state and the trial's last checkpoint (model state + logits) are there
    assert any(p.startswith("sweeps/ray/s3-sweep/") for p in files)
    assert any(p.endswith("/state.pt") for p in files), files
    assert any(p.endswith("/logits.parquet") for p in files), files
    # the driver read the logits back through the same filesystem and logged them to MLflow
    client, children = _children(uri)
    assert len(children) == 1
    names = {a.path for a in client.list_artifacts(children[0].info.run_id)}
    assert "logits.parquet" in names


def test_missing_bucket_is_one_line_before_ray(s3_server, tmp_path):
    done = _sweep("ce", "--storage-path", "s3://no-such-bucket/ray", "--tracking-uri",
                  f"sqlite:///{tmp_path / 'm.db'}", env=s3_server, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "storage path s3://no-such-bucket/ray cannot be used" in lines[0]
    assert "no-such-bucket" in lines[0]
    assert "Started a local Ray" not in done.stderr


def test_relative_sqlite_refused_for_a_remote_cluster(tmp_path):
    done = _sweep("ce", "--address", "ray://10.255.0.1:10001", "--tracking-uri",
                  "sqlite:///mlruns.db", "--storage-path", str(tmp_path), timeout=120)
    assert done.returncode == 2
    assert "relative SQLite file" in done.stderr
    assert "use an MLflow server" in done.stderr


def test_unreachable_address_is_one_line(tmp_path):
    port = free_port()  # nothing listens there
    done = _sweep("ce", "--address", f"127.0.0.1:{port}", "--tracking-uri",
                  f"sqlite:///{tmp_path / 'm.db'}", "--storage-path", str(tmp_path), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: cannot reach the Ray cluster at --address "
                                   f"127.0.0.1:{port}: Connection refused")
