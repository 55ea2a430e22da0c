"""Run files: immutable sorted runs with embedded fence pointers and Bloom filter.

Layout (``FORMAT.md`` § lsm, "Run file")::

    data block 0 | … | data block B-1 | index block | bloom block | footer (72 bytes)

A data block holds up to ``density_factor`` records (fewer once it reaches
``block_bytes``)::

    n:u32 | klen[n]:u32 | vlen[n]:u32 | keys | values | crc32c:u32

``vlen = 0xFFFFFFFF`` marks a tombstone (no value bytes). Keys are strictly ascending
within a run. The index block is :mod:`.fence`'s; the bloom block is the filter's bytes
followed by their crc32c; the footer names where both are and carries its own crc.

Opening a run reads only the footer, index and Bloom filter; data blocks stay on disk
(mapped read-only) and are read one at a time.
"""

from __future__ import annotations

import itertools
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from itertools import accumulate, repeat
from typing import Any

import mmh3

from ..checksum import crc32c
from ..errors import CorruptionError
from ..fs import FileSystem
from .bloom import MAX_PROBES, Bloom, probes_for
from .fence import FenceIndex, decode_index, encode_index

__all__ = [
    "ABSENT",
    "block_get",
    "TOMBSTONE_LEN",
    "FOOTER",
    "encode_block",
    "decode_block",
    "RunWriter",
    "RunReader",
    "write_run",
]

TOMBSTONE_LEN = 0xFFFFFFFF
MAGIC = b"SFLR"
VERSION = 1
#: magic, version, flags, count, tombstones, index_off, index_len, bloom_off, bloom_len,
#: bloom_m, bloom_k, crc32c (over the footer's first 68 bytes)
FOOTER = struct.Struct("<4sHHQQQQQQQII")
_U32 = struct.Struct("<I")
_WRITE_CHUNK = 1 << 20
_hash64 = mmh3.hash64
_uids = itertools.count(1)


def encode_block(keys: list[bytes], values: list[bytes | None]) -> bytes:
    """One data block of ``keys`` (ascending) and their values (``None`` = tombstone)."""
    n = len(keys)
    vlens = [TOMBSTONE_LEN if v is None else len(v) for v in values]
    if TOMBSTONE_LEN in vlens:
        vbytes = b"".join([v for v in values if v is not None])
    else:
        vbytes = b"".join(values)  # type: ignore[arg-type]
    body = b"".join((struct.pack(f"<{2 * n + 1}I", n, *map(len, keys), *vlens), *keys, vbytes))
    return body + _U32.pack(crc32c(body))


def decode_block(raw: bytes, path: str, offset: int) -> tuple[list[bytes], list[bytes | None]]:
    """``(keys, values)`` of a data block; :class:`CorruptionError` if it is damaged."""
    if len(raw) < 8 or crc32c(memoryview(raw)[:-4]) != _U32.unpack_from(raw, len(raw) - 4)[0]:
        raise CorruptionError(path, f"data block at offset {offset} checksum mismatch")
    try:
        (n,) = _U32.unpack_from(raw, 0)
        lens = struct.unpack_from(f"<{2 * n}I", raw, 4)
    except struct.error:
        raise CorruptionError(path, f"data block at offset {offset} is malformed") from None
    klens = lens[:n]
    vlens = lens[n:]
    kstart = 4 + 8 * n
    kl = klens[0] if n else 0
    if n and klens.count(kl) == n:  # fixed-size keys (common): no offset table needed
        kend = kstart + kl * n
        keys = [raw[p : p + kl] for p in range(kstart, kend, kl)]
    else:
        kends = list(accumulate(klens, initial=kstart))
        keys = [raw[a:b] for a, b in zip(kends, kends[1:], strict=False)]
        kend = kends[-1]
    vl = vlens[0] if n else 0
    values: list[bytes | None]
    if n and vl != TOMBSTONE_LEN and vlens.count(vl) == n:
        end = kend + vl * n
        values = [raw[p : p + vl] for p in range(kend, end, vl)] if vl else [b""] * n
    elif TOMBSTONE_LEN in vlens:
        vends = list(accumulate((0 if v == TOMBSTONE_LEN else v for v in vlens), initial=kend))
        values = [
            None if vl == TOMBSTONE_LEN else raw[a:b]
            for a, b, vl in zip(vends, vends[1:], vlens, strict=False)
        ]
        end = vends[-1]
    else:
        vends = list(accumulate(vlens, initial=kend))
        values = [raw[a:b] for a, b in zip(vends, vends[1:], strict=False)]
        end = vends[-1]
    if end != len(raw) - 4:
        raise CorruptionError(path, f"data block at offset {offset} lengths do not match its size")
    return keys, values


#: What :func:`block_get` returns for a key the block does not hold.
ABSENT = object()


def block_get(raw: bytes, key: bytes, path: str, offset: int) -> bytes | None | object:
    """The value of ``key`` in a data block without decoding the block.

    Returns the value, ``None`` for a tombstone, or :data:`ABSENT`. With fixed-size keys
    (the common case) the key is found by one ``bytes.find`` over the key area;
    otherwise the block is decoded. Verifies the block's crc like :func:`decode_block`.
    """
    if len(raw) < 8 or crc32c(memoryview(raw)[:-4]) != _U32.unpack_from(raw, len(raw) - 4)[0]:
        raise CorruptionError(path, f"data block at offset {offset} checksum mismatch")
    try:
        (n,) = _U32.unpack_from(raw, 0)
        lens = struct.unpack_from(f"<{2 * n}I", raw, 4)
    except struct.error:
        raise CorruptionError(path, f"data block at offset {offset} is malformed") from None
    kl = len(key)
    klens = lens[:n]
    if klens.count(kl) != n:
        if kl not in klens:
            return ABSENT
        keys, values = decode_block(raw, path, offset)
        i = bisect_left(keys, key)
        return values[i] if i < n and keys[i] == key else ABSENT
    kstart = 4 + 8 * n
    kend = kstart + kl * n
    pos = raw.find(key, kstart, kend)
    while pos >= 0 and (pos - kstart) % kl:
        pos = raw.find(key, pos + 1, kend)
    if pos < 0:
        return ABSENT
    i = (pos - kstart) // kl
    vlens = lens[n:]
    vl = vlens[i]
    if vl == TOMBSTONE_LEN:
        return None
    if vlens.count(vl) == n:
        start = kend + i * vl
    else:
        start = kend + sum(v for v in vlens[:i] if v != TOMBSTONE_LEN)
    end = start + vl
    if end > len(raw) - 4:
        raise CorruptionError(path, f"data block at offset {offset} lengths do not match its size")
    return raw[start:end]


class RunWriter:
    """Streams sorted records into a new run file at ``path`` (normally a ``.tmp``)."""

    def __init__(
        self,
        fs: FileSystem,
        path: str,
        *,
        density_factor: int,
        block_bytes: int,
        bloom_fpr: float,
        fsync: bool = False,
    ) -> None:
        self.fs = fs
        self.path = path
        self.density_factor = density_factor
        self.block_bytes = block_bytes
        self.bloom_fpr = bloom_fpr
        self.fsync = fsync
        self.count = 0
        self.tombstones = 0
        self._hashes = array("q")
        self._offsets: list[int] = []
        self._fences: list[bytes] = []
        self._last_key = b""
        self._pos = 0
        self._buf = bytearray()
        self._fd: int | None = fs.open_new(path)

    def add_many(self, keys: list[bytes], values: list[bytes | None]) -> None:
        """Append records; ``keys`` ascending and greater than every key added before."""
        n = len(keys)
        if not n:
            return
        if (keys[0] <= self._last_key and self.count) or any(map(bytes.__ge__, keys, keys[1:])):
            raise ValueError(
                f"run keys must ascend strictly ({self.path}): got {keys[:3]!r:.80} after "
                f"{self._last_key!r:.60}"
            )
        d = self.density_factor
        limit = self.block_bytes
        hashes = self._hashes
        hashes.extend([x for k in keys for x in _hash64(k)])
        i = 0
        while i < n:
            j = min(i + d, n)
            ks = keys[i:j]
            vs = values[i:j]
            try:
                size = sum(map(len, ks)) + sum(map(len, vs))  # type: ignore[arg-type]
            except TypeError:  # tombstones (None) in this block
                size = sum(map(len, ks)) + sum(len(v) for v in vs if v is not None)
            if size > limit and j - i > 1:
                acc = 0
                cut = 0
                for k, v in zip(ks, vs, strict=False):
                    acc += len(k) + (0 if v is None else len(v))
                    if acc > limit and cut:
                        break
                    cut += 1
                j = i + cut
                ks = ks[:cut]
                vs = vs[:cut]
            block = encode_block(ks, vs)
            self._offsets.append(self._pos)
            self._fences.append(ks[0])
            self._pos += len(block)
            self._buf += block
            self.tombstones += vs.count(None)
            i = j
        self.count += n
        self._last_key = keys[-1]
        if len(self._buf) >= _WRITE_CHUNK and self._fd is not None:
            self.fs.write(self._fd, self._buf)
            self._buf = bytearray()

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self.fs.close(fd)

    def finish(self) -> dict[str, Any]:
        """Write index, Bloom filter and footer; close. Returns the run's counts."""
        if self._fd is None:
            raise ValueError(f"run writer for {self.path} is already closed")
        fd = self._fd
        try:
            index = encode_index(self._offsets + [self._pos], self._fences, self._last_key)
            bloom = Bloom.build(self._hashes, self.bloom_fpr)
            bbytes = bloom.to_bytes()
            bbytes += _U32.pack(crc32c(bbytes))
            index_off = self._pos
            bloom_off = index_off + len(index)
            head = FOOTER.pack(
                MAGIC, VERSION, 0, self.count, self.tombstones, index_off, len(index),
                bloom_off, len(bbytes), bloom.m, bloom.k, 0,
            )[:-4]
            footer = head + _U32.pack(crc32c(head))
            self._buf += index
            self._buf += bbytes
            self._buf += footer
            self.fs.write(fd, self._buf)
            self._buf = bytearray()
            if self.fsync:
                self.fs.fsync(fd)
        finally:
            self._close()
        return {
            "count": self.count,
            "tombstones": self.tombstones,
            "bytes": bloom_off + len(bbytes) + FOOTER.size,
        }

    def abort(self) -> None:
        """Close without finishing (the caller removes the file). Idempotent."""
        try:
            self._close()
        except OSError:
            pass


def write_run(
    fs: FileSystem,
    path: str,
    keys: list[bytes],
    values: list[bytes | None],
    *,
    density_factor: int,
    block_bytes: int,
    bloom_fpr: float,
    fsync: bool = False,
) -> dict[str, Any]:
    """Write a whole run from sorted ``keys`` and their ``values`` in one go."""
    w = RunWriter(
        fs, path, density_factor=density_factor, block_bytes=block_bytes, bloom_fpr=bloom_fpr,
        fsync=fsync,
    )
    try:
        w.add_many(keys, values)
    except BaseException:
        w.abort()
        raise
    return w.finish()


class RunReader:
    """An open run: footer, fence index and Bloom filter in memory, blocks on disk."""

    __slots__ = (
        "path", "name", "level", "count", "tombstones", "size", "index", "bloom", "mm", "uid",
    )

    def __init__(self, fs: FileSystem, path: str, name: str = "", level: int = 0) -> None:
        self.path = path
        self.name = name
        self.level = level
        fd = fs.open_read(path)
        try:
            mm = fs.mmap(fd)
        finally:
            fs.close(fd)
        if mm is None or len(mm) < FOOTER.size:
            raise CorruptionError(path, "run file too short for its footer")
        self.size = len(mm)
        foot = mm[-FOOTER.size :]
        (
            magic, version, _flags, count, tombs, index_off, index_len, bloom_off, bloom_len, m, k,
            crc,
        ) = FOOTER.unpack(foot)
        if magic != MAGIC or crc32c(foot[:-4]) != crc:
            raise CorruptionError(path, "run footer has a bad magic or checksum")
        if version != VERSION:
            raise CorruptionError(path, f"run file version {version} is not supported")
        if not (
            index_off + index_len == bloom_off and bloom_off + bloom_len == self.size - FOOTER.size
        ):
            raise CorruptionError(path, "run footer offsets do not match the file size")
        self.count = count
        self.tombstones = tombs
        self.index: FenceIndex = decode_index(mm[index_off:bloom_off], path)
        if self.index.offsets[-1] != index_off:
            raise CorruptionError(path, "run index does not end where the footer says")
        braw = mm[bloom_off : bloom_off + bloom_len]
        if (
            len(braw) < 4
            or crc32c(memoryview(braw)[:-4]) != _U32.unpack_from(braw, len(braw) - 4)[0]
        ):
            raise CorruptionError(path, "run bloom filter checksum mismatch")
        if len(braw) - 4 != (m + 7) // 8 or not 1 <= k <= MAX_PROBES:
            raise CorruptionError(
                path, "run bloom filter size or probe count does not match the footer"
            )
        if k != probes_for(m, count):  # another k would make lookups miss keys the run holds
            raise CorruptionError(
                path,
                f"run bloom filter probe count {k} does not match its {m} bits "
                f"over {count} records",
            )
        self.bloom = Bloom.from_bytes(braw[:-4], m, k)
        self.mm = mm
        self.uid = next(_uids) << 32  # block-cache ids are uid + block index

    @property
    def nblocks(self) -> int:
        return len(self.index.fences)

    def read_block(self, i: int) -> tuple[list[bytes], list[bytes | None]]:
        """Keys and values of block ``i`` (verified against its crc)."""
        offs = self.index.offsets
        a = offs[i]
        return decode_block(self.mm[a : offs[i + 1]], self.path, a)

    def block_size(self, i: int) -> int:
        offs = self.index.offsets
        return offs[i + 1] - offs[i]

    def items(self) -> Iterator[tuple[bytes, bytes | None]]:
        """Every record, in key order (tombstones as ``None``)."""
        for i in range(self.nblocks):
            keys, values = self.read_block(i)
            yield from zip(keys, values, strict=False)

    def chunks(self, nblocks: int = 64) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        """Keys and values ``nblocks`` blocks at a time, in key order (for merges)."""
        for start in range(0, self.nblocks, nblocks):
            keys: list[bytes] = []
            values: list[bytes | None] = []
            for i in range(start, min(start + nblocks, self.nblocks)):
                ks, vs = self.read_block(i)
                keys += ks
                values += vs
            yield keys, values

    def tagged(self, tag: int, start: bytes = b"") -> Iterator[tuple[bytes, int, bytes | None]]:
        """Every record as ``(key, tag, value)``, for heap merges where a lower tag wins;
        ``start``: only keys from it on (the blocks before the one that can hold it are
        not read)."""
        first = 0
        if start:
            if start > self.index.last_key:
                return
            first = max(0, bisect_right(self.index.fences, start) - 1)
        for i in range(first, self.nblocks):
            keys, values = self.read_block(i)
            if i == first and start:
                j = bisect_left(keys, start)
                keys, values = keys[j:], values[j:]
            yield from zip(keys, repeat(tag), values)

    @property
    def memory_bytes(self) -> int:
        """Approximate RAM held for this run (index and filter; blocks stay on disk)."""
        return self.index.nbytes + self.bloom.nbytes + 200
