"""The product's own Kafka code, unchanged, on the simulated Kafka and the virtual loop.

The Kafka port (``sfaas.runtime.ports``) is filled with the simulated log for the body's
task (``ports.context``): every producer, consumer and admin client ``make_producer``,
``make_consumer``, ``ensure_topics`` and ``read_range`` make is then a simulated one."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import OutOfOrderSequenceNumber

from sfaas.errors import ClusterError
from sfaas.runtime import ports
from sfaas.runtime.kafka import ensure_topics, make_producer, read_range
from sfaas.runtime.settings import Settings
from sfaas.sim import clock
from sfaas.sim.log import SimKafka
from sfaas.sim.ports import SimKafkaPort
from tests.runtime.test_egress_transactions import dead_worker_replaced
from worker.clients import KafkaClients

SETTINGS = Settings(kafka="sim:9092", reply_commit_ms=0)


def on_sim(monkeypatch: pytest.MonkeyPatch,
           body: Callable[[SimKafka], Awaitable[None]], seed: int = 11) -> None:
    """Run ``body`` on the virtual loop with the process's Kafka port simulated."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop)
        sim = SimKafka(loop.random)
        sim_ports = dataclasses.replace(ports.REAL, kafka=SimKafkaPort(sim))
        await asyncio.create_task(body(sim), context=ports.context(sim_ports))
    clock.run(main(), seed=seed)


def test_read_range_waits_out_a_stale_leader_and_misses_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A recovery's read (``read_range``) asked while a stale leader answers four records
    short: it asks again until the leader is current, then returns every record."""
    async def body(sim: SimKafka) -> None:
        loop = asyncio.get_running_loop()
        await ensure_topics(SETTINGS.kafka, {"ns.app.epochs": 1})
        tp = TopicPartition("ns.app.epochs", 0)
        p = make_producer(SETTINGS.kafka, durable=True)
        await p.start()
        for i in range(10):
            await (await p.send(tp.topic, bytes([i]), partition=0))
        sim.stale_leader(tp, 3.0, behind=4)
        t0 = loop.time()
        got = await read_range(SETTINGS.kafka, {tp: 2}, at_least={tp: 10})
        assert got == {0: [(o, bytes([o])) for o in range(2, 10)]}
        assert loop.time() - t0 >= 3.0
        sim.stale_leader(tp, 600.0, behind=4)  # past its patience: it says so
        t0 = loop.time()
        with pytest.raises(ClusterError, match="cannot read"):
            await read_range(SETTINGS.kafka, {tp: 2}, at_least={tp: 10}, patience=30.0)
        assert 30.0 <= loop.time() - t0 < 31.0
    on_sim(monkeypatch, body)


def test_kafka_clients_renew_a_desynced_producer_and_the_record_lands_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(sim: SimKafka) -> None:
        await ensure_topics(SETTINGS.kafka, {"ns.app.epochs": 1})
        clients = KafkaClients(SETTINGS)  # (its new_producer: make_producer, simulated)
        await clients.start_producer(0)
        sim.faults.desync = 1.0
        sent = await clients.send("ns.app.epochs", b"record", 0)
        with pytest.raises(OutOfOrderSequenceNumber):
            await asyncio.shield(sent.delivery)
        sim.faults.desync = 0.0
        md = await clients.delivered(sent)
        assert md.offset == 0 and clients.producer_renewals == 1
        got = await read_range(SETTINGS.kafka, {TopicPartition("ns.app.epochs", 0): 0})
        assert got == {0: [(0, b"record")]}
        await clients.stop_producer()
    on_sim(monkeypatch, body)


def test_a_dead_workers_reply_is_seen_once_after_its_successor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario of tests/runtime/test_egress_transactions.py's real-Kafka test
    (``dead_worker_replaced``), the same code, on the simulation: a worker paused before
    committing r1 and r2 (one per lane) is replaced; its successor's producers fence it, a
    ``read_committed`` read finds neither answered, the successor commits both; the dead
    one wakes and is refused."""
    async def body(sim: SimKafka) -> None:
        await dead_worker_replaced(SETTINGS, "ns.app.out")
    on_sim(monkeypatch, body)
