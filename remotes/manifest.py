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

__all__ = ["FileInfo", "Manifest", "ManifestError"]

_MAGIC = b"SFMF"
_VERSION = 1
_HEAD = struct.Struct("<4sBI")


class ManifestError(ValueError):
    """The bytes are not a valid manifest (bad magic, version or checksum)."""


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
        body = msgpack.packb(
            {
                "id": self.snapshot_id,
                "engine": self.engine,
                "files": {n: [f.size, f.crc] for n, f in sorted(self.files.items())},
                "meta": self.meta,
                "created": self.created,
            },
            use_bin_type=True,
        )
        return _HEAD.pack(_MAGIC, _VERSION, crc32c(body)) + body

    @classmethod
    def decode(cls, data: bytes, *, source: str = "manifest") -> Manifest:
        if len(data) < _HEAD.size:
            raise ManifestError(f"{source}: too short to be a manifest ({len(data)} bytes)")
        magic, version, crc = _HEAD.unpack_from(data)
        if magic != _MAGIC:
            raise ManifestError(f"{source}: not a manifest (magic {magic!r})")
        if version != _VERSION:
            raise ManifestError(f"{source}: unsupported manifest version {version}")
        body = data[_HEAD.size :]
        if crc32c(body) != crc:
            raise ManifestError(f"{source}: manifest checksum mismatch")
        d = msgpack.unpackb(body, raw=False, strict_map_key=False)
        return cls(
            snapshot_id=d["id"],
            engine=d["engine"],
            files={n: FileInfo(s, c) for n, (s, c) in d["files"].items()},
            meta=d["meta"],
            created=d["created"],
        )
