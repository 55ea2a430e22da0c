"""The epoch log's start records (``sfaas.runtime.epochlog``, "Starts"): does a restarted
coordinator know that the cluster ran before, whatever a stale leader answers?

Found by the simulator (seed 194, issue 51): a coordinator restarted during a recovery
asked the log's end, a stale leader answered 0, and the coordinator took a used cluster
for a new one — no recovery: 24 requests were never answered (on a shorter schedule five
were answered twice and the balances summed to half). The simulated run is
``tests/sim/test_budget.py``'s ``FOUND`` seed 194; these tests hold the parts."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from launcher.services import Endpoints
from sfaas.runtime.epochlog import (
    START_WINDOW,
    AnyRecord,
    EpochLogError,
    EpochRecord,
    FenceRecord,
    StartRecord,
    decode_record,
    live,
    used_before,
)
from sfaas.runtime.settings import Settings
from tests.namespaces import fresh_namespace


def _epoch(epoch: int, worker: int = 0) -> EpochRecord:
    return EpochRecord(epoch, worker, 1.0, ((epoch, worker, epoch),))


def test_a_start_record_decodes_as_itself_and_a_bad_one_is_named() -> None:
    s = StartRecord(1_700_000_000.25)
    assert decode_record(s.encode(), "x@3") == s
    with pytest.raises(EpochLogError, match=r"log@9: malformed body .*a time >= 0"):
        decode_record(s.encode()[:5] + b"\x91\xa1x", "log@9")


def test_no_recovery_replays_a_start_record_and_fences_work_across_one() -> None:
    log: list[tuple[int, AnyRecord]] = [
        (0, _epoch(1)),
        (1, StartRecord(5.0)),     # a coordinator restarted here
        (2, FenceRecord(0, 1, 1)),  # worker 0's recovery
        (3, _epoch(1)),            # sent before the fence, landed after: void
        (4, StartRecord(6.0)),
        (5, _epoch(2, 1)),
    ]
    assert [o for o, _ in live(log, 0)] == [0, 5]


def _starts(*offsets: int) -> list[tuple[int, bytes]]:
    return [(o, StartRecord(float(o)).encode()) for o in offsets]


def test_a_log_of_start_records_alone_from_its_beginning_is_a_new_cluster() -> None:
    assert not used_before([], 0)
    assert not used_before(_starts(0, 1, 2), 3)  # (three coordinators that ran no epoch)
    assert not used_before(_starts(0, 1, 2, 3, 4), 3)  # (records after the start: not read)


def test_anything_before_the_start_record_but_start_records_is_a_used_cluster() -> None:
    assert used_before([(0, _epoch(1).encode()), *_starts(1)], 2)
    assert used_before([(0, FenceRecord(0, 0, 1).encode())], 1)
    assert used_before([(0, b"v0")], 1)  # (a foreign record: not an empty log)


def test_what_the_read_cannot_show_counts_as_used() -> None:
    """An offset of the window without a record, records deleted before it, or a window
    of start records alone that does not reach the log's beginning: a recovery of a
    cluster that never ran restores nothing, a new start of a used one loses requests."""
    assert used_before(_starts(0, 2), 3)  # offset 1 missing
    assert used_before(_starts(5, 6), 7, beginning=5)  # records 0..4 deleted
    window = START_WINDOW + 10
    assert used_before(_starts(*range(10, window)), window)


def test_a_coordinator_start_tells_a_used_epoch_log_from_a_new_one(kafka: Endpoints) -> None:
    """On a real broker: two coordinators starting on a new log find it new (the first's
    start record is no cluster's work); once a worker logged an epoch, the next finds it
    used, and each start left its record in the log."""
    from coordinator.startup import epoch_log_used
    from sfaas.runtime.kafka import ensure_topics, make_producer, read_range

    s = Settings.load({"kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace()})
    topic = s.epoch_log_topic("starts")

    async def run() -> None:
        await ensure_topics(s.kafka, {topic: 1})
        assert not await epoch_log_used(s.kafka, topic)
        assert not await epoch_log_used(s.kafka, topic)
        producer = make_producer(s.kafka, durable=True)
        await producer.start()
        try:
            await producer.send_and_wait(topic, _epoch(1).encode(), partition=0)
        finally:
            await producer.stop()
        assert await epoch_log_used(s.kafka, topic)
        got = await read_range(s.kafka, {TopicPartition(topic, 0): 0})
        kinds = [type(decode_record(v)).__name__ for _, v in got[0]]
        assert kinds == ["StartRecord", "StartRecord", "EpochRecord", "StartRecord"]

    asyncio.run(asyncio.wait_for(run(), 60))
