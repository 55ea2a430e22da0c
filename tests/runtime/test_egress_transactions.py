"""Replies leave in Kafka transactions of the worker's slot (``worker/egress.py``).

Against a real Kafka: a worker killed between producing a reply and committing it, whose
successor in the slot reads the egress topic and produces the reply again in its replay —
the nemesis found this reply twice in the topic (seed 4251531938) when replies were not
transactional; now the successor's producer fences the dead one, which aborts its copy,
and a ``read_committed`` reader sees the reply once. Without a cluster, on producers of our
own: a stuck or fenced transaction is tried again through one new producer, a transaction
that may have landed is not, replies queued during a commit go into the next one, a
zombie renews nothing, and a round's ``durable`` waits for the commit under way."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, OutOfOrderSequenceNumber, ProducerFenced

from sfaas.errors import EXIT_FENCED
from sfaas.runtime import wire
from sfaas.runtime.kafka import ensure_topics, read_range
from sfaas.runtime.settings import Settings
from tests.fuzz.harness import bare_worker
from tests.namespaces import fresh_namespace
from tests.runtime.txn_fakes import Factory, TxnProducer
from worker.clients import RESENDS
from worker.egress import GEN_HEADER, Egress, transactional_id
from worker.fence import Fenced, FenceLease
from worker.service import Worker
from worker.state import WorkerState

OUT = "fuzz.out"


def _worker(tmp_path: Path, first: TxnProducer, factory: Factory, **settings: Any) -> Worker:
    """A bare worker with rounds on (a reply that fails for good makes it leave), its first
    lane's reply producer ``first``, the second lane's a fresh one, and new ones from
    ``factory``."""
    w = bare_worker(str(tmp_path), snapshot_interval=1.0, **settings)
    w.state.egress_topic = OUT
    w.egress.new_producer = factory
    for lane, producer in zip(w.egress.lanes, (first, TxnProducer(factory.offsets)), strict=True):
        lane.producer, lane.txn_id = producer, transactional_id(OUT, w.state.index, lane.index)
    return w


def _queue(w: Worker, offsets: range) -> None:
    for off in offsets:
        w.state.offsets.take(2, off)
        w.egress.add(1, wire.Reply(f"r{off}", True, off).encode(), 2, off)


def _rids(values: list[bytes]) -> list[str]:
    return [wire.Reply.decode(v).rid for v in values]


async def _closing(w: Worker, test: Any) -> None:
    try:
        await asyncio.wait_for(test(), 30)
    finally:
        assert w.state.engine is not None
        w.state.engine.close()


async def test_each_reply_producer_knows_the_egress_topic_before_its_first_record(
        tmp_path: Path) -> None:
    """A started (or renewed) lane's producer has fetched the egress topic's metadata: its
    first send otherwise waits for a refresh, and a promoted standby's first send is its
    recovery's fence (0.13 s of a failover on a busy host)."""
    factory = Factory()
    w = _worker(tmp_path, TxnProducer(factory.offsets), factory)

    async def test() -> None:
        for lane in w.egress.lanes:
            lane.producer, lane.txn_id = None, None
        await w.egress.start(w.state.index)
        assert len(factory.made) == 2
        assert [p.asked for p in factory.made] == [[OUT], [OUT]]
        assert all(p.started for p in factory.made)

    await _closing(w, test)


async def test_a_stuck_transaction_commits_once_through_one_new_producer(tmp_path: Path) -> None:
    factory = Factory()
    stuck = TxnProducer(factory.offsets, send_error=OutOfOrderSequenceNumber())
    w = _worker(tmp_path, stuck, factory)

    async def test() -> None:
        _queue(w, range(2))
        await w.egress.flush()
        assert not w.uplink.closed
        assert stuck.committed == []
        assert len(factory.made) == 1 and w.egress.renewals == 1
        assert factory.ids == [transactional_id(OUT, 0)]  # the slot's id: it fences the stuck one
        fresh = factory.made[0]
        assert _rids(fresh.values()) == ["r0", "r1"] and len(fresh.committed) == 1
        assert fresh.asked == [OUT]  # (its topic's metadata fetched as it started)
        stamp = [(GEN_HEADER, f"0.{w.state.generation}".encode())]
        assert [h for _, _, _, h in fresh.committed[0]] == [stamp, stamp]
        assert w.state.offsets.in_flight == 0 and w.egress.acked == {1: 2}
        await asyncio.sleep(0.01)
        assert stuck.stopped  # (stopped in the background)

    await _closing(w, test)


async def test_a_reply_transaction_failing_every_time_makes_the_worker_leave(tmp_path: Path) -> None:
    factory = Factory(send_error=OutOfOrderSequenceNumber())
    first = TxnProducer(factory.offsets, send_error=OutOfOrderSequenceNumber())
    w = _worker(tmp_path, first, factory)

    async def test() -> None:
        _queue(w, range(1))
        await w.egress.flush()
        assert w.uplink.closed  # a recovery produces it again
        assert len(factory.made) == RESENDS and w.egress.renewals == RESENDS
        assert [len(p.sent) for p in [first, *factory.made]] == [1] * (RESENDS + 1)
        assert not any(p.committed for p in [first, *factory.made])
        assert w.state.offsets.in_flight == 1  # never completed: its offset is not committed

    await _closing(w, test)


async def test_a_commit_that_may_have_landed_is_not_tried_again(tmp_path: Path) -> None:
    """Kafka unreachable past the producer's retries at the commit: nothing says the broker
    did not commit, so the replies are not produced again — the worker leaves, and a new
    producer (which waits for that commit to end, or aborts it) is in place before anyone
    reads the topic."""
    factory = Factory()
    first = TxnProducer(factory.offsets, commit_error=KafkaTimeoutError())
    w = _worker(tmp_path, first, factory)

    async def test() -> None:
        _queue(w, range(1))
        await w.egress.flush()
        assert w.uplink.closed and len(first.sent) == 1
        assert len(factory.made) == 1 and factory.made[0].sent == []  # renewed, nothing resent
        assert w.state.offsets.in_flight == 1

    await _closing(w, test)


async def test_replies_are_sent_at_once_and_commit_together_when_the_window_ends(
        tmp_path: Path) -> None:
    """A transaction stays open ``reply_commit_ms`` for more replies: each reply is handed
    to Kafka as it comes (an uncommitted reader sees it), and the replies of one window
    commit as one transaction, with nobody flushing."""
    factory = Factory()
    first = TxnProducer(factory.offsets)
    w = _worker(tmp_path, first, factory, reply_commit_ms=200)

    async def test() -> None:
        running = asyncio.ensure_future(w.egress.run())
        _queue(w, range(1))
        await asyncio.sleep(0.02)
        assert _rids([v for _, v, _, _ in first.sent]) == ["r0"] and first.committed == []
        _queue(w, range(1, 3))
        await asyncio.sleep(0.02)
        assert len(first.sent) == 3 and first.committed == []  # sent, the window still open
        assert w.state.offsets.in_flight == 3  # (completed only once committed)
        for _ in range(100):
            if first.committed:
                break
            await asyncio.sleep(0.01)
        assert [_rids([v for _, v, _, _ in t]) for t in first.committed] == [["r0", "r1", "r2"]]
        assert w.state.offsets.in_flight == 0 and w.egress.transactions == 1
        running.cancel()

    await _closing(w, test)


async def test_replies_queued_during_a_commit_go_out_in_the_other_lane_and_durable_waits(
        tmp_path: Path) -> None:
    """While one lane's transaction commits, replies are not held back: the slot's other
    producer sends them in its own transaction; ``durable`` (a round, a recovery) commits
    the open one at once and waits for both."""
    hold = asyncio.Event()
    factory = Factory()
    first = TxnProducer(factory.offsets, hold=hold)
    w = _worker(tmp_path, first, factory, reply_commit_ms=0)
    second = w.egress.lanes[1].producer

    async def test() -> None:
        running = asyncio.ensure_future(w.egress.run())
        _queue(w, range(1))
        await asyncio.sleep(0.01)  # the first transaction waits at its commit
        _queue(w, range(1, 4))
        await asyncio.sleep(0.01)
        assert _rids([v for _, v, _, _ in second.sent]) == ["r1", "r2", "r3"]  # not held back
        durable = asyncio.ensure_future(w.egress.durable())
        also = asyncio.ensure_future(w.egress.flush())  # (a second caller: no third transaction)
        await asyncio.sleep(0.01)
        assert not durable.done() and w.state.offsets.in_flight == 1
        hold.set()
        await asyncio.gather(durable, also)
        assert [_rids([v for _, v, _, _ in t]) for t in first.committed] == [["r0"]]
        assert [_rids([v for _, v, _, _ in t]) for t in second.committed] == [["r1", "r2", "r3"]]
        assert w.state.offsets.in_flight == 0 and w.egress.transactions == 2
        assert factory.made == []  # (both lanes' own producers: nothing renewed)
        running.cancel()

    await _closing(w, test)


async def test_a_zombie_renews_nothing(tmp_path: Path) -> None:
    """A worker whose lease ran out (paused past the timeout) finds its transaction fenced:
    it must not start a new producer of the slot's id, which would fence its successor."""
    exits: list[int] = []
    now = [10.0]
    factory = Factory()
    first = TxnProducer(factory.offsets, commit_error=ProducerFenced())
    w = _worker(tmp_path, first, factory)
    lease = FenceLease(2.0, lambda: w.uplink.closed, clock=lambda: now[0], exit=exits.append)
    lease.grant(10.0)
    w.egress._lease = lease

    async def test() -> None:
        _queue(w, range(1))
        original = first.commit_transaction

        async def commit() -> None:
            now[0] = 20.0  # (the process was paused here, long past its lease)
            await original()

        first.commit_transaction = commit  # type: ignore[method-assign]
        with pytest.raises(Fenced):
            await w.egress.flush()
        assert factory.made == [] and exits[:1] == [EXIT_FENCED]

    await _closing(w, test)


# -- a real Kafka -----------------------------------------------------------------------------------

def _egress(s: Settings, topic: str, generation: int, closed: list[str]) -> Egress:
    st = WorkerState(1, False)
    st.index, st.generation, st.egress_topic = 0, generation, topic
    uplink = SimpleNamespace(closed=False, close=lambda: closed.append(f"gen {generation}"))
    return Egress(s, st, SimpleNamespace(consumer=None), uplink,  # type: ignore[arg-type]
                  completed=SimpleNamespace(complete=lambda p, o: None))


def test_a_dead_workers_reply_is_not_seen_twice_after_its_successors_replay(kafka: Any) -> None:
    """The dead worker produced replies r1 and r2 — one in each of its slot's two lanes —
    and was killed before either commit (their bytes are in the topic); the successor
    starts the slot's producers, reads the topic as its recovery does, finds neither
    answered and produces both in its replay. ``read_committed`` sees each once, from the
    successor; the topic holds the dead copies too (what an idempotent producer left
    visible), and the dead process can commit nothing any more."""
    s = Settings(kafka=kafka.kafka_bootstrap, reply_commit_ms=0)
    asyncio.run(asyncio.wait_for(dead_worker_replaced(s, f"{fresh_namespace()}.out"), 90))


async def dead_worker_replaced(s: Settings, topic: str) -> None:
    """The scenario of the test above, on whatever Kafka ``s`` names (the real broker here;
    the simulated one in ``tests/sim/test_product_on_sim.py``)."""
    closed: list[str] = []
    exits: list[int] = []
    counter = itertools.count()
    await ensure_topics(s.kafka, {topic: 2})
    dead, successor = _egress(s, topic, 1, closed), _egress(s, topic, 2, closed)
    now = [0.0]
    lease = FenceLease(2.0, lambda: False, clock=lambda: now[0], exit=exits.append)
    lease.grant(0.0)
    dead._lease = lease
    await dead.start(0)
    held, wake = [asyncio.Event(), asyncio.Event()], asyncio.Event()
    for lane in dead.lanes:
        original = lane.producer.commit_transaction

        async def commit(original: Any = original, at: asyncio.Event = held[lane.index]) -> None:
            at.set()  # (paused here, past its lease, before its commit)
            await wake.wait()
            await original()

        lane.producer.commit_transaction = commit
    r1, r2 = (wire.Reply(f"r{i}", True, next(counter)).encode() for i in (1, 2))
    dead.add(0, r1, -1, -1)
    dying = asyncio.ensure_future(dead.flush())
    await asyncio.wait_for(held[0].wait(), 20)
    dead.add(1, r2, -1, -1)  # (lane 0 commits: the next reply goes out in lane 1)
    dying2 = asyncio.ensure_future(dead.flush())
    await asyncio.wait_for(held[1].wait(), 20)
    tps = {TopicPartition(topic, p): 0 for p in range(2)}

    async def rids(committed: bool = False) -> list[str]:
        raw = await read_range(s.kafka, tps, committed=committed)
        return sorted(_rids([v for recs in raw.values() for _, v in recs]))

    assert await rids() == ["r1", "r2"]
    await successor.start(0)  # fences both dead lanes: their open transactions abort
    assert await rids(committed=True) == []  # not answered: replay
    successor.add(0, r1, -1, -1)
    successor.add(1, r2, -1, -1)
    await successor.flush()
    # the dead process wakes and commits: refused, and it renews nothing (a new producer
    # of the slot's id would fence its successor): its lease ran out long ago
    now[0] = 100.0
    wake.set()
    for flushing in (dying, dying2):
        with pytest.raises(Fenced):
            await flushing
    committed, everything = await rids(committed=True), await rids()
    await successor.stop()
    for lane in dead.lanes:
        await lane.producer.stop()
    assert committed == ["r1", "r2"]
    assert everything == ["r1", "r1", "r2", "r2"]
    assert successor.transactions == 1 and dead.transactions == 0 and closed == []
    assert exits[:1] == [EXIT_FENCED]


def test_a_recoverys_fence_bounds_the_committed_replies_and_stays_invisible(kafka: Any) -> None:
    """The simulator's seeds 158, 176, 214, 303 and 644: a fresh worker's recovery read
    the replies through a stale leader's short end, took replies already committed as
    never sent and committed them twice. Now the recovery first writes a fence record to
    every egress partition, in a transaction it aborts, and reads up to it: the fence's
    offset is past every committed reply, a ``read_committed`` reader never sees the
    record, and the lane commits replies again afterwards."""
    s = Settings(kafka=kafka.kafka_bootstrap, reply_commit_ms=0)
    asyncio.run(asyncio.wait_for(fenced(s, f"{fresh_namespace()}.out"), 90))


async def fenced(s: Settings, topic: str) -> None:
    await ensure_topics(s.kafka, {topic: 2})
    egress = _egress(s, topic, 1, [])
    await egress.start(0)
    tps = {TopicPartition(topic, p): 0 for p in range(2)}
    try:
        for i, p in enumerate((0, 1, 1)):
            egress.add(p, wire.Reply(f"r{i}", True, i).encode(), -1, -1)
        await egress.flush()
        ends = await egress.fence([0, 1])
        egress.add(0, wire.Reply("r3", True, 3).encode(), -1, -1)
        await egress.flush()
        committed = await read_range(s.kafka, tps, committed=True)
        everything = await read_range(s.kafka, tps)
    finally:
        await egress.stop()
    before = [(p, o) for p, recs in committed.items() for o, v in recs
              if wire.Reply.decode(v).rid != "r3"]
    assert len(before) == 3 and all(o < ends[p] for p, o in before)
    assert sorted(_rids([v for recs in committed.values() for _, v in recs])) == \
        ["r0", "r1", "r2", "r3"]
    fences = [(p, o) for p, recs in everything.items() for o, v in recs if v == wire.FENCE]
    assert fences == [(0, ends[0]), (1, ends[1])]
    assert ends[1] >= 2 and committed[0][-1][0] > ends[0]  # (r3: after the fence)


async def test_a_reply_producer_asks_again_soon_while_its_predecessors_transaction_ends() -> None:
    """A slot's new reply producer is answered ``CONCURRENT_TRANSACTIONS`` until the dead
    process's open transaction is aborted: each answer costs one retry backoff, on every
    recovery's critical path (``benchmarks/runtime/client_starts.py``: 0.13 s at aiokafka's
    100 ms, 0.03 s at 20 ms). Other producers keep aiokafka's."""
    from sfaas.runtime.kafka import TXN_RETRY_BACKOFF_MS, make_producer
    replies = make_producer("127.0.0.1:9", transactional_id="app.out.slot-0")
    log = make_producer("127.0.0.1:9", durable=True)
    assert replies._sender._retry_backoff == TXN_RETRY_BACKOFF_MS / 1000 <= 0.02
    assert log._sender._retry_backoff == 0.1


class _FencedProducer(TxnProducer):
    """A producer another process of the slot fenced: aiokafka leaves it in FATAL_ERROR and
    its state machine refuses every begin."""

    async def begin_transaction(self) -> None:
        raise AssertionError("Invalid state transition TransactionState.FATAL_ERROR -> "
                             "TransactionState.IN_TRANSACTION")


async def test_a_recoverys_fence_on_a_fenced_producer_renews_it_on_the_next_attempt(
        tmp_path: Path) -> None:
    """Nemesis seed 13: a worker got its slot back after the slot's promoted standby, which
    had fenced its reply producers, was lost too. Each recovery attempt's fence began a
    transaction on the fatal producer and failed — 25 attempts, until the run ended. The
    failed fence now marks the lane broken, so the next attempt renews its producer."""
    factory = Factory()
    fenced_producer = _FencedProducer(factory.offsets)
    w = _worker(tmp_path, fenced_producer, factory)

    async def test() -> None:
        with pytest.raises(AssertionError, match="FATAL_ERROR"):
            await w.egress.fence([0, 1])  # (this attempt fails: the recovery tries again)
        ends = await w.egress.fence([0, 1])
        assert sorted(ends) == [0, 1] and w.egress.renewals == 1
        assert factory.ids == [transactional_id(OUT, 0)] and factory.made[0].committed == []
        await asyncio.sleep(0.01)
        assert fenced_producer.stopped  # (retired in the background)

    await _closing(w, test)
