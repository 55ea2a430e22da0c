"""The :class:`Store` every engine subclasses: argument checks, options, the data API and
the mapping protocol over it, snapshots and restores, and opening and closing a directory.

The live file set, file lifetimes and background work it builds on are
:class:`~statestores.core.StoreCore`'s; an engine implements the hooks marked *engine
hook* in both.
"""

from __future__ import annotations

import abc
import concurrent.futures
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

from remotes.base import Remote

from . import current, expiry, snapshots
from .checks import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Option,
    check_key,
    check_ops,
    check_value,
)
from .checksum import file_crc
from .core import StoreCore, Subscriber
from .errors import StoreError
from .fs import FileSystem
from .snapshot_info import Frozen, RestoreInfo, SnapshotInfo
from .version import FileEntry

log = logging.getLogger("statestores")

__all__ = [
    "Store",
    "SnapshotInfo",
    "RestoreInfo",
    "Frozen",
    "Option",
    "Subscriber",
    "MAX_KEY_BYTES",
    "MAX_VALUE_BYTES",
    "check_key",
    "check_value",
    "check_ops",
    "file_crc",
]

_MISSING = object()
_LOCK_NAME = "LOCK"


class Store(StoreCore):
    """A key-value store over bytes with incremental snapshots. See :func:`statestores.open`."""

    #: An engine's WAL descriptor, if it keeps one (closed by the default :meth:`_abandon`).
    _wal_fd: int | None

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        remote: Remote | None = None,
        fs: FileSystem | None = None,
        _opened: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(directory, remote, fs, options)
        #: files a replica opened already (``_preopen``, by name; ``statestores.replica``):
        #: ``_open`` takes them instead of opening those files again, the rest are dropped
        self._opened: dict[str, Any] = dict(_opened or {})
        self.fs.makedirs(self.directory)
        self._lock_fd = self.fs.lock(os.path.join(self.directory, _LOCK_NAME))
        try:
            if remote is not None and not self._has_local_state() and remote.list_snapshots():
                with self._lock:  # the maintainer may edit the version as soon as open starts
                    self._open_empty()
                self.restore(None)
            else:
                with self._lock:
                    self._open()
            self._opened.clear()
        except BaseException:
            self._opened.clear()
            self._closed = True
            self._maint.stop()
            self._abandon()
            self.fs.unlock(self._lock_fd)
            raise

    # ------------------------------------------------------------------ engine hooks

    @classmethod
    def _preopen(cls, fs: FileSystem, path: str, entry: FileEntry) -> Any | None:
        """Engine hook: open the file ``entry`` at ``path`` as ``_open`` would, for a replica
        that may be promoted (``_open`` then finds it in ``self._opened``); None: nothing
        to open ahead (the default)."""
        return None

    def _has_local_state(self) -> bool:
        """Engine hook: whether the directory holds any state of this engine."""
        return current.exists(self.fs, self.directory)

    @abc.abstractmethod
    def _open(self) -> None:
        """Engine hook: load whatever the directory holds (after a clean close or a crash).
        Start from :meth:`_load_version`."""

    def _open_empty(self) -> None:
        """Engine hook: set up an empty store that is about to be restored. Default: ``_open``."""
        self._open()

    @abc.abstractmethod
    def _close(self) -> None:
        """Engine hook (lock held, background idle): flush per ``sync``, release resources."""

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

    def prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair whose key starts with ``prefix``, once, in key order.

        Cheaper than filtering :meth:`items` where the engine can seek: ``lsm`` reads only
        the blocks that can hold the prefix, the hash-indexed engines walk their in-memory
        keys without reading a value that does not match. (The runtime finds its timer and
        action records this way at every recovery: a whole-store scan of 10M keys held a
        worker's event loop for 2.5 s.) Engines implement :meth:`_prefixed`."""
        if not isinstance(prefix, bytes):
            raise TypeError(f"prefix must be bytes, got {type(prefix).__name__}")
        self._check_open()
        return self._prefixed(prefix)

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Engine hook of :meth:`prefixed` (``prefix`` checked, the store open). Default:
        filter and sort :meth:`items`."""
        return iter(sorted(kv for kv in self.items() if kv[0].startswith(prefix)))

    @abc.abstractmethod
    def flush(self) -> None:
        """Push buffered writes to files (durability per ``sync``)."""

    def _compact(self) -> None:
        """Engine hook (lock held, called by :meth:`compact`): merge every file once into
        the fewest the engine keeps, dropping overwritten values, tombstones and values
        expired at the horizon; wait for it (releasing the lock). Default: nothing (an
        engine without merges)."""

    # ------------------------------------------------------------------ expiry

    def set_expiry_horizon(self, t_ms: int) -> None:
        """Values whose expiry time (:mod:`statestores.expiry`) is at or before ``t_ms``
        (ms since the Unix epoch, an int >= 0) are *expired* from now on.

        The horizon never moves backwards: a value lower than the current one is ignored
        (so callers on several threads, or a restarted runtime catching up, need not
        order their calls). Reads do not hide expired values — a read returns an expired
        value or nothing, never an older value of its key; merges, flushes that rewrite
        and :meth:`compact` drop them, leaving a tombstone where an older version of the
        key may still live outside what they rewrite. The horizon is not persisted: a
        reopened store has none until it is set again, and :meth:`restore` clears it.
        """
        t = expiry.check_horizon(t_ms)
        with self._lock:
            if self._horizon is None or t > self._horizon:
                self._horizon = t

    @property
    def expiry_horizon(self) -> int | None:
        """The current expiry horizon (ms since the Unix epoch), None if never set."""
        return self._horizon

    def compact(self) -> None:
        """Run one merge cycle now and wait for it: every file of the store merged once
        (memtables and in-memory regions written first), overwritten values, tombstones
        and values expired at the horizon dropped. Writes and reads go on meanwhile; a
        merge already running finishes first. Raises :class:`StoreError` if the merge
        failed (the store stays as it was), or if merges are paused (:meth:`pause_merges`:
        the store's files are being shipped elsewhere)."""
        self._check_open()
        with self._lock:
            self._check_open()
            if self._paused:
                raise StoreError(
                    f"compact() of {self.directory}: merges are paused (pause_merges() or a "
                    "restore in progress); call it again once they are resumed"
                )
            self._compact()

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

    # ------------------------------------------------------------------ snapshots

    def _require_remote(self, what: str) -> Remote:
        if self.remote is None:
            raise StoreError(
                f"{what} needs a remote: open the store with remote=PathRemote(...) or "
                "MinioRemote(...)"
            )
        return self.remote

    def snapshot(self, snapshot_id: int) -> SnapshotInfo:
        """Take snapshot ``snapshot_id``; durable in the remote when this returns."""
        return self.snapshot_async(snapshot_id).result()

    def snapshot_async(
        self, snapshot_id: int, *, delay: float = 0.0
    ) -> concurrent.futures.Future[SnapshotInfo]:
        """Freeze the state now and upload it in the background.

        Returns once the state is frozen (later writes are not part of the snapshot); the
        future resolves when the manifest is published, or fails with :class:`RemoteError`.
        Uploads happen in call order; ``snapshot_id`` must exceed every id this store has
        taken or restored. ``delay``: seconds the upload waits before it starts (a caller
        freezing many stores at once spreads their uploads out this way).
        """
        self._check_open()
        return snapshots.freeze(self, self._require_remote("snapshot"), snapshot_id, delay)

    def snapshots(self) -> list[int]:
        """Ids of the complete snapshots in the remote, ascending."""
        self._check_open()
        return self._require_remote("snapshots()").list_snapshots()

    def restore(self, snapshot_id: int | None = None) -> RestoreInfo:
        """Become exactly snapshot ``snapshot_id`` (``None``: the latest).

        Downloads only files the directory lacks or holds corrupt; everything written
        since that snapshot is discarded. Raises :class:`SnapshotNotFoundError` for an
        unknown id, leaving the store as it was (but for the expiry horizon, below).

        The expiry horizon is cleared (:attr:`expiry_horizon` None): the restored state is
        older, and a caller replaying what followed it may read values as live that the
        old horizon had expired — it sets the horizon again when it knows.
        """
        self._check_open()
        remote = self._require_remote("restore")
        with self._lock:
            self._horizon = None  # before the restore's merges may start
        return snapshots.restore(self, remote, snapshot_id)

    # ------------------------------------------------------------------ lifecycle

    def stats(self) -> dict[str, Any]:
        """Memory, disk, files and engine-specific counters (a fresh dict each call)."""
        self._check_open()
        with self._lock:
            s = self._stats()
            s["version"] = self._version.seq
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
        snapshots.wait_uploads(self)
        self._quiesce()
        try:
            with self._lock:
                if self._closed:
                    return
                try:
                    self._close()
                finally:
                    self._closed = True
                    self._cond.notify_all()
        finally:
            self._maint.stop()  # delivers queued edits, then ends (we hold no lock here)
            if self._uploader is not None:
                self._uploader.shutdown(wait=True)
            try:
                with self._lock:
                    self._remove_strays()
            except OSError as exc:  # e.g. a FaultyFS that died: nothing more to clean
                log.debug("removing leftovers of %s failed: %s", self.directory, exc)
            self.fs.unlock(self._lock_fd)


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
