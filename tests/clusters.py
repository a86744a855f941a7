"""A Ray cluster of several nodes on this machine, for the cluster and fault tests."""

from __future__ import annotations

import socket
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
