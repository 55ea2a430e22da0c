"""Snapshot manifests: which immutable files make up one snapshot of one store.

A manifest is the *publish* step of a snapshot: it is written only after every file it
names is durable in the remote. Encoding (see ``statestores/FORMAT.md`` § "Manifests"):
``b"SFMF" | version:u8 | crc32c:u32 | msgpack(body)``, the crc covering the msgpack bytes.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
from crc32c import crc32c

__all__ = ["FileInfo", "Manifest", "ManifestError", "frame", "unframe"]

_MAGIC = b"SFMF"
_VERSION = 1
_HEAD = struct.Struct("<4sBI")


class ManifestError(ValueError):
    """The bytes are not a valid manifest (bad magic, version or checksum)."""


def frame(magic: bytes, version: int, body: Any) -> bytes:
    """``magic:4 | version:u8 | crc32c:u32 | msgpack(body)``, the crc over the msgpack bytes
    (the framing of snapshot manifests; other small documents reuse it)."""
    raw = msgpack.packb(body, use_bin_type=True)
    return _HEAD.pack(magic, version, crc32c(raw)) + raw


def unframe(
    data: bytes, *, magic: bytes, version: int, what: str, source: str, error: type[ValueError] = ManifestError,
) -> Any:
    """The body of a :func:`frame`; raises ``error`` naming ``source`` and the fault."""
    if len(data) < _HEAD.size:
        raise error(f"{source}: too short to be a {what} ({len(data)} bytes)")
    got, got_version, crc = _HEAD.unpack_from(data)
    if got != magic:
        raise error(f"{source}: not a {what} (magic {got!r})")
    if got_version != version:
        raise error(f"{source}: unsupported {what} version {got_version}")
    raw = data[_HEAD.size :]
    if crc32c(raw) != crc:
        raise error(f"{source}: {what} checksum mismatch")
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:
        raise error(f"{source}: {what} body is not msgpack: {exc}") from None


@dataclass(frozen=True)
class FileInfo:
    """Size and crc32c of one immutable file, as uploaded."""

    size: int
    crc: int


@dataclass(frozen=True)
class Manifest:
    """One complete snapshot: ``files`` (name → info) plus engine-specific ``meta``.

    ``meta`` must be msgpack-able (str keys; ints, strs, bytes, lists, dicts).
    """

    snapshot_id: int
    engine: str
    files: dict[str, FileInfo]
    meta: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def encode(self) -> bytes:
        return frame(_MAGIC, _VERSION, {
            "id": self.snapshot_id,
            "engine": self.engine,
            "files": {n: [f.size, f.crc] for n, f in sorted(self.files.items())},
            "meta": self.meta,
            "created": self.created,
        })

    @classmethod
    def decode(cls, data: bytes, *, source: str = "manifest") -> Manifest:
        d = unframe(data, magic=_MAGIC, version=_VERSION, what="manifest", source=source)
        return cls(
            snapshot_id=d["id"],
            engine=d["engine"],
            files={n: FileInfo(s, c) for n, (s, c) in d["files"].items()},
            meta=d["meta"],
            created=d["created"],
        )
