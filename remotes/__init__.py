"""Snapshot storage for the state stores: a directory or an S3/MinIO bucket."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import GcInfo, Remote
from .errors import RemoteError, SnapshotNotFoundError
from .manifest import FileInfo, Manifest, ManifestError

__all__ = [
    "Remote", "GcInfo", "Manifest", "FileInfo", "ManifestError", "RemoteError",
    "SnapshotNotFoundError", "PathRemote", "MinioRemote",
]

if TYPE_CHECKING:
    from .minio import MinioRemote
    from .path import PathRemote


def __getattr__(name: str) -> object:
    # Imported lazily so that `import remotes` does not pull in the S3 client.
    if name == "PathRemote":
        from .path import PathRemote

        return PathRemote
    if name == "MinioRemote":
        from .minio import MinioRemote

        return MinioRemote
    raise AttributeError(name)
