"""The primary's side of replication: a store's edits and snapshot marks, with their files.

A :class:`Shipper` subscribes to a store. On the store's maintainer thread it only
hard-links each new immutable file into its staging directory (a link, not a copy: the
store may delete its name as soon as a merge replaces it, the link keeps the bytes) and
queues the event. A store can write a file of a name it used before (a restore re-hints
a WAL, downloads a file again): each staged link is therefore named by the file and a
generation (``al-0-0000000179.hint.12``), so an older event still delivers the bytes it
named and a newer one its own; followers read the queue through :meth:`Shipper.stream`, each from
where it stands. The queue (the *backlog*) is bounded: a follower too far behind — or
new — gets one *base* edit (the whole live file set) and continues from there.

Files a follower can store are the immutable ones (runs, segments, hints, dumps). WALs
are still being written, so an edit's WALs are not shipped; a snapshot mark ships the
sealed WALs its snapshot names, so a follower holds every file of each snapshot.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import uuid
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checksum import file_crc
from ..version import FileEntry, SnapshotMark, VersionEdit
from .wire import EditMsg, Hello, MarkMsg, ShippedFile, Tip, after

if TYPE_CHECKING:
    from ..base import Store

__all__ = ["SHIPPED_KINDS", "Delivery", "Shipper"]

log = logging.getLogger("statestores.replica")

#: Kinds of files an edit ships (a WAL is shipped only as part of a snapshot mark).
SHIPPED_KINDS = ("run", "segment", "hint", "dump")
#: Events kept for followers that resume; one further behind gets a base edit. Each kept
#: edit keeps its added files staged (on disk) even after a merge replaced them, so the
#: bound is also one on the disk a slow follower can cost the primary.
DEFAULT_BACKLOG = 256


@dataclass(frozen=True)
class Delivery:
    """One message for a follower and where the bodies it flags are (``name → path``)."""

    msg: EditMsg | MarkMsg
    paths: dict[str, str]


@dataclass(frozen=True)
class _Event:
    n: int  # position in this shipper's stream
    event: VersionEdit | SnapshotMark
    staged: dict[str, str]  # file name → its staged link (the name of a generation)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.staged.values())


class Shipper:
    """Ships ``store``'s edits and snapshot marks to followers (see the module docstring).

    ``name`` identifies the store to followers (default: its directory's base name);
    ``staging`` must be on the store's file system (default: ``<directory>.ship``).
    """

    def __init__(self, store: Store, *, name: str | None = None, staging: str | None = None,
                 backlog: int = DEFAULT_BACKLOG) -> None:
        if backlog < 1:
            raise ValueError(f"backlog must be >= 1 events, got {backlog}")
        self.store = store
        self.name = name or os.path.basename(store.directory)
        self.staging = os.path.abspath(staging or store.directory + ".ship")
        shutil.rmtree(self.staging, ignore_errors=True)  # links a crashed shipper left
        os.makedirs(self.staging)
        self._limit = backlog
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._refs: Counter[str] = Counter()  # staged link → references
        self._crcs: dict[str, tuple[int, int]] = {}  # staged link → (size, crc)
        self._current: dict[str, tuple[str, tuple[int, ...]]] = {}  # name → newest link, stat
        self._gen = 0
        self._backlog: deque[_Event] = deque()
        self._n = 0  # events so far
        self._mark: _Event | None = None  # the newest snapshot mark (its files stay staged)
        self._copy_warned = False
        self._acked_mark = -1  # the newest snapshot mark a follower acknowledged installing
        self._ack_listeners: list[Callable[[], None]] = []
        self.followers = 0  # streams open now
        #: This shipper's lineage: followers resume only a stream of the same origin.
        self.origin = uuid.uuid4().hex
        with store.lock, self._lock:  # no edit between reading the version and subscribing
            seq, files = store.version()
            #: the live version's shipped files: name → (entry, its staged link)
            self._live = {
                e.name: (e, self._stage(e.name)) for e in files if e.kind in SHIPPED_KINDS
            }
            self._ref(k for _, k in self._live.values())
            self._seq = seq
            self._unsubscribe = store.subscribe(self._on_event)

    # ------------------------------------------------------------------ the store's side

    def _stage(self, name: str) -> str:
        """(lock held) The staged link of the store's file ``name`` as it is now: the one
        staged before if it is still referenced and the same file, else a new generation
        (the store keeps the file on disk while we are called)."""
        src = self.store.file_path(name)
        st = os.stat(src)
        stat = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        cur = self._current.get(name)
        if cur is not None and cur[1] == stat and self._refs[cur[0]] > 0:
            return cur[0]
        self._gen += 1
        key = f"{name}.{self._gen}"
        dst = os.path.join(self.staging, key)
        try:
            os.link(src, dst)
        except OSError as exc:
            if exc.errno != 18:  # EXDEV: staging on another file system; copy instead
                raise
            if not self._copy_warned:
                log.warning(
                    "staging %s is on another file system than %s: copying files", self.staging,
                    self.store.directory,
                )
                self._copy_warned = True
            shutil.copyfile(src, dst)
        self._current[name] = (key, stat)
        return key

    def _ref(self, keys: Iterable[str]) -> None:
        for k in keys:
            self._refs[k] += 1

    def _release(self, keys: Iterable[str]) -> None:
        """(lock held) Drop references; unlink staged links nothing references."""
        for k in keys:
            self._refs[k] -= 1
            if self._refs[k] <= 0:
                del self._refs[k]
                self._crcs.pop(k, None)
                name = k.rsplit(".", 1)[0]
                if self._current.get(name, ("",))[0] == k:
                    del self._current[name]
                try:
                    os.remove(os.path.join(self.staging, k))
                except FileNotFoundError:
                    pass

    def _on_event(self, event: VersionEdit | SnapshotMark) -> None:
        """(the store's maintainer thread) Stage the event's files and queue it; never
        blocks (the lock is held by streams only for bookkeeping, never across I/O but a
        link). Staging and referencing happen under one lock: a stream dropping the last
        reference to a link cannot unlink it between the two."""
        with self._lock:
            if self._closed:
                return
            if isinstance(event, VersionEdit):
                if event.seq <= self._seq:
                    return
                entries = [e for e in event.added if e.kind in SHIPPED_KINDS]
            else:
                entries = list(event.files)
            staged = {e.name: self._stage(e.name) for e in entries}
            self._n += 1
            ev = _Event(self._n, event, staged)
            self._ref(ev.keys)
            if isinstance(event, VersionEdit):
                # references are taken before any is dropped: a file removed and added
                # back by one edit keeps its link
                gone = [old[1] for n in event.removed if (old := self._live.pop(n, None))]
                for e in entries:
                    self._ref([staged[e.name]])
                    old = self._live.get(e.name)
                    if old is not None:
                        gone.append(old[1])
                    self._live[e.name] = (e, staged[e.name])
                self._release(gone)
                self._seq = event.seq
            else:
                if self._mark is not None:
                    self._release(self._mark.keys)
                self._ref(ev.keys)
                self._mark = ev
            self._backlog.append(ev)
            while len(self._backlog) > self._limit:
                self._release(self._backlog.popleft().keys)
            self._cond.notify_all()

    # ------------------------------------------------------------------ the followers' side

    def _shipped(self, entries: Iterable[FileEntry], staged: dict[str, str],
                 have: set[str]) -> tuple[ShippedFile, ...]:
        out = []
        for e in entries:
            key = staged[e.name]
            info = self._crcs.get(key)
            if info is None:
                info = file_crc(self.store.fs, os.path.join(self.staging, key))
                self._crcs[key] = info
            out.append(ShippedFile(e, info[0], info[1], e.name not in have))
        return tuple(out)

    def _paths(self, staged: dict[str, str]) -> dict[str, str]:
        return {n: os.path.join(self.staging, k) for n, k in staged.items()}

    def _delivery(self, ev: _Event, have: set[str]) -> Delivery:
        event = ev.event
        if isinstance(event, VersionEdit):
            added = [e for e in event.added if e.kind in SHIPPED_KINDS]
            msg: EditMsg | MarkMsg = EditMsg(
                event.seq, self._shipped(added, ev.staged, have), tuple(event.removed)
            )
        else:
            msg = MarkMsg(event.snapshot_id, event.seq, self._shipped(event.files, ev.staged, have))
        return Delivery(msg, self._paths(ev.staged))

    def stream(self, hello: Hello, *, idle: float = 0.2) -> Generator[Delivery | Tip, None, None]:
        """Everything a follower standing at ``hello`` lacks, then new events as they come.

        Yields a :class:`Tip` after ``idle`` seconds without news: the heartbeat that lets
        a follower notice a lost message, and a transport notice it was stopped. The files
        of the delivery just yielded stay staged until the caller asks for the next one.
        Ends when the shipper closes.
        """
        at = hello  # where the follower stands once it installed what this stream sent
        held: list[str] = []
        with self._lock:
            self.followers += 1
        try:
            with self._lock:
                nxt = self._resume_point(hello)
            while True:
                base: tuple[int, dict[str, tuple[FileEntry, str]], _Event | None] | None = None
                ev: _Event | None = None
                tip: Tip | None = None
                with self._lock:
                    self._release(held)
                    held = []
                    if self._closed:
                        return
                    if nxt is None or (self._backlog and nxt < self._backlog[0].n):
                        # new, another lineage, or fell behind the backlog: the whole live
                        # version (and the newest mark), then on from here
                        live = dict(self._live)
                        mark = None if hello.live_only else self._mark
                        held = [k for _, k in live.values()] + list(mark.keys if mark else ())
                        base = (self._seq, live, mark)
                        nxt = self._n + 1
                    else:
                        ev = self._next(nxt)
                        if ev is None:
                            self._cond.wait(idle)
                            ev = self._next(nxt)
                        if ev is not None:
                            nxt = ev.n + 1
                            held = list(ev.keys)
                        else:
                            tip = Tip(self._seq, self._mark.event.snapshot_id if self._mark else -1)  # type: ignore[union-attr]
                    self._ref(held)
                # ``at.have_files``: what the follower holds once it installed what this
                # stream sent — a file shipped once is not shipped again (a mark names files
                # its edits brought); a file an edit removes may be deleted there, so it
                # leaves. Only what the follower installs counts: it skips a duplicate (an
                # edit at or below its version, a mark it holds), and a replay from a mark it
                # lacks sends such duplicates — a file one of them added and a later one
                # removed is not on the follower, so a later mark naming it carries its body.
                if base is not None:
                    seq, live, mark = base
                    staged = {n: k for n, (_, k) in live.items()}
                    entries = [e for e, _ in live.values()]
                    shipped = self._shipped(entries, staged, set(at.have_files))
                    msg: EditMsg | MarkMsg = EditMsg(seq, shipped, (), True, self.origin)
                    yield Delivery(msg, self._paths(staged))
                    at = after(at, msg)
                    if mark is not None:
                        d = self._delivery(mark, set(at.have_files))
                        yield d
                        at = after(at, d.msg)
                elif tip is not None:
                    yield tip
                elif ev is not None:
                    d = self._delivery(ev, set(at.have_files))
                    yield d
                    at = after(at, d.msg)
        finally:
            with self._lock:
                self._release(held)
                self.followers -= 1

    def note_ack(self, mark: int) -> None:
        """A follower installed snapshot mark ``mark`` (a transport calls this on its ack)."""
        with self._lock:
            if mark <= self._acked_mark:
                return
            self._acked_mark = mark
            self._cond.notify_all()
            told = list(self._ack_listeners)
        for fn in told:
            fn()

    def acked(self, snapshot_id: int) -> bool:
        """Has a follower acknowledged the mark of ``snapshot_id`` (or a newer one)?"""
        with self._lock:
            return self._acked_mark >= snapshot_id

    def on_ack(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` after each newer acknowledgement and when the shipper closes (on
        the thread that notes it, no lock held): what an event loop waits on instead of
        :meth:`wait_acked`. Returns the call that stops it."""
        with self._lock:
            self._ack_listeners.append(fn)

        def off() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._ack_listeners.remove(fn)
        return off

    def wait_acked(self, snapshot_id: int, timeout: float) -> bool:
        """Wait until a follower acknowledged the mark of ``snapshot_id`` (or a newer one):
        True; False after ``timeout`` seconds or when the shipper closes."""
        with self._lock:
            self._cond.wait_for(lambda: self._acked_mark >= snapshot_id or self._closed, timeout)
            return self._acked_mark >= snapshot_id

    def _next(self, n: int) -> _Event | None:
        return next((e for e in self._backlog if e.n >= n), None)

    def _resume_point(self, hello: Hello) -> int | None:
        """(lock held) The first event a follower at ``hello`` lacks, or None: it needs a base."""
        if hello.origin != self.origin or hello.have_seq > self._seq:
            return None
        if self._mark is not None and self._mark.event.snapshot_id > hello.have_mark:  # type: ignore[union-attr]
            if not self._backlog or self._mark.n < self._backlog[0].n:
                # it lacks the newest mark, which the backlog no longer holds: a base sends it
                return None
        if not self._backlog:
            return self._n + 1 if hello.have_seq == self._seq else None
        first = self._backlog[0].event
        oldest = first.seq - 1 if isinstance(first, VersionEdit) else first.seq
        if hello.have_seq < oldest:
            return None
        # the first edit it lacks, or an earlier mark it lacks (a mark lost in transit while
        # later edits arrived: the edits between are sent again and skipped as duplicates)
        for ev in self._backlog:
            e = ev.event
            if (
                (e.seq > hello.have_seq)
                if isinstance(e, VersionEdit)
                else e.snapshot_id > hello.have_mark
            ):
                return ev.n
        return self._n + 1

    # ------------------------------------------------------------------ lifecycle

    @property
    def seq(self) -> int:
        """The version of the store this shipper has queued up to."""
        return self._seq

    @property
    def closed(self) -> bool:
        """Has :meth:`close` run?"""
        return self._closed

    def close(self) -> None:
        """Stop shipping: unsubscribe, end every stream, drop the staging directory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            told = list(self._ack_listeners)
        for fn in told:
            fn()
        self._unsubscribe()
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> Shipper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Shipper({self.name!r}, seq={self._seq}, backlog={len(self._backlog)})"

