"""A worker whose idempotent producer is stuck (``OutOfOrderSequenceNumber``: the broker
appended nothing and rejects everything after) replaces it in place and sends the
epoch-log record again, instead of leaving the cluster; a producer that stays stuck
through every resend makes it leave as before (``worker/clients.py``, ``worker/epochs.py``).
Without a cluster: a bare worker on fake producers of our own. Replies have a
transactional producer of their own: ``tests/runtime/test_egress_transactions.py``."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import OutOfOrderSequenceNumber, ProducerClosed

from sfaas.runtime import wire
from sfaas.runtime.epochlog import EpochRecord
from sfaas.runtime.partitioning import partition_of
from tests.fuzz.harness import PARTITIONS, bare_worker
from worker.clients import RESENDS
from worker.service import Worker
from worker.state import Pending

LOG_TOPIC = "sfaas.fuzzapp.epochs"


class _Producer:
    """An idempotent producer: a stuck one fails every delivery with
    ``OutOfOrderSequenceNumber``, a sound one acknowledges each at the next offset of its
    partition (``offsets``: shared by the producers of one test, as Kafka's log is)."""

    def __init__(self, offsets: dict[tuple[str, int], int], stuck: bool) -> None:
        self.offsets = offsets
        self.stuck = stuck
        #: (topic, value, partition, headers) of every record handed to this producer
        self.sent: list[tuple[str, bytes, int, Any]] = []
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def flush(self) -> None:
        await asyncio.sleep(0)

    async def send(self, topic: str, value: bytes, partition: int,
                   headers: Any = None) -> asyncio.Future[Any]:
        self.sent.append((topic, value, partition, headers))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.stuck:
            fut.set_exception(OutOfOrderSequenceNumber())
        else:
            at = self.offsets.get((topic, partition), 0)
            self.offsets[(topic, partition)] = at + 1
            fut.set_result(SimpleNamespace(topic=topic, partition=partition, offset=at))
        return fut


def _producers(w: Worker, first_stuck: bool, new_stuck: bool) -> tuple[_Producer, list[_Producer]]:
    """Give ``w`` a producer (stuck or not) and a factory of new ones; returns the first and
    the list the factory fills."""
    offsets: dict[tuple[str, int], int] = {}
    first = _Producer(offsets, first_stuck)
    made: list[_Producer] = []

    def new() -> _Producer:
        made.append(_Producer(offsets, new_stuck))
        return made[-1]

    w.kafka.producer = first
    w.kafka.new_producer = new
    return first, made


def _worker(tmp_path: Path) -> Worker:
    """A bare worker with snapshot rounds on (so it writes the epoch log, and leaves the
    cluster on a write that fails)."""
    w = bare_worker(str(tmp_path), snapshot_interval=1.0)
    assert w.state.log_topic == LOG_TOPIC and not w.uplink.closed
    return w


def _queue_request(w: Worker, offset: int = 0) -> wire.Request:
    """One request for a key of this worker's, taken from ingress ``p:offset``."""
    mine = w.state.mine()
    key = next(k for k in (f"k{i}" for i in itertools.count())
               if partition_of("kv", k, PARTITIONS) in mine)
    p = partition_of("kv", key, PARTITIONS)
    req = wire.Request(f"r{offset}", "kv", key, "put", [offset], 0, 0.0)
    w.state.offsets.take(p, offset)
    w.state.applied.take(p, offset)
    loop = w.state.loop
    assert loop is not None
    loop.queue.append(Pending(req, p, offset))
    return req


async def _epoch(w: Worker, epoch: int = 1) -> list[wire.Message]:
    """Begin and execute one epoch, as the coordinator's Begin does; what went to the
    coordinator."""
    begin = wire.Begin(epoch, 1000.0 + epoch)
    t0 = w.epochs.begin(begin)
    assert t0 is not None
    await w.epochs.execute(begin, t0)
    sent: list[wire.Message] = w.uplink.channel.sent  # type: ignore[union-attr]
    return sent


def _renewals_metric(w: Worker) -> float:
    """``sfaas_worker_producer_renewals`` as a scrape of ``/metrics`` reads it."""
    for ch in [*w.links.channels.values(), w.uplink.channel]:
        ch.buffered = lambda: 0  # type: ignore[union-attr]  # (the fake channels buffer nothing)
    family = next(m for m in w.metrics.collect() if m.name == "sfaas_worker_producer_renewals")
    return float(family.samples[0].value)


def _records(p: _Producer, topic: str) -> list[bytes]:
    return [v for t, v, _, _ in p.sent if t == topic]


async def _closing(w: Worker, test: Callable[[], Any]) -> None:
    try:
        await test()
    finally:
        assert w.state.engine is not None
        w.state.engine.close()


# -- the epoch log ---------------------------------------------------------------------------------

async def test_an_epoch_log_record_a_stuck_producer_rejected_is_written_once_through_a_new_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = _worker(tmp_path)
    stuck, made = _producers(w, first_stuck=True, new_stuck=False)

    async def test() -> None:
        _queue_request(w)
        with caplog.at_level(logging.WARNING, logger="sfaas.worker"):
            to_coordinator = await _epoch(w)
        assert not w.uplink.closed  # it did not leave the cluster ...
        assert [type(m) for m in to_coordinator] == [wire.Report]  # ... and reported the epoch
        assert len(made) == 1 and w.kafka.producer is made[0] and made[0].started
        rejected, written = _records(stuck, LOG_TOPIC), _records(made[0], LOG_TOPIC)
        assert len(rejected) == 1 and written == rejected  # the same record, once, on the new one
        assert EpochRecord.decode(written[0]).epoch == 1
        assert w.state.log_pos == 1  # (where the new producer's copy landed, plus one)
        await w.kafka.flush_producer()
        assert stuck.stopped and not made[0].stopped
        assert w.kafka.producer_renewals == 1 and _renewals_metric(w) == 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("producer is stuck (OutOfOrderSequenceNumber" in m for m in warnings), warnings

    await _closing(w, test)


async def test_a_producer_stuck_through_every_resend_makes_the_worker_leave(
        tmp_path: Path) -> None:
    w = _worker(tmp_path)
    first, made = _producers(w, first_stuck=True, new_stuck=True)

    async def test() -> None:
        _queue_request(w)
        to_coordinator = await _epoch(w)
        assert w.uplink.closed  # the write failed for good: the worker left for a recovery
        assert not [m for m in to_coordinator if isinstance(m, wire.Report)]
        assert len(made) == RESENDS and w.kafka.producer_renewals == RESENDS
        assert [len(_records(p, LOG_TOPIC)) for p in [first, *made]] == [1] * (RESENDS + 1)
        await w.kafka.flush_producer()
        assert all(p.stopped for p in [first, *made[:-1]])

    await _closing(w, test)


# -- what a renewal owes the rest of the worker ------------------------------------------------------

class _Holding(_Producer):
    """A producer whose deliveries stay under way until it stops; stopping fails them with
    ``OutOfOrderSequenceNumber`` (its batches a stuck partition rejects), and a send waiting
    for room in its batch then fails with ``ProducerClosed``, as aiokafka's do."""

    def __init__(self, offsets: dict[tuple[str, int], int]) -> None:
        super().__init__(offsets, stuck=False)
        self.pending: list[asyncio.Future[Any]] = []
        self.room = asyncio.Event()
        self.full = False

    async def send(self, topic: str, value: bytes, partition: int,
                   headers: Any = None) -> asyncio.Future[Any]:
        if self.full:
            await self.room.wait()
        if self.stopped:
            raise ProducerClosed()
        self.sent.append((topic, value, partition, headers))
        self.pending.append(asyncio.get_running_loop().create_future())
        return self.pending[-1]

    async def stop(self) -> None:
        self.stopped = True
        self.room.set()
        await asyncio.sleep(0.01)  # (its sender ends its last requests)
        for fut in self.pending:
            fut.set_exception(OutOfOrderSequenceNumber())


async def test_a_send_caught_in_a_producer_being_replaced_goes_to_the_new_one(
        tmp_path: Path) -> None:
    w = _worker(tmp_path)
    _, made = _producers(w, first_stuck=False, new_stuck=False)
    old = _Holding({})
    old.full = True  # (a send waits for room in its batch)
    w.kafka.producer = old

    async def test() -> None:
        sending = asyncio.ensure_future(w.kafka.send(LOG_TOPIC, b"record", 0))
        await asyncio.sleep(0)
        await w.kafka.renew_producer(old, OutOfOrderSequenceNumber())
        sent = await sending
        assert sent.producer is made[0] and _records(made[0], LOG_TOPIC) == [b"record"]
        assert (await w.kafka.delivered(sent)).offset == 0 and old.sent == []

    await _closing(w, test)


async def test_stopping_during_a_renewal_stops_the_new_producer_and_the_replaced_one() -> None:
    """A worker stopping while a new producer is starting: both producers end stopped
    (none is left running behind the process's last flush)."""
    from sfaas.runtime.settings import Settings
    from worker.clients import KafkaClients

    kafka = KafkaClients(Settings())
    offsets: dict[tuple[str, int], int] = {}
    old, gate = _Producer(offsets, stuck=True), asyncio.Event()
    made: list[_Producer] = []

    class _Slow(_Producer):
        async def start(self) -> None:
            await gate.wait()  # (a broker slow to answer the new producer)
            await super().start()

    def new() -> _Producer:
        made.append(_Slow(offsets, stuck=False))
        return made[-1]

    kafka.producer, kafka.new_producer = old, new
    renewing = asyncio.ensure_future(kafka.renew_producer(old, OutOfOrderSequenceNumber()))
    await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(kafka.stop_producer())
    await asyncio.sleep(0.01)
    assert not stopping.done()  # it waits for the renewal
    gate.set()
    await asyncio.wait_for(asyncio.gather(renewing, stopping), 5)
    assert made and made[0].started and made[0].stopped and old.stopped


async def test_a_recovery_reads_the_log_only_once_the_records_in_flight_landed(
        tmp_path: Path) -> None:
    """Found by the simulator (issue 51, seed 88): an epoch's record still in flight when a
    recovery halted the epochs landed after the recovery read the log, so that recovery did
    not replay the epoch and its requests were taken again as new ones; a later recovery
    found the record and ran them twice. The worker's quiesce (what a recovery or a rejoin
    starts with) now returns only once every record handed to Kafka landed or failed."""
    w = _worker(tmp_path)
    first, _ = _producers(w, first_stuck=False, new_stuck=False)
    held: list[asyncio.Future[Any]] = []

    async def slow_send(topic: str, value: bytes, partition: int,
                        headers: Any = None) -> asyncio.Future[Any]:
        first.sent.append((topic, value, partition, headers))
        held.append(asyncio.get_running_loop().create_future())  # (the broker's answer)
        return held[-1]

    first.send = slow_send  # type: ignore[method-assign]

    async def test() -> None:
        _queue_request(w)
        begin = wire.Begin(1, 1001.0)
        t0 = w.epochs.begin(begin)
        assert t0 is not None
        executing = w.tasks.spawn(w.epochs.execute(begin, t0))
        for _ in range(100):
            if held:
                break
            await asyncio.sleep(0)
        assert _records(first, LOG_TOPIC), "the epoch's record was not handed to Kafka"
        for _ in range(100):  # (the epoch runs its request and waits for the record)
            await asyncio.sleep(0)
        quiescing = asyncio.ensure_future(w.quiet.quiesce())
        for _ in range(50):
            await asyncio.sleep(0)
        assert executing.cancelled()  # (the epoch itself was halted)
        assert not quiescing.done(), "the quiesce returned with a record still in flight"
        # (the halt cancelled the epoch waiting for the record, not the record's delivery:
        # the simulator's seeds 438 and 577 saw a cancelled delivery land after the read)
        assert not held[0].cancelled()
        held[0].set_result(SimpleNamespace(topic=LOG_TOPIC, partition=0, offset=0))
        await asyncio.wait_for(quiescing, 5)

    await _closing(w, test)


async def test_a_rejoin_does_not_wait_for_replies_that_need_the_lease_it_renews(
        tmp_path: Path) -> None:
    """Found by the simulator (seed 16, once its heartbeats ran on virtual time): cut from
    the coordinator past its lease, a worker rejoining it first quiesced — waiting for its
    open reply transaction, whose commit waits for the lease, which only the rejoin renews:
    it never rejoined. The rejoin's quiesce stops everything but leaves the replies to the
    recovery that follows it; a recovery's quiesce still waits for them."""
    w = _worker(tmp_path)
    lease_back = asyncio.Event()  # (a reply transaction's commit, waiting for the lease)

    async def durable(recovering: bool = False) -> None:
        await lease_back.wait()

    w.egress.durable = durable  # type: ignore[method-assign]

    async def test() -> None:
        await asyncio.wait_for(w.quiet.quiesce(replies=False), 5)
        recovering = asyncio.ensure_future(w.quiet.quiesce())
        for _ in range(50):
            await asyncio.sleep(0)
        assert not recovering.done(), "a recovery's quiesce must wait for the replies"
        lease_back.set()
        await asyncio.wait_for(recovering, 5)

    await _closing(w, test)
