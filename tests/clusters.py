"""Processes the cluster, fault and team-store tests start: a Ray cluster of several nodes on
this machine, a real `mlflow server` that a drill can stop and start again, a real S3-compatible
server, a real PostgreSQL."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
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


def start_mlflow_server(root: Path, port: int, *, timeout: float = 120.0,
                        backend_store_uri: str | None = None,
                        artifacts_destination: str | None = None,
                        env: dict[str, str] | None = None) -> subprocess.Popen:
    """A real `mlflow server` on 127.0.0.1:`port`, its log in `root`.

    Its store is `backend_store_uri` (default: SQLite in `root`), its artifacts go to
    `artifacts_destination` (default: a folder of `root`); `env`: more variables of the server
    (a database password, S3 credentials). Returns once its ``/health`` answers; the caller
    stops it (:func:`stop_process`). Started again on the same `root` and `port`, it serves the
    same store (a server that came back).
    """
    log = open(root / "server.log", "a")  # noqa: SIM115 (the process writes it)
    env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING", **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", backend_store_uri or f"sqlite:///{root / 'server.db'}",
         "--artifacts-destination", artifacts_destination or str(root / "artifacts"),
         "--workers", "1"],
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


def start_s3_server(root: Path, *,
                    timeout: float = 60.0) -> tuple[subprocess.Popen, dict[str, str]]:
    """moto's standalone S3 server on a free port of 127.0.0.1, its log in `root`.

    Returns:
        The process (stop it with :func:`stop_process`) and the environment a client needs:
        ``AWS_ENDPOINT_URL`` and dummy credentials, which the server accepts.

    Raises:
        RuntimeError: with the end of its log, when it does not answer within `timeout` s.
    """
    port = free_port()
    with open(root / "moto.log", "w") as log:  # the process keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                 str(port)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc, kill=True)
                raise RuntimeError(f"moto server did not start: "
                                   f"{(root / 'moto.log').read_text()[-2000:]}") from None
            time.sleep(0.3)
    return proc, {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                  "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


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


def postgres_binary(name: str) -> str | None:
    """PostgreSQL's program `name` (``initdb``, ``postgres``): on ``PATH``, else where Debian's
    ``postgresql`` package puts it (``/usr/lib/postgresql/<major>/bin``, the newest); None."""
    found = shutil.which(name)
    if found:
        return str(Path(found).resolve())
    folders = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                     key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    for folder in reversed(folders):
        if (folder / name).is_file():
            return str(folder / name)
    return None


@dataclass
class Postgres:
    """A PostgreSQL server this test session started on 127.0.0.1 (:func:`start_postgres`).

    Its superuser :attr:`user` logs in over TCP with :attr:`password` (SCRAM); clients take the
    password from ``PGPASSWORD`` (:attr:`env`), never from a URL.
    """

    proc: subprocess.Popen
    port: int
    root: Path
    user: str
    password: str

    @property
    def env(self) -> dict[str, str]:
        """What a client's environment needs: the password (``PGPASSWORD``)."""
        return {"PGPASSWORD": self.password}

    def uri(self, database: str) -> str:
        """The SQLAlchemy URL of `database`, without the password."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> Any:
        """A psycopg2 connection to `database` (the caller closes it)."""
        import psycopg2

        return psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user,
                                password=self.password, dbname=database, connect_timeout=5)

    def create_database(self, name: str) -> str:
        """Create database `name`; return its URL (:meth:`uri`)."""
        conn = self.connect()
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.uri(name)

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster this session started), then remove its files."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres(port: int, *, timeout: float = 60.0) -> Postgres:
    """A fresh PostgreSQL cluster (``initdb``) served by ``postgres`` on 127.0.0.1:`port`.

    PostgreSQL refuses to run as root: as root, both run as the unprivileged ``postgres`` user
    (``setpriv``, which execs, so the process this returns is the postmaster itself), in a
    temporary folder that user owns; otherwise as the current user. Durability is off (fsync,
    synchronous commits): a test's database. The caller stops it (:meth:`Postgres.stop`).

    Raises:
        RuntimeError: if a binary is missing, no unprivileged user exists, or it does not start.
    """
    initdb, postgres = postgres_binary("initdb"), postgres_binary("postgres")
    if initdb is None or postgres is None:
        raise RuntimeError("PostgreSQL's initdb/postgres not found")
    root = Path(tempfile.mkdtemp(prefix="raysearch-pg-"))
    demote: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")  # KeyError: no such user
        os.chown(root, user.pw_uid, user.pw_gid)
        demote = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                  "--init-groups", "--"]
    password = secrets.token_hex(12)
    (root / "pw").write_text(password + "\n")
    if demote:
        os.chown(root / "pw", user.pw_uid, user.pw_gid)
    done = subprocess.run([*demote, initdb, "-D", str(root / "data"), "-U", "raysearch",
                           f"--pwfile={root / 'pw'}", "--auth-host=scram-sha-256",
                           "--auth-local=trust", "-E", "UTF8", "--no-sync"],
                          capture_output=True, text=True, cwd=root, timeout=120)
    (root / "pw").unlink()
    if done.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {done.stderr[-2000:]}")
    log = open(root / "server.log", "w")  # noqa: SIM115 (the process writes it)
    proc = subprocess.Popen(
        [*demote, postgres, "-D", str(root / "data"), "-h", "127.0.0.1", "-p", str(port),
         "-k", str(root), "-c", "fsync=off", "-c", "synchronous_commit=off",
         "-c", "full_page_writes=off"],
        stdout=log, stderr=subprocess.STDOUT, cwd=root)
    log.close()
    server = Postgres(proc, port, root, "raysearch", password)
    deadline = time.monotonic() + timeout
    while True:
        try:
            server.connect().close()
            return server
        except Exception:  # noqa: BLE001 (psycopg2.OperationalError while it starts)
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (root / "server.log").read_text()[-2000:]
                server.stop()
                raise RuntimeError(f"postgres did not start: {tail}") from None
            time.sleep(0.3)
