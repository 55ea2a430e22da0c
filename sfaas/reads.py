"""The client's channels to the workers, and its direct state reads (``Client.get`` /
``Client.scan``); its direct calls (``sfaas.direct``) use the same channels.

A read through Kafka costs two trips through the broker. With the cluster's secret and
its coordinator's address (``Settings.secret``, ``Settings.coordinator``; a client made
from ``sfaas.launcher``'s ``cluster_settings`` has both), a client instead asks the
coordinator where the partitions are (``Where`` → ``Placement``) and sends each read to
the worker owning its partition over an authenticated channel (``Read`` →
``ReadReply``): the same answer — committed state between two commits, see
``worker.protocols.reads`` — without the broker. Whenever that path cannot answer (no
coordinator there, a wrong secret, a recovery or a rescale under way, a worker gone),
:meth:`DirectReads.read` says so and the client reads through Kafka; after a failure
to connect it asks the coordinator again and does not try for a while — :data:`RETRY_FIRST`
seconds, doubled with each failure in a row up to :data:`RETRY_AFTER` — and never after its
secret was refused (a wrong secret does not fix itself, and each try is logged by the
server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from sfaas.errors import AuthenticationError, ChannelClosed, reply_error
from sfaas.runtime import channels, wire
from sfaas.runtime.protocols.reads import NOT_HERE
from sfaas.runtime.settings import DEV_SECRET, Settings

log = logging.getLogger("sfaas.client")

__all__ = ["DirectReads", "Unavailable", "RETRY_FIRST", "RETRY_AFTER", "CONNECT_TIMEOUT"]

#: Seconds a client reads through Kafka after the direct path failed to connect: the first
#: failure in a row turns it off for RETRY_FIRST, each next one for twice as long, up to
#: RETRY_AFTER; a read answered directly starts the count again. (A recovery takes about a
#: second; a flat 5 s kept a client on Kafka seconds after it, and each unlucky try — the
#: lost worker's old address, a coordinator still recovering — cost 5 s more.)
RETRY_FIRST = 0.25
RETRY_AFTER = 5.0
#: Seconds to connect to the coordinator or a worker.
CONNECT_TIMEOUT = 1.0
#: Seconds to wait for a worker's answer before reading through Kafka instead.
ANSWER_TIMEOUT = 5.0


class Unavailable(Exception):
    """The direct path cannot answer this read (read through Kafka)."""


class DirectReads:
    """Direct reads of one client (see the module docstring)."""

    def __init__(self, settings: Settings, app: str) -> None:
        self._settings = settings
        self._app = app
        self._secret = settings.secret or DEV_SECRET
        self._coordinator: channels.Channel | None = None
        self._placement: wire.Placement | None = None
        self._asking: asyncio.Future[wire.Placement] | None = None
        self._workers: dict[tuple[str, int], channels.Channel] = {}
        self._readers: set[asyncio.Task[None]] = set()
        #: reads waiting for an answer: id → (the worker's channel, the future)
        self._pending: dict[int, tuple[channels.Channel, asyncio.Future[wire.ReadReply]]] = {}
        self._ids = 0
        self._lock = asyncio.Lock()
        self._off_until = 0.0
        self._failures = 0  # failed connects in a row (how long the next is off)
        #: reads answered directly, and reads handed back to Kafka
        self.direct = 0
        self.fell_back = 0
        #: why the last read handed back to Kafka was not answered directly
        self.why_not = ""
        #: where a worker's ``Answer`` goes (``sfaas.direct.DirectCalls``), and who hears
        #: of a worker's channel closing
        self.on_answer: Callable[[channels.Channel, wire.Answer], None] | None = None
        self.on_closed: Callable[[channels.Channel], None] | None = None

    @property
    def available(self) -> bool:
        """Whether the direct path may be tried now (see :data:`RETRY_AFTER`)."""
        return time.monotonic() >= self._off_until

    async def read(self, operator: str, partition: int, key: str, prefix: str = "",
                   limit: int = 0) -> tuple[bool, Any]:
        """``(True, value)``: answered directly (an error the worker named is raised, as a
        read through Kafka would); ``(False, None)``: read through Kafka instead."""
        if time.monotonic() < self._off_until:
            self.fell_back += 1
            self.why_not = "the direct path is off after a failure (see RETRY_AFTER)"
            return False, None
        for attempt in range(2):
            try:
                reply = await self._ask(wire.Read(0, operator, partition, key, prefix, limit),
                                        fresh=attempt > 0)
            except Unavailable as exc:
                log.debug("direct read unavailable (%s): reading through Kafka", exc)
                self.why_not = str(exc)
                break
            if reply.ok:
                self.direct += 1
                self._failures = 0
                return True, reply.value
            if reply.error_type != NOT_HERE:
                raise reply_error(reply.error_type or "BadRequest", reply.reason)
            self.why_not = reply.reason
            self._placement = None  # ask the coordinator again
        self.fell_back += 1
        return False, None

    async def _ask(self, msg: wire.Read, fresh: bool) -> wire.ReadReply:
        placement = await self.where(fresh)
        if not placement.owners or not 0 <= msg.partition < len(placement.owners):
            raise Unavailable("no placement (a recovery or a rescale is under way)")
        peer = placement.peers[placement.owners[msg.partition]]
        chan = await self.worker(peer.host, peer.port)
        self._ids += 1
        msg.id = self._ids
        fut: asyncio.Future[wire.ReadReply] = asyncio.get_running_loop().create_future()
        self._pending[msg.id] = (chan, fut)
        try:
            chan.send(msg)
            return await asyncio.wait_for(fut, ANSWER_TIMEOUT)
        except (TimeoutError, ChannelClosed) as exc:
            raise Unavailable(f"worker {peer.host}:{peer.port}: {type(exc).__name__}") from None
        finally:
            self._pending.pop(msg.id, None)

    async def where(self, fresh: bool = False) -> wire.Placement:
        """Where the partitions are (the coordinator's last answer, unless ``fresh``);
        raises :class:`Unavailable` when the coordinator cannot be asked."""
        if self._placement is not None and not fresh:
            return self._placement
        async with self._lock:  # one question at a time; the others take its answer
            if self._placement is not None and not fresh:
                return self._placement
            if self._coordinator is None or self._coordinator.closed:
                host, _, port = self._settings.coordinator.rpartition(":")
                if not port.isdigit():
                    self._off_until = float("inf")  # (no coordinator to ask: Kafka only)
                    raise Unavailable(f"coordinator address {self._settings.coordinator!r} "
                                       "has no port")
                self._coordinator = await self._connect(host, int(port))
            chan = self._coordinator
            chan.send(wire.Where(self._app))
            try:
                msgs = await asyncio.wait_for(chan.recv(), ANSWER_TIMEOUT)
            except (TimeoutError, ChannelClosed) as exc:
                chan.close()
                self._coordinator = None
                raise Unavailable(f"the coordinator did not answer: {type(exc).__name__}") \
                    from None
            got = next((m for m in msgs if isinstance(m, wire.Placement)), None)
            if got is None:
                raise Unavailable("the coordinator answered something else than a placement")
            self._placement = got if got.owners else None
            return got

    async def _connect(self, host: str, port: int) -> channels.Channel:
        try:
            return await channels.connect(host, port, self._secret, timeout=CONNECT_TIMEOUT)
        except AuthenticationError as exc:  # another secret: it will not change, Kafka it is
            self._off_until = float("inf")
            raise Unavailable(f"{host}:{port} refused this client's secret: {exc}") from None
        except Exception as exc:  # refused, unreachable: Kafka for a while
            self._off_until = time.monotonic() + min(RETRY_AFTER,
                                                     RETRY_FIRST * 2 ** self._failures)
            self._failures = min(self._failures + 1, 30)  # (2 ** n stays a float for ever)
            raise Unavailable(f"cannot connect to {host}:{port}: {exc}") from None

    async def worker(self, host: str, port: int) -> channels.Channel:
        """The channel to the worker at ``host:port`` (connected on first use); raises
        :class:`Unavailable` when it cannot be reached."""
        chan = self._workers.get((host, port))
        if chan is not None and not chan.closed:
            return chan
        try:
            chan = await self._connect(host, port)
        except Unavailable:
            self._placement = None  # (a worker that was lost: ask the coordinator again)
            raise
        self._workers[(host, port)] = chan
        task = asyncio.get_running_loop().create_task(self._replies(chan))
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)
        return chan

    async def _replies(self, chan: channels.Channel) -> None:
        """Hand each of a worker's answers to the read waiting for it."""
        try:
            while True:
                for m in await chan.recv():
                    if isinstance(m, wire.Answer):
                        if self.on_answer is not None:
                            self.on_answer(chan, m)
                        continue
                    waiting = self._pending.get(m.id) if isinstance(m, wire.ReadReply) else None
                    if waiting is not None and waiting[0] is chan and not waiting[1].done():
                        waiting[1].set_result(m)  # type: ignore[arg-type]
        except (ChannelClosed, wire.ProtocolError):
            pass
        finally:
            chan.close()
            self._placement = None
            if self.on_closed is not None:
                self.on_closed(chan)
            for c, fut in list(self._pending.values()):
                if c is chan and not fut.done():
                    fut.set_exception(ChannelClosed("the worker closed the channel"))

    async def close(self) -> None:
        for chan in [*self._workers.values(), *([self._coordinator] if self._coordinator else [])]:
            chan.close()
        for task in list(self._readers):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._workers.clear()
        self._coordinator = None
