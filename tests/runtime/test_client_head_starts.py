"""A restarted worker's Kafka clients, told ahead what their first lookups need (issue 48):
a started consumer tracks no topic, and its first offset lookup of one — or its first
position before its group's coordinator is known — fails once and waits a retry backoff
(``benchmarks/runtime/client_starts.py``: 0.34 s cold, 0.01 s told). What a worker's
start tells it must be what those lookups use; a failure to tell is only logged."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiokafka import TopicPartition

from sfaas.runtime.kafka import ensure_topics, make_consumer
from tests.namespaces import fresh_namespace
from worker.clients import know_group, know_topics


def test_a_consumer_told_its_topics_and_group_knows_their_leaders_and_coordinator(
        kafka: Any) -> None:
    async def go() -> None:
        ns = fresh_namespace()
        out, log_topic, ingress = f"{ns}.out", f"{ns}.epochs", f"{ns}.in"
        await ensure_topics(kafka.kafka_bootstrap, {out: 3, log_topic: 1, ingress: 2})
        c = make_consumer(kafka.kafka_bootstrap, f"{ns}.workers", 10)
        await c.start()
        try:
            assert c.partitions_for_topic(out) is None  # (what the head start is for)
            await know_topics(c, {out, log_topic})
            await know_group(c, [TopicPartition(ingress, 0)])
            assert c.partitions_for_topic(out) == {0, 1, 2}
            assert c.partitions_for_topic(log_topic) == {0}
            assert c._coordinator.coordinator_id is not None
        finally:
            await c.stop()
    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_head_start_that_fails_is_logged_and_left(caplog: pytest.LogCaptureFixture) -> None:
    class Unreachable:
        class _client:  # noqa: N801 (aiokafka's attribute)
            @staticmethod
            async def _wait_on_metadata(topic: str) -> None:
                raise ConnectionError(f"no broker for {topic}")

        @staticmethod
        async def committed(tp: TopicPartition) -> None:
            raise ConnectionError("no coordinator")

    async def go() -> None:
        await know_topics(Unreachable(), {"a.out"})
        await know_group(Unreachable(), [TopicPartition("a.in", 0)])
    with caplog.at_level(logging.INFO, logger="sfaas.worker"):
        asyncio.run(go())
    assert "metadata of ['a.out']" in caplog.text and "no broker for a.out" in caplog.text
    assert "group's coordinator" in caplog.text and "no coordinator" in caplog.text


def test_a_head_start_kafka_does_not_answer_gives_up_after_its_patience(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A head start never holds a worker's start longer than its patience: the lookups
    after it wait for Kafka themselves."""
    import worker.clients as clients
    monkeypatch.setattr(clients, "HEAD_START_PATIENCE", 0.05)

    class Silent:
        class _client:  # noqa: N801 (aiokafka's attribute)
            @staticmethod
            async def _wait_on_metadata(topic: str) -> None:
                await asyncio.sleep(3600)

        @staticmethod
        async def committed(tp: TopicPartition) -> None:
            await asyncio.sleep(3600)

    async def go() -> None:
        await asyncio.wait_for(asyncio.gather(know_topics(Silent(), {"a.out"}),
                                              know_group(Silent(), [TopicPartition("a.in", 0)])),
                               5.0)
    with caplog.at_level(logging.INFO, logger="sfaas.worker"):
        asyncio.run(go())
    assert caplog.text.count("TimeoutError") == 2
