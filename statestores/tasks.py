"""The store lock and the work handed to the store's maintainer thread.

A part every :class:`~statestores.base.Store` holds (``store.tasks``). The rule it
carries (``statestores/README.md``): one lock (an ``RLock``) guards the engine's state,
the caller's thread takes it for every operation; background results are installed by
the :class:`~statestores.maintainer.Maintainer` thread; nobody waits for background work
while holding the lock — :meth:`Tasks.wait` releases it.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from . import background
from .maintainer import Maintainer

__all__ = ["Tasks"]


class Tasks:
    """The store lock, its condition, and the maintainer thread's tasks."""

    def __init__(self, name: str) -> None:
        #: constant after construction
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.maintainer = Maintainer(name)
        #: The first exception a task on the maintainer raised: the store's files may no
        #: longer match its memory, so waiters raise it instead of waiting forever.
        self.error: BaseException | None = None
        self._scheduled: set[str] = set()  # coalesced tasks posted, not yet started

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Hand ``fn(*args)`` to the maintainer thread (a done-callback's only job). If it
        raises, the store remembers the error and wakes every waiter with it."""

        def task() -> None:
            try:
                fn(*args)
            except BaseException as exc:
                with self.lock:
                    if self.error is None:
                        self.error = exc
                    self.cond.notify_all()
                raise

        self.maintainer.post(task)

    def post_once(self, fn: Callable[[], Any]) -> None:
        """(lock held) Post ``fn`` unless it is already posted and has not started: work
        whose triggers can come at any rate (WAL switches, edits for subscribers) costs
        one inbox slot, however many triggers."""
        key = fn.__name__
        if key in self._scheduled:
            return
        self._scheduled.add(key)

        def once() -> None:
            with self.lock:
                self._scheduled.discard(key)
            fn()

        self.post(once)

    def on_done(
        self, fn: Callable[[Any], Any]
    ) -> Callable[[concurrent.futures.Future[Any]], None]:
        """A done-callback that hands the future to ``fn`` on the maintainer thread."""

        def callback(fut: concurrent.futures.Future[Any]) -> None:
            self.post(fn, fut)

        return callback

    def wait(self, predicate: Callable[[], bool]) -> None:
        """(lock held) Wait for background work until ``predicate()``, releasing the lock
        meanwhile; raises the background error if a task failed."""
        self._wait_for(lambda: predicate() or self.error is not None)
        if self.error is not None and not predicate():
            raise self.error

    def wait_quietly(self, predicate: Callable[[], bool]) -> None:
        """(lock held) Like :meth:`wait`, but a background error ends the wait silently."""
        self._wait_for(lambda: predicate() or self.error is not None)

    def _wait_for(self, done: Callable[[], bool]) -> None:
        """(lock held) Release the lock until ``done()`` — or, in the background's loop
        mode, run the work queued on this thread until then (``statestores.bgloop``)."""
        background.wait_until(done, lambda: self.cond.wait_for(done))

    def notify(self) -> None:
        """(lock held) Wake threads waiting in :meth:`wait` (after installing results)."""
        self.cond.notify_all()
