"""``CURRENT``: the small local document naming a store's live version.

Rewritten atomically (temp file + rename) by every version edit, so a crash leaves either
the old or the new version. Encoding (``FORMAT.md`` § "CURRENT"):
``b"SFCU" | crc32c:u32 | msgpack({"seq", "version", "files"})``.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import msgpack

from .checksum import crc32c
from .errors import CorruptionError
from .fs import FileSystem
from .version import Version, encode_entries

__all__ = ["NAME", "exists", "read", "write", "write_version"]

NAME = "CURRENT"
_HEAD = struct.Struct("<4sI")
_MAGIC = b"SFCU"


def exists(fs: FileSystem, directory: str) -> bool:
    """Whether ``directory`` holds a ``CURRENT`` file (i.e. an engine's state)."""
    return fs.exists(os.path.join(directory, NAME))


def read(fs: FileSystem, directory: str) -> dict[str, Any]:
    """The ``CURRENT`` document, or ``{}`` if there is none; ``seq`` and ``version`` are
    ints >= 0 and ``files`` a list (its entries: :func:`~.version.decode_entries`)."""
    path = os.path.join(directory, NAME)
    if not fs.exists(path):
        return {}
    data = fs.read_file(path)
    if len(data) < _HEAD.size:
        raise CorruptionError(path, "file too short")
    magic, crc = _HEAD.unpack_from(data)
    body = data[_HEAD.size :]
    if magic != _MAGIC or crc32c(body) != crc:
        raise CorruptionError(path, "bad magic or checksum")
    try:
        doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for malformed input
        raise CorruptionError(path, f"not a document: {type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict):
        raise CorruptionError(path, "not a document")
    for key, default in (("seq", 0), ("version", 0)):
        value = doc.setdefault(key, default)
        if type(value) is not int or value < 0:
            raise CorruptionError(path, f"{key} must be an int >= 0, got {type(value).__name__}")
    if not isinstance(doc.setdefault("files", []), list):
        raise CorruptionError(path, "files must be a list")
    return doc


def write(fs: FileSystem, directory: str, doc: dict[str, Any], *, sync: bool) -> None:
    """Replace ``CURRENT`` with ``doc`` atomically."""
    body = msgpack.packb(doc, use_bin_type=True)
    fs.write_file_atomic(
        os.path.join(directory, NAME), _HEAD.pack(_MAGIC, crc32c(body)) + body, sync=sync
    )


def write_version(
    fs: FileSystem, directory: str, seq: int, version: Version, *, sync: bool
) -> None:
    """Persist ``version`` (and the file-name counter ``seq``) as ``CURRENT``."""
    write(
        fs, directory,
        {"seq": seq, "version": version.seq, "files": encode_entries(version.files.values())},
        sync=sync,
    )
