"""The two sides of the Kafka contract: the real broker (aiokafka on the test session's
Kafka, a normal event loop) and the simulation (``sfaas.sim.log`` on the virtual loop of
``sfaas.sim.clock``). A test is an ``async`` body given a :class:`Side`; it runs the same
on both."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete

from sfaas.sim import clock
from sfaas.sim.log import SimKafka
from tests.namespaces import fresh_namespace

#: seed of the simulated side's runs
SEED = 51


class Side:
    """Makes clients and topics on one side, and runs a test body there."""

    name = ""

    def producer(self, **kw: Any) -> Any:
        raise NotImplementedError

    def consumer(self, **kw: Any) -> Any:
        raise NotImplementedError

    def admin(self) -> Any:
        raise NotImplementedError

    def run(self, body: Callable[[Side], Awaitable[None]]) -> None:
        raise NotImplementedError

    async def topic(self, partitions: int) -> str:
        """A new topic of its own (a unique name)."""
        name = f"{self.prefix}.c{uuid.uuid4().hex[:8]}"
        admin = self.admin()
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])
            while True:  # (a real broker's metadata may lag its creation)
                (d,) = await admin.describe_topics([name])
                if len(d["partitions"] or ()) == partitions:
                    return name
                await asyncio.sleep(0.05)
        finally:
            await admin.close()

    async def delete_records(self, tp: TopicPartition, before: int) -> None:
        admin = self.admin()
        await admin.start()
        try:
            await admin.delete_records({tp: RecordsToDelete(before)})
        finally:
            await admin.close()

    prefix = "sim"


class RealSide(Side):
    name = "real"

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.prefix = fresh_namespace()

    def producer(self, **kw: Any) -> Any:
        return AIOKafkaProducer(bootstrap_servers=self.bootstrap, **kw)

    def consumer(self, **kw: Any) -> Any:
        return AIOKafkaConsumer(bootstrap_servers=self.bootstrap, **kw)

    def admin(self) -> Any:
        return AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)

    def run(self, body: Callable[[Side], Awaitable[None]]) -> None:
        async def main() -> None:
            await body(self)
        asyncio.run(main())


class SimSide(Side):
    name = "sim"

    def __init__(self) -> None:
        self.kafka: SimKafka | None = None

    def _kafka(self) -> SimKafka:
        assert self.kafka is not None, "clients are made inside run()"
        return self.kafka

    def producer(self, **kw: Any) -> Any:
        return self._kafka().producer(bootstrap_servers="sim", **kw)

    def consumer(self, **kw: Any) -> Any:
        return self._kafka().consumer(bootstrap_servers="sim", **kw)

    def admin(self) -> Any:
        return self._kafka().admin(bootstrap_servers="sim")

    def run(self, body: Callable[[Side], Awaitable[None]]) -> None:
        async def main() -> None:
            loop = asyncio.get_running_loop()
            assert isinstance(loop, clock.VirtualLoop)
            self.kafka = SimKafka(loop.random)
            await body(self)
        clock.run(main(), seed=SEED)


@pytest.fixture(params=["real", "sim"])
def side(request: pytest.FixtureRequest) -> Side:
    if request.param == "real":
        return RealSide(request.getfixturevalue("kafka").kafka_bootstrap)
    return SimSide()
