"""Links into the MLflow UI, and a local ``mlflow ui`` for a raysearch store.

MLflow 3's UI opens an experiment in its GenAI view (traces, token usage); which view it shows
is the sidebar's workflow type, kept by the browser. A link whose hash route carries the query
``workflowType=machine_learning`` opens the model-training view (runs, metrics, artifacts).
The query belongs inside the fragment, ``http://127.0.0.1:5000/#/experiments/1/runs/<run
id>?workflowType=machine_learning``: placed before the ``#`` the UI ignores it.

No Ray here: ``raysearch ui`` and notebooks use this module without starting or importing Ray.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from raysearch.tracking.runs import PARENT_TAG, SWEEP_TAG

logger = logging.getLogger(__name__)

#: Hash-route query that makes MLflow 3's UI show its model-training view.
WORKFLOW_QUERY = "workflowType=machine_learning"


#: How long :func:`start_mlflow_ui` waits for the server to answer, in seconds.
START_TIMEOUT_S = 60.0


def _base(base_url: str) -> str:
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"`base_url` must be an http(s) URL, got {base_url!r}")
    return base_url.rstrip("/")


def _check_id(name: str, value: str) -> str:
    value = str(value).strip()
    if not value or "/" in value or "?" in value or "#" in value:
        raise ValueError(f"`{name}` must be a non-empty MLflow id, got {value!r}")
    return value


def run_link(base_url: str, experiment_id: str, run_id: str, *,
             artifact: str | None = None) -> str:
    """URL of a run in the MLflow UI, in its model-training view.

    Args:
        base_url (str): the UI's address, e.g. ``http://127.0.0.1:5000`` (see
            :func:`ui_base_url`).
        experiment_id (str): id of the run's experiment.
        run_id (str): the run's id.
        artifact (str, optional): path of one of the run's artifacts (``pareto.png``): the link
            then opens the run's Artifacts tab with that file previewed. Defaults to ``None``
            (the run's overview: metrics, params, tags).

    Returns:
        ``{base_url}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning``
        (with ``/artifacts/{artifact}`` before the ``?`` when `artifact` is given).

    Raises:
        ValueError: if `base_url` is not an http(s) URL, or an id is empty or holds ``/``,
            ``?`` or ``#``.
    """
    base = _base(base_url)
    path = (f"/experiments/{_check_id('experiment_id', experiment_id)}"
            f"/runs/{_check_id('run_id', run_id)}")
    if artifact:
        path += "/artifacts/" + urllib.parse.quote(artifact.strip("/"), safe="/")
    return f"{base}/#{path}?{WORKFLOW_QUERY}"


def experiment_link(base_url: str, experiment_id: str) -> str:
    """URL of an experiment's runs table in the MLflow UI, in its model-training view.

    A sweep's parent run is a row there; its trials (child runs) are nested under it (the
    row's ``+`` button shows them).

    Args:
        base_url (str): the UI's address, e.g. ``http://127.0.0.1:5000``.
        experiment_id (str): the experiment's id.

    Returns:
        ``{base_url}/#/experiments/{experiment_id}/runs?workflowType=machine_learning``.

    Raises:
        ValueError: if `base_url` is not an http(s) URL or `experiment_id` is not an id.
    """
    base = _base(base_url)
    return f"{base}/#/experiments/{_check_id('experiment_id', experiment_id)}/runs?{WORKFLOW_QUERY}"


def _connect_host(host: str) -> str:
    """Address a local browser reaches a server listening on `host` at."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


def ui_base_url(tracking_uri: str, host: str = "127.0.0.1", port: int = 5000) -> str:
    """Address of the MLflow UI that shows the runs of `tracking_uri`.

    Args:
        tracking_uri (str): the MLflow tracking URI.
        host (str, optional): interface ``raysearch ui`` serves a local store on. A wildcard
            (``0.0.0.0``, ``::``) gives the loopback address. Defaults to ``"127.0.0.1"``.
        port (int, optional): port it serves it on. Defaults to ``5000``.

    Returns:
        For an ``http(s)://`` tracking URI, that server's URL (an MLflow tracking server
        serves its UI at the same address); for a local store (``sqlite:///...``, a folder,
        a database URI), ``http://{host}:{port}``, where ``raysearch ui`` serves it.
    """
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return f"http://{_connect_host(host)}:{int(port)}"


def local_store_path(tracking_uri: str) -> Path | None:
    """The file or folder behind a local tracking URI.

    Args:
        tracking_uri (str): an MLflow tracking URI.

    Returns:
        The SQLite file of ``sqlite:///PATH``, the folder of ``file://PATH`` or of a plain path,
        ``None`` for servers and other databases.
    """
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri[len("sqlite:///"):])
    if tracking_uri.startswith("file://"):
        return Path(urllib.parse.urlparse(tracking_uri).path)
    if "://" not in tracking_uri and tracking_uri:
        return Path(tracking_uri)
    return None


def require_store(tracking_uri: str) -> None:
    """Check that a local tracking store exists (servers and databases are not checked).

    Call it before any ``MlflowClient`` touches the URI: MLflow creates a missing SQLite file,
    and an empty store would hide a wrong path.

    Args:
        tracking_uri (str): an MLflow tracking URI.

    Raises:
        ValueError: if the SQLite file or the store folder does not exist.
    """
    path = local_store_path(tracking_uri)
    if path is None or path.exists():
        return
    if tracking_uri.startswith("sqlite:///"):
        raise ValueError(f"no MLflow store at {path} (tracking URI {tracking_uri}): run a sweep "
                         "first, or pass --tracking-uri")
    raise ValueError(f"no MLflow store folder at {path} (tracking URI {tracking_uri})")


def get_experiment_id(client: Any, experiment: str) -> str:
    """Id of the active experiment named `experiment`.

    Args:
        client (MlflowClient): client of the store.
        experiment (str): the experiment's name.

    Returns:
        The experiment's id.

    Raises:
        ValueError: if the store has no active experiment of that name (lists the known ones).
    """
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":
        known = sorted(e.name for e in client.search_experiments())
        hint = f"; known: {', '.join(known)}" if known else ""
        raise ValueError(f"no experiment named '{experiment}' in {client.tracking_uri}{hint}")
    return exp.experiment_id


def latest_sweep(client: Any, experiment: str) -> Any | None:
    """The most recently started sweep of an experiment.

    A sweep is a parent run: it has the tag ``raysearch.sweep`` and no ``mlflow.parentRunId``.

    Args:
        client (MlflowClient): client of the store.
        experiment (str): the experiment's name.

    Returns:
        The parent run (an ``mlflow.entities.Run``) with the latest start time, or ``None`` if
        the experiment has no sweep yet.

    Raises:
        ValueError: if the experiment does not exist (see :func:`get_experiment_id`).
    """
    exp_id = get_experiment_id(client, experiment)
    runs = client.search_runs([exp_id],
                              filter_string=f"tags.`{SWEEP_TAG}` != '' "
                                            f"and tags.`{PARENT_TAG}` IS NULL",
                              order_by=["attributes.start_time DESC"], max_results=10)
    return next((r for r in runs if PARENT_TAG not in r.data.tags), None)


def has_artifact(client: Any, run_id: str, path: str) -> bool:
    """Whether run `run_id` has the top-level artifact `path` (``False`` if it cannot tell).

    Args:
        client (MlflowClient): client of the store.
        run_id (str): the run's id.
        path (str): a file name at the top of the run's artifacts, e.g. ``pareto.png``.

    Returns:
        ``True`` if the run's artifact listing holds `path`; ``False`` if not, or if listing
        fails (an unreachable artifact store must not stop a link from being printed).
    """
    try:
        return any(f.path == path for f in client.list_artifacts(run_id))
    except Exception as exc:  # any artifact-store error: no link to the file, nothing else
        logger.debug("cannot list the artifacts of run %s: %s", run_id, exc)
        return False


def check_port_free(host: str, port: int) -> None:
    """Check that a server could listen on `host`:`port` now.

    Args:
        host (str): interface address or name.
        port (int): TCP port.

    Raises:
        ValueError: if the port is in use, or the address cannot be listened on.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} is in use (another MLflow UI?): "
                                 "pick a free one with --port") from None
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _tail(log: Any) -> str:
    """The telling part of a server's stderr: its last error line, else its last two lines."""
    log.flush()
    log.seek(0)
    lines = [ln.strip() for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "exception" in ln.lower()]
    kept = errors[-1:] if errors else lines[-2:]
    return " | ".join(ln[:800] for ln in kept) or "(no output)"


def start_mlflow_ui(tracking_uri: str, *, host: str = "127.0.0.1", port: int = 5000,
                    artifacts_destination: str | None = None, workers: int = 1,
                    timeout: float = START_TIMEOUT_S) -> subprocess.Popen:
    """Start ``mlflow ui`` on a tracking store and wait until it answers HTTP.

    Runs ``python -m mlflow ui --backend-store-uri URI --host HOST --port PORT --workers N``
    with this interpreter, in a session of its own (a Ctrl-C in the terminal reaches the
    caller, which stops the server with :func:`stop_mlflow_ui`). Its request log is dropped;
    its stderr is kept for the error message. MLflow's job runner (GenAI jobs, two extra
    processes) is off unless ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION`` is set. Artifacts that
    raysearch logs sit at absolute ``file://`` locations, which the UI reads directly.

    Args:
        tracking_uri (str): the store (``sqlite:///ABS/PATH.db``, a folder, a database URI).
        host (str, optional): interface to listen on. Defaults to ``"127.0.0.1"``.
        port (int, optional): port to listen on (1-65535). Defaults to ``5000``.
        artifacts_destination (str, optional): where the server stores artifacts uploaded
            through it (``--artifacts-destination``). Defaults to ``None``: ``mlartifacts``
            beside a SQLite file (where raysearch puts its experiments' artifacts), else
            MLflow's default.
        workers (int, optional): uvicorn workers. Defaults to ``1``, plenty for one user:
            MLflow's default (4 workers and its job runner) took 33 s to start on 2 cores, one
            worker without the runner 5 s.
        timeout (float, optional): seconds to wait for the server to answer. Defaults to
            :data:`START_TIMEOUT_S`.

    Returns:
        The running ``mlflow ui`` process (``subprocess.Popen``); stop it with
        :func:`stop_mlflow_ui`.

    Raises:
        ValueError: if a local store is missing (see :func:`require_store`), `port` is out of
            range, or `host`:`port` cannot be listened on (in use, unknown address).
        RuntimeError: if the server exits before it answers, or does not answer within
            `timeout` seconds (then it is stopped); the message holds the last lines of its
            stderr.
    """
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"`port` must be in 1-65535, got {port}")
    if workers < 1:
        raise ValueError(f"`workers` must be >= 1, got {workers}")
    require_store(tracking_uri)
    check_port_free(host, int(port))
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri,
           "--host", host, "--port", str(int(port)), "--workers", str(workers)]
    if artifacts_destination is None and tracking_uri.startswith("sqlite:///"):
        artifacts_destination = str(Path(tracking_uri[len("sqlite:///"):]).parent / "mlartifacts")
    if artifacts_destination is not None:
        cmd += ["--artifacts-destination", artifacts_destination]
    env = dict(os.environ)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    url = f"http://{_connect_host(host)}:{int(port)}/health"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=log, env=env, start_new_session=True)
        try:
            _wait_until_up(proc, url, log, timeout)
        except BaseException:  # failed, timed out, or Ctrl-C while waiting: leave no server
            stop_mlflow_ui(proc)
            raise
    logger.info("mlflow ui (pid %d) answers on %s", proc.pid, url)
    return proc


def _wait_until_up(proc: subprocess.Popen, url: str, log: Any, timeout: float) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a local server
    deadline = time.monotonic() + timeout
    while True:
        try:
            with opener.open(url, timeout=2) as resp:
                answered = resp.status == 200
        except (urllib.error.URLError, OSError):
            answered = False
        code = proc.poll()
        if code is not None:
            # mlflow ui exits with code 0 when its port is taken: any exit is a failure here
            raise RuntimeError(f"mlflow ui exited (code {code}) before it answered on "
                               f"{url}: {_tail(log)}")
        if answered:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"mlflow ui did not answer on {url} within {timeout:.0f} s: "
                               f"{_tail(log)}")
        time.sleep(0.25)


def stop_mlflow_ui(proc: subprocess.Popen, timeout: float = 20.0) -> int:
    """Stop a server started by :func:`start_mlflow_ui` (no-op if it has exited).

    Sends SIGTERM to its pid (``mlflow ui`` passes it on to its uvicorn workers); after
    `timeout` seconds kills its whole process group, the session it was started in.

    Args:
        proc (subprocess.Popen): the process :func:`start_mlflow_ui` returned.
        timeout (float, optional): seconds to wait after SIGTERM. Defaults to ``20.0``.

    Returns:
        The server's exit code.
    """
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning("mlflow ui (pid %d) ignored SIGTERM for %.0f s: killing it",
                           proc.pid, timeout)
            try:
                if os.getpgid(proc.pid) == proc.pid:  # its own session: take its workers too
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
            except ProcessLookupError:
                pass
            proc.wait()
    return proc.returncode
