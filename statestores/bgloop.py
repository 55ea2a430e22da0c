"""The ``loop`` mode of :mod:`statestores.background`, and the stores' serial executors.

In the ``loop`` mode no thread and no process runs background work: a task runs *later*
on the asyncio event loop of the thread that submitted it (``call_soon``; a
:class:`Serial`'s task at its start time, ``call_at``), one at a time, on that thread. It
still interleaves with what the loop runs meanwhile, as on a thread — but in an order the
loop alone decides, so a program on a deterministic loop (the simulator's virtual-time
loop, ``sfaas.sim.clock``) runs its stores' uploads deterministically too. For one core
without threads, and the simulator; every task then costs the loop's own time.

Two rules keep it from waiting for ever:

- **A waiter runs the task.** :meth:`Deferred.result` (or ``exception``) of a task not
  started yet runs it right there, on the waiter's thread — the loop's, which would
  otherwise never get to it (an upload waiting for its ``ship``, a restore waiting for the
  uploads queued before it). A serial task first runs those queued before it. The rule
  every store keeps — no lock held while waiting for background work — is what makes
  running it there safe: its done-callbacks run with no store lock held, as on a
  dispatcher thread.
- **A wait for background work does it.** Every other wait for it — a store's
  ``tasks.wait`` for a hand-off or a merge, a frozen region's future, the maintainer's
  inbox — runs the oldest work not started yet, one task at a time, until its condition
  holds (:func:`help_until`); the waits a store makes with its lock held release it on a
  thread, and the lock is re-entrant here (one thread does all the work).
- **No running loop, no deferral**: a task submitted where no event loop runs (a store
  closed after its loop ended) runs at once, on the caller's thread.

A store's maintainer (``statestores.maintainer``) runs its inbox the same way: a
:class:`LoopSerial` of its own, no thread.

Queues are bounded as the lanes' are (:data:`statestores.background.MAX_QUEUED` tasks
queued, not started, per lane and per serial executor: :class:`BackgroundBusy` beyond).
"""

from __future__ import annotations

import abc
import asyncio
import collections
import concurrent.futures
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .errors import BackgroundBusy

__all__ = ["Deferred", "LoopLanes", "Serial", "ThreadSerial", "LoopSerial", "running_loop",
           "help_until"]

#: per event loop, its loop-mode tasks queued and not started, oldest first (what
#: :func:`help_until` runs; a loop that ended takes its leftovers with it)
_unstarted: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Deferred]] = (
    weakref.WeakKeyDictionary())


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Deferred(concurrent.futures.Future[Any]):
    """A loop-mode task: run by the loop later, or at once by a caller that waits for it
    (see the module docstring). ``started``: called as it starts (its queue's count);
    ``before``: run first when a waiter runs it (a serial executor's earlier tasks)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop | None,
                 started: Callable[[Deferred], None],
                 before: Callable[[Deferred], None] | None = None,
                 charge: Callable[[float], None] | None = None) -> None:
        super().__init__()
        self._registry = None if loop is None else _unstarted.setdefault(loop, {})
        self._fn: Callable[..., Any] | None = fn
        self._args = args
        self._started = started
        self._before = before
        self._charge = charge
        self.begun = False
        if self._registry is not None:
            self._registry[id(self)] = self

    def run(self) -> None:
        """Run the task unless it began already (the loop's callback, or a waiter's)."""
        if self.begun:
            return
        self.begun = True
        if self._registry is not None:
            self._registry.pop(id(self), None)
        self._started(self)
        fn, args = self._fn, self._args
        self._fn, self._args = None, ()  # (drop the arguments — a memtable — once run)
        if fn is None or not self.set_running_or_notify_cancel():
            return
        t0 = time.thread_time()
        try:
            result = fn(*args)
        except BaseException as exc:
            self._charged(t0)
            self.set_exception(exc)
        else:
            self._charged(t0)
            self.set_result(result)

    def _charged(self, t0: float) -> None:
        if self._charge is not None:
            self._charge(time.thread_time() - t0)

    def _run_if_waiting(self) -> None:
        if self.done():
            return
        if self.begun:  # running, and waited for on the thread that runs it
            raise RuntimeError("a loop-mode background task waits for itself")
        self.run_now()

    def run_now(self) -> None:
        """Run it now: first what its executor queued before it (a waiter's, a helper's)."""
        if self._before is not None:
            self._before(self)
        self.run()

    def result(self, timeout: float | None = None) -> Any:
        self._run_if_waiting()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._run_if_waiting()
        return super().exception(timeout)


def help_until(done: Callable[[], bool]) -> None:
    """Wait for background work on the thread that does it (see the module docstring):
    run the oldest task not started until ``done()``. Raises ``RuntimeError`` when nothing
    is left to run and ``done()`` is still false (a wait that would never end)."""
    loop = running_loop()
    queue = _unstarted.get(loop) if loop is not None else None
    while not done():
        if not queue:
            raise RuntimeError("a wait for background work that no queued task will end "
                               "(loop mode)")
        next(iter(queue.values())).run_now()


class LoopLanes:
    """The lanes of the loop mode: how many tasks each has queued, not started."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._queued: dict[str, int] = collections.defaultdict(int)
        self._lock = threading.Lock()  # (submits from several threads: no loop-mode use)

    def submit(self, lane: str, fn: Callable[..., Any], args: tuple[Any, ...],
               charge: Callable[[float], None]) -> Deferred:
        loop = running_loop()
        with self._lock:
            if loop is not None and self._queued[lane] >= self.bound:
                raise BackgroundBusy(f"background lane {lane!r} has {self.bound} tasks queued "
                                     "on the event loop; try again later")
            self._queued[lane] += 1
        task = Deferred(fn, args, loop, lambda _: self._took(lane), charge=charge)
        if loop is None:
            task.run()  # (counted out again at once)
        else:
            loop.call_soon(task.run)
        return task

    def _took(self, lane: str) -> None:
        with self._lock:
            self._queued[lane] = max(0, self._queued[lane] - 1)


class Serial(abc.ABC):
    """Runs tasks one at a time, in submit order (a store's uploads): see
    :func:`statestores.background.serial`."""

    @abc.abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any,
               not_before: float = 0.0) -> concurrent.futures.Future[Any]:
        """Queue ``fn(*args)``, to start at ``not_before`` at the earliest."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Run (or wait for) what is queued, then end."""


class ThreadSerial(Serial):
    """A thread of its own (started by the first task); ``not_before`` is the task's own
    to wait for (``statestores.background.wait``)."""

    def __init__(self, name: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., Any], *args: Any,
               not_before: float = 0.0) -> concurrent.futures.Future[Any]:
        return self._pool.submit(fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class LoopSerial(Serial):
    """The loop mode's: each task starts on the loop at ``not_before`` (the loop's
    ``time()``) at the earliest, after every task submitted before it."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._queue: collections.deque[tuple[Deferred, float]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    def submit(self, fn: Callable[..., Any], *args: Any,
               not_before: float = 0.0) -> concurrent.futures.Future[Any]:
        loop = running_loop()
        if loop is not None and len(self._queue) >= self.bound:
            raise BackgroundBusy(f"a serial executor has {self.bound} tasks queued on the "
                                 "event loop; try again later")
        task = Deferred(fn, args, loop, self._took, before=self._run_before)
        if loop is None:
            self._run_before(task)
            task.run()
            return task
        self._queue.append((task, not_before))
        if self._timer is None:
            self._schedule(loop)
        return task

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._queue:
            self._timer = loop.call_at(max(self._queue[0][1], loop.time()), self._next, loop)

    def _next(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self._queue:
            self._queue[0][0].run()
        self._schedule(loop)

    def _took(self, task: Deferred) -> None:
        """(as ``task`` starts) Out of the queue: it is the head (tasks start in order)."""
        if self._queue and self._queue[0][0] is task:
            self._queue.popleft()

    def _run_before(self, task: Deferred) -> None:
        """A waiter runs ``task`` now: first every task queued before it."""
        while self._queue and self._queue[0][0] is not task:
            self._queue[0][0].run()

    def shutdown(self) -> None:
        while self._queue:
            self._queue[0][0].run()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
