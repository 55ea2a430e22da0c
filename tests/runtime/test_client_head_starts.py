"""A restarted worker's Kafka consumer, told its group ahead (issue 48): its first position
before its group's coordinator is known fails once and pauses a retry backoff (100 ms of a
restarted worker's start); a worker finds the coordinator beside its end offsets
(``benchmarks/runtime/client_starts.py``). A failure to tell it is only logged."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiokafka import TopicPartition

from sfaas.runtime.kafka import ensure_topics, make_consumer
from tests.namespaces import fresh_namespace
from worker.clients import know_group


def test_a_consumer_told_its_group_knows_the_coordinator(kafka: Any) -> None:
    async def go() -> None:
        ns = fresh_namespace()
        ingress = f"{ns}.in"
        await ensure_topics(kafka.kafka_bootstrap, {ingress: 2})
        c = make_consumer(kafka.kafka_bootstrap, f"{ns}.workers", 10)
        await c.start()
        try:
            assert c._coordinator.coordinator_id is None  # (what the head start is for)
            await know_group(c, [TopicPartition(ingress, 0)])
            assert c._coordinator.coordinator_id is not None
        finally:
            await c.stop()
    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_head_start_that_fails_is_logged_and_left(caplog: pytest.LogCaptureFixture) -> None:
    class Unreachable:
        @staticmethod
        async def committed(tp: TopicPartition) -> None:
            raise ConnectionError("no coordinator")

    with caplog.at_level(logging.INFO, logger="sfaas.worker"):
        asyncio.run(know_group(Unreachable(), [TopicPartition("a.in", 0)]))
    assert "group's coordinator" in caplog.text and "no coordinator" in caplog.text


def test_a_head_start_kafka_does_not_answer_gives_up_after_its_patience(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A head start never holds a worker's start longer than its patience: the lookups
    after it wait for Kafka themselves."""
    import worker.clients as clients
    monkeypatch.setattr(clients, "HEAD_START_PATIENCE", 0.05)

    class Silent:
        @staticmethod
        async def committed(tp: TopicPartition) -> None:
            await asyncio.sleep(3600)

    with caplog.at_level(logging.INFO, logger="sfaas.worker"):
        asyncio.run(asyncio.wait_for(know_group(Silent(), [TopicPartition("a.in", 0)]), 5.0))
    assert "TimeoutError" in caplog.text
