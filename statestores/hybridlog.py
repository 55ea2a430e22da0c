"""``hybridlog``: a FASTER-style store — a log whose tail lives in memory and is updated in place.

The logical log has three regions, newest last:

* the **mutable region** (``_mut``): the newest records, a dict. A put to a key whose
  latest record is here overwrites it in place — no new record, no I/O. Under a skewed
  (Zipfian) workload most puts are such in-place dict updates;
* the **read-only region** (``_ro``): older in-memory records, never changed; a put to a
  key found here appends a new record to the tail (the mutable region);
* the **on-disk region**: immutable log files with hint files (``logfile``), indexed by
  the hash index (key → logical address), merged in the background like AppendLog's.

``ro_lag_interval``: how many records the read-only boundary trails the tail. The
boundary advances in steps: when the mutable region holds ``ro_lag_interval`` records and
a put needs a new one, the whole mutable region becomes read-only. ``flush_interval``:
once that many records are read-only, the region is *handed off*: it stays readable (as a
flushing region) while the maintainer thread writes it to a new log file (one record per
key: the region is already deduplicated), and leaves memory once that file is installed.

Durability (``sync``): the default ``"none"`` keeps the in-memory regions only in memory —
a crash loses the writes since the last flush, snapshot or close, and the store reopens to
the state at that flush (prefix-consistent; this is HybridLog's documented trade-off).
``"os"``/``"fsync"`` add a write-ahead log: every put/delete/batch is appended to the
active WAL before it is applied; the WAL rolls whenever the boundary advances, and a WAL
is deleted once every record it covers is in a log file. An active WAL that reaches
``max_wal_bytes`` (hot keys updated in place never advance the boundary) flushes both
regions, so the WALs stay bounded.

A snapshot does not flush (FASTER's fold-over checkpoint): it advances the read-only
boundary to the tail and seals what the records written since the last snapshot are in —
with a WAL, the active WAL (a new one starts); without (``sync="none"``), a small *tail*
file it writes now, holding the last record of each key written since (a WAL in format
and kind). So a round writes one small file per store and starts no flush and no merge,
like an LSM store's. The snapshot names every log file, hint and sealed WAL (and a log
file still being written for a region handed off before, its upload waiting for it). The
sealed WALs go once the read-only region they cover is flushed; when a store holds
``max_snapshot_wals`` of them (between half that and all of it, staggered per store so
stores sharing a machine do not all flush in the same round), the snapshot flushes both
regions instead, as a close does, so a restore never replays more than that many.

Files (``FORMAT.md`` § hybridlog): ``hl-<level>-<seq>.log``, ``hl-<level>-<seq>.hint``,
``hl-w-<seq>.wal`` (WALs and snapshot tails), ``CURRENT``.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from . import background, records
from .base import MAX_KEY_BYTES, Frozen, Option, Store, check_key, check_ops, check_put
from .errors import BackgroundBusy
from .fs import FileSystem
from .log import Handoffs, Segments, levels, live_pairs
from .log.regions import Region, Tail, write_tail
from .log.segment import hint_name
from .version import FileEntry

__all__ = ["HybridLogStore"]

log = logging.getLogger("statestores")

_MISSING: Any = object()


class HybridLogStore(Store):
    """FASTER's HybridLog: mutable / read-only in-memory regions over log files.

    Holds its parts: the log files with their index and merges (``segments``,
    :class:`~.log.sealed.Segments`) and the region flushes and tails handed to the
    maintainer (``handoffs``, :class:`~.log.store.Handoffs`); the regions and WALs are its own.
    """

    engine = "hybridlog"
    PREFIX = "hl"
    LANES = ("merge", "flush")  # regions are written in the flush lane
    DEFAULT_SYNC = "none"
    OPTIONS = {
        "ro_lag_interval": Option(
            1 << 16, int, lambda v: v >= 1, "an int >= 1 (records in the mutable region)"
        ),
        "flush_interval": Option(
            1 << 16, int, lambda v: v >= 1, "an int >= 1 (read-only records before a flush)"
        ),
        "max_wal_bytes": Option(
            64 << 20, int, lambda v: 1 <= v <= 1 << 40,
            "an int in [1, 2**40] (bytes of the active WAL before both regions are flushed)",
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
        self._mut: dict[bytes, bytes | None] = {}
        self._ro: dict[bytes, bytes | None] = {}
        self._flushing: tuple[Region, ...] = ()  # oldest first; replaced whole (lock-free readers)
        self._lag: int = self.options["ro_lag_interval"]
        self._flush_at: int = self.options["flush_interval"]
        self._wal_max: int = self.options["max_wal_bytes"]
        self._wal_cap = levels.snapshot_wal_cap(self.options["max_snapshot_wals"], self.directory)
        # sync="none", once snapshots are taken: the records of the mutable regions turned
        # read-only since the last tail or flush (the next snapshot's tail); None: not kept
        self._fresh: dict[bytes, bytes | None] | None = None
        self._tails: tuple[Tail, ...] = ()  # being written, oldest first; replaced whole
        self._wal_fd: int | None = None
        self._wal_size = 0  # bytes of whole records in the active WAL
        self._wals: list[str] = []  # WALs oldest → newest; the last is the active one
        self._direct = type(self.fs) is FileSystem and self.sync == "os"
        self._advances = 0
        self._flushes = 0
        self._appends = 0
        wals = [e.name for e in self.segments.open()]
        for i, w in enumerate(wals):
            region = self._replay(w)
            if i < len(wals) - 1:
                self._ro.update(region)
            else:
                self._mut = region
        self._wals = wals
        if self.sync == "none":
            if wals:
                # sealed, as a restore leaves them (``_install``): a snapshot's tails (a
                # promoted replica) or the WALs of an earlier sync="os" run stay named in
                # the version, their records read-only, until the next flush covers them.
                # Flushing here instead would drop the files of the snapshot this store
                # was opened at, and a restore to it would download them again.
                self._ro.update(self._mut)
                self._mut = {}
                self._fresh = {}
        elif wals:
            self._wal_fd = self.fs.open_append(self.files.path(wals[-1]))
            self._wal_size = self.fs.size(self.files.path(wals[-1]))
        else:
            self._edit([self._new_wal()])
        self.segments.open_done(self.LANES)

    def _replay(self, name: str) -> dict[bytes, bytes | None]:
        """The records of WAL ``name`` as a region (last record per key), truncating a torn tail."""
        path = self.files.path(name)
        buf = self.fs.read_file(path)
        res = records.ScanResult(0, False)
        region: dict[bytes, bytes | None] = {}
        for _off, key, value in records.scan(buf, path, res):
            region[key] = value
        if res.torn:
            self.fs.truncate(path, res.valid_end)
        return region

    def _new_wal(self) -> FileEntry:
        """Open a new, empty active WAL (older WALs stay until their records are in log
        files); the caller puts the entry into its version edit."""
        if self._wal_fd is not None:
            if self.sync == "fsync":
                self.fs.fsync(self._wal_fd)
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        name = f"{self.PREFIX}-w-{self.files.next_seq():010d}.wal"
        self._wal_fd = self.fs.open_append(self.files.path(name))
        self._wal_size = 0
        self._wals.append(name)
        return FileEntry(name, "wal")

    def _close(self) -> None:
        if self._mut or self._ro or self._flushing:
            self._flush_all(inline=True)
        if self._wal_fd is not None:
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        self.segments.drop()

    def _abandon(self) -> None:
        super()._abandon()
        segments: Segments | None = getattr(self, "segments", None)
        if segments is not None:
            segments.drop()

    # ------------------------------------------------------------------ the WAL

    def _log(self, data: bytes) -> None:
        """Append ``data`` to the active WAL per ``sync`` (only called when there is one)."""
        fd = self._wal_fd
        assert fd is not None
        if self._direct:
            n = os.write(fd, data)
            self._wal_size += n
            if n == len(data):
                return
            data = data[n:]
        try:
            self.fs.write(fd, data)
            if self.sync == "fsync":
                self.fs.fsync(fd)
        except BaseException:
            # cut a partly written record off, so later appends do not follow garbage
            try:
                self.fs.truncate(self.files.path(self._wals[-1]), self._wal_size)
            except OSError:
                pass
            raise
        self._wal_size += len(data)

    # ------------------------------------------------------------------ writes

    def put(self, key: bytes, value: bytes) -> None:
        if self._closed:
            self.check_open()
        key, value = check_put(key, value)
        with self._lock:
            m = self._mut
            if key not in m:
                if len(m) >= self._lag:
                    # advance first: the record must land in the WAL that covers the new region
                    self._advance()
                    m = self._mut
                self._appends += 1  # a new record at the tail (the other puts update in place)
            if self._wal_fd is not None:
                self._log(records.encode(key, value))
                m[key] = value
                if self._wal_size >= self._wal_max:
                    self._bound_wal()
            else:
                m[key] = value

    def delete(self, key: bytes) -> None:
        self.check_open()
        key = check_key(key)
        with self._lock:
            m = self._mut
            if self.get(key, _MISSING) is _MISSING:
                return  # not live anywhere: nothing to shadow
            if key not in m and len(m) >= self._lag:
                self._advance()
                m = self._mut
            if self._wal_fd is not None:
                self._log(records.encode(key, None))
            m[key] = None
            self._bound_wal()

    def write_batch(self, ops: Iterable[tuple[bytes, bytes | None]]) -> None:
        self.check_open()
        checked = check_ops(ops)
        if not checked:
            return
        with self._lock:
            if len(self._mut) >= self._lag:
                self._advance()  # never split a batch across the boundary
            if self._wal_fd is not None:
                self._log(records.encode_batch(checked))
            m = self._mut
            for k, v in checked:
                m[k] = v
            self._bound_wal()

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        if self._closed:
            self.check_open()
        if type(key) is not bytes or not key or len(key) > MAX_KEY_BYTES:
            key = check_key(key)
        v = self._mut.get(key, _MISSING)
        if v is _MISSING:
            v = self._ro.get(key, _MISSING)
            if v is _MISSING:
                flushing = self._flushing
                if flushing:
                    v = self._flushing_get(flushing, key)
                if v is _MISSING:
                    return self.segments.get(key, default)  # type: ignore[no-any-return]
        return default if v is None else v

    @staticmethod
    def _flushing_get(flushing: tuple[Region, ...], key: bytes) -> Any:
        for region in reversed(flushing):
            for d in reversed(region.dicts):
                v = d.get(key, _MISSING)
                if v is not _MISSING:
                    return v
        return _MISSING

    def flush(self) -> None:
        """Write both in-memory regions to a log file (durable per ``sync``)."""
        self.check_open()
        with self._lock:
            if self._mut or self._ro or self._flushing:
                self._flush_all(inline=True)
            elif self._wal_fd is not None and self.sync == "fsync":
                self.fs.fsync(self._wal_fd)

    def _bound_wal(self) -> None:
        """(lock held, after a write was applied) Flush both regions once the active WAL
        holds ``max_wal_bytes``: puts to keys in the mutable region update it in place and
        never advance the boundary, so without this a few hot keys grow the WAL — and what
        a reopen replays — without bound. The flush starts a new WAL; the old ones go when
        the regions' log file is installed."""
        if self._wal_fd is None or self._wal_size < self._wal_max:
            return
        if self.handoffs.full:
            # wait (releasing the lock) for a hand-off slot; meanwhile another writer may
            # flush, or close may (then this write is in its log file: no error to raise)
            self.handoffs.wait_slot()
            if (
                self._closed
                or self._wal_fd is None
                or self._wal_size < self._wal_max
                or not (self._mut or self._ro)
            ):
                return
        self._flush_all()

    # ------------------------------------------------------------------ regions

    def _advance(self) -> None:
        """(lock held) Move the read-only boundary to the tail; hand the read-only region
        off once it holds ``flush_interval`` records."""
        if len(self._ro) + len(self._mut) >= self._flush_at:
            self.handoffs.reserve()  # first: waiting releases the lock
        self._ro.update(self._mut)
        if self._fresh is not None:
            self._fresh.update(self._mut)
        self._mut = {}
        self._advances += 1
        if self._wal_fd is not None:
            self._edit([self._new_wal()])  # the older WALs now cover exactly the read-only region
        if len(self._ro) >= self._flush_at:
            self._flush_ro()

    def _flush_ro(self) -> None:
        """(lock held) Hand the read-only region to the maintainer to become a log file."""
        old_wals = self._wals[:-1] if self._wal_fd is not None else self._wals
        self._start_region([self._ro], old_wals)
        self._ro = {}
        if self._fresh is not None:
            self._fresh = {}  # in the region's log file

    def _flush_all(self, *, inline: bool = False) -> None:
        """(lock held) Both in-memory regions become one log file: handed off, or written
        here with ``inline`` (after every earlier hand-off, waited for without the lock)."""
        if inline:
            self.handoffs.drain()  # first: waiting releases the lock
            dicts = [d for r in self._flushing for d in r.dicts] + [self._ro, self._mut]
            wals = [w for r in self._flushing for w in r.wals]
            self._flushing = ()
        else:
            self.handoffs.reserve()  # first: waiting releases the lock
            dicts = [self._ro, self._mut]
            wals = []
        if self._wal_fd is not None:
            self._edit([self._new_wal()])  # the older WALs cover exactly the regions flushed here
        wals += self._wals[:-1] if self._wal_fd is not None else self._wals
        self._wals = [w for w in self._wals if w not in wals]
        self._ro = {}
        self._mut = {}
        if self._fresh is not None:
            self._fresh = {}
        if inline:
            seq = self.files.next_seq()
            region = Region(dicts, wals, self.segments.segment_name(0, seq), seq)
            self._flushing = (*self._flushing, region)
            self._write_region(region)
        else:
            self._start_region(dicts, wals)

    def _start_region(self, dicts: list[dict[bytes, bytes | None]], wals: list[str]) -> None:
        seq = self.files.next_seq()
        region = Region(dicts, list(wals), self.segments.segment_name(0, seq), seq)
        self._wals = [w for w in self._wals if w not in region.wals]
        self._flushing = (*self._flushing, region)  # readable from now until installed
        region.future = self.handoffs.hand_off(
            functools.partial(self._write_region, region, in_background=True)
        )

    def _write_region(self, region: Region, *, in_background: bool = False) -> None:
        """Write ``region`` as a log file + hint (no lock: the files are new; in the
        background process when ``in_background``), then install it with one version
        edit and drop it from memory."""
        merged: dict[bytes, bytes | None] = {}
        for d in region.dicts:
            merged.update(d)
        items = self.segments.region_items(merged)  # expired values dropped there
        try:
            _size, keys, addrs, tombs = self.segments.write_segment(
                region.name, region.seq, items, in_background=in_background
            )
        except BaseException:
            region.failed = True  # stays in memory (and its WALs on disk); close or flush() retries
            raise
        with self._lock:
            # the commit point: the log file in, the WALs it covers out; then the index
            self.segments.add_written(region.name, keys, addrs, tombs, region.wals)
            self._flushing = tuple(r for r in self._flushing if r is not region)  # after the index
            self._flushes += 1
            self.segments.kick()

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair once (values read in chunks, so memory stays bounded)."""
        self.check_open()
        return live_pairs(self, self.segments, None, self._memory_keys)

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The in-memory keys walked, only the matches' values read."""
        return live_pairs(self, self.segments, prefix, self._memory_keys)


    def _memory_keys(self) -> Iterable[bytes]:
        return (
            [k for r in self._flushing for d in r.dicts for k in d]
            + list(self._ro)
            + list(self._mut)
        )

    # ------------------------------------------------------------------ snapshots

    def _freeze(self) -> Frozen:
        active = self._wals[-1:] if self._wal_fd is not None else []
        tracked = self._wal_fd is not None or self._fresh is not None
        if not tracked or len(self._wals) - len(active) >= self._wal_cap:
            # a first snapshot without a WAL (no tail could name what the regions hold), or
            # a restore would replay too many WALs: flush, as a close does
            if self._mut or self._ro:
                self._flush_all()
            if self._wal_fd is None:
                self._fresh = {}  # from now on each snapshot writes a tail
        else:
            if self._mut:
                self._advance()  # with a WAL, the active one is sealed and a new one started
            if self._fresh:
                self._start_tail()
        active = self._wals[-1:] if self._wal_fd is not None else []
        # the log files being written for handed-off regions are part of the snapshot, and
        # the WALs and tails those regions cover are not: a restore replays a snapshot's
        # WALs over all of its log files, so a covered tail — a subset of the region taken
        # at an earlier snapshot — would put back the values (and deletes) the region's
        # file has since overwritten
        covered = {w for r in self._flushing for w in r.wals}
        extra = [
            e
            for r in self._flushing
            for e in (FileEntry(r.name, "segment", 0), FileEntry(hint_name(r.name), "hint", 0))
        ]
        # being written
        extra += [FileEntry(t.name, "wal") for t in self._tails if t.name not in covered]
        pending = [r.future for r in self._flushing if r.future is not None]
        pending += [t.future for t in self._tails if t.future is not None and t.name not in covered]
        return self.segments.frozen([*active, *covered], extra, pending)

    def _start_tail(self) -> None:
        """(lock held, ``sync="none"``) Seal the records of the regions turned read-only
        since the last tail or flush as a tail: a WAL file holding them as one batch (the
        last record per key). The freeze only swaps the dict and names the file; the
        maintainer encodes and writes it (in the flush background process) and then names
        it in the version, so a round's freeze costs no encoding and no I/O. Its records
        stay in the read-only region meanwhile (readers never need the file); a region
        handed off later covers the tail (its name is in ``_wals``) and, being handed to
        the same maintainer after it, is installed after it."""
        merged = self._fresh
        assert merged is not None
        self._fresh = {}
        tail = Tail(f"{self.PREFIX}-w-{self.files.next_seq():010d}.wal", merged)
        self._wals.append(tail.name)
        self._tails = (*self._tails, tail)
        tail.future = self.handoffs.hand_off(functools.partial(self._write_tail, tail))

    def _write_tail(self, tail: Tail) -> None:
        """(maintainer, no lock) Write ``tail``, then name it in the version: all or nothing."""
        path = self.files.path(tail.name)
        items = list(tail.records.items())
        try:
            done = False
            if not self.local_background:
                try:
                    background.submit(write_tail, None, path, items, lane="flush").result()
                    done = True
                except BackgroundBusy as exc:
                    log.debug("tail %s written on the maintainer: %s", tail.name, exc)
            if not done:
                write_tail(self.fs, path, items)
        except BaseException:
            with self._lock:
                self._tail_failed(tail)
            raise
        with self._lock:
            self._tails = tuple(t for t in self._tails if t is not tail)
            self._edit([FileEntry(tail.name, "wal")])  # a region covering it removes it again

    def _tail_failed(self, tail: Tail) -> None:
        """(lock held) ``tail`` could not be written: the snapshot that sealed it fails (its
        upload waits for it), and its keys go back into the next tail — with the values
        the read-only region holds now — unless a region handed off since covers them."""
        self._tails = tuple(t for t in self._tails if t is not tail)
        if tail.name not in self._wals:
            return  # covered by a handed-off region, which holds its records
        self._wals.remove(tail.name)
        fresh = self._fresh
        if fresh is not None:
            for k in tail.records:
                v = self._ro.get(k, _MISSING)  # nothing was flushed since: the region holds it
                if k not in fresh and v is not _MISSING:
                    fresh[k] = v

    def _install(self, entries: list[FileEntry], replaced: frozenset[str] = frozenset()) -> None:
        wals = sorted((e for e in entries if e.kind == "wal"), key=lambda e: e.seq)
        new = self.segments.install([e for e in entries if e.kind != "wal"])
        self._mut = {}
        self._ro = {}
        self._fresh = {} if self.sync == "none" else None
        self._flushing = ()
        self._tails = ()
        if self._wal_fd is not None:
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        for e in wals:  # the records written after the snapshot's last flush: read-only now
            self._ro.update(self._replay(e.name))
        self._wals = [e.name for e in wals]
        new += wals
        if self.sync != "none":
            new.append(self._new_wal())
        self._reset_version(new)

    # ------------------------------------------------------------------ stats

    def _stats(self) -> dict[str, Any]:
        s = self.segments.stats()
        index = self.segments.index
        mem: dict[bytes, bytes | None] = {}
        for r in self._flushing:
            for d in r.dicts:
                mem.update(d)
        mem.update(self._ro)
        mem.update(self._mut)
        keys = len(index)
        mem_bytes = 0
        for k, v in mem.items():
            mem_bytes += sys.getsizeof(k) + (sys.getsizeof(v) if v is not None else 0) + 16
            if v is None:
                keys -= k in index
            else:
                keys += k not in index
        s.update(
            keys=keys,
            mutable_records=len(self._mut),
            read_only_records=len(self._ro),
            boundary_advances=self._advances,
            tail_appends=self._appends,
            flushes=self._flushes,
            wals=list(self._wals),
            memory_bytes=s["index_bytes"]
            + mem_bytes
            + sys.getsizeof(self._mut)
            + sys.getsizeof(self._ro),
            flushing_regions=len(self._flushing),
            files=self.files.version.names(),
        )
        return s

    # ------------------------------------------------------------------ background work

    def _idle(self) -> bool:
        return self.segments.idle()

    def _kick(self) -> None:
        self.segments.kick()

    def _compact(self) -> None:
        """(lock held) Both regions into a log file, as :meth:`flush` does, then every log
        file merged into one (:meth:`Segments.compact`)."""
        self.flush()
        self.segments.compact()
