"""A worker's part of a round (worker.protocols.rounds.RoundTaker): every store is frozen at the
cut, and their uploads start spread out over at most half an interval."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from sfaas.runtime import wire
from statestores import SnapshotInfo
from statestores.snapshots import SnapshotAbandoned, SnapshotState
from worker.protocols.rounds import UPLOAD_SPACING, RoundTaker
from worker.state import Cut


class _Store:
    """Records what a round asks of it; its upload ends when the test says so."""

    engine = "memonly"  # (a round records each store's engine)

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []
        self.upload: concurrent.futures.Future[SnapshotInfo] = concurrent.futures.Future()
        self.snapshot_state = SnapshotState()  # (counts its restores)

    def snapshot_async(self, snapshot_id: int, *, delay: float = 0.0) -> concurrent.futures.Future[SnapshotInfo]:
        self.calls.append((snapshot_id, delay))
        return self.upload


def _info(sid: int) -> SnapshotInfo:
    return SnapshotInfo(snapshot_id=sid, files_uploaded=1, bytes_uploaded=100, files_total=2, bytes_total=300,
                        freeze_seconds=0.0, upload_seconds=0.0)


@pytest.mark.parametrize(("interval", "n"), [(1.0, 4), (5.0, 4), (0.2, 4), (1.0, 64)])
async def test_a_rounds_uploads_start_spread_over_at_most_half_an_interval(interval: float, n: int) -> None:
    sent: list[wire.Message] = []
    taker = RoundTaker(0, sent.append, interval=interval)
    stores = {("op", p): _Store() for p in range(n)}

    async def durable() -> None:
        return None

    taker.take(7, Cut(42, {0: 10}, {}, [], {0: 3}, 5), stores, durable)  # type: ignore[arg-type]
    delays = [s.calls[0][1] for s in stores.values()]
    assert all(s.calls == [(7, d)] for s, d in zip(stores.values(), delays, strict=True))  # each frozen once, now
    step = min(UPLOAD_SPACING, interval / 2 / n)
    assert delays == pytest.approx([i * step for i in range(n)])
    assert delays[-1] < interval / 2
    await asyncio.sleep(0.01)
    assert sent == []  # the report waits for every upload
    for p, s in enumerate(stores.values()):
        s.upload.set_result(_info(7))
        if p < n - 1:
            await asyncio.sleep(0)
            assert sent == []
    await taker.close()
    assert len(sent) == 1
    report = sent[0]
    assert isinstance(report, wire.Snapshotted) and report.round == 7 and report.error == ""
    # (the cut travels whole, from WorkerState.cut to the report)
    assert (report.epoch, report.ingress, report.skip, report.egress, report.retries,
            report.epoch_log) == (42, {0: 10}, {}, {0: 3}, [], 5)
    assert [(c.operator, c.partition, c.engine) for c in report.stores] == [
        ("op", p, "memonly") for p in range(n)]


@pytest.mark.parametrize("upload", ["abandoned", "done"])
async def test_a_round_rolled_back_before_its_report_is_not_reported(upload: str) -> None:
    """A recovery restored the stores after the freeze: the round's report (its cut's old
    positions) must never go out, not even as a failure — a restarted coordinator may have
    a round in flight under the same id (statestores abandons the uploads still running,
    or they had ended already and the report was waiting for the replies' acks)."""
    sent: list[wire.Message] = []
    taker = RoundTaker(0, sent.append, interval=1.0)
    stores = {("op", p): _Store() for p in range(2)}
    acked = asyncio.Event()

    async def durable() -> None:
        await acked.wait()

    taker.take(7, Cut(42, {0: 10}, {}, [], {0: 3}, 5), stores, durable)  # type: ignore[arg-type]
    for s in stores.values():
        if upload == "done":
            s.upload.set_result(_info(7))
        s.snapshot_state.restores += 1  # a rollback restored it
        if upload == "abandoned":
            s.upload.set_exception(SnapshotAbandoned("restored to snapshot 5"))
    acked.set()
    await taker.close()
    assert sent == [] and taker.abandoned == 1 and taker.taken == 0


async def test_a_round_taken_after_a_rollback_is_reported() -> None:
    sent: list[wire.Message] = []
    taker = RoundTaker(0, sent.append, interval=1.0)
    stores = {("op", 0): _Store()}
    stores["op", 0].snapshot_state.restores = 3  # (restored before the freeze: no matter)

    async def durable() -> None:
        return None

    taker.take(8, Cut(50, {0: 10}, {}, [], {0: 3}, 5), stores, durable)  # type: ignore[arg-type]
    stores["op", 0].upload.set_result(_info(8))
    await taker.close()
    assert len(sent) == 1 and isinstance(sent[0], wire.Snapshotted) and sent[0].round == 8


async def test_a_round_its_worker_may_no_longer_report_is_dropped_and_its_stop_ends() -> None:
    """The coordinator's channel closed while the report waited for the lease (the worker
    was cut off and its standby took the slot: it never rejoins, so nothing renews the
    lease): ``held`` says no and the report is dropped — the stop, which waits for the
    pending reports, ends (the simulator's seeds 428 and 686 hung there)."""
    sent: list[wire.Message] = []
    asked: list[int] = []

    async def held(round_id: int) -> bool:
        asked.append(round_id)
        return False

    taker = RoundTaker(0, sent.append, held, interval=1.0)
    stores = {("op", 0): _Store()}

    async def durable() -> None:
        return None

    taker.take(9, Cut(60, {0: 10}, {}, [], {0: 3}, 5), stores, durable)  # type: ignore[arg-type]
    stores["op", 0].upload.set_result(_info(9))
    await asyncio.wait_for(taker.close(), 5)
    assert asked == [9] and sent == [] and taker.abandoned == 1 and taker.taken == 0
