"""Names and keys inside a remote's namespace, shared by every implementation.

Layout (relative to a directory or to ``bucket/prefix/``)::

    files/<name>                         immutable data files
    manifests/<snapshot_id:%020d>.manifest   one encoded Manifest per published snapshot
    blobs/<name>                         small opaque documents

Zero-padded ids make the lexicographic order of keys the numeric order of snapshots, so
an S3 listing (which is lexicographic) is already sorted.
"""

from __future__ import annotations

import re

__all__ = [
    "FILES",
    "MANIFESTS",
    "BLOBS",
    "MAX_SNAPSHOT_ID",
    "check_name",
    "check_snapshot_id",
    "manifest_name",
    "parse_manifest_name",
    "normalize_prefix",
]

FILES = "files"
MANIFESTS = "manifests"
BLOBS = "blobs"

MAX_SNAPSHOT_ID = 10**20 - 1
_MANIFEST_RE = re.compile(r"^(\d{20})\.manifest$")


def check_name(name: object, what: str = "name") -> str:
    """Return ``name`` if it is a valid file/blob name, else raise ``ValueError``/``TypeError``.

    A valid name is a non-empty ``str`` without ``/``, ``\\``, NUL or ``..`` and is not ``.``;
    it is used verbatim as the last component of a path or object key.
    """
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__}: {name!r}")
    if not name:
        raise ValueError(f"{what} must not be empty, got {name!r}")
    if "/" in name or "\\" in name or "\x00" in name:
        raise ValueError(f"{what} {name!r} must not contain '/', '\\\\' or NUL")
    if ".." in name or name == ".":
        raise ValueError(f"{what} {name!r} must not be '.' or contain '..'")
    if len(name.encode()) > 200:
        raise ValueError(f"{what} {name!r} is longer than 200 bytes")
    return name


def check_snapshot_id(snapshot_id: object) -> int:
    """Return ``snapshot_id`` if it is an int in ``[0, 10**20)``, else raise."""
    if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
        raise TypeError(
            f"snapshot_id must be an int, got {type(snapshot_id).__name__}: {snapshot_id!r}"
        )
    if not 0 <= snapshot_id <= MAX_SNAPSHOT_ID:
        raise ValueError(f"snapshot_id must be in [0, {MAX_SNAPSHOT_ID}], got {snapshot_id}")
    return snapshot_id


def manifest_name(snapshot_id: int) -> str:
    """``manifests/`` entry name of ``snapshot_id`` (without the directory)."""
    return f"{check_snapshot_id(snapshot_id):020d}.manifest"


def parse_manifest_name(name: str) -> int | None:
    """The snapshot id encoded in a ``manifests/`` entry name, or ``None`` for other names."""
    m = _MANIFEST_RE.match(name)
    return int(m.group(1)) if m else None


def normalize_prefix(prefix: str) -> str:
    """``prefix`` as ``a/b/`` (``""`` for none); ``ValueError`` naming a bad component."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}: {prefix!r}")
    parts = [p for p in prefix.strip("/").split("/")]
    if parts == [""]:
        return ""
    for p in parts:
        if p in ("", ".", "..") or "\\" in p or "\x00" in p:
            raise ValueError(
                f"prefix {prefix!r} has an empty, '.', '..' or invalid component {p!r}"
            )
    return "/".join(parts) + "/"
