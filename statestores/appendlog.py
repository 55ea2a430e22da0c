"""``appendlog``: a Bitcask-style store — an append-only log plus an in-memory hash index.

Every put/delete/batch is appended to the *active segment* (``records`` format) and the
index maps the key to the record's logical address (``statestores.log``). When the active
segment reaches ``threshold`` bytes it is sealed: a new active segment takes over at once,
and the maintainer thread writes the sealed one's hint file (the keys it holds last, with
addresses, and its tombstones) from the in-memory map kept alongside. ``max_runs_per_level``
hinted segments of one level are merged in the background into one of the next level.

Reopening reads ``CURRENT``, the hint files (never the values), and scans only the active
segment (and a sealed one whose hint a crash prevented), truncating a torn tail.

A snapshot *folds* the active segment: the spare takes over (a pointer swap), and the old
one stops taking appends but is neither hinted nor merged — it stays a ``wal`` entry, and
the snapshot names it with every sealed segment and hint. So a round writes one small
file per store and starts no hint and no merge, like an LSM store's WAL seal. Folded
segments are sealed (hinted, then merged) together with the active one at its next roll
or at close. The snapshot that finds ``max_snapshot_wals`` of them (a per-store value
between half that and all of it, so stores snapshotted together do not all do this in the
same round) instead merges them in the background merge process straight into one sealed
level-0 segment with its hint — two new files for the next round to upload, where sealing
them one by one made a hint each and then merges of those. They stay readable ``wal``
entries until the merge is installed; if the merge slot is taken, a later snapshot tries
again, and at twice the cap they are sealed one by one. A restore scans at most that many.

Files (``FORMAT.md`` § appendlog): ``al-<level>-<seq>.log``, ``al-<level>-<seq>.hint``,
``CURRENT``.
"""

from __future__ import annotations

import array
import functools
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

# the C function itself, not the checksum.crc32c wrapper: one Python frame less per get/put
from crc32c import crc32c

from . import records
from .base import Store
from .checks import MAX_KEY_BYTES, Option, check_key, check_ops, check_put
from .fs import FileSystem
from .log import Handoffs, Segment, Segments, levels, live_pairs
from .log.segment import hint_name, scan_segment
from .snapshot_info import Frozen as _Frozen
from .version import FileEntry

__all__ = ["AppendLogStore"]

_BODY = struct.Struct("<IIB").pack
_CRC = struct.Struct("<I").pack
_REC = records.HEADER_SIZE
#: With ``sync="none"`` appends wait in a user-space buffer up to this size.
_WBUF_BYTES = 64 << 10
_KEEP: Any = object()


@dataclass(eq=False)
class _Sealing:
    """A segment that took its last append, with what its hint is made of."""

    seg: Segment
    alive: dict[bytes, int]  # live keys → addresses
    atombs: set[bytes]  # keys whose last record here is a delete


class AppendLogStore(Store):
    """Bitcask: append-only segments, an in-memory hash index, hint files, background merges.

    Holds its parts: the sealed segments with their index and merges (``segments``,
    :class:`~.log.sealed.Segments`) and the seals handed to the maintainer (``handoffs``,
    :class:`~.log.store.Handoffs`); the active, spare and folded segments are its own.
    """

    engine = "appendlog"
    PREFIX = "al"
    DEFAULT_SYNC = "os"
    #: The background lanes it uses (started at open).
    LANES = ("merge",)
    OPTIONS = {
        "threshold": Option(
            16 << 20, int, lambda v: 1 <= v <= 1 << 34,
            "an int in [1, 2**34] (bytes of the active segment before it is sealed)",
        ),
        **levels.SEGMENT_OPTIONS,
    }

    segments: Segments
    handoffs: Handoffs

    # ------------------------------------------------------------------ open / close

    def _open(self) -> None:
        self.handoffs = Handoffs(self.tasks, self, self.directory)
        self.segments = Segments(
            self, self.fs, self.files, self.tasks, self.handoffs, prefix=self.PREFIX,
            fsync=self.sync == "fsync", max_runs=self.options["max_runs_per_level"],
            local=self.local_background,
        )
        self._active: Segment | None = None
        self._alive: dict[bytes, int] = {}  # the active segment's live keys → addresses
        self._atombs: set[bytes] = set()  # keys whose last record in the active segment is a delete
        self._threshold: int = self.options["threshold"]
        # the real file system's write is os.write; calling it directly saves a Python frame per put
        self._direct = type(self.fs) is FileSystem and self.sync == "os"
        self._rolls = 0
        self._folds = 0
        #: Segments a snapshot folded (oldest first): readable ``wal`` entries, not yet hinted.
        self._folded: list[_Sealing] = []
        self._merging: list[_Sealing] = []  # folded segments being merged (_merge_folded)
        self._fold_cap = levels.snapshot_wal_cap(self.options["max_snapshot_wals"], self.directory)
        #: active/spare segment seq → a seq allocated just before it: the name of the
        #: segment the folded ones are merged into when that segment takes over (see _merge_folded)
        self._below: dict[int, int] = {}
        self._folded_merges = 0
        #: The next active segment, created (and listed in the version) ahead of time, so
        #: that a roll — and so a snapshot's freeze — is a pointer swap with no syscall.
        self._spare: Segment | None = None
        wals = self.segments.open(seal_older_wals=True)
        if wals:
            with self._lock:  # the index may be adopted by its builder thread meanwhile
                self._open_active(wals[-1].name)
            self._edit([self._new_spare()])
        else:
            self._edit([self._start_active(), self._new_spare()])
        self.segments.open_done(self.LANES)

    def _open_active(self, name: str) -> None:
        """Reopen the active segment: replay its records, truncating a torn tail."""
        b = self._scan_open(name, truncate_torn=True)
        self._alive, self._atombs = b.alive, b.atombs
        self._active = b.seg

    def _scan_open(self, name: str, *, truncate_torn: bool) -> _Sealing:
        """(lock held) Replay segment ``name`` into the index; open and map it."""
        seg = Segment(name, 0, self.files.path(name))
        size, alive, tombs = scan_segment(self.fs, seg.path, seg.seq, truncate_torn=truncate_torn)
        for key in tombs:
            self.segments.forget(key)
        self.segments.update(alive)
        self._open_fds(seg, size)
        if size:
            seg.map(self.fs, seg.rfd)  # type: ignore[arg-type]
        self.segments.track(seg)
        return _Sealing(seg, alive, tombs)

    def _start_active(self) -> FileEntry:
        """A new, empty active segment (the caller puts the entry into its edit)."""
        seg = self._create_segment(self._reserve_seq())
        self._active = seg
        self.segments.track(seg)
        return FileEntry(seg.name, "wal")

    def _new_spare(self) -> FileEntry:
        """(lock held) Create the spare segment; the caller puts the entry into its edit."""
        self._spare = self._create_segment(self._reserve_seq())
        return FileEntry(self._spare.name, "wal")

    def _reserve_seq(self) -> int:
        """(lock held) The seq of a new active or spare segment, with the one just below it
        kept in ``_below``: a merge of the segments folded before it took over is named by
        that seq, so it sorts after them and before this one (``version.py``: by seq)."""
        below = self.files.next_seq()
        seq = self.files.next_seq()
        self._below[seq] = below
        return seq

    def _create_segment(self, seq: int) -> Segment:
        """An empty, writable segment file with its descriptors open (no lock needed)."""
        name = self.segments.segment_name(0, seq)
        seg = Segment(name, 0, self.files.path(name))
        self._open_fds(seg, 0)
        return seg

    def _open_fds(self, seg: Segment, size: int) -> None:
        seg.sealed = False
        seg.fd = self.fs.open_append(seg.path)  # creates the file
        seg.rfd = self.fs.open_read(seg.path)
        seg.size = seg.flushed = size

    def _close(self) -> None:
        seg = self._active
        if seg is not None and seg.size or self._folded:
            self._roll(start_new=False, inline=True)
        seg = self._active
        if seg is not None:  # empty
            seg.close(self.fs)
            self.segments.untrack(seg)
            self._active = None
            self._edit((), [seg.name])
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.close(self.fs)
            self._edit((), [spare.name])
        self.segments.drop()

    def _abandon(self) -> None:
        spare = getattr(self, "_spare", None)
        if spare is not None:
            spare.close(self.fs)
        super()._abandon()
        segments: Segments | None = getattr(self, "segments", None)
        if segments is not None:
            segments.drop()

    # ------------------------------------------------------------------ writes

    def _emit(self, seg: Segment, data: bytes) -> None:
        """Append ``data`` to the active segment per ``sync``."""
        n = len(data)
        if self.sync == "none":
            seg.wbuf += data
            seg.size += n
            if len(seg.wbuf) >= _WBUF_BYTES:
                self._flush_wbuf(seg)
            return
        try:
            self.fs.write(seg.fd, data)  # type: ignore[arg-type]
            if self.sync == "fsync":
                self.fs.fsync(seg.fd)  # type: ignore[arg-type]
        except BaseException:
            self._undo_partial(seg)
            raise
        seg.size += n
        seg.flushed = seg.size

    def _undo_partial(self, seg: Segment) -> None:
        """After a failed append, cut the file back to its last whole record (best effort)."""
        try:
            self.fs.truncate(seg.path, seg.flushed)
        except OSError:
            pass

    def _flush_wbuf(self, seg: Segment) -> None:
        if seg.wbuf:
            try:
                self.fs.write(seg.fd, seg.wbuf)  # type: ignore[arg-type]
            except BaseException:
                self._undo_partial(seg)
                raise
            seg.flushed += len(seg.wbuf)
            seg.wbuf = bytearray()

    def put(self, key: bytes, value: bytes) -> None:
        if self._closed:
            self.check_open()
        key, value = check_put(key, value)
        body = _BODY(len(key), len(value), 0) + key + value
        rec = _CRC(crc32c(body)) + body
        with self._lock:
            seg = self._active
            assert seg is not None
            addr = (seg.seq << 36) + seg.size
            if self._direct:
                n = os.write(seg.fd, rec)  # type: ignore[arg-type]
                if n != len(rec):
                    self._emit_rest(seg, rec, n)
                seg.size = seg.flushed = seg.size + len(rec)
            else:
                self._emit(seg, rec)
            self._alive[key] = addr
            self.segments.point(key, addr)
            if self._atombs:
                self._atombs.discard(key)
            if seg.size >= self._threshold:
                self._roll()

    def _emit_rest(self, seg: Segment, rec: bytes, n: int) -> None:
        try:
            self.fs.write(seg.fd, memoryview(rec)[n:])  # type: ignore[arg-type]
        except BaseException:
            self._undo_partial(seg)
            raise

    def delete(self, key: bytes) -> None:
        self.check_open()
        key = check_key(key)
        with self._lock:
            if self.segments.lookup(key) is None:
                return  # nothing live to shadow: older records are shadowed already
            seg = self._active
            assert seg is not None
            self._emit(seg, records.encode(key, None))
            self.segments.forget(key)
            self._alive.pop(key, None)
            self._atombs.add(key)
            if seg.size >= self._threshold:
                self._roll()

    def write_batch(self, ops: Iterable[tuple[bytes, bytes | None]]) -> None:
        self.check_open()
        checked = check_ops(ops)
        if not checked:
            return
        data = records.encode_batch(checked)
        with self._lock:
            seg = self._active
            assert seg is not None
            addr = seg.base + seg.size
            self._emit(seg, data)
            point, forget = self.segments.point, self.segments.forget
            alive, atombs = self._alive, self._atombs
            for k, v in checked:
                if v is None:
                    forget(k)
                    alive.pop(k, None)
                    atombs.add(k)
                    addr += _REC + len(k)
                else:
                    point(k, addr)
                    alive[k] = addr
                    atombs.discard(k)
                    addr += _REC + len(k) + len(v)
            if seg.size >= self._threshold:
                self._roll()

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        if self._closed:
            self.check_open()
        if type(key) is not bytes or not key or len(key) > MAX_KEY_BYTES:
            key = check_key(key)
        return self.segments.get(key, default)  # type: ignore[no-any-return]

    def __len__(self) -> int:
        self.segments.await_index()
        return len(self.segments.index)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair once (values read in chunks, so memory stays bounded)."""
        self.check_open()
        return live_pairs(self, self.segments, None, tuple)

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The in-memory keys walked, only the matches' values read."""
        return live_pairs(self, self.segments, prefix, tuple)


    def flush(self) -> None:
        self.check_open()
        with self._lock:
            seg = self._active
            if seg is None:
                return
            self._flush_wbuf(seg)
            if self.sync == "fsync":
                self.fs.fsync(seg.fd)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ rolling

    def _roll(self, *, start_new: bool = True, inline: bool = False) -> None:
        """(lock held) Seal the folded segments and the active one. The spare takes over at
        once — a pointer swap, no syscall, no version edit (both files are already listed
        as ``wal``, and reopen replays every ``wal`` in order). The maintainer then maps
        each sealed segment, writes its hint and applies one edit per segment (the commit
        point: it becomes a ``segment`` with its ``hint``), and creates the next spare.
        ``inline``: all of it here (close)."""
        if not self._rolling():
            return
        if not inline:
            self.handoffs.reserve()  # first: waiting releases the lock
            if not self._rolling():
                return
        batch, self._folded = self._folded, []
        seg = self._active
        if seg is not None and seg.size:
            batch.append(self._retire(seg, start_new))
            self._rolls += 1
        for b in batch:
            # readable through its descriptors until the maintainer maps it
            b.seg.hint_ready = False
            self.segments.add_sealed(b.seg)
        make_spare = start_new and self._spare is None
        if inline:
            self._seal_all(batch, make_spare)
        else:
            fut = self.handoffs.hand_off(functools.partial(self._seal_all, batch, make_spare))
            for b in batch:
                b.seg.hint_future = fut

    def _seal_all(self, batch: list[_Sealing], make_spare: bool) -> None:
        """(maintainer, or inline at close) :meth:`_seal` each of ``batch``; then create
        the next spare segment if ``make_spare``."""
        for b in batch:
            self._seal(b)
        if make_spare:
            self._make_spare()

    def _rolling(self) -> bool:
        seg = self._active
        return bool(self._folded) or (seg is not None and seg.size > 0)

    def _retire(self, seg: Segment, start_new: bool) -> _Sealing:
        """(lock held) ``seg``, the active segment, takes its last append; the spare (or a
        new segment) takes over when ``start_new``."""
        self._flush_wbuf(seg)
        if self.sync == "fsync":
            self.fs.fsync(seg.fd)  # type: ignore[arg-type]
        done = _Sealing(seg, self._alive, self._atombs)
        self._below.pop(seg.seq, None)
        self._active = None
        self._alive = {}
        self._atombs = set()
        if start_new:
            spare, self._spare = self._spare, None
            if spare is None:  # the maintainer has not made the next one yet
                self._edit([self._start_active()])
            else:
                self._active = spare
                self.segments.track(spare)
        return done

    def _seal(self, b: _Sealing) -> None:
        """(maintainer, or inline at close) Write ``b``'s hint, then make it a sealed segment."""
        seg = b.seg
        keys = sorted(b.alive)  # hint keys are sorted (binary search before the index is built)
        addrs = array.array("Q", map(b.alive.__getitem__, keys))
        self.segments.write_hint(seg.name, seg.seq, seg.size, keys, addrs, sorted(b.atombs))
        with self._lock:
            seg.seal(self.fs)
            # the commit point
            self._edit(
                [FileEntry(seg.name, "segment", 0), FileEntry(hint_name(seg.name), "hint", 0)],
                [seg.name],
            )
            seg.hint_ready = True
            self.segments.kick()

    def _make_spare(self) -> None:
        """(maintainer) Create the next spare segment, unless one exists or the store closed."""
        with self._lock:
            seq = self._reserve_seq() if self._spare is None and not self._closed else None
        if seq is None:
            return
        spare = self._create_segment(seq)  # syscalls, no lock
        with self._lock:
            active = self._active
            # age order is seq order: a spare older than the active (made while the
            # fallback started a new active) would sort before it — drop it
            if (
                self._spare is None
                and not self._closed
                and (active is None or spare.seq > active.seq)
            ):
                self._spare = spare
                self._edit([FileEntry(spare.name, "wal")])
                return
            self._below.pop(spare.seq, None)
        spare.close(self.fs)
        self.fs.remove(spare.path)

    def _fold(self) -> None:
        """(lock held) A snapshot's freeze: the active segment takes its last append and
        stays a readable ``wal`` entry — no hint, no merge — until :meth:`_roll` seals it."""
        seg = self._active
        if seg is None or seg.size == 0:
            return
        self._folded.append(self._retire(seg, True))
        if seg.rfd is not None:
            seg.map(self.fs, seg.rfd)  # reads of it take the fast path
        self._folds += 1
        if self._spare is None:
            self.tasks.post(self._make_spare)

    # ------------------------------------------------------------------ snapshots

    def _freeze(self) -> _Frozen:
        self._fold()
        if (
            len(self._folded) >= self._fold_cap
            and not self._merge_folded()
            and len(self._folded) >= 2 * self._fold_cap
        ):
            self._roll()  # a restore would scan too many, and no merge could start: hint them all
        # folded segments are ``wal`` entries already; the active one and the spare are still
        # written to
        return self.segments.frozen(
            [s.name for s in (self._active, self._spare) if s is not None]
        )

    def _merge_folded(self) -> bool:
        """(lock held, after a fold) Start merging the folded segments into one sealed
        level-0 segment with its hint, in the background merge process; False if the merge
        slot is taken (the next snapshot tries again).

        Sealing them one by one instead meant a hint file each (~17 uploads in one round)
        and then merges of those: CPU and MinIO requests landing in one round. Until the
        merge is installed they stay ``wal`` entries, readable and in every snapshot; its
        output is named by the seq reserved below the active segment (``_reserve_seq``),
        which every folded segment precedes."""
        active = self._active
        out_seq = self._below.get(active.seq) if active is not None else None
        if out_seq is None or not self.segments.may_merge():
            return False
        batch, self._folded = self._folded, []
        self._merging = batch  # before the merge starts: a test's inline merge ends in it
        if not self.segments.start_merge(
            [b.seg for b in batch], out_seq, 0,
            drop_tombstones=not self.segments.sealed_count(), owner=self,
        ):
            self._folded, self._merging = batch, []
            return False
        self._folded_merges += 1
        return True

    def folded_merge_ended(self, ok: bool) -> None:
        """(lock held; ``log.host.FoldedOwner``) The merge :meth:`_merge_folded` started
        ended; if it failed, its segments are folded again — older than any folded since,
        sealed by a roll or merged again."""
        batch, self._merging = self._merging, []
        if not ok:
            self._folded[:0] = batch

    def _install(self, entries: list[FileEntry], replaced: frozenset[str] = frozenset()) -> None:
        seg = self._active
        if seg is not None:
            seg.close(self.fs)
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.close(self.fs)
        self._active = None
        self._folded = []  # their descriptors are closed with the other segments
        self._below = {}
        # wal entries (folded segments) rank among level-0 segments by seq: one older than
        # a segment of the snapshot (folded ones being merged while a newer segment was
        # sealed) is hinted here and loaded in its place; the newer ones are replayed last
        wals = sorted((e for e in entries if e.kind == "wal"), key=lambda e: e.seq)
        top = levels.newest_level0(entries)
        older = [e for e in wals if e.seq < top]
        new = self.segments.install(
            [e for e in entries if e.kind != "wal"] + self.segments.hint_segments(older)
        )
        for e in wals[len(older):]:
            # after the segments: newer
            self._folded.append(self._scan_open(e.name, truncate_torn=False))
            new.append(e)
        self._alive = {}
        self._atombs = set()
        new.append(self._start_active())
        new.append(self._new_spare())
        self._reset_version(new)

    # ------------------------------------------------------------------ stats

    def _stats(self) -> dict[str, Any]:
        s = self.segments.stats()
        seg = self._active
        active_bytes = seg.size if seg is not None else 0
        s.update(
            keys=len(self.segments.index),
            active_bytes=active_bytes,
            rolls=self._rolls,
            folds=self._folds,
            folded_segments=len(self._folded),
            folded_merges=self._folded_merges,
            flushes=self._rolls,
            memory_bytes=s["index_bytes"]
            + 100 * len(self._alive)
            + (len(seg.wbuf) if seg is not None else 0),
            files=self.files.version.names(),
        )
        return s

    # ------------------------------------------------------------------ background work

    def _idle(self) -> bool:
        return self.segments.idle()

    def _kick(self) -> None:
        self.segments.kick()

    def _compact(self) -> None:
        """(lock held) Seal the folded segments and the active one, then merge every sealed
        segment into one (:meth:`Segments.compact`)."""
        self._roll()
        self.segments.compact()
