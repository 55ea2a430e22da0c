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
    threads: int
    children: int  # live or zombie child processes
    fds: int
    sockets: int

    def __str__(self) -> str:
        return f"{self.threads} threads, {self.children} child processes, {self.fds} fds ({self.sockets} sockets)"


def _children() -> int:
    me = str(os.getpid())
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            n += 1
    return n


def held() -> Held:
    gc.collect()
    fds = os.listdir("/proc/self/fd")
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return Held(threading.active_count(), _children(), len(fds), sockets)


def settled(baseline: Held, timeout: float = 10.0) -> Held:
    """What is held once it is back to ``baseline`` (threads and processes take a moment
    to end after ``close`` returns), or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        now = held()
        if now == baseline or time.monotonic() > deadline:
            return now
        time.sleep(0.05)
