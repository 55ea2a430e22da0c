"""``read_range``, the recovery's reads of the epoch log, the ingress and the egress, against
a real Kafka: exactly the records from each start to the end, and never fewer without an
error — a record a recovery misses is executed a second time. Kafka answers as if records
were missing when a broker back from a partition still acts as the leader (the nemesis,
issue 33); here the same answers come from a start past the end, a known offset past the
end, and records deleted under the reader (``OFFSET_OUT_OF_RANGE``)."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete

from sfaas.errors import ClusterError
from sfaas.runtime.kafka import ensure_topics, make_producer, read_range
from tests.namespaces import fresh_namespace


async def _topic(kafka: Any, records: int, partitions: int = 2) -> str:
    topic = f"{fresh_namespace()}.range"
    await ensure_topics(kafka.kafka_bootstrap, {topic: partitions})
    producer = make_producer(kafka.kafka_bootstrap, durable=True)
    await producer.start()
    try:
        for i in range(records):
            await producer.send(topic, f"v{i}".encode(), partition=i % partitions)
        await producer.flush()
    finally:
        await producer.stop()
    return topic


def test_reads_each_partition_from_its_start_to_its_end(kafka: Any) -> None:
    async def go() -> None:
        topic = await _topic(kafka, 40)
        got = await read_range(kafka.kafka_bootstrap, {TopicPartition(topic, 0): 5,
                                                       TopicPartition(topic, 1): 0})
        assert [o for o, _ in got[0]] == list(range(5, 20))
        assert [v for _, v in got[0]] == [f"v{2 * o}".encode() for o in range(5, 20)]
        assert [v for _, v in got[1]] == [f"v{2 * o + 1}".encode() for o in range(20)]
        # known to exist and there: no wait, the same answer
        again = await read_range(kafka.kafka_bootstrap, {TopicPartition(topic, 1): 0},
                                 {TopicPartition(topic, 1): 20})
        assert again[1] == got[1]
    asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.parametrize("how", ["start past the end", "a known offset past the end"])
def test_an_end_before_what_exists_is_an_error_not_a_short_read(kafka: Any, how: str) -> None:
    """A stale leader's end offset is short; the old read returned what it found (nothing
    here), and the recovery ran the missing requests again."""
    async def go() -> None:
        topic = await _topic(kafka, 10)
        tp = TopicPartition(topic, 0)
        starts, known = ({tp: 9}, None) if how == "start past the end" else ({tp: 0}, {tp: 9})
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ClusterError, match=rf"cannot read {topic}\[0\]: its end is 5, "
                                               r"before offset 9, which exists"):
            await read_range(kafka.kafka_bootstrap, starts, known, patience=1.0)
        assert 1.0 <= loop.time() - t0 < 10  # it asked again for its patience, then gave up
    asyncio.run(asyncio.wait_for(go(), 60))


def test_an_offset_out_of_range_is_an_error_never_a_jump(kafka: Any) -> None:
    """Records deleted below the read's start: Kafka answers OFFSET_OUT_OF_RANGE, as a
    stale leader does. aiokafka's default would jump to the partition's end and return
    nothing of what was asked; the read asks again, then fails naming the offset."""
    async def go() -> None:
        topic = await _topic(kafka, 20, partitions=1)
        tp = TopicPartition(topic, 0)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.kafka_bootstrap)
        await admin.start()
        try:
            await admin.delete_records({tp: RecordsToDelete(before_offset=12)})
        finally:
            await admin.close()
        with pytest.raises(ClusterError, match=rf"cannot read {topic}\[0\] at offset 3: out of "
                                               "range"):
            await read_range(kafka.kafka_bootstrap, {tp: 3}, patience=1.0)
        got = await read_range(kafka.kafka_bootstrap, {tp: 12})  # what is there still reads
        assert [v for _, v in got[0]] == [f"v{i}".encode() for i in range(12, 20)]
    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_broker_that_never_answers_costs_the_read_one_request_timeout(kafka: Any) -> None:
    """A broker cut off answers nothing until the cut heals (here: a server that accepts
    connections and never answers). A read that reaches only such a broker gives up at its
    patience, naming it — it used to wait aiokafka's 40 s request timeout, whatever its
    patience; and one request waits :data:`READ_REQUEST_TIMEOUT_MS`, then the read goes on
    with the next broker (aiokafka shuffles the bootstrap list: the silent one is asked
    first in half the runs, and cost those 40 s)."""
    from sfaas.runtime.kafka import READ_REQUEST_TIMEOUT_MS

    async def go() -> None:
        topic = await _topic(kafka, 8)
        held: list[asyncio.StreamWriter] = []

        async def silent(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            held.append(w)  # (never answers, never closes)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        mute = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        loop = asyncio.get_running_loop()
        try:
            t0 = loop.time()
            with pytest.raises(ClusterError, match=rf"cannot reach Kafka at {mute} to read"):
                await read_range(mute, {TopicPartition(topic, 0): 0}, patience=3.0)
            assert loop.time() - t0 < 3.0 + 2 * READ_REQUEST_TIMEOUT_MS / 1000 + 2
            for _ in range(3):
                t0 = loop.time()
                got = await read_range(f"{mute},{kafka.kafka_bootstrap}",
                                       {TopicPartition(topic, 0): 0})
                assert [v for _, v in got[0]] == [f"v{2 * i}".encode() for i in range(4)]
                assert loop.time() - t0 < READ_REQUEST_TIMEOUT_MS / 1000 + 5
        finally:
            server.close()
            for w in held:
                w.close()
    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_busy_loop_never_leaves_the_fetcher_idle_for_its_poll_interval(kafka: Any) -> None:
    """A recovery's ``read_committed`` read of the replies, on a worker whose loop is busy
    (a promoted standby: its stores, its new Kafka clients). The partitions hold only an
    aborted transaction (the recoveries' egress fences). The read assigned its partitions
    and asked their ends before it gave them a position; aiokafka's fetcher, run in
    between, looked for one and then sat out its 0.2 s poll interval after the seek — 0.21 s
    of a promoted standby's recovery in 4 of 6 failovers (issue 48). Each read here took
    0.25 s then beside a loop that turns every 0.5 ms, and 0.05 s positioned at once."""
    async def go() -> None:
        topic = await _topic(kafka, 0, partitions=8)
        producer = make_producer(kafka.kafka_bootstrap, transactional_id=topic)
        await producer.start()
        try:
            await producer.begin_transaction()
            for p in range(8):
                await producer.send(topic, b"fence", partition=p)
            await producer.abort_transaction()
        finally:
            await producer.stop()
        tps = [TopicPartition(topic, p) for p in range(8)]

        async def busy() -> None:
            while True:
                t = time.perf_counter()
                while time.perf_counter() - t < 0.0005:
                    pass
                await asyncio.sleep(0)

        beside = asyncio.ensure_future(busy())
        took = []
        try:
            for _ in range(5):
                t0 = time.perf_counter()
                got = await read_range(kafka.kafka_bootstrap, dict.fromkeys(tps, 0),
                                       dict.fromkeys(tps, 1), committed=True)
                took.append(time.perf_counter() - t0)
                assert got == {p: [] for p in range(8)}  # (aborted: nothing to hand out)
        finally:
            beside.cancel()
        print("reads beside a busy loop took", [round(t, 3) for t in took])
        assert statistics.median(took) < 0.15, took
    asyncio.run(asyncio.wait_for(go(), 60))
