"""The sealed segments of an AppendLog or HybridLog store, the hash index over them and
their merges: :class:`Segments`, a part the engine holds (``store.segments``), reaching
the engine only through :class:`~.host.SegmentsHost`, under the store lock.

Every key is in an in-memory hash index mapping it to the logical address of its latest
record on disk (a large store opens with it built on a thread, :data:`LAZY_INDEX_KEYS`;
reads use the hints' sorted keys until it is adopted). When ``max_runs_per_level`` hinted
segments share a level (:mod:`.levels`), they are merged into one segment at the next
level in the background process; the maintainer thread renames the outputs, applies one
version edit (output in, inputs out), and redirects the index entries that pointed into
the inputs, in chunks so writers get the lock in between. A merge drops overwritten
values; it drops tombstones only when no older segment exists (nothing left to shadow).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from crc32c import crc32c

from .. import background, hints
from ..errors import BackgroundBusy, CorruptionError, StoreError
from ..files import FileSet
from ..fs import FileSystem
from ..hints import OFFSET_BITS, OFFSET_MASK
from ..snapshot_info import Frozen
from ..tasks import Tasks
from ..version import FileEntry
from . import levels
from .host import FoldedOwner, MergeJob, SegmentsHost
from .index import PendingIndex, Redirect
from .merge import merge_segments
from .segment import (
    _HEADER,
    _HEADER_SIZE,
    Segment,
    hint_name,
    hint_scanned,
    write_hint,
    write_segment,
)
from .store import Handoffs

log = logging.getLogger("statestores")

__all__ = ["Segments", "LAZY_INDEX_KEYS"]

#: Stores whose hints hold at least this many keys open with the index built in the background.
LAZY_INDEX_KEYS = 1 << 16
#: Pause between two chunks of background work that takes the store lock.
YIELD_SECONDS = 0.001
#: Index entries redirected per lock hold after a merge.
REDIRECT_CHUNK = 1 << 12


class Segments:
    """The sealed segments of a log-structured store, the hash index over them, and the
    merge in flight (this part is the one owner of all three)."""

    def __init__(
        self, host: SegmentsHost, fs: FileSystem, files: FileSet, tasks: Tasks,
        handoffs: Handoffs, *, prefix: str, fsync: bool, max_runs: int, local: bool,
    ) -> None:
        #: constant after construction
        self.host = host
        self.fs = fs
        self.files = files
        self.tasks = tasks
        self.handoffs = handoffs
        self.directory = files.directory
        self.prefix = prefix
        self.fsync = fsync
        self.max_runs = max_runs
        self.local = local  # background jobs run in this process (a test's file system)
        self._bg_fs = fs if local else None
        self._resume_open: Callable[[], None] | None = None
        self._index: dict[bytes, int] = {}
        # while the index is built in the background: the hints (sorted), and keys deleted since
        self._pending: PendingIndex | None = None
        self._gone: set[bytes] = set()
        self._segs: dict[int, Segment] = {}
        self._sealed: list[Segment] = []
        self._merge: MergeJob | None = None
        self._redirect: Redirect | None = None
        self._merges_done = 0
        self._merge_failures = 0
        self._merge_retry_at = 0  # no merge starts while fewer segments exist (after a failure)
        self._merged_bytes = 0
        self._expired_dropped = 0  # values merges and region writes found expired

    @property
    def index(self) -> dict[bytes, int]:
        """The hash index (complete after :meth:`await_index`); only this part changes it."""
        return self._index

    @property
    def pending(self) -> PendingIndex | None:
        """The interim (hint-based) index while the hash index is built, else None."""
        return self._pending

    def open(self, *, seal_older_wals: bool = False) -> list[FileEntry]:
        """(lock held) Read the version, load its sealed segments; return its ``wal`` entries.

        A segment the version lists without its hint (a crash before the maintainer wrote
        it) is scanned and hinted now. With ``seal_older_wals`` (AppendLog, whose ``wal``
        entries are active or folded segments, ordered among level-0 segments by seq) every
        ``wal`` but the newest becomes such a segment, or goes if it is empty — the newest
        too when a level-0 segment is newer (a replica promoted at a snapshot taken while
        folded segments were being merged and a newer one sealed). No merge starts before
        :meth:`open_done`.
        """
        self._resume_open = self.host.pause_merges()
        version = self.files.load()
        if seal_older_wals:
            wals = version.of_kind("wal")
            top = levels.newest_level0(version)
            older = wals[:-1] if wals and wals[-1].seq > top else wals
            if older:
                keep = [e for e in older if self.fs.size(self.files.path(e.name)) > 0]
                self.host.edit_files(
                    [FileEntry(e.name, "segment", 0) for e in keep], [e.name for e in older]
                )
        segs = version.of_kind("segment")
        missing = [e for e in segs if hint_name(e.name) not in version]
        for e in missing:
            hint_scanned(
                self.fs, self.directory, e.name, e.seq, truncate_torn=True, fsync=self.fsync
            )
        if missing:
            self.host.edit_files([FileEntry(hint_name(e.name), "hint", e.level) for e in missing])
        self._load_sealed(segs)
        return version.of_kind("wal")

    def open_done(self, lanes: Iterable[str]) -> None:
        """End of the engine's ``_open``: merges may start. The background processes the
        store will use (``lanes``) start now, on their own threads: paid at the first merge,
        a process start (~0.3 s of CPU) was the worst stall of a 1,000 TPS run
        (benchmarks/README.md)."""
        for lane in lanes:
            background.warm_up(lane)
        resume, self._resume_open = self._resume_open, None
        if resume is not None:
            resume()

    def hint_segments(self, entries: list[FileEntry]) -> list[FileEntry]:
        """Scan each of ``entries`` (``wal`` files) and write its hint; return the segment
        and hint entries that make them sealed level-0 segments (an empty one: none)."""
        out: list[FileEntry] = []
        for e in entries:
            if hint_scanned(
                self.fs, self.directory, e.name, e.seq, truncate_torn=False, fsync=self.fsync,
                skip_empty=True,
            ):
                out += [FileEntry(e.name, "segment", 0), FileEntry(hint_name(e.name), "hint", 0)]
        return out

    def install(self, entries: list[FileEntry]) -> list[FileEntry]:
        """Drop every segment and load those of ``entries``; return the segment + hint entries."""
        segs = sorted((e for e in entries if e.kind == "segment"), key=lambda e: (-e.level, e.seq))
        names = {e.name for e in entries}
        for e in segs:
            if hint_name(e.name) not in names:
                raise CorruptionError(
                    self.directory, f"snapshot names segment {e.name} without its hint"
                )
        self.drop()
        self._load_sealed(segs)
        return [e for e in entries if e.kind in ("segment", "hint")]

    def segment_name(self, level: int, seq: int) -> str:
        return f"{self.prefix}-{level}-{seq:010d}.log"

    def frozen(
        self, skip: Iterable[str], extra: Iterable[FileEntry] = (),
        pending: Iterable[concurrent.futures.Future[Any]] = (),
    ) -> Frozen:
        """(lock held) The snapshot: the live version but ``skip`` (files still written to),
        a sealed segment whose hint is being written as its segment + hint (the snapshot's
        upload waits for the hint), plus ``extra`` files of hand-offs."""
        names, sealing, futs = levels.sealing(self._sealed)
        return self.files.frozen(
            skip=[*skip, *names], extra=sealing + list(extra), pending=futs + list(pending)
        )

    def _load_sealed(self, entries: Iterable[FileEntry]) -> None:
        """Open the sealed segments (oldest first) and index them from their hints."""
        loaded: list[hints.Hint] = []
        for e in entries:
            seg = Segment(e.name, e.level, self.files.path(e.name))
            seg.open_sealed(self.fs)
            try:
                hpath = self.files.path(hint_name(e.name))
                h = hints.decode(self.fs.read_file(hpath), hpath, seq=seg.seq)
                if h.data_size != seg.size:
                    raise CorruptionError(
                        seg.path, f"file is {seg.size} bytes, its hint says {h.data_size}"
                    )
            except (CorruptionError, OSError):
                seg.close(self.fs)
                raise
            loaded.append(h)
            self._sealed.append(seg)
            self._segs[seg.seq] = seg
        if not loaded:
            return
        pending = PendingIndex(loaded)
        if sum(len(h.keys) for h in loaded) < LAZY_INDEX_KEYS:
            self._index = pending.build()
        else:
            # open returns now; reads use the hints' sorted key arrays until the hash
            # index, built on a thread, is adopted
            self._pending = pending
            self._start_index_build(pending)

    def _start_index_build(self, pending: PendingIndex) -> None:
        threading.Thread(
            target=self._index_builder, args=(pending,), name="statestores-index", daemon=True
        ).start()

    def _index_builder(self, pending: PendingIndex) -> None:
        try:
            pending.build()
            with self.tasks.lock:
                self._adopt_index(pending)
        except Exception:
            log.exception("building the index of %s failed", self.directory)

    def _adopt_index(self, pending: PendingIndex) -> None:
        """(lock held) Replace the interim index by the built one, with every write since
        open applied."""
        if self._pending is not pending:
            return  # dropped meanwhile (restore, close)
        built = pending.build()
        for k in self._gone:
            built.pop(k, None)
        built.update(self._index)
        self._index = built  # before _pending = None: see get
        self._pending = None
        self._gone = set()
        self.kick()

    def await_index(self) -> None:
        """Make sure the hash index is complete (building it here if need be)."""
        pending = self._pending
        if pending is not None:
            pending.build()
            with self.tasks.lock:
                self._adopt_index(pending)

    def lookup(self, key: bytes) -> int | None:
        """(lock held) The address of ``key``'s live record, or None."""
        loc = self._index.get(key)
        if loc is not None or self._pending is None or key in self._gone:
            return loc
        return self._pending.lookup(key)

    def point(self, key: bytes, addr: int) -> None:
        """(lock held) ``key``'s live record is now at ``addr``."""
        self._index[key] = addr

    def update(self, addrs: dict[bytes, int]) -> None:
        """(lock held) :meth:`point` each key of ``addrs`` at its address."""
        self._index.update(addrs)

    def forget(self, key: bytes) -> None:
        """(lock held) ``key`` was deleted: drop it from the index (and shadow the interim one)."""
        self._index.pop(key, None)
        if self._pending is not None:
            self._gone.add(key)

    def get(self, key: bytes, default: Any) -> Any:
        """The value at the index entry of ``key`` (``default`` if none): the fast read path."""
        index = self._index
        loc = index.get(key)
        if loc is None:
            if self._pending is None and self._index is index:
                return default
            return self._read_slow(key, default)  # the index is still being built
        seg = self._segs.get(loc >> OFFSET_BITS)
        off = loc & OFFSET_MASK
        if seg is not None and off < seg.mapped:
            mm = seg.mm
            crc, klen, vlen, _flags = _HEADER.unpack_from(mm, off)
            rec = mm[off + 4 : off + _HEADER_SIZE + klen + vlen]
            if crc32c(rec) == crc:
                return rec[9 + klen :]
        return self._read_slow(key, default)

    def _read_slow(self, key: bytes, default: Any) -> Any:
        """Read under the lock: tails of the active segment, remaps, and corrupt records."""
        with self.tasks.lock:
            loc = self.lookup(key)
            if loc is None:
                return default
            seg = self._segs.get(loc >> OFFSET_BITS)
            if seg is None:
                raise StoreError(
                    f"{self.directory}: index entry of key {key!r:.60} names unknown segment "
                    f"{loc >> OFFSET_BITS}"
                )
            rkey, value = seg.read(self.fs, loc & OFFSET_MASK)
            if rkey != key:
                raise CorruptionError(
                    seg.path,
                    f"record at offset {loc & OFFSET_MASK} holds key {rkey!r:.60}, expected "
                    f"{key!r:.60}",
                )
            return default if value is None else value

    def track(self, seg: Segment) -> None:
        """(lock held) Reads find ``seg`` (an active, spare or folded segment) by its seq."""
        self._segs[seg.seq] = seg

    def untrack(self, seg: Segment) -> None:
        """(lock held) Undo :meth:`track` (an empty active segment dropped)."""
        del self._segs[seg.seq]

    def add_sealed(self, seg: Segment) -> None:
        """(lock held) ``seg`` is the newest sealed segment (its hint may still be written:
        ``hint_ready`` False keeps it out of merges)."""
        self._sealed.append(seg)
        self._segs[seg.seq] = seg

    def add_written(
        self, name: str, keys: list[bytes], addrs: Any, tombs: list[bytes], removed: list[str]
    ) -> None:
        """(lock held) Install log file ``name``, written with its hint (:meth:`write_segment`),
        as the newest level-0 segment: one version edit adds it and removes ``removed``."""
        seg = Segment(name, 0, self.files.path(name))
        seg.open_sealed(self.fs)
        # the commit point
        self.host.edit_files(
            [FileEntry(seg.name, "segment", 0), FileEntry(hint_name(seg.name), "hint", 0)],
            removed,
        )
        self.add_sealed(seg)
        self._index.update(zip(keys, addrs, strict=True))
        for k in tombs:
            self.forget(k)

    def sealed_count(self) -> int:
        return len(self._sealed)

    def write_segment(
        self, name: str, seq: int, items: list[tuple[bytes, bytes | None]], *,
        in_background: bool = False,
    ) -> tuple[int, list[bytes], Any, list[bytes]]:
        """Write ``items`` (unique keys) as sealed segment ``name`` + its hint (no lock
        needed: the files are new); return its size, live keys, their addresses, tombstones.

        ``in_background`` (only from a thread that may wait, never with the lock held): in
        the ``flush`` background process, so encoding every record never holds this
        process's GIL (a region flushed at each snapshot round slowed the epochs after it).
        """
        if in_background and not self.local:
            try:
                fut = background.submit(
                    write_segment, None, self.directory, name, seq, items, self.fsync,
                    lane="flush",
                )
            except BackgroundBusy as exc:
                log.debug("segment %s written in the foreground: %s", name, exc)
            else:
                return fut.result()
        return write_segment(self.fs, self.directory, name, seq, items, self.fsync)

    def write_hint(
        self, name: str, seq: int, size: int, keys: list[bytes], addrs: Any, tombs: list[bytes]
    ) -> None:
        write_hint(self.fs, self.directory, name, seq, size, keys, addrs, tombs, self.fsync)

    def region_items(
        self, merged: dict[bytes, bytes | None]
    ) -> list[tuple[bytes, bytes | None]]:
        """The records of a log file written from memory (:func:`.levels.region_items`)."""
        items, n_expired = levels.region_items(
            merged, self._index, self._pending is None, self.host.expiry_horizon
        )
        self._expired_dropped += n_expired
        return items

    def drop(self) -> None:
        for seg in self._segs.values():
            seg.close(self.fs)
        self._segs = {}
        self._sealed = []
        self._index = {}
        self._pending = None
        self._gone = set()

    # ------------------------------------------------------------------ merges

    def idle(self) -> bool:
        """No merge, index redirect or hand-off is in flight."""
        return self._merge is None and self._redirect is None and not self.handoffs.count

    def may_merge(self) -> bool:
        """(lock held) No merge or redirect runs, none is paused, and the index is complete
        (the redirect after a merge needs it; its adoption kicks again)."""
        return (
            self._merge is None
            and self._redirect is None
            and not self.host.merges_paused
            and not self.host.closed
            and self._pending is None
        )

    def kick(self) -> None:
        """(lock held) Start a merge if a level is full and none is running."""
        if not self.may_merge():
            return
        if len(self._sealed) < self._merge_retry_at:
            return  # the last merge failed: wait for more segments before trying again
        due = levels.pick_merge(self._sealed, self.max_runs, self.directory)
        if due is not None:
            inputs, level, drop = due
            self.start_merge(inputs, self.files.next_seq(), level, drop_tombstones=drop)

    def start_merge(
        self, inputs: list[Segment], seq: int, level: int, *, drop_tombstones: bool,
        owner: FoldedOwner | None = None,
    ) -> bool:
        """(lock held) Merge ``inputs`` (oldest first) into segment ``seq`` of ``level`` in
        the background merge process; False if its lane is full (a later kick tries again).
        ``owner``: the inputs are its ``wal`` entries, without hints (their records are
        read); it is told how the merge ended (:class:`~.host.FoldedOwner`)."""
        out = self.segment_name(level, seq)
        try:
            fut = background.submit(
                merge_segments, self._bg_fs, self.directory, [(s.name, s.seq) for s in inputs],
                out, seq, drop_tombstones, self.fsync, owner is not None,
                self.host.expiry_horizon, lane="merge", local=self.local,
            )
        except BackgroundBusy as exc:
            log.debug("merge in %s postponed: %s", self.directory, exc)
            return False
        self._merge = MergeJob(inputs, out, seq, level, fut, owner)
        fut.add_done_callback(self.tasks.on_done(self._merge_done))
        return True

    def _merge_done(self, fut: concurrent.futures.Future[Any]) -> None:
        """(maintainer) Install a finished merge, then redirect the index in chunks."""
        lock = self.tasks.lock
        try:
            job = self._merge
            pre: hints.Hint | None = None
            if job is not None and job.future is fut and fut.exception() is None:
                # decode the output's hint before taking the lock: it is the slow part
                path = self.files.path(hint_name(job.out_name)) + ".tmp"
                try:
                    pre = hints.decode(self.fs.read_file(path), path, seq=job.out_seq)
                except (OSError, CorruptionError):
                    pre = None  # _finish_merge reads it again and reports
            with lock:
                if self._merge is None or self._merge.future is not fut:
                    return
                try:
                    self._finish_merge(pre)
                finally:
                    self.tasks.notify()
                r = self._redirect
            # point the index at the output in chunks, letting writers in between
            while r is not None:
                with lock:
                    stop = self.host.merges_paused or self.host.closed
                    if self._redirect is not r or self._redirect_step(
                        r, None if stop else REDIRECT_CHUNK
                    ):
                        self.tasks.notify()
                        return
                # a lock is not fair: give a waiting writer the chance to take it
                time.sleep(YIELD_SECONDS)
        except Exception:
            log.exception("installing a merge in %s failed", self.directory)
            with lock:
                self._merge = None
                self._redirect = None
                self.tasks.notify()

    def _finish_merge(self, pre: hints.Hint | None = None) -> None:
        """(lock held, merge future done) Install the merge output in place of its inputs.

        The index redirect that follows is left in ``self._redirect`` (see
        :meth:`_redirect_step`); until it is done the inputs' mappings stay readable.
        """
        job = self._merge
        assert job is not None
        self._merge = None
        out_path = self.files.path(job.out_name)
        out_hint = self.files.path(hint_name(job.out_name))
        try:
            size, _live, _tombs, dropped, n_expired = job.future.result()
            if self.host.closed:
                raise StoreError("the store closed before the merge was installed")
        except Exception as exc:
            self._merge_failures += 1
            log.error("merge into %s failed: %s", out_path, exc)
            self.fs.remove(out_path + ".tmp")
            self.fs.remove(out_hint + ".tmp")
            if job.owner is not None:
                job.owner.folded_merge_ended(False)
            else:
                self._merge_retry_at = len(self._sealed) + self.max_runs
            return
        self.fs.rename(out_path + ".tmp", out_path)
        self.fs.rename(out_hint + ".tmp", out_hint)
        seg = Segment(job.out_name, job.level, out_path)
        seg.open_sealed(self.fs)
        h = pre if pre is not None else hints.decode(
            self.fs.read_file(out_hint), out_hint, seq=job.out_seq
        )
        wals = job.owner is not None
        sealed, removed = levels.merged_order(self._sealed, job.inputs, seg, wals=wals)
        if wals:
            for s in job.inputs:
                # closes their descriptors; the mappings stay readable until the redirect is done
                s.seal(self.fs)
        # the commit point; the inputs' files go, their mappings stay readable until the
        # redirect is done
        added = [FileEntry(seg.name, "segment", seg.level)]
        self.host.edit_files([*added, FileEntry(hint_name(seg.name), "hint", seg.level)], removed)
        self._sealed = sealed
        self._segs[seg.seq] = seg
        self._merged_bytes += size
        self._expired_dropped += n_expired
        # a key the output holds no live record of (a tombstone — perhaps a value found
        # expired — or a value dropped as expired) leaves the index if it pointed into an
        # input: the output's verdict is its newest
        self._redirect = Redirect(
            h.keys, h.addresses, {s.seq for s in job.inputs}, job.inputs,
            list(h.tombstones) + dropped if h.tombstones else dropped,
        )
        if job.owner is not None:
            job.owner.folded_merge_ended(True)

    def _redirect_step(self, r: Redirect, limit: int | None) -> bool:
        """(lock held) Redirect up to ``limit`` index entries from the merge inputs to the
        output (``None``: all); when all are done, drop the inputs. True when finished."""
        if not r.step(self._index, limit):
            return False
        self._redirect = None
        for s in r.inputs:
            self._segs.pop(s.seq, None)
        self._merges_done += 1
        self.kick()
        return True

    def compact(self) -> None:
        """(lock held, what memory held sealed by the engine) One merge cycle: every sealed
        segment merged into one — the oldest data, so tombstones and expired values vanish.
        Waits (releasing the lock) for hand-offs and a running merge first, then for this
        one and its index redirect."""
        resume = self.host.pause_merges()  # no level merge starts in between
        try:
            self.handoffs.drain()
            self.tasks.wait(
                lambda: (self._merge is None and self._redirect is None) or self.host.closed
            )
            self.host.check_open()
            self.await_index()  # the redirect after the merge needs the whole index
            n = next((i for i, s in enumerate(self._sealed) if not s.hinted), len(self._sealed))
            inputs = self._sealed[:n]  # oldest first; a segment sealed meanwhile stays newer
            if not inputs:
                return
            # alone at its level, older than any level-0 segment sealed from now on
            level = max(1, max(s.level for s in inputs))
            while not self.start_merge(inputs, self.files.next_seq(), level, drop_tombstones=True):
                self.tasks.cond.wait(0.05)  # the merge lane is full: try again shortly
                self.host.check_open()
            job = self._merge
            assert job is not None
            self.tasks.wait(
                lambda: (self._merge is not job and self._redirect is None) or self.host.closed
            )
            self.host.check_open()
            exc = job.future.exception()
            if exc is not None:
                raise StoreError(f"compaction of {self.directory} failed: {exc}") from exc
        finally:
            resume()

    def stats(self) -> dict[str, Any]:
        self.await_index()
        s = levels.segment_stats(self._index, self._sealed)
        s.update(
            merges_done=self._merges_done,
            merges_running=0 if self._merge is None else 1,
            merge_failures=self._merge_failures,
            merged_bytes=self._merged_bytes,
            expired_dropped=self._expired_dropped,
            handoffs_pending=self.handoffs.count,
        )
        return s
