"""The coordinator's port: every channel opened to it, handed to the part it is for.

A channel's first frame says who opened it: a worker's ``Register`` goes to the membership
(``coordinator.membership``), ``sfaas scale``'s ``Scale`` to the rescale
(``coordinator.protocols.rescale``), a client's ``Where`` to the placements
(``coordinator.protocols.reads``); anything else is dropped. As a service it listens once
the cluster's layout is known (workers register against it) and stops listening when
stopped.
"""

from __future__ import annotations

import asyncio
import logging

from coordinator.needs import Clients, Registrations, ScaleRequests
from coordinator.state import ClusterView
from sfaas.runtime import channels, wire
from sfaas.runtime.lifecycle import Service

log = logging.getLogger("sfaas.coordinator")

__all__ = ["Listener"]


class Listener(Service):
    """Listens on ``host:port`` (port 0: any) for channels proving ``secret`` (see the
    module docstring); ``app``: the app's name, for the log."""

    part = "listener"

    def __init__(self, host: str, port: int, secret: str, app: str, state: ClusterView,
                 registrations: Registrations, scales: ScaleRequests,
                 clients: Clients) -> None:
        self._where = (host, port)
        self._secret = secret
        self._app = app
        self._state = state
        self._registrations = registrations
        self._scales = scales
        self._clients = clients
        self._server: asyncio.Server | None = None
        self._bound: asyncio.Future[tuple[str, int]] | None = None

    def announce(self, bound: asyncio.Future[tuple[str, int]] | None) -> None:
        """Set ``bound`` to the address workers register at once it listens."""
        self._bound = bound

    @property
    def address(self) -> tuple[str, int]:
        """The address it listens on (once started)."""
        assert self._server is not None, "the listener has not started"
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def on_start(self) -> None:
        host, port = self._where
        self._server = await channels.serve(host, port, self._secret, self.on_connection)
        bound = self.address
        log.info("coordinator of app %s listening on %s:%d, waiting for %d workers",
                 self._app, bound[0], bound[1], self._state.slots)
        if self._bound is not None and not self._bound.done():
            self._bound.set_result(bound)

    async def on_stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def on_connection(self, chan: channels.Channel) -> None:
        """Serve one channel until it closes: hand it to the part its first frame is for."""
        msgs = await chan.recv()
        first = msgs[0] if msgs else None
        if isinstance(first, wire.Scale):
            await self._scales.request(first, chan)
        elif isinstance(first, wire.Where):  # a client's direct reads
            await self._clients.serve(chan, msgs)
        elif isinstance(first, wire.Register):
            await self._registrations.register(first, chan)
        else:
            log.warning("peer %s did not register; dropping", chan.peer)
