"""What every engine shares: argument checks, the mapping protocol, snapshots and restores.

An engine subclasses :class:`Store` and implements the hooks marked *engine hook*. The
contract that makes incremental snapshots work:

* All state the engine holds is, after :meth:`Store._freeze`, described by a set of
  **immutable** files in the store directory whose names never change meaning (a name is
  never reused for different bytes, also not after a restore to an older snapshot: names
  carry a sequence number that :meth:`Store._install` bumps past everything the remote
  has seen).
* A snapshot is that set of names plus the engine's ``meta``; it uploads only the names
  the remote lacks and publishes a manifest last.
* Engines never delete a data file directly: they call :meth:`Store._release_file`, which
  defers the delete while an upload still needs the file.

Thread model: one lock (``self._lock``) guards the engine's state. The caller's thread
takes it for every operation (uncontended, so cheap); background merges take it only to
install their result. Uploads run on a single background thread and touch only immutable
files.
"""

from __future__ import annotations

import abc
import concurrent.futures
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from remotes.base import Remote
from remotes.manifest import FileInfo, Manifest

from .checksum import crc32c
from .errors import (
    CorruptionError,
    RemoteError,
    SnapshotNotFoundError,
    StoreClosedError,
    StoreError,
)
from .fs import FileSystem

log = logging.getLogger("statestores")

__all__ = [
    "Store",
    "SnapshotInfo",
    "RestoreInfo",
    "Frozen",
    "Option",
    "MAX_KEY_BYTES",
    "MAX_VALUE_BYTES",
    "check_key",
    "check_value",
    "file_crc",
]

#: Largest key accepted (the issue asks for at least 64 KiB).
MAX_KEY_BYTES = 1 << 20
#: Largest value accepted (the issue asks for at least 64 MiB).
MAX_VALUE_BYTES = 1 << 28

_MISSING = object()
_LOCK_NAME = "LOCK"
_SEQ_RE = re.compile(r"(\d{6,})")


def check_key(key: object) -> bytes:
    """Return ``key`` as ``bytes`` or raise a ``TypeError``/``ValueError`` naming it."""
    if isinstance(key, (bytearray, memoryview)):
        key = bytes(key)
    if not isinstance(key, bytes):
        raise TypeError(f"key must be bytes, got {type(key).__name__}: {key!r:.80}")
    if not key:
        raise ValueError("key must not be empty (b'')")
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"key of {len(key)} bytes is larger than the maximum {MAX_KEY_BYTES} bytes")
    return key


def check_value(value: object, key: bytes = b"") -> bytes:
    """Return ``value`` as ``bytes`` or raise a ``TypeError``/``ValueError`` naming it."""
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise TypeError(
            f"value for key {key!r:.60} must be bytes, got {type(value).__name__} "
            "(use store.delete(key) to delete)"
            if value is None
            else f"value for key {key!r:.60} must be bytes, got {type(value).__name__}"
        )
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(
            f"value for key {key!r:.60} of {len(value)} bytes is larger than the maximum "
            f"{MAX_VALUE_BYTES} bytes"
        )
    return value


def check_ops(ops: Iterable[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
    """Validate a whole batch before anything is applied (a bad op leaves the store intact)."""
    checked: list[tuple[bytes, bytes | None]] = []
    for i, op in enumerate(ops):
        try:
            key, value = op
        except (TypeError, ValueError):
            raise TypeError(f"write_batch op #{i} must be a (key, value) pair, got {op!r:.80}") from None
        key = check_key(key)
        checked.append((key, None if value is None else check_value(value, key)))
    return checked


def file_crc(fs: FileSystem, path: str) -> tuple[int, int]:
    """``(size, crc32c)`` of a whole file, read in chunks."""
    fd = fs.open_read(path)
    try:
        crc = 0
        size = 0
        while True:
            chunk = fs.pread(fd, 1 << 20, size)
            if not chunk:
                break
            crc = crc32c(chunk, crc)
            size += len(chunk)
        return size, crc
    finally:
        fs.close(fd)


@dataclass(frozen=True)
class Option:
    """One engine option: its default, accepted types, and a check with a message."""

    default: Any
    types: type | tuple[type, ...]
    check: Any = None  # callable(value) -> bool
    expect: str = ""  # what a valid value looks like, for the error message


SYNC_MODES = ("none", "os", "fsync")


@dataclass(frozen=True)
class SnapshotInfo:
    """What one snapshot cost: files/bytes sent to the remote, and what it references."""

    snapshot_id: int
    files_uploaded: int
    bytes_uploaded: int
    files_total: int
    bytes_total: int
    freeze_seconds: float
    upload_seconds: float


@dataclass(frozen=True)
class RestoreInfo:
    """What one restore cost: files/bytes fetched from the remote."""

    snapshot_id: int
    files_downloaded: int
    bytes_downloaded: int
    files_total: int
    bytes_total: int
    seconds: float


@dataclass(frozen=True)
class Frozen:
    """The engine's whole state as immutable files (names relative to the directory)."""

    files: list[str]
    meta: dict[str, Any]


class Store(abc.ABC):
    """A key-value store over bytes with incremental snapshots. See :func:`statestores.open`."""

    engine: ClassVar[str] = ""
    #: Engine options (beyond ``sync``): name → :class:`Option`.
    OPTIONS: ClassVar[dict[str, Option]] = {}
    #: Default for ``sync`` when the caller does not give one.
    DEFAULT_SYNC: ClassVar[str] = "os"
    #: An engine's WAL descriptor, if it keeps one (closed by the default :meth:`_abandon`).
    _wal_fd: int | None

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        remote: Remote | None = None,
        fs: FileSystem | None = None,
        **options: Any,
    ) -> None:
        if remote is not None and not isinstance(remote, Remote):
            raise TypeError(f"remote must be a remotes.Remote, got {type(remote).__name__}")
        self.options = self._parse_options(options)
        self.sync: str = self.options["sync"]
        self.directory = os.path.abspath(os.fspath(directory))
        self.fs = fs if fs is not None else FileSystem()
        self.remote = remote
        self._lock = threading.RLock()
        self._closed = False
        self._pins: Counter[str] = Counter()
        self._deferred: set[str] = set()
        self._uploader: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending_uploads: list[concurrent.futures.Future[SnapshotInfo]] = []
        self._last_snapshot_id: int | None = None
        self._remote_files: dict[str, int] | None = None  # cache of remote.list_files()
        self.fs.makedirs(self.directory)
        self._lock_fd = self.fs.lock(os.path.join(self.directory, _LOCK_NAME))
        try:
            if remote is not None and not self._has_local_state() and remote.list_snapshots():
                self._open_empty()
                self.restore(None)
            else:
                self._open()
        except BaseException:
            self._closed = True
            self._abandon()
            self.fs.unlock(self._lock_fd)
            raise

    # ------------------------------------------------------------------ options

    @classmethod
    def _parse_options(cls, given: dict[str, Any]) -> dict[str, Any]:
        specs = dict(cls.OPTIONS)
        specs["sync"] = Option(cls.DEFAULT_SYNC, str, lambda v: v in SYNC_MODES, "one of 'none', 'os', 'fsync'")
        unknown = sorted(set(given) - set(specs))
        if unknown:
            raise TypeError(
                f"unknown option(s) {', '.join(map(repr, unknown))} for engine {cls.engine!r}; "
                f"known: {', '.join(sorted(specs))}"
            )
        out: dict[str, Any] = {}
        for name, spec in specs.items():
            if name not in given:
                out[name] = spec.default
                continue
            value = given[name]
            if isinstance(value, bool) and spec.types in (int, float, (int, float)):
                raise TypeError(f"option {name!r} for engine {cls.engine!r} must be {spec.expect or spec.types}, got {value!r}")
            if spec.types is float and isinstance(value, int):
                value = float(value)
            if not isinstance(value, spec.types):
                raise TypeError(
                    f"option {name!r} for engine {cls.engine!r} must be {spec.expect or spec.types}, "
                    f"got {type(value).__name__} {value!r:.60}"
                )
            if spec.check is not None and not spec.check(value):
                raise ValueError(
                    f"option {name!r} for engine {cls.engine!r} must be {spec.expect}, got {value!r:.60}"
                )
            out[name] = value
        return out

    # ------------------------------------------------------------------ engine hooks

    @abc.abstractmethod
    def _has_local_state(self) -> bool:
        """Engine hook: whether the directory holds any state of this engine."""

    @abc.abstractmethod
    def _open(self) -> None:
        """Engine hook: load whatever the directory holds (after a clean close or a crash)."""

    def _open_empty(self) -> None:
        """Engine hook: set up an empty store that is about to be restored. Default: ``_open``."""
        self._open()

    @abc.abstractmethod
    def _freeze(self) -> Frozen:
        """Engine hook (lock held): make all state immutable files; name them and the meta."""

    @abc.abstractmethod
    def _install(self, manifest: Manifest, next_seq: int) -> None:
        """Engine hook (lock held, merges stopped): become exactly the state of ``manifest``.

        Every file the manifest names is present and verified in the directory. Drop all
        other state (memtables, WALs, hash indexes), persist the engine's local manifest,
        and make every file name created from now on use a sequence number ``>= next_seq``.
        Delete (through :meth:`_release_file`) data files the manifest does not name.
        """

    @abc.abstractmethod
    def _quiesce(self) -> None:
        """Engine hook: wait for background merges to finish and stop starting new ones
        until :meth:`_resume`."""

    def _resume(self) -> None:  # noqa: B027 - optional hook
        """Engine hook: background merges may start again."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Engine hook: flush per ``sync`` and release the engine's resources."""

    def _abandon(self) -> None:
        """Engine hook: drop resources without writing anything (a failed open).

        The default closes a WAL descriptor kept in ``self._wal_fd``; engines holding more
        extend it and call ``super()._abandon()``.
        """
        fd = getattr(self, "_wal_fd", None)
        if fd is not None:
            try:
                self.fs.close(fd)
            except OSError:
                pass  # the open already failed; the error being raised is the one that matters
            self._wal_fd = None

    @abc.abstractmethod
    def _stats(self) -> dict[str, Any]:
        """Engine hook: engine-specific statistics."""

    @abc.abstractmethod
    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key``, or ``default`` if it has none."""

    @abc.abstractmethod
    def put(self, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value`` (``b""`` is a value)."""

    @abc.abstractmethod
    def delete(self, key: bytes) -> None:
        """Delete ``key`` (a no-op if absent)."""

    @abc.abstractmethod
    def write_batch(self, ops: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Apply ``(key, value)`` ops in order, ``None`` meaning delete; all-or-nothing."""

    @abc.abstractmethod
    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair once."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Push buffered writes to files (durability per ``sync``)."""

    # ------------------------------------------------------------------ mapping protocol

    def __contains__(self, key: object) -> bool:
        return self.get(key, _MISSING) is not _MISSING  # type: ignore[arg-type]

    def __getitem__(self, key: bytes) -> bytes:
        value = self.get(key, _MISSING)  # type: ignore[arg-type]
        if value is _MISSING:
            raise KeyError(key)
        return value  # type: ignore[return-value]

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.put(key, value)

    def __delitem__(self, key: bytes) -> None:
        if key not in self:
            raise KeyError(key)
        self.delete(key)

    def __iter__(self) -> Iterator[bytes]:
        for k, _ in self.items():
            yield k

    def keys(self) -> Iterator[bytes]:
        return iter(self)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.directory!r} {state}>"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store at {self.directory} is closed")

    # ------------------------------------------------------------------ files

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _release_file(self, name: str) -> None:
        """Delete data file ``name`` now, or when the last upload pinning it finishes."""
        with self._lock:
            if self._pins[name] > 0:
                self._deferred.add(name)
                return
        self.fs.remove(self._path(name))

    def _unpin(self, names: Iterable[str]) -> None:
        to_delete = []
        with self._lock:
            for n in names:
                self._pins[n] -= 1
                if self._pins[n] <= 0:
                    del self._pins[n]
                    if n in self._deferred:
                        self._deferred.discard(n)
                        to_delete.append(n)
        for n in to_delete:
            self.fs.remove(self._path(n))

    # ------------------------------------------------------------------ snapshots

    def _require_remote(self, what: str) -> Remote:
        if self.remote is None:
            raise StoreError(f"{what} needs a remote: open the store with remote=PathRemote(...) or MinioRemote(...)")
        return self.remote

    def snapshot(self, snapshot_id: int) -> SnapshotInfo:
        """Take snapshot ``snapshot_id``; durable in the remote when this returns."""
        return self.snapshot_async(snapshot_id).result()

    def snapshot_async(self, snapshot_id: int) -> concurrent.futures.Future[SnapshotInfo]:
        """Freeze the state now and upload it in the background.

        Returns once the state is frozen (later writes are not part of the snapshot); the
        future resolves when the manifest is published, or fails with :class:`RemoteError`.
        Uploads happen in call order; ``snapshot_id`` must exceed every id this store has
        taken or restored.
        """
        self._check_open()
        remote = self._require_remote("snapshot")
        if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
            raise TypeError(f"snapshot_id must be an int, got {type(snapshot_id).__name__} {snapshot_id!r:.40}")
        if snapshot_id < 0:
            raise ValueError(f"snapshot_id must be >= 0, got {snapshot_id}")
        t0 = time.perf_counter()
        with self._lock:
            if self._last_snapshot_id is not None and snapshot_id <= self._last_snapshot_id:
                raise ValueError(
                    f"snapshot_id {snapshot_id} must be greater than the last snapshot id "
                    f"{self._last_snapshot_id} of this store"
                )
            frozen = self._freeze()
            for n in frozen.files:
                self._pins[n] += 1
            self._last_snapshot_id = snapshot_id
            if self._uploader is None:
                self._uploader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="statestores-upload")
        freeze_s = time.perf_counter() - t0
        fut = self._uploader.submit(self._upload, remote, snapshot_id, frozen, freeze_s)
        self._pending_uploads = [f for f in self._pending_uploads if not f.done()] + [fut]
        return fut

    def _upload(self, remote: Remote, snapshot_id: int, frozen: Frozen, freeze_s: float) -> SnapshotInfo:
        t0 = time.perf_counter()
        try:
            if self._remote_files is None:
                self._remote_files = dict(remote.list_files())
            infos: dict[str, FileInfo] = {}
            uploaded = 0
            sent = 0
            for name in frozen.files:
                size, crc = file_crc(self.fs, self._path(name))
                infos[name] = FileInfo(size, crc)
                if self._remote_files.get(name) != size:
                    sent += remote.put_file(name, self._path(name))
                    self._remote_files[name] = size
                    uploaded += 1
            manifest = Manifest(snapshot_id, self.engine, infos, frozen.meta)
            remote.write_manifest(manifest)
        except RemoteError:
            self._remote_files = None
            raise
        except OSError as exc:
            self._remote_files = None
            raise RemoteError(f"snapshot {snapshot_id} of {self.directory} failed: {exc}") from exc
        finally:
            self._unpin(frozen.files)
        info = SnapshotInfo(
            snapshot_id,
            uploaded,
            sent,
            len(infos),
            manifest.total_bytes,
            freeze_s,
            time.perf_counter() - t0,
        )
        log.info(
            "snapshot done",
            extra={"store": self.directory, "snapshot_id": snapshot_id, "files_uploaded": uploaded, "bytes_uploaded": sent},
        )
        return info

    def _wait_uploads(self) -> None:
        pending, self._pending_uploads = self._pending_uploads, []
        for f in pending:
            try:
                f.result()
            except Exception as exc:  # the caller of snapshot_async owns the error
                log.warning("snapshot upload failed: %s", exc)

    def snapshots(self) -> list[int]:
        """Ids of the complete snapshots in the remote, ascending."""
        self._check_open()
        return self._require_remote("snapshots()").list_snapshots()

    def restore(self, snapshot_id: int | None = None) -> RestoreInfo:
        """Become exactly snapshot ``snapshot_id`` (``None``: the latest).

        Downloads only files the directory lacks or holds corrupt; everything written
        since that snapshot is discarded. Raises :class:`SnapshotNotFoundError` for an
        unknown id, leaving the store as it was.
        """
        self._check_open()
        remote = self._require_remote("restore")
        t0 = time.perf_counter()
        self._wait_uploads()
        if snapshot_id is None:
            latest = remote.latest_snapshot()
            if latest is None:
                raise SnapshotNotFoundError(f"the remote of {self.directory} holds no snapshot to restore")
            snapshot_id = latest
        elif isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
            raise TypeError(f"snapshot_id must be an int or None, got {type(snapshot_id).__name__}")
        manifest = remote.read_manifest(snapshot_id)
        if manifest.engine != self.engine:
            raise StoreError(
                f"snapshot {snapshot_id} was taken by engine {manifest.engine!r}, this store is {self.engine!r}"
            )
        remote_files = remote.list_files()
        downloaded = 0
        nbytes = 0
        # Pin the manifest's files first: a merge finishing while we download must not
        # delete a local file the snapshot needs (its delete is deferred, then cancelled).
        wanted = list(manifest.files)
        with self._lock:
            for n in wanted:
                self._pins[n] += 1
        try:
            for name, info in manifest.files.items():
                path = self._path(name)
                if self.fs.exists(path) and file_crc(self.fs, path) == (info.size, info.crc):
                    continue
                if name not in remote_files:
                    raise RemoteError(f"snapshot {snapshot_id} names file {name!r}, which the remote lacks")
                tmp = path + ".download"
                nbytes += remote.get_file(name, tmp)
                if file_crc(self.fs, tmp) != (info.size, info.crc):
                    self.fs.remove(tmp)
                    raise CorruptionError(
                        f"remote:{name}", f"downloaded file does not match snapshot {snapshot_id}'s checksum"
                    )
                self.fs.rename(tmp, path)
                downloaded += 1
            next_seq = 1 + max((_seq_of(n) for n in remote_files), default=0)
            with self._lock:
                self._quiesce()
                try:
                    self._install(manifest, next_seq)
                finally:
                    self._resume()
                # the restored state references these files again: cancel deferred deletes
                self._deferred.difference_update(wanted)
                self._last_snapshot_id = snapshot_id
                self._remote_files = dict(remote_files)
        finally:
            self._unpin(wanted)
        return RestoreInfo(
            snapshot_id,
            downloaded,
            nbytes,
            len(manifest.files),
            manifest.total_bytes,
            time.perf_counter() - t0,
        )

    # ------------------------------------------------------------------ lifecycle

    def stats(self) -> dict[str, Any]:
        """Memory, disk, files and engine-specific counters (a fresh dict each call)."""
        self._check_open()
        with self._lock:
            s = self._stats()
        s.setdefault("engine", self.engine)
        s.setdefault("directory", self.directory)
        s.setdefault("disk_bytes", _dir_bytes(self.directory))
        s["pinned_files"] = len(self._pins)
        s["last_snapshot_id"] = self._last_snapshot_id
        return s

    def close(self) -> None:
        """Flush, wait for background work, release the directory. Idempotent."""
        if self._closed:
            return
        self._wait_uploads()
        with self._lock:
            if self._closed:
                return
            try:
                self._quiesce()
                self._close()
            finally:
                self._closed = True
                if self._uploader is not None:
                    self._uploader.shutdown(wait=True)
                for n in list(self._deferred):
                    self.fs.remove(self._path(n))
                self._deferred.clear()
                self.fs.unlock(self._lock_fd)


def _seq_of(name: str) -> int:
    """The sequence number embedded in a data file name (0 if it has none)."""
    m = _SEQ_RE.findall(name)
    return int(m[-1]) if m else 0


def _dir_bytes(directory: str) -> int:
    total = 0
    try:
        with os.scandir(directory) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    total += e.stat().st_size
    except FileNotFoundError:
        pass
    return total
