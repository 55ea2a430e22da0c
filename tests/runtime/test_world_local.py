"""Functions that touch the world, in LocalRunner: journaled effects (``ctx.run``),
post-commit actions (``ctx.after_commit``), durable timers (``ctx.send_after``) and the
virtual clock (``runner.advance``)."""

from __future__ import annotations

import asyncio
import collections
import tempfile
import threading
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import sfaas
from sfaas import Abort, App, BadArguments, BadKey, Context, NotAwaited, TransactionAborted
from sfaas.testing import LocalRunner
from tests.runtime.apps import world


@pytest.fixture
def world_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> str:
    monkeypatch.setattr(world, "_DIR", str(tmp_path))
    world._failures.clear()
    return str(tmp_path)


# -- effects and actions under contention --------------------------------------------------
@pytest.mark.parametrize("workers,fallback", [(1, True), (2, True), (2, False)])
def test_hot_key_orders_charge_once_each_and_email_once_per_commit(
        world_dir: str, workers: int, fallback: bool) -> None:
    n, stock = 200, 150
    with LocalRunner(world.app, workers=workers, fallback=fallback) as r:
        async def go() -> list[Any]:
            await r.acall("stock", "apple", "restock", stock)
            out = await r.agather(*[("orders", f"o{i}", "order", "apple", 10) for i in range(n)],
                                  return_exceptions=True)
            await r.adrain()
            return out
        results = asyncio.run(go())
        committed = {f"o{i}" for i, x in enumerate(results) if isinstance(x, str)}
        assert len(committed) == stock
        assert all(isinstance(x, TransactionAborted) and "sold out" in str(x)
                   for x in results if not isinstance(x, str))
        charges = world.lines("charge")
        # every order's first run reached the payment: one charge each, never a second
        assert len(charges) == n
        assert len({c.split()[1] for c in charges}) == n
        emails = world.lines("email")
        assert sorted(e.split()[0] for e in emails) == sorted(committed)
        assert len({e.split()[1] for e in emails}) == len(emails)
        assert r.stats.effects == n and r.stats.actions == stock
        assert r.state("stock", "apple") == 0
        # the outbox is empty once the actions ran (their records are deleted)
        assert r.actions.pending == 0
        assert all(not k.startswith(b"\x00") for eng in r.engines for s in eng.stores.values()
                   for k, _ in s.items())


def test_an_action_failing_is_retried_with_the_same_key_until_it_returns(
        world_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFAAS_WORLD_FAIL", "2")
    with LocalRunner(world.app) as r:
        r.actions.backoff = (0.01, 0.02)
        r.call("stock", "pear", "restock", 1)
        r.call("orders", "o1", "order", "pear", 5)
        r.drain()
        assert len(world.lines("email")) == 1
        assert r.actions.tries_failed == 2
        assert world._failures == {world.lines("email")[0].split()[1]: 2}
        with pytest.raises(TransactionAborted, match="sold out"):
            r.call("orders", "o2", "order", "pear", 5)
        r.drain()
        assert len(world.lines("email")) == 1  # never for an aborted transaction


app = App("fx")
ops = app.operator("ops")
CALLS: collections.Counter[str] = collections.Counter()


class Declined(Exception):
    pass


def pay(x: int) -> int:
    CALLS["pay"] += 1
    if x < 0:
        raise ValueError(f"bad amount {x}")
    if x == 0:
        raise Declined("card declined")
    return x * 2


@ops.function
async def effect(ctx: Context, x: int) -> Any:
    try:
        got = await ctx.run(pay, x)
    except ValueError as exc:
        return f"ValueError: {exc}"
    ctx.put(got)
    return got


@ops.function
async def two_effects(ctx: Context) -> list[Any]:
    a = await ctx.run(pay, 1)
    b, c = await asyncio.gather(ctx.run(pay, 2), ctx.run(pay, 3))
    return [a, b, c]


@ops.function
async def forgot(ctx: Context) -> None:
    ctx.run(pay, 1)


@ops.function
async def lambda_action(ctx: Context) -> None:
    ctx.after_commit(lambda: None)


@ops.function
async def key_of(ctx: Context) -> str:
    return str(await ctx.run(sfaas.effect_key))


#: set by a test while the effect waits on the runner's own thread: a thread-safe event
GATE: dict[str, threading.Event] = {}


async def slow() -> str:
    while not GATE["open"].is_set():
        await asyncio.sleep(0.005)
    return "done"


@ops.function
async def slow_effect(ctx: Context) -> str:
    return str(await ctx.run(slow))


@ops.function
async def plain(ctx: Context, x: int) -> int:
    ctx.put(x)
    return x


def test_effect_outcomes_are_journaled_results_and_exceptions() -> None:
    CALLS.clear()
    with LocalRunner(app) as r:
        assert r.call("ops", "a", "effect", 4) == 8
        assert r.call("ops", "b", "effect", -1) == "ValueError: bad amount -1"
        # (a class that is not a built-in one comes back as EffectFailed, named by its type)
        with pytest.raises(TransactionAborted, match="Declined: card declined") as info:
            r.call("ops", "c", "effect", 0)
        assert info.value.error_type == "Declined"
        assert CALLS["pay"] == 3  # each once, though each transaction ran twice
        assert r.call("ops", "d", "two_effects") == [2, 4, 6]
        assert CALLS["pay"] == 6
        assert r.stats.suspended >= 5
        key = r.call("ops", "k", "key_of")
        assert key.endswith(":ops:k:0") and len(key.split(":")) == 4


def test_a_run_never_awaited_aborts_and_lambdas_cannot_be_actions() -> None:
    with LocalRunner(app) as r:
        with pytest.raises(NotAwaited, match=r"ctx.run\(pay"):
            r.call("ops", "a", "forgot")
        with pytest.raises(BadArguments, match="module-level function"):
            r.call("ops", "a", "lambda_action")
    with pytest.raises(RuntimeError, match="only known inside"):
        sfaas.effect_key()


def test_a_slow_effect_stalls_no_other_transaction() -> None:
    async def go() -> None:
        GATE["open"] = threading.Event()
        async with LocalRunner(app) as r:
            waiting = asyncio.ensure_future(r.acall("ops", "s", "slow_effect"))
            for i in range(5):  # unrelated requests commit while the effect is still running
                assert await asyncio.wait_for(r.acall("ops", f"p{i}", "plain", i), 5) == i
            assert not waiting.done() and len(r.effects.running) == 1
            GATE["open"].set()
            assert await asyncio.wait_for(waiting, 5) == "done"
    asyncio.run(go())


def test_an_effect_past_its_timeout_is_journaled_as_a_timeout() -> None:
    async def go() -> None:
        GATE["open"] = threading.Event()
        async with LocalRunner(app, effect_timeout=0.05) as r:
            with pytest.raises(TransactionAborted, match="did not finish within 0.05 s"):
                await r.acall("ops", "s", "slow_effect")
    asyncio.run(go())


def test_reserved_keys_are_refused() -> None:
    with LocalRunner(app) as r:
        with pytest.raises(BadKey, match="reserved"):
            r.call("ops", "\x00t0", "plain", 1)


# -- timers ------------------------------------------------------------------------------------
def test_a_timer_fires_once_when_due_never_before_and_a_cancelled_one_never() -> None:
    with LocalRunner(world.app) as r:
        t0 = r.now()
        r.call("alarms", "k", "arm", 30, "a")
        r.call("alarms", "k", "arm", 60, "b")
        r.call("alarms", "k", "arm", 45, "c")
        assert r.call("alarms", "k", "disarm", "c") is True
        r.advance(29.5)
        assert r.state("alarms", "rung:k") is None
        r.advance(1)
        rung = r.state("alarms", "rung:k")
        assert list(rung) == ["a"] and rung["a"][0] == 1 and 0 <= rung["a"][1] < 1
        r.advance(100)
        rung = r.state("alarms", "rung:k")
        assert sorted(rung) == ["a", "b"] and rung["b"][0] == 1 and rung["a"][0] == 1
        assert r.now() - t0 >= 130.5
        assert r.stats.timers == 2
        assert sum(len(t) for t in r.timers) == 0


def test_a_timer_cancelled_from_another_key_and_bad_ids() -> None:
    a = App("t2")
    op = a.operator("op")

    @op.function
    async def arm(ctx: Context) -> str:
        return ctx.send_after(10, "op", "target", "hit")

    @op.function
    async def cancel(ctx: Context, timer: str) -> None:
        ctx.cancel_timer(timer)

    @op.function
    async def hit(ctx: Context) -> None:
        ctx.put(int(ctx.get(0)) + 1)

    @op.function
    async def bad_delay(ctx: Context) -> None:
        ctx.send_after(-1, "op", "x", "hit")

    @op.function
    async def bad_target(ctx: Context) -> None:
        ctx.send_after(1, "op", "x", "nope")

    with LocalRunner(a, check_determinism=False) as r:
        t1, t2 = r.call("op", "owner", "arm"), r.call("op", "owner", "arm")
        r.call("op", "someone-else", "cancel", t1)
        r.advance(11)
        assert r.state("op", "target") == 1
        r.call("op", "owner", "cancel", t2)  # fired already: nothing to do
        with pytest.raises(BadArguments, match="not a timer id"):
            r.call("op", "x", "cancel", "tm-garbage")
        with pytest.raises(BadArguments, match="delay_s must be a number >= 0"):
            r.call("op", "x", "bad_delay")
        with pytest.raises(TransactionAborted, match="has no function 'nope'"):
            r.call("op", "x", "bad_target")


def test_a_timer_whose_call_aborts_is_delivered_once() -> None:
    a = App("t3")
    op = a.operator("op")

    @op.function
    async def arm(ctx: Context) -> str:
        return ctx.send_after(1, "op", ctx.key, "boom")

    @op.function
    async def boom(ctx: Context) -> None:
        ctx.put(int(ctx.get(0)) + 1)
        raise Abort("no")

    with LocalRunner(a) as r:
        r.call("op", "k", "arm")
        r.advance(2)
        r.advance(10)
        assert r.stats.timers == 1 and r.state("op", "k") is None
        assert sum(len(t) for t in r.timers) == 0


@pytest.mark.parametrize("store", ["lsm", "hybridlog"])
def test_timers_and_pending_actions_survive_a_restart(world_dir: str, store: str) -> None:
    d = tempfile.mkdtemp(prefix="sfaas-world-")
    with LocalRunner(world.app, directory=d, store=store) as r:
        r.call("alarms", "k", "arm", 5, "a")
    with LocalRunner(world.app, directory=d, store=store) as r:
        assert sum(len(t) for t in r.timers) == 1
        r.advance(6)
        assert r.state("alarms", "rung:k")["a"][0] == 1
    with LocalRunner(world.app, directory=d, store=store) as r:
        r.advance(60)
        assert r.state("alarms", "rung:k")["a"][0] == 1  # not again


class TimerMachine(RuleBasedStateMachine):
    """Timers against a model: each armed, uncancelled timer fires exactly once, at the
    first ``advance`` that reaches its due time; a cancelled one never."""

    def __init__(self) -> None:
        super().__init__()
        self.r = LocalRunner(world.app, workers=2, partitions=4)
        self.t0 = self.r.now()
        self.clock = 0.0
        self.due: dict[str, float] = {}
        self.cancelled: set[str] = set()
        self.disarmed: set[str] = set()
        self.n = 0

    @rule(delay=st.floats(0, 50), key=st.sampled_from(["k1", "k2", "k3"]))
    def arm(self, delay: float, key: str) -> None:
        name = f"t{self.n}"
        self.n += 1
        self.r.call("alarms", key, "arm", delay, name)
        self.due[f"{key}/{name}"] = self.r.now() + delay

    @precondition(lambda self: self.due)
    @rule(data=st.data())
    def disarm(self, data: st.DataObject) -> None:
        which = data.draw(st.sampled_from(sorted(self.due)))
        key, name = which.split("/")
        got = self.r.call("alarms", key, "disarm", name)
        if which in self.disarmed:
            assert got is False
        else:
            assert got is True
            self.disarmed.add(which)
            # it fired before the cancel committed, or it never will
            if not self._fired().get(which, 0):
                self.cancelled.add(which)

    @rule(seconds=st.floats(0, 30))
    def advance(self, seconds: float) -> None:
        self.r.advance(seconds)

    def _fired(self) -> dict[str, int]:
        out = {}
        for key in ("k1", "k2", "k3"):
            for name, (count, late) in (self.r.state("alarms", "rung:" + key) or {}).items():
                out[f"{key}/{name}"] = count
                assert late >= 0  # never early
        return out

    @invariant()
    def fired_exactly_the_due_ones(self) -> None:
        fired = self._fired()
        now = self.r.now()
        assert all(c == 1 for c in fired.values()), fired
        for which, due in self.due.items():
            if which in self.cancelled:
                assert which not in fired, which
            elif due <= now - 0.5:
                assert which in fired, (which, due, now)

    def teardown(self) -> None:
        self.r.close()


TestTimerMachine = TimerMachine.TestCase
TestTimerMachine.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)


def test_timers_and_actions_move_with_their_partitions(world_dir: str) -> None:
    """A rescale moves a partition's stores — its timers and pending actions with them:
    each timer still fires once, from its new owner."""
    with LocalRunner(world.app, workers=2, partitions=4) as r:
        for i in range(12):
            r.call("alarms", f"k{i}", "arm", 10, "a")
        r.remap([1, 1, 0, 0])  # every partition changes hands
        assert sum(len(t) for t in r.timers) == 12
        r.advance(11)
        for i in range(12):
            assert r.state("alarms", f"rung:k{i}")["a"][0] == 1
        r.advance(60)
        assert r.stats.timers == 12 and sum(len(t) for t in r.timers) == 0
