"""The :class:`Store` every engine subclasses: argument checks, options, the data API and
the mapping protocol over it, snapshots and restores, and opening and closing a directory.

A store *has* its parts, each in a module of its own: the live file set with its numbering
and pins (:class:`~statestores.files.FileSet`, ``store.files``), the store lock and the
maintainer thread's work (:class:`~statestores.tasks.Tasks`, ``store.tasks``), the
subscribers and the events queued for them (:class:`~statestores.delivery.Delivery`,
``store.delivery``) and what :mod:`statestores.snapshots` remembers
(:class:`~statestores.snapshots.SnapshotState`), which that module reaches only through
the methods of :class:`~statestores.snapshots.SnapshotHost` declared there. An engine
implements the hooks its one Protocol, :class:`statestores.engine.Engine`, declares.

**Files.** All durable state is a :class:`~statestores.version.Version`: a set of files
whose names never change meaning (names carry a sequence number from
``files.next_seq()``, which continues above every name the directory or the remote has
seen). Every change of the set is one :meth:`Store._edit`: it persists ``CURRENT``,
queues the edit for subscribers (:meth:`Store.subscribe`), and is the one place that
decides when a file is deleted — once no version names it, no snapshot, upload or restore
pins it (an upload keeps its pin while its snapshot is one of the newest
``snapshots.KEEP_LOCAL``), and every subscriber has been handed the edit that removed it.

**Threads.** One lock (``self._lock``, the ``RLock`` of ``self.tasks``) guards the
engine's state; the caller's thread takes it for every operation. Background work
(flushes, merges, seals) runs elsewhere and its results are installed by the store's
maintainer thread. Nobody waits for background work while holding the lock: waiting is
``self.tasks.wait(...)``, which releases it.
"""

from __future__ import annotations

import abc
import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from remotes.base import Remote

from . import background, current, expiry, snapshots
from .checks import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Option,
    check_key,
    check_ops,
    check_put,
    check_value,
    parse_options,
)
from .checksum import file_crc
from .delivery import Delivery, Subscriber
from .errors import StoreClosedError, StoreError
from .files import FileSet, dir_bytes
from .fs import FileSystem
from .snapshot_info import Frozen, RestoreInfo, SnapshotInfo
from .snapshots import SnapshotState
from .tasks import Tasks
from .version import FileEntry, VersionEdit

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
    "check_put",
    "check_ops",
    "file_crc",
]

_MISSING = object()
_LOCK_NAME = "LOCK"


class Store(abc.ABC):
    """A key-value store over bytes with incremental snapshots. See :func:`statestores.open`."""

    engine: ClassVar[str] = ""
    #: Prefix of every data file name of this engine (``<prefix>-…``).
    PREFIX: ClassVar[str] = ""
    #: Engine options (beyond ``sync``): name → :class:`Option`.
    OPTIONS: ClassVar[dict[str, Option]] = {}
    #: Default for ``sync`` when the caller does not give one.
    DEFAULT_SYNC: ClassVar[str] = "os"
    #: Whether the engine, opened on a snapshot's files, writes only into files it begins
    #: then, never into one the snapshot names (:meth:`stands_at`, ``snapshots.adopt``).
    NEW_FILES_AT_OPEN: ClassVar[bool] = False

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
        if remote is not None and not isinstance(remote, Remote):
            raise TypeError(f"remote must be a remotes.Remote, got {type(remote).__name__}")
        self.options = self.parse_options(options)
        self.sync: str = self.options["sync"]
        self.directory = os.path.abspath(os.fspath(directory))
        self.fs = fs if fs is not None else FileSystem()
        self.remote = remote
        #: the parts (constant after construction)
        self.tasks = Tasks(f"statestores-{self.engine}-maint")
        self.files = FileSet(self.fs, self.directory, self.PREFIX, fsync=self.sync == "fsync")
        self.delivery = Delivery(self.files, self.tasks)
        self.snapshot_state = SnapshotState()
        self._lock = self.tasks.lock
        self._closed = False
        self._paused = 0  # > 0: no new background merge starts (restore, close)
        #: Values expiring at or before this time (ms) are dropped by merges; None: none
        #: set yet (:meth:`set_expiry_horizon`, :mod:`statestores.expiry`).
        self._horizon: int | None = None
        #: files a replica opened already (:meth:`preopen`, by name; ``statestores.replica``):
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
            self.tasks.maintainer.stop()
            self._abandon()
            self.fs.unlock(self._lock_fd)
            raise

    @classmethod
    def parse_options(cls, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` checked against this engine's options, defaults filled in."""
        return parse_options(cls.engine, cls.OPTIONS, cls.DEFAULT_SYNC, given)

    # ------------------------------------------------------------------ engine hooks
    # What an engine provides, with the contracts, is :class:`statestores.engine.Engine`;
    # these are its declarations and the defaults of the optional ones.

    @classmethod
    def preopen(cls, fs: FileSystem, path: str, entry: FileEntry) -> Any | None:
        """Engine hook (``Engine.preopen``); default: nothing to open ahead."""
        return None

    def _has_local_state(self) -> bool:
        return current.exists(self.fs, self.directory)

    @abc.abstractmethod
    def _open(self) -> None: ...

    def _open_empty(self) -> None:
        self._open()

    @abc.abstractmethod
    def _close(self) -> None: ...

    def _abandon(self) -> None:
        """Default: close a WAL descriptor kept in ``self._wal_fd``; engines holding more
        extend it and call ``super()._abandon()``."""
        fd = getattr(self, "_wal_fd", None)
        if fd is not None:
            try:
                self.fs.close(fd)
            except OSError:
                pass  # the open already failed; the error being raised is the one that matters
            self._wal_fd = None

    @abc.abstractmethod
    def _freeze(self) -> Frozen: ...

    @abc.abstractmethod
    def _install(
        self, entries: list[FileEntry], replaced: frozenset[str] = frozenset()
    ) -> None: ...

    def _idle(self) -> bool:
        return True

    def _kick(self) -> None:  # noqa: B027 - optional hook
        """Default: no background work."""

    def _abandon_merge(self) -> None:  # noqa: B027 - optional hook
        """Default: nothing (the store waits for the merge in flight)."""

    @abc.abstractmethod
    def _stats(self) -> dict[str, Any]: ...

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
        self.check_open()
        return self._prefixed(prefix)

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Default: filter and sort :meth:`items`."""
        return iter(sorted(kv for kv in self.items() if kv[0].startswith(prefix)))

    @abc.abstractmethod
    def flush(self) -> None:
        """Push buffered writes to files (durability per ``sync``)."""

    def _compact(self) -> None:  # noqa: B027 - optional hook
        """Default: nothing (an engine without merges)."""

    # ------------------------------------------------------------------ files and versions

    def check_open(self) -> None:
        """Raise :class:`StoreClosedError` if the store is closed."""
        if self._closed:
            raise StoreClosedError(f"store at {self.directory} is closed")

    @property
    def local_background(self) -> bool:
        """Background jobs run in this process when the file system is not the real one
        (a test's FaultyFS must see the job's writes, crash included)."""
        return type(self.fs) is not FileSystem

    @property
    def _bg_fs(self) -> FileSystem | None:
        """The file system a background job uses: ours when it runs locally."""
        return self.fs if self.local_background else None

    def _edit(self, added: Iterable[FileEntry] = (), removed: Iterable[str] = ()) -> VersionEdit:
        """(lock held) The one way the live file set changes: apply, persist, publish, and
        delete what the edit removed once nothing needs it."""
        edit = self.files.apply(added, removed)
        self.delivery.publish(edit)
        return edit

    def _reset_version(self, entries: Iterable[FileEntry]) -> VersionEdit:
        """(lock held) One edit that makes the version exactly ``entries``."""
        return self._edit(*self.files.reset_to(entries))

    def version(self) -> tuple[int, list[FileEntry]]:
        """``(seq, files)``: the live version's number and its files (age order per kind)."""
        self.check_open()
        with self._lock:
            v = self.files.version
            return v.seq, sorted(v.files.values(), key=lambda e: (e.kind, -e.level, e.seq))

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for every later :class:`VersionEdit`, in sequence order,
        after it is durable, and for every :class:`SnapshotMark` (a snapshot this store
        completed) at its place in that order; returns a function that unsubscribes.

        Files an edit removes, and the files a mark names, stay on disk until the callback
        returned. The callback runs
        on the store's maintainer thread: it must hand the edit to a thread of its own
        (e.g. put it on a queue) and never call back into the store or block.
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self.check_open()
        with self._lock:
            self.delivery.add(callback)

        def unsubscribe() -> None:
            with self._lock:
                self.delivery.remove(callback)

        return unsubscribe

    # ------------------------------------------------------------------ background work

    def _quiesce(self, *, abandon: bool = False) -> None:
        """Stop starting merges and wait, without holding the lock, until none is in flight.
        ``abandon``: a restore, which replaces the files a merge in flight reads — drop its
        result instead of waiting for it (``_abandon_merge``)."""
        with self._lock:
            self._paused += 1
            if abandon:
                self._abandon_merge()
            self.tasks.wait_quietly(self._idle)

    def _resume(self) -> None:
        with self._lock:
            self._paused = max(0, self._paused - 1)
            if not self._paused and not self._closed:
                self._kick()

    def pause_merges(self) -> Callable[[], None]:
        """Start no new merge until the returned function is called (once; later calls do
        nothing). A merge in flight finishes; flushes go on. For a store whose files are
        being shipped to a new owner: a merge then would ship its state a second time."""
        with self._lock:
            self.check_open()
            self._paused += 1
        resumed = threading.Event()

        def resume() -> None:
            if not resumed.is_set():
                resumed.set()
                self._resume()

        return resume

    def settle(self) -> None:
        """Wait until no background flush, merge, seal or other maintainer task of this
        store is in flight (e.g. before looking at its files)."""
        for _ in range(100):
            with self._lock:
                self.tasks.wait(
                    lambda: self._closed or (self._idle() and self.delivery.idle())
                )
                if self._closed:
                    return
            marker = threading.Event()
            if not self.tasks.maintainer.post(marker.set):
                return
            background.wait_until(marker.is_set, marker.wait)  # (FIFO: all before it ran)
            with self._lock:
                if self._idle() and self.delivery.idle():
                    return

    # ------------------------------------------------------------------ the parts' host
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def merges_paused(self) -> bool:
        """No new merge may start (:meth:`pause_merges`, a restore, a close, an open)."""
        return self._paused > 0

    def edit_files(
        self, added: Iterable[FileEntry] = (), removed: Iterable[str] = ()
    ) -> VersionEdit:
        """(lock held) :meth:`_edit`, for the parts an engine holds (``log.host``)."""
        return self._edit(added, removed)

    # ------------------------------------------------------------------ snapshots' host
    # What :mod:`statestores.snapshots` may do to a store (its ``SnapshotHost`` Protocol).

    @property
    def lock(self) -> threading.RLock:
        """The store lock (for the parts and modules that share it)."""
        return self._lock

    def file_path(self, name: str) -> str:
        """The path of the store's file ``name``."""
        return self.files.path(name)

    def freeze_files(self) -> Frozen:
        """(lock held) Name the files that hold all state written so far (``_freeze``)."""
        return self._freeze()

    def pin_files(self, names: Iterable[str]) -> None:
        """Keep ``names`` on disk until :meth:`unpin_files`."""
        with self._lock:
            self.files.pin(names)

    def unpin_files(self, names: Iterable[str]) -> None:
        """Release a pin of each of ``names``; delete those nothing needs any more."""
        with self._lock:
            self.files.unpin(names)

    def publish_snapshot(self, snapshot_id: int, entries: Iterable[FileEntry]) -> None:
        """Tell subscribers that snapshot ``snapshot_id`` (``entries``) is complete; its
        files stay on disk until every subscriber has been handed the mark."""
        with self._lock:
            if not self._closed:
                self.delivery.publish_mark(snapshot_id, entries)

    def pause_for_restore(self) -> None:
        """Start no merge, drop the one in flight, wait until background work is idle."""
        self._quiesce(abandon=True)

    def resume_after_restore(self) -> None:
        """Undo :meth:`pause_for_restore`."""
        self._resume()

    def stands_at(self, names: Iterable[str], seq_floor: int) -> bool:
        """(lock held) Whether this store, opened on the files ``names`` and not written
        since, stands exactly there (see :data:`NEW_FILES_AT_OPEN`); if so, new files are
        numbered above ``seq_floor`` from now on."""
        return self.NEW_FILES_AT_OPEN and self.files.stands_at(names, seq_floor)

    def install_snapshot(
        self, entries: list[FileEntry], replaced: frozenset[str], seq_floor: int
    ) -> None:
        """(lock held) Become exactly ``entries``, numbering new files above ``seq_floor``."""
        self.files.skip_to(seq_floor)
        self._install(entries, replaced)

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
        self.check_open()
        with self._lock:
            self.check_open()
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
        self.check_open()
        return snapshots.freeze(self, self._require_remote("snapshot"), snapshot_id, delay)

    def snapshots(self) -> list[int]:
        """Ids of the complete snapshots in the remote, ascending."""
        self.check_open()
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
        self.check_open()
        remote = self._require_remote("restore")
        with self._lock:
            self._horizon = None  # before the restore's merges may start
        return snapshots.restore(self, remote, snapshot_id)

    # ------------------------------------------------------------------ lifecycle

    def stats(self) -> dict[str, Any]:
        """Memory, disk, files and engine-specific counters (a fresh dict each call)."""
        self.check_open()
        with self._lock:
            s = self._stats()
            s["version"] = self.files.version.seq
        s.setdefault("engine", self.engine)
        s.setdefault("directory", self.directory)
        s.setdefault("disk_bytes", dir_bytes(self.directory))
        s["pinned_files"] = len(self.files.pins)
        s["last_snapshot_id"] = self.snapshot_state.last_id
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
                    self.tasks.notify()
        finally:
            self.tasks.maintainer.stop()  # delivers queued edits, then ends (we hold no lock)
            snapshots.shutdown(self)
            try:
                with self._lock:
                    self.files.remove_strays()
            except OSError as exc:  # e.g. a FaultyFS that died: nothing more to clean
                log.debug("removing leftovers of %s failed: %s", self.directory, exc)
            self.fs.unlock(self._lock_fd)

