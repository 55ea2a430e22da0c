"""One shared process pool for CPU-heavy background work (merges).

Merges run in a separate process so that they use the second core and never hold the
GIL of the process serving reads and writes. The pool is created lazily, shared by every
store in the process, and uses the ``forkserver`` start method (forking a process with
threads is unsafe). Submitted functions must be top-level functions of plain arguments.

``SFAAS_BACKGROUND=thread`` runs the work on a thread instead (useful under profilers
or on a single core).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["submit", "shutdown", "mode"]

T = TypeVar("T")

_lock = threading.Lock()
_pool: concurrent.futures.Executor | None = None
_pid: int | None = None


def mode() -> str:
    """``"process"`` (default) or ``"thread"``, from ``SFAAS_BACKGROUND``."""
    m = os.environ.get("SFAAS_BACKGROUND", "process")
    if m not in ("process", "thread"):
        raise ValueError(f"SFAAS_BACKGROUND must be 'process' or 'thread', got {m!r}")
    return m


def _executor() -> concurrent.futures.Executor:
    global _pool, _pid
    with _lock:
        if _pool is None or _pid != os.getpid():
            if mode() == "thread":
                _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="statestores-merge")
            else:
                ctx = multiprocessing.get_context("forkserver")
                _pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx)
            _pid = os.getpid()
        return _pool


def warm_up(lane: str = "merge") -> None:
    """Start the lane's worker now (temporary: a no-op)."""


def submit(fn: Callable[..., T], *args: Any, lane: str = "merge", local: bool = False) -> concurrent.futures.Future[T]:
    """Run ``fn(*args)`` in the background; the future carries its result or exception.

    Done-callbacks run on the pool's result thread, shared by every store in the process:
    a callback must not block on a store's lock (the store's own thread may hold it while
    waiting for another future). Hand the result to a thread of the store instead.
    """
    if local:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        def run() -> None:
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:
                fut.set_exception(exc)
        threading.Thread(target=run, daemon=True).start()
        return fut
    try:
        return _executor().submit(fn, *args)
    except concurrent.futures.BrokenExecutor:
        shutdown()
        return _executor().submit(fn, *args)


def shutdown() -> None:
    """Stop the pool (waiting for running work). A later :func:`submit` starts a new one."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=False)


atexit.register(shutdown)
