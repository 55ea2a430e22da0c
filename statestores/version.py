"""The live file set of a store, and the typed edits that change it.

Every engine describes its durable state as a :class:`Version`: a set of immutable (or,
for WALs and an AppendLog's active segment, append-only) files, each with a kind and a
level. Every flush, seal, merge, restore and WAL roll is one :class:`VersionEdit` —
files added, files removed — applied through :meth:`statestores.base.Store._edit`, the
one place where the set changes: it persists the new version in ``CURRENT``
(``FORMAT.md`` § "CURRENT"), hands the edit to subscribers in sequence order, and
decides when removed files are deleted.

Order is derived, not stored: data files (runs, segments) are ordered oldest → newest by
``(level descending, seq ascending)``, which holds because levels never increase from
older to newer data (tiering) and merges are serialized; WALs by ``seq``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import CorruptionError

__all__ = [
    "KINDS", "FileEntry", "VersionEdit", "SnapshotMark", "Version", "seq_of", "encode_entries",
    "decode_entries",
]

#: ``run`` (lsm sorted run), ``segment`` (sealed log file), ``hint`` (a segment's index),
#: ``wal`` (write-ahead log, or an AppendLog's active segment), ``dump`` (memonly).
KINDS = ("run", "segment", "hint", "wal", "dump")
_DATA = ("run", "segment", "dump")
_SEQ_RE = re.compile(r"(\d{6,})")


def seq_of(name: str) -> int:
    """The sequence number embedded in a data file name (0 if it has none)."""
    m = _SEQ_RE.findall(name)
    return int(m[-1]) if m else 0


@dataclass(frozen=True)
class FileEntry:
    """One live file: its name (relative to the store directory), kind and level."""

    name: str
    kind: str
    level: int = 0

    @property
    def seq(self) -> int:
        return seq_of(self.name)

    def encode(self) -> list[Any]:
        return [self.name, self.kind, self.level]


@dataclass(frozen=True)
class VersionEdit:
    """One change of the live file set; ``seq`` is the version it produces."""

    seq: int
    added: tuple[FileEntry, ...] = ()
    removed: tuple[str, ...] = ()


@dataclass(frozen=True)
class SnapshotMark:
    """Snapshot ``snapshot_id`` is complete in the remote and holds exactly ``files``.

    Delivered to subscribers in the same ordered stream as the edits: every edit with a
    sequence number up to ``seq`` came before it. ``files`` may name sealed WALs that no
    edit listed as immutable (a replica needs their bodies to hold the snapshot locally).
    """

    snapshot_id: int
    seq: int
    files: tuple[FileEntry, ...]


@dataclass
class Version:
    """The live file set at version ``seq`` (mutable; owned by one store, under its lock)."""

    seq: int = 0
    files: dict[str, FileEntry] = field(default_factory=dict)

    def apply(self, added: Iterable[FileEntry], removed: Iterable[str]) -> VersionEdit:
        """Apply one edit (removed first, then added) and return it, numbered."""
        rem = tuple(n for n in removed if n in self.files)
        for n in rem:
            del self.files[n]
        add = tuple(added)
        for e in add:
            if e.kind not in KINDS:
                raise ValueError(
                    f"file {e.name!r} has unknown kind {e.kind!r}; expected one of {KINDS}"
                )
            self.files[e.name] = e
        self.seq += 1
        return VersionEdit(self.seq, add, rem)

    def of_kind(self, *kinds: str) -> list[FileEntry]:
        """Entries of ``kinds`` in age order (oldest first)."""
        out = [e for e in self.files.values() if e.kind in kinds]
        if all(k in _DATA for k in kinds):
            out.sort(key=lambda e: (-e.level, e.seq))
        else:
            out.sort(key=lambda e: e.seq)
        return out

    def names(self) -> list[str]:
        return sorted(self.files)

    def __contains__(self, name: object) -> bool:
        return name in self.files

    def __iter__(self) -> Iterator[FileEntry]:
        return iter(list(self.files.values()))


def encode_entries(entries: Iterable[FileEntry]) -> list[list[Any]]:
    """Entries as msgpack-able lists (``CURRENT``, snapshot manifests), sorted by name."""
    return [e.encode() for e in sorted(entries, key=lambda e: e.name)]


def decode_entries(raw: Any, source: str) -> list[FileEntry]:
    """Inverse of :func:`encode_entries`; :class:`CorruptionError` naming ``source`` if
    malformed."""
    if not isinstance(raw, list):
        raise CorruptionError(source, f"file list must be a list, got {type(raw).__name__}")
    out: list[FileEntry] = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], str)
            or item[1] not in KINDS
            or not isinstance(item[2], int)
            or "/" in item[0]
            or item[0] in ("", ".", "..")
        ):
            raise CorruptionError(
                source, f"bad file entry {item!r:.80}; expected [name, kind, level]"
            )
        out.append(FileEntry(item[0], item[1], item[2]))
    return out
