"""A worker's Kafka clients: one producer (replies, epoch-log records) and one consumer
(ingress), started patiently — a broker restart must not make the supervisor give up on
the worker."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from sfaas.errors import ClusterError
from sfaas.runtime.kafka import make_consumer, make_producer
from sfaas.runtime.settings import Settings

log = logging.getLogger("sfaas.worker")

__all__ = ["KafkaClients", "start_kafka"]


async def start_kafka(make: Callable[[], Any], where: str, patience: float = 120.0,
                      index: int = -1) -> Any:
    """Start the Kafka client ``make()`` gives, retrying while the broker at ``where`` is
    unreachable, at most ``patience`` seconds."""
    deadline = time.monotonic() + patience
    while True:
        client = make()
        try:
            await client.start()
            return client
        except Exception as exc:
            await client.stop()
            if time.monotonic() > deadline:
                raise ClusterError(f"Kafka at {where} unreachable for {patience:.0f} s: "
                                   f"{exc}") from exc
            log.warning("Kafka at %s unreachable (%s); retrying", where, exc,
                        extra={"worker": index})
            await asyncio.sleep(1.0)


class KafkaClients:
    """The producer and the consumer (None until started) and the consumer's group."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.producer: Any = None
        self.consumer: Any = None
        #: the group ``consumer`` was started in
        self.group = ""

    async def start_producer(self, index: int = -1) -> None:
        s = self._settings
        self.producer = await start_kafka(
            lambda: make_producer(s.kafka, s.linger_ms, durable=True), s.kafka, index=index)

    async def start_consumer(self, group: str, index: int = -1) -> None:
        """(Re)start the consumer in ``group``."""
        s = self._settings
        if self.consumer is not None:
            await self.consumer.stop()
        self.consumer = await start_kafka(
            lambda: make_consumer(s.kafka, group, s.fetch_wait_ms), s.kafka, index=index)
        self.group = group
