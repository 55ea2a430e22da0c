"""Test doubles for the stores' seams, kept out of the product's import surface.

:class:`FaultyFS` fails (optionally tearing the write) at a chosen mutating call and then
behaves like a dead process: every later call fails too, and every descriptor it opened is
closed, so nothing it buffered reaches disk afterwards. Reopening the directory with a
fresh :class:`~statestores.fs.FileSystem` is then exactly a restart after ``kill -9``.
A store handed a file system other than the real one runs its background jobs on threads
of this process, so the fault reaches merges and flushes too. :meth:`FaultyFS.fail_next`
arms the fault at a moment rather than a count (the simulator's disk faults, ``sfaas.sim``).

:func:`inline_post` stands in for :meth:`~statestores.maintainer.Maintainer.post` and runs
whatever a store posts to its maintainer thread at once, on the posting thread.
"""

from __future__ import annotations

import mmap
import os
import random
import threading
from collections.abc import Callable
from typing import Any

from .fs import FileSystem, close_fd
from .maintainer import Maintainer

__all__ = ["FaultyFS", "InjectedFault", "inline_post"]


def inline_post(self: Maintainer, fn: Callable[..., Any], *args: Any) -> bool:
    """A :meth:`Maintainer.post` that runs ``fn(*args)`` at once on the posting thread
    (which may hold the store's re-entrant lock), making background installs deterministic:
    ``monkeypatch.setattr(Maintainer, "post", inline_post)``."""
    fn(*args)
    return True


class InjectedFault(OSError):
    """Raised by :class:`FaultyFS` at the chosen call (and at every call after it)."""


class FaultyFS(FileSystem):
    """A :class:`FileSystem` that dies at the ``fail_at``-th mutating call.

    Mutating calls are ``write``, ``fsync``, ``truncate``, ``rename``, ``remove`` and
    ``fsync_dir``. With ``torn=True`` the failing ``write`` first writes a random prefix of
    its data, as a process killed in the middle of a large write would. After the fault
    every call raises :class:`InjectedFault` and all descriptors opened through this object
    are closed (releasing the directory lock), so the store object is as good as dead.
    """

    def __init__(self, fail_at: int | None = None, *, torn: bool = True, seed: int = 0,
                 on_fault: Callable[[str], None] | None = None) -> None:
        self.fail_at = fail_at
        self.torn = torn
        self.calls = 0
        self.dead = False
        #: told what failed, once, when the fault strikes (``crash()`` included)
        self.on_fault = on_fault
        self._rng = random.Random(seed)
        self._fds: set[int] = set()
        # held across each call's liveness check *and* its syscall: a crash() never lands
        # in the middle of another thread's call (as a real kill -9 stops every thread at once)
        self._mutex = threading.RLock()

    def _tick(self) -> bool:
        """Count one mutating call; True if this is the one that must fail."""
        with self._mutex:
            if self.dead:
                raise InjectedFault("injected fault: the process is dead")
            self.calls += 1
            return self.fail_at is not None and self.calls >= self.fail_at

    def _die(self, what: str = "") -> InjectedFault:
        with self._mutex:
            self.dead = True
            fds, self._fds = self._fds, set()
        for fd in fds:
            try:
                close_fd(fd)
            except OSError:
                pass
        message = f"injected fault at mutating call {self.calls}{what}"
        if self.on_fault is not None:
            self.on_fault(message)
        return InjectedFault(message)

    def crash(self) -> None:
        """Die now (as ``kill -9`` between two calls would)."""
        self._die(" (crash)")

    def fail_next(self, *, torn: bool) -> None:
        """Fail the next mutating call (tearing it if it is a ``write`` and ``torn``), and
        every call after it."""
        with self._mutex:
            self.torn = torn
            self.fail_at = self.calls + 1

    def _check_alive(self) -> None:
        if self.dead:
            raise InjectedFault("injected fault: the process is dead")

    def _track(self, fd: int) -> int:
        with self._mutex:
            self._fds.add(fd)
        return fd

    def open_append(self, path: str) -> int:
        with self._mutex:
            self._check_alive()
            return self._track(super().open_append(path))

    def open_new(self, path: str) -> int:
        with self._mutex:
            self._check_alive()
            return self._track(super().open_new(path))

    def open_read(self, path: str) -> int:
        with self._mutex:
            self._check_alive()
            return self._track(super().open_read(path))

    def lock(self, path: str) -> int:
        with self._mutex:
            self._check_alive()
            return self._track(super().lock(path))

    def close(self, fd: int) -> None:
        with self._mutex:
            if fd not in self._fds:
                return  # already closed by the fault
            self._fds.discard(fd)
            os.close(fd)

    def unlock(self, fd: int) -> None:
        with self._mutex:
            if fd not in self._fds:
                return  # already closed by the fault
            self._fds.discard(fd)
            close_fd(fd)

    def _dead_if_gone(self, exc: OSError) -> BaseException:
        """An ``OSError`` raised because another thread's fault closed our descriptor is
        the injected crash, not a bug (threads share the one dying file system)."""
        return InjectedFault("injected fault: the process is dead") if self.dead else exc

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        with self._mutex:
            if self._tick():
                what = f": write of {len(data)} bytes"
                if self.torn and len(data) > 1:
                    kept = self._rng.randrange(1, len(data))
                    super().write(fd, memoryview(data)[:kept])
                    what += f" torn after {kept}"
                raise self._die(what)
            try:
                super().write(fd, data)
            except OSError as exc:
                raise self._dead_if_gone(exc) from None

    def fsync(self, fd: int) -> None:
        with self._mutex:
            if self._tick():
                raise self._die(": fsync")
            try:
                super().fsync(fd)
            except OSError as exc:
                raise self._dead_if_gone(exc) from None

    def truncate(self, path: str, size: int) -> None:
        with self._mutex:
            if self._tick():
                raise self._die(": truncate")
            super().truncate(path, size)

    def rename(self, src: str, dst: str) -> None:
        with self._mutex:
            if self._tick():
                raise self._die(": rename")
            super().rename(src, dst)

    def remove(self, path: str) -> None:
        with self._mutex:
            if self._tick():
                raise self._die(": remove")
            super().remove(path)

    def fsync_dir(self, directory: str) -> None:
        with self._mutex:
            if self._tick():
                raise self._die(": fsync_dir")
            super().fsync_dir(directory)

    def read_file(self, path: str) -> bytes:
        with self._mutex:
            self._check_alive()
            return super().read_file(path)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._mutex:
            self._check_alive()
            try:
                return super().pread(fd, size, offset)
            except OSError as exc:
                raise self._dead_if_gone(exc) from None

    def mmap(self, fd: int) -> mmap.mmap | None:
        with self._mutex:
            self._check_alive()
            try:
                return super().mmap(fd)
            except (OSError, ValueError) as exc:
                raise self._dead_if_gone(OSError(str(exc))) from None
