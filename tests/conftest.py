"""Shared fixtures: one local Ray for the whole session, a real `mlflow server` on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from clusters import start_mlflow_server, stop_process

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` process on a free port of 127.0.0.1; yields its URI."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = _free_port()
    proc = start_mlflow_server(root, port)
    yield f"http://127.0.0.1:{port}"
    stop_process(proc)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (moto's standalone server) on a free port of 127.0.0.1.

    Yields the environment a client needs (``AWS_ENDPOINT_URL`` and dummy credentials, which
    the server accepts); the process is stopped by its pid at the end of the session.
    """
    root = tmp_path_factory.mktemp("s3_server")
    port = _free_port()
    log = open(root / "server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start: "
                                   f"{(root / 'server.log').read_text()[-2000:]}") from None
            time.sleep(0.3)
    yield {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


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
