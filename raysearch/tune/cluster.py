"""The Ray cluster a sweep runs on: starting or joining it, and checking it can run the sweep.

:func:`init_ray` starts a local Ray or connects to ``--address`` (shipping the user's code to a
remote cluster), :func:`quiet_ray_env` silences Ray's and Optuna's noise; the checks fail in one
line before anything is written: an unreachable address (:func:`check_ray_address`), a relative
SQLite tracking file on a remote cluster (:func:`check_tracking_for_cluster`), CPUs or GPUs per
trial that the cluster cannot grant (:func:`check_resources`; on a cluster with an autoscaler a
bounded wait for them).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import optuna
import ray

from raysearch.tune.settings import RAY_JOB_ENV, Resources
from raysearch.tune.trainable import trial_env

__all__ = ["RESOURCE_WAIT_S", "check_gpus", "check_ray_address", "check_resources",
           "check_tracking_for_cluster", "in_ray_job", "init_ray", "is_remote_address",
           "quiet_ray_env", "trial_bundles", "unmet_resources"]

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


#: Seconds a sweep on a cluster waits for an autoscaler to add the nodes its trials need
#: (environment variable ``RAYSEARCH_RESOURCE_WAIT_S`` overrides it).
RESOURCE_WAIT_S = 600.0


def trial_bundles(resources: Resources) -> tuple[list[dict[str, float]], dict[str, str]]:
    """What one trial needs placed on the cluster, and the options asking for CPUs and GPUs.

    A one-process trial is one bundle ``{"CPU": cpus_per_trial, "GPU": gpus_per_trial}``; a
    DDP trial is ``workers_per_trial`` bundles of ``cpus_per_worker`` and ``gpus_per_worker``
    (its coordinator holds no CPU: :func:`~raysearch.tune.trainable.trial_resources`).

    Returns:
        (bundles, ``{"CPU": "--cpus-per-trial 2", "GPU": "--gpus-per-trial 1"}``).
    """
    workers = resources.workers_per_trial
    if workers > 1:
        bundle = {"CPU": resources.cpus_per_worker, "GPU": resources.gpus_per_worker}
        return [bundle] * workers, {
            "CPU": f"--workers-per-trial {workers} --cpus-per-worker "
                   f"{resources.cpus_per_worker:g}",
            "GPU": f"--workers-per-trial {workers} --gpus-per-worker "
                   f"{resources.gpus_per_worker:g}"}
    bundle = {"CPU": resources.cpus_per_trial, "GPU": resources.gpus_per_trial}
    return [bundle], {"CPU": f"--cpus-per-trial {resources.cpus_per_trial:g}",
                      "GPU": f"--gpus-per-trial {resources.gpus_per_trial:g}"}


def unmet_resources(bundles: list[dict[str, float]], options: dict[str, str], where: str, *,
                    nodes: list[dict[str, float]] | None = None,
                    total: dict[str, float] | None = None) -> str | None:
    """Why the Ray cluster cannot run one trial of `bundles`, or None.

    Every bundle must fit on one alive node, and all of them together in the cluster.

    Args:
        bundles: what one trial needs placed (:func:`trial_bundles`).
        options: the options asking for CPUs and GPUs, for the message.
        where: ``"this machine"`` or ``"the Ray cluster"``, for the message.
        nodes: each alive node's resources (``{"CPU": 8.0, "GPU": 1.0, ...}``); None: those of
            ``ray.nodes()`` now.
        total: the cluster's resources; None: ``ray.cluster_resources()`` now.

    Returns:
        One line naming the options, what a trial needs and what there is; None when it fits.
    """
    if nodes is None:
        nodes = [{k: float(v) for k, v in node.get("Resources", {}).items()}
                 for node in ray.nodes() if node.get("Alive")]
    if total is None:
        total = {k: float(v) for k, v in ray.cluster_resources().items()}
    for kind, unit in (("GPU", "GPU"), ("CPU", "CPUs")):
        per_trial = sum(b[kind] for b in bundles)
        if not per_trial:
            continue
        have, option = total.get(kind, 0.0), options[kind]
        if have < per_trial:
            hint = "; leave the GPU options out to train on the CPU" if kind == "GPU" else ""
            return f"{option} needs {per_trial:g} {unit} per trial but {where} has {have:g}{hint}"
        largest = max((node.get(kind, 0.0) for node in nodes), default=0.0)
        if max(b[kind] for b in bundles) > largest:
            return (f"{option} needs {max(b[kind] for b in bundles):g} {unit} on one node but "
                    f"the largest node of {where} has {largest:g}")
    return None


def check_resources(resources: Resources, address: str | None, *,
                    wait_s: float | None = None) -> None:
    """Fail in one line when no trial can ever get the CPUs and GPUs it asks for.

    Checked against the Ray cluster (``ray.cluster_resources()`` and each alive node) after
    :func:`init_ray` and before the Tuner starts, which would otherwise wait for them forever.
    On this machine that is an error at once. On a cluster (`address`, or a Ray Job) an
    autoscaler may still add nodes: a warning, a request for them
    (``ray.autoscaler.sdk.request_resources``), and an error when they have not come after
    `wait_s` seconds.

    Args:
        resources: what each trial asks for.
        address: the sweep's ``--address``.
        wait_s: seconds to wait on a cluster; None: ``$RAYSEARCH_RESOURCE_WAIT_S`` or
            :data:`RESOURCE_WAIT_S`.

    Raises:
        ValueError: naming the options, what one trial needs and what the cluster has.
    """
    bundles, options = trial_bundles(resources)
    cluster = bool(address and address != "local") or in_ray_job()
    where = "the Ray cluster" if cluster else "this machine"
    problem = unmet_resources(bundles, options, where)
    if problem is None:
        return
    if not cluster:
        raise ValueError(problem)
    if wait_s is None:
        wait_s = float(os.environ.get("RAYSEARCH_RESOURCE_WAIT_S", RESOURCE_WAIT_S))
    logger.warning("%s: waiting up to %g s for an autoscaler to add nodes", problem, wait_s)
    _request_resources(bundles)
    deadline = time.monotonic() + wait_s
    try:
        while problem is not None and time.monotonic() < deadline:
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
            problem = unmet_resources(bundles, options, where)
    finally:
        _request_resources([])  # the trials' own requests take over
    if problem is not None:
        raise ValueError(f"{problem}, after waiting {wait_s:g} s for an autoscaler to add "
                         "nodes (RAYSEARCH_RESOURCE_WAIT_S sets how long)")


def _request_resources(bundles: list[dict[str, float]]) -> None:
    """Ask the cluster's autoscaler for `bundles` (none: withdraw the request); best effort."""
    try:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[{k: v for k, v in b.items() if v} for b in bundles])
    except Exception as exc:  # noqa: BLE001 (a cluster without an autoscaler)
        logger.debug("request_resources failed: %s", exc)


#: :func:`check_resources` under the name :mod:`raysearch.tune.resume` calls.
check_gpus = check_resources
