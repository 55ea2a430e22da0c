"""Ingress offsets: only the offset below which every request completed is committed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfaas.runtime import wire
from sfaas.runtime.txn.offsets import OffsetTracker
from tests.runtime.txn_fakes import TxnProducer
from worker.egress import Egress
from worker.ingress import Ingress
from worker.state import Pending, WorkerState


def test_waiting_request_holds_the_watermark() -> None:
    t = OffsetTracker()
    for o in range(5):
        t.take(0, o)
    assert t.watermark(0) == 0
    for o in (1, 2, 4):  # offset 0 waits to re-run; 3 too
        t.complete(0, o)
    assert t.watermark(0) == 0
    t.complete(0, 0)
    assert t.watermark(0) == 3
    t.complete(0, 3)
    assert t.watermark(0) == 5
    assert t.outstanding(0) == 0
    assert t.watermark(1) is None


def test_misuse_names_the_offset() -> None:
    t = OffsetTracker()
    t.take(2, 10)
    with pytest.raises(ValueError, match="offset 9 of partition 2"):
        t.take(2, 9)
    with pytest.raises(ValueError, match="never taken"):
        t.complete(2, 11)
    t.complete(2, 10)
    with pytest.raises(ValueError, match="completed twice"):
        t.complete(2, 10)


def test_to_commit_reports_only_moved_watermarks() -> None:
    t = OffsetTracker()
    t.take(0, 0)
    t.take(1, 0)
    assert t.to_commit() == {0: 0, 1: 0}
    t.mark_committed({0: 0, 1: 0})
    assert t.to_commit() == {}
    t.complete(1, 0)
    assert t.to_commit() == {1: 1}


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_watermark_matches_model(data: st.DataObject) -> None:
    """Against a model: the watermark is the lowest incomplete taken offset (or next)."""
    t = OffsetTracker()
    parts = data.draw(st.integers(1, 3))
    nxt = {p: 0 for p in range(parts)}
    incomplete: dict[int, set[int]] = {p: set() for p in range(parts)}
    for _ in range(data.draw(st.integers(1, 60))):
        p = data.draw(st.integers(0, parts - 1))
        if incomplete[p] and data.draw(st.booleans()):
            o = data.draw(st.sampled_from(sorted(incomplete[p])))
            t.complete(p, o)
            incomplete[p].discard(o)
        else:
            o = nxt[p] + data.draw(st.integers(0, 2))  # Kafka offsets may have gaps
            t.take(p, o)
            incomplete[p].add(o)
            nxt[p] = o + 1
        for q in range(parts):
            expect = min(incomplete[q]) if incomplete[q] else (nxt[q] if nxt[q] else None)
            if expect is None and q not in t.watermarks():
                continue
            assert t.watermark(q) == expect
            assert t.outstanding(q) == len(incomplete[q])
        assert t.in_flight == sum(len(v) for v in incomplete.values())
    gone = data.draw(st.integers(0, parts - 1))
    t.drop(gone)  # the partition moved away: its requests no longer count
    assert t.in_flight == sum(len(v) for q, v in incomplete.items() if q != gone)


# -- the worker's wiring -------------------------------------------------------------------------


class _FakeConsumer:
    def __init__(self) -> None:
        self.commits: list[dict[int, int]] = []

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits.append({tp.partition: o for tp, o in offsets.items()})


def _request(i: int) -> wire.Request:
    return wire.Request(f"r{i}", "accounts", f"k{i}", "deposit", [1], 0, 0.0)


def _wired(snapshot_interval: float, uplink: Any) -> Any:
    """A worker's egress and ingress, wired as ``worker.service.Worker`` wires them, on fake
    Kafka clients (``w.offsets``: the state's tracker; ``w.producer``: the reply producer,
    whose deliveries wait for ``deliver()``)."""
    state = WorkerState(1, False)
    state.ingress_topic, state.egress_topic = "in", "out"
    producer = TxnProducer(manual=True)
    kafka = SimpleNamespace(consumer=_FakeConsumer())
    settings = SimpleNamespace(max_batch=1, snapshot_interval=snapshot_interval, kafka="fake:1",
                               linger_ms=0, reply_commit_ms=0)
    w = SimpleNamespace(offsets=state.offsets, consumer=kafka.consumer, producer=producer, coord=uplink)
    w.egress = Egress(settings, state, kafka, uplink)  # type: ignore[arg-type]
    w.egress.lanes[0].producer = w.egress.lanes[1].producer = producer
    w.egress.new_producer = lambda tid: TxnProducer(producer.offsets)
    w.ingress = Ingress(settings, state, kafka, w.egress, SimpleNamespace(work_arrived=lambda: None))  # type: ignore[arg-type]
    w.egress.completes(w.ingress)
    return w


async def _delivered(w: Any) -> None:
    """Once the reply transaction under way has handed its records over, deliver them."""
    for _ in range(1000):
        if w.producer.waiting:
            w.producer.deliver()
            return
        await asyncio.sleep(0)
    raise AssertionError("no reply was handed to the producer")


async def test_worker_commits_completed_offsets_only() -> None:
    """A re-running request keeps the committed offset below it; failed replies too."""
    w = _wired(0, SimpleNamespace(closed=False))
    items = [Pending(_request(i), 3, 100 + i) for i in range(4)]
    for it in items:
        w.offsets.take(it.partition, it.offset)
    # epoch: 100 re-runs (no reply); 101..103 complete
    for it in items[1:]:
        w.egress.add(0, b"reply", it.partition, it.offset)
    flushing = asyncio.ensure_future(w.egress.flush())
    await asyncio.sleep(0)
    await w.egress.commit_offsets()
    assert w.consumer.commits == [{3: 100}]  # nothing acknowledged yet
    await _delivered(w)
    await flushing
    assert w.offsets.in_flight == 1 and w.offsets.outstanding(3) == 1  # 101..103 completed
    await w.egress.commit_offsets()
    assert w.consumer.commits[-1] == {3: 100}  # 100 still waits: no move, nothing sent
    assert len(w.consumer.commits) == 1
    # the re-run completes, but its reply's transaction fails: still not completed
    w.producer.commit_error = RuntimeError("broker down")
    w.egress.add(0, b"reply", 3, 100)
    flushing = asyncio.ensure_future(w.egress.flush())
    await _delivered(w)
    await flushing
    await w.egress.commit_offsets()
    assert len(w.consumer.commits) == 1
    assert w.offsets.watermark(3) == 100
    assert not w.coord.closed  # without snapshot rounds there is no recovery to leave for


async def test_a_reply_that_cannot_be_delivered_makes_the_worker_leave_for_a_recovery() -> None:
    """With snapshot rounds on, a reply the producer gave up on would otherwise be lost to
    its client (and hold an in-flight slot): the worker leaves the cluster, as for a failed
    epoch-log write, so the recovery's replay produces it again."""
    closed: list[bool] = []
    w = _wired(1.0, SimpleNamespace(closed=False, close=lambda: closed.append(True)))
    w.offsets.take(3, 100)
    w.offsets.take(3, 101)
    w.egress.add(0, b"reply", 3, 100)
    flushing = asyncio.ensure_future(w.egress.flush())
    await _delivered(w)
    await flushing
    assert closed == [] and w.offsets.in_flight == 1
    w.egress.add(0, b"reply", 3, 101)
    w.producer.send_error = RuntimeError("broker down")
    await w.egress.flush()
    assert closed == [True]  # the coordinator sees it go and recovers
    assert w.offsets.in_flight == 1  # never completed: its offset is not committed
