"""The files of one store directory: the live :class:`~statestores.version.Version`, the
numbering of new file names, ``CURRENT``, and the pins that keep files on disk.

A part every :class:`~statestores.base.Store` holds (``store.files``). It takes no lock:
its owner holds the store lock around every call (the methods say *lock held*).

**Lifetimes.** A file is deleted once no version names it and nothing pins it. Pins are
counted: a snapshot being uploaded, a restore downloading, an edit or snapshot mark not
yet handed to every subscriber each hold one (:class:`Pins`).
"""

from __future__ import annotations

import concurrent.futures
import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

from . import current
from .errors import CorruptionError
from .fs import FileSystem
from .snapshot_info import Frozen
from .version import FileEntry, Version, VersionEdit, decode_entries, seq_of

__all__ = ["FileSet", "Pins", "dir_bytes"]


class Pins:
    """Counted pins on file names: a pinned file stays on disk whatever the version says."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, names: Iterable[str]) -> None:
        """Pin each of ``names`` once more."""
        for n in names:
            self._counts[n] += 1

    def release(self, names: Iterable[str]) -> list[str]:
        """Release one pin of each of ``names``; return those no longer pinned at all."""
        freed = []
        for n in names:
            self._counts[n] -= 1
            if self._counts[n] <= 0:
                del self._counts[n]
                freed.append(n)
        return freed

    def __contains__(self, name: object) -> bool:
        return self._counts[name] > 0 if isinstance(name, str) else False

    def __len__(self) -> int:
        return len(self._counts)


class FileSet:
    """The live version of one directory, its numbering and its pins (lock held by the owner)."""

    def __init__(self, fs: FileSystem, directory: str, prefix: str, *, fsync: bool) -> None:
        #: constant after construction
        self.fs = fs
        self.directory = directory
        self.prefix = prefix
        self.fsync = fsync
        #: the last sequence number used in a file name
        self.seq = 0
        self.version = Version()
        self.pins = Pins()

    def path(self, name: str) -> str:
        """The path of file ``name`` in the directory."""
        return os.path.join(self.directory, name)

    def next_seq(self) -> int:
        """A fresh sequence number for a new file name."""
        self.seq += 1
        return self.seq

    def skip_to(self, seq: int) -> None:
        """Number new files above ``seq`` (names another copy of the store has used)."""
        self.seq = max(self.seq, seq)

    def stands_at(self, names: Iterable[str], seq_floor: int) -> bool:
        """Whether every live file outside ``names`` is a WAL numbered above ``seq_floor``
        (nothing flushed or merged since ``names``: the open's new WAL, its spare) — if so,
        new files are numbered above it from now on."""
        want = set(names)
        if any(e.kind != "wal" or seq_of(n) <= seq_floor
               for n, e in self.version.files.items() if n not in want):
            return False
        self.skip_to(seq_floor)
        return True

    def load(self) -> Version:
        """(open) Read ``CURRENT`` into :attr:`version`, continue numbering above every name
        in the directory, and delete leftovers no version names."""
        path = self.path(current.NAME)
        doc = current.read(self.fs, self.directory)
        self.seq = int(doc.get("seq", 0))
        entries = decode_entries(doc.get("files", []), path)
        self.version = Version(int(doc.get("version", 0)), {e.name: e for e in entries})
        for e in entries:
            if not self.fs.exists(self.path(e.name)):
                raise CorruptionError(self.path(e.name), f"named in {path} but missing")
        names = self.fs.listdir(self.directory)
        own = [seq_of(n) for n in names if n.startswith(self.prefix + "-")]
        self.seq = max([self.seq, *own])
        self.remove_strays(names)
        return self.version

    def remove_strays(self, names: Iterable[str] | None = None) -> None:
        """Delete this engine's files that no version names and nothing pins (leftovers of
        a crash: unfinished ``.tmp`` outputs, files a crash left unreferenced)."""
        prefix = self.prefix + "-"
        for name in self.fs.listdir(self.directory) if names is None else names:
            if name.startswith(prefix) and name not in self.version and name not in self.pins:
                self.fs.remove(self.path(name))

    def apply(self, added: Iterable[FileEntry], removed: Iterable[str]) -> VersionEdit:
        """Apply one edit to the version and persist it in ``CURRENT``. Deleting what it
        removed is the caller's (:meth:`delete_unneeded`, once subscribers have it)."""
        edit = self.version.apply(added, removed)
        current.write_version(self.fs, self.directory, self.seq, self.version, sync=self.fsync)
        return edit

    def reset_to(self, entries: Iterable[FileEntry]) -> tuple[list[FileEntry], list[str]]:
        """The ``(added, removed)`` of the edit that makes the version exactly ``entries``."""
        new = {e.name: e for e in entries}
        old = self.version.files
        added = [e for n, e in new.items() if old.get(n) != e]
        removed = [n for n in old if n not in new or old[n] != new[n]]
        return added, removed

    def pin(self, names: Iterable[str]) -> None:
        """Keep ``names`` on disk until :meth:`unpin`."""
        self.pins.add(names)

    def unpin(self, names: Iterable[str]) -> None:
        """Release a pin of each of ``names``, deleting those nothing needs any more."""
        self.delete_unneeded(self.pins.release(names))

    def delete_unneeded(self, names: Iterable[str]) -> None:
        """Delete each of ``names`` that no version names and nothing pins."""
        for n in names:
            if n not in self.version and n not in self.pins:
                self.fs.remove(self.path(n))

    def frozen(
        self,
        *,
        skip: Iterable[str] = (),
        extra: Iterable[FileEntry] = (),
        pending: Iterable[concurrent.futures.Future[Any]] = (),
    ) -> Frozen:
        """A snapshot's files, derived from the live version: every file but ``skip``
        (files still being written to, e.g. the active WAL), plus ``extra`` files a
        hand-off is writing (their ``pending`` futures resolve once they are durable)."""
        skipped = set(skip)
        entries = [e for e in self.version if e.name not in skipped]
        have = {e.name for e in entries}
        entries += [e for e in extra if e.name not in have]
        return Frozen(entries, list(pending))


def dir_bytes(directory: str) -> int:
    """The bytes of the files in ``directory`` now: a file background work removes between
    the listing and its ``stat`` (a retired WAL, a merged run) is skipped, not the rest."""
    total = 0
    try:
        with os.scandir(directory) as it:
            entries = [e for e in it if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return 0
    for e in entries:
        try:
            total += e.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return total
