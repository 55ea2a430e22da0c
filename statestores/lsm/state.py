"""The bounds of an ``lsm`` store's memory (see :mod:`statestores.lsm.engine`),
:class:`Imm`, a memtable being flushed in the background, and the levels of runs a
version names (:func:`levels_of`).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..version import FileEntry
from .runfile import RunReader

__all__ = ["Imm", "ENTRY_OVERHEAD", "MAX_IMMS", "WAL_FACTOR", "levels_of"]

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


def levels_of(
    runs: Iterable[FileEntry],
    have: dict[str, RunReader],
    open_run: Callable[[FileEntry], RunReader],
) -> list[list[RunReader]]:
    """The levels of ``runs`` (oldest first per level), reusing the readers in ``have``
    (by name, at the same level), opening the others with ``open_run``."""
    levels: list[list[RunReader]] = []
    for e in runs:
        while len(levels) <= e.level:
            levels.append([])
        r = have.get(e.name)
        if r is None or r.level != e.level:
            r = open_run(e)
        levels[e.level].append(r)
    return levels
