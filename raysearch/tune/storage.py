"""Where a sweep keeps its Tune state and checkpoints: a local folder or a URI, via pyarrow.

Ray Tune reads and writes ``storage_path`` through ``pyarrow.fs``; this module resolves the
user's ``--storage-path`` the same way and checks it before Ray starts, so a missing bucket,
missing credentials or a folder that cannot be written is one line instead of a failure after
the first trial (and before the sweep's parent run takes its name). A sweep's name is the one
folder of its Tune state under the storage path (:func:`check_sweep_name`).

- A local path (or an NFS mount, which is a local path on every node) becomes absolute.
- A URI (``s3://bucket/prefix``, ``gs://bucket/prefix``, ``hdfs://...``, ``file:///...``) is
  kept as it is; pyarrow resolves the filesystem from it (S3: the usual AWS credential chain
  and ``AWS_ENDPOINT_URL`` for S3-compatible stores such as MinIO).

No Ray, no MLflow: plain pyarrow.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

__all__ = ["DEFAULT_STORAGE", "MAX_NAME_CHARS", "NAME_CHARS", "check_storage", "check_sweep_name",
           "is_uri", "resolve_storage"]

#: Tune's own default, used when no ``--storage-path`` is given.
DEFAULT_STORAGE = "~/ray_results"

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_uri(path: str) -> bool:
    """True for ``scheme://...`` (``s3://``, ``gs://``, ``file://``), False for a local path."""
    return bool(_URI.match(path))


def resolve_storage(path: str | None) -> str:
    """The ``storage_path`` to give Tune: a URI unchanged, a local path made absolute.

    Args:
        path (str | None): ``--storage-path``; None means :data:`DEFAULT_STORAGE`.

    Returns:
        str: the URI, or the absolute local path (``~`` expanded).
    """
    path = path or DEFAULT_STORAGE
    if is_uri(path):
        return path
    return str(Path(path).expanduser().resolve())


def check_storage(path: str) -> None:
    """Make sure the storage location can be reached and written, leaving nothing behind.

    The folder is created and a probe file (``.raysearch-probe-<pid>``) written and deleted in
    it, so a folder that cannot be created or written (permissions, a read-only mount, a bucket
    without write access) is refused here, before anything of the sweep is recorded. The local
    folders made for the probe are removed again (Tune makes them when the sweep starts).

    Args:
        path (str): a resolved storage path (:func:`resolve_storage`).

    Raises:
        ValueError: one line naming the location and pyarrow's reason (unknown scheme, missing
            bucket, no credentials, a file in the way, no permission to write).
    """
    import pyarrow.fs as pafs

    doing = "used"
    try:
        if is_uri(path):
            filesystem, inner = pafs.FileSystem.from_uri(path)
        else:
            filesystem, inner = pafs.LocalFileSystem(), path
        info = filesystem.get_file_info(inner)
        if info.type == pafs.FileType.File:
            raise ValueError(f"storage path {path} is a file, not a folder")
        made = [] if is_uri(path) else _missing_folders(Path(inner))
        filesystem.create_dir(inner, recursive=True)
        probe = f"{inner.rstrip('/')}/.raysearch-probe-{os.getpid()}"
        doing = "written"
        try:
            with filesystem.open_output_stream(probe) as stream:
                stream.write(b"raysearch checks that the storage path can be written\n")
            filesystem.delete_file(probe)
        finally:
            for folder in made:  # deepest first
                with contextlib.suppress(OSError):
                    folder.rmdir()
    except (OSError, ValueError, NotImplementedError) as exc:  # pyarrow's errors subclass these
        reason = " ".join(str(exc).split())
        raise ValueError(f"storage path {path} cannot be {doing}: {reason}") from None


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and its ancestors that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


#: Longest sweep name (it names Tune's folder and prefixes every trial's run name).
MAX_NAME_CHARS = 100
#: Characters of a sweep name besides letters and digits.
NAME_CHARS = "-_.+=@,"


def check_sweep_name(name: str) -> str:
    """`name` when it is a usable sweep name: one path component of a sane length.

    A sweep's name is the folder of its Tune state under the storage path and the value of a
    tag MLflow searches for, so it is 1 to :data:`MAX_NAME_CHARS` letters, digits and
    :data:`NAME_CHARS`, not starting with ``.`` or ``-`` (no ``/``, no ``..``, no hidden
    folder, no option look-alike).

    Raises:
        ValueError: one line naming the name and what is wrong with it.
    """
    shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}... ({len(name)} characters)"
    bad = sorted({c for c in name if not (c.isalnum() or c in NAME_CHARS)})
    problem = ("is empty" if not name else
               f"is longer than {MAX_NAME_CHARS} characters" if len(name) > MAX_NAME_CHARS else
               f"holds {', '.join(map(repr, bad))}" if bad else
               f"starts with {name[0]!r}" if name[0] in ".-" else None)
    if problem is not None:
        raise ValueError(f"sweep name {shown} {problem}: a name is one folder under the "
                         f"storage path, 1-{MAX_NAME_CHARS} letters, digits and {NAME_CHARS} "
                         "not starting with . or -")
    return name
