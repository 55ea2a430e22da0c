"""Direct calls, the client's side: a transaction sent straight to the worker owning its
key, its reply read on the same channel — no Kafka record on the way in or out
(``worker.direct`` is the worker's side; the messages are
``sfaas.runtime.protocols.ingress``).

It takes what direct reads take (``sfaas.reads``): the cluster's secret and its
coordinator's address. The worker answers once the request's epoch is durable in the
epoch log, so an answer is final.

**Resending.** Until its answer arrives or the call's timeout passes, a call is sent again
— with the same request id — whenever its channel closed (the worker died, or a recovery
closed it) or a worker answered ``NOT_HERE`` (it does not own the partition now, or it is
rolling back), after asking the coordinator where the partition is, with a backoff from
:data:`FIRST_BACKOFF` to :data:`MAX_BACKOFF` seconds. Every copy of one request id gets
the one reply (a worker knows each request id it took, and keeps each reply until the
client acknowledges it), so resending never runs a transaction twice.

**Acknowledgements.** A worker keeps each reply until its client acknowledges it
(``Acked``). An acknowledgement rides with the next request to the same worker, in its
frame, or goes alone after :data:`ACK_DELAY`; so a steady stream of calls costs no frame of
its own for them (issue 47: one frame less per transaction each way).

**Kafka instead.** :meth:`DirectCalls.call` returns None when no worker may have taken
the request — the coordinator or the workers cannot be reached, the secret was refused,
the cluster runs without snapshot rounds — and the client sends it through Kafka. Once a
worker may have taken it (it was written to a channel that then closed, or a worker
answered that the partition moved away while the request waited there: its re-run moves
with the partition), it stays on the direct path until the timeout: the Kafka path would
not know the request id, and would run it a second time.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sfaas.errors import ChannelClosed
from sfaas.reads import DirectReads, Unavailable
from sfaas.runtime import channels, wire
from sfaas.runtime.protocols.reads import MOVED, NOT_HERE

log = logging.getLogger("sfaas.client")

__all__ = ["DirectCalls", "ACK_DELAY", "FIRST_BACKOFF", "MAX_ACKS", "MAX_BACKOFF", "NO_ROUNDS"]

#: Seconds before the first resend, doubled after each one up to :data:`MAX_BACKOFF`.
FIRST_BACKOFF = 0.02
MAX_BACKOFF = 0.5
#: The start of a worker's ``NOT_HERE`` reason when the cluster cannot take direct calls.
NO_ROUNDS = "direct requests need snapshot rounds"
#: Seconds an acknowledgement waits for the next request to the same worker to ride with
#: (one frame for both) before it goes alone.
ACK_DELAY = 0.05
#: Acknowledgements held for one worker at most: one more sends them at once.
MAX_ACKS = 1024


class _Closed(Exception):
    """The channel a call was written to closed before its answer came."""


class DirectCalls:
    """The direct calls of one client (see the module docstring), over ``path``'s channels."""

    def __init__(self, path: DirectReads) -> None:
        self._path = path
        path.on_answer = self._answer
        path.on_closed = self._closed
        #: calls waiting for an answer: request id → (the channel, the future)
        self._waiting: dict[str, tuple[channels.Channel, asyncio.Future[wire.Reply]]] = {}
        #: request ids whose replies arrived, to acknowledge, per channel
        self._acks: dict[channels.Channel, list[str]] = {}
        self._flushing = False
        #: the cluster takes no direct calls (no snapshot rounds): Kafka from now on
        self.off = False
        #: calls answered directly, calls sent again, calls handed to Kafka
        self.answered = 0
        self.resent = 0
        self.fell_back = 0

    async def call(self, rid: str, record: bytes, partition: int,
                   deadline: float) -> wire.Reply | None:
        """The reply to request ``rid`` (``record``, in ingress ``partition``), or None:
        no worker took it, send it through Kafka. Raises :class:`TimeoutError` at
        ``deadline`` (``time.monotonic()``)."""
        maybe_taken = False
        backoff = FIRST_BACKOFF
        fresh = False
        while True:
            if not maybe_taken and (self.off or not self._path.available):
                self.fell_back += 1
                return None
            try:
                reply = await self._try(rid, record, partition, deadline, fresh)
            except _Closed:
                maybe_taken = True
                reply = None
            except Unavailable as exc:
                if not maybe_taken:
                    self.fell_back += 1
                    return None
                log.debug("direct call %s: %s; trying again", rid, exc)
                reply = None
            if reply is not None:
                if reply.error_type != NOT_HERE:
                    self.answered += 1
                    return reply
                if (reply.reason or "").startswith(MOVED):
                    # (taken, then given up by a rescale: its re-run may run at the new owner)
                    maybe_taken = True
                if (reply.reason or "").startswith(NO_ROUNDS) and not maybe_taken:
                    self.off = True
                    self.fell_back += 1
                    return None
            if time.monotonic() + backoff >= deadline:
                raise TimeoutError(rid)
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, MAX_BACKOFF)
            fresh = True
            self.resent += 1

    async def _try(self, rid: str, record: bytes, partition: int, deadline: float,
                   fresh: bool) -> wire.Reply:
        """Send the request once to the partition's owner; its answer."""
        path = self._path
        placement = await path.where(fresh)
        if not 0 <= partition < len(placement.owners):
            raise Unavailable("no placement (a recovery or a rescale is under way)")
        peer = placement.peers[placement.owners[partition]]
        chan = await path.worker(peer.host, peer.port)
        fut: asyncio.Future[wire.Reply] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (chan, fut)
        try:
            try:
                self._send_acks(chan)  # (they ride in the request's frame)
                chan.send(wire.Submit(record))
            except ChannelClosed:
                raise Unavailable(f"worker {peer.host}:{peer.port} closed the channel") from None
            async with asyncio.timeout_at(asyncio.get_running_loop().time()
                                          + max(0.0, deadline - time.monotonic())):
                return await fut  # (no task per wait, as wait_for would make)
        finally:
            if self._waiting.get(rid, (None,))[0] is chan:
                del self._waiting[rid]

    def _answer(self, chan: channels.Channel, msg: wire.Answer) -> None:
        try:
            reply = wire.Reply.decode(msg.reply)
        except wire.ProtocolError as exc:
            log.warning("ignoring a malformed answer from %s: %s", chan.peer, exc)
            return
        waiting = self._waiting.get(reply.rid)
        if reply.error_type != NOT_HERE:
            self._ack(chan, reply.rid)  # (also a copy nobody waits for any more)
        if waiting is not None and waiting[0] is chan and not waiting[1].done():
            waiting[1].set_result(reply)

    def _closed(self, chan: channels.Channel) -> None:
        self._acks.pop(chan, None)
        for c, fut in list(self._waiting.values()):
            if c is chan and not fut.done():
                fut.set_exception(_Closed())

    def _ack(self, chan: channels.Channel, rid: str) -> None:
        """Acknowledge ``rid`` with the next request to ``chan``'s worker, or alone after
        :data:`ACK_DELAY` (so the worker keeps the reply that much longer, and a
        transaction costs one frame less each way)."""
        rids = self._acks.setdefault(chan, [])
        rids.append(rid)
        if len(rids) >= MAX_ACKS:
            self._send_acks(chan)
        elif not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_later(ACK_DELAY, self._flush_acks)

    def _send_acks(self, chan: channels.Channel) -> None:
        rids = self._acks.pop(chan, None)
        if rids and not chan.closed:
            try:
                chan.send(wire.Acked(rids))
            except ChannelClosed:
                pass

    def _flush_acks(self) -> None:
        self._flushing = False
        self.flush()

    def flush(self) -> None:
        """Queue every held acknowledgement on its channel now (before the client closes
        them: a closing channel still writes what is queued)."""
        for chan in list(self._acks):
            self._send_acks(chan)
