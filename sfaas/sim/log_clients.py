"""Simulated aiokafka clients on a :class:`~sfaas.sim.broker.Broker`: the producer, consumer
and admin calls the product makes, with aiokafka's structures and exception types (checked
against a real broker by ``tests/sim/test_log_contract.py``).

Each takes the keyword arguments of its aiokafka class and ignores those that only tune a
real client (buffers, metadata refresh, linger); ``bootstrap_servers`` included.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
from collections.abc import Iterable
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import (
    ConsumerStoppedError,
    IllegalOperation,
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
)
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, RecordMetadata

from sfaas.sim.broker import Broker, Partition, Txn

__all__ = ["SimProducer", "SimConsumer"]

#: aiokafka's defaults where the simulation uses them
REQUEST_TIMEOUT_MS = 40_000
TRANSACTION_TIMEOUT_MS = 60_000
#: seconds at most between a cut's heal and an orphaned socket's next retransmission (its
#: timer backed off through the cut)
RETRANSMIT = 3.0


async def until_reachable(broker: Broker, tp: TopicPartition | None, timeout: float,
                          owner: str | None = None) -> None:
    """Wait while the cluster (or ``tp``'s leader) is down or cut from process ``owner``, at
    most ``timeout`` seconds; then ``KafkaTimeoutError``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (broker.leads(tp, owner) if tp is not None else broker.reachable(owner)):
        left = deadline - loop.time()
        if left <= 0:
            raise KafkaTimeoutError(f"no answer from Kafka in {timeout:.0f} s"
                                    + (f" for {tp.topic}[{tp.partition}]" if tp else ""))
        await asyncio.wait([broker.changed()], timeout=left)


class SimProducer:
    """``AIOKafkaProducer``: ``send`` hands a record to a queue the producer delivers in order
    (one request at a time, so each partition keeps the order of sends)."""

    def __init__(self, broker: Broker, *, transactional_id: str | None = None,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS,
                 transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS,
                 owner: str | None = None, **_: Any) -> None:
        self._broker = broker
        #: the process holding it (a cut from the brokers is a process's)
        self._owner = owner
        #: ``(partition, record)`` of the request on the wire (handed to the socket, no
        #: answer yet)
        self._wire: tuple[TopicPartition, Any] | None = None
        self._tid = transactional_id
        self._request_timeout = request_timeout_ms / 1000
        self._txn_timeout = transaction_timeout_ms / 1000
        self._epoch = -1
        self._started = False
        self._closed = False
        #: a fatal error (fenced): every transactional call fails from here on
        self._fatal: KafkaError | None = None
        #: the process holding this producer died (:meth:`kill`)
        self._dead = False
        self._txn: Txn | None = None
        #: the first error of the open transaction's sends (its commit raises it)
        self._txn_error: BaseException | None = None
        #: partitions whose sequence went out of order (every later send to them fails)
        self._stuck: set[TopicPartition] = set()
        self._queue: collections.deque[tuple[TopicPartition, Any, asyncio.Future[Any]]] = \
            collections.deque()
        self._delivering: asyncio.Task[None] | None = None
        broker.producer_ids += 1
        self._id = broker.producer_ids

    async def start(self) -> None:
        await until_reachable(self._broker, None, self._request_timeout, self._owner)
        if self._tid is not None:
            self._epoch = self._broker.init_producer(self._tid)
        self._started = True

    async def stop(self) -> None:
        if self._closed:
            return
        await self.flush()
        self._closed = True

    async def flush(self) -> None:
        while self._delivering is not None and not self._delivering.done():
            await asyncio.wait([self._delivering])

    async def partitions_for(self, topic: str) -> set[int]:
        await until_reachable(self._broker, None, self._request_timeout, self._owner)
        return {p.tp.partition for p in self._partitions(topic)}

    def _partitions(self, topic: str) -> list[Partition]:
        parts = self._broker.topics.get(topic)
        if parts is None:
            raise KafkaTimeoutError(f"topic {topic!r} not in the metadata")
        return parts

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: list[tuple[str, bytes]] | None = None) -> asyncio.Future[Any]:
        """Queue a record; the future ends with its ``RecordMetadata`` or its error."""
        if self._closed:
            raise ProducerClosed()
        if self._tid is not None and (self._txn is None or self._fatal is not None):
            raise IllegalOperation("Can't send messages while not in transaction")
        parts = self._partitions(topic)
        if partition is None:
            partition = self._broker.rng.randrange(len(parts))
        if not 0 <= partition < len(parts):
            raise AssertionError("Unrecognized partition")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        record = (value, key, tuple(headers or ()), self._txn)
        self._queue.append((TopicPartition(topic, partition), record, fut))
        if self._delivering is None or self._delivering.done():
            self._delivering = asyncio.get_running_loop().create_task(self._deliver())
        return fut

    def kill(self) -> None:
        """The process holding this producer died: nothing it queued or does later reaches
        the log (a cancelled task's ``finally`` would still commit), and what it has in
        flight neither — but the request on the wire of a process cut from the brokers,
        which lands once the cut heals (:meth:`_orphaned`)."""
        self._dead = self._closed = True
        self._fatal = ProducerFenced()
        if self._wire is not None and not self._broker.reachable(self._owner):
            tp, record = self._wire
            txn = record[3]
            if txn is None:  # (a transaction's send dies with its producer's epoch)
                self._broker.event(f"fault orphan p{self._id} {tp.topic}[{tp.partition}] "
                                   f"on the wire")
                # (owned by no process: the dead one's tasks are cancelled)
                asyncio.get_running_loop().create_task(self._orphaned(tp, record),
                                                       context=contextvars.Context())
        while self._queue:
            fut = self._queue.popleft()[2]
            if not fut.done():
                fut.set_exception(ProducerClosed())

    async def _orphaned(self, tp: TopicPartition, record: Any) -> None:
        """The request on the wire when its process died cut from the brokers: the
        kernel still sends an orphaned socket's bytes, so it lands after the cut heals
        (within the request timeout), at the retransmission timer's next try — up to
        :data:`RETRANSMIT` s later, after the slot's next process may have written — a
        record its writer never knew was appended."""
        try:
            await until_reachable(self._broker, tp, self._request_timeout, self._owner)
        except KafkaTimeoutError:
            return
        await asyncio.sleep(self._broker.rng.uniform(0.0, RETRANSMIT))
        value, key, headers, txn = record
        entry = self._broker.append(tp, value, key, headers, txn)
        self._broker.event(f"fault orphan p{self._id} {tp.topic}[{tp.partition}] lands "
                           f"@{entry.offset}")

    async def _deliver(self) -> None:
        while self._queue:
            tp, record, fut = self._queue.popleft()
            try:
                md = await self._produce(tp, record)
            except Exception as exc:
                txn = record[3]
                if txn is not None and txn is self._txn and self._txn_error is None:
                    self._txn_error = exc
                if not fut.done():
                    fut.set_exception(exc)
            else:
                if not fut.done():
                    fut.set_result(md)

    async def _produce(self, tp: TopicPartition, record: Any) -> RecordMetadata:
        b, f = self._broker, self._broker.faults
        value, key, headers, txn = record
        if wait := b.latency():
            await asyncio.sleep(wait)
        self._wire = (tp, record)
        try:
            await until_reachable(b, tp, self._request_timeout, self._owner)
        finally:
            self._wire = None
        if self._dead:
            raise ProducerClosed()
        if self._tid is not None and (b.fenced(self._tid, self._epoch)
                                      or txn is None or txn.state != "open"):
            self._fatal = ProducerFenced()
            raise self._fatal
        if tp in self._stuck:
            raise OutOfOrderSequenceNumber(f"{tp.topic}[{tp.partition}]: out of order")
        if b.chance(f.desync):
            self._stuck.add(tp)
            b.event(f"fault desync p{self._id} {tp.topic}[{tp.partition}]")
            raise OutOfOrderSequenceNumber(f"{tp.topic}[{tp.partition}]: out of order")
        if b.chance(f.send_error):
            b.event(f"fault send-error p{self._id} {tp.topic}[{tp.partition}]")
            raise KafkaTimeoutError("produce request timed out")
        entry = b.append(tp, value, key, headers, txn)
        if b.chance(f.lost_ack):
            b.event(f"fault lost-ack p{self._id} {tp.topic}[{tp.partition}]@{entry.offset}")
            raise KafkaTimeoutError("produce request timed out (appended)")
        return RecordMetadata(tp.topic, tp.partition, tp, entry.offset, entry.timestamp, 0,
                              b.partition(tp).start)

    # -- transactions -------------------------------------------------------------------------
    def _transition(self, to: str) -> None:
        if self._tid is None:
            raise IllegalOperation("the producer has no transactional_id")
        if self._fatal is not None:
            raise AssertionError(f"Invalid state transition TransactionState.FATAL_ERROR -> "
                                 f"TransactionState.{to}")

    async def begin_transaction(self) -> None:
        self._transition("IN_TRANSACTION")
        if self._txn is not None:
            raise AssertionError("Invalid state transition TransactionState.IN_TRANSACTION "
                                 "-> TransactionState.IN_TRANSACTION")
        assert self._tid is not None
        self._txn = self._broker.begin(self._tid, self._epoch, self._txn_timeout)
        self._txn_error = None

    async def commit_transaction(self) -> None:
        """Commit the open transaction; a fenced producer's commit raises ``ProducerFenced``
        (then, like aiokafka's, it is in a fatal state: begin and abort fail)."""
        if self._fatal is not None:
            raise self._fatal
        self._transition("COMMITTING_TRANSACTION")
        await self.flush()
        txn = self._txn
        assert txn is not None, "no transaction open"
        b = self._broker
        await until_reachable(b, None, self._request_timeout, self._owner)
        if self._fatal is not None or b.fenced(txn.tid, txn.epoch) or txn.state != "open":
            self._fatal = ProducerFenced()
            raise self._fatal
        if self._txn_error is not None:
            raise self._txn_error
        b.end_txn(txn, commit=True)
        self._txn = None

    async def abort_transaction(self) -> None:
        self._transition("ABORTING_TRANSACTION")
        await self.flush()
        txn, self._txn = self._txn, None
        if txn is not None and not self._broker.fenced(txn.tid, txn.epoch):
            self._broker.end_txn(txn, commit=False)


class _Metadata:
    """What ``consumer._client`` offers the product: a metadata refresh (a no-op here:
    a stale leader's answers end with its fault, not with a refresh)."""

    async def force_metadata_update(self) -> bool:
        await asyncio.sleep(0)
        return True


class SimConsumer:
    """``AIOKafkaConsumer`` with manual assignment (the product never subscribes)."""

    def __init__(self, broker: Broker, *, group_id: str | None = None,
                 auto_offset_reset: str = "latest", isolation_level: str = "read_uncommitted",
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS, owner: str | None = None,
                 **_: Any) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset {auto_offset_reset!r}")
        if isolation_level not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"isolation_level {isolation_level!r}")
        self._broker = broker
        self._owner = owner
        self._group = group_id
        self._reset = auto_offset_reset
        self._committed_only = isolation_level == "read_committed"
        self._request_timeout = request_timeout_ms / 1000
        self._closed = False
        #: assigned partitions → the next offset to fetch (None: to be reset)
        self._positions: dict[TopicPartition, int | None] = {}
        self._highwater: dict[TopicPartition, int] = {}
        self._lso: dict[TopicPartition, int] = {}
        self._client = _Metadata()

    async def start(self) -> None:
        await until_reachable(self._broker, None, self._request_timeout, self._owner)

    async def stop(self) -> None:
        self._closed = True

    # -- assignment and positions -------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._positions = {tp: None for tp in partitions}
        self._highwater = {}
        self._lso = {}

    def assignment(self) -> set[TopicPartition]:
        return set(self._positions)

    def _assigned(self, tp: TopicPartition) -> None:
        if tp not in self._positions:
            raise IllegalStateError(f"Partition {tp} is not assigned")

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if not isinstance(offset, int) or offset < 0:
            raise ValueError("Offset must be a positive integer")
        self._assigned(partition)
        self._positions[partition] = offset

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        ends = await self.end_offsets(list(partitions or self._positions))
        for tp, end in ends.items():
            self.seek(tp, end)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        starts = await self.beginning_offsets(list(partitions or self._positions))
        for tp, start in starts.items():
            self.seek(tp, start)

    async def position(self, partition: TopicPartition) -> int:
        self._assigned(partition)
        at = self._positions[partition]
        if at is None:
            await until_reachable(self._broker, partition, self._request_timeout, self._owner)
            at = self._positions[partition] = self._reset_position(partition)
        return at

    def _reset_position(self, tp: TopicPartition, out_of_range: int | None = None) -> int:
        """Where a partition without a valid position reads from: the group's committed
        offset (unless that is what is out of range), else the reset policy."""
        committed = None if self._group is None else self._broker.groups.get((self._group, tp))
        if committed is not None and out_of_range is None:
            return committed
        part = self._broker.partition(tp)
        if self._reset == "earliest":
            return part.start
        if self._reset == "latest":
            return part.end(self._committed_only)
        if out_of_range is not None:
            raise OffsetOutOfRangeError({tp: out_of_range})
        raise NoOffsetForPartitionError(f"{tp}: no committed offset and no reset policy")

    def highwater(self, partition: TopicPartition) -> int | None:
        assert partition in self._positions, "Partition is not assigned"
        return self._highwater.get(partition)

    def last_stable_offset(self, partition: TopicPartition) -> int | None:
        assert partition in self._positions, "Partition is not assigned"
        return self._lso.get(partition)

    # -- offsets ------------------------------------------------------------------------------
    async def _offsets(self, partitions: Iterable[TopicPartition], end: bool
                       ) -> dict[TopicPartition, int]:
        out = {}
        for tp in partitions:
            await until_reachable(self._broker, tp, self._request_timeout, self._owner)
            part = self._broker.partition(tp)
            stale = self._broker.stale_end(tp) if end else None
            out[tp] = part.start if not end else part.end(self._committed_only) \
                if stale is None else min(stale, part.end(self._committed_only))
        return out

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's end: its last stable offset (``read_committed``) or high
        watermark; a stale leader's answer is behind."""
        return await self._offsets(partitions, end=True)

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]
                                ) -> dict[TopicPartition, int]:
        return await self._offsets(partitions, end=False)

    async def committed(self, partition: TopicPartition) -> int | None:
        if self._group is None:
            raise IllegalOperation("Requires group_id")
        await until_reachable(self._broker, None, self._request_timeout, self._owner)
        return self._broker.groups.get((self._group, partition))

    async def commit(self, offsets: dict[TopicPartition, Any] | None = None) -> None:
        if self._group is None:
            raise IllegalOperation("Requires group_id")
        if offsets is None:
            offsets = {tp: await self.position(tp) for tp in self._positions}
        await until_reachable(self._broker, None, self._request_timeout, self._owner)
        for tp, o in offsets.items():
            offset = o.offset if isinstance(o, OffsetAndMetadata) else o
            self._broker.groups[(self._group, tp)] = offset
            self._broker.event(f"commit {self._group} {tp.topic}[{tp.partition}]={offset}")

    # -- fetching -----------------------------------------------------------------------------
    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, list[Any]]:
        """Records from each partition's position on (``max_records`` in all); waits up to
        ``timeout_ms`` for one. A position out of range follows ``auto_offset_reset``."""
        if self._closed:
            raise ConsumerStoppedError()
        if max_records is not None and (not isinstance(max_records, int) or max_records < 1):
            raise ValueError("`max_records` must be a positive Integer")
        b, loop = self._broker, asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            if wait := b.latency():
                await asyncio.sleep(wait)
            out: dict[TopicPartition, list[Any]] = {}
            if not b.chance(b.faults.empty_fetch):
                left = max_records if max_records is not None else 500
                for tp in list(partitions or self._positions):
                    got = self._fetch(tp, left)
                    if got:
                        out[tp] = got
                        left -= len(got)
                    if left <= 0:
                        break
            left_s = deadline - loop.time()
            if out or left_s <= 0:
                return out
            await asyncio.wait([b.changed()], timeout=left_s)

    def _fetch(self, tp: TopicPartition, limit: int) -> list[ConsumerRecord[Any, Any]]:
        """One partition's fetch from its position: up to ``limit`` records; the position
        moves past them and past the control markers and aborted records it skipped."""
        b = self._broker
        self._assigned(tp)
        if not b.leads(tp, self._owner):
            return []
        part = b.partition(tp)
        end = part.end(self._committed_only)
        stale = b.stale_end(tp)
        if stale is not None:
            end = min(end, stale)
        at = self._positions[tp]
        if at is None:
            at = self._reset_position(tp)
        if at < part.start or at > (stale if stale is not None else part.hw):
            at = self._reset_position(tp, out_of_range=at)
        self._highwater[tp] = part.hw if stale is None else stale
        self._lso[tp] = min(part.lso, self._highwater[tp])
        got: list[ConsumerRecord[Any, Any]] = []
        while at < end and len(got) < limit:
            e = part.at(at)
            at += 1
            if e.control or (self._committed_only and e.txn is not None
                             and e.txn.state == "aborted"):
                continue
            got.append(ConsumerRecord(tp.topic, tp.partition, e.offset, e.timestamp, 0, e.key,
                                      e.value, None, len(e.key or b""), len(e.value or b""),
                                      e.headers))
        self._positions[tp] = at
        return got
