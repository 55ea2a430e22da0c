"""A primary's side of the standbys: every partition store shipped over ``tcp``.

With snapshot rounds on each worker runs a replication server; with ``standbys`` > 0 it ships
every partition store (``worker.protocols.rescale`` ships only the stores of partitions moving away
in a rescale). The server is the process's replica port's (``sfaas.runtime.ports``: a
:class:`statestores.replica.TcpServer`, the simulator's in its run; port sent to the
coordinator in ``Register.repl_port``) with a :class:`~statestores.replica.Shipper` per
shipped store, named :func:`store_name`. Every flush and merge the store does is
shipped as it happens — the run files with their footers, the log files with their hints
— and every completed snapshot's file list with it; a standby installs them and never
merges (``worker.protocols.standby``). Shipping costs this worker a hard link per new file on the
store's maintainer thread, and ``sendfile`` per follower. A round's report waits (at most
:data:`MARK_WAIT`) until the standbys acknowledged the round's snapshot marks, so the
round the coordinator promotes a standby to is one whose files the standby holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from sfaas.runtime import ports
from sfaas.runtime.lifecycle import Service
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import StoreKey
from statestores import Store
from statestores.replica import Shipper

log = logging.getLogger("sfaas.worker.replication")

__all__ = ["Replication", "Shipping", "store_name", "MARK_WAIT"]

#: Seconds a round's report waits for the standbys to hold the round (a standby that is
#: slower only costs a download if it is promoted right then).
MARK_WAIT = 2.0


def store_name(operator: str, partition: int) -> str:
    """How a primary names the store of ``operator``'s ``partition`` to its standbys."""
    return f"{operator}.p{partition}"


class Shipping:
    """The replication server of one primary worker (see the module docstring)."""

    def __init__(self, settings: Settings, secret: str) -> None:
        self._shippers: dict[str, Shipper] = {}
        self.server = ports.current().replica.serve(self._shippers.get, secret, settings.host)
        self.port = self.server.address[1]

    def attach(self, stores: Mapping[StoreKey, Store]) -> dict[StoreKey, int]:
        """Ship every store of ``stores`` (called once they are open; a store shipped
        already keeps its shipper); returns each store's version now."""
        seqs = {}
        for (op, p), store in stores.items():
            name = store_name(op, p)
            sh = self._shippers.get(name)
            if sh is None:
                sh = self._shippers[name] = Shipper(store, name=name)
            seqs[(op, p)] = sh.seq
        log.info("shipping %d stores on port %d", len(self._shippers), self.port)
        return seqs

    def detach(self, keys: Iterable[StoreKey]) -> None:
        """Stop shipping these stores (they moved away; before they close)."""
        for op, p in keys:
            sh = self._shippers.pop(store_name(op, p), None)
            if sh is not None:
                sh.close()

    @property
    def followed(self) -> bool:
        """Does any store have a follower (standby or receiver) now?"""
        return any(sh.followers for sh in list(self._shippers.values()))

    async def wait_marks(self, round_id: int, timeout: float = MARK_WAIT) -> bool:
        """Wait until every store's standby (if one follows it) acknowledged round
        ``round_id``'s snapshot mark, so a standby promoted after the round completes holds
        all its files; False (logged) if one did not within ``timeout`` seconds. Woken by
        each acknowledgement (``Shipper.on_ack``, on the transport's thread): the loop runs
        on meanwhile, and a standby driven on it (the simulator's) acknowledges."""
        loop = asyncio.get_running_loop()
        news = asyncio.Event()
        shippers = list(self._shippers.items())

        def poke() -> None:  # (a transport's thread; an ack after the loop closed is moot)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(news.set)

        offs = [sh.on_ack(poke) for _n, sh in shippers]
        deadline = loop.time() + timeout
        try:
            for name, sh in shippers:
                if sh.followers and not await _acked(sh, round_id, news, deadline):
                    log.warning("round %d: the standby of %s did not acknowledge its snapshot "
                                "within %.1f s; a promotion now would download what it lacks",
                                round_id, name, timeout)
                    return False
            return True
        finally:
            for off in offs:
                off()

    def close(self) -> None:
        """Stop serving standbys and drop the staged links (before the stores close)."""
        self.server.close()
        for sh in self._shippers.values():
            sh.close()
        self._shippers.clear()


async def _acked(sh: Shipper, round_id: int, news: asyncio.Event, deadline: float) -> bool:
    """Has ``sh``'s follower acknowledged round ``round_id``, waiting on ``news`` until
    the loop's ``deadline``?"""
    loop = asyncio.get_running_loop()
    while not (sh.acked(round_id) or sh.closed) and (left := deadline - loop.time()) > 0:
        news.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(news.wait(), left)
    return sh.acked(round_id)


class Opened(Protocol):
    """The slot's stores, once open (``worker.startup.Stores``): what starting ships."""

    @property
    def opened(self) -> Mapping[StoreKey, Store] | None: ...


class Replication(Service):
    """The replication server as a service (``worker.startup``): :meth:`open` listens
    before the join (the port goes in the ``Register``; on with rounds or standbys, since
    rescales ship stores too); starting ships every store of the slot (with standbys);
    stopping closes the server before the stores close. Fills ``worker.needs.Standbys``."""

    part = "shipping"

    def __init__(self, settings: Settings, secret: str) -> None:
        self._settings = settings
        self._secret = secret
        self._stores: Opened | None = None
        #: the replication server (None: off, or not listening yet)
        self.shipping: Shipping | None = None

    def ships(self, stores: Opened) -> Replication:
        """Starting ships ``stores`` (with standbys)."""
        self._stores = stores
        return self

    def open(self) -> None:
        s = self._settings
        if s.standbys > 0 or s.snapshot_interval > 0:
            self.shipping = Shipping(s, self._secret)

    @property
    def port(self) -> int:
        """Where standbys and receivers reach the server (0: none)."""
        return self.shipping.port if self.shipping is not None else 0

    async def on_start(self) -> None:
        opened = self._stores.opened if self._stores is not None else None
        if self.shipping is not None and self._settings.standbys > 0 and opened is not None:
            self.shipping.attach(opened)

    async def on_stop(self) -> None:
        if self.shipping is not None:
            self.shipping.close()
