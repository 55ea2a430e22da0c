"""The simulated Kafka's faults (``sfaas.sim.log``), on the virtual loop: each does what a
real broker's failure does to the product's clients, and a run replays from its seed."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
)

from sfaas.sim import clock
from sfaas.sim.log import Faults, SimKafka

ROOT = Path(__file__).resolve().parents[2]
T = "ns.app.t"
TP = TopicPartition(T, 0)


def sim(body: Callable[[SimKafka], Awaitable[Any]], seed: int = 7, **faults: Any) -> Any:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop)
        kafka = SimKafka(loop.random, Faults(**faults))
        kafka.create_topic(T, 2)
        return await body(kafka)
    return clock.run(main(), seed=seed)


async def read(kafka: SimKafka, **kw: Any) -> list[tuple[int, bytes]]:
    c = kafka.consumer(auto_offset_reset="earliest", **kw)
    await c.start()
    c.assign([TP])
    got = await c.getmany(timeout_ms=100)
    return [(r.offset, r.value) for r in got.get(TP, [])]


def test_a_failed_send_appends_nothing_and_a_lost_ack_appends() -> None:
    async def body(kafka: SimKafka) -> None:
        p = kafka.producer()
        await p.start()
        kafka.faults.send_error = 1.0
        with pytest.raises(KafkaTimeoutError):
            await (await p.send(T, b"lost", partition=0))
        assert await read(kafka) == []
        kafka.faults.send_error, kafka.faults.lost_ack = 0.0, 1.0
        with pytest.raises(KafkaTimeoutError):
            await (await p.send(T, b"ambiguous", partition=0))
        assert await read(kafka) == [(0, b"ambiguous")]  # (in the log all the same)
    sim(body)


def test_a_desynced_producer_stays_stuck_on_that_partition() -> None:
    async def body(kafka: SimKafka) -> None:
        p = kafka.producer(enable_idempotence=True)
        await p.start()
        kafka.faults.desync = 1.0
        with pytest.raises(OutOfOrderSequenceNumber):
            await (await p.send(T, b"a", partition=0))
        kafka.faults.desync = 0.0
        with pytest.raises(OutOfOrderSequenceNumber):  # stuck, as aiokafka's stays
            await (await p.send(T, b"b", partition=0))
        assert (await (await p.send(T, b"c", partition=1))).offset == 0
        fresh = kafka.producer(enable_idempotence=True)  # what worker/clients.py renews to
        await fresh.start()
        assert (await (await fresh.send(T, b"d", partition=0))).offset == 0
    sim(body)


def test_an_empty_fetch_waits_out_its_timeout_and_returns_nothing() -> None:
    async def body(kafka: SimKafka) -> None:
        loop = asyncio.get_running_loop()
        p = kafka.producer()
        await p.start()
        await (await p.send(T, b"x", partition=0))
        kafka.faults.empty_fetch = 1.0
        c = kafka.consumer(auto_offset_reset="earliest")
        await c.start()
        c.assign([TP])
        assert await c.getmany(timeout_ms=1500) == {} and loop.time() == 1.5
        kafka.faults.empty_fetch = 0.0
        assert [r.value for r in (await c.getmany(timeout_ms=1500))[TP]] == [b"x"]
    sim(body)


def test_an_outage_holds_sends_until_it_ends_or_their_timeout() -> None:
    async def body(kafka: SimKafka) -> None:
        loop = asyncio.get_running_loop()
        p = kafka.producer(request_timeout_ms=30_000)
        await p.start()
        t0 = loop.time()
        kafka.outage(10.0)
        md = await (await p.send(T, b"late", partition=0))
        assert (md.offset, loop.time() - t0) == (0, 10.0)
        kafka.outage(60.0)
        with pytest.raises(KafkaTimeoutError):
            await (await p.send(T, b"never", partition=0))
        assert loop.time() - t0 == 40.0
    sim(body)


def test_a_leaderless_partition_fetches_nothing_until_its_leader_is_back() -> None:
    async def body(kafka: SimKafka) -> None:
        loop = asyncio.get_running_loop()
        p = kafka.producer()
        await p.start()
        await (await p.send(T, b"x", partition=0))
        kafka.leader_down(TP, 5.0)
        c = kafka.consumer(auto_offset_reset="earliest")
        await c.start()
        c.assign([TP])
        assert await c.getmany(timeout_ms=1000) == {}
        got = await c.getmany(timeout_ms=10_000)  # woken when the leader is back
        assert [r.value for r in got[TP]] == [b"x"] and loop.time() == 5.0
    sim(body)


def test_a_stale_leader_answers_short_and_rewinds_an_earliest_consumer() -> None:
    async def body(kafka: SimKafka) -> None:
        p = kafka.producer()
        await p.start()
        for i in range(10):
            await (await p.send(T, bytes([i]), partition=0))
        c = kafka.consumer(auto_offset_reset="earliest")
        strict = kafka.consumer(auto_offset_reset="none")
        for x in (c, strict):
            await x.start()
            x.assign([TP])
            x.seek(TP, 9)
        kafka.stale_leader(TP, 2.0, behind=4)
        assert await c.end_offsets([TP]) == {TP: 6}
        # position 9 is past the stale end: "out of range", reset to the start (the
        # rewind worker/ingress.py:Ingress._rewound detects)
        got = await c.getmany(timeout_ms=100)
        assert got[TP][0].offset == 0 and c.highwater(TP) == 6
        with pytest.raises(OffsetOutOfRangeError) as info:
            await strict.getmany(timeout_ms=100)
        assert info.value.args == ({TP: 9},)  # what sfaas.runtime.kafka.read_range parses
        await asyncio.sleep(2.0)
        assert await c.end_offsets([TP]) == {TP: 10}
    sim(body)


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    async def body(kafka: SimKafka) -> None:
        p = kafka.producer(transactional_id="slot-0", transaction_timeout_ms=20_000)
        await p.start()
        await p.begin_transaction()
        await (await p.send(T, b"slow", partition=0))
        rc = kafka.consumer(isolation_level="read_committed")
        await rc.start()
        assert await rc.end_offsets([TP]) == {TP: 0}
        await asyncio.sleep(20.0)
        assert await rc.end_offsets([TP]) == {TP: 2}  # aborted: record + marker
        with pytest.raises(ProducerFenced):
            await p.commit_transaction()
        assert await read(kafka, isolation_level="read_committed") == []
    sim(body)


def test_retention_keeps_the_newest_records_of_a_topic() -> None:
    async def body(kafka: SimKafka) -> None:
        kafka.create_topic("ns.app.small", 1, retained=3)
        tp = TopicPartition("ns.app.small", 0)
        p = kafka.producer()
        await p.start()
        for i in range(5):
            await (await p.send(tp.topic, bytes([i]), partition=0))
        c = kafka.consumer(auto_offset_reset="none")
        await c.start()
        c.assign([tp])
        assert (await c.beginning_offsets([tp]), await c.end_offsets([tp])) == ({tp: 2}, {tp: 5})
        c.seek(tp, 0)
        with pytest.raises(OffsetOutOfRangeError):
            await c.getmany(timeout_ms=10)
    sim(body)


async def _workload(kafka: SimKafka, trace: list[str]) -> None:
    """Producers and a consumer with random pauses, under every probabilistic fault."""
    rng = kafka.broker.rng

    async def produce(n: int) -> None:
        p = kafka.producer(transactional_id=f"w{n}")
        await p.start()
        for i in range(20):
            await asyncio.sleep(rng.uniform(0, 0.05))
            await p.begin_transaction()
            fut = await p.send(T, f"{n}.{i}".encode(), partition=rng.randrange(2))
            try:
                await fut
                await p.commit_transaction()
            except Exception as exc:
                trace.append(f"{asyncio.get_running_loop().time():.6f} p{n} {type(exc).__name__}")
                await p.abort_transaction()

    async def consume() -> None:
        c = kafka.consumer(auto_offset_reset="earliest", isolation_level="read_committed")
        await c.start()
        c.assign([TopicPartition(T, 0), TopicPartition(T, 1)])
        for _ in range(30):
            got = await c.getmany(timeout_ms=50, max_records=7)
            for tp, rs in sorted(got.items()):
                trace.extend([f"read {tp.partition}@{r.offset}={r.value!r}" for r in rs])
    await asyncio.gather(produce(0), produce(1), consume())


def _trace(seed: int) -> bytes:
    lines: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop)
        kafka = SimKafka(loop.random, Faults(send_error=0.1, lost_ack=0.05, empty_fetch=0.2,
                                             latency=(0.0, 0.01)), lines.append)
        kafka.create_topic(T, 2)
        await _workload(kafka, lines)
    clock.run(main(), seed=seed)
    return "\n".join(lines).encode()


def test_a_seed_replays_byte_for_byte_and_another_seed_differs() -> None:
    first = _trace(1)
    assert b"read " in first and b"append " in first and b"fault " in first
    assert _trace(1) == first
    assert _trace(2) != first
    random.seed(99)  # (the global random source plays no part)
    assert _trace(1) == first


def test_a_seed_replays_in_another_process_whatever_its_hash_seed() -> None:
    """(str hashing differs between processes: no set or dict order of str may leak in)"""
    probe = "import sys; from tests.sim.test_log_faults import _trace; sys.stdout.buffer.write(_trace(1))"
    outs = [subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": h, "PYTHONPATH": str(ROOT)}).stdout
            for h in ("1", "2")]
    assert outs == [_trace(1)] * 2
