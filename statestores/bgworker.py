"""The background worker process: runs the tasks a store process's lane sends it (see
:mod:`statestores.background`) and replies, until its parent closes the pipe or dies.

Started as ``python -P -m statestores._bgmain <parent pid>``; it dies with its parent
(``PR_SET_PDEATHSIG`` on Linux, plus a watchdog thread), runs at ``nice`` 10 and ignores
SIGINT.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any

from . import background
from .bgframes import CREDENTIALS, FRAME, PICKLE, recv_frame, write_all

__all__ = ["child_main", "error_reply"]

_PR_SET_PDEATHSIG = 1
#: Seconds between two checks of the worker's watchdog.
_WATCHDOG_PERIOD = 0.2


def _set_pdeathsig() -> None:
    """Ask the kernel to SIGKILL this process when its parent thread exits (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _watchdog(parent: int) -> None:
    while True:
        time.sleep(_WATCHDOG_PERIOD)
        if os.getppid() != parent:
            os._exit(1)


def error_reply(tid: Any, exc: BaseException) -> bytes:
    """The pickled failure reply for ``exc``, as it is if it survives a pickle round trip."""
    tb = "".join(traceback.format_exception(exc))
    with contextlib.suppress(Exception):
        exc.add_note(f"raised in background process {os.getpid()}:\n{tb.rstrip()}")
    try:
        data = pickle.dumps((tid, False, exc), PICKLE)
        pickle.loads(data)
        return data
    except Exception:
        return pickle.dumps((tid, False, RuntimeError(f"{exc!r}\n{tb}")), PICKLE)


def child_main(argv: list[str]) -> int:
    """The worker: run tasks from stdin, reply on stdout, until EOF on stdin."""
    parent = int(argv[0])
    _set_pdeathsig()
    if os.getppid() != parent:
        return 0  # the parent died before prctl took effect
    threading.Thread(
        target=_watchdog, args=(parent,), name="statestores-bg-watchdog", daemon=True
    ).start()
    background.run_tasks_here()
    with contextlib.suppress(OSError):
        os.nice(10)  # background work loses the CPU to the serving process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # private descriptors for the protocol; a task that prints writes to stderr, a task
    # that reads stdin reads /dev/null
    rfd = os.dup(0)
    wfd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    while True:
        try:
            frame = recv_frame(rfd)
        except EOFError:
            return 1
        if frame is None:
            return 0
        if frame[:len(CREDENTIALS)] == CREDENTIALS:  # no reply
            from remotes import credentials

            credentials.install(json.loads(bytes(frame[len(CREDENTIALS):])))
            continue
        tid: Any = None
        try:
            tid, fn, args = pickle.loads(frame)
            del frame
            reply = pickle.dumps((tid, True, fn(*args)), PICKLE)
        except BaseException as exc:  # reported to the parent, which decides
            reply = error_reply(tid, exc)
        args = None  # drop the arguments before waiting for the next task
        write_all(wfd, FRAME.pack(len(reply)))
        write_all(wfd, reply)
        del reply
