"""The state of an ``lsm`` store (see :mod:`statestores.lsm.engine`): the memtable, the
immutable memtables being flushed, the WALs, the runs per level and the block cache — what
the read path (:mod:`.reads`) and the write path (:mod:`.writes`) share.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

from ..base import Store
from ..fs import FileSystem
from .cache import BlockCache
from .runfile import RunReader

__all__ = ["LSMState", "Imm", "ENTRY_OVERHEAD", "MAX_IMMS", "WAL_FACTOR"]

#: Estimated bytes a memtable entry costs beyond its key and value (two bytes objects
#: and a dict slot); used for ``memtable_bytes`` and ``memory_bytes``.
ENTRY_OVERHEAD = 100
#: A WAL holding this many times ``memtable_bytes`` forces a flush (bounds replay time
#: under overwrite-heavy loads, where the memtable stays small but the log grows).
WAL_FACTOR = 4
#: Immutable memtables that may wait for their background flush before a writer stalls.
MAX_IMMS = 3


@dataclass(eq=False)
class Imm:
    """A full memtable being written to a level-0 run in the background."""

    mem: dict[bytes, bytes | None]
    nbytes: int
    wals: list[str]  # the WALs holding exactly these writes (sealed)
    name: str  # the run it becomes
    drop_tombstones: bool
    future: concurrent.futures.Future[dict[str, Any]]
    #: resolves once the run is installed under its name (a snapshot's upload waits for it)
    installed: concurrent.futures.Future[None] = field(
        default_factory=concurrent.futures.Future
    )


class LSMState(Store):
    """The fields of an ``lsm`` store and the views derived from them."""

    def _init_state(self) -> None:
        o = self.options
        self._mem_limit: int = o["memtable_bytes"]
        self._wal_limit: int = WAL_FACTOR * o["memtable_bytes"]
        self._max_runs: int = o["max_runs_per_level"]
        self._run_opts = {
            "density_factor": o["density_factor"],
            "block_bytes": o["block_bytes"],
            "bloom_fpr": o["bloom_fpr"],
            "fsync": self.sync == "fsync",
        }
        self._mem: dict[bytes, bytes | None] = {}
        self._mem_bytes = 0
        self._levels: list[list[RunReader]] = []
        self._runs: tuple[RunReader, ...] = ()  # newest first, across levels
        self._wals: list[str] = []  # oldest first; the last is active when _wal_fd is set
        self._wal_fd: int | None = None
        #: (name, descriptor): the next WAL, in the version
        self._spare_wal: tuple[str, int] | None = None
        self._fds_to_close: list[int] = []  # sealed WALs' descriptors, closed by the maintainer
        self._wal_bytes = 0
        self._imms: tuple[Imm, ...] = ()  # oldest first; replaced whole (lock-free readers)
        self._cache = BlockCache(o["cache_bytes"])
        self._merge: (
            tuple[concurrent.futures.Future[dict[str, Any]], int, list[RunReader], str] | None
        ) = None
        self._flushes = 0
        self._merges_done = 0
        self._merge_errors = 0
        self._expired_dropped = 0  # values merges found expired (dropped or made tombstones)
        self._fsync = self.sync == "fsync"
        # The plain FileSystem's write is os.write plus a short-write loop; calling
        # os.write directly on the put path saves a call and a memoryview. Any other
        # FileSystem (FaultyFS) keeps seeing every write.
        self._raw_write = type(self.fs) is FileSystem

    def _rebuild_runs(self) -> None:
        while self._levels and not self._levels[-1]:
            self._levels.pop()
        self._runs = tuple(r for lv in self._levels for r in reversed(lv))

    def _all_wals(self) -> list[str]:
        return [w for imm in self._imms for w in imm.wals] + self._wals

    def _sealed_wals(self) -> list[str]:
        own = self._wals[:-1] if self._wal_fd is not None else self._wals
        return [w for imm in self._imms for w in imm.wals] + own
