"""A worker's Kafka clients: one producer (replies, epoch-log records) and one consumer
(ingress), started patiently — a broker restart must not make the supervisor give up on
the worker.

The producer is idempotent (``acks=all``), and aiokafka's idempotent producer, once a
broker answered ``OutOfOrderSequenceNumber`` (seen after a broker restart under load: the
new leader's sequence of this producer is behind the one the producer holds), rejects every
later record to that partition — the Java client resets its producer epoch there, aiokafka
does not. The client replaces its producer then (``sfaas.client``); so does a worker: a
reply or an epoch-log record whose delivery failed with one of :data:`DESYNCED` is sent
again through a new producer (:meth:`KafkaClients.resend`), at most :data:`RESENDS` times,
before the write fails as it did before (the worker leaves the cluster for a recovery).
The producer is replaced in place, once for all the records it rejected
(:meth:`KafkaClients.renew_producer`); every part reads ``KafkaClients.producer`` at each
send, so all of them use the new one from then on, and the old one is stopped in the
background.

Why a record sent again is not appended twice: the broker answers these errors for a
batch it did not append (a sequence out of order, a producer id or epoch it does not know
or that is stale). The one way to two copies is an earlier attempt of the same batch
that a broker did append but could not answer (a connection lost), followed by an answer
from a broker that misses it — the stale leader of KIP-320, which aiokafka cannot tell
apart. Even then the second copy is harmless, because both copies are the same bytes:

* an epoch-log record: a recovery keys the records it replays by epoch (a worker writes
  one record per epoch) and collects the epochs to replay in a set
  (``worker.protocols.recovery``), so a second copy replays nothing twice; no record of
  the next epoch lands between the copies (its Begin waits for this worker's report,
  which waits for this record's acknowledgement);
* a reply: its client takes the first reply of a request id and drops later ones (the
  request no longer waits: ``sfaas.client.Client._read_replies``), and a recovery reads
  the replies already out into a map by request id.

Snapshot rounds' cut records (``sfaas.runtime.epochlog.CutRecord``) are not sent again:
a recovery does not merge copies of those.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any, NamedTuple, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    UnknownProducerId,
)

from sfaas.errors import ClusterError
from sfaas.runtime import ports
from sfaas.runtime.kafka import make_consumer, make_producer
from sfaas.runtime.ports import ClockPort, KafkaPort
from sfaas.runtime.settings import Settings
from worker.fence import FenceLease

log = logging.getLogger("sfaas.worker")

__all__ = ["KafkaClients", "start_kafka", "hand_over", "warm_topic", "Sent", "DESYNCED", "RESENDS"]

#: Delivery errors after which the idempotent producer is stuck and the broker appended
#: nothing of the rejected batch (see the module docstring). aiokafka reports a produce
#: answer's ``INVALID_PRODUCER_EPOCH`` as ``ProducerFenced``; no other producer can fence
#: ours (it has no transactional id).
DESYNCED = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch, ProducerFenced)
#: Times one record is sent again through a new producer (see the module docstring).
RESENDS = 3
#: Seconds a new producer may take to start before the renewal fails (the write then fails).
RENEW_PATIENCE = 10.0


async def start_kafka(make: Callable[[], Any], where: str, patience: float = 120.0,
                      index: int = -1, *, clock: ClockPort | None = None) -> Any:
    """Start the Kafka client ``make()`` gives, retrying while the broker at ``where`` is
    unreachable, at most ``patience`` seconds of ``clock`` (the process's when None)."""
    clock = clock or ports.current().clock
    deadline = clock.monotonic() + patience
    while True:
        client = make()
        try:
            await client.start()
            return client
        except Exception as exc:
            await client.stop()
            if clock.monotonic() > deadline:
                raise ClusterError(f"Kafka at {where} unreachable for {patience:.0f} s: "
                                   f"{exc}") from exc
            log.warning("Kafka at %s unreachable (%s); retrying", where, exc,
                        extra={"worker": index})
            await asyncio.sleep(1.0)


#: Seconds the head start :func:`know_group` may take: past it the start goes on without it
#: (a Kafka that does not answer holds the lookups themselves).
HEAD_START_PATIENCE = 2.0


async def know_group(consumer: Any, tps: Collection[TopicPartition]) -> None:
    """Have ``consumer`` find its group's coordinator now (asking for ``tps``' committed
    offsets): the ingest's first positions otherwise fail once on an unknown coordinator
    and wait a retry backoff (100 ms) of a restarted worker's start. Only a head start."""
    try:
        async with asyncio.timeout(HEAD_START_PATIENCE):
            for tp in tps:
                await consumer.committed(tp)
    except Exception as exc:
        log.info("could not find the consumer group's coordinator ahead of the ingest: %r", exc)


async def warm_topic(producer: Any, topic: str) -> None:
    """Fetch ``topic``'s metadata into a just started ``producer`` now: its first send to a
    topic it does not know yet waits for a metadata refresh (0.13 s on a busy host), which a
    recovery's fence record would otherwise pay. Only a head start: the send fetches it
    anyway, so a failure here is logged and left."""
    try:
        await producer.partitions_for(topic)
    except Exception as exc:
        log.info("could not fetch the metadata of %s ahead of its first record: %s", topic, exc)


class Sent(NamedTuple):
    """A record handed to ``producer``: ``delivery`` ends with its metadata or error."""

    producer: Any
    delivery: asyncio.Future[Any]
    topic: str
    value: bytes
    partition: int
    headers: list[tuple[str, bytes]] | None = None


class HasProducer(Protocol):
    producer: Any


async def hand_over(kafka: HasProducer, topic: str, value: bytes, partition: int,
                    headers: list[tuple[str, bytes]] | None = None) -> Sent:
    """Hand a record to ``kafka.producer``; a send caught in a producer replaced meanwhile
    (stopping: ``ProducerClosed``, as when its batch was full) goes to its successor."""
    while True:
        producer = kafka.producer
        try:
            delivery = await producer.send(topic, value, partition=partition, headers=headers)
        except ProducerClosed:
            if producer is kafka.producer:  # (stopped, not replaced: the worker stops)
                raise
            continue
        return Sent(producer, delivery, topic, value, partition, headers)


class KafkaClients:
    """The producer and the consumer (None until started) and the consumer's group."""

    def __init__(self, settings: Settings, kafka: KafkaPort | None = None) -> None:
        """``kafka``: the Kafka port its clients are made by (``sfaas.runtime.ports``; the
        process's when None)."""
        self._settings = settings
        self._port = kafka
        self.producer: Any = None
        self.consumer: Any = None
        #: the group ``consumer`` was started in
        self.group = ""
        #: makes a producer, not started (a seam: tests give fakes)
        self.new_producer: Callable[[], Any] = lambda: make_producer(
            settings.kafka, settings.linger_ms, durable=True, kafka=kafka)
        #: producers replaced so far (stuck in ``OutOfOrderSequenceNumber`` and the like)
        self.producer_renewals = 0
        #: the renewal under way (one at a time), and the replaced producers stopping
        #: (held: the loop keeps weak references)
        self._renewing: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._index = -1

    async def start_producer(self, index: int = -1) -> None:
        self._index = index
        self.producer = await start_kafka(self.new_producer, self._settings.kafka, index=index)

    async def start_consumer(self, group: str, index: int = -1) -> None:
        """(Re)start the consumer in ``group``."""
        s = self._settings
        if self.consumer is not None:
            await self.consumer.stop()
        self.consumer = await start_kafka(
            lambda: make_consumer(s.kafka, group, s.fetch_wait_ms, kafka=self._port), s.kafka,
            index=index)
        self.group = group

    # -- a stuck producer (see the module docstring) ----------------------------------------------
    async def send(self, topic: str, value: bytes, partition: int,
                   headers: list[tuple[str, bytes]] | None = None) -> Sent:
        """Hand a record to the producer (:func:`hand_over`); :meth:`delivered` awaits it."""
        return await hand_over(self, topic, value, partition, headers)

    async def delivered(self, sent: Sent, fence: FenceLease | None = None) -> Any:
        """The metadata of ``sent``'s record once the broker has it, sent again through a
        new producer if its own is stuck (:meth:`resend`)."""
        try:
            # (shielded: a caller cancelled — the epoch halted by a recovery — must not
            # cancel the delivery; the record may still land, and the epoch log's settle
            # waits for it: worker.epoch_log)
            return await asyncio.shield(sent.delivery)
        except DESYNCED as exc:
            return await self.resend(sent, exc, fence)

    async def resend(self, sent: Sent, exc: BaseException, fence: FenceLease | None = None) -> Any:
        """``sent``'s delivery failed with ``exc``: while that is one of :data:`DESYNCED`
        (nothing appended), send the record again through a new producer, at most
        :data:`RESENDS` times, each under ``fence`` (the coordinator's lease, as the first
        send was); its metadata, or the last error raised."""
        for _ in range(RESENDS):
            if not isinstance(exc, DESYNCED):
                break
            await self.renew_producer(sent.producer, exc)
            if fence is not None and not fence.valid():
                await fence.held()
            sent = await hand_over(self, sent.topic, sent.value, sent.partition, sent.headers)
            try:
                return await sent.delivery
            except Exception as e:
                exc = e
        raise exc

    async def renew_producer(self, broken: Any, exc: BaseException) -> None:
        """Replace the producer ``broken`` (stuck: ``exc``) by a new one, unless it was
        replaced already; returns once no renewal is under way. One renewal at a time:
        whoever asks while one is under way waits for it."""
        task = self._renewing
        if broken is self.producer and (task is None or task.done()):
            task = self._renewing = asyncio.get_running_loop().create_task(
                self._renew(broken, exc))
            task.add_done_callback(_retrieved)
        if task is not None and not task.done():
            await asyncio.shield(task)  # (a waiter cancelled leaves the renewal running)

    async def _renew(self, broken: Any, exc: BaseException) -> None:
        log.warning("the Kafka producer is stuck (%s: %s): replacing it and sending the records "
                    "it rejected again", type(exc).__name__, exc, extra={"worker": self._index})
        fresh = await start_kafka(self.new_producer, self._settings.kafka, RENEW_PATIENCE,
                                  self._index)
        self.producer = fresh
        self.producer_renewals += 1
        # (its deliveries still under way end first: those it rejected are sent again by
        # whoever waits for them, through ``fresh``)
        stop = asyncio.get_running_loop().create_task(self._retire(broken))
        self._retiring.add(stop)
        stop.add_done_callback(self._retiring.discard)

    async def _retire(self, old: Any) -> None:
        try:
            await old.stop()
        except Exception as exc:
            log.warning("stopping a replaced Kafka producer failed: %s", exc,
                        extra={"worker": self._index})

    async def flush_producer(self) -> None:
        """Every record handed to a producer so far has its outcome: the producer flushed,
        the ones it replaced stopped (their records' callbacks have run)."""
        await self.producer.flush()
        await self._retired()


    async def stop_producer(self) -> None:
        """Stop the producer for good, after a renewal under way (its new producer is the
        one stopped then) and with the producers it replaced; each waits for its
        outstanding deliveries."""
        if self._renewing is not None and not self._renewing.done():
            await asyncio.gather(self._renewing, return_exceptions=True)
        await self.producer.stop()
        await self._retired()

    async def _retired(self) -> None:
        """Every replaced producer stopped (those replaced meanwhile too)."""
        while stopping := [t for t in self._retiring if not t.done()]:
            await asyncio.gather(*stopping)


def _retrieved(task: asyncio.Task[None]) -> None:
    """(A renewal's failure is raised to whoever waits for it; this marks it seen, for
    a renewal whose waiters were all cancelled.)"""
    if not task.cancelled():
        task.exception()
