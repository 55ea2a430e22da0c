"""A worker's channels: the one to the coordinator, and one to each peer.

Both outlive what travels over them: the coordinator's channel is replaced when the worker
registers again (a standby's promotion, a restarted coordinator), a peer's when the peer
moved (a replaced worker) or the membership changed (a rescale). The parts that send hold
these holders, never a channel, so they always reach the current one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from sfaas.errors import AuthenticationError, ChannelClosed, ClusterError
from sfaas.runtime import channels, wire

log = logging.getLogger("sfaas.worker")

__all__ = ["CoordinatorLink", "PeerLinks", "connect_retry"]


async def connect_retry(host: str, port: int, secret: str,
                        timeout: float = 30.0) -> channels.Channel:
    """A channel to ``host:port``, retrying until ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await channels.connect(host, port, secret)
        except AuthenticationError as exc:
            if "shared-secret" in str(exc):
                raise
            err: Exception = exc
        except OSError as exc:
            err = exc
        if time.monotonic() > deadline:
            raise ClusterError(f"cannot reach {host}:{port}: {err}")
        await asyncio.sleep(0.1)


class CoordinatorLink:
    """The channel to the coordinator (none until the worker registers)."""

    def __init__(self, secret: str) -> None:
        self._secret = secret
        self.channel: Any = None  # a ``channels.Channel`` (a fake one in the tests)

    async def connect(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.channel = await connect_retry(host, port, self._secret, timeout)

    @property
    def closed(self) -> bool:
        return self.channel is None or bool(self.channel.closed)

    def send(self, msg: wire.Message) -> None:
        if self.channel is None:
            raise ChannelClosed("not connected to the coordinator")
        self.channel.send(msg)

    async def recv(self) -> list[wire.Message]:
        if self.channel is None:
            raise ChannelClosed("not connected to the coordinator")
        got: list[wire.Message] = await self.channel.recv()
        return got

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()

    def buffered(self) -> int | None:
        """Bytes written and not yet sent (None: no channel)."""
        return None if self.channel is None else int(self.channel.buffered())


class PeerLinks:
    """The channels to this worker's peers, by worker index."""

    def __init__(self, secret: str, connect_timeout: float) -> None:
        self._secret = secret
        #: a peer that stays unreachable was lost too: fail soon, the coordinator recovers
        self._timeout = connect_timeout
        self.channels: dict[int, Any] = {}  # ``channels.Channel``s (fake ones in the tests)
        self._addrs: dict[int, tuple[str, int]] = {}

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

    async def connect(self, peers: Sequence[Sequence[Any]], me: int) -> None:
        """Connect to every peer whose channel is missing, closed or at a new address."""
        for j, (host, port) in enumerate(peers):
            if j == me:
                continue
            old = self.channels.get(j)
            if old is not None and not old.closed and self._addrs.get(j) == (host, port):
                continue
            if old is not None:
                old.close()
            ch = await connect_retry(host, port, self._secret, timeout=self._timeout)
            ch.send(wire.Hello(me))
            self.channels[j] = ch
            self._addrs[j] = (host, port)

    def drop_from(self, n_workers: int) -> None:
        """Close the channels to workers ``n_workers`` and above (the membership shrank)."""
        for j in [j for j in self.channels if j >= n_workers]:
            self.channels.pop(j).close()
            self._addrs.pop(j, None)

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
