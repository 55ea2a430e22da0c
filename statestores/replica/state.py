"""The follower's ``FOLLOW`` document (``FORMAT.md`` § "FOLLOW"): a magic, a crc32c and a
msgpack map of the version a replica holds (seq and files), the origin it follows and its
retained snapshot marks."""

from __future__ import annotations

import struct
from typing import NamedTuple

import msgpack

from ..checksum import crc32c
from ..errors import CorruptionError, StoreError
from ..version import FileEntry, decode_entries, encode_entries

__all__ = ["FollowState", "decode_state", "encode_state"]

_HEAD = struct.Struct("<4sI")
_MAGIC = b"SFFO"

#: (snapshot_id, seq, files) of a retained mark
Mark = tuple[int, int, tuple[FileEntry, ...]]


class FollowState(NamedTuple):
    seq: int
    origin: str
    files: dict[str, FileEntry]
    #: oldest first
    marks: list[Mark]


def encode_state(engine: str, state: FollowState) -> bytes:
    """The document's bytes."""
    doc = {
        "engine": engine,
        "seq": state.seq,
        "origin": state.origin,
        "files": encode_entries(state.files.values()),
        "marks": [[i, s, encode_entries(f)] for i, s, f in state.marks],
    }
    body: bytes = msgpack.packb(doc, use_bin_type=True)
    return _HEAD.pack(_MAGIC, crc32c(body)) + body


def decode_state(data: bytes, path: str, engine: str) -> FollowState:
    """The state in ``data`` (read from ``path``), a replica of ``engine``'s: a damaged
    document is a :class:`CorruptionError`, another engine's a :class:`StoreError`."""
    magic, crc = _HEAD.unpack_from(data) if len(data) >= _HEAD.size else (b"", 0)
    body = data[_HEAD.size:]
    if magic != _MAGIC or crc32c(body) != crc:
        raise CorruptionError(path, "bad magic or checksum")
    try:
        doc = msgpack.unpackb(body, raw=False)
        if doc.get("engine") != engine:
            raise StoreError(f"{path}: a replica of engine {doc.get('engine')!r}, not {engine!r}")
        return FollowState(
            int(doc["seq"]),
            str(doc["origin"]),
            {e.name: e for e in decode_entries(doc["files"], path)},
            [(int(i), int(s), tuple(decode_entries(f, path))) for i, s, f in doc["marks"]],
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptionError(path, f"malformed replica state: {exc}") from None
