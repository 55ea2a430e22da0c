"""HybridLog's in-memory records on their way to files: a :class:`Region` handed off to
become a log file, a snapshot :class:`Tail` and :func:`write_tail`, which writes one."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field

from .. import records
from ..fs import FileSystem

__all__ = ["Region", "Tail", "write_tail"]


def write_tail(fs: FileSystem | None, path: str, items: list[tuple[bytes, bytes | None]]) -> None:
    """Write a snapshot tail: ``items`` as one batch (all or nothing), atomically (a temp
    file, then a rename). Runs in the ``flush`` background process (``fs`` None: the real
    file system), or on the maintainer thread with a test's file system."""
    fs = fs if fs is not None else FileSystem()
    fs.write_file_atomic(path, records.encode_batch(items), sync=False)


@dataclass(eq=False)
class Tail:
    """A snapshot tail being written by the maintainer: ``name`` holds ``records`` (the
    last record per key written since the previous tail or flush) once ``future`` resolves."""

    name: str
    records: dict[bytes, bytes | None]
    future: concurrent.futures.Future[None] | None = None


@dataclass(eq=False)
class Region:
    """In-memory records handed to the maintainer to become log file ``name``: readable
    until that file is installed. ``dicts`` oldest first; ``wals`` hold exactly them."""

    dicts: list[dict[bytes, bytes | None]]
    wals: list[str]
    name: str
    seq: int
    future: concurrent.futures.Future[None] | None = None
    failed: bool = field(default=False)
