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
once that many records are read-only, they are written to a new log file (one record per
key: the region is already deduplicated) and leave memory.

Durability (``sync``): the default ``"none"`` keeps the in-memory regions only in memory —
a crash loses the writes since the last flush, snapshot or close, and the store reopens to
the state at that flush (prefix-consistent; this is HybridLog's documented trade-off).
``"os"``/``"fsync"`` add a write-ahead log: every put/delete/batch is appended to the
active WAL before it is applied; the WAL rolls whenever the boundary advances, and a WAL
is deleted once every record it covers is in a log file.

A snapshot flushes both in-memory regions into one new log file (only what changed since
the last flush), and names every log file and hint.

Files (``FORMAT.md`` § hybridlog): ``hl-<level>-<seq>.log``, ``hl-<level>-<seq>.hint``,
``hl-w-<seq>.wal``, ``CURRENT``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from remotes.manifest import Manifest

from . import current, records
from .base import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Frozen,
    Option,
    check_key,
    check_ops,
    check_value,
)
from .fs import FileSystem
from .logfile import SegmentedStore

__all__ = ["HybridLogStore"]

_MISSING: Any = object()


class HybridLogStore(SegmentedStore):
    """FASTER's HybridLog: mutable / read-only in-memory regions over log files."""

    engine = "hybridlog"
    PREFIX = "hl"
    DEFAULT_SYNC = "none"
    OPTIONS = {
        "ro_lag_interval": Option(1 << 16, int, lambda v: v >= 1, "an int >= 1 (records in the mutable region)"),
        "flush_interval": Option(1 << 16, int, lambda v: v >= 1, "an int >= 1 (read-only records before a flush)"),
        **SegmentedStore.SEGMENT_OPTIONS,
    }

    # ------------------------------------------------------------------ open / close

    def _open(self) -> None:
        self._mut: dict[bytes, bytes | None] = {}
        self._ro: dict[bytes, bytes | None] = {}
        self._lag: int = self.options["ro_lag_interval"]
        self._flush_at: int = self.options["flush_interval"]
        self._wal_fd: int | None = None
        self._wal_size = 0  # bytes of whole records in the active WAL
        self._wals: list[str] = []  # WALs oldest → newest; the last is the active one
        self._direct = type(self.fs) is FileSystem and self.sync == "os"
        self._advances = 0
        self._flushes = 0
        self._appends = 0
        state = self._open_segments()
        wals = [w for w in state.get("wals", []) if self.fs.exists(self._path(w))]
        for i, w in enumerate(wals):
            region = self._replay(w)
            if i < len(wals) - 1:
                self._ro.update(region)
            else:
                self._mut = region
        self._wals = wals
        if self.sync == "none":
            if wals or self._mut or self._ro:
                self._flush_all()  # the WALs of an earlier sync="os" run become a log file
        elif wals:
            self._wal_fd = self.fs.open_append(self._path(wals[-1]))
            self._wal_size = self.fs.size(self._path(wals[-1]))
        else:
            self._start_wal()
            self._write_current()
        self._remove_strays(set(self._sealed_files()) | set(self._wals))
        self._open_done()

    def _replay(self, name: str) -> dict[bytes, bytes | None]:
        """The records of WAL ``name`` as a region (last record per key), truncating a torn tail."""
        path = self._path(name)
        buf = self.fs.read_file(path)
        res = records.ScanResult(0, False)
        region: dict[bytes, bytes | None] = {}
        for _off, key, value in records.scan(buf, path, res):
            region[key] = value
        if res.torn:
            self.fs.truncate(path, res.valid_end)
        return region

    def _write_current(self, sealed: list[Any] | None = None) -> None:
        current.write(
            self.fs,
            self.directory,
            {"seq": self._seq, "segments": self._sealed_doc(sealed), "wals": list(self._wals)},
            sync=self.sync == "fsync",
        )

    def _start_wal(self) -> None:
        """Open a new, empty active WAL (older WALs stay until their records are flushed)."""
        if self._wal_fd is not None:
            if self.sync == "fsync":
                self.fs.fsync(self._wal_fd)
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        name = f"{self.PREFIX}-w-{self._next_seq():010d}.wal"
        self._wal_fd = self.fs.open_append(self._path(name))
        self._wal_size = 0
        self._wals.append(name)

    def _release_later(self, names: list[str]) -> None:
        for n in names:
            self._release_file(n)

    def _close(self) -> None:
        if self._mut or self._ro:
            self._flush_all()
        if self._wal_fd is not None:
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        self._drop_segments()

    def _abandon(self) -> None:
        super()._abandon()
        if hasattr(self, "_segs"):
            self._drop_segments()

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
                self.fs.truncate(self._path(self._wals[-1]), self._wal_size)
            except OSError:
                pass
            raise
        self._wal_size += len(data)

    # ------------------------------------------------------------------ writes

    def put(self, key: bytes, value: bytes) -> None:
        if self._closed:
            self._check_open()
        if type(key) is not bytes or type(value) is not bytes or not key or len(key) > MAX_KEY_BYTES or len(value) > MAX_VALUE_BYTES:
            key = check_key(key)
            value = check_value(value, key)
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

    def delete(self, key: bytes) -> None:
        self._check_open()
        key = check_key(key)
        with self._lock:
            m = self._mut
            if m.get(key) is None and self._ro.get(key) is None and self._lookup(key) is None:
                return  # not live anywhere: nothing to shadow
            if key not in m and len(m) >= self._lag:
                self._advance()
                m = self._mut
            if self._wal_fd is not None:
                self._log(records.encode(key, None))
            m[key] = None

    def write_batch(self, ops: Iterable[tuple[bytes, bytes | None]]) -> None:
        self._check_open()
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

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        if self._closed:
            self._check_open()
        if type(key) is not bytes or not key or len(key) > MAX_KEY_BYTES:
            key = check_key(key)
        v = self._mut.get(key, _MISSING)
        if v is _MISSING:
            v = self._ro.get(key, _MISSING)
            if v is _MISSING:
                return self._disk_get(key, default)  # type: ignore[no-any-return]
        return default if v is None else v  # type: ignore[no-any-return]

    def flush(self) -> None:
        """Write both in-memory regions to a log file (durable per ``sync``)."""
        self._check_open()
        with self._lock:
            if self._mut or self._ro:
                self._flush_all()
            elif self._wal_fd is not None and self.sync == "fsync":
                self.fs.fsync(self._wal_fd)

    # ------------------------------------------------------------------ regions

    def _advance(self) -> None:
        """(lock held) Move the read-only boundary to the tail; flush if enough is read-only."""
        self._ro.update(self._mut)
        self._mut = {}
        self._advances += 1
        if self._wal_fd is not None:
            self._start_wal()  # the older WALs now cover exactly the read-only region
            self._write_current()
        if len(self._ro) >= self._flush_at:
            self._flush_ro()

    def _flush_all(self) -> None:
        """(lock held) Make the mutable region read-only and flush everything in memory."""
        self._ro.update(self._mut)
        self._mut = {}
        if self._wal_fd is not None:
            self._start_wal()
        self._flush_ro()

    def _flush_ro(self) -> None:
        """(lock held) Write the read-only region to a new log file and drop it from memory."""
        self._await_index()
        index = self._index
        # a tombstone is needed only where a log file still holds the key
        items = [(k, v) for k, v in self._ro.items() if v is not None or k in index]
        sealed = self._sealed
        if items:
            seg, keys, addrs, tombs = self._seal_new(0, items)
            sealed = sealed + [seg]
        old_wals = self._wals[:-1] if self._wal_fd is not None else self._wals
        self._wals = self._wals[len(old_wals) :]
        self._write_current(sealed)  # the commit point
        if items:
            self._sealed = sealed
            self._segs[seg.seq] = seg
            index.update(zip(keys, addrs, strict=True))
            for k in tombs:
                index.pop(k, None)
        self._ro = {}
        self._flushes += 1
        self._release_later(old_wals)
        self._maybe_merge()

    def _memory_keys(self) -> Iterable[bytes]:
        return list(self._ro) + list(self._mut)

    # ------------------------------------------------------------------ snapshots

    def _freeze(self) -> Frozen:
        if self._mut or self._ro:
            self._flush_all()
        return self._frozen()

    def _install(self, manifest: Manifest, next_seq: int) -> None:
        self._install_segments(manifest, next_seq)
        self._mut = {}
        self._ro = {}
        if self._wal_fd is not None:
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        self._wals = []
        if self.sync != "none":
            self._start_wal()
        self._write_current()
        self._remove_strays(set(self._sealed_files()) | set(self._wals))

    # ------------------------------------------------------------------ stats

    def _stats(self) -> dict[str, Any]:
        s = self._segment_stats()
        index = self._index
        mem: dict[bytes, bytes | None] = dict(self._ro)
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
            memory_bytes=s["index_bytes"] + mem_bytes + sys.getsizeof(self._mut) + sys.getsizeof(self._ro),
            files=sorted(self._sealed_files() + self._wals),
        )
        return s
