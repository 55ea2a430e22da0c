"""``lsm``: a log-structured merge tree with tiered merges.

Writes go to a dict memtable (and, unless ``sync="none"``, to a write-ahead log). When the
memtable reaches ``memtable_bytes`` it becomes *immutable* (still read by lookups, its WALs
still live) and a one-process flush pool sorts it and writes it as a level-0 *run*: an
immutable file of checksummed blocks with its fence pointers and Bloom filter embedded
(:mod:`.runfile`); the store installs runs in memtable order. When a level holds
``max_runs_per_level`` runs they are merged, in the shared background process pool
(:mod:`statestores.background`), into one run of the next level; the store installs the
result atomically (``CURRENT``) and keeps serving reads and writes meanwhile. Writers
wait only if ``_MAX_IMMS`` memtables are already waiting for their flush.

Files (``FORMAT.md`` § lsm): ``lsm-L<level>-<seq>.run`` runs, ``lsm-<seq>.wal`` WALs, and
``CURRENT`` = ``{"seq", "levels": [[run names, oldest first], …], "wals": [names, oldest
first]}``. Anything else named ``lsm-*`` is a leftover of a crash and is removed on open.

Snapshots do not flush: with a WAL, freezing *seals* the active WAL (a new one takes
over), so a snapshot is the run files plus the sealed WALs, and costs only the bytes
written since the previous one. Without a WAL (``sync="none"``) freezing flushes the
memtable.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import struct
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import mmh3
from crc32c import crc32c as crc32c_raw

from .. import background, records
from ..base import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Frozen,
    Option,
    Store,
    check_key,
    check_ops,
    check_value,
)
from ..errors import BackgroundBusy, CorruptionError
from ..fs import FileSystem
from ..version import FileEntry, seq_of
from . import merge as merge_mod
from .merge import merge_sorted
from .runfile import ABSENT, RunReader, block_get, decode_block, write_run
from .wal import replay

__all__ = ["LSMStore"]

log = logging.getLogger("statestores.lsm")

_MISS = object()
_hash64 = mmh3.hash64
_encode = records.encode
_crc = crc32c_raw
#: ``records`` body header (klen, vlen, flags); ``put`` inlines ``records.encode`` with it.
_BODY = struct.Struct("<IIB")
_CRC = struct.Struct("<I")
#: Estimated bytes a memtable entry costs beyond its key and value (two bytes objects
#: and a dict slot); used for ``memtable_bytes`` and ``memory_bytes``.
_ENTRY_OVERHEAD = 100
#: Estimated bytes a cached, decoded block costs per record beyond its raw size.
_CACHED_RECORD_OVERHEAD = 90
#: One block-cache miss in this many decodes its block into the cache (see _miss).
_ADMIT_EVERY = 4
#: A WAL holding this many times ``memtable_bytes`` forces a flush (bounds replay time
#: under overwrite-heavy loads, where the memtable stays small but the log grows).
_WAL_FACTOR = 4


def _positive(v: int) -> bool:
    return v >= 1


#: Immutable memtables that may wait for their background flush before a writer stalls.
_MAX_IMMS = 3

@dataclass(eq=False)
class _Imm:
    """A full memtable being written to a level-0 run in the background."""

    mem: dict[bytes, bytes | None]
    nbytes: int
    wals: list[str]  # the WALs holding exactly these writes (sealed)
    name: str  # the run it becomes
    drop_tombstones: bool
    future: concurrent.futures.Future[dict[str, Any]]
    #: resolves once the run is installed under its name (a snapshot's upload waits for it)
    installed: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)


class LSMStore(Store):
    """An LSM tree: dict memtable + WAL, sorted runs with Bloom filters and fence pointers."""

    engine = "lsm"
    PREFIX = "lsm"
    DEFAULT_SYNC = "os"
    OPTIONS = {
        "memtable_bytes": Option(8 << 20, int, _positive, "an int >= 1 (bytes)"),
        "max_runs_per_level": Option(4, int, lambda v: v >= 2, "an int >= 2"),
        "density_factor": Option(32, int, _positive, "an int >= 1 (records per fence pointer)"),
        "block_bytes": Option(4096, int, _positive, "an int >= 1 (bytes)"),
        "bloom_fpr": Option(0.01, float, lambda v: 0.0 < v < 1.0, "a float in (0, 1)"),
        "cache_bytes": Option(32 << 20, int, lambda v: v >= 0, "an int >= 0 (bytes)"),
    }

    # ------------------------------------------------------------------ open

    def _init_state(self) -> None:
        o = self.options
        self._mem_limit: int = o["memtable_bytes"]
        self._wal_limit: int = _WAL_FACTOR * o["memtable_bytes"]
        self._max_runs: int = o["max_runs_per_level"]
        self._run_opts = {
            "density_factor": o["density_factor"],
            "block_bytes": o["block_bytes"],
            "bloom_fpr": o["bloom_fpr"],
            "fsync": self.sync == "fsync",
        }
        self._cache_limit: int = o["cache_bytes"]
        self._mem: dict[bytes, bytes | None] = {}
        self._mem_bytes = 0
        self._levels: list[list[RunReader]] = []
        self._runs: tuple[RunReader, ...] = ()  # newest first, across levels
        self._wals: list[str] = []  # oldest first; the last is active when _wal_fd is set
        self._wal_fd: int | None = None
        self._spare_wal: tuple[str, int] | None = None  # (name, descriptor): the next WAL, in the version
        self._fds_to_close: list[int] = []  # sealed WALs' descriptors, closed by the maintainer
        self._wal_bytes = 0
        self._imms: tuple[_Imm, ...] = ()  # oldest first; replaced whole (lock-free readers)
        self._cache: OrderedDict[int, dict[bytes, bytes | None]] = OrderedDict()
        self._cache_sizes: dict[int, int] = {}
        self._cache_used = 0
        self._misses = 0
        self._merge: tuple[concurrent.futures.Future[dict[str, Any]], int, list[RunReader], str] | None = None
        self._flushes = 0
        self._merges_done = 0
        self._merge_errors = 0
        self._fsync = self.sync == "fsync"
        # The plain FileSystem's write is os.write plus a short-write loop; calling
        # os.write directly on the put path saves a call and a memoryview. Any other
        # FileSystem (FaultyFS) keeps seeing every write.
        self._raw_write = type(self.fs) is FileSystem

    def _open(self) -> None:
        self._init_state()
        version = self._load_version()
        for e in version.of_kind("run"):
            while len(self._levels) <= e.level:
                self._levels.append([])
            self._levels[e.level].append(RunReader(self.fs, self._path(e.name), e.name, e.level))
        self._rebuild_runs()
        wal_names = [e.name for e in version.of_kind("wal")]
        kept: list[str] = []
        empty: list[str] = []
        # the WAL that was active at a crash may end torn: the newest non-empty one (an
        # empty spare may follow it)
        sizes = [self.fs.size(self._path(n)) for n in wal_names]
        last = max((i for i, n in enumerate(sizes) if n), default=-1)
        for i, name in enumerate(wal_names):
            size, _n = replay(self.fs, self._path(name), self._mem, truncate_torn=i == last)
            (kept if size else empty).append(name)
        self._mem_bytes = sum(len(k) + (len(v) if v else 0) + _ENTRY_OVERHEAD for k, v in self._mem.items())
        self._wals = kept
        added = self._switch_wal() if self.sync != "none" else []
        if added or empty:
            self._edit(added, empty)
        log.debug(
            "opened lsm store",
            extra={"store": self.directory, "runs": len(self._runs), "wals": len(kept), "memtable_keys": len(self._mem)},
        )
        # Starting a background process takes 0.1-0.5 s: have the pools start theirs now
        # (on their own threads), so the first flush or merge does not wait for it.
        background.warm_up("flush")
        background.warm_up("merge")
        with self._lock:
            self._kick()

    # ------------------------------------------------------------------ files

    def _switch_wal(self) -> list[FileEntry]:
        """(lock held) Seal the active WAL and make another one active: the spare — a
        pointer swap, no syscall, already in the version — or else a new file, whose entry
        is returned for the caller's edit. The maintainer closes the old descriptor and
        makes the next spare, so a snapshot's freeze never waits for the file system."""
        old_fd = self._wal_fd
        spare, self._spare_wal = self._spare_wal, None
        added: list[FileEntry] = []
        if spare is not None:
            name, self._wal_fd = spare
        else:
            name = f"lsm-{self._next_seq():010d}.wal"
            self._wal_fd = self.fs.open_new(self._path(name))
            added.append(FileEntry(name, "wal"))
        self._wals.append(name)
        self._wal_bytes = 0
        if old_fd is not None:
            self._fds_to_close.append(old_fd)
        self._post_once(self._maintain_wals)
        return added

    def _maintain_wals(self) -> None:
        """(maintainer) Close sealed WALs' descriptors (each may take milliseconds) and
        make the next spare WAL."""
        with self._lock:
            fds, self._fds_to_close = self._fds_to_close, []
        for fd in fds:
            if self._fsync:
                self.fs.fsync(fd)
            self.fs.close(fd)
        with self._lock:
            if self._closed or self._spare_wal is not None or self._wal_fd is None:
                return
            seq = self._next_seq()
        name = f"lsm-{seq:010d}.wal"
        fd = self.fs.open_new(self._path(name))  # the syscall, without the lock
        with self._lock:
            # replay order is seq order: a spare older than the active WAL (a new file was
            # made meanwhile) would replay before it — drop it
            if self._closed or self._spare_wal is not None or self._wal_fd is None or seq < seq_of(self._wals[-1]):
                self.fs.close(fd)
                self.fs.remove(self._path(name))
                return
            self._spare_wal = (name, fd)
            self._edit([FileEntry(name, "wal")])

    def _drop_spare(self) -> list[str]:
        """(lock held) Close the spare WAL; its name, for the caller's edit to remove."""
        spare, self._spare_wal = self._spare_wal, None
        if spare is None:
            return []
        self.fs.close(spare[1])
        return [spare[0]]

    def _rebuild_runs(self) -> None:
        while self._levels and not self._levels[-1]:
            self._levels.pop()
        self._runs = tuple(r for lv in self._levels for r in reversed(lv))

    def _all_wals(self) -> list[str]:
        return [w for imm in self._imms for w in imm.wals] + self._wals

    def _sealed_wals(self) -> list[str]:
        own = self._wals[:-1] if self._wal_fd is not None else self._wals
        return [w for imm in self._imms for w in imm.wals] + own

    # ------------------------------------------------------------------ operations

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        if self._closed:
            self._check_open()
        if type(key) is not bytes or not key or len(key) > MAX_KEY_BYTES:
            key = check_key(key)
        v = self._mem.get(key, _MISS)
        if v is not _MISS:
            return default if v is None else v  # type: ignore[return-value]
        imms = self._imms
        if imms:
            for imm in reversed(imms):
                v = imm.mem.get(key, _MISS)
                if v is not _MISS:
                    return default if v is None else v  # type: ignore[return-value]
        if not self._runs:
            return default
        h1, h2 = _hash64(key)
        with self._lock:
            for run in self._runs:
                bloom = run.bloom
                m = bloom.m
                bits = bloom.bits
                p = h1 % m
                if not bits[p]:
                    continue
                d = h2 % m
                for _ in bloom.probes:
                    p += d
                    if p >= m:
                        p -= m
                    if not bits[p]:
                        break
                else:
                    index = run.index
                    if key > index.last_key:
                        continue
                    i = bisect_right(index.fences, key) - 1
                    if i < 0:
                        continue
                    cid = run.uid + i
                    block = self._cache.get(cid)
                    if block is None:
                        v = self._miss(run, i, cid, key)
                    else:
                        self._cache.move_to_end(cid)
                        v = block.get(key, _MISS)
                    if v is not _MISS:
                        return default if v is None else v  # type: ignore[return-value]
        return default

    def _miss(self, run: RunReader, i: int, cid: int, key: bytes) -> bytes | None | object:
        """Look ``key`` up in block ``i`` of ``run``, which is not cached.

        Decoding a block for the cache costs several lookups' worth, so only every
        ``_ADMIT_EVERY``-th miss admits its block; the others search the raw block. A
        working set that fits in the cache still ends up cached; one that does not
        no longer pays a decode on every miss.
        """
        self._misses += 1
        offs = run.index.offsets
        a = offs[i]
        if self._misses % _ADMIT_EVERY == 0 and 2 * (offs[i + 1] - a) <= self._cache_limit // 4:
            return self._load_block(run, i, cid).get(key, _MISS)
        v = block_get(run.mm[a : offs[i + 1]], key, run.path, a)
        return _MISS if v is ABSENT else v

    def _load_block(self, run: RunReader, i: int, cid: int) -> dict[bytes, bytes | None]:
        """Read, verify and decode block ``i`` of ``run``; keep it in the LRU cache."""
        offs = run.index.offsets
        a = offs[i]
        raw = run.mm[a : offs[i + 1]]
        keys, values = decode_block(raw, run.path, a)
        block = dict(zip(keys, values, strict=False))
        size = len(raw) + _CACHED_RECORD_OVERHEAD * len(keys)
        if size <= self._cache_limit // 4:
            cache = self._cache
            sizes = self._cache_sizes
            cache[cid] = block
            sizes[cid] = size
            self._cache_used += size
            while self._cache_used > self._cache_limit:
                old, _ = cache.popitem(last=False)
                self._cache_used -= sizes.pop(old)
        return block

    def _drop_cached(self, runs: Iterable[RunReader]) -> None:
        dead = {r.uid >> 32 for r in runs}
        for cid in [c for c in self._cache if c >> 32 in dead]:
            del self._cache[cid]
            self._cache_used -= self._cache_sizes.pop(cid)

    def put(self, key: bytes, value: bytes) -> None:
        if self._closed:
            self._check_open()
        if (
            type(key) is not bytes
            or type(value) is not bytes
            or not key
            or len(key) > MAX_KEY_BYTES
            or len(value) > MAX_VALUE_BYTES
        ):
            key = check_key(key)
            value = check_value(value, key)
        with self._lock:
            fd = self._wal_fd
            if fd is not None:
                # records.encode(key, value), inlined (the same bytes; see test_lsm_wal)
                body = _BODY.pack(len(key), len(value), 0) + key + value
                rec = _CRC.pack(_crc(body)) + body
                if self._raw_write:
                    n = os.write(fd, rec)
                    if n != len(rec):
                        self.fs.write(fd, rec[n:])
                else:
                    self.fs.write(fd, rec)
                if self._fsync:
                    self.fs.fsync(fd)
                self._wal_bytes += len(rec)
            mem = self._mem
            n = len(mem)
            mem[key] = value
            if len(mem) != n:
                self._mem_bytes += len(key) + len(value) + _ENTRY_OVERHEAD
                if self._mem_bytes >= self._mem_limit:
                    self._rotate_locked()
            elif self._wal_bytes >= self._wal_limit:
                self._rotate_locked()

    def delete(self, key: bytes) -> None:
        if self._closed:
            self._check_open()
        key = check_key(key)
        self._apply([(key, None)], _encode(key, None))

    def write_batch(self, ops: Iterable[tuple[bytes, bytes | None]]) -> None:
        self._check_open()
        checked = check_ops(ops)
        if checked:
            self._apply(checked, records.encode_batch(checked))

    def _apply(self, ops: list[tuple[bytes, bytes | None]], rec: bytes) -> None:
        with self._lock:
            fd = self._wal_fd
            if fd is not None:
                self.fs.write(fd, rec)
                if self._fsync:
                    self.fs.fsync(fd)
                self._wal_bytes += len(rec)
            mem = self._mem
            for k, v in ops:
                if k not in mem:
                    self._mem_bytes += len(k) + _ENTRY_OVERHEAD
                mem[k] = v
                if v is not None:
                    self._mem_bytes += len(v)
            if self._mem_bytes >= self._mem_limit or self._wal_bytes >= self._wal_limit:
                self._rotate_locked()

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair once, in key order, as of this call (a lazy merge)."""
        self._check_open()
        with self._lock:
            mem = self._mem
            mkeys = sorted(mem)
            mvals = [mem[k] for k in mkeys]
            imms = [sorted(imm.mem.items()) for imm in reversed(self._imms)]
            runs = self._runs
        sources: list[Iterator[tuple[bytes, int, bytes | None]]] = [zip(mkeys, repeat(0), mvals)]
        for i, pairs in enumerate(imms):
            sources.append(zip([k for k, _ in pairs], repeat(i + 1), [v for _, v in pairs], strict=False))
        sources += [r.tagged(len(imms) + i + 1) for i, r in enumerate(runs)]
        return merge_sorted(sources, drop_tombstones=True)  # type: ignore[return-value]

    def flush(self) -> None:
        """Write the memtable to a level-0 run (and fsync it with ``sync="fsync"``)."""
        self._check_open()
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        """Write the memtable to a level-0 run now (after every pending background flush,
        waited for without holding the lock)."""
        self._drain_imms()
        mem = self._mem
        if not mem and not self._sealed_wals():
            return
        added: list[FileEntry] = []
        if mem:
            keys = sorted(mem)
            values = list(map(mem.__getitem__, keys))
            if not self._runs:  # nothing older to shadow: tombstones can go
                pairs = [(k, v) for k, v in zip(keys, values, strict=False) if v is not None]
                keys = [k for k, _ in pairs]
                values = [v for _, v in pairs]
            if keys:
                name = f"lsm-L0-{self._next_seq():010d}.run"
                path = self._path(name)
                write_run(self.fs, path + ".tmp", keys, values, **self._run_opts)
                self.fs.rename(path + ".tmp", path)
                if not self._levels:
                    self._levels.append([])
                self._levels[0].append(RunReader(self.fs, path, name, 0))
                self._rebuild_runs()
                added.append(FileEntry(name, "run", 0))
        old_wals = self._wals
        self._wals = []
        if self._wal_fd is not None:
            added += self._switch_wal()
        self._edit(added, old_wals)
        self._mem = {}  # after the runs are published: lock-free readers see one or the other
        self._mem_bytes = 0
        self._flushes += 1
        self._kick()

    def _rotate_locked(self) -> None:
        """Hand the full memtable to the background flush lane and start a fresh one."""
        if len(self._imms) >= _MAX_IMMS:  # flushes fall behind: stall this writer
            self._wait(lambda: len(self._imms) < _MAX_IMMS or self._closed)
            self._check_open()
        if not self._mem:
            return
        mem = self._mem
        name = f"lsm-L0-{self._next_seq():010d}.run"
        drop = not self._runs and not self._imms
        o = self._run_opts
        try:
            fut = background.submit(
                merge_mod.flush_memtable, self._bg_fs, self._path(name) + ".tmp", mem, drop,
                o["density_factor"], o["block_bytes"], o["bloom_fpr"], o["fsync"],
                lane="flush", local=self._local_background,
            )
        except (BackgroundBusy, RuntimeError, OSError) as exc:
            log.warning("no background flush (%s); flushing in the foreground", exc)
            self._flush_locked()
            return
        wals = self._wals
        self._wals = []
        added = self._switch_wal() if self._wal_fd is not None else []
        self._imms = (*self._imms, _Imm(mem, self._mem_bytes, wals, name, drop, fut))
        self._mem = {}  # after the imm is published: lock-free readers see one or the other
        self._mem_bytes = 0
        if added:
            self._edit(added)
        fut.add_done_callback(self._on_done(self._install_flushes))

    def _install_flushes(self, _fut: object = None) -> None:
        """(maintainer) Install finished flushes, oldest first."""
        with self._lock:
            while self._imms and self._imms[0].future.done() and not self._closed:
                self._install_imm(self._imms[0])
            self._notify()

    def _drain_imms(self) -> None:
        """(lock held) Wait, releasing the lock, until every background flush is installed."""
        if self._imms:
            self._wait(lambda: not self._imms or self._closed)

    def _install_imm(self, imm: _Imm) -> None:
        """Put a flushed memtable's run into level 0 (lock held; ``imm`` is the oldest)."""
        try:
            self._install_imm_run(imm)
        except BaseException as exc:
            imm.installed.set_exception(exc)
            raise
        imm.installed.set_result(None)

    def _install_imm_run(self, imm: _Imm) -> None:
        path = self._path(imm.name)
        try:
            result = imm.future.result()
        except Exception as exc:  # e.g. the background process died: flush here instead
            log.warning("background flush of %s failed (%s); flushing in the foreground", imm.name, exc)
            self.fs.remove(path + ".tmp")
            keys = sorted(imm.mem)
            values = list(map(imm.mem.__getitem__, keys))
            if imm.drop_tombstones:
                keep = [i for i, v in enumerate(values) if v is not None]
                keys = [keys[i] for i in keep]
                values = [values[i] for i in keep]
            result = {"count": len(keys)}
            if keys:
                write_run(self.fs, path + ".tmp", keys, values, **self._run_opts)
        added: list[FileEntry] = []
        if result["count"]:
            self.fs.rename(path + ".tmp", path)
            if not self._levels:
                self._levels.append([])
            self._levels[0].append(RunReader(self.fs, path, imm.name, 0))
            self._rebuild_runs()
            added.append(FileEntry(imm.name, "run", 0))
        self._imms = self._imms[1:]  # after the run is published
        self._edit(added, imm.wals)
        self._flushes += 1
        self._kick()

    # ------------------------------------------------------------------ merges

    def _idle(self) -> bool:
        return not self._imms and self._merge is None

    def _kick(self) -> None:
        """Start merging the shallowest full level, unless a merge runs or merges are paused."""
        if self._merge is not None or self._paused or self._closed:
            return
        for i, level in enumerate(self._levels):
            if len(level) >= self._max_runs:
                inputs = list(level)
                target = i + 1
                drop = not any(self._levels[target:])
                name = f"lsm-L{target}-{self._next_seq():010d}.run"
                try:
                    fut = background.submit(
                        merge_mod.merge_runs,
                        self._bg_fs,
                        [r.path for r in reversed(inputs)],
                        self._path(name) + ".tmp",
                        drop,
                        self._run_opts["density_factor"],
                        self._run_opts["block_bytes"],
                        self._run_opts["bloom_fpr"],
                        self._run_opts["fsync"],
                        lane="merge",
                        local=self._local_background,
                    )
                except BackgroundBusy as exc:
                    log.debug("merge of %s postponed: %s", self.directory, exc)
                    return
                self._merge = (fut, i, inputs, name)
                fut.add_done_callback(self._on_done(self._finish_merge))
                return

    def _finish_merge(self, fut: concurrent.futures.Future[dict[str, Any]]) -> None:
        """(maintainer) Install a finished merge: one edit adds the output, removes the inputs."""
        with self._lock:
            try:
                self._install_merge(fut)
            finally:
                self._notify()

    def _install_merge(self, fut: concurrent.futures.Future[dict[str, Any]]) -> None:
        m = self._merge
        if m is None or m[0] is not fut:
            return
        self._merge = None
        _fut, level, inputs, name = m
        path = self._path(name)
        try:
            result = fut.result()
        except Exception as exc:
            self._merge_errors += 1
            log.error("merge into %s failed: %s", name, exc, extra={"store": self.directory})
            self.fs.remove(path + ".tmp")
            return
        if self._closed:
            self.fs.remove(path + ".tmp")
            return
        added: list[FileEntry] = []
        if result["count"]:
            self.fs.rename(path + ".tmp", path)
            reader = RunReader(self.fs, path, name, level + 1)
            while len(self._levels) <= level + 1:
                self._levels.append([])
            self._levels[level + 1].append(reader)
            added.append(FileEntry(name, "run", level + 1))
        gone = {id(r) for r in inputs}
        self._levels[level] = [r for r in self._levels[level] if id(r) not in gone]
        self._rebuild_runs()
        self._edit(added, [r.name for r in inputs])
        self._drop_cached(inputs)
        self._merges_done += 1
        log.debug(
            "merge installed",
            extra={"store": self.directory, "level": level + 1, "run": name, "inputs": result.get("inputs")},
        )
        self._kick()

    # ------------------------------------------------------------------ snapshots

    def _freeze(self) -> Frozen:
        if self._wal_fd is None:
            # no WAL to seal: the memtable is handed to the background flush as a full one
            # is, and the snapshot names the runs being written (its upload waits for them)
            # — the freeze itself writes nothing
            if self._mem:
                self._rotate_locked()
            # a memtable of deletes only, with nothing older to shadow, becomes no run
            imms = [i for i in self._imms if not (i.drop_tombstones and all(v is None for v in i.mem.values()))]
            return self._frozen_version(extra=[FileEntry(i.name, "run", 0) for i in imms], pending=[i.installed for i in imms])
        if self._wal_bytes:
            added = self._switch_wal()  # seal: the old WAL is immutable from now on
            if added:
                self._edit(added)
        active = self._wals[-1:] if self._wal_fd is not None else []
        spare = [self._spare_wal[0]] if self._spare_wal is not None else []
        return self._frozen_version(skip=active + spare)

    def _install(self, entries: list[FileEntry], replaced: frozenset[str] = frozenset()) -> None:
        runs = sorted((e for e in entries if e.kind == "run"), key=lambda e: (-e.level, e.seq))
        wal_names = sorted((e.name for e in entries if e.kind == "wal"), key=lambda n: n)
        if len(runs) + len(wal_names) != len(entries):
            raise CorruptionError(self.directory, f"an lsm snapshot holds only runs and WALs, got {[e.kind for e in entries]}")
        if self._wal_fd is not None:
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        self._drop_spare()
        mem: dict[bytes, bytes | None] = {}
        for name in wal_names:
            replay(self.fs, self._path(name), mem, truncate_torn=False)
        # a run file never changes under its name: a reader already open (the state being
        # replaced shares most runs with a recent snapshot) is reused, not re-read
        have = {r.name: r for level in self._levels for r in level}
        levels: list[list[RunReader]] = []
        for e in runs:
            while len(levels) <= e.level:
                levels.append([])
            r = have.get(e.name)
            if r is None or r.level != e.level or e.name in replaced:
                r = RunReader(self.fs, self._path(e.name), e.name, e.level)
            levels[e.level].append(r)
        self._levels = levels
        self._rebuild_runs()
        self._wals = list(wal_names)
        new = list(entries)
        if self.sync != "none":
            new += self._switch_wal()
        self._reset_version(new)
        self._mem = mem
        self._mem_bytes = sum(len(k) + (len(v) if v else 0) + _ENTRY_OVERHEAD for k, v in mem.items())
        self._cache.clear()
        self._cache_sizes.clear()
        self._cache_used = 0

    # ------------------------------------------------------------------ lifecycle

    def _close(self) -> None:
        if self._mem:
            self._flush_locked()  # reopen then reads only indexes, never replays a WAL
        if self._wal_fd is not None:
            if self._fsync:
                self.fs.fsync(self._wal_fd)
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        spare = self._drop_spare()
        if spare:
            self._edit((), spare)
        self._cache.clear()
        self._cache_sizes.clear()
        self._runs = ()
        self._levels = []

    def _abandon(self) -> None:
        spare = getattr(self, "_spare_wal", None)
        if spare is not None:
            try:
                self.fs.close(spare[1])
            except OSError:
                pass  # the open failed already; that error is the one that matters
            self._spare_wal = None
        for fd in self._fds_to_close if hasattr(self, "_fds_to_close") else ():
            try:
                self.fs.close(fd)
            except OSError:
                pass
        super()._abandon()

    def _stats(self) -> dict[str, Any]:
        runs_mem = sum(r.memory_bytes for r in self._runs)
        return {
            "entries_upper_bound": len(self._mem) + sum(len(i.mem) for i in self._imms) + sum(r.count for r in self._runs),
            "memtable_keys": len(self._mem),
            "memtable_bytes": self._mem_bytes,
            "flushes_pending": len(self._imms),
            "memory_bytes": self._mem_bytes + sum(i.nbytes for i in self._imms) + runs_mem + self._cache_used,
            "index_bytes": runs_mem,
            "cache_bytes": self._cache_used,
            "cached_blocks": len(self._cache),
            "runs_per_level": [len(lv) for lv in self._levels],
            "files_per_level": {f"L{i}": [r.name for r in lv] for i, lv in enumerate(self._levels)},
            "run_bytes": sum(r.size for r in self._runs),
            "wals": self._all_wals(),
            "files": self._version.names(),
            "wal_bytes": self._wal_bytes,
            "flushes": self._flushes,
            "merges_done": self._merges_done,
            "merges_running": int(self._merge is not None),
            "merge_errors": self._merge_errors,
        }
