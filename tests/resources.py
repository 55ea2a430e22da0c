"""What a process holds (threads, child processes, descriptors, sockets), to check that
``close()``/``down`` give back everything they took."""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Held:
    """What the process holds, by identity: a thread or descriptor that an earlier test's
    leftovers end while a test runs cannot hide one this test left behind."""

    threads: frozenset[tuple[int, str]]  # (ident, name)
    children: frozenset[int]  # pids of live or zombie child processes
    fds: frozenset[tuple[int, str]]  # (fd, what it points to)

    @property
    def sockets(self) -> int:
        return sum(target.startswith("socket:") for _, target in self.fds)

    def __sub__(self, other: Held) -> Held:
        """What ``self`` holds that ``other`` did not."""
        return Held(self.threads - other.threads, self.children - other.children, self.fds - other.fds)

    def __bool__(self) -> bool:
        return bool(self.threads or self.children or self.fds)

    def __str__(self) -> str:
        names = sorted(name for _, name in self.threads)
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        return (f"{len(self.threads)} threads ({shown}), {len(self.children)} child processes, "
                f"{len(self.fds)} fds ({self.sockets} sockets)")


def _children() -> frozenset[int]:
    me = str(os.getpid())
    pids = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            pids.add(int(pid))
    return frozenset(pids)


def held() -> Held:
    gc.collect()
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add((int(fd), os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # (the listing's own descriptor, closed by now)
            pass
    threads = frozenset((t.ident or 0, t.name) for t in threading.enumerate())
    return Held(threads, _children(), frozenset(fds))


def leftover(baseline: Held, timeout: float = 10.0) -> Held:
    """What the process holds beyond ``baseline`` once that is nothing (threads and
    processes take a moment to end after ``close`` returns), or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        extra = held() - baseline
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)
