"""The interface every remote implements (``PathRemote``, ``MinioRemote``).

A remote is one namespace (a directory, or a bucket + prefix) holding:

* ``files/<name>`` — immutable data files, named so that a name never changes meaning;
* ``manifests/<snapshot_id>`` — one :class:`~remotes.manifest.Manifest` per complete snapshot;
* ``blobs/<name>`` — small opaque documents other layers publish (e.g. the runtime's
  global snapshot record).

Uploads are write-then-publish: callers upload files first and write the manifest last,
so a crash mid-upload never leaves a manifest that names a missing file.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable
from dataclasses import dataclass

from ._layout import check_snapshot_id
from .manifest import Manifest

__all__ = ["Remote", "GcInfo"]


@dataclass(frozen=True)
class GcInfo:
    """What :meth:`Remote.gc` removed."""

    snapshots_deleted: list[int]
    files_deleted: int
    bytes_deleted: int


class Remote(abc.ABC):
    """Snapshot storage. Implementations are thread-safe."""

    #: True when a pickled copy in another process reaches the same storage (a server, a
    #: directory), so a store may upload through its background process; an in-memory
    #: fake keeps the default False and is always used in this process.
    shareable: bool = False

    # -- files --
    @abc.abstractmethod
    def put_file(self, name: str, path: str | os.PathLike[str]) -> int:
        """Upload local file ``path`` as ``name``; durable on return; returns bytes sent."""

    @abc.abstractmethod
    def get_file(self, name: str, path: str | os.PathLike[str]) -> int:
        """Download ``name`` to ``path`` (atomically: temp file + rename); returns bytes.

        Raises ``statestores.errors.RemoteError`` if the remote lacks ``name``.
        """

    @abc.abstractmethod
    def list_files(self) -> dict[str, int]:
        """Every data file in the remote: name → size in bytes."""

    @abc.abstractmethod
    def delete_file(self, name: str) -> None:
        """Delete ``name``; deleting a missing file is not an error."""

    # -- manifests --
    @abc.abstractmethod
    def write_manifest(self, manifest: Manifest) -> None:
        """Publish ``manifest`` (replacing one with the same id). Call after its files."""

    @abc.abstractmethod
    def read_manifest(self, snapshot_id: int) -> Manifest:
        """The manifest of ``snapshot_id``; ``SnapshotNotFoundError`` if there is none."""

    @abc.abstractmethod
    def list_snapshots(self) -> list[int]:
        """Ids of the complete (published) snapshots, ascending."""

    @abc.abstractmethod
    def delete_snapshot(self, snapshot_id: int) -> None:
        """Unpublish one snapshot (its files stay until :meth:`gc`)."""

    def delete_snapshots(self, snapshot_ids: Iterable[int]) -> None:
        """Unpublish several snapshots (missing ones are fine); a remote whose service
        deletes many objects in one request overrides this to use it."""
        for sid in [check_snapshot_id(sid) for sid in snapshot_ids]:  # (all checked first)
            self.delete_snapshot(sid)

    # -- blobs --
    @abc.abstractmethod
    def put_blob(self, name: str, data: bytes) -> None:
        """Store a small document atomically (readers see old or new, never a mix)."""

    @abc.abstractmethod
    def get_blob(self, name: str) -> bytes | None:
        """A document stored with :meth:`put_blob`, or ``None``."""

    @abc.abstractmethod
    def delete_blob(self, name: str) -> None:
        """Delete a document; deleting a missing one is not an error."""

    # -- lifecycle --
    @abc.abstractmethod
    def gc(self, keep: int) -> GcInfo:
        """Keep the newest ``keep`` snapshots; delete older manifests and every file that
        no retained manifest references."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Delete everything in this remote's namespace."""

    def latest_snapshot(self) -> int | None:
        ids = self.list_snapshots()
        return ids[-1] if ids else None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (optional)."""
