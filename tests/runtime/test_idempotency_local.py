"""Idempotent requests in LocalRunner: a retry with the same idempotency key gets the
first outcome — its result or its abort — and never runs again."""

from __future__ import annotations

import asyncio

import pytest

from sfaas import Abort, App, BadRequest, Context, TransactionAborted
from sfaas.testing import LocalRunner

app = App("idem")
wallets = app.operator("wallets", store="lsm")


@wallets.function
async def deposit(ctx: Context, amount: int) -> int:
    new = int(ctx.get(0)) + amount
    ctx.put(new)
    return new


@wallets.function
async def withdraw(ctx: Context, amount: int) -> int:
    have = int(ctx.get(0))
    if have < amount:
        raise Abort(f"insufficient funds ({have})")
    ctx.put(have - amount)
    return have - amount


def test_a_retry_gets_the_first_result_and_deposits_once() -> None:
    with LocalRunner(app) as r:
        assert r.call("wallets", "a", "deposit", 50, idempotency_key="dep-1") == 50
        assert r.call("wallets", "a", "deposit", 50, idempotency_key="dep-1") == 50
        assert r.state("wallets", "a") == 50
        # another key, another function, or none: runs
        assert r.call("wallets", "a", "deposit", 50, idempotency_key="dep-2") == 100
        assert r.call("wallets", "a", "withdraw", 10, idempotency_key="dep-1") == 90
        assert r.call("wallets", "a", "deposit", 1) == 91
        assert r.items("wallets") == {"a": 91}  # (the kept outcomes are not values)


def test_concurrent_duplicates_run_once_and_all_get_the_first_outcome() -> None:
    async def go() -> None:
        async with LocalRunner(app, workers=2) as r:
            calls = [r.acall("wallets", f"w{i % 10}", "deposit", 5, idempotency_key=f"k{i % 30}")
                     for i in range(90)]  # 30 requests, each sent 3 times at once
            results = await asyncio.gather(*calls)
            by_key: dict[int, set[int]] = {}
            for i, res in enumerate(results):
                by_key.setdefault(i % 30, set()).add(res)
            assert all(len(v) == 1 for v in by_key.values()), by_key
            assert await r.aitems("wallets") == {f"w{i}": 15 for i in range(10)}  # 3 deposits each
    asyncio.run(go())


def test_an_abort_is_the_outcome_too_and_retention_ends() -> None:
    with LocalRunner(app, idempotency_retention=60) as r:
        with pytest.raises(TransactionAborted, match=r"insufficient funds \(0\)"):
            r.call("wallets", "b", "withdraw", 10, idempotency_key="w-1")
        r.call("wallets", "b", "deposit", 100)
        with pytest.raises(TransactionAborted, match=r"insufficient funds \(0\)"):
            r.call("wallets", "b", "withdraw", 10, idempotency_key="w-1")  # the first outcome
        assert r.state("wallets", "b") == 100
        r.advance(61)  # the window ended: the key is new again, and its record is gone
        assert [k for eng in r.engines for s in eng.stores.values() for k, _ in s.items()
                if k.startswith(b"\x00")] == []
        assert r.call("wallets", "b", "withdraw", 10, idempotency_key="w-1") == 90
        r.advance(61)
        assert [k for eng in r.engines for s in eng.stores.values() for k, _ in s.items()
                if k.startswith(b"\x00")] == []


def test_bad_idempotency_keys_are_refused() -> None:
    with LocalRunner(app) as r:
        for bad in ("", "x" * 257, 7):
            with pytest.raises(BadRequest, match="idempotency key must be a str"):
                r.call("wallets", "a", "deposit", 1, idempotency_key=bad)  # type: ignore[arg-type]


def test_state_reads_get_and_scan_without_a_transaction() -> None:
    from sfaas import BadArguments, BadKey, UnknownOperator

    with LocalRunner(app, workers=2) as r:
        for i in range(30):
            r.call("wallets", f"user-{i:02d}", "deposit", i, idempotency_key=f"d{i}")
        r.call("wallets", "other", "deposit", 1)
        epochs = r.stats.epochs
        assert r.get("wallets", "user-07") == 7 and r.get("wallets", "nobody", 0) == 0
        assert r.scan("wallets", "user-", limit=5) == [(f"user-{i:02d}", i) for i in range(5)]
        assert len(r.scan("wallets")) == 31  # (the kept outcomes and their timers never show)
        assert r.stats.epochs == epochs  # no transaction ran
        with pytest.raises(BadArguments, match="limit must be an int"):
            r.scan("wallets", limit=0)
        with pytest.raises(BadKey, match="must not start"):
            r.get("wallets", "\x00t")
        with pytest.raises(UnknownOperator):
            r.get("nope", "x")


def test_a_directory_reopened_with_another_engine_or_partition_count_is_refused(
        tmp_path) -> None:
    """Reopening stores with another engine or partition count would read keys as absent:
    refused, naming both layouts; the data is intact for the right one."""
    from sfaas import ConfigError

    d = tmp_path / "data"
    with LocalRunner(app, directory=d, store="lsm", partitions=8) as r:
        for i in range(50):
            r.call("wallets", f"k{i}", "deposit", 1)
    with pytest.raises(ConfigError, match=r"engine 'lsm' in 8 partitions; this run asks for "
                                          r"engine 'lsm' in 4 partitions"):
        LocalRunner(app, directory=d, store="lsm", partitions=4)
    with pytest.raises(ConfigError, match=r"engine 'lsm' in 8 partitions; this run asks for "
                                          r"engine 'hybridlog' in 8"):
        LocalRunner(app, directory=d, store="hybridlog", partitions=8)
    with LocalRunner(app, directory=d, store="lsm", partitions=8) as r:
        assert len(r.items("wallets")) == 50
