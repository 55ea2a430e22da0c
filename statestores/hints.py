"""Hint files: the compact index of one log segment (AppendLog segments, HybridLog files).

A hint lists, for every key whose *last* record in the segment is a put, the logical
address of that record, and every key whose last record is a delete; both key lists are
sorted, so a key can be found by binary search before the hash index exists. Reopening a store
reads hints only, never the values: the keys are one msgpack array (split into ``bytes``
objects at C speed), the addresses one ``u64`` array (``array.frombytes``), so building
the in-memory index is ``dict.update(zip(keys, addresses))`` with no per-record Python
code. See ``FORMAT.md`` § "hint files"::

    0   4   magic b"SFHI"
    4   1   version (2: key arrays sorted)
    5   3   zero
    8   4   crc32c of bytes [12, end)
    12  8   data_size   size of the segment's log file the hint describes
    20  4   seq         the segment's sequence number (the high bits of every address)
    24  4   n_live
    28  4   n_tomb
    32  8   live_len    bytes of the live-keys array
    40  8   tomb_len    bytes of the tombstone-keys array
    48  …   live keys: msgpack arrays of bin (8192 keys each, the last one shorter), n_live in all
    …   8·n_live  addresses: u64 each, ``seq << 36 | record offset``
    …   …   tombstone keys: msgpack arrays of bin, likewise, n_tomb in all
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from .checksum import crc32c
from .errors import CorruptionError

__all__ = ["Hint", "encode", "decode", "OFFSET_BITS", "OFFSET_MASK", "address"]

#: Low bits of a logical address hold the record's offset in its segment (segments up to 64 GiB).
OFFSET_BITS = 36
OFFSET_MASK = (1 << OFFSET_BITS) - 1

_MAGIC = b"SFHI"
_VERSION = 2  # 2: key arrays sorted
_PREFIX = struct.Struct("<4sB3sI")
_BODY = struct.Struct("<QIIIQQ")
_HEADER_SIZE = _PREFIX.size + _BODY.size  # 48
_SWAP = sys.byteorder != "little"


def address(seq: int, offset: int) -> int:
    """The logical address of the record at ``offset`` in segment ``seq``."""
    return (seq << OFFSET_BITS) | offset


@dataclass
class Hint:
    """The decoded index of one segment."""

    seq: int
    data_size: int
    keys: list[bytes]
    addresses: array.array[int]  # array('Q'), parallel to keys
    tombstones: list[bytes]


def encode(
    seq: int,
    data_size: int,
    keys: Sequence[bytes],
    addresses: Sequence[int] | array.array[int],
    tombstones: Sequence[bytes],
) -> bytes:
    """Encode a hint; ``keys[i]`` lives at ``addresses[i]``. Keys must be unique, and both
    ``keys`` and ``tombstones`` sorted ascending (readers binary-search them)."""
    if len(keys) != len(addresses):
        raise ValueError(f"hint of segment {seq}: {len(keys)} keys but {len(addresses)} addresses")
    live = _pack_keys(keys)
    tomb = _pack_keys(tombstones)
    addrs = addresses if isinstance(addresses, array.array) else array.array("Q", addresses)
    if _SWAP:
        addrs = array.array("Q", addrs)
        addrs.byteswap()
    body = (
        _BODY.pack(data_size, seq, len(keys), len(tombstones), len(live), len(tomb))
        + live
        + addrs.tobytes()
        + tomb
    )
    return _PREFIX.pack(_MAGIC, _VERSION, b"\0\0\0", crc32c(body)) + body


def decode(data: bytes, path: str, *, seq: int | None = None) -> Hint:
    """Decode a hint read from ``path``; :class:`CorruptionError` naming it if malformed.

    With ``seq`` given, the hint must describe that segment.
    """
    if len(data) < _HEADER_SIZE:
        raise CorruptionError(path, f"hint file too short ({len(data)} bytes)")
    magic, version, pad, crc = _PREFIX.unpack_from(data)
    if magic != _MAGIC or pad != b"\0\0\0":
        raise CorruptionError(path, f"not a hint file (magic {magic!r})")
    if version != _VERSION:
        raise CorruptionError(path, f"unsupported hint version {version}")
    view = memoryview(data)
    if crc32c(view[_PREFIX.size :]) != crc:
        raise CorruptionError(path, "hint checksum mismatch")
    data_size, hseq, n_live, n_tomb, live_len, tomb_len = _BODY.unpack_from(data, _PREFIX.size)
    if seq is not None and hseq != seq:
        raise CorruptionError(path, f"hint describes segment {hseq}, expected {seq}")
    pos = _HEADER_SIZE
    end_live = pos + live_len
    end_addr = end_live + 8 * n_live
    if end_addr + tomb_len != len(data):
        raise CorruptionError(path, "hint section lengths do not add up to the file size")
    keys = _unpack_keys(view[pos:end_live], path)
    tombs = _unpack_keys(view[end_addr:], path)
    if len(keys) != n_live or len(tombs) != n_tomb:
        raise CorruptionError(path, "hint key counts do not match its header")
    addrs = array.array("Q")
    addrs.frombytes(view[end_live:end_addr])
    if _SWAP:
        addrs.byteswap()
    return Hint(hseq, data_size, keys, addrs, tombs)


#: Keys per msgpack array. Decoding one array is one C call that holds the GIL; pieces of
#: this size keep a background decode (after a merge) from stalling the serving thread.
_KEYS_PER_ARRAY = 1 << 13


def _pack_keys(keys: Sequence[bytes]) -> bytes:
    """Keys as consecutive msgpack arrays of at most ``_KEYS_PER_ARRAY`` bins (none if empty)."""
    pack = msgpack.Packer(use_bin_type=True).pack
    return b"".join(
        pack(list(keys[i : i + _KEYS_PER_ARRAY])) for i in range(0, len(keys), _KEYS_PER_ARRAY)
    )


def _unpack_keys(blob: memoryview, path: str) -> list[bytes]:
    out: list[bytes] = []
    if not blob:
        return out
    unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=max(len(blob), 1))
    unpacker.feed(blob)
    try:
        for part in unpacker:
            # (set(map(type, ...)) runs at C speed: a hint is decoded in bulk on every reopen)
            if not isinstance(part, list) or set(map(type, part)) - {bytes}:
                raise CorruptionError(
                    path, "hint key section holds something other than arrays of keys (bin)"
                )
            out += part
    except ValueError as exc:
        raise CorruptionError(path, f"undecodable hint key array: {exc}") from None
    return out
