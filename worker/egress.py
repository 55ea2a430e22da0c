"""Egress: replies out to Kafka in transactions, and ingress offsets committed once their
replies are in.

A committed (or finally aborted) request's reply is queued here by the epoch's commit and
produced at once, in commit order, to the reply partition the request named — inside a
Kafka transaction of this worker's *slot*. The slot has two transactional producers, its
*lanes* (ids ``<egress topic>.slot-<index>`` and ``…-<index>.1``, :func:`transactional_id`),
started when the slot is taken (``worker.membership``). One lane's transaction is open and
takes every reply as it comes, for ``reply_commit_ms`` (a window: a transaction costs the
broker an AddPartitionsToTxn, an EndTxn and a marker per partition, whatever it holds); then
it commits, and the other lane opens the next transaction — so a reply never waits for a
commit before it is sent. A snapshot round and a recovery (:meth:`Egress.durable`) commit
the open transaction at once. When a transaction commits, its requests are *completed*:
their ingress offsets may be committed to the consumer group (``sfaas.runtime.txn.offsets``)
and they stop counting against the worker's in-flight limit (``worker.ingress``), which is
what bounds the replies queued here.

Why transactions: the slot's next process (a replacement, a promoted standby) starts its
producers with the same ids, and the broker then fences the previous ones — aborting their
open transactions and refusing whatever they still send, including bytes a killed process
left in its socket that reach the broker late (after a cut heals). Without that, a dead
worker's reply could land in the egress topic *after* its successor's recovery read the
topic (``worker.protocols.recovery``, step 4), and the replay would produce it a second
time (the nemesis caught 4 such replies, seed 4251531938). The recovery reads the topic
``read_committed``, so it sees exactly the replies that count, and a replay produces the
others. Readers that want every reply once read ``read_committed`` too (docs/guide: the
Kafka path); ``sfaas.Client`` reads uncommitted replies for latency and keeps the first per
request id — an aborted reply is the same bytes its replay commits.

A transaction that fails because the producer is stuck or fenced (:data:`RETRY`: the broker
appended nothing that counts — the transaction is aborted) is tried again through a new
producer of the lane's id, at most ``worker.clients.RESENDS`` times, each under the
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
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import IllegalOperation

from sfaas.runtime import wire
from sfaas.runtime.kafka import make_producer
from sfaas.runtime.ports import KafkaPort
from sfaas.runtime.settings import Settings
from worker.clients import DESYNCED, RENEW_PATIENCE, RESENDS, start_kafka, warm_topic
from worker.fence import OPEN_POLL, Fenced, FenceLease
from worker.needs import Completions
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker")

__all__ = ["Egress", "Lane", "Uplink", "Clients", "GEN_HEADER", "RETRY", "LANES",
           "transactional_id"]

#: The Kafka header on every reply: ``b"<slot>.<generation>"`` of the process that made it.
GEN_HEADER = "sfaas-gen"
#: Transaction failures after which nothing of it counts (aborted, or never appended), so it
#: is tried again through a new producer: a stuck or fenced producer (aiokafka reports a
#: transaction the broker timed out as ``ProducerFenced``), or one left in a failed state.
RETRY = (*DESYNCED, IllegalOperation)

#: (reply partition, encoded reply, ingress partition, ingress offset)
Queued = tuple[int, bytes, int, int]
#: The slot's lanes: transactional producers used in turn (see the module docstring).
LANES = 2
#: A stopping worker waits for its queued replies to commit at most this many heartbeat
#: timeouts: a transaction commits only under the coordinator's lease, so a worker stopped
#: while cut from the coordinator would wait forever (the simulator's seed 35); what it
#: leaves uncommitted the recovery that follows its loss produces again.
STOP_PATIENCE = 2.0
#: A transaction commits once it holds this many replies, whatever its window.
MAX_TXN_REPLIES = 5000


def transactional_id(egress_topic: str, slot: int, lane: int = 0) -> str:
    """The transactional id of slot ``slot``'s replies in ``lane``: the same in every
    process that holds the slot, so each new one fences the one before."""
    return f"{egress_topic}.slot-{slot}" + (f".{lane}" if lane else "")


def _seen(task: asyncio.Task[None]) -> None:
    """(A commit's exception — ``Fenced``, with which the process leaves — is raised to
    whoever waits for it next; marked seen so that one nobody waits for is not logged.)"""
    if not task.cancelled():
        task.exception()


class Unstarted(Exception):
    """The lane's producer failed before (or never started): its transaction goes straight
    to a new producer."""


class Uplink(Protocol):
    """The coordinator's channel, which a worker closes to leave the cluster."""

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


class Clients(Protocol):
    """Whoever holds the Kafka clients (``worker.clients.KafkaClients``): the consumer
    whose group the ingress offsets are committed to."""

    consumer: Any


class Lane:
    """One transactional producer of the slot and the transaction it has open; the
    :class:`Egress` task that drains the queue owns it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.producer: Any = None
        self.txn_id = ""
        #: the last transaction failed: the next one starts with a new producer
        self.broken = False
        #: the open transaction: its replies, their deliveries, when it began, and why it
        #: cannot commit (None: it can)
        self.batch: list[Queued] = []
        self.sent: list[Any] = []
        self.opened = 0.0
        self.error: BaseException | None = None
        #: the commit under way (None: none)
        self.commit: asyncio.Task[None] | None = None

    def busy(self) -> bool:
        return self.commit is not None and not self.commit.done()


class Egress:
    """One worker's replies and offset commits (see module docstring).

    ``completed.complete(partition, offset)``: the request read there completed (its reply
    is committed; the ingress fills the port, ``worker.needs.Completions``, given here or —
    the ingress being built after the egress — by :meth:`completes`).
    """

    def __init__(self, settings: Settings, state: WorkerState, kafka: Clients, uplink: Uplink,
                 completed: Completions | None = None, lease: FenceLease | None = None,
                 kafka_port: KafkaPort | None = None) -> None:
        """``kafka_port``: what :attr:`new_producer` makes producers with
        (``sfaas.runtime.ports``; the process's when None)."""
        self._settings = settings
        self._rounds_on = settings.snapshot_interval > 0
        #: replies leave, and offsets are committed, only under the lease (``worker.fence``)
        self._lease = lease
        self._state = state
        self._kafka = kafka
        self._uplink = uplink
        self._completed = completed
        #: replies queued and not yet sent, in commit order
        self.replies: list[Queued] = []
        self.event = asyncio.Event()
        #: per egress partition, one past the highest offset of a reply committed
        self.acked: dict[int, int] = {}
        #: the slot's producers, used in turn; ``_at``: the lane whose transaction takes replies
        self.lanes = tuple(Lane(i) for i in range(LANES))
        self._at = 0
        #: seconds a transaction stays open for more replies (``reply_commit_ms``)
        self.window = settings.reply_commit_ms / 1000
        #: makes an unstarted transactional producer for an id (a seam: tests give fakes)
        self.new_producer: Callable[[str], Any] = lambda tid: make_producer(
            settings.kafka, settings.linger_ms, transactional_id=tid, kafka=kafka_port)
        #: producers replaced so far (stuck, fenced or failed transactions)
        self.renewals = 0
        #: transactions committed so far
        self.transactions = 0
        #: the one task that sends replies and starts commits (None: none running)
        self._drain: asyncio.Task[None] | None = None
        #: callers waiting for every reply to commit: the open transaction commits at once
        self._urgent = 0
        self._more = asyncio.Event()
        #: replaced producers stopping (held: the loop keeps weak references)
        self._retiring: set[asyncio.Task[None]] = set()

    async def start(self, slot: int) -> None:
        """Start slot ``slot``'s producers (kept if they are the ones running): from here on
        the broker refuses the slot's earlier processes, and their open transactions are
        aborted."""
        await asyncio.gather(*(self._start(lane, slot) for lane in self.lanes))

    async def _start(self, lane: Lane, slot: int) -> None:
        tid = transactional_id(self._state.egress_topic, slot, lane.index)
        if lane.producer is not None and tid == lane.txn_id and not lane.broken:
            return
        old, lane.producer, lane.txn_id = lane.producer, None, tid
        if old is not None:
            self._retire(old)
        lane.producer = await start_kafka(lambda: self.new_producer(tid), self._settings.kafka,
                                          index=slot)
        lane.broken = False
        await warm_topic(lane.producer, self._state.egress_topic)

    async def stop(self) -> None:
        """Stop the producers after the replies queued (the worker stops), waiting for them
        at most :data:`STOP_PATIENCE` heartbeat timeouts."""
        patience = STOP_PATIENCE * self._settings.heartbeat_timeout
        try:
            await asyncio.wait_for(asyncio.shield(self.flush()), patience)
        except TimeoutError:
            log.warning("stopping with replies not committed after %.1f s (the coordinator's "
                        "lease lapsed?): the recovery produces them again", patience,
                        extra={"worker": self._state.index})
        for lane in self.lanes:
            if lane.producer is not None:
                await lane.producer.stop()
        while stopping := [t for t in self._retiring if not t.done()]:
            await asyncio.gather(*stopping)

    def add(self, reply_partition: int, value: bytes, partition: int, offset: int) -> None:
        """Queue one reply to the request read at ingress ``partition:offset`` (-1: none)."""
        self.replies.append((reply_partition, value, partition, offset))
        self.event.set()
        self._more.set()

    def completes(self, ingress: Completions) -> None:
        """Acknowledged replies complete their requests in ``ingress`` (a loop between
        parts, closed once both exist: ``worker.service``)."""
        self._completed = ingress

    async def fence(self, partitions: Iterable[int]) -> dict[int, int]:
        """For a recovery's ``read_committed`` read of the replies (every reply queued is
        committed first, ``worker.quiesce``): per egress partition in ``partitions``, the
        offset of a fence record (``wire.FENCE``) this worker just wrote there through the
        partition's leader, in a transaction it then aborts. The read must reach it: every
        reply committed before is before it — whatever a stale leader answers — and a
        ``read_committed`` reader never sees the record. Raises when it cannot be written
        (the recovery fails, and is retried)."""
        parts = sorted(partitions)
        lane = self.lanes[self._at]
        if lane.batch or lane.busy():
            raise RuntimeError("replies are still being produced; the recovery fences after "
                               "they are committed")
        await self._leased(recovering=True)  # (see FenceLease.held_open)
        if lane.broken or lane.producer is None:
            await self._renew(lane, Unstarted("the reply producer failed before the fence"))
        await self._leased(recovering=True)  # (the abort ends a transaction of the slot)
        st, producer = self._state, lane.producer
        try:
            # (a producer fenced meanwhile by the slot's other process — a promoted standby
            # that then was lost itself — is left in FATAL_ERROR, whose begin aiokafka
            # refuses with an AssertionError: broken too, or every attempt of the recovery
            # failed the same way for ever, nemesis seed 13)
            await producer.begin_transaction()
            futs = [await producer.send(st.egress_topic, wire.FENCE, partition=p) for p in parts]
            mds = await asyncio.gather(*futs)
        except BaseException:
            lane.broken = True  # (renewed before its next transaction)
            raise
        await producer.abort_transaction()
        return {md.partition: int(md.offset) for md in mds}

    async def run(self) -> None:
        """Produce queued replies as they come (the worker's egress task)."""
        while True:
            await self.event.wait()
            self.event.clear()
            await asyncio.shield(self._draining())

    def _draining(self) -> asyncio.Task[None]:
        task = self._drain
        if task is None or task.done():
            task = self._drain = asyncio.get_running_loop().create_task(self._drain_all())
        return task

    def _pending(self) -> bool:
        return bool(self.replies) or any(lane.batch or lane.busy() for lane in self.lanes) \
            or (self._drain is not None and not self._drain.done())

    async def flush(self) -> None:
        """Send every reply queued so far and commit it at once; returns once each is
        committed (or failed for good). Whoever calls this waits for the egress' tasks (a
        caller cancelled leaves them running)."""
        self._urgent += 1
        self._more.set()
        try:
            while self._pending():
                await asyncio.shield(self._draining())
                for lane in self.lanes:
                    if lane.commit is not None and lane.busy():
                        await asyncio.shield(lane.commit)
                    elif lane.commit is not None and lane.commit.done():
                        lane.commit.result()  # (a zombie's commit raised Fenced: so does this)
        finally:
            self._urgent -= 1

    async def durable(self, recovering: bool = False) -> None:
        """Every reply queued so far is committed (or failed for good). ``recovering``: a
        recovery's step — the commits wait for the coordinator's lease, so a lapsed lease
        with the coordinator's channel closed ends the wait with ``ChannelClosed``
        (``FenceLease.open``): only the rejoin that follows the recovery renews it (the
        simulator, seed 456: a coordinator restarted while a worker's recovery flushed
        its replies, cut from Kafka; the recovery waited for ever and the worker never
        rejoined)."""
        lease = self._lease
        if not recovering or lease is None or not self._pending():
            await self.flush()
            return
        flush = asyncio.ensure_future(self.flush())
        try:
            while not (await asyncio.wait([flush], timeout=OPEN_POLL))[0]:
                lease.open()
            flush.result()
        finally:
            flush.cancel()  # (its commits go on: flush shields them)

    async def _drain_all(self) -> None:
        """Send queued replies into the open transaction; commit it when its window ends (at
        once when someone flushes), and go on in the other lane. Returns once nothing is
        queued and no transaction is open."""
        loop = asyncio.get_running_loop()
        while True:
            lane = self.lanes[self._at]
            if self.replies:
                await self._leased()
                batch, self.replies = self.replies, []
                await self._send(lane, batch)
                continue
            if not lane.batch:
                return
            wait = lane.opened + self.window - loop.time()
            if self._urgent or wait <= 0 or len(lane.batch) >= MAX_TXN_REPLIES or lane.error:
                self._commit(lane)
                self._at = (self._at + 1) % LANES
                continue
            self._more.clear()
            try:
                await asyncio.wait_for(self._more.wait(), wait)
            except TimeoutError:
                pass

    async def _send(self, lane: Lane, batch: list[Queued]) -> None:
        """Hand ``batch`` to ``lane``'s transaction (opened here if none is)."""
        if not lane.batch:
            if lane.commit is not None:  # (its last transaction must have ended)
                await asyncio.gather(lane.commit, return_exceptions=True)
                lane.commit.result()
            lane.opened, lane.sent, lane.error = asyncio.get_running_loop().time(), [], None
            try:
                if lane.broken or lane.producer is None:
                    raise Unstarted(f"reply producer {lane.index} needs renewing")
                await lane.producer.begin_transaction()
            except Exception as e:
                lane.error = e
        lane.batch.extend(batch)
        if lane.error is not None:
            return
        st = self._state
        headers = [(GEN_HEADER, f"{st.index}.{st.generation}".encode())]
        try:
            for p, value, _, _ in batch:
                lane.sent.append(await lane.producer.send(st.egress_topic, value, partition=p,
                                                          headers=headers))
        except Exception as e:
            lane.error = e

    def _commit(self, lane: Lane) -> None:
        """Commit ``lane``'s open transaction in the background."""
        batch, sent, error = lane.batch, lane.sent, lane.error
        lane.batch, lane.sent, lane.error = [], [], None
        lane.commit = asyncio.get_running_loop().create_task(
            self._finish(lane, batch, sent, error))
        lane.commit.add_done_callback(_seen)

    async def _finish(self, lane: Lane, batch: list[Queued], sent: list[Any],
                      error: BaseException | None) -> None:
        if error is None:
            try:
                mds = await asyncio.gather(*sent)
                await self._leased()  # (the commit makes them visible: only under the lease)
                await lane.producer.commit_transaction()
            except Fenced:
                raise
            except Exception as e:
                error = e
            else:
                self._done(batch, list(mds))
                return
        lane.broken = True
        if isinstance(error, (*RETRY, Unstarted)):
            await self._transact(lane, batch, error)
        else:
            await self._give_up(lane, batch, error)

    async def _leased(self, recovering: bool = False) -> None:
        """Wait for the coordinator's lease (``recovering``: a recovery's step, which a
        closed coordinator channel ends, ``FenceLease.held_open``)."""
        lease = self._lease
        if lease is not None and not lease.valid():
            await (lease.held_open() if recovering else lease.held())

    async def _transact(self, lane: Lane, batch: list[Queued], exc: BaseException) -> None:
        """Produce ``batch`` in one transaction through a new producer of ``lane``'s id,
        tried again while it fails with one of :data:`RETRY` (see the module docstring)."""
        for _ in range(RESENDS):
            try:
                await self._renew(lane, exc)
                mds = await self._one(lane, batch)
            except Fenced:
                raise
            except Exception as e:
                exc, lane.broken = e, True
                if not isinstance(e, RETRY):
                    break
                continue
            self._done(batch, mds)
            return
        await self._give_up(lane, batch, exc)

    async def _give_up(self, lane: Lane, batch: list[Queued], exc: BaseException) -> None:
        if lane.broken and not isinstance(exc, (*RETRY, Unstarted)):
            # (before anyone reads the topic: a new producer's start waits until a commit
            # whose answer was lost is complete, or aborts it)
            try:
                await self._renew(lane, exc)
            except Fenced:
                raise
            except Exception as e:
                log.warning("renewing the reply producer failed: %s", e,
                            extra={"worker": self._state.index})
        for _, _, partition, offset in batch:
            self._failed(partition, offset, exc)

    def _done(self, batch: list[Queued], mds: list[Any]) -> None:
        self.transactions += 1
        for md, (_, _, partition, offset) in zip(mds, batch, strict=True):
            self._acked(md, partition, offset)

    async def _one(self, lane: Lane, batch: list[Queued]) -> list[Any]:
        """One transaction of ``batch`` at once: the metadata of each reply once it committed."""
        st = self._state
        producer, topic = lane.producer, st.egress_topic
        headers = [(GEN_HEADER, f"{st.index}.{st.generation}".encode())]
        await producer.begin_transaction()
        futs = [await producer.send(topic, value, partition=p, headers=headers)
                for p, value, _, _ in batch]
        mds = await asyncio.gather(*futs)
        await self._leased()  # (the commit makes them visible: only under the lease)
        await producer.commit_transaction()
        return list(mds)

    async def _renew(self, lane: Lane, exc: BaseException) -> None:
        """A new producer of ``lane``'s id in place of its current one (``exc``: why); it
        fences the old one, whose open transaction the broker aborts."""
        await self._leased()  # (a new producer fences every older one: the owner's act)
        slot = self._state.index
        if lane.producer is not None:
            log.warning("the reply transaction failed (%s: %s): replacing the producer and "
                        "trying again", type(exc).__name__, exc, extra={"worker": slot})
            self._retire(lane.producer)
            lane.producer = None
        tid = lane.txn_id or transactional_id(self._state.egress_topic, slot, lane.index)
        lane.producer = await start_kafka(lambda: self.new_producer(tid), self._settings.kafka,
                                          RENEW_PATIENCE, slot)
        lane.txn_id = tid
        self.renewals += 1
        lane.broken = False
        await warm_topic(lane.producer, self._state.egress_topic)

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
