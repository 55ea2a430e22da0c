"""The one thread a store owns for everything that happens after background work.

The rule every engine follows (``statestores/README.md``): **no lock is held while
waiting for background work, and a done-callback only hands its result to the store's
own thread.** This module is that thread: callbacks :meth:`Maintainer.post` a function,
and the maintainer runs it — installing a flushed run, a finished merge, a sealed
segment's hint — taking the store lock itself, with nobody waiting on it while holding
that lock.

The inbox is bounded: what posts to it (one merge, a few flushes or seals in flight per
store, version-edit deliveries) is bounded at its source, so a full inbox is a bug and
raises instead of blocking a callback.

In the background's ``loop`` mode (``statestores.bgloop``) there is no thread: the inbox
is a serial executor on the event loop, run in order by the loop or by a wait for it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from . import background
from .bgloop import LoopSerial
from .errors import BackgroundBusy

__all__ = ["Maintainer", "INBOX_LIMIT"]

log = logging.getLogger("statestores")

#: Tasks the inbox holds at most (its sources are bounded far below this).
INBOX_LIMIT = 1024

#: An idle maintainer thread ends after this long (an abandoned store keeps no thread).
IDLE_EXIT_SECONDS = 5.0


class Maintainer:
    """A lazily started daemon thread running posted functions in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._q: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.Queue(
            INBOX_LIMIT
        )
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        #: the inbox in the background's loop mode (made by the first post there)
        self._serial: LoopSerial | None = None
        self._running = False  # a task of the loop mode's inbox runs

    def post(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run ``fn(*args)`` on the maintainer thread; never blocks. False once stopped."""
        if background.mode() == "loop":
            return self._post_on_loop(fn, args)
        with self._mutex:
            if self._stopped:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            try:
                self._q.put_nowait((fn, args))
            except queue.Full:
                raise RuntimeError(
                    f"{self.name}: maintainer inbox full ({INBOX_LIMIT} tasks)"
                ) from None
        return True

    def _post_on_loop(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
        with self._mutex:
            if self._stopped:
                return False
            if self._serial is None:
                self._serial = LoopSerial(INBOX_LIMIT)
            serial = self._serial
        try:  # (outside the mutex: with no loop running, the task runs right here)
            serial.submit(self._call, fn, args)
        except BackgroundBusy:
            raise RuntimeError(
                f"{self.name}: maintainer inbox full ({INBOX_LIMIT} tasks)") from None
        return True

    def _call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """(loop mode) One task of the inbox, as the thread runs it."""
        outer, self._running = self._running, True
        try:
            fn(*args)
        except Exception:
            log.exception("%s: background task %s failed", self.name, getattr(fn, "__name__", fn))
        finally:
            self._running = outer

    def on_thread(self) -> bool:
        """Whether the caller is the maintainer thread (in the loop mode: runs its task)."""
        return threading.current_thread() is self._thread or self._running

    def stop(self, timeout: float = 30.0) -> None:
        """Run what is queued, then end the thread. The caller must not hold the store lock."""
        with self._mutex:
            if self._stopped:
                return
            self._stopped = True
            thread = self._thread
            serial = self._serial
            if thread is not None:
                self._q.put(None)
        if serial is not None:
            serial.shutdown()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.error("%s did not stop within %.0f s", self.name, timeout)

    def _run(self) -> None:
        while True:
            try:
                item = self._q.get(timeout=IDLE_EXIT_SECONDS)
            except queue.Empty:
                with self._mutex:  # idle: end the thread; the next post starts a new one
                    if self._q.empty():
                        self._thread = None
                        return
                continue
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except Exception:
                log.exception(
                    "%s: background task %s failed", self.name, getattr(fn, "__name__", fn)
                )
