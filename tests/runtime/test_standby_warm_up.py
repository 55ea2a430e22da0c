"""A standby's Kafka clients know the app's topics before a promotion needs them
(``worker.membership.Membership.warm_up``): the first record a client sends to, or the
first offset it asks of, a topic it does not know yet waits for a metadata refresh — and a
promoted standby's first record to the epoch log is its recovery's fence. Its snapshot
rounds' remote is open too (``Recovery.warm_rounds``): a new one connects and checks its
bucket on its first call, the recovery's read of the round."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from sfaas.runtime import wire
from sfaas.runtime.protocols.rounds import INDEX_BLOB, RoundError, round_blob
from sfaas.runtime.settings import Settings
from worker.membership import Membership
from worker.protocols import recovery
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


class _Blobs:
    """A rounds remote that holds nothing, counting what it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def get_blob(self, name: str) -> bytes | None:
        self.asked.append(name)
        return None


def test_the_rounds_remote_a_standby_opened_is_the_one_its_recoveries_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[_Blobs] = []

    def rounds_remote(_s: Settings, _app: str) -> _Blobs:
        made.append(_Blobs())
        return made[-1]

    monkeypatch.setattr(recovery, "rounds_remote", rounds_remote)
    r = recovery.Recovery(Settings.load({}), SimpleNamespace(name="bank"),  # type: ignore[arg-type]
                          WorkerState(1, False), uplink=None, rollback=None,  # type: ignore[arg-type]
                          replay=None)  # type: ignore[arg-type]

    async def go() -> None:
        await r.warm_rounds()
        for _ in range(2):
            with pytest.raises(RoundError, match="round 3 is listed but its manifest"):
                await r._read_round(wire.Recover(1, 3, [], [0]))  # (no manifest sent)

    asyncio.run(go())
    assert len(made) == 1, "one remote for the warm-up and every recovery"
    assert made[0].asked == [INDEX_BLOB, round_blob(3), round_blob(3)]


def test_a_rounds_warm_up_that_fails_is_only_a_head_start(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def down(_s: Settings, _app: str) -> object:
        raise ConnectionError("MinIO refused the connection")

    monkeypatch.setattr(recovery, "rounds_remote", down)
    r = recovery.Recovery(Settings.load({}), SimpleNamespace(name="bank"),  # type: ignore[arg-type]
                          WorkerState(1, False), uplink=None, rollback=None,  # type: ignore[arg-type]
                          replay=None)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, "sfaas.worker.recovery"):
        asyncio.run(r.warm_rounds())
    assert any("could not reach the snapshot rounds" in m and "refused" in m
               for m in caplog.messages)
