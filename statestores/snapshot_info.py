"""The values a snapshot and a restore hand around: what an engine's state is as files
(:class:`Frozen`), and what a snapshot or a restore cost (:class:`SnapshotInfo`,
:class:`RestoreInfo`).

Kept apart from the orchestration in :mod:`statestores.snapshots` so that the store core,
which declares the engine hook returning a :class:`Frozen`, need not import it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from remotes.errors import RemoteError

from .version import FileEntry

__all__ = ["Frozen", "SnapshotInfo", "RestoreInfo", "SnapshotAbandoned"]


class SnapshotAbandoned(RemoteError):
    """The snapshot's upload was abandoned: a restore to an older snapshot replaced the
    state it froze before the upload ended. The snapshot is not complete as far as its
    caller knows (its manifest may or may not have been written, never before every file
    it names); nothing may reference it."""


@dataclass(frozen=True)
class SnapshotInfo:
    """What one snapshot cost: files/bytes sent to the remote, bytes read, what it references."""

    snapshot_id: int
    files_uploaded: int
    bytes_uploaded: int
    files_total: int
    bytes_total: int
    freeze_seconds: float
    upload_seconds: float
    #: Bytes of local files read to checksum and upload (only files the remote lacked).
    bytes_read: int = 0


@dataclass(frozen=True)
class RestoreInfo:
    """What one restore cost: files/bytes fetched from the remote."""

    snapshot_id: int
    files_downloaded: int
    bytes_downloaded: int
    files_total: int
    bytes_total: int
    seconds: float


@dataclass
class Frozen:
    """The engine's state as files: the version entries naming them, and futures that
    resolve once files still being written (off the caller's thread) are durable.

    ``finalize`` (optional, run on the uploader thread after ``pending``) returns the
    entries as they ended up (e.g. without an output that turned out empty).
    """

    entries: list[FileEntry]
    pending: list[concurrent.futures.Future[Any]] = field(default_factory=list)
    finalize: Callable[[], list[FileEntry]] | None = None

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]
