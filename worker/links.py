"""A worker's channels: the one to the coordinator, and one to each peer.

Both outlive what travels over them: the coordinator's channel is replaced when the worker
registers again (a standby's promotion, a restarted coordinator), a peer's when the peer
moved (a replaced worker) or the membership changed (a rescale). The parts that send hold
these holders, never a channel, so they always reach the current one.

Once the worker serves (:meth:`CoordinatorLink.listen`), a task of its own reads the
coordinator's channel: each ``Alive`` renews the worker's lease (``worker.fence``) the
moment it arrives — never behind a recovery or a commit the worker is acting on — and the
other messages wait, at most :data:`INBOX_FRAMES` frames, for :meth:`CoordinatorLink.recv`
(a full queue stops the reading: the coordinator's messages then wait in TCP). A ``Recover``
read there also tells a recovery still running that a later one waits
(:meth:`CoordinatorLink.newer_recover`). Every peer
channel is gated by the lease: what is queued on it leaves only while the lease holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sfaas.errors import AuthenticationError, ChannelClosed, StartAgain
from sfaas.runtime import channels, ports, wire
from worker.fence import FenceLease

log = logging.getLogger("sfaas.worker")

__all__ = ["CoordinatorLink", "PeerLinks", "connect_retry", "INBOX_FRAMES"]

#: Frames of the coordinator read ahead of the worker acting on them (see the docstring).
INBOX_FRAMES = 256
#: Seconds between looks at the coordinator's channel while waiting for the lease
#: (``CoordinatorLink.held_unless_closed``).
HELD_POLL = 0.1


#: Seconds one connection attempt of :func:`connect_retry` may take before the next: a
#: peer that answers does within milliseconds. An attempt started while the coordinator
#: was cut off (the nemesis' ``cut-coord``: its address unroutable, the SYN unanswered)
#: waited out the channels' 10 s timeout past the heal — the workers holding the state
#: came back 4 s after their standbys had taken their slots.
CONNECT_ATTEMPT = 1.0


async def connect_retry(host: str, port: int, secret: str,
                        timeout: float = 30.0) -> channels.Channel:
    """A channel to ``host:port``, retrying until ``timeout`` seconds passed (each attempt
    at most :data:`CONNECT_ATTEMPT` s)."""
    clock = ports.current().clock  # (the process's: virtual in the simulator)
    deadline = clock.monotonic() + timeout
    while True:
        try:
            attempt = min(CONNECT_ATTEMPT, max(0.1, deadline - clock.monotonic()))
            return await channels.connect(host, port, secret, timeout=attempt)
        except AuthenticationError as exc:
            if "shared-secret" in str(exc):
                raise
            err: Exception = exc
        except OSError as exc:  # (a TimeoutError too: this attempt's; the next may reach it)
            err = exc
        if clock.monotonic() > deadline:
            raise StartAgain(f"cannot reach {host}:{port}: {err or type(err).__name__}")
        await asyncio.sleep(0.1)


class CoordinatorLink:
    """The channel to the coordinator (none until the worker registers)."""

    def __init__(self, secret: str) -> None:
        self._secret = secret
        self.channel: Any = None  # a ``channels.Channel`` (a fake one in the tests)
        self._on_alive: Callable[[wire.Alive], None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._frames: asyncio.Queue[list[wire.Message] | None] = asyncio.Queue(INBOX_FRAMES)
        self._error: BaseException | None = None
        #: the worker's lease (``worker.fence``), renewed by the ``Alive`` read here
        self.lease: FenceLease | None = None
        #: the newest recovery attempt whose ``Recover`` was read from this channel, and the
        #: waiters of :meth:`newer_recover`
        self._newest_recover = 0
        self._recover_waiters: list[asyncio.Future[None]] = []

    async def held(self) -> None:
        """Return once the worker may act on the coordinator's behalf (see
        :meth:`worker.fence.FenceLease.held`)."""
        if self.lease is not None and not self.lease.valid():
            await self.lease.held()

    async def held_unless_closed(self) -> bool:
        """:meth:`held`, or False as soon as the coordinator's channel is closed: a worker
        that waits for the lease inside the inbox loop (a recovery's answer) must not wait
        for a coordinator that is gone — only the rejoin, which that loop runs once it sees
        the channel closed, renews the lease (the simulator's seed 309: a coordinator that
        crashed during its workers' recovery left them waiting for ever)."""
        while self.lease is not None and not self.lease.valid():
            if self.closed:
                return False
            try:
                await asyncio.wait_for(self.lease.held(), HELD_POLL)
            except TimeoutError:
                continue
        return not self.closed

    async def connect(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.channel = await connect_retry(host, port, self._secret, timeout)
        if self._on_alive is not None:
            self._read()

    def listen(self, on_alive: Callable[[wire.Alive], None]) -> None:
        """From now on a task reads the channel (this one and every later one): ``Alive``
        goes to ``on_alive`` at once, the rest waits for :meth:`recv`."""
        self._on_alive = on_alive
        self._read()

    def _read(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self._frames = asyncio.Queue(INBOX_FRAMES)
        self._error = None
        self._newest_recover = 0  # (a new coordinator counts its attempts from 1)
        self._reader = asyncio.get_running_loop().create_task(
            self._reading(self.channel, self._frames), name="coordinator-reader")

    async def _reading(self, chan: Any,
                       frames: asyncio.Queue[list[wire.Message] | None]) -> None:
        on_alive = self._on_alive
        assert on_alive is not None
        try:
            while True:
                msgs = await chan.recv()
                rest = [m for m in msgs if not isinstance(m, wire.Alive)]
                if len(rest) < len(msgs):
                    for m in msgs:
                        if isinstance(m, wire.Alive):
                            on_alive(m)
                if rest:
                    if frames is self._frames:
                        self._saw_recovers(rest)
                    await frames.put(rest)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # ChannelClosed, ProtocolError: recv() raises it
            if frames is self._frames:
                self._error = exc
            await frames.put(None)

    def _saw_recovers(self, msgs: list[wire.Message]) -> None:
        attempts = [m.attempt for m in msgs if isinstance(m, wire.Recover)]
        if attempts and max(attempts) > self._newest_recover:
            self._newest_recover = max(attempts)
            waiters, self._recover_waiters = self._recover_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def newer_recover(self, attempt: int) -> None:
        """Return once a ``Recover`` of a later attempt than ``attempt`` was read from the
        coordinator's channel (it waits in the inbox behind the recovery running now: that
        one's answer no longer matters, ``coordinator.protocols.recovery``)."""
        while self._newest_recover <= attempt:
            waiter = asyncio.get_running_loop().create_future()
            self._recover_waiters = [*(w for w in self._recover_waiters if not w.done()), waiter]
            await waiter

    @property
    def closed(self) -> bool:
        return self.channel is None or bool(self.channel.closed)

    def is_closed(self) -> bool:
        """:attr:`closed`, as a function (the fence reads it)."""
        return self.closed

    def send(self, msg: wire.Message) -> None:
        if self.channel is None:
            raise ChannelClosed("not connected to the coordinator")
        self.channel.send(msg)

    async def recv(self) -> list[wire.Message]:
        if self.channel is None:
            raise ChannelClosed("not connected to the coordinator")
        if self._reader is None:
            got: list[wire.Message] = await self.channel.recv()
            return got
        frames = self._frames
        item = await frames.get()
        if item is None:
            frames.put_nowait(None)  # (every later recv of this channel fails the same way)
            raise self._error or ChannelClosed("coordinator channel closed")
        return item

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()

    def buffered(self) -> int | None:
        """Bytes written and not yet sent (None: no channel)."""
        return None if self.channel is None else int(self.channel.buffered())


class PeerLinks:
    """The channels to this worker's peers, by worker index."""

    def __init__(self, secret: str, connect_timeout: float,
                 gate: Callable[[], bool] | None = None) -> None:
        self._secret = secret
        #: a peer that stays unreachable was lost too: fail soon, the coordinator recovers
        self._timeout = connect_timeout
        self.channels: dict[int, Any] = {}  # ``channels.Channel``s (fake ones in the tests)
        #: peer → the address and this worker's generation its channel was opened with
        self._addrs: dict[int, tuple[tuple[Any, ...], int]] = {}
        #: the lease's check (``worker.fence.FenceLease.check``): what a channel queued leaves
        #: only while it holds (``channels.Channel.gate``)
        self.gate = gate
        #: this worker's generation, said in each ``Hello``
        self.generation = 0

    def send_all(self, msg: wire.Message) -> None:
        """``msg`` to every peer (a closed channel is a loss the coordinator handles)."""
        for ch in self.channels.values():
            try:
                ch.send(msg)
            except ChannelClosed:
                pass

    def send_to(self, index: int, msg: wire.Message) -> None:
        """``msg`` to peer ``index`` (a closed channel is a loss the coordinator handles)."""
        ch = self.channels.get(index)
        if ch is not None:
            try:
                ch.send(msg)
            except ChannelClosed:
                pass

    async def connect(self, peers: Sequence[Sequence[Any]], me: int,
                      timeout: float | None = None) -> None:
        """Connect to every peer whose channel is missing, lost (closed, or its connection
        gone: a channel only written to learns it no other way), at a new address, or
        opened under an older generation of this worker (its ``Hello`` said that one: after
        a rejoin the peer refuses what it sends, ``worker.calls.stale_generation``).
        ``timeout``: per peer (the links' own by default); past it ``StartAgain``."""
        for j, peer in enumerate(peers):
            if j != me:
                await self._connect_one(j, peer, me, self._timeout if timeout is None else timeout)

    async def connect_reachable(self, peers: Sequence[Sequence[Any]], me: int,
                                timeout: float) -> list[int]:
        """:meth:`connect`, but a peer not reached within ``timeout`` is left without a
        channel instead of failing the rest; returns those peers' indices."""
        missing = []
        for j, peer in enumerate(peers):
            if j == me:
                continue
            try:
                await self._connect_one(j, peer, me, timeout)
            except StartAgain as exc:
                log.warning("peer %d not reached: %s", j, exc)
                missing.append(j)
        return missing

    async def _connect_one(self, j: int, peer: Sequence[Any], me: int, timeout: float) -> None:
        old = self.channels.get(j)
        if (old is not None and not old.lost
                and self._addrs.get(j) == (tuple(peer), self.generation)):
            return
        if old is not None:
            old.close()  # (kept until replaced: a send on it fails as ChannelClosed)
        ch = await connect_retry(peer[0], peer[1], self._secret, timeout=timeout)
        ch.gate = self.gate
        ch.send(wire.Hello(me, self.generation))
        self.channels[j] = ch
        self._addrs[j] = (tuple(peer), self.generation)

    def drop_from(self, n_workers: int) -> None:
        """Close the channels to workers ``n_workers`` and above (the membership shrank)."""
        for j in [j for j in self.channels if j >= n_workers]:
            self.channels.pop(j).close()
            self._addrs.pop(j, None)

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
