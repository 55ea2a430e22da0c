"""``PathRemote``: snapshot storage in a local (or mounted) directory.

Every write goes to a unique temp file under ``<root>/tmp/``, is fsynced, renamed into
place (atomic on POSIX), and the parent directory is fsynced, so a reader or a crash sees
either the old object or the complete new one, never a torn one.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from ._gc import plan_gc
from ._layout import (
    BLOBS,
    FILES,
    MANIFESTS,
    check_name,
    check_snapshot_id,
    manifest_name,
    parse_manifest_name,
)
from .base import GcInfo, Remote
from .errors import RemoteError, SnapshotNotFoundError
from .manifest import Manifest

__all__ = ["PathRemote"]

log = logging.getLogger(__name__)

_TMP = "tmp"
_STALE_TMP_S = 3600.0  # a write in flight never takes this long
_COPY_CHUNK = 1 << 20


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_durable(src: str | os.PathLike[str], dst: Path) -> int:
    """Copy ``src`` to ``dst`` (a fresh path) and fsync it; returns bytes copied."""
    n = 0
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while True:
            chunk = fin.read(_COPY_CHUNK)
            if not chunk:
                break
            fout.write(chunk)
            n += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return n


class PathRemote(Remote):
    """A remote in directory ``root`` (created if missing). Thread-safe.

    Layout: ``root/files/<name>``, ``root/manifests/<id:%020d>.manifest``,
    ``root/blobs/<name>``; ``root/tmp/`` holds in-progress writes.
    """

    shareable = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a path, got {type(root).__name__}: {root!r}")
        self.root = Path(root).absolute()
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"root {str(self.root)!r} exists and is not a directory")
        self._lock = threading.Lock()  # serializes gc/destroy against each other only
        self._dirs_ready = False
        self._ensure_dirs()

    def __reduce__(self) -> tuple[type[PathRemote], tuple[str]]:
        # The lock cannot be pickled; a copy in another process gets its own.
        return (PathRemote, (str(self.root),))

    def __repr__(self) -> str:
        return f"PathRemote({str(self.root)!r})"

    # -- helpers --
    def _ensure_dirs(self) -> None:
        if self._dirs_ready and (self.root / _TMP).is_dir():
            return
        try:
            for sub in (FILES, MANIFESTS, BLOBS, _TMP):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RemoteError(f"{self}: cannot create the remote's directories: {e}") from e
        self._dirs_ready = True

    def _tmp_path(self) -> Path:
        self._ensure_dirs()
        return self.root / _TMP / f"{uuid.uuid4().hex}.tmp"

    def _publish(self, tmp: Path, final: Path) -> None:
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
            _fsync_dir(final.parent)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _write_bytes(self, final: Path, data: bytes) -> None:
        tmp = self._tmp_path()
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._publish(tmp, final)

    # -- files --
    def put_file(self, name: str, path: str | os.PathLike[str]) -> int:
        """Copy local file ``path`` into ``files/<name>``; durable on return."""
        check_name(name)
        tmp = self._tmp_path()
        try:
            n = _copy_durable(path, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._publish(tmp, self.root / FILES / name)
        log.debug("put file", extra={"remote": str(self.root), "file": name, "bytes": n})
        return n

    def get_file(self, name: str, path: str | os.PathLike[str]) -> int:
        """Copy ``files/<name>`` to ``path`` (temp file beside it + rename)."""
        check_name(name)
        src = self.root / FILES / name
        dst = Path(path)
        tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex}.part")
        try:
            n = _copy_durable(src, tmp)
            os.replace(tmp, dst)
        except FileNotFoundError as e:
            tmp.unlink(missing_ok=True)
            if not src.exists():
                raise RemoteError(f"{self}: no file {name!r} (looked for {str(src)!r})") from e
            raise
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return n

    def list_files(self) -> dict[str, int]:
        """Every data file: name → size in bytes."""
        out: dict[str, int] = {}
        for name, size, _ in self._scan_files():
            out[name] = size
        return out

    def _scan_files(self) -> list[tuple[str, int, float]]:
        out: list[tuple[str, int, float]] = []
        try:
            entries = list(os.scandir(self.root / FILES))
        except FileNotFoundError:
            return out
        for entry in entries:
            try:
                st = entry.stat()
            except FileNotFoundError:  # deleted concurrently
                continue
            out.append((entry.name, st.st_size, st.st_mtime))
        return out

    def delete_file(self, name: str) -> None:
        """Delete ``files/<name>``; a missing file is not an error."""
        check_name(name)
        (self.root / FILES / name).unlink(missing_ok=True)

    # -- manifests --
    def _manifest_path(self, snapshot_id: int) -> Path:
        return self.root / MANIFESTS / manifest_name(snapshot_id)

    def write_manifest(self, manifest: Manifest) -> None:
        """Publish ``manifest`` atomically (replacing one with the same id)."""
        if not isinstance(manifest, Manifest):
            raise TypeError(f"manifest must be a remotes.Manifest, got {type(manifest).__name__}")
        self._write_bytes(self._manifest_path(manifest.snapshot_id), manifest.encode())
        log.debug(
            "published manifest", extra={"remote": str(self.root), "snapshot": manifest.snapshot_id}
        )

    def read_manifest(self, snapshot_id: int) -> Manifest:
        """The manifest of ``snapshot_id``; ``SnapshotNotFoundError`` if unpublished."""
        p = self._manifest_path(snapshot_id)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise SnapshotNotFoundError(f"{self}: no snapshot {snapshot_id}") from None
        m = Manifest.decode(data, source=str(p))
        if m.snapshot_id != snapshot_id:
            raise RemoteError(
                f"{p}: holds the manifest of snapshot {m.snapshot_id}, not {snapshot_id}"
            )
        return m

    def list_snapshots(self) -> list[int]:
        """Ids of the published snapshots, ascending."""
        try:
            names = os.listdir(self.root / MANIFESTS)
        except FileNotFoundError:
            return []
        return sorted(i for i in map(parse_manifest_name, names) if i is not None)

    def delete_snapshot(self, snapshot_id: int) -> None:
        """Unpublish ``snapshot_id`` (its files stay until :meth:`gc`); missing is fine."""
        check_snapshot_id(snapshot_id)
        self._manifest_path(snapshot_id).unlink(missing_ok=True)

    # -- blobs --
    def put_blob(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``blobs/<name>`` atomically."""
        check_name(name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"blob {name!r}: data must be bytes, got {type(data).__name__}")
        self._write_bytes(self.root / BLOBS / name, bytes(data))

    def get_blob(self, name: str) -> bytes | None:
        """``blobs/<name>``, or ``None`` if absent."""
        check_name(name)
        try:
            return (self.root / BLOBS / name).read_bytes()
        except FileNotFoundError:
            return None

    def delete_blob(self, name: str) -> None:
        """Delete ``blobs/<name>``; a missing blob is not an error."""
        check_name(name)
        (self.root / BLOBS / name).unlink(missing_ok=True)

    # -- lifecycle --
    def gc(self, keep: int) -> GcInfo:
        """Keep the newest ``keep`` (>= 1) snapshots; delete older manifests and the files no
        retained manifest references (files newer than the newest retained manifest are
        kept: they may belong to an upload in flight)."""
        with self._lock:
            def mtime(sid: int) -> float:
                return self._manifest_path(sid).stat().st_mtime

            plan = plan_gc(
                self.list_snapshots(), keep, self.read_manifest, self._scan_files(), mtime
            )
            for sid in plan.drop_snapshots:
                self.delete_snapshot(sid)
            for name in plan.drop_files:
                self.delete_file(name)
            self._sweep_tmp()
        info = GcInfo(plan.drop_snapshots, len(plan.drop_files), sum(plan.drop_files.values()))
        log.info(
            "gc",
            extra={"remote": str(self.root), "snapshots_deleted": info.snapshots_deleted,
                   "files_deleted": info.files_deleted, "bytes_deleted": info.bytes_deleted},
        )
        return info

    def _sweep_tmp(self) -> None:
        """Delete temp files that a crashed writer left behind (older than an hour)."""
        cutoff = time.time() - _STALE_TMP_S
        try:
            entries = list(os.scandir(self.root / _TMP))
        except FileNotFoundError:
            return
        for entry in entries:
            try:
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    log.info(
                        "removed stale temp file",
                        extra={"remote": str(self.root), "file": entry.name},
                    )
            except FileNotFoundError:
                continue

    def destroy(self) -> None:
        """Delete the whole directory; the remote can be used again afterwards (empty)."""
        with self._lock:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.root.exists():
                # ignore_errors hides why; retry once loudly.
                shutil.rmtree(self.root)
            self._dirs_ready = False
