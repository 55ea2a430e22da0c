"""Fence pointers: the first key and file offset of every data block of a run.

Encoded as the run file's index block (``FORMAT.md`` § lsm, "Index block")::

    nblocks:u32 | offsets[nblocks + 1]:u64 | fence_klen[nblocks]:u32 | fence keys |
    last_klen:u32 | last key | crc32c:u32

``offsets[i]`` is where block ``i`` starts; ``offsets[nblocks]`` is where the index starts
(the end of the last block). The crc covers every byte before it.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from itertools import accumulate

from ..checksum import crc32c
from ..errors import CorruptionError

__all__ = ["FenceIndex", "encode_index", "decode_index"]

_U32 = struct.Struct("<I")


class FenceIndex:
    """Block offsets and fence keys of one run, held in memory while the run is open."""

    __slots__ = ("offsets", "fences", "last_key")

    def __init__(self, offsets: list[int], fences: list[bytes], last_key: bytes) -> None:
        self.offsets = offsets
        self.fences = fences
        self.last_key = last_key

    def find(self, key: bytes) -> int:
        """The block that holds ``key`` if any block does, else ``-1``."""
        if key > self.last_key:
            return -1
        return bisect_right(self.fences, key) - 1

    @property
    def nbytes(self) -> int:
        """Approximate memory held (keys plus list slots and int objects)."""
        return sum(len(f) + 41 for f in self.fences) + 40 * len(self.offsets) + len(self.last_key)


def encode_index(offsets: list[int], fences: list[bytes], last_key: bytes) -> bytes:
    """The index block for ``len(fences)`` blocks (``offsets`` has one more entry)."""
    n = len(fences)
    if len(offsets) != n + 1:
        raise ValueError(f"index needs {n + 1} offsets for {n} blocks, got {len(offsets)}")
    body = b"".join(
        (
            struct.pack(f"<I{n + 1}Q{n}I", n, *offsets, *map(len, fences)),
            *fences,
            _U32.pack(len(last_key)),
            last_key,
        )
    )
    return body + _U32.pack(crc32c(body))


def decode_index(buf: bytes, path: str) -> FenceIndex:
    """Parse an index block; :class:`CorruptionError` naming ``path`` if it is damaged."""
    if len(buf) < 12 or crc32c(memoryview(buf)[:-4]) != _U32.unpack_from(buf, len(buf) - 4)[0]:
        raise CorruptionError(path, "run index block checksum mismatch")
    try:
        (n,) = _U32.unpack_from(buf, 0)
        offsets = list(struct.unpack_from(f"<{n + 1}Q", buf, 4))
        pos = 4 + 8 * (n + 1)
        klens = struct.unpack_from(f"<{n}I", buf, pos)
        pos += 4 * n
        ends = list(accumulate(klens, initial=pos))
        fences = [buf[a:b] for a, b in zip(ends, ends[1:], strict=False)]
        pos = ends[-1]
        (lk,) = _U32.unpack_from(buf, pos)
        last_key = buf[pos + 4 : pos + 4 + lk]
        if pos + 4 + lk != len(buf) - 4:
            raise CorruptionError(path, "run index block has trailing bytes")
    except struct.error as exc:
        raise CorruptionError(path, f"run index block is malformed: {exc}") from None
    return FenceIndex(offsets, fences, last_key)
