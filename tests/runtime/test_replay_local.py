"""``sfaas.testing.replay`` without Kafka or MinIO: a hand-made epoch log of counter bumps,
replayed with :class:`LogReplay` — in tid order within each epoch and epoch after epoch,
on the caller's thread (so a ``breakpoint()`` in a function stops there) — and compared
with the replies a cluster would have committed (:func:`compare`)."""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from sfaas import App, Context
from sfaas.runtime import wire
from sfaas.runtime.epochlog import EpochRecord
from sfaas.runtime.partitioning import owner_of_partition, partition_of
from sfaas.runtime.recorded import empty_round
from sfaas.runtime.txn.epochs import make_tid
from sfaas.testing.replay import LogReplay, compare

WORKERS, PARTITIONS = 2, 4
ran_on: list[int] = []

app = App("bumps")
counters = app.operator("counters", store="memonly")


@counters.function
async def bump(ctx: Context) -> int:
    ran_on.append(threading.get_ident())
    if ctx.key == "stop":
        breakpoint()  # (the test's hook stands in for pdb)
    v = int(ctx.get(default=0))
    ctx.put(v + 1)
    return v


def _history(epochs: list[list[str]]) -> tuple[list[EpochRecord], dict[tuple[int, int], wire.Request]]:
    """Per epoch, the keys bumped (in arrival order): the records and the ingress requests."""
    offsets = [itertools.count() for _ in range(PARTITIONS)]
    requests: dict[tuple[int, int], wire.Request] = {}
    records = []
    for epoch, keys in enumerate(epochs, start=1):
        batches: dict[int, list[tuple[int, int, int]]] = {}
        for key in keys:
            p = partition_of("counters", key, PARTITIONS)
            o = next(offsets[p])
            requests[(p, o)] = wire.Request(f"r{epoch}-{len(requests)}", "counters", key, "bump", [], 0, None)
            w = owner_of_partition(p, WORKERS)
            batch = batches.setdefault(w, [])
            batch.append((make_tid(epoch, w, len(batch)), p, o))
        records += [EpochRecord(epoch, w, 1000.0 + epoch, tuple(b)) for w, b in sorted(batches.items())]
    return records, requests


def test_a_replay_runs_the_log_in_order_on_the_callers_thread_and_finds_a_changed_reply(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records, requests = _history([["a", "b", "a"], ["stop", "a"], ["b", "stop"]])
    stopped: list[int] = []
    monkeypatch.setattr(sys, "breakpointhook", lambda *a, **k: stopped.append(threading.get_ident()))
    ran_on.clear()

    async def go() -> tuple[list[Any], dict[str, Any]]:
        replay = LogReplay(app, empty_round(PARTITIONS, WORKERS), records, requests, tmp_path)
        try:
            decided = [d for e in replay.epochs for d in await replay.run_epoch(e)]
            return decided, replay.items("counters")
        finally:
            await replay.close()

    decided, state = asyncio.run(go())
    me = threading.get_ident()
    assert set(ran_on) == {me} and stopped == [me, me]
    assert state == {"a": 3, "b": 2, "stop": 2}
    # every bump of "a" read the one before it: its replies are 0, 1, 2 in log order
    by_rid = {d.item.rid: d for d in decided}
    a = sorted((rid for rid, d in by_rid.items() if d.item.request.key == "a"),
               key=lambda rid: (by_rid[rid].epoch, by_rid[rid].tid))
    assert [by_rid[rid].value for rid in a] == [0, 1, 2]
    # the committed replies: as replayed, but one that the cluster answered otherwise
    replies = {rid: d.reply() for rid, d in by_rid.items()}
    replies[a[1]] = wire.Reply(a[1], False, None, "Abort", "no")
    found = compare(decided, replies)
    assert (found.compared, found.direct, found.unanswered) == (len(by_rid), 0, 0)
    assert [d.rid for d in found.divergences] == [a[1]]
    assert found.divergences[0].describe() == (
        f"request {a[1]}: counters.bump on key 'a' (epoch 1): the cluster replied Abort: 'no', "
        "the replay 1")
