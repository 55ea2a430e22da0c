"""An event loop of its own on a daemon thread: what lets one :class:`~sfaas.testing.LocalRunner`
serve blocking callers and coroutines of any event loop alike.

A coroutine handed to :meth:`LoopThread.run` (blocking) or :meth:`LoopThread.arun` (awaited
from any loop) runs on this loop, so everything it touches is touched on one thread only.
The thread starts on first use and :meth:`LoopThread.stop` ends it: the tasks still running
are cancelled and the loop closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """A lazily started event loop on a daemon thread named ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def thread(self) -> threading.Thread | None:
        """The thread, once started (None before, and after :meth:`stop`)."""
        return self._thread

    def on_it(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block until it ends: its result, or its exception
        raised here (not chained to anything)."""
        if self.on_it():
            coro.close()
            raise RuntimeError(f"a blocking call on the {self.name} thread itself would wait "
                               "for itself: await the call's async form there")
        fut = self._submit(coro)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # (a timeout or ^C in the caller: the coroutine need not go on)
            raise

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop, awaited from the caller's loop (any loop; cancelling
        the caller cancels ``coro``)."""
        return await asyncio.wrap_future(self._submit(coro))

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            loop = self._started()
        except BaseException:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"the {self.name} thread was stopped")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_serve, args=(loop,), name=self.name,
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def stop(self) -> None:
        """Cancel what still runs on the loop, close it and wait for the thread to end (at
        once if it never started; again, nothing). Called on the thread itself (a
        finalizer the garbage collector runs there), it ends after the current step,
        unwaited."""
        on_it = self.on_it()
        with self._lock:
            self._stopped = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            if not on_it:
                thread.join()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The thread: run ``loop`` until stopped, then cancel its tasks and close it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
