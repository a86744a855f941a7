"""A trial's checkpoints: writing them through Tune, reading them back, skipping torn ones.

A checkpoint is a folder holding :data:`STATE_FILE` (the epoch, the model, optimizer and
scheduler state dicts and the epoch's metrics: tensors and plain containers only), read back
with ``torch.load(weights_only=True)`` (:func:`load_state`), beside the files of the trial's
last report (the reliability diagram, ``logits.parquet``, ...). Tune keeps a trial's
checkpoints as ``checkpoint_<index>`` folders of its storage (a local folder or a URI such as
``s3://``), which :func:`trial_checkpoints` lists and :func:`resume_state` searches for the
newest readable one.
"""

from __future__ import annotations

import io
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from ray import tune

__all__ = ["CHECKPOINT_FOLDER", "STATE_FILE", "load_state", "read_state", "report",
           "resume_state", "storage_name", "trial_checkpoints"]

#: The training state inside a checkpoint folder.
STATE_FILE = "state.pt"
#: A trial's checkpoint folders in its storage: ``checkpoint_<index>`` (Tune's names).
CHECKPOINT_FOLDER = re.compile(r"checkpoint_(\d+)")


def report(metrics: dict[str, Any], files: Path | dict[str, bytes] | None) -> None:
    """``tune.report(metrics)``, with a checkpoint of the folder or the files when given.

    Args:
        metrics: the report.
        files: None (no checkpoint), a folder whose files become the checkpoint, or
            ``{file name: bytes}`` (a DDP trial's rank 0 sends its files as bytes).
    """
    if files is None:
        tune.report(metrics)
    elif isinstance(files, Path):
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(files))
    else:
        with tempfile.TemporaryDirectory() as d:
            for name, content in files.items():
                (Path(d) / name).write_bytes(content)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))


def load_state(data: bytes) -> dict[str, Any]:
    """Read a trial checkpoint's ``state.pt`` bytes with ``torch.load(weights_only=True)``.

    Only tensors and plain containers are accepted (no code is unpickled from the storage
    path); tensors land on the CPU.

    Raises:
        ValueError: if the file holds anything else (e.g. a checkpoint that pickled arbitrary
            objects) or is not a checkpoint state.
    """
    try:
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # pickle.UnpicklingError and friends
        raise ValueError(f"trial checkpoint {STATE_FILE} cannot be read with weights_only=True "
                         f"(tensors and plain containers only): {' '.join(str(exc).split())[:300]}"
                         ) from None
    if not isinstance(state, dict) or "epoch" not in state:
        raise ValueError(f"trial checkpoint {STATE_FILE} is not a training state (no 'epoch')")
    return state


def storage_name(filesystem: Any, path: str) -> str:
    """`path` on `filesystem` as a user finds it: a local path, else ``<scheme>://<path>``."""
    kind = getattr(filesystem, "type_name", "local")
    return path if kind == "local" or "::" in kind else f"{kind}://{path}"


def read_state(filesystem: Any, folder: str) -> tuple[bytes, int]:
    """``state.pt`` of the checkpoint `folder` on `filesystem`: its bytes and epoch.

    Raises:
        OSError: if the file is missing or cannot be read.
        ValueError: if it is not a readable training state (:func:`load_state`).
    """
    with filesystem.open_input_stream(f"{folder}/{STATE_FILE}") as stream:
        data = stream.read()
    return data, int(load_state(data)["epoch"])


def _why(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "missing"
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def trial_checkpoints(filesystem: Any, folder: str) -> list[tuple[int, str]]:
    """``(index, path)`` of the ``checkpoint_<index>`` folders in a trial's `folder`, newest first.

    Args:
        filesystem: the storage's ``pyarrow.fs.FileSystem``.
        folder: the trial's folder on it (an unreadable one has none).
    """
    import pyarrow.fs

    try:
        infos = filesystem.get_file_info(pyarrow.fs.FileSelector(folder))
    except OSError:
        return []
    found = [(int(m.group(1)), info.path) for info in infos
             if info.type == pyarrow.fs.FileType.Directory
             and (m := CHECKPOINT_FOLDER.fullmatch(info.base_name)) is not None]
    return sorted(found, reverse=True)


def resume_state(checkpoint: tune.Checkpoint) -> tuple[bytes | None, str | None]:
    """The ``state.pt`` bytes to resume from, given the checkpoint Tune returned.

    When the checkpoint's ``state.pt`` cannot be read (missing, truncated, corrupt, or not
    loadable with ``torch.load(weights_only=True)``), the trial's older checkpoint folders next
    to it (``checkpoint_<index>`` with a lower index, on the same filesystem) are tried, newest
    first.

    Args:
        checkpoint: ``tune.get_checkpoint()`` of the attempt (its ``path`` and ``filesystem``
            locate the folder in the sweep's storage).

    Returns:
        ``(bytes, None)`` when the checkpoint is readable. Otherwise the bytes of the newest
        readable older checkpoint (None: none is, the attempt starts from scratch) and one
        line naming the unreadable file (its full path in the storage) and why, and what the
        attempt resumes from instead.
    """
    fs, folder = checkpoint.filesystem, checkpoint.path.rstrip("/")
    try:
        return read_state(fs, folder)[0], None
    except (OSError, ValueError) as exc:
        why = _why(exc)
    line = (f"checkpoint {storage_name(fs, f'{folder}/{STATE_FILE}')} cannot be read ({why}); "
            f"skipped")
    parent, _, name = folder.rpartition("/")
    match = CHECKPOINT_FOLDER.fullmatch(name)
    older = [path for index, path in trial_checkpoints(fs, parent)
             if match is not None and index < int(match.group(1))]
    unreadable = []
    for path in older:
        try:
            data, epoch = read_state(fs, path)
        except (OSError, ValueError):
            unreadable.append(path.rpartition("/")[2])
            continue
        also = f" (also unreadable: {', '.join(unreadable)})" if unreadable else ""
        return data, (f"{line}; resuming from the older {storage_name(fs, path)} (epoch "
                      f"{epoch}){also}")
    also = f" ({', '.join(unreadable)} unreadable too)" if unreadable else ""
    return None, f"{line}; no older readable checkpoint{also}: the trial starts from scratch"
