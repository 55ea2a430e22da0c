"""``lsm``: a log-structured merge tree with tiered merges.

Writes go to a dict memtable (and, unless ``sync="none"``, to a write-ahead log). When the
memtable reaches ``memtable_bytes`` it becomes *immutable* (still read by lookups, its WALs
still live) and a one-process flush pool sorts it and writes it as a level-0 *run*: an
immutable file of checksummed blocks with its fence pointers and Bloom filter embedded
(:mod:`.runfile`); the store installs runs in memtable order. When a level holds
``max_runs_per_level`` runs they are merged, in the shared background process pool
(:mod:`statestores.background`), into one run of the next level; the store installs the
result atomically (``CURRENT``) and keeps serving reads and writes meanwhile. Writers
wait only if ``state.MAX_IMMS`` memtables are already waiting for their flush.

The store holds its parts: the WALs (:class:`~.wals.Wals`), the block cache
(:class:`~.cache.BlockCache`) and the merge in flight (:class:`~.merges.Merges`); the
lookups past the memtables are :mod:`.reads`' functions.

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
from collections.abc import Iterable, Iterator
from itertools import takewhile
from typing import Any

from crc32c import crc32c as _crc

from .. import background, records
from ..base import MAX_KEY_BYTES, Frozen, Option, Store, check_key, check_ops, check_put
from ..errors import BackgroundBusy, CorruptionError, StoreError
from ..fs import FileSystem
from ..version import FileEntry
from . import merge as merge_mod
from . import reads, writes
from .cache import MISS, BlockCache
from .merges import Merges
from .runfile import RunReader
from .state import ENTRY_OVERHEAD, MAX_IMMS, WAL_FACTOR, Imm, levels_of
from .wal import Replayed, read_sealed, replay, replay_all, weight
from .wals import Wals

__all__ = ["LSMStore"]

log = logging.getLogger("statestores.lsm")

_encode = records.encode
_BODY = writes.WAL_BODY
_CRC = writes.WAL_CRC


def _positive(v: int) -> bool:
    return v >= 1


class LSMStore(Store):
    """An LSM tree: dict memtable + WAL, sorted runs with Bloom filters and fence pointers."""

    engine = "lsm"
    PREFIX = "lsm"
    DEFAULT_SYNC = "os"
    NEW_FILES_AT_OPEN = True  # (its open starts a new WAL; runs are never written again)
    OPTIONS = {
        "memtable_bytes": Option(8 << 20, int, _positive, "an int >= 1 (bytes)"),
        "max_runs_per_level": Option(4, int, lambda v: v >= 2, "an int >= 2"),
        "density_factor": Option(32, int, _positive, "an int >= 1 (records per fence pointer)"),
        "block_bytes": Option(4096, int, _positive, "an int >= 1 (bytes)"),
        "bloom_fpr": Option(0.01, float, lambda v: 0.0 < v < 1.0, "a float in (0, 1)"),
        "cache_bytes": Option(32 << 20, int, lambda v: v >= 0, "an int >= 0 (bytes)"),
    }

    # ------------------------------------------------------------------ state

    def _init_state(self) -> None:
        o = self.options
        self._fsync = self.sync == "fsync"
        self._mem_limit: int = o["memtable_bytes"]
        self._wal_limit: int = WAL_FACTOR * o["memtable_bytes"]
        self._max_runs: int = o["max_runs_per_level"]
        self._run_opts = {
            "density_factor": o["density_factor"],
            "block_bytes": o["block_bytes"],
            "bloom_fpr": o["bloom_fpr"],
            "fsync": self._fsync,
        }
        self._mem: dict[bytes, bytes | None] = {}
        self._mem_bytes = 0
        self._imms: tuple[Imm, ...] = ()  # oldest first; replaced whole (lock-free readers)
        self._levels: list[list[RunReader]] = []
        self._runs: tuple[RunReader, ...] = ()  # newest first, across levels
        self._wal = Wals(self.fs, self.files, self.tasks, fsync=self._fsync)
        self._cache = BlockCache(o["cache_bytes"])
        self._merges = Merges(self.fs, self.files, self.tasks, self._run_opts, self)
        self._flushes = 0
        # The plain FileSystem's write is os.write plus a short-write loop; calling
        # os.write directly on the put path saves a call and a memoryview. Any other
        # FileSystem (FaultyFS) keeps seeing every write.
        self._raw_write = type(self.fs) is FileSystem

    def _rebuild_runs(self) -> None:
        while self._levels and not self._levels[-1]:
            self._levels.pop()
        self._runs = tuple(r for lv in self._levels for r in reversed(lv))

    def _all_wals(self) -> list[str]:
        return [w for imm in self._imms for w in imm.wals] + self._wal.names

    def _sealed_wals(self) -> list[str]:
        return [w for imm in self._imms for w in imm.wals] + self._wal.sealed()

    # ------------------------------------------------------------------ open

    @classmethod
    def preopen(cls, fs: FileSystem, path: str, entry: FileEntry) -> RunReader | Replayed | None:
        """A run's footer, fence index and Bloom filter, read and checked ahead; a sealed
        WAL's records (what the memtable replays)."""
        if entry.kind == "run":
            return RunReader(fs, path, entry.name, entry.level)
        if entry.kind != "wal":
            return None
        wal = read_sealed(fs, path)
        wal.nbytes = weight(wal.records)
        return wal

    def _open(self) -> None:
        self._init_state()
        version = self.files.load()
        for e in version.of_kind("run"):
            while len(self._levels) <= e.level:
                self._levels.append([])
            run = self._opened.pop(e.name, None)
            path = self.files.path(e.name)
            if run is not None and run.level == e.level and run.size == self.fs.size(path):
                run.path = path  # (a promoted replica may have moved)
            else:
                run = RunReader(self.fs, path, e.name, e.level)
            self._levels[e.level].append(run)
        self._rebuild_runs()
        kept, empty, self._mem_bytes = replay_all(
            self.fs, self.files.path, [e.name for e in version.of_kind("wal")], self._opened,
            self._mem,
        )
        self._wal.names = kept
        added = self._switch_wal() if self.sync != "none" else []
        if added or empty:
            self._edit(added, empty)
        log.debug(
            "opened lsm store",
            extra={
                "store": self.directory, "runs": len(self._runs), "wals": len(kept),
                "memtable_keys": len(self._mem),
            },
        )
        # Starting a background process takes 0.1-0.5 s: have the pools start theirs now
        # (on their own threads), so the first flush or merge does not wait for it.
        background.warm_up("flush")
        background.warm_up("merge")
        with self._lock:
            self._kick()

    # ------------------------------------------------------------------ reads

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        if self._closed:
            self.check_open()
        if type(key) is not bytes or not key or len(key) > MAX_KEY_BYTES:
            key = check_key(key)
        v = self._mem.get(key, MISS)
        if v is not MISS:
            return default if v is None else v  # type: ignore[return-value]
        imms = self._imms
        if imms:
            for imm in reversed(imms):
                v = imm.mem.get(key, MISS)
                if v is not MISS:
                    return default if v is None else v  # type: ignore[return-value]
        if not self._runs:
            return default
        with self._lock:
            return reads.get_in_runs(self._runs, self._cache, key, default)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live pair once, in key order, as of this call (a lazy merge)."""
        return self._merged(b"")

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Each run read from the block that can hold the prefix, up to the first key
        past it."""
        return takewhile(lambda kv: kv[0].startswith(prefix), self._merged(prefix))

    def _merged(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The live pairs from key ``start`` on, in key order, as of this call."""
        self.check_open()
        with self._lock:
            imms = [imm.mem for imm in reversed(self._imms)]
            memtables = reads.sorted_memtables(self._mem, imms, start)
            runs = self._runs
        return reads.merged(memtables, runs, start)

    # ------------------------------------------------------------------ writes

    def put(self, key: bytes, value: bytes) -> None:
        if self._closed:
            self.check_open()
        key, value = check_put(key, value)
        with self._lock:
            wal = self._wal
            fd = wal.fd
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
                wal.bytes += len(rec)
            mem = self._mem
            n = len(mem)
            mem[key] = value
            if len(mem) != n:
                self._mem_bytes += len(key) + len(value) + ENTRY_OVERHEAD
                if self._mem_bytes >= self._mem_limit:
                    self._rotate_locked()
            elif wal.bytes >= self._wal_limit:
                self._rotate_locked()

    def delete(self, key: bytes) -> None:
        if self._closed:
            self.check_open()
        key = check_key(key)
        self._apply([(key, None)], _encode(key, None))

    def write_batch(self, ops: Iterable[tuple[bytes, bytes | None]]) -> None:
        self.check_open()
        checked = check_ops(ops)
        if checked:
            self._apply(checked, records.encode_batch(checked))

    def _apply(self, ops: list[tuple[bytes, bytes | None]], rec: bytes) -> None:
        with self._lock:
            wal = self._wal
            fd = wal.fd
            if fd is not None:
                self.fs.write(fd, rec)
                if self._fsync:
                    self.fs.fsync(fd)
                wal.bytes += len(rec)
            mem = self._mem
            for k, v in ops:
                if k not in mem:
                    self._mem_bytes += len(k) + ENTRY_OVERHEAD
                mem[k] = v
                if v is not None:
                    self._mem_bytes += len(v)
            if self._mem_bytes >= self._mem_limit or wal.bytes >= self._wal_limit:
                self._rotate_locked()

    # ------------------------------------------------------------------ WAL files

    def _switch_wal(self) -> list[FileEntry]:
        """(lock held) Seal the active WAL, make another active (:meth:`Wals.switch`); the
        maintainer closes the old one and makes the next spare."""
        added = self._wal.switch()
        self.tasks.post_once(self._maintain_wals)
        return added

    def _maintain_wals(self) -> None:
        """(maintainer) Close sealed WALs' descriptors (each may take milliseconds) and
        make the next spare WAL."""
        self._wal.close_sealed()
        with self._lock:
            if self._closed or not self._wal.spare_wanted():
                return
            seq = self.files.next_seq()
        spare = self._wal.open_spare(seq)  # the syscall, without the lock
        with self._lock:
            if self._wal.adopt_spare(spare, seq, closed=self._closed):
                self._edit([FileEntry(spare[0], "wal")])

    # ------------------------------------------------------------------ flushes

    def flush(self) -> None:
        """Write the memtable to a level-0 run (and fsync it with ``sync="fsync"``)."""
        self.check_open()
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
            name = f"lsm-L0-{self.files.next_seq():010d}.run"
            path = self.files.path(name)
            # nothing older to shadow: tombstones can go
            if writes.write_memtable(self.fs, path + ".tmp", mem, not self._runs, self._run_opts):
                self.fs.rename(path + ".tmp", path)
                self._add_level0(RunReader(self.fs, path, name, 0))
                added.append(FileEntry(name, "run", 0))
        old_wals = self._wal.retire()
        if self._wal.fd is not None:
            added += self._switch_wal()
        self._edit(added, old_wals)
        self._mem = {}  # after the runs are published: lock-free readers see one or the other
        self._mem_bytes = 0
        self._flushes += 1
        self._kick()

    def _add_level0(self, run: RunReader) -> None:
        if not self._levels:
            self._levels.append([])
        self._levels[0].append(run)
        self._rebuild_runs()

    def _rotate_locked(self) -> None:
        """Hand the full memtable to the background flush lane and start a fresh one."""
        if len(self._imms) >= MAX_IMMS:  # flushes fall behind: stall this writer
            self.tasks.wait(lambda: len(self._imms) < MAX_IMMS or self._closed)
            self.check_open()
        if not self._mem:
            return
        mem = self._mem
        name = f"lsm-L0-{self.files.next_seq():010d}.run"
        drop = not self._runs and not self._imms
        o = self._run_opts
        try:
            fut = background.submit(
                merge_mod.flush_memtable, self._bg_fs, self.files.path(name) + ".tmp", mem, drop,
                o["density_factor"], o["block_bytes"], o["bloom_fpr"], o["fsync"],
                lane="flush", local=self.local_background,
            )
        except (BackgroundBusy, RuntimeError, OSError) as exc:
            log.warning("no background flush (%s); flushing in the foreground", exc)
            self._flush_locked()
            return
        wals = self._wal.retire()
        added = self._switch_wal() if self._wal.fd is not None else []
        self._imms = (*self._imms, Imm(mem, self._mem_bytes, wals, name, drop, fut))
        self._mem = {}  # after the imm is published: lock-free readers see one or the other
        self._mem_bytes = 0
        if added:
            self._edit(added)
        fut.add_done_callback(self.tasks.on_done(self._install_flushes))

    def _install_flushes(self, _fut: object = None) -> None:
        """(maintainer) Install finished flushes, oldest first."""
        with self._lock:
            while self._imms and self._imms[0].future.done() and not self._closed:
                self._install_imm(self._imms[0])
            self.tasks.notify()

    def _drain_imms(self) -> None:
        """(lock held) Wait, releasing the lock, until every background flush is installed."""
        if self._imms:
            self.tasks.wait(lambda: not self._imms or self._closed)

    def _install_imm(self, imm: Imm) -> None:
        """Put a flushed memtable's run into level 0 (lock held; ``imm`` is the oldest)."""
        try:
            self._install_imm_run(imm)
        except BaseException as exc:
            imm.installed.set_exception(exc)
            raise
        imm.installed.set_result(None)

    def _install_imm_run(self, imm: Imm) -> None:
        path = self.files.path(imm.name)
        try:
            count = imm.future.result()["count"]
        except Exception as exc:  # e.g. the background process died: flush here instead
            log.warning(
                "background flush of %s failed (%s); flushing in the foreground", imm.name, exc
            )
            self.fs.remove(path + ".tmp")
            count = writes.write_memtable(
                self.fs, path + ".tmp", imm.mem, imm.drop_tombstones, self._run_opts
            )
        added: list[FileEntry] = []
        if count:
            self.fs.rename(path + ".tmp", path)
            self._add_level0(RunReader(self.fs, path, imm.name, 0))
            added.append(FileEntry(imm.name, "run", 0))
        self._imms = self._imms[1:]  # after the run is published
        self._edit(added, imm.wals)
        self._flushes += 1
        self._kick()

    # ------------------------------------------------------------------ snapshots

    def _freeze(self) -> Frozen:
        if self._wal.fd is None:
            # no WAL to seal: the memtable is handed to the background flush as a full one
            # is, and the snapshot names the runs being written (its upload waits for them)
            # — the freeze itself writes nothing
            if self._mem:
                self._rotate_locked()
            # a memtable of deletes only, with nothing older to shadow, becomes no run
            imms = [
                i
                for i in self._imms
                if not (i.drop_tombstones and all(v is None for v in i.mem.values()))
            ]
            return self.files.frozen(
                extra=[FileEntry(i.name, "run", 0) for i in imms],
                pending=[i.installed for i in imms],
            )
        if self._wal.bytes:
            added = self._switch_wal()  # seal: the old WAL is immutable from now on
            if added:
                self._edit(added)
        return self.files.frozen(skip=self._wal.unsealed())

    # ------------------------------------------------------------------ merges

    def _idle(self) -> bool:
        return not self._imms and self._merges.job is None

    def _kick(self) -> None:
        """Start merging the shallowest full level, unless a merge runs or merges are paused."""
        if self._merges.job is not None or self._paused or self._closed:
            return
        for i, level in enumerate(self._levels):
            if len(level) >= self._max_runs:
                self._start_merge(list(level), i + 1, drop=not any(self._levels[i + 1 :]))
                return

    def _start_merge(self, inputs: list[RunReader], target: int, *, drop: bool) -> bool:
        """(lock held, no merge running) :meth:`Merges.start` for this store."""
        return self._merges.start(
            inputs, target, drop=drop, horizon=self._horizon, bg_fs=self._bg_fs,
            local=self.local_background,
        )

    def _compact(self) -> None:
        """(lock held) One merge cycle: the memtable flushed, then every run merged into
        one at the deepest level (at least 1), nothing older left: tombstones and expired
        values vanish. Waits (releasing the lock) for a running merge, then for this one."""
        self._flush_locked()
        self._paused += 1  # no level merge starts in between
        try:
            self.tasks.wait(lambda: self._merges.job is None or self._closed)
            self.check_open()
            inputs = [r for lv in reversed(self._levels) for r in lv]  # oldest first
            if not inputs:
                return
            target = max(1, len(self._levels) - 1)
            while not self._start_merge(inputs, target, drop=True):
                self.tasks.cond.wait(0.05)  # the merge lane is full: try again shortly
                self.check_open()
            m = self._merges.job
            assert m is not None
            self.tasks.wait(lambda: self._merges.job is not m or self._closed)
            self.check_open()
            exc = m.future.exception()
            if exc is not None:
                raise StoreError(f"compaction of {self.directory} failed: {exc}") from exc
        finally:
            self._paused -= 1
            if not self._paused and not self._closed:
                self._kick()

    def merge_ended(self, fut: concurrent.futures.Future[dict[str, Any]]) -> None:
        """(maintainer thread; ``MergesHost``) Install a finished merge: one edit adds the
        output, removes the inputs."""
        with self._lock:
            try:
                self._install_merge(fut)
            finally:
                self.tasks.notify()

    def _abandon_merge(self) -> None:
        """(lock held) A restore replaces the runs: :meth:`Merges.abandon`."""
        self._merges.abandon()

    def _install_merge(self, fut: concurrent.futures.Future[dict[str, Any]]) -> None:
        taken = self._merges.take(fut, closed=self._closed)
        if taken is None:
            return
        (_fut, target, inputs, name), result = taken
        path = self.files.path(name)
        added: list[FileEntry] = []
        if result["count"]:
            self.fs.rename(path + ".tmp", path)
            reader = RunReader(self.fs, path, name, target)
            while len(self._levels) <= target:
                self._levels.append([])
            self._levels[target].append(reader)
            added.append(FileEntry(name, "run", target))
        gone = {id(r) for r in inputs}
        self._levels = [[r for r in lv if id(r) not in gone] for lv in self._levels]
        self._rebuild_runs()
        self._edit(added, [r.name for r in inputs])
        self._cache.drop(inputs)
        self._merges.done += 1
        log.debug(
            "merge installed",
            extra={
                "store": self.directory, "level": target, "run": name,
                "inputs": result.get("inputs"),
            },
        )
        self._kick()

    # ------------------------------------------------------------------ restores

    def _install(self, entries: list[FileEntry], replaced: frozenset[str] = frozenset()) -> None:
        runs = sorted((e for e in entries if e.kind == "run"), key=lambda e: (-e.level, e.seq))
        wal_names = sorted((e.name for e in entries if e.kind == "wal"), key=lambda n: n)
        if len(runs) + len(wal_names) != len(entries):
            raise CorruptionError(
                self.directory,
                f"an lsm snapshot holds only runs and WALs, got {[e.kind for e in entries]}",
            )
        self._wal.close(sync=False)
        self._wal.drop_spare()
        mem: dict[bytes, bytes | None] = {}
        for name in wal_names:
            replay(self.fs, self.files.path(name), mem, truncate_torn=False)
        # a run file never changes under its name: a reader already open (the state being
        # replaced shares most runs with a recent snapshot) is reused, not re-read
        have = {r.name: r for level in self._levels for r in level if r.name not in replaced}
        self._levels = levels_of(runs, have, lambda e: RunReader(
            self.fs, self.files.path(e.name), e.name, e.level))
        self._rebuild_runs()
        self._wal.names = list(wal_names)
        new = list(entries)
        if self.sync != "none":
            new += self._switch_wal()
        self._reset_version(new)
        self._mem = mem
        self._mem_bytes = weight(mem)
        self._cache.clear()

    # ------------------------------------------------------------------ lifecycle

    def _close(self) -> None:
        if self._mem:
            self._flush_locked()  # reopen then reads only indexes, never replays a WAL
        self._wal.close(sync=self._fsync)
        spare = self._wal.drop_spare()
        if spare:
            self._edit((), spare)
        self._cache.clear()
        self._runs = ()
        self._levels = []

    def _abandon(self) -> None:
        wal: Wals | None = getattr(self, "_wal", None)  # None: the open failed before it
        if wal is not None:
            wal.abandon()

    def _stats(self) -> dict[str, Any]:
        runs_mem = sum(r.memory_bytes for r in self._runs)
        return {
            "entries_upper_bound": len(self._mem)
            + sum(len(i.mem) for i in self._imms)
            + sum(r.count for r in self._runs),
            "memtable_keys": len(self._mem),
            "memtable_bytes": self._mem_bytes,
            "flushes_pending": len(self._imms),
            "memory_bytes": self._mem_bytes
            + sum(i.nbytes for i in self._imms)
            + runs_mem
            + self._cache.used,
            "index_bytes": runs_mem,
            "cache_bytes": self._cache.used,
            "cached_blocks": len(self._cache),
            "runs_per_level": [len(lv) for lv in self._levels],
            "files_per_level": {f"L{i}": [r.name for r in lv] for i, lv in enumerate(self._levels)},
            "run_bytes": sum(r.size for r in self._runs),
            "wals": self._all_wals(),
            "files": self.files.version.names(),
            "wal_bytes": self._wal.bytes,
            "flushes": self._flushes,
            "merges_done": self._merges.done,
            "merges_running": int(self._merges.job is not None),
            "merge_errors": self._merges.errors,
            "expired_dropped": self._merges.expired_dropped,
        }
