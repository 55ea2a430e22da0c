"""The write-ahead logs of an ``lsm`` store: the active one the writers append to, the
spare that takes over when it is sealed, and the sealed ones a flush retires.

A part the store holds (``LSMStore._wal``), used under the store lock unless a method
says otherwise. It names and opens files; the store records them in its version
(``FORMAT.md`` § lsm: ``lsm-<seq>.wal``).
"""

from __future__ import annotations

from ..files import FileSet
from ..fs import FileSystem
from ..tasks import Tasks
from ..version import FileEntry, seq_of

__all__ = ["Wals"]


class Wals:
    """The WAL files of one lsm store."""

    def __init__(self, fs: FileSystem, files: FileSet, tasks: Tasks, *, fsync: bool) -> None:
        #: constant after construction
        self.fs = fs
        self.files = files
        self.tasks = tasks
        self.fsync = fsync
        #: the active WAL's descriptor; None: no WAL (``sync="none"``, or closed)
        self.fd: int | None = None
        #: bytes written to the active WAL
        self.bytes = 0
        #: WAL names, oldest first; the last is active when :attr:`fd` is set
        self.names: list[str] = []
        #: (name, descriptor): the next WAL, already in the version
        self.spare: tuple[str, int] | None = None
        self._to_close: list[int] = []  # sealed WALs' descriptors, closed by the maintainer

    def switch(self) -> list[FileEntry]:
        """Seal the active WAL and make another one active: the spare — a pointer swap, no
        syscall, already in the version — or else a new file, whose entry is returned for
        the caller's edit. The caller has the maintainer :meth:`close_sealed` the old
        descriptor and make the next spare, so a freeze never waits for the file system."""
        old_fd = self.fd
        spare, self.spare = self.spare, None
        added: list[FileEntry] = []
        if spare is not None:
            name, self.fd = spare
        else:
            name = f"lsm-{self.files.next_seq():010d}.wal"
            self.fd = self.fs.open_new(self.files.path(name))
            added.append(FileEntry(name, "wal"))
        self.names.append(name)
        self.bytes = 0
        if old_fd is not None:
            self._to_close.append(old_fd)
        return added

    def retire(self) -> list[str]:
        """Every WAL name so far, forgotten: a flush's run now holds their writes (the
        caller removes them in its edit and :meth:`switch` es if a WAL was active)."""
        names, self.names = self.names, []
        return names

    def sealed(self) -> list[str]:
        """The WALs no writer appends to any more."""
        return self.names[:-1] if self.fd is not None else list(self.names)

    def unsealed(self) -> list[str]:
        """The active WAL and the spare: files a snapshot must not name."""
        active = self.names[-1:] if self.fd is not None else []
        return active + ([self.spare[0]] if self.spare is not None else [])

    def close_sealed(self) -> None:
        """(maintainer, no lock) Close the sealed WALs' descriptors (each may take ms)."""
        with self.tasks.lock:
            fds, self._to_close = self._to_close, []
        for fd in fds:
            if self.fsync:
                self.fs.fsync(fd)
            self.fs.close(fd)

    def spare_wanted(self) -> bool:
        """A WAL is active and no spare is ready."""
        return self.spare is None and self.fd is not None

    def open_spare(self, seq: int) -> tuple[str, int]:
        """(no lock) Create the file of a spare WAL numbered ``seq`` (the syscall)."""
        name = f"lsm-{seq:010d}.wal"
        return name, self.fs.open_new(self.files.path(name))

    def adopt_spare(self, spare: tuple[str, int], seq: int, *, closed: bool) -> bool:
        """Keep ``spare`` (from :meth:`open_spare`) as the next WAL, or delete it if it is
        no longer wanted: the store closed, a spare or no WAL, or it is older than the
        active WAL (a new file was made meanwhile; replay order is seq order). True: kept,
        the caller adds it to the version."""
        if closed or not self.spare_wanted() or seq < seq_of(self.names[-1]):
            self.fs.close(spare[1])
            self.fs.remove(self.files.path(spare[0]))
            return False
        self.spare = spare
        return True

    def drop_spare(self) -> list[str]:
        """Close the spare WAL; its name, for the caller's edit to remove."""
        spare, self.spare = self.spare, None
        if spare is None:
            return []
        self.fs.close(spare[1])
        return [spare[0]]

    def close(self, *, sync: bool) -> None:
        """Close the active WAL (``sync``: fsync it first); the caller drops the spare."""
        if self.fd is not None:
            if sync:
                self.fs.fsync(self.fd)
            self.fs.close(self.fd)
            self.fd = None

    def abandon(self) -> None:
        """(a failed open) Close every descriptor, writing nothing; errors are ignored (the
        open's own error is the one that matters)."""
        fds = [self.spare[1]] if self.spare is not None else []
        fds += self._to_close + ([self.fd] if self.fd is not None else [])
        self.spare, self._to_close, self.fd = None, [], None
        for fd in fds:
            try:
                self.fs.close(fd)
            except OSError:
                pass
