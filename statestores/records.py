"""Log records: the unit of the WAL, AppendLog files and HybridLog files.

See ``FORMAT.md`` § "Log records". One record::

    crc32c:u32  klen:u32  vlen:u32  flags:u8  key[klen]  value[vlen]

little-endian; the crc covers everything after itself. ``flags`` bits:
``TOMBSTONE`` (a delete; ``vlen`` is 0), ``BATCH`` (part of a write batch) and
``COMMIT`` (closes a batch; its value is the member count as u32). Members of a batch
take effect only if their ``COMMIT`` record follows them, which is what makes a
``write_batch`` all-or-nothing across a crash.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .checksum import crc32c
from .errors import CorruptionError

__all__ = [
    "HEADER",
    "TOMBSTONE",
    "BATCH",
    "COMMIT",
    "encode",
    "encode_batch",
    "decode_at",
    "scan",
    "ScanResult",
]

HEADER = struct.Struct("<IIIB")
_BODY_HEADER = struct.Struct("<IIB")
_CRC = struct.Struct("<I")
_COUNT = struct.Struct("<I")
HEADER_SIZE = HEADER.size  # 13

TOMBSTONE = 0x01
BATCH = 0x02
COMMIT = 0x04


def encode(key: bytes, value: bytes | None, flags: int = 0) -> bytes:
    """One record; ``value=None`` encodes a tombstone."""
    if value is None:
        body = _BODY_HEADER.pack(len(key), 0, flags | TOMBSTONE) + key
    else:
        body = _BODY_HEADER.pack(len(key), len(value), flags) + key + value
    return _CRC.pack(crc32c(body)) + body


def encode_batch(ops: Iterable[tuple[bytes, bytes | None]]) -> bytes:
    """A write batch: every op flagged ``BATCH``, then one ``COMMIT`` record."""
    parts = [encode(k, v, BATCH) for k, v in ops]
    parts.append(encode(b"", _COUNT.pack(len(parts)), COMMIT))
    return b"".join(parts)


def decode_at(
    buf: bytes | memoryview, offset: int, path: str
) -> tuple[bytes, bytes | None, int, int]:
    """Decode the record at ``offset``: ``(key, value_or_None, flags, next_offset)``.

    Raises :class:`CorruptionError` naming ``path`` on a bad checksum or a short record.
    """
    end_hdr = offset + HEADER_SIZE
    if end_hdr > len(buf):
        raise CorruptionError(path, f"truncated record header at offset {offset}")
    crc, klen, vlen, flags = HEADER.unpack_from(buf, offset)
    end = end_hdr + klen + vlen
    if end > len(buf):
        raise CorruptionError(path, f"truncated record at offset {offset}")
    if crc32c(buf[offset + 4 : end]) != crc:
        raise CorruptionError(path, f"checksum mismatch in record at offset {offset}")
    key = bytes(buf[end_hdr : end_hdr + klen])
    if flags & TOMBSTONE:
        return key, None, flags, end
    return key, bytes(buf[end_hdr + klen : end]), flags, end


@dataclass
class ScanResult:
    """What :func:`scan` found: the effective records and where valid data ends."""

    valid_end: int
    torn: bool


def scan(
    buf: bytes | memoryview, path: str, result: ScanResult, start: int = 0
) -> Iterator[tuple[int, bytes, bytes | None]]:
    """Yield ``(offset, key, value_or_None)`` for every effective record in ``buf``.

    Batch members are held back until their ``COMMIT`` arrives; an unfinished batch at
    the end is dropped. A bad record that is the last thing in the buffer is a torn tail
    (a crash mid-append): scanning stops there and ``result.torn`` is set, with
    ``result.valid_end`` the offset to truncate to. A bad record followed by more data is
    corruption and raises :class:`CorruptionError`.
    """
    offset = start
    size = len(buf)
    pending: list[tuple[int, bytes, bytes | None]] = []
    committed_end = start
    result.torn = False
    while offset < size:
        try:
            key, value, flags, nxt = decode_at(buf, offset, path)
        except CorruptionError:
            if _is_tail(buf, offset):
                result.torn = True
                break
            raise
        if flags & COMMIT:
            if value is None or len(value) != 4 or _COUNT.unpack(value)[0] != len(pending):
                raise CorruptionError(
                    path, f"batch commit at offset {offset} does not match its members"
                )
            yield from pending
            pending.clear()
            committed_end = nxt
        elif flags & BATCH:
            pending.append((offset, key, value))
        else:
            if pending:
                raise CorruptionError(path, f"unterminated batch before offset {offset}")
            yield offset, key, value
            committed_end = nxt
        offset = nxt
    if pending:
        result.torn = True
    result.valid_end = committed_end


def _is_tail(buf: bytes | memoryview, offset: int) -> bool:
    """Whether a bad record at ``offset`` can be a torn final append.

    It can if its declared extent reaches the end of the buffer (the append was cut
    short), or if it is so mangled that its lengths point past the end.
    """
    if offset + HEADER_SIZE > len(buf):
        return True
    _crc, klen, vlen, _flags = HEADER.unpack_from(buf, offset)
    extent: int = offset + HEADER_SIZE + klen + vlen
    return extent >= len(buf)
