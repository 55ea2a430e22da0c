"""A worker that rejoins a restarted coordinator starts ingest where it had taken requests.

The ``faults`` series (seed 777): the coordinator was killed while the workers replayed a
recovery. That recovery's read of the ingress topic had taken records 4031–4038, which the
ingest consumer had never fetched (its position stayed at 4031). The rejoin restarted
ingest from the consumer's position, ingest took 4031 again, the offset tracker refused
it (``taken out of order (next is 4039)``) and the worker left: 4 s more of the gap.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from sfaas.runtime import wire
from worker.ingress import Ingress
from worker.state import WorkerState

PARTITION = 2


class _Consumer:
    """A consumer over one in-memory partition: ``getmany`` hands out records from its
    position on, as aiokafka's does."""

    def __init__(self, records: dict[int, bytes], position: int) -> None:
        self.records = records
        self.position = position

    def assign(self, tps: list[TopicPartition]) -> None:
        assert [tp.partition for tp in tps] == [PARTITION]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.position = offset

    async def getmany(self, timeout_ms: int = 0, max_records: int = 1) -> dict[Any, list[Any]]:
        offs = [o for o in sorted(self.records) if o >= self.position][:max_records]
        if not offs:
            await asyncio.sleep(timeout_ms / 1000)
            return {}
        self.position = offs[-1] + 1
        recs = [SimpleNamespace(offset=o, value=self.records[o]) for o in offs]
        return {TopicPartition("in", PARTITION): recs}


def _request(offset: int) -> bytes:
    return wire.Request(f"r{offset}", "accounts", f"k{offset}", "deposit", [1], 0, 0.0).encode()


async def test_a_rejoin_mid_recovery_starts_ingest_past_what_the_recovery_took() -> None:
    state = WorkerState(8, False)
    state.ingress_topic, state.egress_topic = "in", "out"
    state.reply_partitions(1)
    state.index, state.partitions, state.owners = 0, 4, [1, 1, 0, 1]
    state.loop = SimpleNamespace(queue=[])  # type: ignore[assignment]
    records = {o: _request(o) for o in range(4025, 4031)}
    consumer = _Consumer(records, position=4025)
    failures: list[BaseException] = []
    settings = SimpleNamespace(max_batch=8)
    ingress = Ingress(settings, state, SimpleNamespace(consumer=consumer),  # type: ignore[arg-type]
                      SimpleNamespace(add=lambda *a: None),  # type: ignore[arg-type]
                      SimpleNamespace(work_arrived=lambda: None), on_failure=failures.append)
    # ingest ran up to 4030, then a recovery's read took 4031–4038 (its rebuild)
    ingress.restart_at({PARTITION: 4025})
    for _ in range(100):
        await asyncio.sleep(0)
        if consumer.position >= 4031:
            break
    await ingress.pause()
    assert consumer.position == 4031  # what ingest fetched; then more came to Kafka
    records.update({o: _request(o) for o in range(4031, 4045)})
    queued = [it.offset for it in state.loop.queue]  # type: ignore[union-attr]
    assert queued and queued[-1] < 4031
    for off in range(4031, 4039):
        assert ingress.take(PARTITION, off, records[off]) is not None

    ingress.start_where_taken()  # the coordinator came back: the worker rejoined
    for _ in range(200):
        await asyncio.sleep(0)
        if consumer.position >= 4045:
            break
    await ingress.pause()
    assert failures == []
    assert [it.offset for it in state.loop.queue][len(queued):] == list(range(4039, 4045))  # type: ignore[union-attr]
    assert state.offsets.next_offset(PARTITION) == 4045
