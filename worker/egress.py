"""Egress: replies out to Kafka, and ingress offsets committed once their replies are in.

A committed (or finally aborted) request's reply is queued here by the epoch's commit and
produced by one task, in commit order, to the reply partition the request named. When the
broker acknowledges a reply, its request is *completed*: its ingress offset may be
committed to the consumer group (``sfaas.runtime.txn.offsets``) and it stops counting against the
worker's in-flight limit (``worker.ingress``), which is what bounds the replies queued here
and those being sent again.

A reply whose delivery failed because the producer is stuck (``OutOfOrderSequenceNumber``
and the like: ``worker.clients.DESYNCED``; the broker appended nothing) is sent again
through a new producer, at most ``worker.clients.RESENDS`` times (``worker.clients``: why a
copy that did land twice is harmless — its client takes one reply per request id). It then
completes like any other, later than the replies made after it. A reply whose delivery
fails otherwise (the producer gave up: Kafka unreachable past its retries), or still fails
after those resends, is not completed: its offset stays uncommitted. With snapshot rounds
on, the worker then leaves the cluster, as when an epoch-log write fails: the recovery
that follows rolls back to the newest round and replays, producing every reply not yet in
the egress topic again. Without rounds there is no recovery to leave for; the request
waits for a restart, holding its in-flight slot.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

from aiokafka import TopicPartition

from sfaas.runtime.settings import Settings
from worker.clients import DESYNCED, Sent, hand_over
from worker.fence import FenceLease
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker")

__all__ = ["Egress", "Uplink", "Clients", "GEN_HEADER"]

#: The Kafka header on every reply: ``b"<slot>.<generation>"`` of the process that made it.
GEN_HEADER = "sfaas-gen"


class Uplink(Protocol):
    """The coordinator's channel, which a worker closes to leave the cluster."""

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


class Clients(Protocol):
    """Whoever holds the Kafka clients (``worker.clients.KafkaClients``)."""

    producer: Any
    consumer: Any

    async def resend(self, sent: Sent, exc: BaseException,
                     fence: FenceLease | None = None) -> Any: ...

    async def flush_producer(self) -> None: ...


class Egress:
    """One worker's replies and offset commits (see module docstring).

    ``completed(partition, offset)``: the request read there completed (its reply is
    acknowledged).
    """

    def __init__(self, settings: Settings, state: WorkerState, kafka: Clients, uplink: Uplink,
                 completed: Callable[[int, int], None], lease: FenceLease | None = None) -> None:
        self._rounds_on = settings.snapshot_interval > 0
        #: replies leave, and offsets are committed, only under the lease (``worker.fence``)
        self._lease = lease
        self._state = state
        self._kafka = kafka
        self._uplink = uplink
        self._completed = completed
        #: (reply partition, encoded reply, ingress partition, ingress offset), in commit order
        self.replies: list[tuple[int, bytes, int, int]] = []
        self.event = asyncio.Event()
        #: per egress partition, one past the highest offset of a reply acknowledged
        self.acked: dict[int, int] = {}
        #: replies being sent again through a new producer (a task each, held: the loop keeps
        #: weak references; bounded by the in-flight limit, as every reply not acknowledged)
        self._resending: set[asyncio.Task[None]] = set()

    def add(self, reply_partition: int, value: bytes, partition: int, offset: int) -> None:
        """Queue one reply to the request read at ingress ``partition:offset`` (-1: none)."""
        self.replies.append((reply_partition, value, partition, offset))
        self.event.set()

    async def run(self) -> None:
        """Produce queued replies as they come (the worker's egress task)."""
        while True:
            await self.event.wait()
            self.event.clear()
            await self.flush()

    async def flush(self) -> None:
        """Hand every queued reply to the producer (its delivery completes later), each
        stamped with this process's slot and generation (the ``sfaas-gen`` header)."""
        if not self.replies:
            return
        lease = self._lease
        if lease is not None and not lease.valid():
            await lease.held()
        replies, self.replies = self.replies, []
        st = self._state
        topic = st.egress_topic
        headers = [(GEN_HEADER, f"{st.index}.{st.generation}".encode())]
        for p, value, in_part, in_offset in replies:
            sent = await hand_over(self._kafka, topic, value, p, headers)
            sent.delivery.add_done_callback(functools.partial(self._sent, in_part, in_offset, sent))

    async def durable(self) -> None:
        """Every reply queued so far is acknowledged by the broker (or failed for good),
        those being sent again through a new producer included."""
        await self.flush()
        await self._kafka.flush_producer()  # (a reply it rejected is in _resending now)
        while resending := [t for t in self._resending if not t.done()]:
            await asyncio.gather(*resending, return_exceptions=True)

    def _sent(self, partition: int, offset: int, sent: Sent, fut: asyncio.Future[Any]) -> None:
        """A reply's delivery finished: on success its request is completed; a stuck
        producer's rejection is sent again (see the module docstring)."""
        if fut.cancelled():  # (a worker that is stopping)
            return
        exc = fut.exception()
        if exc is None:
            self._acked(fut.result(), partition, offset)
        elif isinstance(exc, DESYNCED):
            task = asyncio.get_running_loop().create_task(
                self._resend(partition, offset, sent, exc))
            self._resending.add(task)
            task.add_done_callback(self._resending.discard)
        else:
            self._failed(partition, offset, exc)

    async def _resend(self, partition: int, offset: int, sent: Sent, exc: BaseException) -> None:
        try:
            md = await self._kafka.resend(sent, exc, self._lease)
        except Exception as e:
            self._failed(partition, offset, e)
        else:
            self._acked(md, partition, offset)

    def _acked(self, md: Any, partition: int, offset: int) -> None:
        if md.offset + 1 > self.acked.get(md.partition, 0):
            self.acked[md.partition] = md.offset + 1
        if offset >= 0:
            self._completed(partition, offset)

    def _failed(self, partition: int, offset: int, exc: BaseException) -> None:
        if self._rounds_on and not self._uplink.closed:
            log.error("producing the reply to ingress %d:%d failed: %s; leaving the cluster so "
                      "that a recovery produces it again", partition, offset, exc,
                      extra={"worker": self._state.index})
            self._uplink.close()
        else:
            log.error("producing the reply to ingress %d:%d failed: %s", partition, offset, exc)

    async def commit_loop(self) -> None:
        """Commit offsets every second (apart from heartbeats: a commit waits for Kafka)."""
        while True:
            await asyncio.sleep(1.0)
            await self.commit_offsets()

    async def commit_offsets(self) -> None:
        """Commit to the consumer group the offsets below which every request completed."""
        st = self._state
        offsets = st.offsets.to_commit()
        if not offsets:
            return
        if self._lease is not None and not self._lease.check():
            return  # (committed by the next try under a lease, or by the slot's next process)
        try:
            await self._kafka.consumer.commit(
                {TopicPartition(st.ingress_topic, p): o for p, o in offsets.items()})
        except Exception as exc:
            log.warning("committing ingress offsets failed: %s", exc)
        else:
            st.offsets.mark_committed(offsets)
