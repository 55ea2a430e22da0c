"""LocalRunner: the cluster's transaction semantics in-process."""

from __future__ import annotations

import asyncio
import random

import pytest

from examples import bank, cart
from sfaas import (
    Abort,
    App,
    BadArguments,
    BadKey,
    Context,
    NotSerializable,
    TransactionAborted,
    UnknownFunction,
    UnknownOperator,
)
from sfaas.testing import LocalRunner


@pytest.fixture
def bank_runner():
    with LocalRunner(bank.app, store="memonly") as r:
        yield r


def test_bank_deposit_transfer_and_overdraft(bank_runner: LocalRunner) -> None:
    assert bank_runner.call("accounts", "alice", "deposit", 100) == 100
    assert bank_runner.call("accounts", "alice", "transfer", "bob", 30) == 70
    with pytest.raises(TransactionAborted, match="insufficient funds") as info:
        bank_runner.call("accounts", "alice", "transfer", "bob", 500)
    assert info.value.error_type == "Abort"
    assert bank_runner.items("accounts") == {"alice": 70, "bob": 30}


def test_unknown_names_wrong_arity_bad_key_and_values_fail_clearly(bank_runner: LocalRunner) -> None:
    with pytest.raises(UnknownOperator, match="nope"):
        bank_runner.call("nope", "alice", "deposit", 1)
    with pytest.raises(UnknownFunction, match="steal"):
        bank_runner.call("accounts", "alice", "steal", 1)
    with pytest.raises(BadArguments, match="transfer"):
        bank_runner.call("accounts", "alice", "transfer", "bob")
    with pytest.raises(BadKey):
        bank_runner.call("accounts", 42, "deposit", 1)
    with pytest.raises(NotSerializable):
        bank_runner.call("accounts", "alice", "deposit", object())
    assert bank_runner.items("accounts") == {}


async def test_concurrent_transfers_conserve_money_across_workers() -> None:
    accounts = [f"acct{i}" for i in range(20)]
    rnd = random.Random(7)
    async with LocalRunner(bank.app, store="memonly", workers=3, partitions=6) as r:
        await asyncio.gather(*(r.acall("accounts", a, "deposit", 100) for a in accounts))
        results = await asyncio.gather(
            *(
                r.acall("accounts", rnd.choice(accounts), "transfer", rnd.choice(accounts), rnd.randint(1, 80))
                for _ in range(600)
            ),
            return_exceptions=True,
        )
        balances = await r.aitems("accounts")
    assert sum(balances.values()) == 2000
    assert min(balances.values()) >= 0
    failures = [e for e in results if isinstance(e, BaseException)]
    assert all(isinstance(e, TransactionAborted) for e in failures)
    assert len(failures) < len(results)  # most transfers succeed


def test_checkout_reserves_all_items_or_none() -> None:
    with LocalRunner(cart.app, store="memonly") as r:
        r.call("stock", "apple", "restock", 5)
        r.call("stock", "pear", "restock", 1)
        r.call("cart", "c1", "add", "apple", 3)
        r.call("cart", "c1", "add", "pear", 2)  # more pears than in stock
        with pytest.raises(TransactionAborted, match="out of stock: pear"):
            r.call("order", "o1", "checkout", "c1")
        # nothing reserved, cart intact, no order
        assert r.state("stock", "apple") == 5
        assert r.state("stock", "pear") == 1
        assert r.state("cart", "c1") == {"apple": 3, "pear": 2}
        assert r.state("order", "o1") is None
        r.call("stock", "pear", "restock", 1)
        assert r.call("order", "o1", "checkout", "c1") == {"apple": 3, "pear": 2}
        assert r.state("stock", "apple") == 2
        assert r.state("stock", "pear") == 0
        assert r.state("cart", "c1") is None  # cleared by ctx.send
        assert r.state("order", "o1") == {"cart": "c1", "items": {"apple": 3, "pear": 2}}


def _chain_app() -> App:
    app = App("chain")
    a = app.operator("a", store="memonly")
    b = app.operator("b", store="memonly")

    @a.function
    async def write_then_fail_remote(ctx: Context, n: int) -> None:
        ctx.put(n)
        await ctx.call("b", "x", "write", n)
        await ctx.call("b", "y", "fail")

    @a.function
    async def swallow(ctx: Context) -> str:
        ctx.put("swallowed")
        try:
            await ctx.call("b", "y", "fail")
        except Abort:
            return "caught"
        return "not reached"

    @a.function
    async def send_failing(ctx: Context) -> str:
        ctx.put("sent")
        ctx.send("b", "z", "fail")
        return "returned"

    @a.function
    async def bad_value(ctx: Context) -> None:
        ctx.put({1, 2})

    @a.function
    async def divide(ctx: Context, d: int) -> float:
        return 1 / d

    @a.function
    async def meta(ctx: Context) -> list:
        return [ctx.random(), ctx.now(), ctx.tid]

    @b.function
    async def write(ctx: Context, n: int) -> None:
        ctx.put(n)

    @b.function
    async def fail(ctx: Context) -> None:
        ctx.put("half-done")
        raise Abort("b failed on purpose")

    return app


def test_aborts_roll_back_every_operator_and_key_even_when_caught() -> None:
    with LocalRunner(_chain_app()) as r:
        for fn, args in [("write_then_fail_remote", (1,)), ("swallow", ()), ("send_failing", ())]:
            with pytest.raises(TransactionAborted, match="b failed on purpose"):
                r.call("a", "k", fn, *args)
        assert r.items("a") == {}
        assert r.items("b") == {}
        with pytest.raises(NotSerializable):
            r.call("a", "k", "bad_value")
        with pytest.raises(TransactionAborted, match="ZeroDivisionError") as info:
            r.call("a", "k", "divide", 0)
        assert info.value.error_type == "ZeroDivisionError"
        rnd, now, tid = r.call("a", "k", "meta")
        assert 0 <= rnd < 1 and now > 0 and tid > 0


def test_calls_inside_transactions_validate_names_and_arity() -> None:
    app = App("v")
    op = app.operator("o", store="memonly")

    @op.function
    async def bad_call(ctx: Context, what: str) -> None:
        ctx.put(1)
        if what == "op":
            await ctx.call("missing", "k", "f")
        elif what == "fn":
            await ctx.call("o", "k", "missing")
        elif what == "arity":
            await ctx.call("o", "k", "bad_call")
        else:
            await ctx.call("o", 5, "bad_call", "x")

    with LocalRunner(app) as r:
        for what, exc in [("op", UnknownOperator), ("fn", UnknownFunction), ("arity", BadArguments), ("key", BadKey)]:
            with pytest.raises(exc):
                r.call("o", "k", "bad_call", what)
        assert r.items("o") == {}


@pytest.mark.parametrize("fallback", [True, False])
async def test_randomized_bank_history_is_serializable(fallback: bool) -> None:
    """Replaying committed transfers serially in the reported commit order reproduces every
    result, with and without the fallback phase."""
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

    rnd = random.Random(11)
    keys = [f"k{i}" for i in range(8)]
    reqs = []
    for _ in range(300):
        a, b = rnd.sample(keys, 2)
        reqs.append((a, b, rnd.randint(1, 12)))
    async with LocalRunner(app, workers=2, partitions=4, max_batch=40, fallback=fallback) as r:
        epochs: dict[int, tuple[int, int]] = {}
        r.on_epoch_committed = lambda epoch, tids: epochs.update({t: (epoch, k) for k, t in enumerate(tids)})
        results = await r.agather(*[("acc", a, "move", b, n) for a, b, n in reqs], return_exceptions=True)
        final = await r.aitems("acc")
    committed = sorted(
        (epochs[res[0]], i, res) for i, res in enumerate(results) if not isinstance(res, BaseException)
    )
    model: dict[str, int] = {}
    for _, i, (_tid, mine, theirs) in committed:
        a, b, n = reqs[i]
        assert model.get(a, 10) == mine and model.get(b, 10) == theirs, f"request {i} saw a non-serial state"
        model[a] = mine - n
        model[b] = theirs + n
    assert final == model
    assert sum(final.values()) + 10 * (len(keys) - len(final)) == 10 * len(keys)


async def test_hot_key_chain_commits_in_one_epoch_with_the_fallback_phase_like_the_cluster() -> None:
    app = App("hot")
    ctr = app.operator("ctr", store="memonly")

    @ctr.function
    async def add(ctx: Context, n: int) -> int:
        v = ctx.get(default=0)
        ctx.put(v + n)
        return v

    for fallback, most_epochs in ((True, 1), (False, None)):
        async with LocalRunner(app, workers=2, fallback=fallback) as r:
            got = await r.agather(*[("ctr", "hot", "add", 1)] * 60)
            assert sorted(got) == list(range(60)) and await r.astate("ctr", "hot") == 60
            if most_epochs is not None:
                assert r.stats.epochs == most_epochs and r.stats.reruns == 0
            else:  # without it every conflicting increment waits for a later epoch
                assert r.stats.epochs > 30 and r.stats.reruns > 0


async def test_orders_on_one_sku_and_one_wallet_commit_in_the_epoch_that_found_them() -> None:
    """300 orders, each taking one unit of one SKU and charging one wallet (other workers'
    keys than most orders'): the cross-worker fallback phase decides them all in one epoch
    — without it, one order committed per epoch — with stock and money exact."""
    app = App("shop")
    stock, wallet, orders = (app.operator(n, store="memonly") for n in ("stock", "wallet", "orders"))

    @stock.function
    async def take(ctx: Context) -> int:
        left = ctx.get(default=250)
        if left < 1:
            raise Abort("sold out")
        ctx.put(left - 1)
        return left - 1

    @wallet.function
    async def charge(ctx: Context, amount: int) -> int:
        balance = ctx.get(default=1000)
        if balance < amount:
            raise Abort("no money")
        ctx.put(balance - amount)
        return balance - amount

    @orders.function
    async def place(ctx: Context, sku: str, who: str) -> int:
        left = await ctx.call("stock", sku, "take")
        await ctx.call("wallet", who, "charge", 3)
        ctx.put("placed")
        return left

    for fallback in (True, False):
        async with LocalRunner(app, workers=2, fallback=fallback) as r:
            got = await r.agather(*[("orders", f"o{i}", "place", "sku", "w") for i in range(300)],
                                  return_exceptions=True)
            placed = sorted(x for x in got if isinstance(x, int))
            assert placed == list(range(250)), "each unit sold once, in order"
            assert all(isinstance(x, TransactionAborted) and "sold out" in str(x) for x in got if not isinstance(x, int))
            assert await r.astate("stock", "sku") == 0 and await r.astate("wallet", "w") == 1000 - 3 * 250
            assert len(await r.aitems("orders")) == 250
            if fallback:
                assert r.stats.epochs <= 10, r.stats
            else:
                assert r.stats.epochs > 100, r.stats


def test_a_functions_sends_apply_in_the_order_they_were_made() -> None:
    """Replay after a recovery must reproduce a transaction's writes: sends to one key run
    in issue order even when the first one takes longer (a hop to another worker)."""
    app = App("sends")
    a = app.operator("a", store="memonly")
    c = app.operator("c", store="memonly")

    @c.function
    async def add_after_a_hop(ctx: Context, n: int) -> None:
        await ctx.call("a", "elsewhere", "noop")
        ctx.put(ctx.get(default=0) + n)

    @c.function
    async def double(ctx: Context) -> None:
        ctx.put(ctx.get(default=0) * 2)

    @a.function
    async def noop(ctx: Context) -> None:
        await asyncio.sleep(0.005)  # like a network hop: other tasks run meanwhile

    @a.function
    async def two_sends(ctx: Context, key: str) -> str:
        ctx.send("c", key, "add_after_a_hop", 10)
        ctx.send("c", key, "double")
        return "sent"

    with LocalRunner(app, workers=2, partitions=4) as r:
        for i in range(8):
            assert r.call("a", f"root{i}", "two_sends", f"k{i}") == "sent"
            assert r.state("c", f"k{i}") == 20  # (0 + 10) * 2, never 0 * 2 + 10


def _forgetful_app() -> App:
    app = App("forgetful")
    accounts = app.operator("accounts", store="memonly")

    @accounts.function
    async def deposit(ctx: Context, amount: int) -> int:
        ctx.put(ctx.get(default=0) + amount)
        return int(ctx.get())

    @accounts.function
    async def pay_forgetting_await(ctx: Context, to: str, amount: int) -> int:
        ctx.put(ctx.get(default=0) - amount)
        ctx.call("accounts", to, "deposit", amount)  # the bug: no await
        return int(ctx.get())

    @accounts.function
    async def relay(ctx: Context, to: str, amount: int) -> int:
        ctx.put(ctx.get(default=0) + 1)
        return int(await ctx.call("accounts", to, "pay_forgetting_await", ctx.key, amount))

    @accounts.function
    async def pay_both(ctx: Context, a: str, b: str, amount: int) -> list[int]:
        ctx.put(ctx.get(default=0) - 2 * amount)
        return list(await asyncio.gather(ctx.call("accounts", a, "deposit", amount),
                                         ctx.call("accounts", b, "deposit", amount)))

    return app


@pytest.mark.parametrize("workers", [1, 2])
def test_a_call_never_awaited_aborts_the_transaction_and_names_the_call(workers: int) -> None:
    import gc
    import warnings

    from sfaas import NotAwaited

    with warnings.catch_warnings(record=True) as caught, \
            LocalRunner(_forgetful_app(), workers=workers, partitions=4) as r:
        warnings.simplefilter("always")
        r.call("accounts", "alice", "deposit", 100)
        with pytest.raises(NotAwaited) as info:
            r.call("accounts", "alice", "pay_forgetting_await", "bob", 30)
        message = str(info.value)
        assert "ctx.call('accounts', 'bob', 'deposit', ...)" in message, message
        assert "pay_forgetting_await" in message and "await" in message
        # nothing of it committed: not the debit, not the credit that never ran
        assert r.state("accounts", "alice") == 100
        assert r.state("accounts", "bob") is None
        # a callee's forgotten call aborts its caller's transaction too
        with pytest.raises(NotAwaited, match="pay_forgetting_await"):
            r.call("accounts", "carol", "relay", "alice", 5)
        assert r.state("accounts", "carol") is None and r.state("accounts", "alice") == 100
        # calls handed to gather are awaited: they run and commit
        assert r.call("accounts", "alice", "pay_both", "bob", "dave", 10) == [10, 10]
        assert r.state("accounts", "alice") == 80
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)], \
        [str(w.message) for w in caught]


def _card_app() -> App:
    app = App("cards")
    cards = app.operator("cards", store="memonly")
    wallets = app.operator("wallets", store="memonly")

    def validate(number: str) -> None:
        if not number.isdigit():
            raise ValueError("card number invalid")

    @wallets.function
    async def charge(ctx: Context, number: str, amount: int) -> int:
        if amount < 0:
            raise Abort("negative amount")
        ctx.put(ctx.get(default=0) + amount)
        validate(number)
        return int(ctx.get())

    @cards.function
    async def pay(ctx: Context, wallet: str, number: str, amount: int) -> int:
        ctx.put(ctx.get(default=0) + 1)
        try:
            return int(await ctx.call("wallets", wallet, "charge", number, amount))
        except TransactionAborted:
            return -1  # caught: the transaction still aborts

    return app


@pytest.mark.parametrize("workers", [1, 2])
def test_a_plain_exception_reaches_the_caller_with_the_functions_traceback(
        workers: int, caplog: pytest.LogCaptureFixture) -> None:
    with LocalRunner(_card_app(), workers=workers, partitions=4) as r, \
            caplog.at_level("WARNING", logger="sfaas"):
        with pytest.raises(TransactionAborted, match="ValueError: card number invalid") as info:
            r.call("cards", "c1", "pay", "w1", "12ab", 5)
        tb = info.value.traceback
        assert tb is not None
        # from the function down to the raise, the user's own frames
        assert "in charge" in tb and "in validate" in tb and __file__ in tb, tb
        assert "ValueError: card number invalid" in tb
        assert any("in validate" in note for note in info.value.__notes__)
        assert r.state("cards", "c1") is None and r.state("wallets", "w1") is None
        # the engine that ran the function logged it, with operator, function and key
        logged = [m for m in caplog.messages if "wallets.charge on key 'w1' raised" in m]
        assert logged and "in validate" in logged[0], caplog.messages
        # an Abort is the user's decision, not a bug: no traceback, nothing logged
        caplog.clear()
        with pytest.raises(TransactionAborted, match="negative amount") as aborted:
            r.call("cards", "c2", "pay", "w2", "4242", -5)
        assert aborted.value.traceback is None and not caplog.messages
        assert r.call("cards", "c2", "pay", "w2", "4242", 5) == 5


def _clock_app() -> App:
    import itertools
    import random as stdlib_random
    import time

    app = App("clocks")
    stamps = app.operator("stamps", store="memonly")

    @stamps.function
    async def wall_clock(ctx: Context) -> None:
        ctx.put(time.time())  # the bug: differs on every run

    @stamps.function
    async def draw(ctx: Context) -> float:
        return stdlib_random.random()  # the bug, in the result only

    runs = itertools.count()

    @stamps.function
    async def branch_on_outside_state(ctx: Context, other: str) -> None:
        if next(runs) % 2 == 0:  # the bug: reads another key on every other run only
            await ctx.call("stamps", other, "peek")
        ctx.put(1)

    @stamps.function
    async def peek(ctx: Context) -> object:
        return ctx.get()

    @stamps.function
    async def fine(ctx: Context) -> float:
        ctx.put([ctx.now(), ctx.random()])
        return ctx.random()

    return app


@pytest.mark.parametrize("workers", [1, 2])
def test_the_determinism_check_aborts_a_function_that_differs_when_run_twice(workers: int) -> None:
    from sfaas import NondeterminismError

    with LocalRunner(_clock_app(), workers=workers, partitions=4) as r:
        with pytest.raises(NondeterminismError) as info:
            r.call("stamps", "a", "wall_clock")
        message = str(info.value)
        assert "stamps.wall_clock on key 'a' is not deterministic" in message, message
        assert "wrote stamps/'a' = " in message and "ctx.now()" in message
        assert r.state("stamps", "a") is None  # not committed
        with pytest.raises(NondeterminismError, match="gave the result .* the second"):
            r.call("stamps", "b", "draw")
        with pytest.raises(NondeterminismError, match="read stamps/'x' only the first time"):
            r.call("stamps", "k", "branch_on_outside_state", "x")
        # ctx.now() and ctx.random() are the same on both runs: this commits
        assert 0 <= r.call("stamps", "c", "fine") < 1
        assert len(r.state("stamps", "c")) == 2
    with LocalRunner(_clock_app(), workers=workers, partitions=4, check_determinism=False) as r:
        r.call("stamps", "a", "wall_clock")  # the check is off: it commits
        assert r.state("stamps", "a") > 0
