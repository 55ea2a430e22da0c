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
from typing import Any

from .. import background
from ..base import Option
from ..errors import BackgroundBusy, CorruptionError, StoreError
from ..fs import FileSystem
from ..version import FileEntry
from . import merge as merge_mod
from .reads import LSMReads
from .runfile import RunReader
from .state import ENTRY_OVERHEAD
from .wal import Replayed, read_sealed, replay
from .writes import LSMWrites

__all__ = ["LSMStore"]

log = logging.getLogger("statestores.lsm")


def _positive(v: int) -> bool:
    return v >= 1


def _weight(mem: dict[bytes, bytes | None]) -> int:
    """What ``mem``'s records weigh in the memtable (``LSMState._mem_bytes``)."""
    return sum(len(k) + (len(v) if v else 0) + ENTRY_OVERHEAD for k, v in mem.items())


class LSMStore(LSMReads, LSMWrites):
    """An LSM tree: dict memtable + WAL, sorted runs with Bloom filters and fence pointers.

    Its state is :class:`~.state.LSMState`'s; lookups are :class:`~.reads.LSMReads`',
    writes, flushes and the freeze :class:`~.writes.LSMWrites`'; here are opening, merges,
    restores and closing.
    """

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

    @classmethod
    def preopen(cls, fs: FileSystem, path: str, entry: FileEntry) -> RunReader | Replayed | None:
        """A run's footer, fence index and Bloom filter, read and checked ahead; a sealed
        WAL's records (what the memtable replays)."""
        if entry.kind == "run":
            return RunReader(fs, path, entry.name, entry.level)
        if entry.kind != "wal":
            return None
        wal = read_sealed(fs, path)
        wal.nbytes = _weight(wal.records)
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
        wal_names = [e.name for e in version.of_kind("wal")]
        kept: list[str] = []
        empty: list[str] = []
        # the WAL that was active at a crash may end torn: the newest non-empty one (an
        # empty spare may follow it)
        sizes = [self.fs.size(self.files.path(n)) for n in wal_names]
        last = max((i for i, n in enumerate(sizes) if n), default=-1)
        weights: list[int] | None = []  # of the WALs read ahead, if all were
        for i, name in enumerate(wal_names):
            ahead = self._opened.pop(name, None)
            if isinstance(ahead, Replayed) and ahead.size == sizes[i]:
                self._mem.update(ahead.records)
                size = ahead.size
                if weights is not None:
                    weights.append(ahead.nbytes)
            else:
                path = self.files.path(name)
                size, _n = replay(self.fs, path, self._mem, truncate_torn=i == last)
                weights = None if size else weights
            (kept if size else empty).append(name)
        # (a key in two WALs counts twice in their sum: the memtable flushes no later)
        self._mem_bytes = sum(weights) if weights is not None else _weight(self._mem)
        self._wals = kept
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

    # ------------------------------------------------------------------ merges

    def _idle(self) -> bool:
        return not self._imms and self._merge is None

    def _kick(self) -> None:
        """Start merging the shallowest full level, unless a merge runs or merges are paused."""
        if self._merge is not None or self._paused or self._closed:
            return
        for i, level in enumerate(self._levels):
            if len(level) >= self._max_runs:
                self._start_merge(list(level), i + 1, drop=not any(self._levels[i + 1 :]))
                return

    def _start_merge(self, inputs: list[RunReader], target: int, *, drop: bool) -> bool:
        """(lock held, no merge running) Merge ``inputs`` (oldest first) into one run
        appended to level ``target`` in the background; False if the lane is full.
        ``drop``: nothing older than the inputs exists, so tombstones — and values expired
        at the horizon — vanish instead of shadowing older versions."""
        name = f"lsm-L{target}-{self.files.next_seq():010d}.run"
        try:
            fut = background.submit(
                merge_mod.merge_runs,
                self._bg_fs,
                [r.path for r in reversed(inputs)],
                self.files.path(name) + ".tmp",
                drop,
                self._run_opts["density_factor"],
                self._run_opts["block_bytes"],
                self._run_opts["bloom_fpr"],
                self._run_opts["fsync"],
                self._horizon,
                lane="merge",
                local=self.local_background,
            )
        except BackgroundBusy as exc:
            log.debug("merge of %s postponed: %s", self.directory, exc)
            return False
        self._merge = (fut, target, inputs, name)
        fut.add_done_callback(self.tasks.on_done(self._finish_merge))
        return True

    def _compact(self) -> None:
        """(lock held) One merge cycle: the memtable flushed, then every run merged into
        one at the deepest level (at least 1), nothing older left: tombstones and expired
        values vanish. Waits (releasing the lock) for a running merge, then for this one."""
        self._flush_locked()
        self._paused += 1  # no level merge starts in between
        try:
            self.tasks.wait(lambda: self._merge is None or self._closed)
            self.check_open()
            inputs = [r for lv in reversed(self._levels) for r in lv]  # oldest first
            if not inputs:
                return
            target = max(1, len(self._levels) - 1)
            while not self._start_merge(inputs, target, drop=True):
                self.tasks.cond.wait(0.05)  # the merge lane is full: try again shortly
                self.check_open()
            m = self._merge
            assert m is not None
            self.tasks.wait(lambda: self._merge is not m or self._closed)
            self.check_open()
            exc = m[0].exception()
            if exc is not None:
                raise StoreError(f"compaction of {self.directory} failed: {exc}") from exc
        finally:
            self._paused -= 1
            if not self._paused and not self._closed:
                self._kick()

    def _finish_merge(self, fut: concurrent.futures.Future[dict[str, Any]]) -> None:
        """(maintainer) Install a finished merge: one edit adds the output, removes the inputs."""
        with self._lock:
            try:
                self._install_merge(fut)
            finally:
                self.tasks.notify()

    def _abandon_merge(self) -> None:
        """(lock held) A restore replaces the runs: the merge in flight (at 50M keys it can
        run for tens of seconds) is not waited for. Its inputs stay pinned until it ends;
        then its output is deleted, never installed."""
        m = self._merge
        if m is None:
            return
        self._merge = None
        fut, _target, inputs, name = m
        names = [r.name for r in inputs]
        self.pin_files(names)
        log.info("a restore abandons the merge into %s", name, extra={"store": self.directory})

        def ended(_fut: concurrent.futures.Future[dict[str, Any]]) -> None:
            with self._lock:
                self.fs.remove(self.files.path(name) + ".tmp")
                self.unpin_files(names)

        fut.add_done_callback(self.tasks.on_done(ended))

    def _install_merge(self, fut: concurrent.futures.Future[dict[str, Any]]) -> None:
        m = self._merge
        if m is None or m[0] is not fut:
            return
        self._merge = None
        _fut, target, inputs, name = m
        path = self.files.path(name)
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
            reader = RunReader(self.fs, path, name, target)
            while len(self._levels) <= target:
                self._levels.append([])
            self._levels[target].append(reader)
            added.append(FileEntry(name, "run", target))
        gone = {id(r) for r in inputs}
        self._levels = [[r for r in lv if id(r) not in gone] for lv in self._levels]
        self._rebuild_runs()
        self._expired_dropped += result.get("expired", 0)
        self._edit(added, [r.name for r in inputs])
        self._cache.drop(inputs)
        self._merges_done += 1
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
        if self._wal_fd is not None:
            self.fs.close(self._wal_fd)
            self._wal_fd = None
        self._drop_spare()
        mem: dict[bytes, bytes | None] = {}
        for name in wal_names:
            replay(self.fs, self.files.path(name), mem, truncate_torn=False)
        # a run file never changes under its name: a reader already open (the state being
        # replaced shares most runs with a recent snapshot) is reused, not re-read
        have = {r.name: r for level in self._levels for r in level}
        levels: list[list[RunReader]] = []
        for e in runs:
            while len(levels) <= e.level:
                levels.append([])
            r = have.get(e.name)
            if r is None or r.level != e.level or e.name in replaced:
                r = RunReader(self.fs, self.files.path(e.name), e.name, e.level)
            levels[e.level].append(r)
        self._levels = levels
        self._rebuild_runs()
        self._wals = list(wal_names)
        new = list(entries)
        if self.sync != "none":
            new += self._switch_wal()
        self._reset_version(new)
        self._mem = mem
        self._mem_bytes = sum(
            len(k) + (len(v) if v else 0) + ENTRY_OVERHEAD for k, v in mem.items()
        )
        self._cache.clear()

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
            "wal_bytes": self._wal_bytes,
            "flushes": self._flushes,
            "merges_done": self._merges_done,
            "merges_running": int(self._merge is not None),
            "merge_errors": self._merge_errors,
            "expired_dropped": self._expired_dropped,
        }
