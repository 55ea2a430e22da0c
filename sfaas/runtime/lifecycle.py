"""A process's parts, started in order and stopped in reverse, each stop on its own.

A part is registered once it starts (:meth:`Lifecycle.started`, or before its start by
:func:`run_steps`, so a stop must cope with a partial start); :meth:`Lifecycle.stop` stops
every registered part, newest first. A stop that fails is logged and the next still runs,
so a Kafka error at shutdown cannot leave the stores open. The worker registers its parts
as its start-up learns what it holds; the coordinator's parts are one fixed list of
:class:`Step`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Lifecycle", "Step", "run_steps"]

Stop = Callable[[], Awaitable[None] | None]


class Lifecycle:
    """The stops of the parts started so far (see the module docstring)."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._stops: list[tuple[str, Stop]] = []

    @property
    def parts(self) -> list[str]:
        """The parts started, in order."""
        return [name for name, _ in self._stops]

    def started(self, name: str, stop: Stop) -> None:
        """Part ``name`` runs now; ``stop()`` (a function or a coroutine function) ends it."""
        self._stops.append((name, stop))

    async def stop(self) -> None:
        """Stop every part started, in reverse order."""
        while self._stops:
            name, stop = self._stops.pop()
            try:
                done = stop()
                if inspect.isawaitable(done):
                    await done
                self._log.debug("stopped %s", name)
            except Exception:
                self._log.exception("stopping %s failed", name)


async def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Step:
    """A part's start and stop (either may be nothing)."""

    name: str
    start: Callable[[], Awaitable[None]] = _nothing
    stop: Callable[[], Awaitable[None]] = _nothing


async def run_steps(steps: list[Step], body: Callable[[], Awaitable[None]],
                    log: logging.Logger) -> None:
    """Start ``steps`` in order, run ``body``, then stop the steps begun in reverse order."""
    parts = Lifecycle(log)
    try:
        for step in steps:
            parts.started(step.name, step.stop)
            log.debug("starting %s", step.name)
            await step.start()
        await body()
    finally:
        await parts.stop()
