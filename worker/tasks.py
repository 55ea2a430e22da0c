"""The tasks a worker starts on the fly (its parts start and stop through
:class:`sfaas.runtime.lifecycle.Lifecycle`)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["Tasks"]

class Tasks:
    """The tasks a worker starts on the fly (epochs, served calls, commits): a reference
    keeps each from being garbage collected mid-flight; a recovery cancels them all."""

    def __init__(self) -> None:
        self.running: set[asyncio.Future[Any]] = set()

    def add(self, task: asyncio.Future[Any]) -> None:
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self.add(task)
        return task

    def cancel(self) -> list[asyncio.Future[Any]]:
        """Cancel every task running; returns them (to wait for)."""
        running = list(self.running)
        for t in running:
            t.cancel()
        return running
