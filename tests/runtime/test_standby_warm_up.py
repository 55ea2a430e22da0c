"""A standby's Kafka clients know the app's topics before a promotion needs them
(``worker.membership.Membership.warm_up``): the first record a client sends to, or the
first offset it asks of, a topic it does not know yet waits for a metadata refresh — and a
promoted standby's first record to the epoch log is its recovery's fence."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from sfaas.runtime.settings import Settings
from worker.membership import Membership
from worker.state import WorkerState


class _Producer:
    def __init__(self, fail: bool = False) -> None:
        self.asked: list[str] = []
        self.fail = fail

    async def partitions_for(self, topic: str) -> set[int]:
        self.asked.append(topic)
        if self.fail and topic.endswith(".epochs"):
            raise ConnectionError("the broker went away")
        return {0, 1} if topic.endswith(".out") else {0}


class _Consumer:
    def __init__(self) -> None:
        self.asked: list[Any] = []

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        self.asked.extend(tps)
        return {tp: 0 for tp in tps}


def _warm(producer: _Producer) -> tuple[_Consumer, Settings]:
    settings = Settings.load({})
    state = WorkerState(1, False, log_topic=settings.epoch_log_topic("bank"))
    consumer = _Consumer()
    kafka = SimpleNamespace(producer=producer, consumer=consumer)
    m = Membership(settings, SimpleNamespace(name="bank"), "standby-0", "s", state,  # type: ignore[arg-type]
                   uplink=None, links=None, kafka=kafka, moving=None, egress=None)  # type: ignore[arg-type]
    asyncio.run(m.warm_up())
    return consumer, settings


def test_a_standby_fetches_the_replies_and_the_epoch_logs_metadata_into_both_clients() -> None:
    producer = _Producer()
    consumer, settings = _warm(producer)
    egress, log_topic = settings.topics("bank")[1], settings.epoch_log_topic("bank")
    assert producer.asked == [egress, log_topic]
    assert sorted((tp.topic, tp.partition) for tp in consumer.asked) == [
        (log_topic, 0), (egress, 0), (egress, 1)]


def test_a_warm_up_that_fails_is_only_a_head_start() -> None:
    producer = _Producer(fail=True)
    consumer, settings = _warm(producer)  # (no exception: the promotion fetches it anyway)
    assert producer.asked[-1] == settings.epoch_log_topic("bank")
    assert len(consumer.asked) == 3
