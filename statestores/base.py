"""What every engine shares: argument checks, options, the mapping protocol, the live
file set (versions and their edits), file lifetimes, and the background-work rule.

An engine subclasses :class:`Store` and implements the hooks marked *engine hook*.

**Files.** All durable state is a :class:`~statestores.version.Version`: a set of files
whose names never change meaning (names carry a sequence number from
:meth:`Store._next_seq`, which continues above every name the directory or the remote
has seen). Every change of the set is one :meth:`Store._edit`: it persists ``CURRENT``,
queues the edit for subscribers (:meth:`Store.subscribe`), and is the one place that
decides when a file is deleted — once no version names it, no snapshot, upload or
restore pins it, and every subscriber has been handed the edit that removed it.

**Threads.** One lock (``self._lock``, an ``RLock``) guards the engine's state; the
caller's thread takes it for every operation. Background work (flushes, merges, seals)
runs elsewhere and its results are installed by the store's :class:`Maintainer` thread.
Nobody waits for background work while holding the lock: waiting is
``self._cond.wait_for(...)``, which releases it.
"""

from __future__ import annotations

import abc
import concurrent.futures
import logging
import os
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from remotes.base import Remote

from . import current, snapshots
from .checks import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Option,
    check_key,
    check_ops,
    check_value,
    parse_options,
)
from .errors import StoreClosedError, StoreError
from .fs import FileSystem
from .maintainer import Maintainer
from .snapshots import Frozen, RestoreInfo, SnapshotInfo, file_crc
from .version import FileEntry, SnapshotMark, Version, VersionEdit, decode_entries, seq_of

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

#: A version-edit subscriber: called with each edit, in order, after it is durable.
Subscriber = Callable[[VersionEdit | SnapshotMark], None]

_MISSING = object()
_LOCK_NAME = "LOCK"
#: Edits waiting for delivery to subscribers, at most; beyond it the editor waits.
_OUTBOX_LIMIT = 256


class Store(abc.ABC):
    """A key-value store over bytes with incremental snapshots. See :func:`statestores.open`."""

    engine: ClassVar[str] = ""
    #: Prefix of every data file name of this engine (``<prefix>-…``).
    PREFIX: ClassVar[str] = ""
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
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._paused = 0  # > 0: no new background merge starts (restore, close)
        #: The first exception an install on the maintainer raised: the store's files may
        #: no longer match its memory, so waiters raise it instead of waiting forever.
        self._bg_error: BaseException | None = None
        self._seq = 0  # the last sequence number used in a file name
        self._version = Version()
        self._pins: Counter[str] = Counter()
        self._subscribers: list[Subscriber] = []
        self._outbox: deque[VersionEdit | SnapshotMark] = deque()
        self._maint = Maintainer(f"statestores-{self.engine}-maint")
        self._scheduled: set[str] = set()  # coalesced maintainer tasks posted, not yet started
        self._uploader: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending_uploads: list[concurrent.futures.Future[SnapshotInfo]] = []
        self._last_snapshot_id: int | None = None
        self._remote_files: dict[str, int] | None = None  # cache of remote.list_files()
        self._file_infos: dict[str, Any] | None = None  # name → FileInfo known without reading
        #: name → (size, crc32c) of files checked against their crc when they arrived here
        #: (a promoted replica's): a restore trusts them instead of reading them again
        self._verified: dict[str, tuple[int, int]] = {}
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
        except BaseException:
            self._closed = True
            self._maint.stop()
            self._abandon()
            self.fs.unlock(self._lock_fd)
            raise

    # ------------------------------------------------------------------ options

    @classmethod
    def _parse_options(cls, given: dict[str, Any]) -> dict[str, Any]:
        return parse_options(cls.engine, cls.OPTIONS, cls.DEFAULT_SYNC, given)

    # ------------------------------------------------------------------ engine hooks

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
    def _freeze(self) -> Frozen:
        """Engine hook (lock held): name the files that hold all state written so far.

        Must be cheap (the caller waits): in-memory data may be handed to the maintainer
        thread, with futures in ``Frozen.pending`` that resolve once its files are durable.
        """

    @abc.abstractmethod
    def _install(self, entries: list[FileEntry], replaced: frozenset[str] = frozenset()) -> None:
        """Engine hook (lock held, background work idle): become exactly the state of
        ``entries``, whose files are present and verified. Drop all other state and end
        with one :meth:`_reset_version` to ``entries`` (plus any new WAL). ``replaced``:
        files the restore just put in place under a name a local (corrupt) file had — an
        engine that keeps files open must reopen these."""

    def _idle(self) -> bool:
        """Engine hook (lock held): no background work of this store is in flight."""
        return True

    def _kick(self) -> None:  # noqa: B027 - optional hook
        """Engine hook (lock held): start background work that may be due (a merge)."""

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

    # ------------------------------------------------------------------ versions and files

    @property
    def _local_background(self) -> bool:
        """Background jobs run in this process when the file system is not the real one
        (a test's FaultyFS must see the job's writes, crash included)."""
        return type(self.fs) is not FileSystem

    @property
    def _bg_fs(self) -> FileSystem | None:
        """The file system a background job uses: ours when it runs locally."""
        return self.fs if self._local_background else None

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _next_seq(self) -> int:
        """A fresh sequence number for a new file name (lock held)."""
        self._seq += 1
        return self._seq

    def _load_version(self) -> Version:
        """(open) Read ``CURRENT`` into ``self._version``, continue numbering above every
        name in the directory, and delete leftovers no version names."""
        path = self._path(current.NAME)
        doc = current.read(self.fs, self.directory)
        self._seq = int(doc.get("seq", 0))
        entries = decode_entries(doc.get("files", []), path)
        self._version = Version(int(doc.get("version", 0)), {e.name: e for e in entries})
        for e in entries:
            if not self.fs.exists(self._path(e.name)):
                raise StoreError(f"{self._path(e.name)}: named in {path} but missing")
        names = self.fs.listdir(self.directory)
        self._seq = max([self._seq] + [seq_of(n) for n in names if n.startswith(self.PREFIX + "-")])
        self._remove_strays(names)
        return self._version

    def _remove_strays(self, names: Iterable[str] | None = None) -> None:
        """Delete this engine's files that no version names and nothing pins (leftovers of
        a crash: unfinished ``.tmp`` outputs, files a crash left unreferenced)."""
        prefix = self.PREFIX + "-"
        for name in self.fs.listdir(self.directory) if names is None else names:
            if name.startswith(prefix) and name not in self._version and not self._pins[name]:
                self.fs.remove(self._path(name))

    def _write_current(self) -> None:
        current.write_version(self.fs, self.directory, self._seq, self._version, sync=self.sync == "fsync")

    def _edit(self, added: Iterable[FileEntry] = (), removed: Iterable[str] = ()) -> VersionEdit:
        """(lock held) The one way the live file set changes: apply, persist, publish, and
        delete what the edit removed once nothing needs it."""
        assert self._lock._is_owned(), "Store._edit needs the store lock"  # type: ignore[attr-defined]
        edit = self._version.apply(added, removed)
        self._write_current()
        self._publish(edit)
        return edit

    def _reset_version(self, entries: Iterable[FileEntry]) -> VersionEdit:
        """(lock held) One edit that makes the version exactly ``entries``."""
        new = {e.name: e for e in entries}
        old = self._version.files
        added = [e for n, e in new.items() if old.get(n) != e]
        removed = [n for n in old if n not in new or old[n] != new[n]]
        return self._edit(added, removed)

    def _publish(self, edit: VersionEdit) -> None:
        if not self._subscribers:
            self._maybe_delete(edit.removed)
            return
        # removed files stay on disk until every subscriber has been handed this edit
        self._enqueue(edit, edit.removed)

    def _publish_mark(self, snapshot_id: int, entries: Iterable[FileEntry]) -> None:
        """Tell subscribers that snapshot ``snapshot_id`` (``entries``) is complete; its
        files stay on disk until every subscriber has been handed the mark."""
        with self._lock:
            if not self._subscribers or self._closed:
                return
            mark = SnapshotMark(snapshot_id, self._version.seq, tuple(entries))
            self._enqueue(mark, [e.name for e in mark.files])

    def _enqueue(self, event: VersionEdit | SnapshotMark, pinned: Iterable[str]) -> None:
        """(lock held) Queue ``event`` for subscribers, pinning ``pinned`` until delivered."""
        self._pin(pinned)
        if len(self._outbox) >= _OUTBOX_LIMIT and not self._maint.on_thread():
            self._wait(lambda: len(self._outbox) < _OUTBOX_LIMIT)
        self._outbox.append(event)
        self._post_once(self._deliver)

    def _deliver(self) -> None:
        """(maintainer) Hand queued edits and marks to subscribers in order, without the lock."""
        while True:
            with self._lock:
                if not self._outbox:
                    self._cond.notify_all()
                    return
                event = self._outbox.popleft()
                subs = list(self._subscribers)
            for cb in subs:
                try:
                    cb(event)
                except Exception:
                    log.exception("version subscriber %r failed on %r of %s", cb, event, self.directory)
            with self._lock:
                if isinstance(event, SnapshotMark):
                    self._unpin(e.name for e in event.files)
                else:
                    self._unpin(event.removed)

    def _pin(self, names: Iterable[str]) -> None:
        with self._lock:
            for n in names:
                self._pins[n] += 1

    def _unpin(self, names: Iterable[str]) -> None:
        with self._lock:
            done = []
            for n in names:
                self._pins[n] -= 1
                if self._pins[n] <= 0:
                    del self._pins[n]
                    done.append(n)
            self._maybe_delete(done)

    def _maybe_delete(self, names: Iterable[str]) -> None:
        """(lock held) Delete each of ``names`` that no version names and nothing pins."""
        for n in names:
            if n not in self._version and not self._pins[n]:
                self.fs.remove(self._path(n))

    def _frozen_version(
        self,
        *,
        skip: Iterable[str] = (),
        extra: Iterable[FileEntry] = (),
        pending: Iterable[concurrent.futures.Future[Any]] = (),
    ) -> Frozen:
        """(lock held) A snapshot's files, derived from the live version: every file but
        ``skip`` (files still being written to, e.g. the active WAL), plus ``extra`` files
        a hand-off is writing (their ``pending`` futures resolve once they are durable)."""
        skipped = set(skip)
        entries = [e for e in self._version if e.name not in skipped]
        have = {e.name for e in entries}
        entries += [e for e in extra if e.name not in have]
        return Frozen(entries, list(pending))

    def version(self) -> tuple[int, list[FileEntry]]:
        """``(seq, files)``: the live version's number and its files (age order per kind)."""
        self._check_open()
        with self._lock:
            v = self._version
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
        self._check_open()
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    # ------------------------------------------------------------------ background work

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Hand ``fn(*args)`` to the maintainer thread (a done-callback's only job). If it
        raises, the store remembers the error and wakes every waiter with it."""

        def task() -> None:
            try:
                fn(*args)
            except BaseException as exc:
                with self._lock:
                    if self._bg_error is None:
                        self._bg_error = exc
                    self._cond.notify_all()
                raise

        self._maint.post(task)

    def _post_once(self, fn: Callable[[], Any]) -> None:
        """(lock held) Post ``fn`` unless it is already posted and has not started: work
        whose triggers can come at any rate (WAL switches, edits for subscribers) costs
        one inbox slot, however many triggers."""
        key = fn.__name__
        if key in self._scheduled:
            return
        self._scheduled.add(key)

        def once() -> None:
            with self._lock:
                self._scheduled.discard(key)
            fn()

        self._post(once)

    def _on_done(self, fn: Callable[[Any], Any]) -> Callable[[concurrent.futures.Future[Any]], None]:
        """A done-callback that hands the future to ``fn`` on the maintainer thread."""

        def callback(fut: concurrent.futures.Future[Any]) -> None:
            self._post(fn, fut)

        return callback

    def _wait(self, predicate: Callable[[], bool]) -> None:
        """(lock held) Wait for background work until ``predicate()``, releasing the lock
        meanwhile; raises the background error if an install failed."""
        self._cond.wait_for(lambda: predicate() or self._bg_error is not None)
        if self._bg_error is not None and not predicate():
            raise self._bg_error

    def _notify(self) -> None:
        """(lock held) Wake threads waiting in :meth:`_wait` (after installing background results)."""
        self._cond.notify_all()

    def _quiesce(self) -> None:
        """Stop starting merges and wait, without holding the lock, until none is in flight."""
        with self._lock:
            self._paused += 1
            self._cond.wait_for(lambda: self._idle() or self._bg_error is not None)

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
            self._check_open()
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
                self._wait(lambda: self._closed or (self._idle() and not self._outbox))
                if self._closed:
                    return
            marker = threading.Event()
            if not self._maint.post(marker.set):
                return
            marker.wait()  # the inbox is FIFO: everything posted before the marker has run
            with self._lock:
                if self._idle() and not self._outbox:
                    return

    # ------------------------------------------------------------------ snapshots

    def _require_remote(self, what: str) -> Remote:
        if self.remote is None:
            raise StoreError(f"{what} needs a remote: open the store with remote=PathRemote(...) or MinioRemote(...)")
        return self.remote

    def snapshot(self, snapshot_id: int) -> SnapshotInfo:
        """Take snapshot ``snapshot_id``; durable in the remote when this returns."""
        return self.snapshot_async(snapshot_id).result()

    def snapshot_async(self, snapshot_id: int, *, delay: float = 0.0) -> concurrent.futures.Future[SnapshotInfo]:
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
        unknown id, leaving the store as it was.
        """
        self._check_open()
        return snapshots.restore(self, self._require_remote("restore"), snapshot_id)

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
