"""The write-ahead log: the memtable's writes as log records (``statestores.records``).

A WAL is a plain sequence of records (``FORMAT.md`` § "Log records"); a ``write_batch`` is
one ``encode_batch`` group, all-or-nothing. The engine appends to one *active* WAL; a
snapshot *seals* it (starts a new one) so the sealed file is immutable and can be
uploaded as is. A flush of the memtable retires every WAL.
"""

from __future__ import annotations

from ..errors import CorruptionError
from ..fs import FileSystem
from ..records import ScanResult, scan

__all__ = ["replay", "Replayed", "read_sealed"]


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
