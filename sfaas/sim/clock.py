"""A virtual-time asyncio event loop: ``loop.time()`` is simulated, and a loop with nothing
ready jumps to its next timer instead of sleeping.

:class:`VirtualLoop` is asyncio's own ``SelectorEventLoop`` with two parts swapped: its
``time()`` reads a :class:`VirtualClock`, and its selector (:class:`_NeverBlocks`) polls the
loop's self-pipe without waiting and then *advances* the clock by the timeout the loop asked
to wait — so the earliest timer is due at once. ``await asyncio.sleep(3600)`` returns after
no wall time, with ``loop.time()`` exactly 3600 later (for sleeps whose sums are exact in
floating point; otherwise within one rounding). Work done between awaits takes no virtual
time: only waiting moves the clock.

Deterministic as long as the code under it takes its time, randomness and input from the
loop: asyncio runs ready callbacks in FIFO order and timers by (deadline, order of
scheduling), so one seed gives one run. What breaks that, and what this loop does about it:

* **real sockets, pipes, subprocesses and DNS** — their readiness comes from outside. The
  loop refuses them (:class:`RealIOError`): ``create_connection``, ``create_server``,
  ``open_connection`` (through them), ``sock_*``, ``getaddrinfo``, ``subprocess_*``,
  ``add_reader``/``add_writer``; the selector refuses any descriptor but the self-pipe.
* **threads** — ``run_in_executor`` (so ``asyncio.to_thread``) runs the function inline, at
  once, on the loop's thread: a thread's finishing time would be the wall clock's. A
  thread started by other means and calling ``call_soon_threadsafe`` is not detected; the
  loop then advances past timers while it works.
* **wall-clock reads** — ``time.time()``, ``time.monotonic()``, ``datetime.now()`` in the
  code under test see real time. Not patched: the product's are the clock port to add
  (sfaas/sim/README.md).
* **unseeded randomness** — ``random.random()``, ``uuid4()``, ``os.urandom``, set and dict
  order of str keys across processes (``PYTHONHASHSEED``). :func:`run` hands one
  ``random.Random(seed)`` out as ``loop.random``; the simulated parts draw from it.

A loop with nothing ready, no timer and no thread to wait for can never make progress:
:class:`Stuck` is raised instead of blocking forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, TypeVarTuple, Unpack

__all__ = ["VirtualClock", "VirtualLoop", "RealIOError", "Stuck", "run"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class RealIOError(RuntimeError):
    """The code under the virtual loop used a real socket, pipe, process or resolver."""


class Stuck(RuntimeError):
    """Nothing is ready, no timer is set: the run can never go on (a deadlock)."""


class VirtualClock:
    """Seconds of simulated time; only :meth:`advance` moves it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` (>= 0) pass; a blocking call that takes time (the simulated object
        store's latency) calls this from inside a callback."""
        if seconds < 0:
            raise ValueError(f"time never goes back: advance({seconds})")
        self.now += seconds


class _NeverBlocks(selectors.BaseSelector):
    """Polls a real selector without waiting; a wait it was asked for passes on the clock."""

    def __init__(self, clock: VirtualClock) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = clock
        #: the one descriptor allowed (the loop's self-pipe, registered first)
        self._self_pipe: int | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self._real.register(fileobj, events, data)
        if self._self_pipe is None:
            self._self_pipe = key.fd
        elif key.fd != self._self_pipe:
            self._real.unregister(fileobj)
            raise RealIOError(f"descriptor {key.fd} registered with the virtual loop: real I/O "
                              "makes a run depend on the outside world")
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready:
            return ready
        if timeout is None:
            raise Stuck("the virtual loop has nothing ready and no timer: every task waits "
                        "for something that can never happen")
        self._clock.advance(timeout)
        return []

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Any:
        return self._real.get_map()


def _refuse(what: str) -> Callable[..., Any]:
    def refused(self: VirtualLoop, *args: Any, **kwargs: Any) -> Any:
        raise RealIOError(f"{what} under the virtual loop: a simulation has no real I/O "
                          "(give the code a simulated port instead)")
    refused.__name__ = what
    return refused


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on simulated time (see the module docstring). ``random`` is the run's
    one source of randomness."""

    def __init__(self, clock: VirtualClock | None = None, seed: int = 0) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        self.random = random.Random(seed)
        super().__init__(_NeverBlocks(self.clock))

    def time(self) -> float:
        return self.clock.now

    def run_in_executor(self, executor: concurrent.futures.Executor | None,
                        func: Callable[[Unpack[Ts]], T], *args: *Ts) -> asyncio.Future[T]:
        """Run ``func(*args)`` now, inline (a thread would finish in wall time)."""
        fut: asyncio.Future[T] = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            fut.set_exception(exc)
        return fut

    def set_default_executor(self, executor: concurrent.futures.Executor) -> None:
        raise RealIOError("the virtual loop runs executor work inline; it takes no executor")

    create_connection = _refuse("create_connection")
    create_server = _refuse("create_server")
    create_unix_connection = _refuse("create_unix_connection")
    create_unix_server = _refuse("create_unix_server")
    create_datagram_endpoint = _refuse("create_datagram_endpoint")
    connect_accepted_socket = _refuse("connect_accepted_socket")
    sock_connect = _refuse("sock_connect")
    sock_accept = _refuse("sock_accept")
    sock_recv = _refuse("sock_recv")
    sock_sendall = _refuse("sock_sendall")
    getaddrinfo = _refuse("getaddrinfo")
    getnameinfo = _refuse("getnameinfo")
    subprocess_exec = _refuse("subprocess_exec")
    subprocess_shell = _refuse("subprocess_shell")
    connect_read_pipe = _refuse("connect_read_pipe")
    connect_write_pipe = _refuse("connect_write_pipe")

    def add_reader(self, fd: Any, callback: Callable[[Unpack[Ts]], Any], *args: *Ts) -> None:
        raise RealIOError(f"add_reader({fd}) under the virtual loop: a simulation has no real I/O")

    def add_writer(self, fd: Any, callback: Callable[[Unpack[Ts]], Any], *args: *Ts) -> None:
        raise RealIOError(f"add_writer({fd}) under the virtual loop: a simulation has no real I/O")


def run(coro: Coroutine[Any, Any, T], *, seed: int, start: float = 0.0) -> T:
    """Run ``coro`` to its end on a fresh :class:`VirtualLoop` seeded with ``seed`` (what
    ``asyncio.run`` does for a real loop: the loop is closed after, its async generators
    finalized, the tasks left cancelled)."""
    loop = VirtualLoop(VirtualClock(start), seed)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: VirtualLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
