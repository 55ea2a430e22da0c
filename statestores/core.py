"""The part of a store every engine shares below its data API: the live file set (versions
and their edits), file lifetimes, subscribers, and the background-work rule.

:class:`StoreCore` holds it; :class:`~statestores.base.Store` adds the data API, the
mapping protocol, snapshots and the open/close life cycle on top, and an engine
subclasses that. :mod:`statestores.snapshots` works against this core alone.

**Files.** All durable state is a :class:`~statestores.version.Version`: a set of files
whose names never change meaning (names carry a sequence number from
:meth:`StoreCore._next_seq`, which continues above every name the directory or the remote
has seen). Every change of the set is one :meth:`StoreCore._edit`: it persists
``CURRENT``, queues the edit for subscribers (:meth:`StoreCore.subscribe`), and is the one
place that decides when a file is deleted — once no version names it, no snapshot, upload
or restore pins it (an upload keeps its pin while its snapshot is one of the newest
``snapshots.KEEP_LOCAL``), and every subscriber has been handed the edit that removed it.

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
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from remotes.base import Remote

from . import current
from .checks import Option, parse_options
from .errors import StoreClosedError, StoreError
from .fs import FileSystem
from .maintainer import Maintainer
from .snapshot_info import Frozen, SnapshotInfo
from .version import FileEntry, SnapshotMark, Version, VersionEdit, decode_entries, seq_of

log = logging.getLogger("statestores")

__all__ = ["StoreCore", "Subscriber"]

#: A version-edit subscriber: called with each edit, in order, after it is durable.
Subscriber = Callable[[VersionEdit | SnapshotMark], None]

#: Edits waiting for delivery to subscribers, at most; beyond it the editor waits.
_OUTBOX_LIMIT = 256


class StoreCore(abc.ABC):
    """The live file set and the background-work machinery of one store directory."""

    engine: ClassVar[str] = ""
    #: Prefix of every data file name of this engine (``<prefix>-…``).
    PREFIX: ClassVar[str] = ""
    #: Engine options (beyond ``sync``): name → :class:`Option`.
    OPTIONS: ClassVar[dict[str, Option]] = {}
    #: Default for ``sync`` when the caller does not give one.
    DEFAULT_SYNC: ClassVar[str] = "os"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        remote: Remote | None,
        fs: FileSystem | None,
        options: dict[str, Any],
    ) -> None:
        """The in-memory state of a store not yet opened: nothing touches the directory."""
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
        #: the file names of the newest uploaded snapshots, oldest first, kept pinned so a
        #: rollback to one of them needs no download (``snapshots.KEEP_LOCAL``; the uploader
        #: thread owns it)
        self._kept: deque[tuple[str, ...]] = deque()
        self._pending_uploads: list[concurrent.futures.Future[SnapshotInfo]] = []
        self._last_snapshot_id: int | None = None
        self._remote_files: dict[str, int] | None = None  # cache of remote.list_files()
        self._file_infos: dict[str, Any] | None = None  # name → FileInfo known without reading
        #: name → (size, crc32c) of files checked against their crc when they arrived here
        #: (a promoted replica's): a restore trusts them instead of reading them again
        self._verified: dict[str, tuple[int, int]] = {}
        #: Values expiring at or before this time (ms) are dropped by merges; None: none
        #: set yet (``Store.set_expiry_horizon``, :mod:`statestores.expiry`).
        self._horizon: int | None = None

    # ------------------------------------------------------------------ options

    @classmethod
    def _parse_options(cls, given: dict[str, Any]) -> dict[str, Any]:
        return parse_options(cls.engine, cls.OPTIONS, cls.DEFAULT_SYNC, given)

    # ------------------------------------------------------------------ engine hooks

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

    # ------------------------------------------------------------------ versions and files

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store at {self.directory} is closed")

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
        current.write_version(
            self.fs, self.directory, self._seq, self._version, sync=self.sync == "fsync"
        )

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
                    log.exception(
                        "version subscriber %r failed on %r of %s", cb, event, self.directory
                    )
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

    def _on_done(
        self, fn: Callable[[Any], Any]
    ) -> Callable[[concurrent.futures.Future[Any]], None]:
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
        """(lock held) Wake threads waiting in :meth:`_wait` (after installing background
        results)."""
        self._cond.notify_all()

    def _quiesce(self, *, abandon: bool = False) -> None:
        """Stop starting merges and wait, without holding the lock, until none is in flight.
        ``abandon``: a restore, which replaces the files a merge in flight reads — drop its
        result instead of waiting for it (``_abandon_merge``)."""
        with self._lock:
            self._paused += 1
            if abandon:
                self._abandon_merge()
            self._cond.wait_for(lambda: self._idle() or self._bg_error is not None)

    def _abandon_merge(self) -> None:  # noqa: B027 - optional hook
        """Engine hook (lock held, merges paused): forget the merge in flight, if any, so
        :meth:`_idle` need not wait for it; its output is deleted when it ends, its inputs
        stay on disk until then. Default: nothing (the store waits for it)."""

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
