"""A read-only replica of a store, kept from the store's shipped edits.

A :class:`Follower` installs each edit's files — built by the primary, with their indexes
(run footers with Bloom filter and fences, hint files) — strictly in sequence order, and
holds every file of its newest snapshot marks. It never flushes, merges or builds an
index: :meth:`Follower.promote` writes ``CURRENT`` for the version it holds and opens the
engine on those very files, whose open path reads the shipped hints and footers — or takes
what the follower read of them ahead (``Store.preopen``: an lsm run's fence index and
Bloom filter, a sealed WAL's records — held in memory as the promoted store will hold them).

Its own state is the ``FOLLOW`` document (``FORMAT.md`` § "FOLLOW"), rewritten atomically
after every installed message: the version (seq and files), the origin it follows, the
retained marks. A body is written to ``<name>.replica`` and checked (size, crc32c)
before it is renamed into place, so a corrupt or truncated transfer is never installed:
the follower drops the stream and opens it again from where it stands (re-fetching).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from .. import current
from ..base import Store
from ..checksum import file_crc
from ..engines import engine_class
from ..errors import CorruptionError, SnapshotNotFoundError, StoreClosedError, StoreError
from ..fs import FileSystem
from ..snapshots import manifest_entries, trust
from ..version import FileEntry, encode_entries, seq_of
from .directory import LOCK_NAME as _LOCK_NAME
from .directory import PART as _PART
from .directory import STATE_NAME, load
from .shipper import SHIPPED_KINDS
from .source import Received, Source
from .state import FollowState, encode_state
from .wire import (
    EditMsg,
    Hello,
    MarkMsg,
    ProtocolError,
    ReplicationError,
    ShippedFile,
    Tip,
    files_of,
)

if TYPE_CHECKING:
    from remotes.base import Remote

__all__ = ["Follower", "Driver", "STATE_NAME"]

#: What runs a follower's steps (``Follower._steps``: each yields the seconds to wait, 0
#: after a tip) instead of a thread: called with them and a name, it returns the call that
#: ends them for good (between two steps).
Driver = Callable[[Generator[float, None, None], str], Callable[[], None]]

log = logging.getLogger("statestores.replica")

_BACKOFF = (0.02, 1.0)


class _Gap(ReplicationError):
    """The stream skipped a message this replica needs; reopen it from where we stand."""


class Follower:
    """Keeps ``directory`` a replica of the store ``source`` ships (see the module docstring).

    ``name``: the store's name at the source (default: the source's ``store``, else
    ``directory``'s base name);
    ``keep_marks``: how many of the newest snapshot marks to hold files for;
    ``live_only``: a base edit (a new replica, or one too far behind) brings only the live
    files, not those of the primary's newest snapshot — for a replica that will be
    promoted to a later snapshot, it halves what a fresh one receives when merges rewrote
    the state since that snapshot;
    ``seed``: the store's snapshot remote; a new (empty) replica first downloads the
    files of the newest snapshot there (each checked against the snapshot's crc32c) and
    names them in its hello, so the source ships only what changed since — the primary
    is spared the bulk of a catch-up. A seeded file the source lists with another
    checksum is deleted and fetched from the source;
    ``driver``: what runs the following instead of a thread of its own (:data:`Driver`:
    one thread driving its followers on sources that never block, the simulator's);
    ``options`` are the engine's, checked now and used by :meth:`promote`.
    """

    def __init__(
        self, engine: str, directory: str | os.PathLike[str], source: Source, *,
        name: str | None = None, keep_marks: int = 2, live_only: bool = False,
        seed: Remote | None = None, driver: Driver | None = None, **options: Any,
    ) -> None:
        self.engine_cls = engine_class(engine)
        self.engine = engine
        self.options = options
        self.engine_cls.parse_options(dict(options))  # bad options fail now, not at promote
        if isinstance(keep_marks, bool) or not isinstance(keep_marks, int) or keep_marks < 1:
            raise ValueError(f"keep_marks must be an int >= 1, got {keep_marks!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.name = name or getattr(source, "store", None) or os.path.basename(self.directory)
        self.source = source
        self.keep_marks = keep_marks
        self.live_only = bool(live_only)
        self.seed = seed
        #: files downloaded from ``seed`` that no installed message names yet: name → (size, crc)
        self._seeded: dict[str, tuple[int, int]] = {}
        self._stop_at: int | None = None
        self.fs = FileSystem()
        self._sync = self.engine_cls.parse_options(dict(options))["sync"] == "fsync"
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._stop = threading.Event()
        self._holds: Counter[str] = Counter()
        self._checked: dict[str, tuple[int, int]] = {}  # name → (size, crc32c) verified on arrival
        self._counts: Counter[str] = Counter()
        #: the needed files the engine opens ahead (``Store.preopen``: an lsm run's index and
        #: Bloom filter, a sealed WAL's records), by name, so a promotion does not read them;
        #: owned by the follow thread until :meth:`promote` (after it stopped) hands them over
        self._opened: dict[str, Any] = {}
        self.last_error: BaseException | None = None
        self.fs.makedirs(self.directory)
        self._lock_fd = self.fs.lock(os.path.join(self.directory, _LOCK_NAME))
        try:
            self._load()
        except BaseException:
            self.fs.unlock(self._lock_fd)
            raise
        name = f"statestores-follow-{self.name}"
        self._halt = None if driver is None else driver(self._steps(), name)
        self._thread = None if driver else threading.Thread(target=self._run, name=name,
                                                             daemon=True)
        if self._thread is not None:
            self._thread.start()

    # ------------------------------------------------------------------ state

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _load(self) -> None:
        state = load(self.fs, self.directory, self.engine, self.engine_cls.PREFIX)
        self.seq, self.origin, self.files = state.seq, state.origin, state.files
        #: (snapshot_id, seq, files), oldest first
        self.marks: list[tuple[int, int, tuple[FileEntry, ...]]] = state.marks

    def _save(self) -> None:
        state = FollowState(self.seq, self.origin, self.files, self.marks)
        self.fs.write_file_atomic(
            self._path(STATE_NAME), encode_state(self.engine, state), sync=self._sync
        )

    def _needed(self) -> set[str]:
        """(lock held) Files the version, a retained mark or a reader still needs."""
        need = set(self.files)
        for _i, _s, files in self.marks:
            need.update(e.name for e in files)
        need.update(self._holds)
        need.update(self._seeded)
        return need

    def _collect(self, names: set[str]) -> None:
        """(lock held) Delete those of ``names`` nothing needs any more."""
        need = self._needed()
        for n in names - need:
            self._checked.pop(n, None)
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._path(n))

    # ------------------------------------------------------------------ following

    def _hello(self) -> Hello:
        with self._lock:
            mark = self.marks[-1][0] if self.marks else -1
            return Hello(
                self.name, self.seq, mark, tuple(sorted(self._have_locked())), self.origin,
                self.live_only,
            )

    def _have_locked(self) -> set[str]:
        return set(self.files) | {e.name for _i, _s, f in self.marks for e in f} | set(self._seeded)

    def _seed_from(self, remote: Remote) -> None:
        """(follow thread, before the first stream) Download the newest snapshot's files
        from ``remote`` into an empty replica; a failure only ends the seeding early."""
        with self._lock:
            if self.seq or self.files or self.marks:
                return  # not new: the source's edits bring what it lacks
        try:
            latest = remote.latest_snapshot()
            if latest is None:
                return
            manifest = remote.read_manifest(latest)
            if manifest.engine != self.engine:
                raise StoreError(f"snapshot {latest} is of engine {manifest.engine!r}")
            kinds = {e.name: e.kind for e in manifest_entries(manifest)}
            for name, info in manifest.files.items():
                if self._stop.is_set():
                    return
                if kinds.get(name) not in SHIPPED_KINDS:
                    continue  # a WAL: never part of a replica's version
                part = self._path(name) + _PART
                remote.get_file(name, part)
                if file_crc(self.fs, part) != (info.size, info.crc):
                    os.remove(part)
                    raise CorruptionError(f"remote:{name}",
                                          f"does not match snapshot {latest}'s checksum")
                self.fs.rename(part, self._path(name))
                with self._lock:
                    self._seeded[name] = self._checked[name] = (info.size, info.crc)
                self._counts["seeded_bytes"] += info.size
            log.info("replica %s: seeded with %d files (%d bytes) of snapshot %d", self.directory,
                     len(self._seeded), self._counts["seeded_bytes"], latest)
        except Exception as exc:
            log.info("replica %s: seeding from the snapshot remote stopped (%s); the source "
                     "ships the rest", self.directory, exc)

    def _drop_seeded(self, names: list[str]) -> None:
        with self._lock:
            for n in names:
                self._seeded.pop(n, None)
                self._checked.pop(n, None)
            self._collect(set(names))

    def _run(self) -> None:  # (the follow thread)
        for wait in self._steps():
            if wait > 0:
                self._stop.wait(wait)

    def _steps(self) -> Generator[float, None, None]:
        """Seed, then follow the source until stopped: reopen a stream that ended or
        failed after a backoff (yielded: the seconds to wait), and yield 0 after each
        :class:`Tip` (where a driver on a source that never blocks waits for news)."""
        if self.seed is not None:
            self._seed_from(self.seed)
        delay = _BACKOFF[0]
        while not self._stop.is_set():
            try:
                stream = self.source.open(self._hello())
                try:
                    for item in stream:
                        if self._stop.is_set():
                            break
                        if self._holds_stop_mark():
                            # promoted there next: what follows is not needed (checked here,
                            # after the transport acknowledged the mark, not right after it)
                            self._stop.set()
                            break
                        if isinstance(item, Tip):
                            self._check_tip(item)
                            yield 0.0
                        else:
                            self._apply(item)
                            delay = _BACKOFF[0]
                finally:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()  # the source's cleanup (its socket) now, not when collected
            except (ConnectionError, OSError, ReplicationError, CorruptionError) as exc:
                if self._stop.is_set():
                    break
                if isinstance(exc, CorruptionError):
                    kind = "corrupt"
                elif isinstance(exc, _Gap):
                    kind = "gaps"
                else:
                    kind = "reconnects"
                self._counts[kind] += 1
                self.last_error = exc
                log.info(
                    "replica %s: %s; reopening the stream from version %d", self.directory, exc,
                    self.seq,
                )
            except Exception as exc:  # a bug: keep trying, loudly
                self._counts["errors"] += 1
                self.last_error = exc
                log.exception("replica %s failed; reopening the stream", self.directory)
            yield delay
            delay = min(delay * 2, _BACKOFF[1])

    def _open_ahead(self, entries: list[FileEntry]) -> None:
        """(follow thread) Open those of a message's files the engine opens ahead."""
        for e in entries:
            n = e.name
            if n in self._opened or self._stop.is_set():
                continue
            try:
                opened = self.engine_cls.preopen(self.fs, self._path(n), e)
            except (OSError, StoreError) as exc:  # the promotion opens it and says what is wrong
                log.warning("replica %s: cannot open %s ahead: %s", self.directory, n, exc)
                continue
            if opened is not None:
                self._opened[n] = opened

    def _check_tip(self, tip: Tip) -> None:
        with self._lock:
            newest = self.marks[-1][0] if self.marks else -1
            if tip.seq > self.seq or tip.mark > newest:
                raise _Gap(f"the source is at version {tip.seq}, mark {tip.mark}; this replica "
                           f"at {self.seq}, {newest}")

    def _receive(self, item: Received, wanted: list[tuple[str, int, int]]) -> list[str]:
        """Fetch the bodies, check each (size, crc32c); the temp names, or nothing installed."""
        dests = {n: self._path(n) + _PART for n, _s, _c in wanted}
        try:
            item.fetch(dests)
            for n, size, crc in wanted:
                got = file_crc(self.fs, dests[n])
                if got != (size, crc):
                    self._counts["bad_bodies"] += 1
                    raise CorruptionError(f"replica:{n}", f"received {got[0]} bytes with crc "
                                          f"{got[1]:#x}, expected {size} with {crc:#x}")
                self._counts["bytes"] += size
        except BaseException:
            for d in dests.values():
                with contextlib.suppress(FileNotFoundError):
                    os.remove(d)
            raise
        if self._sync:
            for d in dests.values():
                fd = self.fs.open_append(d)
                try:
                    self.fs.fsync(fd)
                finally:
                    self.fs.close(fd)
        return list(dests.values())

    def _apply(self, item: Received) -> None:
        msg = item.msg
        files = files_of(msg)
        allowed = SHIPPED_KINDS if isinstance(msg, EditMsg) else (*SHIPPED_KINDS, "wal")
        if any(f.entry.kind not in allowed for f in files):
            item.fetch(None)
            raise ProtocolError(f"message {msg!r:.80} names a file kind a replica cannot hold")
        have = self._admit(item, msg)
        if have is None:  # a duplicate: read past its bodies
            self._counts["duplicates"] += 1
            item.fetch(None)
            return
        self._check_seeded(item, files)
        missing = [f.entry.name for f in files if not f.body and f.entry.name not in have]
        wanted = [(f.entry.name, f.size, f.crc) for f in files if f.body]
        parts = self._receive(item, wanted)
        if missing:
            for p in parts:
                os.remove(p)
            raise _Gap(f"{msg!r:.60} relies on {missing[:3]}, which this replica lacks")
        for p in parts:
            self.fs.rename(p, p[: -len(_PART)])
        for f in files:
            if f.body:
                self._checked[f.entry.name] = (f.size, f.crc)
                self._opened.pop(f.entry.name, None)  # what was read ahead is of another body
        self._open_ahead([f.entry for f in files])
        with self._lock:
            before = set(self._needed())
            self._install_locked(msg)
            self._save()
            self._collect(before)
            need = self._needed()
            for n in [n for n in self._opened if n not in need]:
                del self._opened[n]
            self._cond.notify_all()

    def _admit(self, item: Received, msg: EditMsg | MarkMsg) -> set[str] | None:
        """The files this replica has, ``msg`` being the next message; None when it is a late
        duplicate; :class:`_Gap` when one before it is missing."""
        with self._lock:
            have = self._have_locked()
            if isinstance(msg, EditMsg):
                # a base of our own lineage at or below our version is a late duplicate
                stale = msg.seq <= self.seq and (not msg.base or msg.origin == self.origin)
                if not msg.base and not stale and msg.seq != self.seq + 1:
                    item.fetch(None)
                    raise _Gap(f"edit {msg.seq} arrived after {self.seq}")
            else:
                newest = self.marks[-1][0] if self.marks else -1
                stale = msg.snapshot_id <= newest
                if not stale and msg.seq > self.seq:
                    item.fetch(None)
                    raise _Gap(
                        f"mark of snapshot {msg.snapshot_id} (version {msg.seq}) arrived at "
                        f"version {self.seq}"
                    )
        return None if stale else have

    def _check_seeded(self, item: Received, files: tuple[ShippedFile, ...]) -> None:
        """A file named without its body that we seeded must be the source's very file."""
        reseed = [
            f.entry.name
            for f in files
            if not f.body
            and f.entry.name in self._seeded
            and self._seeded[f.entry.name] != (f.size, f.crc)
        ]
        if reseed:  # not the source's file of that name: drop it, the next hello will not list it
            item.fetch(None)
            self._drop_seeded(reseed)
            raise CorruptionError(f"replica:{reseed[0]}", "a seeded file differs from the source's")

    def _install_locked(self, msg: EditMsg | MarkMsg) -> None:
        """(lock held) Take ``msg``'s version or mark as ours."""
        if isinstance(msg, EditMsg):
            if msg.base:
                self.files = {f.entry.name: f.entry for f in msg.added}
                self.origin = msg.origin
                self._seeded.clear()  # the base named what it uses; the rest is collected
                self._counts["bases"] += 1
            else:
                for n in msg.removed:
                    self.files.pop(n, None)
                for f in msg.added:
                    self.files[f.entry.name] = f.entry
                self._counts["edits"] += 1
            self.seq = msg.seq
        else:
            self.marks.append((msg.snapshot_id, msg.seq, tuple(f.entry for f in msg.files)))
            del self.marks[: -self.keep_marks]
            self._counts["marks"] += 1

    # ------------------------------------------------------------------ the user's side

    def wait(
        self, *, seq: int | None = None, snapshot_id: int | None = None, timeout: float = 30.0
    ) -> None:
        """Block until the replica holds version ``seq`` and/or snapshot ``snapshot_id``;
        :class:`TimeoutError` (with the last stream error) after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout

        def reached() -> bool:
            ok = seq is None or self.seq >= seq
            return ok and (snapshot_id is None or any(i >= snapshot_id for i, _s, _f in self.marks))

        with self._lock:
            while not reached():
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    so_far = ", ".join(f"{k} {v}" for k, v in sorted(self._counts.items()))
                    raise TimeoutError(
                        f"replica {self.directory} reached version {self.seq}, marks "
                        f"{[i for i, _s, _f in self.marks]}, not version {seq} / snapshot "
                        f"{snapshot_id} within {timeout} s (last stream error: "
                        f"{self.last_error}; so far: {so_far or 'nothing received'})"
                    )
                self._cond.wait(min(left, 0.5))

    @contextlib.contextmanager
    def hold(self) -> Iterator[tuple[int, list[FileEntry]]]:
        """``(seq, files)`` of the version held now; no file of it is deleted until exit."""
        with self._lock:
            files = list(self.files.values())
            seq = self.seq
            for e in files:
                self._holds[e.name] += 1
        try:
            yield seq, files
        finally:
            with self._lock:
                for e in files:
                    self._holds[e.name] -= 1
                    if self._holds[e.name] <= 0:
                        del self._holds[e.name]
                self._collect({e.name for e in files})

    def _holds_stop_mark(self) -> bool:
        with self._lock:
            return self._stop_at is not None and any(i >= self._stop_at for i, _s, _f in self.marks)

    def stop_at(self, snapshot_id: int) -> None:
        """Stop following once the replica holds snapshot ``snapshot_id`` (at once if it
        does): for a replica about to be promoted there, whatever the primary writes or
        merges after it is not needed. :meth:`promote` and :meth:`wait` work as before."""
        with self._lock:
            self._stop_at = snapshot_id
        if self._holds_stop_mark():
            self._stop.set()
            self.source.close()

    def snapshots(self) -> list[int]:
        """Ids of the snapshots whose every file this replica holds, ascending."""
        with self._lock:
            return [i for i, _s, _f in self.marks]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "seq": self.seq,
                "files": len(self.files),
                "snapshots": [i for i, _s, _f in self.marks],
                "bytes_received": self._counts["bytes"],
                "bytes_seeded": self._counts["seeded_bytes"],
                **{k: self._counts[k] for k in ("edits", "bases", "marks", "duplicates", "gaps",
                                                 "corrupt", "reconnects")},
            }

    def promote(
        self, snapshot_id: int | None = None, *, directory: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> Store:
        """Stop following and open the engine on the replica's own files (nothing copied).

        ``snapshot_id``: become that retained snapshot (:class:`SnapshotNotFoundError`
        naming the retained ones otherwise); ``None``: the newest version held.
        ``directory``: move the replica there first (a rename on the same file system;
        whatever that directory held is deleted, unless a live store holds it:
        :class:`~statestores.LockedError`). ``options`` override those given to the
        follower (e.g. ``remote=``). A promotion that fails has stopped following but left
        the replica intact: promote again, or ``close()`` and follow again. A replica that
        installed nothing yet (its seeding and its stream never completed a message) holds
        version 0: promoted, it is an empty store — what it holds, not a guess — which a
        restore fills; it holds no snapshot. A version whose files are not all on disk is
        refused (:class:`CorruptionError`).
        """
        if self._closed:
            raise StoreClosedError(f"replica {self.directory} is closed")
        self._stop_following()
        target = self.directory if directory is None else os.path.abspath(os.fspath(directory))
        with self._lock:
            if snapshot_id is None:
                entries, seq = list(self.files.values()), self.seq
            else:
                found = [m for m in self.marks if m[0] == snapshot_id]
                if not found:
                    raise SnapshotNotFoundError(
                        f"replica {self.directory} holds snapshots "
                        f"{[i for i, _s, _f in self.marks]}, not {snapshot_id}"
                    )
                _i, seq, files = found[0]
                entries = list(files)
            names = [e.name for e in entries]
            lacking = [n for n in names if not self.fs.exists(self._path(n))]
            if lacking:  # never a store short of what its version names
                raise CorruptionError(
                    self._path(STATE_NAME), f"version {seq} names {lacking[:3]}, which are "
                    f"missing: not promoted ({len(lacking)} of {len(names)} files)")
            old_fd = None
            if target != self.directory and os.path.exists(target):
                old_fd = self.fs.lock(os.path.join(target, _LOCK_NAME))  # nobody may be using it
            top = max([seq_of(n) for n in names] + [0])
            current.write(self.fs, self.directory,
                          {"seq": top, "version": seq, "files": encode_entries(entries)},
                          sync=self._sync)
            # (a replica that installed nothing yet never wrote one: it is version 0, empty)
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._path(STATE_NAME))
            self._closed = True
            self._cond.notify_all()
        self.fs.unlock(self._lock_fd)
        if target != self.directory:
            if old_fd is not None:
                shutil.rmtree(target)
                self.fs.unlock(old_fd)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(self.directory, target)
            log.info("replica %s moved to %s", self.directory, target)
        opened, self._opened = {n: self._opened[n] for n in names if n in self._opened}, {}
        store = self.engine_cls(target, _opened=opened, **{**self.options, **options})
        trust(store, {n: self._checked[n] for n in names if n in self._checked})
        return store

    def _stop_following(self) -> None:
        self._stop.set()
        self.source.close()
        if self._halt is not None:
            self._halt()
            return
        assert self._thread is not None
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            raise ReplicationError(
                f"replica {self.directory}: the follow thread did not stop within 30 s"
            )

    def close(self) -> None:
        """Stop following; the directory keeps the replica (a later Follower resumes it)."""
        if self._closed:
            return
        self._stop_following()
        self._opened = {}
        with self._lock:
            self._closed = True
            self._cond.notify_all()
        self.fs.unlock(self._lock_fd)

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Follower({self.engine!r}, {self.directory!r}, seq={self.seq})"
