"""A sweep's name and record: what identifies it in MLflow and what ``--resume`` reads.

A sweep is named ``<space>-<YYYYmmdd-HHMMSS>`` unless ``--name`` says otherwise
(:func:`default_sweep_name`); a name is one folder under the storage path
(:func:`~raysearch.tune.storage.check_sweep_name`) used once per experiment
(:func:`check_new_sweep_name`). Its parent run holds :data:`SWEEP_RECORD`, the settings and the
search space (:func:`load_record`), and the tag naming the driver process
(:func:`driver_id`, :func:`driver_alive`).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from raysearch import tracking
from raysearch.tune.spaces import SearchSpace
from raysearch.tune.storage import MAX_NAME_CHARS, NAME_CHARS, check_sweep_name

__all__ = ["SWEEP_RECORD", "check_new_sweep_name", "default_sweep_name", "driver_alive",
           "driver_id", "load_record"]

#: Parent-run artifact holding what ``--resume`` needs: the settings and the search space.
SWEEP_RECORD = "sweep.json"


def default_sweep_name(space: SearchSpace) -> str:
    """``<space>-<YYYYmmdd-HHMMSS>``, a valid sweep name (:func:`check_sweep_name`).

    Characters of the space's name that a sweep name cannot hold become ``_``, and the name
    is cut to leave room for the time stamp.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = "".join(c if c.isalnum() or c in NAME_CHARS else "_" for c in space.name)
    base = base.lstrip(".-")[:MAX_NAME_CHARS - len(stamp) - 1] or "sweep"
    return f"{base}-{stamp}"


def check_new_sweep_name(client: Any, experiment: str, name: str) -> None:
    """Refuse an unusable sweep name, or one the experiment already holds.

    Raises:
        ValueError: one line naming what is wrong (:func:`check_sweep_name`), or the existing
            sweep and suggesting ``--resume`` (its runs would be mixed up).
    """
    check_sweep_name(name)
    if client.get_experiment_by_name(experiment) is None:
        return
    try:
        parent = tracking.find_sweep(client, name, experiment, known=False)
    except ValueError:
        return
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(parent.info.start_time / 1000))
    raise ValueError(f"a sweep named '{name}' already exists in experiment '{experiment}' "
                     f"(started {started}, {parent.info.status}): continue it with "
                     f"`raysearch sweep --resume {name}` or choose another --name")


def driver_id() -> str:
    """``<host>:<pid>`` of this driver process (the parent run's ``raysearch.driver`` tag)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def driver_alive(tag: str) -> bool:
    """True when `tag` (``<host>:<pid>``) names a live process of this machine other than us."""
    host, _, pid = tag.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def load_record(client: Any, parent_id: str, name: str) -> dict[str, Any]:
    """The sweep's record (:data:`SWEEP_RECORD`) from its parent run.

    Raises:
        ValueError: if the parent run holds none.
    """
    names = {a.path for a in client.list_artifacts(parent_id)}
    if SWEEP_RECORD not in names:
        raise ValueError(f"sweep '{name}' has no {SWEEP_RECORD} record (it was started by an "
                         "older raysearch) and cannot be resumed")
    with tempfile.TemporaryDirectory() as d:
        local = client.download_artifacts(parent_id, SWEEP_RECORD, d)
        return json.loads(Path(local).read_text())
