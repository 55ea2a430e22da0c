"""The write-ahead log: the memtable's writes as log records (``statestores.records``).

A WAL is a plain sequence of records (``FORMAT.md`` § "Log records"); a ``write_batch`` is
one ``encode_batch`` group, all-or-nothing. The engine appends to one *active* WAL; a
snapshot *seals* it (starts a new one) so the sealed file is immutable and can be
uploaded as is. A flush of the memtable retires every WAL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import CorruptionError
from ..fs import FileSystem
from ..records import ScanResult, scan
from .state import ENTRY_OVERHEAD

__all__ = ["replay", "replay_all", "Replayed", "read_sealed", "weight"]


def weight(mem: dict[bytes, bytes | None]) -> int:
    """What ``mem``'s records weigh in a memtable (its ``memtable_bytes``)."""
    return sum(len(k) + (len(v) if v else 0) + ENTRY_OVERHEAD for k, v in mem.items())


def replay(
    fs: FileSystem, path: str, into: dict[bytes, bytes | None], *, truncate_torn: bool
) -> tuple[int, int]:
    """Apply the WAL at ``path`` to ``into`` (tombstones as ``None``).

    Returns ``(valid_bytes, records_applied)``. A torn tail (a crash mid-append) is cut
    off when ``truncate_torn`` is true and is a :class:`CorruptionError` otherwise (a
    sealed WAL is never appended to, so it cannot be torn).
    """
    buf = fs.read_file(path)
    res = ScanResult(0, False)
    n = 0
    for _off, key, value in scan(buf, path, res):
        into[key] = value
        n += 1
    if res.torn:
        if not truncate_torn:
            raise CorruptionError(path, f"sealed WAL is incomplete after offset {res.valid_end}")
        fs.truncate(path, res.valid_end)
    return res.valid_end, n


class Replayed:
    """A sealed WAL read ahead (a replica's, :func:`read_sealed`): what :func:`replay`
    would apply, the file size it was read at, and ``nbytes``, what its records weigh in a
    memtable (set by the engine)."""

    __slots__ = ("size", "records", "nbytes")

    def __init__(self, size: int, records: dict[bytes, bytes | None]) -> None:
        self.size = size
        self.records = records
        self.nbytes = 0


def read_sealed(fs: FileSystem, path: str) -> Replayed:
    """The records of the sealed WAL at ``path``, later ones winning (a torn one is a
    :class:`CorruptionError`: a sealed WAL is whole)."""
    records: dict[bytes, bytes | None] = {}
    size, _n = replay(fs, path, records, truncate_torn=False)
    return Replayed(size, records)


def replay_all(
    fs: FileSystem, path_of: Callable[[str], str], names: list[str], opened: dict[str, Any],
    mem: dict[bytes, bytes | None],
) -> tuple[list[str], list[str], int]:
    """(open) Replay the WALs ``names`` (oldest first) into ``mem``, taking those a replica
    read ahead from ``opened``; return the non-empty ones, the empty ones, and what
    ``mem`` weighs. The newest non-empty WAL may end torn (it was active at a crash; an
    empty spare may follow it): it is cut at its last whole record."""
    kept: list[str] = []
    empty: list[str] = []
    sizes = [fs.size(path_of(n)) for n in names]
    last = max((i for i, n in enumerate(sizes) if n), default=-1)
    weights: list[int] | None = []  # of the WALs read ahead, if all were
    for i, name in enumerate(names):
        ahead = opened.pop(name, None)
        if isinstance(ahead, Replayed) and ahead.size == sizes[i]:
            mem.update(ahead.records)
            size = ahead.size
            if weights is not None:
                weights.append(ahead.nbytes)
        else:
            size, _n = replay(fs, path_of(name), mem, truncate_torn=i == last)
            weights = None if size else weights
        (kept if size else empty).append(name)
    # (a key in two WALs counts twice in their sum: the memtable flushes no later)
    return kept, empty, sum(weights) if weights is not None else weight(mem)
