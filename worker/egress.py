"""Egress: replies out to Kafka in transactions, and ingress offsets committed once their
replies are in.

A committed (or finally aborted) request's reply is queued here by the epoch's commit and
produced, in commit order, to the reply partition the request named — inside a Kafka
transaction of this worker's *slot*: one transactional producer per slot, its id
``<egress topic>.slot-<index>`` (:func:`transactional_id`), started when the slot is taken
(``worker.membership``). Whatever is queued while a transaction commits goes into the next
one, so a loaded worker commits many replies at once and an idle one one at a time. When a
transaction commits, its requests are *completed*: their ingress offsets may be committed to
the consumer group (``sfaas.runtime.txn.offsets``) and they stop counting against the
worker's in-flight limit (``worker.ingress``), which is what bounds the replies queued here.

Why transactions: the slot's next process (a replacement, a promoted standby) starts its
producer with the same id, and the broker then fences the previous one — aborting its open
transaction and refusing whatever it still sends, including bytes a killed process left in
its socket that reach the broker late (after a cut heals). Without that, a dead worker's
reply could land in the egress topic *after* its successor's recovery read the topic
(``worker.protocols.recovery``, step 4), and the replay would produce it a second time (the
nemesis caught 4 such replies, seed 4251531938). The recovery reads the topic
``read_committed``, so it sees exactly the replies that count, and a replay produces the
others. Readers that want every reply once read ``read_committed`` too (docs/guide: the
Kafka path); ``sfaas.Client`` reads uncommitted replies for latency and keeps the first per
request id — an aborted reply is the same bytes its replay commits.

A transaction that fails because the producer is stuck or fenced (:data:`RETRY`: the broker
appended nothing that counts — the transaction is aborted) is tried again through a new
producer of the same id, at most ``worker.clients.RESENDS`` times, each under the
coordinator's lease (a new producer fences every older one, so only the slot's owner may
start one). A transaction that fails otherwise (Kafka unreachable past the producer's
retries: its commit may have landed) is not tried again, and its replies are not completed:
their offsets stay uncommitted. With snapshot rounds on, the worker then leaves the cluster,
as when an epoch-log write fails; the recovery that follows rolls back to the newest round
and replays, producing every reply not committed in the egress topic. Without rounds there
is no recovery to leave for; the request waits for a restart, holding its in-flight slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import IllegalOperation

from sfaas.runtime.kafka import make_producer
from sfaas.runtime.settings import Settings
from worker.clients import DESYNCED, RENEW_PATIENCE, RESENDS, start_kafka
from worker.fence import Fenced, FenceLease
from worker.needs import Completions
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker")

__all__ = ["Egress", "Uplink", "Clients", "GEN_HEADER", "RETRY", "transactional_id"]

#: The Kafka header on every reply: ``b"<slot>.<generation>"`` of the process that made it.
GEN_HEADER = "sfaas-gen"
#: Transaction failures after which nothing of it counts (aborted, or never appended), so it
#: is tried again through a new producer: a stuck or fenced producer (aiokafka reports a
#: transaction the broker timed out as ``ProducerFenced``), or one left in a failed state.
RETRY = (*DESYNCED, IllegalOperation)

#: (reply partition, encoded reply, ingress partition, ingress offset)
Queued = tuple[int, bytes, int, int]


def transactional_id(egress_topic: str, slot: int) -> str:
    """The transactional id of slot ``slot``'s replies: the same in every process that holds
    the slot, so each new one fences the one before."""
    return f"{egress_topic}.slot-{slot}"


class Uplink(Protocol):
    """The coordinator's channel, which a worker closes to leave the cluster."""

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


class Clients(Protocol):
    """Whoever holds the Kafka clients (``worker.clients.KafkaClients``): the consumer
    whose group the ingress offsets are committed to."""

    consumer: Any


class Egress:
    """One worker's replies and offset commits (see module docstring).

    ``completed.complete(partition, offset)``: the request read there completed (its reply
    is committed; the ingress fills the port, ``worker.needs.Completions``, given here or —
    the ingress being built after the egress — by :meth:`completes`).
    """

    def __init__(self, settings: Settings, state: WorkerState, kafka: Clients, uplink: Uplink,
                 completed: Completions | None = None, lease: FenceLease | None = None) -> None:
        self._settings = settings
        self._rounds_on = settings.snapshot_interval > 0
        #: replies leave, and offsets are committed, only under the lease (``worker.fence``)
        self._lease = lease
        self._state = state
        self._kafka = kafka
        self._uplink = uplink
        self._completed = completed
        #: replies queued and not yet in a transaction, in commit order
        self.replies: list[Queued] = []
        self.event = asyncio.Event()
        #: per egress partition, one past the highest offset of a reply committed
        self.acked: dict[int, int] = {}
        #: the slot's transactional producer (None until :meth:`start`) and its id
        self.producer: Any = None
        self.txn_id = ""
        #: makes an unstarted transactional producer for an id (a seam: tests give fakes)
        self.new_producer: Callable[[str], Any] = lambda tid: make_producer(
            settings.kafka, settings.linger_ms, transactional_id=tid)
        #: producers replaced so far (stuck, fenced or failed transactions)
        self.renewals = 0
        #: transactions committed so far
        self.transactions = 0
        #: the one task that runs transactions, one after the other (None: none running)
        self._drain: asyncio.Task[None] | None = None
        #: the last transaction failed: the next one starts with a new producer
        self._broken = False
        #: replaced producers stopping (held: the loop keeps weak references)
        self._retiring: set[asyncio.Task[None]] = set()

    async def start(self, slot: int) -> None:
        """Start slot ``slot``'s producer (kept if it is the one running): from here on the
        broker refuses the slot's earlier processes, and their open transaction is aborted."""
        tid = transactional_id(self._state.egress_topic, slot)
        if self.producer is not None and tid == self.txn_id and not self._broken:
            return
        old, self.producer, self.txn_id = self.producer, None, tid
        if old is not None:
            self._retire(old)
        self.producer = await start_kafka(lambda: self.new_producer(tid), self._settings.kafka,
                                          index=slot)
        self._broken = False

    async def stop(self) -> None:
        """Stop the producer after the replies queued (the worker stops)."""
        if self._drain is not None and not self._drain.done():
            await asyncio.gather(self._drain, return_exceptions=True)
        if self.producer is not None:
            await self.producer.stop()
        while stopping := [t for t in self._retiring if not t.done()]:
            await asyncio.gather(*stopping)

    def add(self, reply_partition: int, value: bytes, partition: int, offset: int) -> None:
        """Queue one reply to the request read at ingress ``partition:offset`` (-1: none)."""
        self.replies.append((reply_partition, value, partition, offset))
        self.event.set()

    def completes(self, ingress: Completions) -> None:
        """Acknowledged replies complete their requests in ``ingress`` (a loop between
        parts, closed once both exist: ``worker.service``)."""
        self._completed = ingress

    def acked_offsets(self) -> dict[int, int]:
        """Egress partition → the offset after this process's last acknowledged reply."""
        return dict(self.acked)

    async def run(self) -> None:
        """Produce queued replies as they come (the worker's egress task)."""
        while True:
            await self.event.wait()
            self.event.clear()
            await self.flush()

    async def flush(self) -> None:
        """Produce every reply queued so far; returns once each is committed (or failed for
        good). One task runs the transactions; whoever calls this waits for it."""
        while self.replies or (self._drain is not None and not self._drain.done()):
            task = self._drain
            if task is None or task.done():
                task = self._drain = asyncio.get_running_loop().create_task(self._drain_all())
            await asyncio.shield(task)  # (a caller cancelled leaves the transaction running)

    async def durable(self) -> None:
        """Every reply queued so far is committed (or failed for good)."""
        await self.flush()

    async def _drain_all(self) -> None:
        while self.replies:
            await self._leased()
            batch, self.replies = self.replies, []
            await self._transact(batch)

    async def _leased(self) -> None:
        lease = self._lease
        if lease is not None and not lease.valid():
            await lease.held()

    async def _transact(self, batch: list[Queued]) -> None:
        """Produce ``batch`` in one transaction, tried again through a new producer while it
        fails with one of :data:`RETRY` (see the module docstring)."""
        exc: BaseException = RuntimeError("no transaction tried")
        for _ in range(1 + RESENDS):
            try:
                if self._broken or self.producer is None:
                    await self._renew(exc)
                mds = await self._one(batch)
            except Fenced:
                raise
            except Exception as e:
                exc, self._broken = e, True
                if not isinstance(e, RETRY):
                    break
                continue
            self.transactions += 1
            for md, (_, _, partition, offset) in zip(mds, batch, strict=True):
                self._acked(md, partition, offset)
            return
        if self._broken and not isinstance(exc, RETRY):
            # (before anyone reads the topic: a new producer's start waits until a commit
            # whose answer was lost is complete, or aborts it)
            try:
                await self._renew(exc)
            except Fenced:
                raise
            except Exception as e:
                log.warning("renewing the reply producer failed: %s", e,
                            extra={"worker": self._state.index})
        for _, _, partition, offset in batch:
            self._failed(partition, offset, exc)

    async def _one(self, batch: list[Queued]) -> list[Any]:
        """One transaction of ``batch``: the metadata of each reply once it committed."""
        st = self._state
        producer, topic = self.producer, st.egress_topic
        headers = [(GEN_HEADER, f"{st.index}.{st.generation}".encode())]
        await producer.begin_transaction()
        futs = [await producer.send(topic, value, partition=p, headers=headers)
                for p, value, _, _ in batch]
        mds = await asyncio.gather(*futs)
        await self._leased()  # (the commit makes them visible: only under the lease)
        await producer.commit_transaction()
        return list(mds)

    async def _renew(self, exc: BaseException) -> None:
        """A new producer of the same id in place of the current one (``exc``: why); it
        fences the old one, whose open transaction the broker aborts."""
        await self._leased()  # (a new producer fences every older one: the owner's act)
        slot = self._state.index
        if self.producer is not None:
            log.warning("the reply transaction failed (%s: %s): replacing the producer and "
                        "trying again", type(exc).__name__, exc, extra={"worker": slot})
            self._retire(self.producer)
            self.producer = None
        tid = self.txn_id or transactional_id(self._state.egress_topic, slot)
        self.producer = await start_kafka(lambda: self.new_producer(tid), self._settings.kafka,
                                          RENEW_PATIENCE, slot)
        self.txn_id = tid
        self.renewals += 1
        self._broken = False

    def _retire(self, old: Any) -> None:
        async def stop() -> None:
            try:
                await old.stop()
            except Exception as e:
                log.info("stopping a replaced reply producer: %s", e)
        task = asyncio.get_running_loop().create_task(stop())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _acked(self, md: Any, partition: int, offset: int) -> None:
        if md.offset + 1 > self.acked.get(md.partition, 0):
            self.acked[md.partition] = md.offset + 1
        if offset >= 0:
            assert self._completed is not None, "Egress.completes: not wired"
            self._completed.complete(partition, offset)

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
