"""Log segments: one log file of ``records``, its logical addresses, and writing one.

A *logical address* is ``seq << 36 | offset``: ``seq`` is the sequence number in the
segment file's name, so a hint file can store ready-made addresses and reopening is one
``dict.update`` (``FORMAT.md`` § "hint files").
"""

from __future__ import annotations

import array
import concurrent.futures
import os
import struct
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

# the C function itself, not the checksum.crc32c wrapper: one Python frame less per get/put
from crc32c import crc32c

from .. import hints, records
from ..errors import CorruptionError
from ..fs import FileSystem
from ..hints import OFFSET_BITS
from ..version import seq_of

__all__ = ["Segment", "write_records", "hint_name", "scan_segment", "hint_scanned"]

_HEADER = records.HEADER
_BODY_PACK = struct.Struct("<IIB").pack
_CRC_PACK = struct.Struct("<I").pack
_HEADER_SIZE = records.HEADER_SIZE
_WRITE_CHUNK = 1 << 20


def hint_name(log_name: str) -> str:
    """The hint file of segment ``log_name`` (``x.log`` → ``x.hint``)."""
    return log_name[:-4] + ".hint"


class Segment:
    """One log file. Sealed segments are immutable and fully mapped; the active
    AppendLog segment grows, and its mapping covers a prefix (``mapped`` bytes)."""

    __slots__ = ("name", "seq", "level", "path", "mm", "mapped", "size", "sealed",
                 "fd", "rfd", "flushed", "wbuf", "hint_future", "hint_ready")

    def __init__(self, name: str, level: int, path: str) -> None:
        self.name = name
        self.seq = seq_of(name)
        self.level = level
        self.path = path
        self.mm: Any = None  # mmap.mmap | None
        self.mapped = 0  # bytes [0, mapped) readable through mm
        self.size = 0
        self.sealed = True
        self.fd: int | None = None  # append descriptor (active segment only)
        self.rfd: int | None = None  # read descriptor (active segment only)
        self.flushed = 0  # bytes handed to the OS (active segment only)
        self.wbuf = bytearray()  # bytes not yet handed to the OS (sync="none")
        #: Sealed but its hint is still being written (by the maintainer): resolves when durable.
        self.hint_future: concurrent.futures.Future[None] | None = None
        #: False from the seal until its hint is durable and in the version.
        self.hint_ready = True

    @property
    def hinted(self) -> bool:
        """Sealed with its hint durable (only such segments are merged)."""
        return self.sealed and self.hint_ready

    @property
    def base(self) -> int:
        """Logical address of this segment's first byte."""
        return self.seq << OFFSET_BITS

    def map(self, fs: FileSystem, fd: int) -> None:
        """(Re)map the file behind ``fd``; publishes ``mm`` before ``mapped`` for lock-free
        readers."""
        mm = fs.mmap(fd)
        self.mm = mm
        self.mapped = len(mm) if mm is not None else 0

    def seal(self, fs: FileSystem) -> None:
        """Turn the active segment into a sealed one: close its descriptors, map it whole.

        The old mapping is not closed (a lock-free reader may still hold it); it is freed
        with its last reference.
        """
        fds = [fd for fd in (self.fd, self.rfd) if fd is not None]
        self.fd = None
        try:
            if self.rfd is not None:
                self.map(fs, self.rfd)
        finally:
            self.rfd = None
            for fd in fds:
                fs.close(fd)
        self.size = self.mapped
        self.flushed = self.size
        self.sealed = True

    def open_sealed(self, fs: FileSystem) -> None:
        fd = fs.open_read(self.path)
        try:
            self.map(fs, fd)
        finally:
            fs.close(fd)
        self.size = self.mapped
        self.sealed = True

    def close(self, fs: FileSystem) -> None:
        """Release descriptors and the mapping (the segment is unusable afterwards)."""
        for fd in (self.fd, self.rfd):
            if fd is not None:
                try:
                    fs.close(fd)
                except OSError:
                    pass
        self.fd = self.rfd = None
        mm, self.mm, self.mapped = self.mm, None, 0
        if mm is not None:
            try:
                mm.close()
            except (BufferError, ValueError):
                pass  # a reader still holds it; it is freed with the last reference

    def read(self, fs: FileSystem, offset: int) -> tuple[bytes, bytes | None]:
        """``(key, value_or_None)`` of the record at ``offset``; CorruptionError if bad."""
        if offset < self.mapped:
            key, value, _f, _end = records.decode_at(self.mm, offset, self.path)
            return key, value
        if self.sealed:
            raise CorruptionError(
                self.path, f"record offset {offset} is past the end of the file ({self.size} bytes)"
            )
        if offset >= self.flushed:
            key, value, _f, _end = records.decode_at(
                memoryview(self.wbuf), offset - self.flushed, self.path
            )
            return key, value
        if self.flushed - self.mapped >= _REMAP_BYTES and self.rfd is not None:
            self.map(fs, self.rfd)
            return self.read(fs, offset)
        assert self.rfd is not None
        head = fs.pread(self.rfd, _HEADER_SIZE, offset)
        if len(head) < _HEADER_SIZE:
            raise CorruptionError(self.path, f"truncated record header at offset {offset}")
        _crc, klen, vlen, _flags = _HEADER.unpack(head)
        rec = fs.pread(self.rfd, _HEADER_SIZE + klen + vlen, offset)
        key, value, _f, _end = records.decode_at(rec, 0, self.path)
        return key, value


#: The active segment is remapped once this many written bytes lie beyond its mapping;
#: smaller tails are read with pread.
_REMAP_BYTES = 1 << 20


def write_records(
    fs: FileSystem, fd: int, seq: int, items: Iterable[tuple[bytes, bytes | None]]
) -> tuple[int, list[bytes], array.array[int], list[bytes]]:
    """Write one record per ``(key, value_or_None)`` (keys unique) to the new file ``fd``.

    Returns ``(size, live_keys, live_addresses, tombstone_keys)`` for the hint.
    """
    keys: list[bytes] = []
    addrs = array.array("Q")
    tombs: list[bytes] = []
    buf = bytearray()
    pos = 0
    base = seq << OFFSET_BITS
    encode = records.encode
    body_pack = _BODY_PACK
    crc_pack = _CRC_PACK
    add_key = keys.append
    add_addr = addrs.append
    for k, v in items:
        if v is None:
            tombs.append(k)
            buf += encode(k, None)
        else:
            add_key(k)
            add_addr(base + pos + len(buf))
            # records.encode, inlined: this loop runs once per record of every flush
            body = body_pack(len(k), len(v), 0) + k + v
            buf += crc_pack(crc32c(body))
            buf += body
        if len(buf) >= _WRITE_CHUNK:
            fs.write(fd, buf)
            pos += len(buf)
            buf = bytearray()
    if buf:
        fs.write(fd, buf)
        pos += len(buf)
    return pos, keys, addrs, tombs




def scan_segment(
    fs: FileSystem, path: str, seq: int, *, truncate_torn: bool
) -> tuple[int, dict[bytes, int], set[bytes]]:
    """Replay a segment's records: ``(valid size, live key → address, deleted keys)``.

    A torn tail (a record cut short, a batch without its ``COMMIT``) is truncated away
    with ``truncate_torn``; otherwise it is corruption.
    """
    buf = fs.read_file(path)
    res = records.ScanResult(0, False)
    base = seq << OFFSET_BITS
    alive: dict[bytes, int] = {}
    tombs: set[bytes] = set()
    for off, key, value in records.scan(buf, path, res):
        if value is None:
            alive.pop(key, None)
            tombs.add(key)
        else:
            alive[key] = base + off
            tombs.discard(key)
    if res.torn:
        if not truncate_torn:
            raise CorruptionError(
                path, f"torn record at offset {res.valid_end} of a sealed segment"
            )
        fs.truncate(path, res.valid_end)
    return res.valid_end, alive, tombs


_first = itemgetter(0)


def write_segment(
    fs: FileSystem | None, directory: str, name: str, seq: int,
    items: list[tuple[bytes, bytes | None]], fsync: bool,
) -> tuple[int, list[bytes], array.array[int], list[bytes]]:
    """Write ``items`` (unique keys, any order) in key order as the new sealed segment
    ``name`` of ``directory`` plus its hint (hint keys must be sorted, see ``PendingIndex``);
    returns the segment's size, live keys, their addresses and the tombstones.

    Runs in the ``flush`` background process (``fs`` None: the real file system) or, with
    a test's ``FaultyFS``, on the caller's thread. The segment is written as ``<name>.tmp``
    and renamed after its hint, so a crash leaves no segment without one.
    """
    fs = fs if fs is not None else FileSystem()
    path = os.path.join(directory, name)
    fd = fs.open_new(path + ".tmp")
    try:
        size, keys, addrs, tombs = write_records(fs, fd, seq, sorted(items, key=_first))
        if fsync:
            fs.fsync(fd)
    finally:
        fs.close(fd)
    write_hint(fs, directory, name, seq, size, keys, addrs, tombs, fsync)
    fs.rename(path + ".tmp", path)
    return size, keys, addrs, tombs


def write_hint(
    fs: FileSystem, directory: str, name: str, seq: int, size: int, keys: list[bytes], addrs: Any,
    tombs: list[bytes], fsync: bool,
) -> None:
    """The hint of segment ``name`` (``size`` bytes; ``keys`` sorted), written atomically."""
    fs.write_file_atomic(
        os.path.join(directory, hint_name(name)), hints.encode(seq, size, keys, addrs, tombs),
        sync=fsync,
    )


def hint_scanned(
    fs: FileSystem, directory: str, name: str, seq: int, *, truncate_torn: bool, fsync: bool,
    skip_empty: bool = False,
) -> int:
    """Scan segment ``name`` and write its hint; its valid size (``skip_empty``: an empty
    one gets no hint)."""
    size, alive, tombs = scan_segment(
        fs, os.path.join(directory, name), seq, truncate_torn=truncate_torn
    )
    if size or not skip_empty:
        keys = sorted(alive)
        addrs = array.array("Q", map(alive.__getitem__, keys))
        write_hint(fs, directory, name, seq, size, keys, addrs, sorted(tombs), fsync)
    return size
