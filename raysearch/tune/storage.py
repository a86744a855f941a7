"""Where a sweep keeps its Tune state and checkpoints: a local folder or a URI, via pyarrow.

Ray Tune reads and writes ``storage_path`` through ``pyarrow.fs``; this module resolves the
user's ``--storage-path`` the same way and checks it before Ray starts, so a missing bucket or
missing credentials is one line instead of a failure after the first trial.

- A local path (or an NFS mount, which is a local path on every node) becomes absolute.
- A URI (``s3://bucket/prefix``, ``gs://bucket/prefix``, ``hdfs://...``, ``file:///...``) is
  kept as it is; pyarrow resolves the filesystem from it (S3: the usual AWS credential chain
  and ``AWS_ENDPOINT_URL`` for S3-compatible stores such as MinIO).

No Ray, no MLflow: plain pyarrow.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DEFAULT_STORAGE", "check_storage", "is_uri", "resolve_storage"]

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
    """Make sure the storage location can be reached and written (creates the folder).

    Args:
        path (str): a resolved storage path (:func:`resolve_storage`).

    Raises:
        ValueError: one line naming the location and pyarrow's reason (unknown scheme, missing
            bucket, no credentials, a file in the way, no permission).
    """
    import pyarrow.fs as pafs

    try:
        if is_uri(path):
            filesystem, inner = pafs.FileSystem.from_uri(path)
        else:
            filesystem, inner = pafs.LocalFileSystem(), path
        info = filesystem.get_file_info(inner)
        if info.type == pafs.FileType.File:
            raise ValueError(f"storage path {path} is a file, not a folder")
        filesystem.create_dir(inner, recursive=True)
    except (OSError, ValueError, NotImplementedError) as exc:  # pyarrow's errors subclass these
        reason = " ".join(str(exc).split())
        raise ValueError(f"storage path {path} cannot be used: {reason}") from None
