"""A process's long-lived parts as services: started in dependency order, stopped in reverse.

A :class:`Service` (in the style of mode's, faust's service model) declares the services
that must run before it (:meth:`Service.requires`, or an override of
:meth:`Service.dependencies`) and what starting and stopping it do (:meth:`Service.on_start`,
:meth:`Service.on_stop`). :meth:`Service.start` on the process's root service starts every
service it depends on, depth first and each once, then the root; :meth:`Service.stop` is
the one way to stop: it stops every service the start began, newest first.

A service's stop runs once its start began, even if the start failed or was cancelled
(the coordinator cancelled while it waits for its workers still tells those registered
to stop), so an ``on_stop`` must cope with a partial start. A stop that fails is logged and
the next still runs, so a Kafka error at shutdown cannot leave the stores open. A start that
fails is logged naming the part, the exception gets a note naming it too, and the parts
started so far are stopped before it propagates (its type unchanged: callers act on it).

:class:`Lifecycle` is the list of stops underneath: each :meth:`Service.start` keeps the
stops of what it began on one.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Self

__all__ = ["Lifecycle", "Service", "start_order"]

log = logging.getLogger("sfaas.lifecycle")

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


class Service:
    """A long-lived part of a process (see the module docstring). Subclasses name the part
    (:attr:`part`, for logs and errors) and override :meth:`on_start` and :meth:`on_stop`;
    neither is required."""

    #: the part's name in logs and errors ("" : the class's name)
    part: str = ""
    #: the services declared with :meth:`requires`
    _required: tuple[Service, ...] = ()
    #: the stops of what :meth:`start` began (None: not started)
    _running: Lifecycle | None = None

    @property
    def label(self) -> str:
        return self.part or type(self).__name__

    def requires(self, *services: Service) -> Self:
        """Declare that ``services`` must run before this one starts (and stop after it)."""
        self._required = (*self._required, *services)
        return self

    def dependencies(self) -> Sequence[Service]:
        """The services that must run before this one starts, in the order to start them."""
        return self._required

    async def on_start(self) -> None:
        """Begin the part's work (its dependencies run already)."""

    async def on_stop(self) -> None:
        """End the part's work; runs once :meth:`on_start` began, also if it failed."""

    async def start(self) -> None:
        """Start the services this one depends on, in :func:`start_order`, then this one."""
        if self._running is not None:
            raise RuntimeError(f"{self.label} is started already")
        self._running = running = Lifecycle(log)
        for service in start_order(self):
            running.started(service.label, service.on_stop)
            log.debug("starting %s", service.label)
            try:
                await service.on_start()
            except Exception as exc:
                log.error("%s did not start: %s", service.label, exc)
                exc.add_note(f"(while starting {service.label})")
                await self.stop()
                raise
            except BaseException:  # cancelled: what began stops all the same
                await self.stop()
                raise

    async def stop(self) -> None:
        """Stop every service :meth:`start` began, newest first (nothing if not started)."""
        running, self._running = self._running, None
        if running is not None:
            await running.stop()


def start_order(root: Service) -> list[Service]:
    """``root``'s dependencies, depth first and each once, then ``root``: each service comes
    after every service it depends on. A cycle is a wiring error, raised naming it."""
    order: list[Service] = []
    placed: set[int] = set()

    def visit(service: Service, path: tuple[Service, ...]) -> None:
        if id(service) in placed:
            return
        if any(s is service for s in path):
            first = next(i for i, s in enumerate(path) if s is service)
            cycle = [s.label for s in path[first:]] + [service.label]
            raise ValueError(f"services depend on each other in a cycle: {' → '.join(cycle)}")
        for dep in service.dependencies():
            visit(dep, (*path, service))
        placed.add(id(service))
        order.append(service)

    visit(root, ())
    return order
