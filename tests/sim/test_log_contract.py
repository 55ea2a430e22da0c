"""What the product relies on of Kafka, asserted on the real broker and on the simulation
(``sfaas.sim.log``) alike: a difference is a lie the simulator would tell the product."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic
from aiokafka.errors import (
    ConsumerStoppedError,
    IllegalOperation,
    OffsetOutOfRangeError,
    ProducerClosed,
    ProducerFenced,
    TopicAlreadyExistsError,
)

from tests.sim.conftest import Side


def values(got: dict[TopicPartition, list[Any]]) -> list[tuple[int, int, bytes]]:
    return [(tp.partition, r.offset, r.value) for tp, rs in sorted(got.items()) for r in rs]


async def drain(consumer: Any, until: dict[TopicPartition, int],
                tries: int = 20) -> list[tuple[int, int, bytes]]:
    """Every record the consumer hands out until each partition's position reaches
    ``until`` (a real consumer hands them out in several fetches)."""
    out: list[tuple[int, int, bytes]] = []
    for _ in range(tries):
        out += values(await consumer.getmany(timeout_ms=1000))
        if all([await consumer.position(tp) >= o for tp, o in until.items()]):
            return sorted(out)
    raise AssertionError(f"positions never reached {until}; got {out}")


async def started(client: Any) -> Any:
    await client.start()
    return client


def test_order_and_offsets_per_partition(side: Side) -> None:
    async def body(s: Side) -> None:
        t = await s.topic(2)
        p = await started(s.producer(enable_idempotence=True, acks="all"))
        assert await p.partitions_for(t) == {0, 1}
        futs = [await p.send(t, f"v{i}".encode(), partition=i % 2) for i in range(10)]
        mds = [await f for f in futs]
        assert [(m.partition, m.offset) for m in mds] == [(i % 2, i // 2) for i in range(10)]
        with pytest.raises(AssertionError, match="Unrecognized partition"):
            await p.send(t, b"x", partition=2)
        await p.stop()
        tps = [TopicPartition(t, 0), TopicPartition(t, 1)]
        c = await started(s.consumer(enable_auto_commit=False, auto_offset_reset="earliest"))
        c.assign(tps)
        assert c.assignment() == set(tps)
        assert c.highwater(tps[0]) is None  # (known from a fetch on)
        assert await c.end_offsets(tps) == {tps[0]: 5, tps[1]: 5}
        got = await drain(c, {tps[0]: 5, tps[1]: 5})
        assert got == sorted((i % 2, i // 2, f"v{i}".encode()) for i in range(10))
        assert c.highwater(tps[0]) == 5
        await c.stop()
        with pytest.raises(ConsumerStoppedError):
            await c.getmany()
    side.run(body)


def test_seek_position_and_seek_to_end(side: Side) -> None:
    async def body(s: Side) -> None:
        t = await s.topic(1)
        tp = TopicPartition(t, 0)
        p = await started(s.producer())
        for i in range(6):
            await (await p.send(t, bytes([i]), partition=0))
        c = await started(s.consumer(enable_auto_commit=False, auto_offset_reset="earliest"))
        c.assign([tp])
        assert await c.position(tp) == 0
        c.seek(tp, 4)
        assert await c.position(tp) == 4
        assert await drain(c, {tp: 6}) == [(0, 4, b"\x04"), (0, 5, b"\x05")]
        c.seek(tp, 1)
        got = values(await c.getmany(timeout_ms=1000, max_records=2))
        assert got == [(0, 1, b"\x01"), (0, 2, b"\x02")] and await c.position(tp) == 3
        await c.seek_to_end(tp)
        assert await c.position(tp) == 6
        await (await p.send(t, b"later", partition=0))
        assert await drain(c, {tp: 7}) == [(0, 6, b"later")]
        latest = await started(s.consumer(enable_auto_commit=False))  # (default: "latest")
        latest.assign([tp])
        assert await latest.position(tp) == 7
        for client in (p, c, latest):
            await client.stop()
    side.run(body)


async def _until_end(s: Side, tp: TopicPartition, end: int, patience: float = 10.0) -> None:
    """Wait until ``tp``'s end offset is ``end`` (a marker written)."""
    c = await started(s.consumer(enable_auto_commit=False))
    try:
        deadline = asyncio.get_running_loop().time() + patience
        while (at := (await c.end_offsets([tp]))[tp]) != end:
            assert at < end and asyncio.get_running_loop().time() < deadline, (at, end)
            await asyncio.sleep(0.01)
    finally:
        await c.stop()


async def _txn_topic(s: Side) -> tuple[str, TopicPartition]:
    """A topic holding: a committed transaction (offsets 0, marker 1), an aborted one (2,
    marker 3), a plain record (4), an open transaction (5), a plain record after it (6)."""
    t = await s.topic(1)
    tp = TopicPartition(t, 0)
    tx = await started(s.producer(transactional_id=f"{t}.tx"))
    plain = await started(s.producer(enable_idempotence=True, acks="all"))
    await tx.begin_transaction()
    await (await tx.send(t, b"committed", partition=0))
    await tx.commit_transaction()
    await tx.begin_transaction()
    await (await tx.send(t, b"aborted", partition=0))
    await tx.abort_transaction()
    # (Kafka writes the abort's marker after the abort returns: a record sent before it
    # lands takes offset 3. A race on a busy broker, and the likely cause of this test's one
    # failure in four runs of the sim suite under load; its output was not kept)
    await _until_end(s, tp, 4)
    assert (await (await plain.send(t, b"plain", partition=0))).offset == 4
    await tx.begin_transaction()
    assert (await (await tx.send(t, b"open", partition=0))).offset == 5
    assert (await (await plain.send(t, b"after-open", partition=0))).offset == 6
    s.open_producer = tx  # type: ignore[attr-defined]
    await plain.stop()
    return t, tp


def test_read_committed_stops_at_the_open_transaction_and_skips_aborted(side: Side) -> None:
    async def body(s: Side) -> None:
        t, tp = await _txn_topic(s)
        rc = await started(s.consumer(enable_auto_commit=False, auto_offset_reset="earliest",
                                      isolation_level="read_committed"))
        rc.assign([tp])
        assert await rc.end_offsets([tp]) == {tp: 5}  # the last stable offset
        assert await drain(rc, {tp: 5}) == [(0, 0, b"committed"), (0, 4, b"plain")]
        assert rc.highwater(tp) == 7 and rc.last_stable_offset(tp) == 5
        assert values(await rc.getmany(timeout_ms=300)) == []  # nothing past the open one
        latest = await started(s.consumer(enable_auto_commit=False,
                                          isolation_level="read_committed"))
        latest.assign([tp])
        await latest.seek_to_end(tp)
        assert await latest.position(tp) == 5  # (read_committed: the end is the LSO)
        await latest.stop()
        ru = await started(s.consumer(enable_auto_commit=False, auto_offset_reset="earliest"))
        ru.assign([tp])
        assert await ru.end_offsets([tp]) == {tp: 7}
        assert await drain(ru, {tp: 7}) == [(0, 0, b"committed"), (0, 2, b"aborted"),
                                            (0, 4, b"plain"), (0, 5, b"open"),
                                            (0, 6, b"after-open")]
        await s.open_producer.commit_transaction()  # type: ignore[attr-defined]
        # the marker takes offset 7; the open records are read now, in offset order
        assert await drain(rc, {tp: 8}) == [(0, 5, b"open"), (0, 6, b"after-open")]
        assert await rc.end_offsets([tp]) == {tp: 8}
        await rc.seek_to_end(tp)
        assert await rc.position(tp) == 8
        for client in (rc, ru, s.open_producer):  # type: ignore[attr-defined]
            await client.stop()
    side.run(body)


def test_a_new_producer_of_a_transactional_id_fences_the_old(side: Side) -> None:
    async def body(s: Side) -> None:
        t = await s.topic(1)
        tp = TopicPartition(t, 0)
        old = await started(s.producer(transactional_id=f"{t}.slot-0"))
        with pytest.raises(IllegalOperation):
            await old.send(t, b"outside", partition=0)
        await old.begin_transaction()
        await (await old.send(t, b"zombie-1", partition=0))
        new = await started(s.producer(transactional_id=f"{t}.slot-0"))
        late = await old.send(t, b"zombie-2", partition=0)
        with pytest.raises(ProducerFenced):
            await late
        with pytest.raises(ProducerFenced):
            await old.commit_transaction()
        with pytest.raises(AssertionError):  # (aiokafka: fatal state, no new transaction)
            await old.begin_transaction()
        with pytest.raises(IllegalOperation):  # (nor a send)
            await old.send(t, b"zombie-3", partition=0)
        await new.begin_transaction()
        await (await new.send(t, b"successor", partition=0))
        await new.commit_transaction()
        rc = await started(s.consumer(enable_auto_commit=False, auto_offset_reset="earliest",
                                      isolation_level="read_committed"))
        rc.assign([tp])
        end = (await rc.end_offsets([tp]))[tp]
        # zombie-1 (0), its abort marker (1), the successor (2), its commit marker (3)
        assert end == 4
        assert await drain(rc, {tp: end}) == [(0, 2, b"successor")]
        for client in (old, new, rc):
            await client.stop()
    side.run(body)


def test_group_offsets_commit_and_committed(side: Side) -> None:
    async def body(s: Side) -> None:
        t = await s.topic(2)
        tp, other = TopicPartition(t, 0), TopicPartition(t, 1)
        p = await started(s.producer())
        for i in range(5):
            await (await p.send(t, bytes([i]), partition=0))
        group = f"{t}.workers"
        c = await started(s.consumer(group_id=group, enable_auto_commit=False,
                                     auto_offset_reset="earliest"))
        c.assign([tp, other])
        assert await c.committed(tp) is None
        assert await c.position(tp) == 0  # (no commit: the reset policy)
        await c.commit({tp: 3})
        assert await c.committed(tp) == 3 and await c.committed(other) is None
        await c.stop()
        again = await started(s.consumer(group_id=group, enable_auto_commit=False,
                                         auto_offset_reset="earliest"))
        again.assign([tp])
        assert await again.position(tp) == 3
        assert await drain(again, {tp: 5}) == [(0, 3, b"\x03"), (0, 4, b"\x04")]
        lone = await started(s.consumer(enable_auto_commit=False))
        lone.assign([tp])
        with pytest.raises(IllegalOperation):
            await lone.committed(tp)
        with pytest.raises(IllegalOperation):
            await lone.commit({tp: 1})
        for client in (p, again, lone):
            await client.stop()
    side.run(body)


def test_out_of_range_after_retention_follows_the_reset_policy(side: Side) -> None:
    async def body(s: Side) -> None:
        t = await s.topic(1)
        tp = TopicPartition(t, 0)
        p = await started(s.producer())
        for i in range(8):
            await (await p.send(t, bytes([i]), partition=0))
        await s.delete_records(tp, 3)
        clients = [p]
        for reset in ("none", "earliest", "latest"):
            c = await started(s.consumer(enable_auto_commit=False, auto_offset_reset=reset))
            clients.append(c)
            c.assign([tp])
            assert await c.beginning_offsets([tp]) == {tp: 3}
            assert await c.end_offsets([tp]) == {tp: 8}
            c.seek(tp, 1)
            assert await c.position(tp) == 1  # (a seek is local: checked by the fetch)
            if reset == "none":
                with pytest.raises(OffsetOutOfRangeError) as info:
                    for _ in range(10):
                        await c.getmany(timeout_ms=1000)
                assert info.value.args == ({tp: 1},)
                c.seek(tp, 100)
                with pytest.raises(OffsetOutOfRangeError):
                    for _ in range(10):
                        await c.getmany(timeout_ms=1000)
            elif reset == "earliest":
                assert await drain(c, {tp: 8}) == [(0, o, bytes([o])) for o in range(3, 8)]
                c.seek(tp, 100)  # past the end: back to the log start too
                assert await drain(c, {tp: 8}) == [(0, o, bytes([o])) for o in range(3, 8)]
            else:
                assert await drain(c, {tp: 8}) == []
                assert await c.position(tp) == 8
        for client in clients:
            await client.stop()
    side.run(body)


def test_admin_topics_and_cluster(side: Side) -> None:
    async def body(s: Side) -> None:
        t = await s.topic(3)
        admin = s.admin()
        await admin.start()
        assert t in await admin.list_topics()
        (d,) = await admin.describe_topics([t])
        assert (d["error_code"], d["topic"]) == (0, t)
        assert sorted(p["partition"] for p in d["partitions"]) == [0, 1, 2]
        (missing,) = await admin.describe_topics([t + ".missing"])
        assert missing["error_code"] != 0 and not missing["partitions"]
        # (no exception: the error code in the answer; sfaas.runtime.kafka.ensure_topics
        # describes the topics after, whatever the answer)
        answer = await admin.create_topics([NewTopic(t, 3, 1)])
        assert [(n, code) for n, code, _ in answer.topic_errors] == \
            [(t, TopicAlreadyExistsError.errno)]
        cluster = await admin.describe_cluster()
        assert len(cluster["brokers"]) >= 1 and "node_id" in cluster["brokers"][0]
        await admin.close()
    side.run(body)


def test_keys_headers_and_a_stopped_producer(side: Side) -> None:
    async def body(s: Side) -> None:
        t = await s.topic(1)
        tp = TopicPartition(t, 0)
        p = await started(s.producer())
        fut = await p.send(t, b"v", key=b"k", partition=0, headers=[("sfaas-gen", b"0.1")])
        await p.flush()
        assert fut.done() and (await fut).offset == 0
        await p.stop()
        with pytest.raises(ProducerClosed):
            await p.send(t, b"after", partition=0)
        c = await started(s.consumer(enable_auto_commit=False, auto_offset_reset="earliest"))
        c.assign([tp])
        (rec,) = (await c.getmany(timeout_ms=2000))[tp]
        assert (rec.key, rec.value, list(rec.headers)) == (b"k", b"v", [("sfaas-gen", b"0.1")])
        assert (rec.topic, rec.partition, rec.offset) == (t, 0, 0)
        await c.stop()
    side.run(body)
