"""The fallback phases: conflicting roots re-run in the epoch that found the conflict.

Drives :class:`~sfaas.runtime.txn.engine.Engine` directly through the steps of the shared epoch
loop: run every root, gather votes, commit, then either each worker's *local* fallback
(``run_fallback`` on its conflicting local-only roots in tid order, what a worker process
runs) or the *cross-worker* fallback (every conflicting root at once under ordered locks,
what :class:`~sfaas.testing.LocalRunner` runs).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sfaas import Abort, App, Context
from sfaas.runtime.state import open_partition_stores
from sfaas.runtime.txn.engine import Engine, Outcome, RootCall
from sfaas.runtime.txn.epochs import Sequencer
from sfaas.runtime.txn.loop import Participant, merge_votes


class _Router:
    def __init__(self) -> None:
        self.engines: list[Engine] = []

    async def remote_call(
        self, dest: int, tid: int, now: float, operator: str, key: str, function: str,
        args: Sequence[Any], depth: int,
    ) -> Outcome:
        return await self.engines[dest].serve(tid, now, operator, key, function, list(args), depth)


def _ledger() -> App:
    app = App("ledger")
    acc = app.operator("acc", store="memonly")

    @acc.function
    async def move(ctx: Context, to: str, amount: int) -> list:
        mine = ctx.get(default=10)
        if mine < amount:
            raise Abort("short")
        ctx.put(mine - amount)
        theirs = await ctx.call("acc", to, "add", amount)
        return [ctx.tid, mine, theirs]

    @acc.function
    async def add(ctx: Context, amount: int) -> int:
        v = ctx.get(default=10)
        ctx.put(v + amount)
        return v

    @acc.function
    async def bump(ctx: Context, far: str) -> list:
        """Increments; once the value is past 0 it also touches ``far`` (maybe remote)."""
        v = ctx.get(default=0)
        ctx.put(v + 1)
        if v > 0:
            await ctx.call("acc", far, "add", 0)
        return [ctx.tid, v]

    @acc.function
    async def swing(ctx: Context, other: str) -> list:
        """Adds 3 here and 1 to ``other`` while this key is even, else to ``other-twin``: a
        re-run that sees a newer value than its first run may call a key that run did not."""
        v = ctx.get(default=10)
        ctx.put(v + 3)
        target = other if v % 2 == 0 else f"{other}-twin"
        theirs = await ctx.call("acc", target, "add", 1)
        return [ctx.tid, v, target, theirs]

    return app


@dataclass
class _Req:
    index: int
    request: RootCall
    now: float = 0.0
    attempts: int = 0


class _Cluster:
    """Engines driven by the shared epoch loop (``sfaas.runtime.txn.loop``), recording the serial
    commit order: each epoch's commits in tid order, then each worker's fallback commits."""

    def __init__(self, app: App, workers: int, partitions: int = 8, fallback: bool | str = True,
                 alone: bool = True) -> None:
        self.dir = tempfile.mkdtemp(prefix="sfaas-fb-")
        router = _Router()
        self.engines = [
            Engine(app, i, workers, partitions,
                   open_partition_stores(app, f"{self.dir}/w{i}", [p for p in range(partitions) if p % workers == i],
                                         partitions, store="memonly"), router)
            for i in range(workers)
        ]
        router.engines = self.engines
        #: ``"cross"``: the cross-worker fallback phase; True: each worker's local one
        self.cross = fallback == "cross"
        #: the cross phase's deviated roots run again alone on their worker (as workers do)
        self.alone = alone
        self.loops = [Participant(eng, Sequencer(i), lambda r: r.request, 1000, fallback=bool(fallback))
                      for i, eng in enumerate(self.engines)]
        self.epoch = 0
        #: (tid, result) of committed transactions, in the serial order
        self.order: list[tuple[int, Any]] = []
        self.aborted: dict[int, tuple[str, str]] = {}
        self.epochs_used = 0

    async def run(self, requests: list[tuple[str, str, list[Any]]], max_batch: int = 1000) -> None:
        for i, (key, fn, args) in enumerate(requests):
            lp = self.loops[self.engines[0].owner("acc", key)]
            lp.queue.append(_Req(i, RootCall("acc", key, fn, args)))
        while any(lp.pending for lp in self.loops):
            self.epoch += 1
            for lp in self.loops:
                lp.max_batch = max_batch
                lp.begin(self.epoch, 0.0)
            await asyncio.gather(*(lp.execute() for lp in self.loops))
            conflicts, aborts = merge_votes(
                (c.items(), ((t, e, r) for t, (e, r) in u.items())) for c, u in (lp.votes() for lp in self.loops)
            )
            if self.cross:
                fates = await self._cross_commit(conflicts, aborts)
                fb = sorted((f for fs in fates for f in fs if f.fallback and not f.alone), key=lambda f: f.tid)
                # then each worker's deviated roots, alone (theirs commute with the others')
                fb += [f for fs in fates for f in sorted((f for f in fs if f.alone), key=lambda f: f.tid)]
            else:
                fates = [await lp.commit(conflicts, aborts) for lp in self.loops]
                fb = [f for fs in fates for f in fs if f.fallback]  # workers' local chains commute
            normal = sorted((f for fs in fates for f in fs if not f.fallback), key=lambda f: f.tid)
            for f in normal + fb:
                if f.committed:
                    self.order.append((f.tid, f.value))
                else:
                    self.aborted[f.tid] = f.value
            self.epochs_used += 1

    async def _cross_commit(self, conflicts: dict[int, int], aborts: dict[int, tuple[str, str]]) -> list[Any]:
        candidates = [lp.apply(conflicts, aborts) for lp in self.loops]
        tids = {t for c in candidates for t, _ in c}
        for eng in self.engines:
            eng.begin_fallback(tids)

        async def finish(tid: int, commit: bool) -> None:
            await asyncio.sleep(random.random() * 1e-4)  # other roots run meanwhile
            for eng in self.engines:
                eng.finish_fallback(tid, commit)

        out = await asyncio.gather(*(lp.run_fallback(c, finish) for lp, c in zip(self.loops, candidates, strict=True)))
        for eng in self.engines:
            eng.end_fallback()
        if self.alone:
            for lp, o in zip(self.loops, out, strict=True):
                await lp.rerun_deviated(o)
        return [lp.settle(conflicts, aborts, o) for lp, o in zip(self.loops, out, strict=True)]

    def items(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for eng in self.engines:
            for store in eng.operator_stores("acc"):
                for k, v in store.items():
                    out[k.decode()] = eng_unpack(v)
        return out


def eng_unpack(raw: bytes) -> Any:
    from sfaas.runtime.codec import unpack

    return unpack(raw)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), workers=st.integers(1, 3), n=st.integers(1, 120),
       hot=st.floats(0.3, 0.95), fallback=st.sampled_from([False, True, "cross"]))
async def test_skewed_history_is_serializable(seed: int, workers: int, n: int, hot: float,
                                              fallback: bool | str) -> None:
    """Committed results and final state == serial replay in commit order, under heavy skew."""
    rnd = random.Random(seed)
    keys = [f"k{i}" for i in range(12)]

    def draw() -> str:  # a few very hot keys, like Zipf 0.99's head
        return keys[0] if rnd.random() < hot else keys[min(11, int(rnd.expovariate(0.5)))]

    reqs = []
    for _ in range(n):
        a = draw()
        b = draw()
        while b == a:
            b = rnd.choice(keys)
        reqs.append((a, b, rnd.randint(1, 12)))
    c = _Cluster(_ledger(), workers, fallback=fallback)
    await c.run([(a, "move", [b, m]) for a, b, m in reqs], max_batch=rnd.randint(5, 60))
    by_tid = {}
    # recover request index from tid order: tids are unique; map through the results
    model: dict[str, int] = {}
    for tid, (rtid, mine, theirs) in c.order:
        assert rtid == tid
        by_tid[tid] = (mine, theirs)
    # which request each tid served: replay needs it, so match on (mine, theirs) serially
    # (requests are identified by their tid order within each worker's queue)
    tid_req = _tids_to_requests(c, reqs, workers)
    for tid, (mine, theirs) in ((t, by_tid[t]) for t, _ in c.order):
        a, b, m = tid_req[tid]
        assert model.get(a, 10) == mine and model.get(b, 10) == theirs, f"tid {tid} saw a non-serial state"
        model[a] = mine - m
        model[b] = theirs + m
    assert c.items() == model
    # every request either committed or aborted for good (short of money, in serial order)
    assert len(c.order) + len(c.aborted) == n


def _tids_to_requests(c: _Cluster, reqs: list[tuple[str, str, int]], workers: int) -> dict[int, tuple[str, str, int]]:
    """Tids are (first epoch, worker, seq): rebuild which request got which by re-sequencing."""
    from sfaas.runtime.txn.epochs import tid_parts

    per_worker: list[list[tuple[str, str, int]]] = [[] for _ in range(workers)]
    for r in reqs:
        per_worker[c.engines[0].owner("acc", r[0])].append(r)
    tids = sorted({t for t, _ in c.order} | set(c.aborted))
    out: dict[int, tuple[str, str, int]] = {}
    cursor = [0] * workers
    for t in tids:  # within a worker, tids grow in arrival order
        _, w, _ = tid_parts(t)
        out[t] = per_worker[w][cursor[w]]
        cursor[w] += 1
    return out


async def test_hot_key_chain_commits_in_one_epoch() -> None:
    """100 increments of one key: one epoch with the fallback, many without."""
    reqs = [("hot", "add", [1]) for _ in range(100)]
    fast = _Cluster(_ledger(), workers=2)
    await fast.run(reqs)
    assert fast.epochs_used == 1
    assert fast.items() == {"hot": 110}
    slow = _Cluster(_ledger(), workers=2, fallback=False)
    await slow.run(reqs)
    assert slow.items() == {"hot": 110}
    assert slow.epochs_used > 50


async def test_fallback_run_that_leaves_the_worker_reruns_next_epoch() -> None:
    """First run local; in the fallback it would call a remote key: discarded, re-run later."""
    c = _Cluster(_ledger(), workers=2, partitions=8)
    owner = c.engines[0].owner
    far = next(f"f{i}" for i in range(100) if owner("acc", f"f{i}") != owner("acc", "h"))
    await c.run([("h", "bump", [far]) for _ in range(3)])
    # tid order: the first sees 0 (local, commits); the others conflict; their fallback
    # runs see > 0 and call far: discarded, so they need later epochs
    assert [r[1] for _, r in c.order] == [0, 1, 2]
    assert c.epochs_used >= 3
    assert c.items() == {"h": 3, far: 10}


async def test_worker_commit_replies_from_the_fallback_phase() -> None:
    """The worker's Commit handling: a hot chain commits whole, replies carry fallback results."""
    import msgpack

    from sfaas.runtime import wire
    from sfaas.runtime.settings import Settings
    from worker.service import Worker
    from worker.state import Pending

    app = _ledger()
    home = tempfile.mkdtemp()
    # this worker's own fallback phase (the cross-worker one needs peers)
    w = Worker(Settings.load({"secret": "fallback-secret-0123456789", "home": home, "snapshot_interval": 0,
                              "workers": 1, "partitions": 4, "store": "memonly", "fallback": "local"},
                             env={}), app, "w0")
    w.state.adopt(wire.Assign(0, 1, [["127.0.0.1", 1]], 4, "in", "out", "group", [0, 0, 0, 0]))
    eng = w.start_engine(open_partition_stores(app, home, range(4), 4, store="memonly"))
    loop = w.state.loop
    assert loop is not None
    for i in range(4):
        w.state.offsets.take(0, i)
        w.state.applied.take(0, i)
    loop.queue.extend(Pending(wire.Request(f"r{i}", "acc", "hot", "move", ["cold", 4], 0, 0.0), 0, i)
                      for i in range(4))
    loop.begin(1, 0.0)
    await loop.execute()
    conflicts, aborts = loop.votes()
    await w.commits.commit(wire.Commit(1, [wire.Conflict(t, b) for t, b in conflicts.items()],
                                      [wire.Aborted(t, e, r) for t, (e, r) in aborts.items()],
                                      False, None))
    replies = {msgpack.unpackb(v)[0]: msgpack.unpackb(v) for _, v, _, _ in w.egress.replies}
    # 10 → 6 → 2, then short of money: all four decided in one epoch, in tid order
    assert [replies[f"r{i}"][1] for i in range(4)] == [True, True, False, False]
    assert [replies[f"r{i}"][2][1:] for i in range(2)] == [[10, 10], [6, 14]]
    assert replies["r2"][4] == "short"
    assert loop.sequencer.pending_retries == 0 and loop.fallbacks == 3
    m = w.metrics  # what /metrics reports: 2 committed, 2 aborted, 3 fallbacks, no re-run
    assert (m.committed_total, m.aborted_total, m.fallbacks_total, m.reruns_total) == (2, 2, 3, 0)
    # all four are in the state now: a snapshot here replays from offset 4; none was
    # acknowledged by Kafka yet, so the consumer group still resumes from 0
    assert w.state.applied.watermarks() == {0: 4} and w.state.offsets.watermarks() == {0: 0}
    assert eng_unpack(eng.store_of("acc", "hot").get(b"hot")) == 2
    assert eng_unpack(eng.store_of("acc", "cold").get(b"cold")) == 18


async def test_cross_worker_hot_chain_commits_in_one_epoch() -> None:
    """Transfers out of one hot account to keys on both workers: every one reaches another
    worker, so the local fallback leaves them to later epochs; the cross-worker one commits
    the whole chain in the epoch that found it, exactly (money conserved, in tid order)."""
    reqs = [("hot", "move", [f"to{i}", 1]) for i in range(8)]  # hot starts at 10: all 8 succeed
    local = _Cluster(_ledger(), workers=2)
    await local.run(reqs)
    cross = _Cluster(_ledger(), workers=2, fallback="cross")
    await cross.run(reqs)
    assert cross.epochs_used == 1 and local.epochs_used > 2
    assert cross.items() == local.items() and cross.items()["hot"] == 2
    assert [r[1] for _, r in cross.order] == list(range(10, 2, -1))  # each saw the one before


async def test_cross_fallback_run_that_uses_a_new_key_reruns_next_epoch() -> None:
    """A re-run that reads or writes a key its first run did not touch could race a tid
    that is not ordered before it there: it deviates — its writes everywhere dropped —
    and re-runs next epoch, even when its own function catches the error."""
    c = _Cluster(_ledger(), workers=2, partitions=8, fallback="cross")
    owner = c.engines[0].owner
    far = next(f"f{i}" for i in range(100) if owner("acc", f"f{i}") != owner("acc", "h"))
    await c.run([("h", "bump", [far]) for _ in range(3)])
    assert [r[1] for _, r in c.order] == [0, 1, 2]
    assert c.epochs_used >= 2
    assert c.items() == {"h": 3, far: 10 + 0}


async def test_cross_fallback_abort_caught_by_a_caller_still_aborts() -> None:
    """In the fallback an abort anywhere below reaches the root, as at an epoch's barrier."""
    app = App("catch")
    acc = app.operator("acc", store="memonly")

    @acc.function
    async def take(ctx: Context) -> int:
        v = ctx.get(default=1)
        if v <= 0:
            raise Abort("empty")
        ctx.put(v - 1)
        return v

    @acc.function
    async def order(ctx: Context, src: str) -> str:
        ctx.put(ctx.get(default=0) + 1)
        try:
            await ctx.call("acc", src, "take")
        except Abort:
            return "swallowed"
        return "took"

    c = _Cluster(app, workers=2, fallback="cross")
    owner = c.engines[0].owner
    src = next(f"s{i}" for i in range(100) if owner("acc", f"s{i}") != owner("acc", "o"))
    await c.run([("o", "order", [src]) for _ in range(3)])
    # the first takes the only unit; the others' take aborts (caught): they abort whole
    assert len(c.order) == 1 and len(c.aborted) == 2
    assert c.items() == {"o": 1, src: 0}


def _swings(rnd: random.Random, n: int, keys: list[str]) -> list[tuple[str, str, list[Any]]]:
    out = []
    for _ in range(n):
        a, b = rnd.sample(keys, 2)
        out.append((a, "swing", [b]))
    return out


def _check_swings(c: _Cluster, reqs: list[tuple[str, str, list[Any]]], workers: int) -> None:
    """Every swing committed, each saw the state of the serial order ``c.order``."""
    tid_req = _tids_to_requests(c, [(a, args[0], 0) for a, _, args in reqs], workers)
    model: dict[str, int] = {}
    for tid, (rtid, v, target, theirs) in c.order:
        assert rtid == tid
        a, other, _ = tid_req[tid]
        assert model.get(a, 10) == v, f"tid {tid} read {a}={v}, the serial order has {model.get(a, 10)}"
        model[a] = v + 3
        assert target == (other if v % 2 == 0 else f"{other}-twin")
        assert model.get(target, 10) == theirs, f"tid {tid} read {target}={theirs}"
        model[target] = theirs + 1
    assert len(c.order) == len(reqs) and not c.aborted
    assert c.items() == model


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), workers=st.integers(1, 3), n=st.integers(2, 80),
       alone=st.booleans())
async def test_deviating_history_is_serializable(seed: int, workers: int, n: int, alone: bool) -> None:
    """Swings between a few keys (each re-run may deviate: its target depends on what it
    reads) under the cross-worker fallback, with and without the deviated roots' run alone
    after the phase: the replies and the state are those of the serial order — the
    epoch's commits, the phase's by tid, then each worker's alone ones by tid."""
    rnd = random.Random(seed)
    reqs = _swings(rnd, n, [f"s{i}" for i in range(4)])
    c = _Cluster(_ledger(), workers, fallback="cross", alone=alone)
    await c.run(reqs, max_batch=rnd.randint(5, 80))
    _check_swings(c, reqs, workers)


async def test_deviated_roots_commit_in_their_epoch_when_they_stay_on_their_worker() -> None:
    """200 crossing swings over four keys of one worker (and their twins, on it too), in
    one batch: each phase re-run that saw a newer value than its first run deviates, and
    so does every later one on its key. Run again alone after the phase, all commit in the
    epoch that found them; left to later epochs they drain a few per epoch."""
    probe = _Cluster(_ledger(), workers=2)
    owner = probe.engines[0].owner
    local = [k for k in (f"s{i}" for i in range(200))
             if owner("acc", k) == 0 and owner("acc", f"{k}-twin") == 0][:4]
    assert len(local) == 4
    reqs = _swings(random.Random(5), 200, local)
    used = {}
    for alone in (True, False):
        c = _Cluster(_ledger(), workers=2, fallback="cross", alone=alone)
        await c.run(reqs)
        _check_swings(c, reqs, 2)
        used[alone] = c.epochs_used
    assert used[True] == 1, used
    assert used[False] > 10, used
