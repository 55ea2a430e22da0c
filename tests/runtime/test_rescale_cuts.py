"""A rescale's new owner reads the switch round's cuts from the real epoch log
(``worker.protocols.rescale.switch_cuts``): the round's records of the gained partitions'
previous owners, found even when one lands after the first read, and a named error — not
a takeover without them, which would run their committed direct requests again — when
one never lands."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from sfaas.errors import ClusterError
from sfaas.runtime import wire
from sfaas.runtime.epochlog import CutRecord
from sfaas.runtime.kafka import ensure_topics
from sfaas.runtime.settings import Settings
from tests.namespaces import fresh_namespace
from worker.protocols import rescale

APP = "cuts"


#: seconds after which a hanging test ends the process (the ``watchdog`` fixture)
HANG_AFTER = 120
pytestmark = pytest.mark.usefixtures("watchdog")


def _reply(rid: str) -> bytes:
    return wire.Reply(rid, True, rid.upper()).encode()


def _reassign(round_id: int, handed: dict[int, int], epoch_log: int = 0) -> wire.Reassign:
    return wire.Reassign(round_id, 0, 2, [], [0, 0, 0, 1], {}, {}, [], handed, epoch_log)


async def _write(s: Settings, records: list[CutRecord]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka)
    await producer.start()
    try:
        for r in records:
            await producer.send_and_wait(s.epoch_log_topic(APP), r.encode(), partition=0)
    finally:
        await producer.stop()


def test_the_new_owner_finds_its_previous_owners_cuts_even_late(kafka: Any) -> None:
    s = Settings.load({"kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace()})

    async def main() -> None:
        await ensure_topics(s.kafka, {s.epoch_log_topic(APP): 1})
        await _write(s, [CutRecord(3, 30, 2, ((1, _reply("old"), 0.5),), ()),   # an older round
                         CutRecord(4, 40, 0, ((0, _reply("w0"), 0.1),), ()),
                         CutRecord(4, 40, 2, ((1, _reply("a"), 0.2),), ())])

        async def late() -> None:  # worker 3's record lands after the first read
            await asyncio.sleep(0.5)
            await _write(s, [CutRecord(4, 40, 3, ((2, _reply("b"), 0.3),), ())])

        t0 = time.monotonic()
        writing = asyncio.create_task(late())
        cuts = await rescale.switch_cuts(s, APP, _reassign(4, {1: 2, 2: 3}))
        await writing
        got = sorted((c.round, c.worker, wire.Reply.decode(c.replies[0][1]).rid) for c in cuts)
        assert got == [(4, 0, "w0"), (4, 2, "a"), (4, 3, "b")], got
        assert time.monotonic() - t0 < rescale.CUTS_PATIENCE
        assert await rescale.switch_cuts(s, APP, _reassign(4, {})) == []  # (nothing gained)

    asyncio.run(main())


def test_a_previous_owners_cut_that_never_lands_fails_the_takeover_by_name(
        kafka: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rescale, "CUTS_PATIENCE", 1.0)
    s = Settings.load({"kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace()})

    async def main() -> None:
        await ensure_topics(s.kafka, {s.epoch_log_topic(APP): 1})
        await _write(s, [CutRecord(6, 60, 0, (), ())])
        with pytest.raises(ClusterError, match=r"no cut of round 6 by workers \[2\], the previous "
                                               r"owners of partitions \[3\]"):
            await rescale.switch_cuts(s, APP, _reassign(6, {1: 0, 3: 2}))

    asyncio.run(main())
