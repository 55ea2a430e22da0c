"""Log segments and what AppendLog and HybridLog share about them.

Both engines keep every key in an in-memory hash index that maps it to the *logical
address* of its latest record on disk: ``seq << 36 | offset``, where ``seq`` is the
sequence number in the segment file's name (so a hint file can store ready-made
addresses and reopening is one ``dict.update``). Sealed segments are immutable log files
(``records`` format), each with a hint file (``hints``); they are ordered oldest → newest
and carry a level. When ``max_runs_per_level`` segments share a level, they are merged
into one segment at the next level, in a background process (:mod:`.background`): it writes
``<out>.log.tmp`` / ``<out>.hint.tmp``; the store renames them, rewrites ``CURRENT``,
redirects the index entries that pointed into the inputs, and releases the inputs.

Levels never increase from oldest to newest (tiering), so the segments of one level are
contiguous, and a merge output takes their place in the order. A merge drops overwritten
values; it drops tombstones only when no older segment exists (nothing left to shadow).
"""

from __future__ import annotations

import abc
import array
import bisect
import concurrent.futures
import itertools
import logging
import os
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar

# the C function itself, not the checksum.crc32c wrapper: one Python frame less per get/put
from crc32c import crc32c

from remotes.manifest import Manifest

from . import background, current, hints, records
from .base import Frozen, Option, RestoreInfo, Store, _seq_of
from .errors import CorruptionError, StoreError
from .fs import FileSystem
from .hints import OFFSET_BITS, OFFSET_MASK

log = logging.getLogger("statestores")

__all__ = [
    "Segment",
    "SegmentedStore",
    "MergeFailed",
    "merge_segments",
    "write_records",
    "hint_name",
]

_HEADER = records.HEADER
_BODY_PACK = struct.Struct("<IIB").pack
_CRC_PACK = struct.Struct("<I").pack
_HEADER_SIZE = records.HEADER_SIZE
_WRITE_CHUNK = 1 << 20
_MISSING = object()
_first = itemgetter(0)


def hint_name(log_name: str) -> str:
    """The hint file of segment ``log_name`` (``x.log`` → ``x.hint``)."""
    return log_name[:-4] + ".hint"


class MergeFailed(StoreError):
    """A background merge could not read its inputs (picklable across processes)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(path, detail)
        self.path = path
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


class Segment:
    """One log file. Sealed segments are immutable and fully mapped; the active
    AppendLog segment grows, and its mapping covers a prefix (``mapped`` bytes)."""

    __slots__ = ("name", "seq", "level", "path", "mm", "mapped", "size", "sealed",
                 "fd", "rfd", "flushed", "wbuf")

    def __init__(self, name: str, level: int, path: str) -> None:
        self.name = name
        self.seq = _seq_of(name)
        self.level = level
        self.path = path
        self.mm: Any = None  # mmap.mmap | None
        self.mapped = 0  # bytes [0, mapped) readable through mm
        self.size = 0
        self.sealed = True
        self.fd: int | None = None  # append descriptor (active segment only)
        self.rfd: int | None = None  # read descriptor (active segment only)
        self.flushed = 0  # bytes handed to the OS (active segment only)
        self.wbuf = bytearray()  # bytes not yet handed to the OS (sync="none")

    @property
    def base(self) -> int:
        """Logical address of this segment's first byte."""
        return self.seq << OFFSET_BITS

    def map(self, fs: FileSystem, fd: int) -> None:
        """(Re)map the file behind ``fd``; publishes ``mm`` before ``mapped`` for lock-free readers."""
        mm = fs.mmap(fd)
        self.mm = mm
        self.mapped = len(mm) if mm is not None else 0

    def seal(self, fs: FileSystem) -> None:
        """Turn the active segment into a sealed one: close its descriptors, map it whole.

        The old mapping is not closed (a lock-free reader may still hold it); it is freed
        with its last reference.
        """
        fds = [fd for fd in (self.fd, self.rfd) if fd is not None]
        self.fd = None
        try:
            if self.rfd is not None:
                self.map(fs, self.rfd)
        finally:
            self.rfd = None
            for fd in fds:
                fs.close(fd)
        self.size = self.mapped
        self.flushed = self.size
        self.sealed = True

    def open_sealed(self, fs: FileSystem) -> None:
        fd = fs.open_read(self.path)
        try:
            self.map(fs, fd)
        finally:
            fs.close(fd)
        self.size = self.mapped
        self.sealed = True

    def close(self, fs: FileSystem) -> None:
        """Release descriptors and the mapping (the segment is unusable afterwards)."""
        for fd in (self.fd, self.rfd):
            if fd is not None:
                try:
                    fs.close(fd)
                except OSError:
                    pass
        self.fd = self.rfd = None
        mm, self.mm, self.mapped = self.mm, None, 0
        if mm is not None:
            try:
                mm.close()
            except (BufferError, ValueError):
                pass  # a reader still holds it; it is freed with the last reference

    def read(self, fs: FileSystem, offset: int) -> tuple[bytes, bytes | None]:
        """``(key, value_or_None)`` of the record at ``offset``; CorruptionError if bad."""
        if offset < self.mapped:
            key, value, _f, _end = records.decode_at(self.mm, offset, self.path)
            return key, value
        if self.sealed:
            raise CorruptionError(self.path, f"record offset {offset} is past the end of the file ({self.size} bytes)")
        if offset >= self.flushed:
            key, value, _f, _end = records.decode_at(memoryview(self.wbuf), offset - self.flushed, self.path)
            return key, value
        if self.flushed - self.mapped >= _REMAP_BYTES and self.rfd is not None:
            self.map(fs, self.rfd)
            return self.read(fs, offset)
        assert self.rfd is not None
        head = fs.pread(self.rfd, _HEADER_SIZE, offset)
        if len(head) < _HEADER_SIZE:
            raise CorruptionError(self.path, f"truncated record header at offset {offset}")
        _crc, klen, vlen, _flags = _HEADER.unpack(head)
        rec = fs.pread(self.rfd, _HEADER_SIZE + klen + vlen, offset)
        key, value, _f, _end = records.decode_at(rec, 0, self.path)
        return key, value


#: The active segment is remapped once this many written bytes lie beyond its mapping;
#: smaller tails are read with pread.
_REMAP_BYTES = 1 << 20


def write_records(
    fs: FileSystem, fd: int, seq: int, items: Iterable[tuple[bytes, bytes | None]]
) -> tuple[int, list[bytes], array.array, list[bytes]]:
    """Write one record per ``(key, value_or_None)`` (keys unique) to the new file ``fd``.

    Returns ``(size, live_keys, live_addresses, tombstone_keys)`` for the hint.
    """
    keys: list[bytes] = []
    addrs = array.array("Q")
    tombs: list[bytes] = []
    buf = bytearray()
    pos = 0
    base = seq << OFFSET_BITS
    encode = records.encode
    body_pack = _BODY_PACK
    crc_pack = _CRC_PACK
    add_key = keys.append
    add_addr = addrs.append
    for k, v in items:
        if v is None:
            tombs.append(k)
            buf += encode(k, None)
        else:
            add_key(k)
            add_addr(base + pos + len(buf))
            # records.encode, inlined: this loop runs once per record of every flush
            body = body_pack(len(k), len(v), 0) + k + v
            buf += crc_pack(crc32c(body))
            buf += body
        if len(buf) >= _WRITE_CHUNK:
            fs.write(fd, buf)
            pos += len(buf)
            buf = bytearray()
    if buf:
        fs.write(fd, buf)
        pos += len(buf)
    return pos, keys, addrs, tombs


def merge_segments(
    directory: str,
    inputs: list[tuple[str, int]],
    out_name: str,
    out_seq: int,
    drop_tombstones: bool,
    fsync: bool,
) -> tuple[int, int, int]:
    """Merge segments ``inputs`` (``(log name, seq)``, oldest first) into ``out_name``.

    Runs in the background merge process. Writes ``<out>.tmp`` and ``<out hint>.tmp`` (the store
    renames them) and returns ``(bytes, live records, tombstones)``. The newest record of
    each key wins; tombstones are dropped with ``drop_tombstones``. Every copied record's
    checksum is verified; bad input raises :class:`MergeFailed` naming the file.
    """
    fs = FileSystem()
    out_path = os.path.join(directory, out_name)
    out_hint = os.path.join(directory, hint_name(out_name))
    maps: dict[int, tuple[Any, str]] = {}
    try:
        latest: dict[bytes, int] = {}
        for name, seq in inputs:
            path = os.path.join(directory, name)
            hpath = os.path.join(directory, hint_name(name))
            h = hints.decode(fs.read_file(hpath), hpath, seq=seq)
            latest.update(zip(h.keys, h.addresses, strict=True))
            if h.tombstones:
                latest.update(dict.fromkeys(h.tombstones, -1))
            fd = fs.open_read(path)
            try:
                mm = fs.mmap(fd)
            finally:
                fs.close(fd)
            if (len(mm) if mm is not None else 0) != h.data_size:
                raise CorruptionError(path, f"size differs from its hint ({h.data_size} bytes)")
            maps[seq] = (mm, path)
        keys: list[bytes] = []
        addrs = array.array("Q")
        tombs: list[bytes] = []
        base = out_seq << OFFSET_BITS
        fd = fs.open_new(out_path + ".tmp")
        try:
            buf = bytearray()
            pos = 0
            for k, a in sorted(latest.items(), key=_first):  # hint keys must be sorted
                if a < 0:
                    if drop_tombstones:
                        continue
                    tombs.append(k)
                    buf += records.encode(k, None)
                else:
                    mm, path = maps[a >> OFFSET_BITS]
                    keys.append(k)
                    addrs.append(base + pos + len(buf))
                    buf += _copy_record(mm, a & OFFSET_MASK, k, path)
                if len(buf) >= _WRITE_CHUNK:
                    fs.write(fd, buf)
                    pos += len(buf)
                    buf = bytearray()
                    if pos > OFFSET_MASK:  # addresses hold 36 bits of offset
                        raise MergeFailed(out_path, "a merged segment would exceed 64 GiB; not merging")
            fs.write(fd, buf)
            pos += len(buf)
            if fsync:
                fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.write_file_atomic(out_hint + ".tmp", hints.encode(out_seq, pos, keys, addrs, tombs), sync=fsync)
        return pos, len(keys), len(tombs)
    except CorruptionError as exc:
        fs.remove(out_path + ".tmp")
        raise MergeFailed(exc.path, exc.detail) from None
    except BaseException:
        fs.remove(out_path + ".tmp")
        raise
    finally:
        for mm, _p in maps.values():
            if mm is not None:
                mm.close()


def _copy_record(mm: Any, off: int, key: bytes, path: str) -> bytes:
    """The verified bytes of the live record at ``off`` (batch flag cleared)."""
    if mm is None or off + _HEADER_SIZE > len(mm):
        raise CorruptionError(path, f"record offset {off} is past the end of the file")
    crc, klen, vlen, flags = _HEADER.unpack_from(mm, off)
    end = off + _HEADER_SIZE + klen + vlen
    rec = mm[off:end]
    if end > len(mm) or crc32c(memoryview(rec)[4:]) != crc or rec[_HEADER_SIZE : _HEADER_SIZE + klen] != key:
        raise CorruptionError(path, f"checksum mismatch in record at offset {off}")
    if flags & ~records.TOMBSTONE:
        # a batch member: outside its batch it is a plain record
        return records.encode(key, rec[_HEADER_SIZE + klen :])
    return rec


def _submit(fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
    """``background.submit`` on the merge lane, never raising: a full queue fails the
    returned future instead (the merge counts as failed and is retried later)."""
    try:
        return background.submit(fn, *args)
    except Exception as exc:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_exception(exc)
        return fut


class _Redirect:
    """An index redirect in progress after a merge: the output's keys and addresses, and
    how far the redirect got."""

    def __init__(self, keys: list[bytes], addrs: array.array, gone: set[int], inputs: list[Segment]) -> None:
        self.keys = keys
        self.addrs = addrs
        self.pos = 0
        self.gone = gone
        self.inputs = inputs


class _PendingIndex:
    """The hints of the sealed segments, before (and while) they become the hash index.

    Hint keys are sorted, so a key is found by binary search, newest segment first.
    """

    def __init__(self, loaded: list[hints.Hint]) -> None:
        self.hints = loaded  # oldest first
        self._lock = threading.Lock()
        self._built: dict[bytes, int] | None = None

    def lookup(self, key: bytes) -> int | None:
        """The address of ``key``'s newest record in the hints, None if none or deleted."""
        for h in reversed(self.hints):
            keys = h.keys
            i = bisect.bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                return h.addresses[i]
            tombs = h.tombstones
            if tombs:
                i = bisect.bisect_left(tombs, key)
                if i < len(tombs) and tombs[i] == key:
                    return None
        return None

    def build(self) -> dict[bytes, int]:
        """The hash index of all hints (built once; concurrent callers wait for it)."""
        with self._lock:
            if self._built is None:
                index: dict[bytes, int] = {}
                for h in self.hints:
                    keys, addrs = h.keys, h.addresses
                    # in slices: one dict.update holds the GIL throughout, and the thread
                    # that opened the store should not wait for the whole build
                    for i in range(0, len(keys), _BUILD_SLICE):
                        index.update(zip(keys[i : i + _BUILD_SLICE], addrs[i : i + _BUILD_SLICE], strict=True))
                    for k in h.tombstones:
                        index.pop(k, None)
                self._built = index
            return self._built


#: Keys per dict.update while building the index in the background (~1 ms each).
_BUILD_SLICE = 1 << 12

#: Stores whose hints hold at least this many keys open with the index built in the background.
_LAZY_INDEX_KEYS = 1 << 16

#: Pause between two chunks of background work that takes the store lock.
_YIELD_SECONDS = 0.001

#: Index entries redirected per lock hold after a merge.
_REDIRECT_CHUNK = 1 << 12


@dataclass
class _MergeJob:
    inputs: list[Segment]
    out_name: str
    out_seq: int
    level: int
    future: concurrent.futures.Future[tuple[int, int, int]]


class SegmentedStore(Store):
    """Shared machinery of AppendLog and HybridLog: sealed segments + hints, the hash
    index over them, background merges, and the fast read path.

    Subclasses set ``PREFIX`` and implement ``_write_current(sealed)`` (persist the
    segment list in ``CURRENT``) and ``_memory_keys()``.
    """

    PREFIX: ClassVar[str] = ""
    SEGMENT_OPTIONS: ClassVar[dict[str, Option]] = {
        "max_runs_per_level": Option(4, int, lambda v: 2 <= v <= 1000, "an int in [2, 1000]"),
    }

    # ------------------------------------------------------------------ state

    def _init_segments(self) -> None:
        self._seq = 0
        self._index: dict[bytes, int] = {}
        # while the index is built in the background: the hints (sorted), and keys deleted since
        self._pending: _PendingIndex | None = None
        self._gone: set[bytes] = set()
        self._segs: dict[int, Segment] = {}
        self._sealed: list[Segment] = []
        self._merge: _MergeJob | None = None
        self._redirect: _Redirect | None = None
        self._merge_pause = 0
        self._merges_done = 0
        self._merge_failures = 0
        self._merge_retry_at = 0  # no merge starts while fewer segments exist (after a failure)
        self._merged_bytes = 0

    def _has_local_state(self) -> bool:
        return current.exists(self.fs, self.directory)

    def _open_segments(self) -> dict[str, Any]:
        """Reset, read ``CURRENT``, load its sealed segments; return the ``CURRENT`` document.

        The sequence counter continues above every name in the directory (strays too), so
        a name is never reused for other bytes.
        """
        self._init_segments()
        # no merge may start before open is done (the index builder thread could start one,
        # and the engine's stray removal would delete its output)
        self._merge_pause = 1
        state = current.read(self.fs, self.directory)
        self._seq = int(state.get("seq", 0))
        self._load_sealed(state.get("segments", []))
        prefix = self.PREFIX + "-"
        names = [n for n in self.fs.listdir(self.directory) if n.startswith(prefix)]
        self._seq = max([self._seq] + [_seq_of(n) for n in names])
        return state

    def _open_done(self) -> None:
        """End of the engine's ``_open``: merges may start."""
        with self._lock:
            self._merge_pause = 0
            self._maybe_merge()

    def _install_segments(self, manifest: Manifest, next_seq: int) -> None:
        """Drop every segment and load those of ``manifest`` (the shared part of ``_install``)."""
        entries = manifest.meta.get("segments")
        if not isinstance(entries, list):
            raise CorruptionError(
                f"manifest {manifest.snapshot_id}", f"{self.engine} manifest lacks its segment list"
            )
        self._drop_segments()
        self._seq = max(self._seq, next_seq - 1)
        self._load_sealed(entries)

    def _frozen(self) -> Frozen:
        """The sealed segments as a snapshot (after the engine made everything sealed)."""
        return Frozen(self._sealed_files(), {"segments": self._sealed_doc()})

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _segment_name(self, level: int, seq: int) -> str:
        return f"{self.PREFIX}-{level}-{seq:010d}.log"

    def _sealed_doc(self, sealed: list[Segment] | None = None) -> list[list[Any]]:
        return [[s.name, s.level] for s in (self._sealed if sealed is None else sealed)]

    @abc.abstractmethod
    def _write_current(self, sealed: list[Segment] | None = None) -> None:
        """Persist ``CURRENT`` naming ``sealed`` (default: the current list) and the engine's other live files."""

    def _sealed_files(self) -> list[str]:
        out: list[str] = []
        for s in self._sealed:
            out += (s.name, hint_name(s.name))
        return out

    def _load_sealed(self, entries: Iterable[list[Any]]) -> None:
        """Open the sealed segments ``[[name, level], ...]`` (oldest first) and index them from their hints."""
        loaded: list[hints.Hint] = []
        for name, level in entries:
            seg = Segment(name, int(level), self._path(name))
            seg.open_sealed(self.fs)
            try:
                hpath = self._path(hint_name(name))
                h = hints.decode(self.fs.read_file(hpath), hpath, seq=seg.seq)
                if h.data_size != seg.size:
                    raise CorruptionError(seg.path, f"file is {seg.size} bytes, its hint says {h.data_size}")
            except (CorruptionError, OSError):
                seg.close(self.fs)
                raise
            loaded.append(h)
            self._sealed.append(seg)
            self._segs[seg.seq] = seg
            self._seq = max(self._seq, seg.seq)
        if not loaded:
            return
        pending = _PendingIndex(loaded)
        if sum(len(h.keys) for h in loaded) < _LAZY_INDEX_KEYS:
            self._index = pending.build()
        else:
            # open returns now; reads use the hints' sorted key arrays until the hash
            # index, built on a thread, is adopted
            self._pending = pending
            self._start_index_build(pending)

    def _start_index_build(self, pending: _PendingIndex) -> None:
        threading.Thread(target=self._index_builder, args=(pending,), name="statestores-index", daemon=True).start()

    def _index_builder(self, pending: _PendingIndex) -> None:
        try:
            pending.build()
            with self._lock:
                self._adopt_index(pending)
        except Exception:
            log.exception("building the index of %s failed", self.directory)

    def _adopt_index(self, pending: _PendingIndex) -> None:
        """(lock held) Replace the interim index by the built one, with every write since open applied."""
        if self._pending is not pending:
            return  # dropped meanwhile (restore, close)
        built = pending.build()
        for k in self._gone:
            built.pop(k, None)
        built.update(self._index)
        self._index = built  # before _pending = None: see _disk_get
        self._pending = None
        self._gone = set()
        self._maybe_merge()

    def _await_index(self) -> None:
        """Make sure the hash index is complete (building it here if need be)."""
        pending = self._pending
        if pending is not None:
            pending.build()
            with self._lock:
                self._adopt_index(pending)

    def _lookup(self, key: bytes) -> int | None:
        """(lock held) The address of ``key``'s live record, or None."""
        loc = self._index.get(key)
        if loc is not None or self._pending is None or key in self._gone:
            return loc
        return self._pending.lookup(key)

    def _forget(self, key: bytes) -> None:
        """(lock held) ``key`` was deleted: drop it from the index (and shadow the interim one)."""
        self._index.pop(key, None)
        if self._pending is not None:
            self._gone.add(key)

    def _seal_new(
        self, level: int, items: Iterable[tuple[bytes, bytes | None]]
    ) -> tuple[Segment, list[bytes], array.array, list[bytes]]:
        """Write ``items`` (unique keys) as a new sealed segment + hint (not yet listed in
        ``CURRENT``); return it with its live keys, their addresses, and its tombstones."""
        seq = self._next_seq()
        name = self._segment_name(level, seq)
        path = self._path(name)
        fd = self.fs.open_new(path + ".tmp")
        try:
            # in key order: hint keys must be sorted (see _PendingIndex)
            size, keys, addrs, tombs = write_records(self.fs, fd, seq, sorted(items, key=_first))
            if self.sync == "fsync":
                self.fs.fsync(fd)
        finally:
            self.fs.close(fd)
        self._write_hint(name, seq, size, keys, addrs, tombs)
        self.fs.rename(path + ".tmp", path)
        seg = Segment(name, level, path)
        seg.open_sealed(self.fs)
        return seg, keys, addrs, tombs

    def _write_hint(self, name: str, seq: int, size: int, keys: list[bytes], addrs: Any, tombs: list[bytes]) -> None:
        self.fs.write_file_atomic(
            self._path(hint_name(name)), hints.encode(seq, size, keys, addrs, tombs), sync=self.sync == "fsync"
        )

    def _remove_strays(self, live: set[str]) -> None:
        """Delete this engine's files that ``CURRENT`` does not name (leftovers of a crash)."""
        prefix = self.PREFIX + "-"
        for name in self.fs.listdir(self.directory):
            if name.startswith(prefix) and name not in live:
                self._release_file(name)

    def _drop_segments(self) -> None:
        for seg in self._segs.values():
            seg.close(self.fs)
        self._segs = {}
        self._sealed = []
        self._index = {}
        self._pending = None
        self._gone = set()

    # ------------------------------------------------------------------ reads

    def _disk_get(self, key: bytes, default: Any) -> Any:
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
        with self._lock:
            loc = self._lookup(key)
            if loc is None:
                return default
            seg = self._segs.get(loc >> OFFSET_BITS)
            if seg is None:
                raise StoreError(f"{self.directory}: index entry of key {key!r:.60} names unknown segment {loc >> OFFSET_BITS}")
            rkey, value = seg.read(self.fs, loc & OFFSET_MASK)
            if rkey != key:
                raise CorruptionError(seg.path, f"record at offset {loc & OFFSET_MASK} holds key {rkey!r:.60}, expected {key!r:.60}")
            return default if value is None else value

    def _get_any(self, key: bytes) -> Any:
        return self.get(key, _MISSING)  # type: ignore[arg-type]

    def _memory_keys(self) -> Iterable[bytes]:
        """Keys held outside the disk index (HybridLog's in-memory regions)."""
        return ()

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair once (values read in chunks, so memory stays bounded)."""
        self._check_open()
        self._await_index()
        with self._lock:
            keys = list(self._index)
            extra = [k for k in dict.fromkeys(self._memory_keys()) if k not in self._index]
        keys += extra
        for i in range(0, len(keys), 1024):
            with self._lock:
                self._check_open()
                chunk = [(k, self._get_any(k)) for k in keys[i : i + 1024]]
            for k, v in chunk:
                if v is not _MISSING:
                    yield k, v

    # ------------------------------------------------------------------ merges

    def _maybe_merge(self) -> None:
        """(lock held) Start a merge if a level is full and none is running."""
        if self._merge is not None or self._redirect is not None or self._merge_pause or self._closed:
            return
        if self._pending is not None:
            return  # the redirect after a merge needs the complete index; adoption calls back
        limit = self.options["max_runs_per_level"]
        if len(self._sealed) < self._merge_retry_at:
            return  # the last merge failed: wait for more segments before trying again
        counts = Counter(s.level for s in self._sealed)
        for level in sorted(counts):
            if counts[level] < limit:
                continue
            first = next(i for i, s in enumerate(self._sealed) if s.level == level)
            inputs = self._sealed[first : first + counts[level]]
            if any(s.level != level for s in inputs):
                log.warning("segments of level %d in %s are not contiguous; not merging", level, self.directory)
                continue
            seq = self._next_seq()
            out = self._segment_name(level + 1, seq)
            fut = _submit(
                merge_segments,
                self.directory,
                [(s.name, s.seq) for s in inputs],
                out,
                seq,
                first == 0,
                self.sync == "fsync",
            )
            self._merge = _MergeJob(inputs, out, seq, level + 1, fut)
            if fut.done():  # failed at once (or a test's synchronous _submit): install now
                self._merge_done(fut)
            else:
                fut.add_done_callback(self._merge_landed)
            return

    def _merge_landed(self, fut: concurrent.futures.Future[Any]) -> None:
        # Runs on the background lane's dispatcher thread: hand over to a thread of our own
        # (installing takes the store lock and decodes the output's hint).
        threading.Thread(target=self._merge_done, args=(fut,), name="statestores-merge-install", daemon=True).start()

    def _merge_done(self, fut: concurrent.futures.Future[Any]) -> None:
        try:
            job = self._merge
            pre: hints.Hint | None = None
            if job is not None and job.future is fut and fut.exception() is None:
                # decode the output's hint before taking the lock: it is the slow part
                path = self._path(hint_name(job.out_name)) + ".tmp"
                try:
                    pre = hints.decode(self.fs.read_file(path), path, seq=job.out_seq)
                except (OSError, CorruptionError):
                    pre = None  # _finish_merge reads it again and reports
            with self._lock:
                if self._merge is None or self._merge.future is not fut or self._closed:
                    return
                self._finish_merge(pre)
                r = self._redirect
            # point the index at the output in chunks, letting writers in between
            while r is not None:
                with self._lock:
                    if self._redirect is not r or self._redirect_step(r, _REDIRECT_CHUNK):
                        return
                time.sleep(_YIELD_SECONDS)  # a lock is not fair: give a waiting writer the chance to take it
        except Exception:
            log.exception("installing a merge in %s failed", self.directory)

    def _finish_merge(self, pre: hints.Hint | None = None) -> None:
        """(lock held, merge future done) Install the merge output in place of its inputs.

        The index redirect that follows is left in ``self._redirect`` for the caller to
        run (:meth:`_redirect_step`); until it is done the inputs stay readable.
        """
        job = self._merge
        assert job is not None
        self._merge = None
        out_path = self._path(job.out_name)
        out_hint = self._path(hint_name(job.out_name))
        try:
            size, _live, _tombs = job.future.result()
        except Exception as exc:
            self._merge_failures += 1
            self._merge_retry_at = len(self._sealed) + self.options["max_runs_per_level"]
            log.error("merge into %s failed: %s", out_path, exc)
            self.fs.remove(out_path + ".tmp")
            self.fs.remove(out_hint + ".tmp")
            return
        self.fs.rename(out_path + ".tmp", out_path)
        self.fs.rename(out_hint + ".tmp", out_hint)
        seg = Segment(job.out_name, job.level, out_path)
        seg.open_sealed(self.fs)
        h = pre if pre is not None else hints.decode(self.fs.read_file(out_hint), out_hint, seq=job.out_seq)
        first = self._sealed.index(job.inputs[0])
        sealed = self._sealed[:first] + [seg] + self._sealed[first + len(job.inputs) :]
        self._write_current(sealed)  # the commit point
        self._sealed = sealed
        self._segs[seg.seq] = seg
        self._merged_bytes += size
        self._redirect = _Redirect(h.keys, h.addresses, {s.seq for s in job.inputs}, job.inputs)

    def _redirect_step(self, r: _Redirect, limit: int | None) -> bool:
        """(lock held) Redirect up to ``limit`` index entries from the merge inputs to the
        output (``None``: all); when all are done, release the inputs. True when finished."""
        index = self._index
        get = index.get
        gone = r.gone
        n = len(r.keys)
        end = n if limit is None else min(n, r.pos + limit)
        for k, a in zip(r.keys[r.pos : end], r.addrs[r.pos : end], strict=True):
            cur = get(k)
            if cur is not None and (cur >> OFFSET_BITS) in gone:
                index[k] = a
        r.pos = end
        if end < n:
            return False
        self._redirect = None
        for s in r.inputs:
            del self._segs[s.seq]
            self._release_file(s.name)
            self._release_file(hint_name(s.name))
        self._merges_done += 1
        self._maybe_merge()
        return True

    def restore(self, snapshot_id: int | None = None) -> RestoreInfo:
        """See :meth:`Store.restore`. Merges stay paused for the whole restore: the base
        class decides which files to download *before* it quiesces, and a merge finishing
        in between would delete inputs that the snapshot still names."""
        self._check_open()
        with self._lock:
            self._quiesce()
        try:
            return super().restore(snapshot_id)
        finally:
            self._resume()

    def _quiesce(self) -> None:
        self._merge_pause += 1
        job = self._merge
        if job is not None:
            concurrent.futures.wait([job.future])
            with self._lock:
                if self._merge is job:
                    self._finish_merge()
        with self._lock:
            if self._redirect is not None:
                self._redirect_step(self._redirect, None)

    def _resume(self) -> None:
        self._merge_pause = max(0, self._merge_pause - 1)
        if not self._merge_pause and not self._closed:
            with self._lock:
                self._maybe_merge()

    # ------------------------------------------------------------------ stats

    def _segment_stats(self) -> dict[str, Any]:
        self._await_index()
        index = self._index
        sample = list(itertools.islice(index, 64))
        per_key = (sum(sys.getsizeof(k) for k in sample) / len(sample) if sample else 0) + 32
        levels = Counter(s.level for s in self._sealed)
        return {
            "keys_on_disk": len(index),
            "index_bytes": int(sys.getsizeof(index) + per_key * len(index)),
            "segments": len(self._sealed),
            "files_per_level": {f"L{lv}": levels[lv] for lv in sorted(levels)},
            "sealed_bytes": sum(s.size for s in self._sealed),
            "merges_done": self._merges_done,
            "merges_running": 0 if self._merge is None else 1,
            "merge_failures": self._merge_failures,
            "merged_bytes": self._merged_bytes,
        }

