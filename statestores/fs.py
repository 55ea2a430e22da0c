"""The one seam between the engines and the operating system's files.

Engines never call ``os`` directly for data files: they go through a :class:`FileSystem`,
so a test can hand a store one that dies mid-call (``statestores.testing.FaultyFS``) and
reach every write the store makes, background merges included.

Writes go straight to ``os.write`` (no Python-level buffering): what a ``write`` call has
returned from is in the OS and survives a killed process; ``fsync`` adds power-loss safety.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading

from .errors import LockedError

__all__ = ["FileSystem", "close_fd"]

# Directory locks are POSIX record locks (``fcntl.lockf``), as LevelDB's: they belong to
# the process, so a child forked by any thread (a background worker being spawned, the
# user's subprocess) never holds one — with ``flock`` the lock lives in the open file
# description, which a child shares from fork until exec, so a store closed meanwhile
# could not be reopened. A record lock does not exclude the process itself, so this
# table does: lock path → descriptor, and descriptor → path.
_locks_mutex = threading.Lock()
_locked_paths: dict[str, int] = {}
_locked_fds: dict[int, str] = {}


def close_fd(fd: int) -> None:
    """Close ``fd``; if it holds a directory lock, drop it from the table in the same step
    (no lock can be taken, and no table entry reused, in between)."""
    with _locks_mutex:
        path = _locked_fds.pop(fd, None)
        if path is not None:
            _locked_paths.pop(path, None)
        os.close(fd)


class FileSystem:
    """Real file operations. Paths are ``str``; descriptors are plain ints."""

    def open_append(self, path: str) -> int:
        """Open ``path`` for appending, creating it if missing."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def open_new(self, path: str) -> int:
        """Create (or truncate) ``path`` for writing."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def open_read(self, path: str) -> int:
        return os.open(path, os.O_RDONLY)

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` (looping over short writes)."""
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def mmap(self, fd: int) -> mmap.mmap | None:
        """A read-only map of the whole file, or ``None`` for an empty file."""
        if os.fstat(fd).st_size == 0:
            return None
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def truncate(self, path: str, size: int) -> None:
        os.truncate(path, size)

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src``."""
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

    def listdir(self, directory: str) -> list[str]:
        return os.listdir(directory)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def makedirs(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)

    def fsync_dir(self, directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def lock(self, path: str) -> int:
        """Take an exclusive lock file; :class:`LockedError` if someone holds it (another
        process, or another store of this process)."""
        key = os.path.realpath(path)
        with _locks_mutex:
            if key in _locked_paths:
                raise LockedError(f"{path}: the store directory is already open in this process")
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise LockedError(
                        f"{path}: the store directory is already open elsewhere"
                    ) from None
                raise
            _locked_paths[key] = fd
            _locked_fds[fd] = key
        return fd

    def unlock(self, fd: int) -> None:
        close_fd(fd)

    # -- composed helpers (built only from the primitives above, so faults reach them) --

    def write_file_atomic(self, path: str, data: bytes, *, sync: bool) -> None:
        """Write ``data`` to ``path`` all-or-nothing: a temp file, then a rename."""
        tmp = path + ".tmp"
        fd = self.open_new(tmp)
        try:
            self.write(fd, data)
            if sync:
                self.fsync(fd)
        finally:
            self.close(fd)
        self.rename(tmp, path)
        if sync:
            self.fsync_dir(os.path.dirname(path) or ".")
