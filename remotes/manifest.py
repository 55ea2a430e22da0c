"""Snapshot manifests: which immutable files make up one snapshot of one store.

A manifest is the *publish* step of a snapshot: it is written only after every file it
names is durable in the remote. Encoding (see ``statestores/FORMAT.md`` § "Manifests"):
``b"SFMF" | version:u8 | crc32c:u32 | msgpack(body)``, the crc covering the msgpack bytes.
"""

from __future__ import annotations

import math
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
from crc32c import crc32c

from ._layout import MAX_SNAPSHOT_ID, check_name

__all__ = ["FileInfo", "Manifest", "ManifestError", "frame", "unframe"]

_MAGIC = b"SFMF"
_VERSION = 1
_HEAD = struct.Struct("<4sBI")


class ManifestError(ValueError):
    """The bytes are not a valid manifest (bad magic, version or checksum)."""


def frame(magic: bytes, version: int, body: Any) -> bytes:
    """``magic:4 | version:u8 | crc32c:u32 | msgpack(body)``, the crc over the msgpack bytes
    (the framing of snapshot manifests; other small documents reuse it)."""
    raw: bytes = msgpack.packb(body, use_bin_type=True)
    return _HEAD.pack(magic, version, crc32c(raw)) + raw


def unframe(
    data: bytes, *, magic: bytes, version: int, what: str, source: str,
    error: type[ValueError] = ManifestError,
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

        def bad(why: str) -> ManifestError:
            return ManifestError(f"{source}: malformed manifest body: {why}")

        if not isinstance(d, dict) or not {"id", "engine", "files", "meta", "created"} <= d.keys():
            raise bad("expected a map with id, engine, files, meta, created")
        sid, engine, files, meta, created = (
            d["id"], d["engine"], d["files"], d["meta"], d["created"],
        )
        if type(sid) is not int or not 0 <= sid <= MAX_SNAPSHOT_ID:
            raise bad(f"id must be an int in [0, {MAX_SNAPSHOT_ID}]")
        if type(engine) is not str or type(meta) is not dict or type(files) is not dict:
            raise bad("engine must be a str, meta and files maps")
        if type(created) not in (int, float) or not math.isfinite(created):
            raise bad("created must be a finite number")
        infos: dict[str, FileInfo] = {}
        for name, info in files.items():
            try:
                check_name(name, "file name")
            except (TypeError, ValueError) as exc:
                raise bad(str(exc)) from None
            if (
                type(info) is not list
                or len(info) != 2
                or not all(type(x) is int and x >= 0 for x in info)
            ):
                raise bad(f"file {name!r} must have [size, crc], ints >= 0")
            infos[name] = FileInfo(info[0], info[1])
        return cls(snapshot_id=sid, engine=engine, files=infos, meta=meta, created=created)
