"""Authenticated, batched message channels over asyncio TCP.

A frame is a 4-byte big-endian length followed by a msgpack payload
(:func:`sfaas.runtime.wire.encode_frame`). Before any frame, both ends prove they know the shared
secret (``SFAAS_SECRET``) with an HMAC-SHA256 challenge–response in both directions:

1. server → client: ``MAGIC`` + 16-byte nonce ``ns``
2. client → server: 16-byte nonce ``nc`` + ``HMAC(secret, "c" + ns + nc)``
3. server → client: ``HMAC(secret, "s" + nc + ns)``

The secret itself never crosses the wire. A peer that fails (wrong secret, garbage,
timeout) is logged, counted in :data:`REJECTED` and disconnected; the server keeps serving
everyone else. The server reads exactly the 48-byte answer before the MAC checks out, and a
frame's length is checked against :data:`MAX_FRAME` before its body is read (allocated).

:meth:`Channel.send` only queues a message; everything queued in one event-loop tick
goes out as one frame, so bursts of calls/results between two processes are batched.
Messages are packed as they are queued, and a tick's queue is written out at once when it
reaches :data:`HIGH_WATER` bytes. Bytes written but not yet taken by the peer wait in the
transport; above :data:`HIGH_WATER` of them a writer that calls :meth:`Channel.wait_room`
waits until the peer has read them down to a quarter — so a slow peer slows its callers
instead of growing our memory (at most about twice the mark per channel).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import logging
import os
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sfaas.errors import AuthenticationError, ChannelClosed
from sfaas.runtime import ports
from sfaas.runtime.ports import NetworkPort
from sfaas.runtime.wire import Message, ProtocolError, decode_frame, encode_message, join_frame

log = logging.getLogger("sfaas.runtime.channels")

__all__ = [
    "Channel", "connect", "serve", "MAX_FRAME", "MAGIC", "REJECTED", "Traffic", "TRAFFIC",
    "HIGH_WATER",
]

MAGIC = b"SFAAS1"
_NONCE = 16
_MAC = 32
#: Largest frame accepted (bounds memory a peer can make us allocate).
MAX_FRAME = 64 << 20
#: Unsent bytes in a channel's transport above which :meth:`Channel.wait_room` waits, and
#: queued bytes above which a tick's messages are written out at once.
HIGH_WATER = 1 << 20
#: Seconds between tries of a gated channel's flush (:attr:`Channel.gate`).
GATE_RETRY = 0.02
_HEADER = struct.Struct(">I")
HANDSHAKE_TIMEOUT = 5.0
#: A TCP connection whose sent bytes stay unacknowledged this long, or whose peer stops
#: answering keepalive probes (sent after :data:`KEEPALIVE_IDLE` s of silence, then every
#: :data:`KEEPALIVE_INTERVAL` s), is closed by the kernel: a partition that drops packets
#: without a reset (no FIN, no RST) then ends the channel within ~5–7 s instead of the
#: kernel's ~15 minutes of retransmissions — and a worker's channel from a peer that
#: closes that way makes the coordinator recover (``wire.PeerBroken``).
USER_TIMEOUT = 5.0
KEEPALIVE_IDLE = 1
KEEPALIVE_INTERVAL = 1
KEEPALIVE_COUNT = 5
#: Peers this process refused, by why: ``"unauthenticated"`` (failed the handshake) and
#: ``"protocol"`` (an authenticated peer sent a frame that does not decode).
REJECTED: collections.Counter[str] = collections.Counter()


@dataclass(slots=True)
class Traffic:
    """Frames and bytes (length headers included) through every channel of this process."""

    sent_frames: int = 0
    sent_bytes: int = 0
    received_frames: int = 0
    received_bytes: int = 0


#: This process's channel traffic (read by its ``/metrics``).
TRAFFIC = Traffic()


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


class Channel:
    """One authenticated connection; ``send`` batches, ``recv`` returns one frame's messages."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.peer = peer
        self._queue: list[bytes] = []  # packed messages of this tick
        self._queued = 0  # their bytes
        self._scheduled = False
        self.closed = False
        #: when set, what is queued leaves only while ``gate()`` is true (a worker's lease,
        #: ``worker.fence``); meanwhile it waits here, tried again every :data:`GATE_RETRY` s
        self.gate: Callable[[], bool] | None = None
        self._retrying = False
        self.frames_sent = 0
        #: how often a writer waited in :meth:`wait_room`
        self.waits = 0
        writer.transport.set_write_buffer_limits(high=HIGH_WATER, low=HIGH_WATER // 4)

    @property
    def lost(self) -> bool:
        """Closed, or its connection gone under it — the peer's end closed (the end of the
        stream arrived: no channel is half-closed on purpose) or reset (the transport is
        closing) — which a channel only written to learns only so, never from a read."""
        return self.closed or self._reader.at_eof() or self._writer.transport.is_closing()

    def send(self, msg: Message) -> None:
        """Queue ``msg``; it leaves with everything else queued in this loop iteration."""
        if self.closed:
            raise ChannelClosed(f"channel to {self.peer} is closed")
        part = encode_message(msg)
        self._queue.append(part)
        self._queued += len(part)
        if self._queued >= HIGH_WATER and not self._retrying:
            self._flush()
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._queue or self.closed:
            return
        if self.gate is not None and not self.gate():
            self._scheduled = True  # (sends only queue meanwhile)
            if not self._retrying:
                self._retrying = True
                asyncio.get_running_loop().call_later(GATE_RETRY, self._retry)
            return
        parts, self._queue, self._queued = self._queue, [], 0
        if self._writer.transport.is_closing():
            # the connection is gone under the channel (its peer died, a reset, the
            # keepalive gave up): what was queued cannot leave — ``lost`` says so; uvloop's
            # transport would raise here, in a loop callback, where nobody hears it
            return
        payload = join_frame(parts)
        self._writer.write(_HEADER.pack(len(payload)) + payload)
        self.frames_sent += 1
        TRAFFIC.sent_frames += 1
        TRAFFIC.sent_bytes += 4 + len(payload)

    def _retry(self) -> None:
        self._retrying = False
        self._flush()

    async def drain(self) -> None:
        """Flush queued messages and wait until the OS took them (backpressure point)."""
        self._flush()
        await self._writer.drain()

    async def wait_room(self) -> None:
        """Return at once unless more than :data:`HIGH_WATER` bytes wait unsent; then wait
        until the peer read them down to a quarter (:class:`ChannelClosed` if it goes away)."""
        if self.closed:
            raise ChannelClosed(f"channel to {self.peer} is closed")
        if self._writer.transport.get_write_buffer_size() <= HIGH_WATER:
            return
        self.waits += 1
        self._flush()
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            self.closed = True
            raise ChannelClosed(f"channel to {self.peer} closed: {exc}") from None

    async def recv(self) -> list[Message]:
        """The next frame's messages; raises :class:`ChannelClosed` at end of stream."""
        try:
            header = await self._reader.readexactly(4)
            (n,) = _HEADER.unpack(header)
            if n > MAX_FRAME:
                raise ProtocolError(f"frame of {n} bytes from {self.peer} exceeds {MAX_FRAME}")
            payload = await self._reader.readexactly(n)
        except (asyncio.IncompleteReadError, OSError) as exc:  # (ETIMEDOUT: USER_TIMEOUT)
            self.closed = True
            raise ChannelClosed(f"channel to {self.peer} closed: {exc}") from None
        TRAFFIC.received_frames += 1
        TRAFFIC.received_bytes += 4 + n
        return decode_frame(payload)

    def buffered(self) -> int:
        """Bytes written but not yet taken by the OS (a slow or stuck peer makes it grow)."""
        return 0 if self.closed else self._writer.transport.get_write_buffer_size()

    def close(self) -> None:
        """Flush what is queued and close the connection."""
        if self.closed:
            return
        try:
            self._flush()
        finally:
            self.closed = True
            self._writer.close()


async def _client_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes
) -> None:
    hello = await reader.readexactly(len(MAGIC) + _NONCE)
    if not hello.startswith(MAGIC):
        raise AuthenticationError("peer is not an sfaas endpoint (bad magic)")
    ns = hello[len(MAGIC):]
    nc = os.urandom(_NONCE)
    writer.write(nc + _mac(secret, b"c", ns, nc))
    await writer.drain()
    answer = await reader.readexactly(_MAC)
    if not hmac.compare_digest(answer, _mac(secret, b"s", nc, ns)):
        raise AuthenticationError("server failed the shared-secret check (SFAAS_SECRET differs)")


async def _server_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes
) -> None:
    ns = os.urandom(_NONCE)
    writer.write(MAGIC + ns)
    await writer.drain()
    data = await reader.readexactly(_NONCE + _MAC)
    nc, mac = data[:_NONCE], data[_NONCE:]
    if not hmac.compare_digest(mac, _mac(secret, b"c", ns, nc)):
        raise AuthenticationError("client failed the shared-secret check")
    writer.write(_mac(secret, b"s", nc, ns))
    await writer.drain()


def _tune(writer: asyncio.StreamWriter) -> None:
    """No Nagle delay, and a bounded life for a connection whose peer went silent
    (:data:`USER_TIMEOUT`). A stream without a TCP socket (the simulator's) has neither."""
    import socket

    sock = writer.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    opts = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
            (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
                        ("TCP_USER_TIMEOUT", int(USER_TIMEOUT * 1000))):
        if hasattr(socket, name):  # (Linux's; elsewhere the kernel's defaults)
            opts.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in opts:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:
            pass


async def connect(host: str, port: int, secret: str | bytes, *, timeout: float = 10.0,
                  network: NetworkPort | None = None) -> Channel:
    """Open an authenticated channel to ``host:port`` over ``network``'s streams (the
    process's network port when None: ``sfaas.runtime.ports``)."""
    key = secret.encode() if isinstance(secret, str) else secret
    net = network or ports.current().network
    try:
        reader, writer = await asyncio.wait_for(net.open_connection(host, port), timeout)
    except OSError:
        _cancel_kept()
        raise
    _tune(writer)
    try:
        await asyncio.wait_for(_client_handshake(reader, writer, key), HANDSHAKE_TIMEOUT)
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
        writer.close()
        _cancel_kept()
        raise AuthenticationError(f"handshake with {host}:{port} failed: {exc!r}") from None
    except AuthenticationError:
        writer.close()
        raise
    return Channel(reader, writer, f"{host}:{port}")


def _cancel_kept() -> None:
    """Raise the cancel of the calling task that Python 3.11's ``asyncio.wait_for`` turned
    into its inner attempt's error (a cancel that lands as the attempt fails): a caller
    retrying on that error went on for its whole timeout (``worker.links.connect_retry``:
    a superseded recovery waited 3.5 s for a dead peer)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def serve(
    host: str,
    port: int,
    secret: str | bytes,
    handler: Callable[[Channel], Awaitable[None]],
    *, network: NetworkPort | None = None,
) -> asyncio.Server:
    """Accept authenticated channels on ``host:port`` (0: any free port) and run ``handler``,
    over ``network``'s streams (the process's network port when None).

    Unauthenticated peers are logged and dropped; a handler's exception is logged and
    closes only that channel.
    """
    key = secret.encode() if isinstance(secret, str) else secret

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept(reader, writer, key, handler)

    server: asyncio.Server = await (network or ports.current().network).start_server(
        on_connect, host, port)
    return server


async def accept(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes,
    handler: Callable[[Channel], Awaitable[None]],
) -> None:
    """Serve one incoming connection: the handshake, then ``handler`` on the channel
    (:func:`serve` runs it for every connection; tests feed it hostile bytes)."""
    addr = writer.get_extra_info("peername")
    peer = f"{addr[0]}:{addr[1]}" if addr else "?"
    _tune(writer)
    try:
        await asyncio.wait_for(_server_handshake(reader, writer, key), HANDSHAKE_TIMEOUT)
    except (TimeoutError, AuthenticationError, asyncio.IncompleteReadError, ConnectionError) as exc:
        REJECTED["unauthenticated"] += 1
        log.warning("refused unauthenticated peer %s: %s", peer, exc or type(exc).__name__,
                    extra={"peer": peer})
        writer.close()
        return
    chan = Channel(reader, writer, peer)
    try:
        await handler(chan)
    except ChannelClosed:
        log.debug("channel from %s closed", peer)
    except asyncio.CancelledError:  # the process is shutting down
        pass
    except ProtocolError as exc:
        REJECTED["protocol"] += 1
        log.warning("protocol error from %s: %s", peer, exc, extra={"peer": peer})
    except Exception:
        log.exception("handler for %s failed", peer)
    finally:
        chan.close()
