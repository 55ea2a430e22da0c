"""A worker cut from Kafka alone (``sfaas.sim.log.SimKafka.cut``, the budget's
``kafka_cut``): what a cut broker link does to one process's clients, an orphaned
socket's request landing after the heal, and the draw that schedules it.

Why the orphan matters: a worker cut from the brokers while its recovery's fence was on
the wire lost its slot; the kernel delivered the fence after the heal, after the slot's
next process had written its own fence and records — which the epoch log's rule then
counted void (``tests/runtime/test_epochlog_fences.py``, nemesis seeds 13 and 14)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, ProducerClosed

from sfaas.sim import clock
from sfaas.sim.__main__ import parser, schedule
from sfaas.sim.faults import draw
from sfaas.sim.log import SimKafka
from sfaas.sim.log_clients import RETRANSMIT
from sfaas.sim.ports import SimKafkaPort

T = "ns.app.t"
TP = TopicPartition(T, 0)

#: sha256 of ``str(draw(seed))`` for seeds 0–199, each on its line, before the Kafka cut was
#: drawn (main at 5afe8b4): every earlier draw of every seed, pinned
BEFORE_KAFKA_CUT = "0d2c256229592bed3571430704bf477ac15171bbe114f13fc4fb7a747c7266fc"


def _run(body: Any, seed: int = 3) -> Any:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        kafka = SimKafka(loop.random)
        kafka.create_topic(T, 1)
        return await body(kafka, loop)
    return clock.run(main(), seed=seed)


def _values(kafka: SimKafka) -> list[tuple[bytes | None, float]]:
    return [(e.value, e.timestamp) for e in kafka.broker.partition(TP).entries]


def test_a_cut_process_waits_its_peers_do_not_and_its_probe_fails() -> None:
    async def body(kafka: SimKafka, loop: Any) -> None:
        cut, other = SimKafkaPort(kafka, "worker-1"), SimKafkaPort(kafka, "worker-0")
        p1, p0 = cut.producer(request_timeout_ms=5000), other.producer()
        await p1.start()
        await p0.start()
        kafka.cut("worker-1", 2.0)
        t0 = loop.time()
        await (await p0.send(T, b"peer", partition=0))
        assert loop.time() - t0 < 0.1
        with pytest.raises(ConnectionRefusedError):
            await cut.probe("sim", 9092)
        await other.probe("sim", 9092)
        md = await (await p1.send(T, b"cut", partition=0))
        assert loop.time() - t0 >= 2.0 and md.offset == 1  # (sent once the cut healed)
        await cut.probe("sim", 9092)
        kafka.cut("worker-1", 10.0)
        with pytest.raises(KafkaTimeoutError):  # (past its request timeout)
            await (await p1.send(T, b"late", partition=0))
    _run(body)


async def _dies_cut_off(kafka: SimKafka, queued: bool) -> None:
    """Worker 1, cut from the brokers for 1 s, sends its fence (on the wire) and maybe a
    record behind it, dies at 0.5 s; the slot's successor (not cut) writes at 1.05 s."""
    port = SimKafkaPort(kafka, "worker-1")
    p = port.producer()
    await p.start()
    kafka.cut("worker-1", 1.0)
    futs = [await p.send(T, b"fence", partition=0)]
    if queued:
        futs.append(await p.send(T, b"behind it", partition=0))
    await asyncio.sleep(0.5)
    port.kill()
    for fut in futs:
        with pytest.raises(ProducerClosed):
            await fut
    await asyncio.sleep(0.55)  # (healed at 1.0)
    successor = SimKafkaPort(kafka, "standby-0").producer()
    await successor.start()
    await (await successor.send(T, b"successor", partition=0))
    await asyncio.sleep(RETRANSMIT + 0.1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_request_on_the_wire_of_a_process_that_died_cut_off_lands_after_the_heal(
        seed: int) -> None:
    async def body(kafka: SimKafka, loop: Any) -> None:
        await _dies_cut_off(kafka, queued=True)
        landed = [v for v, _ in _values(kafka)]
        assert sorted(landed) == [b"fence", b"successor"]  # (never what was queued behind)
        at = dict(_values(kafka))[b"fence"] / 1000  # (ms)
        assert 1.0 <= at <= 1.0 + RETRANSMIT + 0.01
    _run(body, seed)


def test_an_orphaned_request_lands_after_the_successor_for_some_seeds() -> None:
    """The retransmission timer: some seeds land the dead process's request after what the
    slot's next process wrote right after the heal (the case the epoch log must survive)."""
    async def body(kafka: SimKafka, loop: Any) -> bool:
        await _dies_cut_off(kafka, queued=False)
        return [v for v, _ in _values(kafka)] == [b"successor", b"fence"]
    later = [_run(body, seed) for seed in range(12)]
    assert any(later) and not all(later), later


def test_the_kafka_cut_is_drawn_last_and_changed_no_earlier_draw() -> None:
    schedules = [draw(seed) for seed in range(200)]
    without = "\n".join(str(dataclasses.replace(s, kafka_cut=None)) for s in schedules)
    assert hashlib.sha256(without.encode()).hexdigest() == BEFORE_KAFKA_CUT
    cuts = [s for s in schedules if s.kafka_cut is not None]
    assert 40 <= len(cuts) <= 80
    near = [s for s in cuts if s.crash or s.cut]  # (timed near the recovery)
    for s in near:
        assert s.kafka_cut is not None
        ends = [sum(p) for p in (s.crash, s.cut) if p is not None]
        assert any(0 <= s.kafka_cut[0] - end <= 0.2 + 1e-9 for end in ends), s


def test_the_flag_gives_the_schedule_and_back() -> None:
    s = schedule(parser().parse_args(["--app", "m:a", "--seed", "1", "--cut-kafka", "0.4,3"]))
    assert s.kafka_cut == (0.4, 3.0) and s.faults() == 1
    assert s.args() == ["--cut-kafka", "0.4,3"]
    with pytest.raises(SystemExit):
        parser().parse_args(["--app", "m:a", "--seed", "1", "--cut-kafka"])
