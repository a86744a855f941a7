"""Shared fixtures: one local Ray for the whole session, a real `mlflow server` on 127.0.0.1, a
real S3-compatible server, a real PostgreSQL and a team's `mlflow server` over both."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from clusters import (
    Postgres,
    free_port,
    postgres_binary,
    start_mlflow_server,
    start_postgres,
    start_s3_server,
    stop_process,
)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance (2 CPUs) shared by every integration test."""
    import ray

    from raysearch.tune.cluster import init_ray, quiet_ray_env

    quiet_ray_env()
    if not ray.is_initialized():
        from raysearch.tune.trainable import trial_env

        ray.init(address="local", num_cpus=2, log_to_driver=False, include_dashboard=False,
                 runtime_env={"env_vars": trial_env()})
    init_ray()  # no-op once initialised: what the CLI does
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` process on a free port of 127.0.0.1; yields its URI."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    proc = start_mlflow_server(root, port)
    yield f"http://127.0.0.1:{port}"
    stop_process(proc)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (moto's standalone server) on a free port of 127.0.0.1.

    Yields the environment a client needs (``AWS_ENDPOINT_URL`` and dummy credentials, which
    the server accepts); the process is stopped by its pid at the end of the session.
    """
    proc, env = start_s3_server(tmp_path_factory.mktemp("s3_server"))
    yield env
    stop_process(proc)


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL (Debian's ``postgresql`` package) on a free port of 127.0.0.1.

    Skips in one line where its programs or the Python driver are missing, or where root has
    no unprivileged ``postgres`` user to run it as; stopped by its pid at the end.
    """
    for program in ("initdb", "postgres"):
        if postgres_binary(program) is None:
            pytest.skip(f"PostgreSQL's {program} not found (apt-get install postgresql)")
    pytest.importorskip("psycopg", reason="psycopg not installed (pip install -e '.[dev]')")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and no 'postgres' user to run PostgreSQL as (PostgreSQL "
                        "refuses root; apt-get install postgresql creates the user)")
    server = start_postgres(free_port())
    yield server
    server.stop()


@dataclass
class TeamStore:
    """A team's tracking set-up: an `mlflow server` on PostgreSQL with its artifacts in S3.

    Attributes:
        tracking_uri: the server (``http://127.0.0.1:<port>``).
        env: what a driver's environment holds: S3's endpoint and credentials (Tune's storage)
            and ``PGPASSWORD`` (the Optuna study's database).
        postgres: the database server (its :meth:`~clusters.Postgres.create_database`).
        bucket: the S3 bucket; the server's artifacts are under ``s3://<bucket>/mlflow``.
    """

    tracking_uri: str
    env: dict[str, str]
    postgres: Postgres
    bucket: str


@pytest.fixture(scope="session")
def team_store(postgres_server, s3_server, tmp_path_factory):
    """``mlflow server --backend-store-uri postgresql://... --artifacts-destination s3://...``.

    The server's database password and S3 credentials are in its environment, not in its
    command line. Stopped by its pid at the end of the session.
    """
    import boto3

    bucket = "team"
    boto3.client("s3", endpoint_url=s3_server["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(
        Bucket=bucket)
    root = tmp_path_factory.mktemp("team_mlflow")
    port = free_port()
    proc = start_mlflow_server(
        root, port, backend_store_uri=postgres_server.create_database("mlflow"),
        artifacts_destination=f"s3://{bucket}/mlflow",
        env={**s3_server, **postgres_server.env,
             "MLFLOW_S3_ENDPOINT_URL": s3_server["AWS_ENDPOINT_URL"]})
    yield TeamStore(f"http://127.0.0.1:{port}", {**s3_server, **postgres_server.env},
                    postgres_server, bucket)
    stop_process(proc)


@pytest.fixture
def sqlite_uri(tmp_path):
    """A fresh SQLite tracking store in the test's tmp dir."""
    return f"sqlite:///{tmp_path / 'mlruns.db'}"


@pytest.fixture(scope="session")
def tabular_plugin(tmp_path_factory):
    """examples/tabular_calib installed with ``pip install --target DIR`` (DIR not on sys.path).

    Returns DIR: put it on PYTHONPATH (a subprocess) or ``sys.path`` (this process) to use the
    plug-in's entry-point names.
    """
    import shutil

    root = tmp_path_factory.mktemp("plugin")
    source = root / "src"
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "tabular_calib", source,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    target = root / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-build-isolation", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return target
