"""Processes the cluster and fault tests start: a Ray cluster of several nodes on this machine,
and a real `mlflow server` that a drill can stop and start again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_cluster(head_cpus: int, *worker_cpus: int, dashboard: bool = False) -> Any:
    """A ``ray.cluster_utils.Cluster``: a head and one worker node per entry of `worker_cpus`.

    Each node's dashboard agent gets its own port: with several nodes on one IP the default
    (52365) would be taken by whichever agent binds first. The caller shuts it down.
    """
    from ray.cluster_utils import Cluster

    head = {"num_cpus": head_cpus, "dashboard_agent_listen_port": free_port()}
    if dashboard:
        head.update(include_dashboard=True, dashboard_port=free_port())
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for cpus in worker_cpus:
        cluster.add_node(num_cpus=cpus, dashboard_agent_listen_port=free_port())
    cluster.wait_for_nodes()
    return cluster


def start_mlflow_server(root: Path, port: int, *, timeout: float = 120.0) -> subprocess.Popen:
    """A real `mlflow server` on 127.0.0.1:`port` over the SQLite store and artifacts in `root`.

    Returns once its ``/health`` answers; the caller stops it (:func:`stop_process`). Started
    again on the same `root` and `port`, it serves the same store (a server that came back).
    """
    log = open(root / "server.log", "a")  # noqa: SIM115 (the process writes it)
    env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root / 'server.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
        start_new_session=True)  # its own process group: the server's workers stop with it
    log.close()
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                tail = (root / "server.log").read_text()[-2000:]
                raise RuntimeError(f"mlflow server did not start: {tail}") from None
            time.sleep(0.5)


def stop_process(proc: subprocess.Popen, timeout: float = 20.0, *, kill: bool = False) -> None:
    """Stop a process this test started, with the process group it leads (by its pid).

    SIGTERM, then SIGKILL after `timeout`; `kill`: SIGKILL at once (a crash, not a shutdown).
    """
    def signal_group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):  # gone, or not a group leader
            proc.send_signal(sig)

    signal_group(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        signal_group(signal.SIGKILL)
        proc.wait()
