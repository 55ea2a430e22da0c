"""``memonly``: the whole state in a dict; a snapshot writes all of it.

The baseline that shows why incremental snapshots matter: every snapshot (and every
flush without a WAL) dumps the full state into a new file, so cumulative snapshot cost
grows quadratically with a growing state.

**The dump's CPU follows the change, its bytes the state.** A dump is written while the
store's lock is held and the caller (a worker's event loop, at each snapshot round) waits.
Encoding every record there cost ~0.35 µs per key — 35 ms per 100K keys, a stall of every
request in flight. So the store keeps each key's encoded dump record (``_enc``) and the keys
written since it was last brought up to date (``_dirty``); a dump re-encodes only those
and joins the rest in C. The price is a second copy of the state in memory. After an open
or a restore everything is dirty (``_dirty`` is None) until the first dump.

Files (see ``FORMAT.md``): ``mem-<seq>.dump`` — the full state as one write batch of log
records; ``mem-<seq>.wal`` — writes since that dump (only with ``sync`` ≠ ``"none"``);
``CURRENT`` — which dump and WAL are live.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from . import expiry, records
from .base import MAX_KEY_BYTES, Frozen, Store, check_key, check_ops, check_put
from .errors import CorruptionError
from .version import FileEntry

__all__ = ["MemOnlyStore"]

#: Records joined per write of a dump (bounds the extra memory a dump takes).
_DUMP_CHUNK_RECORDS = 8192


class MemOnlyStore(Store):
    """A dict, dumped whole at every snapshot; an optional WAL for ``sync`` = os/fsync."""

    engine = "memonly"
    PREFIX = "mem"
    DEFAULT_SYNC = "none"

    def _open(self) -> None:
        self._data: dict[bytes, bytes] = {}
        #: key -> its encoded dump record, as of the last dump (see module docstring)
        self._enc: dict[bytes, bytes] = {}
        #: keys written since then; None: every key (after an open or a restore)
        self._dirty: set[bytes] | None = None
        #: expiring keys → expiry time, and a heap of (time, key) over it (stale entries
        #: skipped), as of the last dump; None: not kept (no horizon was set then)
        self._expiring: dict[bytes, int] | None = None
        self._exp_heap: list[tuple[int, bytes]] = []
        self._expired_dropped = 0
        self._wal_fd: int | None = None
        self._wal_name: str | None = None
        self._wal_bytes = 0
        self._dumps = 0
        version = self.files.load()
        dumps = version.of_kind("dump")
        wals = version.of_kind("wal")
        self._dump_name: str | None = dumps[-1].name if dumps else None
        if self._dump_name:
            self._load_records(self._dump_name, truncate_torn=False)
        wal = wals[-1].name if wals else None
        if wal:
            self._load_records(wal, truncate_torn=True)
            self._wal_bytes = self.fs.size(self.files.path(wal))
            self._wal_name = wal
        if self.sync != "none":
            if wal:
                self._wal_fd = self.fs.open_append(self.files.path(wal))
            else:
                self._start_wal()

    def _load_records(self, name: str, *, truncate_torn: bool) -> None:
        path = self.files.path(name)
        buf = self.fs.read_file(path)
        res = records.ScanResult(0, False)
        data = self._data
        for _off, key, value in records.scan(buf, path, res):
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        if res.torn:
            if not truncate_torn:
                raise CorruptionError(path, "dump file is incomplete")
            self.fs.truncate(path, res.valid_end)

    def _next_name(self, ext: str) -> str:
        return f"mem-{self.files.next_seq():010d}.{ext}"

    def _new_wal(self) -> FileEntry:
        """Open a new, empty WAL (not yet in the version) in place of the current one."""
        if self._wal_fd is not None:
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        self._wal_name = self._next_name("wal")
        self._wal_fd = self.fs.open_new(self.files.path(self._wal_name))
        self._wal_bytes = 0
        return FileEntry(self._wal_name, "wal")

    def _start_wal(self) -> None:
        old = self._wal_name
        entry = self._new_wal()
        self._edit([entry], [old] if old else [])

    def _append(self, data: bytes) -> None:
        if self._wal_fd is None:
            return
        self.fs.write(self._wal_fd, data)
        if self.sync == "fsync":
            self.fs.fsync(self._wal_fd)
        self._wal_bytes += len(data)

    # -- operations --

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        if self._closed:
            self.check_open()
        if type(key) is not bytes or not key or len(key) > MAX_KEY_BYTES:
            key = check_key(key)
        return self._data.get(key, default)

    def put(self, key: bytes, value: bytes) -> None:
        if self._closed:
            self.check_open()
        key, value = check_put(key, value)
        with self._lock:
            if self._wal_fd is not None:
                self._append(records.encode(key, value))
            self._data[key] = value
            if self._dirty is not None:
                self._dirty.add(key)

    def delete(self, key: bytes) -> None:
        self.check_open()
        key = check_key(key)
        with self._lock:
            if self._wal_fd is not None:
                self._append(records.encode(key, None))
            self._data.pop(key, None)
            if self._dirty is not None:
                self._dirty.add(key)
                self._bound_dirty()

    def write_batch(self, ops: Iterable[tuple[bytes, bytes | None]]) -> None:
        self.check_open()
        checked = check_ops(ops)
        if not checked:
            return
        with self._lock:
            if self._wal_fd is not None:
                self._append(records.encode_batch(checked))
            data = self._data
            for k, v in checked:
                if v is None:
                    data.pop(k, None)
                else:
                    data[k] = v
            if self._dirty is not None:
                self._dirty.update(k for k, _ in checked)
                self._bound_dirty()

    def _bound_dirty(self) -> None:
        """(lock held) Deleted keys stay in ``_dirty`` until the next dump; a store that
        churns through keys between rare dumps would hoard them, so beyond twice the live
        keys it drops the cache (the next dump encodes everything again)."""
        assert self._dirty is not None
        if len(self._dirty) > 2 * len(self._data) + 1024:
            self._drop_dump_cache()

    def _drop_dump_cache(self) -> None:
        """Forget every encoded record: the next dump encodes every key."""
        self._enc, self._dirty = {}, None

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        self.check_open()
        with self._lock:
            snapshot = list(self._data.items())
        return iter(snapshot)

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        with self._lock:
            found = [(k, v) for k, v in self._data.items() if k.startswith(prefix)]
        found.sort()
        return iter(found)

    def __len__(self) -> int:
        return len(self._data)

    def flush(self) -> None:
        self.check_open()
        with self._lock:
            if self._wal_fd is None:
                self._dump()
            elif self.sync == "fsync":
                self.fs.fsync(self._wal_fd)

    # -- snapshots --

    def _encoded(self) -> dict[bytes, bytes]:
        """(lock held) Every key's dump record, brought up to date (see module docstring)."""
        data, enc, dirty = self._data, self._enc, self._dirty
        if dirty is None:
            enc = self._enc = {k: records.encode(k, v, records.BATCH) for k, v in data.items()}
        else:
            for k in dirty:
                v = data.get(k)
                if v is None:
                    enc.pop(k, None)
                else:
                    enc[k] = records.encode(k, v, records.BATCH)
        self._dirty = set()
        return enc

    def _drop_expired(self) -> None:
        """(lock held, before a dump) Drop the values expired at the horizon from memory,
        and so from the dump. Expiry times are learnt from the keys written since the last
        dump (all keys after an open, a restore or the first horizon), so a dump pays for
        the change, not the state; nothing at all while no horizon is set."""
        horizon = self._horizon
        if horizon is None:
            self._expiring = None
            return
        data, dirty, expiring = self._data, self._dirty, self._expiring
        heap = self._exp_heap
        if expiring is None or dirty is None:
            expiring = self._expiring = {}
            for k, v in data.items():
                if v and v[0] == expiry.MARKER and (t := expiry.expiry_ms(v)) is not None:
                    expiring[k] = t
            heap = self._exp_heap = [(t, k) for k, t in expiring.items()]
            heapq.heapify(heap)
        else:
            marker = expiry.MARKER
            for k in dirty:
                cur = data.get(k)
                if cur and cur[0] == marker and (t := expiry.expiry_ms(cur)) is not None:
                    if expiring.get(k) != t:
                        expiring[k] = t
                        heapq.heappush(heap, (t, k))
                elif expiring:
                    expiring.pop(k, None)
            if len(heap) > 2 * len(expiring) + 1024:  # stale entries of rewritten keys
                heap = self._exp_heap = [(t, k) for k, t in expiring.items()]
                heapq.heapify(heap)
        while heap and heap[0][0] <= horizon:
            t, k = heapq.heappop(heap)
            if expiring.get(k) == t:
                del expiring[k]
                del data[k]
                if dirty is not None:
                    dirty.add(k)  # _encoded drops its record
                self._expired_dropped += 1

    def _dump(self) -> str:
        """Write the whole state but expired values to a new dump file and make it (and a
        fresh WAL) current."""
        self._drop_expired()
        name = self._next_name("dump")
        path = self.files.path(name)
        tmp = path + ".tmp"
        enc = self._encoded()
        fd = self.fs.open_new(tmp)
        try:
            recs = iter(enc.values())
            while chunk := b"".join(itertools.islice(recs, _DUMP_CHUNK_RECORDS)):
                self.fs.write(fd, chunk)
            self.fs.write(fd, records.encode(b"", len(enc).to_bytes(4, "little"), records.COMMIT))
            if self.sync == "fsync":
                self.fs.fsync(fd)
        finally:
            self.fs.close(fd)
        self.fs.rename(tmp, path)
        old = [n for n in (self._dump_name, self._wal_name) if n]
        self._dump_name = name
        added = [FileEntry(name, "dump")]
        if self.sync != "none":
            added.append(self._new_wal())
        else:
            self._wal_name = None
        self._edit(added, old)
        self._dumps += 1
        return name

    def _compact(self) -> None:
        """(lock held) One merge cycle: a dump, without the expired values."""
        self._dump()

    def _freeze(self) -> Frozen:
        return Frozen([FileEntry(self._dump(), "dump")])

    def _install(self, entries: list[FileEntry], replaced: frozenset[str] = frozenset()) -> None:
        dumps = [e for e in entries if e.kind == "dump"]
        if entries and (len(dumps) != 1 or len(entries) != 1):  # (none: empty, no snapshot)
            raise CorruptionError(
                self.directory,
                f"a memonly snapshot names one dump file, got {[e.name for e in entries]}",
            )
        self._data = {}
        self._drop_dump_cache()
        if dumps:
            self._load_records(dumps[0].name, truncate_torn=False)
        self._dump_name = dumps[0].name if dumps else None
        new = list(dumps)
        if self._wal_fd is not None:
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        self._wal_name = None
        if self.sync != "none":
            new.append(self._new_wal())
        self._reset_version(new)

    def _close(self) -> None:
        if self._wal_fd is None:
            self._dump()
        else:
            if self._wal_bytes > (1 << 20) and self._wal_bytes > 2 * self._data_bytes():
                self._dump()  # keep reopen time proportional to the state, not its history
            if self.sync == "fsync":
                self.fs.fsync(self._wal_fd)
            self.fs.close(self._wal_fd)
            self._wal_fd = None

    def _data_bytes(self) -> int:
        return sum(len(k) + len(v) for k, v in self._data.items())

    def _stats(self) -> dict[str, Any]:
        return {
            "keys": len(self._data),
            "data_bytes": self._data_bytes(),
            "wal_bytes": self._wal_bytes,
            "dumps": self._dumps,
            "expired_dropped": self._expired_dropped,
            "files": self.files.version.names(),
        }
