"""The Ray cluster a sweep runs on: starting or joining it, and checking it can run the sweep.

:func:`init_ray` starts a local Ray or connects to ``--address`` (shipping the user's code to a
remote cluster), :func:`quiet_ray_env` silences Ray's and Optuna's noise; the checks fail in one
line before anything is written: an unreachable address (:func:`check_ray_address`), a relative
SQLite tracking file on a remote cluster (:func:`check_tracking_for_cluster`), GPUs the cluster
does not have (:func:`check_gpus`).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import optuna
import ray

from raysearch.tune.settings import RAY_JOB_ENV, Resources
from raysearch.tune.trainable import trial_env

__all__ = ["check_gpus", "check_ray_address", "check_tracking_for_cluster", "in_ray_job",
           "init_ray", "is_remote_address", "quiet_ray_env"]

logger = logging.getLogger(__name__)


def quiet_ray_env() -> None:
    """Silence the noise users see from Ray and Optuna in a sweep (see the stack notes)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # a diverged trial's last report carries no metrics (it is recorded FAILED, not scored)
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # our own progress lines report every trial (failures included); Tune's summaries of the
    # same events and its "could not fetch metrics" notes (no result.json by design) are noise
    for name in ("ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def init_ray(address: str | None = None, modules: tuple[str, ...] = ()) -> None:
    """Connect to `address` or start a local Ray, unless Ray is already initialised.

    On a remote cluster (:func:`is_remote_address`) the user's own packages and modules
    (`modules`: what :func:`~raysearch.tune.plan.make_plan` found behind the import strings
    and callables) are shipped with Ray's ``runtime_env`` ``py_modules``, so every worker
    imports them as the driver does. A local Ray needs nothing shipped: its workers start with
    the driver's current directory and ``PYTHONPATH`` on their path.
    """
    quiet_ray_env()
    if ray.is_initialized():
        return
    runtime_env: dict[str, Any] = {"env_vars": trial_env()}
    if modules and is_remote_address(address):
        runtime_env["py_modules"] = list(modules)
    ray.init(address=address, log_to_driver=False, configure_logging=True,
             logging_level=logging.WARNING, runtime_env=runtime_env)


def in_ray_job() -> bool:
    """True when this process is a Ray Job's entrypoint (its cwd is a temporary copy)."""
    return RAY_JOB_ENV in os.environ


def is_remote_address(address: str | None) -> bool:
    """True when the sweep's driver-side work may run away from this machine's cwd.

    A Ray Client address (``ray://``, even tunnelled to 127.0.0.1: Tune then runs the sweep on
    the head node) or a cluster on another host; ``auto``/``local``/None and a GCS address on
    this machine are local.
    """
    if not address or address in ("local", "auto"):
        return False
    if address.startswith("ray://"):
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def check_tracking_for_cluster(uri: str | None, address: str | None) -> None:
    """Refuse a relative SQLite tracking URI when the sweep runs on a remote cluster.

    The MLflow records are written by the sweep's driver-side callback, which runs where Tune's
    controller runs: on the head node for a Ray Client address (``ray://``) or a Ray Job, whose
    working directory is a temporary copy that vanishes with the job. A relative SQLite file
    (including the default ``./mlruns.db``) would land there. An ``http(s)://`` tracking
    server, a database URI or an absolute SQLite path that exists where the driver runs is
    accepted.

    Args:
        uri (str | None): the tracking URI as the user gave it (``--tracking-uri`` or
            ``$MLFLOW_TRACKING_URI``); None means the default ``./mlruns.db``.
        address (str | None): ``--address``.

    Raises:
        ValueError: one line saying why and what to use instead.
    """
    if not is_remote_address(address) and not in_ray_job():
        return
    if uri is not None and (not uri.startswith("sqlite:///") or uri.startswith("sqlite:////")):
        return
    uri = uri or "sqlite:///mlruns.db (the default)"
    where = (f"--address {address} runs the sweep on a remote Ray cluster"
             if is_remote_address(address) else "this sweep runs as a Ray Job")
    raise ValueError(f"--tracking-uri {uri} is a relative SQLite file, but {where}, where the "
                     "driver's working folder may be a temporary copy: use an MLflow server "
                     "(--tracking-uri http://HOST:5000) or an absolute sqlite:////path")


def check_ray_address(address: str | None, *, timeout: float = 5.0) -> None:
    """Fail in one line when `address` (``host:port`` or ``ray://host:port``) is unreachable.

    ``ray.init`` would otherwise retry for minutes. ``auto``, ``local`` and None are not probed.

    Raises:
        ValueError: naming the address and the socket error.
    """
    if not address or address in ("auto", "local"):
        return
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--address {address}: expected host:port or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ValueError(f"cannot reach the Ray cluster at --address {address}: "
                         f"{exc.strerror or exc}") from None


def check_gpus(resources: Resources, address: str | None) -> None:
    """Fail in one line when trials ask for GPUs that the Ray cluster does not have.

    Args:
        resources: what each trial asks for.
        address: the sweep's ``--address`` (on a cluster, an autoscaler may still add GPU
            nodes: a warning, and Ray waits for them).

    Raises:
        ValueError: on this machine, naming the option, the GPUs wanted and those there are.
    """
    if resources.workers_per_trial > 1:
        wanted = resources.workers_per_trial * resources.gpus_per_worker
        option = f"--workers-per-trial {resources.workers_per_trial} --gpus-per-worker " \
                 f"{resources.gpus_per_worker:g}"
    else:
        wanted = resources.gpus_per_trial
        option = f"--gpus-per-trial {resources.gpus_per_trial:g}"
    if not wanted:
        return
    have = float(ray.cluster_resources().get("GPU", 0))
    if have >= wanted:
        return
    cluster = bool(address) or in_ray_job()
    where = "the Ray cluster" if cluster else "this machine"
    message = (f"{option} needs {wanted:g} GPU per trial but {where} has {have:g}; "
               "leave the GPU options out to train on the CPU")
    if cluster:
        # an autoscaling cluster may still add GPU nodes: say it, and let Ray wait for them
        logger.warning("%s (waiting for the autoscaler to add GPU nodes)", message)
        return
    raise ValueError(message)
