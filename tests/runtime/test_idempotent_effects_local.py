"""Effects once per logical request, in-process: duplicates of an idempotent request run
each ``ctx.run`` effect once, under a key derived from the idempotency key, whether they
come at once, while the effect runs or after the first was answered; an abort after an
effect says which effect ran; a retry of an aborted attempt gets its abort."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import sfaas
from sfaas import (
    Abort,
    App,
    Context,
    EffectThenAbortWarning,
    NotSerializable,
    TransactionAborted,
)
from sfaas.testing import LocalRunner

app = App("effects-once")
wallets = app.operator("wallets", store="memonly")

#: effect keys of every charge that ran, in order (the payment provider's view)
HITS: list[str] = []
#: set by a test to hold charges until it lets them go
GATE = threading.Event()
STARTED = threading.Event()


def charge(amount: int) -> dict[str, Any]:
    STARTED.set()
    assert GATE.wait(30), "the test never let the charge go"
    HITS.append(sfaas.effect_key())
    return {"charge": len(HITS), "amount": amount}


def opaque(amount: int) -> object:
    HITS.append(sfaas.effect_key())
    return object()


@wallets.function
async def pay(ctx: Context, amount: int) -> dict[str, Any]:
    receipt = await ctx.run(charge, amount)
    ctx.put(int(ctx.get(default=100)) - amount)
    return dict(receipt)


@wallets.function
async def pay_then_refuse(ctx: Context, amount: int) -> None:
    await ctx.run(charge, amount)
    raise Abort("changed my mind")


@wallets.function
async def pay_opaque(ctx: Context, amount: int) -> Any:
    return await ctx.run(opaque, amount)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    HITS.clear()
    GATE.set()
    STARTED.clear()


@pytest.mark.timeout(60)
async def test_ten_concurrent_duplicates_charge_once_under_one_stable_key() -> None:
    async with LocalRunner(app) as runner:
        replies = await asyncio.gather(*(
            runner.acall("wallets", "alice", "pay", 5, idempotency_key="order-1")
            for _ in range(10)))
        # and again, one after another, after the first was answered
        replies += [await runner.acall("wallets", "alice", "pay", 5, idempotency_key="order-1")
                    for _ in range(3)]
        assert await runner.acall("wallets", "alice", "pay", 0) is not None  # (another key)
    assert all(r == replies[0] for r in replies), replies
    first, other = HITS
    assert first.startswith("i") and first.endswith(":wallets:alice:0"), first
    assert other != first and not other.startswith("i")  # (no idempotency key: the request id)
    # the key depends on the logical request only: another process derives the same one
    HITS.clear()
    async with LocalRunner(app) as runner:
        await runner.acall("wallets", "alice", "pay", 5, idempotency_key="order-1")
        await runner.acall("wallets", "alice", "pay", 5, idempotency_key="order-2")
    assert HITS[0] == first and HITS[1] != first, HITS


@pytest.mark.timeout(60)
async def test_duplicates_arriving_while_the_effect_runs_wait_for_it() -> None:
    GATE.clear()
    async with LocalRunner(app) as runner:
        early = [asyncio.ensure_future(runner.acall("wallets", "bob", "pay", 3,
                                                    idempotency_key="o-7")) for _ in range(5)]
        assert await asyncio.get_running_loop().run_in_executor(None, STARTED.wait, 10)
        late = [asyncio.ensure_future(runner.acall("wallets", "bob", "pay", 3,
                                                   idempotency_key="o-7")) for _ in range(5)]
        await asyncio.sleep(0.2)  # (the late ones ran and suspended at the same effect)
        GATE.set()
        replies = await asyncio.gather(*early, *late)
        assert await runner.aget("wallets", "bob") == 97
    assert len(HITS) == 1 and all(r == replies[0] for r in replies), (HITS, replies)


@pytest.mark.timeout(60)
async def test_an_abort_after_an_effect_names_it_and_a_retry_gets_the_abort() -> None:
    async with LocalRunner(app) as runner:
        with pytest.raises(TransactionAborted, match="changed my mind") as first, \
                pytest.warns(EffectThenAbortWarning, match=r"after its effect\(s\) "
                                                           r"i[0-9a-f]{32}:wallets:carol:0 ran"):
            await runner.acall("wallets", "carol", "pay_then_refuse", 9, idempotency_key="x")
        (key,) = HITS
        assert f"[after effect(s) {key} ran before this abort and are not undone" \
            in first.value.reason, first.value.reason
        with pytest.raises(TransactionAborted) as retry, pytest.warns(EffectThenAbortWarning):
            await runner.acall("wallets", "carol", "pay_then_refuse", 9, idempotency_key="x")
        assert retry.value.reason == first.value.reason
    assert HITS == [key], HITS


@pytest.mark.timeout(60)
async def test_an_effect_result_that_cannot_be_journaled_says_the_effect_ran() -> None:
    async with LocalRunner(app) as runner:
        with pytest.raises(NotSerializable) as info, pytest.warns(EffectThenAbortWarning):
            await runner.acall("wallets", "dave", "pay_opaque", 1)
    reason = info.value.reason
    assert not reason.startswith("NotSerializable"), reason  # (no doubled prefix)
    assert f"the result of effect {HITS[0]} (opaque)" in reason and "the effect ran" in reason
    assert str(info.value).count("NotSerializable") == 0, str(info.value)


@pytest.mark.timeout(60)
def test_the_runner_takes_typed_handles_and_warns_in_plain_code_too() -> None:
    with LocalRunner(app) as runner:
        assert runner.call(pay, "erin", 4, idempotency_key="t-1") == {"charge": 1, "amount": 4}
        assert runner.gather((pay, "erin", 4), ("wallets", "erin", "pay", 1)) == [
            {"charge": 2, "amount": 4}, {"charge": 3, "amount": 1}]
        with pytest.warns(EffectThenAbortWarning), pytest.raises(TransactionAborted):
            runner.call(pay_then_refuse, "erin", 1)
        with pytest.raises(TypeError, match=r"request 0 is \(<"):
            runner.gather((pay,))
    assert len(HITS) == 4
