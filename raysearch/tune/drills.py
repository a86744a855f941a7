"""Fault drills: a trial that fails on purpose, to exercise a cluster's retry path.

``raysearch sweep --fault-drill EPOCH`` makes the first attempt of every trial fail at epoch
EPOCH (``--max-failures`` then retries it from its last checkpoint); the kinds of
:data:`~raysearch.tune.settings.FAULT_KINDS`:

- ``raise``: the attempt raises :class:`InjectedFault` right after reporting the epoch;
- ``kill-in-checkpoint``: the attempt writes that epoch's state truncated to half its bytes as
  ``state.pt`` into the trial's next ``checkpoint_<index>`` folder in storage (what a copy
  interrupted by a kill leaves; Tune never registers it), then SIGKILLs its own process, so
  Ray sees a dead worker (:func:`kill_in_checkpoint`);
- ``corrupt-checkpoint``: after reporting the epoch, the attempt truncates the ``state.pt`` of
  its newest checkpoint in storage, then raises (:func:`truncate_newest_checkpoint`).

A retry that found no readable checkpoint starts from scratch but does not drill again.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import torch
from ray import tune

from raysearch.tune.checkpoints import STATE_FILE, storage_name

__all__ = ["InjectedFault", "kill_in_checkpoint", "truncate_newest_checkpoint"]


class InjectedFault(RuntimeError):
    """Raised by a fault drill (``--fault-drill``): Tune retries the trial."""


def _trial_storage() -> tuple[Any, str, int]:
    """The trial's storage filesystem, its folder there, and its last checkpoint's index."""
    storage = tune.get_context().get_storage()
    return storage.storage_filesystem, storage.trial_fs_path, storage.current_checkpoint_index


def kill_in_checkpoint(state: dict[str, Any]) -> None:
    """Drill ``kill-in-checkpoint``: leave a torn checkpoint, then SIGKILL this process.

    Writes `state` truncated to half its bytes as ``state.pt`` into the trial's next
    ``checkpoint_<index>`` folder in storage (the folder Tune would persist the next
    checkpoint to), as a copy interrupted by a kill leaves it; Tune never registers it.
    Never returns.
    """
    fs, trial, index = _trial_storage()
    with tempfile.TemporaryDirectory() as d:  # the bytes the complete checkpoint would hold
        torch.save(state, Path(d) / STATE_FILE)
        data = (Path(d) / STATE_FILE).read_bytes()
    folder = f"{trial}/checkpoint_{index + 1:06d}"
    fs.create_dir(folder)
    with fs.open_output_stream(f"{folder}/{STATE_FILE}") as stream:
        stream.write(data[: len(data) // 2])
    logging.getLogger(__name__).warning("fault drill: torn checkpoint %s written; killing this "
                                        "worker", storage_name(fs, f"{folder}/{STATE_FILE}"))
    os.kill(os.getpid(), signal.SIGKILL)


def truncate_newest_checkpoint() -> str:
    """Drill ``corrupt-checkpoint``: cut the newest checkpoint's ``state.pt`` in half.

    Returns:
        The file's path in the storage, or ``"no checkpoint"`` when the trial has none yet.
    """
    fs, trial, index = _trial_storage()
    if index < 0:
        return "no checkpoint"
    path = f"{trial}/checkpoint_{index:06d}/{STATE_FILE}"
    with fs.open_input_stream(path) as stream:
        data = stream.read()
    with fs.open_output_stream(path) as stream:
        stream.write(data[: len(data) // 2])
    return storage_name(fs, path)
