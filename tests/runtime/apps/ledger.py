"""A test app for snapshot rounds and recovery: accounts with transfers (overdrafts
abort) and counters whose ``bump`` returns the pre-increment value, so a test can check
that every committed increment is in the state exactly once and agrees with the replies;
``clock`` makes the state and the replies depend on ``ctx.now()``, so a replay that ran a
transaction with another ``now`` than its first run shows."""

from __future__ import annotations

import os

from sfaas import Abort, App, Context

_PRIME = (1 << 61) - 1
app = App("ledger")
_store = os.environ.get("SFAAS_STORE", "lsm")
accounts = app.operator("accounts", store=_store)
counters = app.operator("counters", store=_store)


@accounts.function
async def balance(ctx: Context) -> int:
    return int(ctx.get(default=0))


@accounts.function
async def deposit(ctx: Context, amount: int) -> int:
    new = int(ctx.get(default=0)) + amount
    ctx.put(new)
    return new


@accounts.function
async def transfer(ctx: Context, to: str, amount: int) -> int:
    """Move ``amount`` to ``to``; aborts (nothing changes) on an overdraft."""
    bal = int(ctx.get(default=0))
    if bal < amount:
        raise Abort(f"insufficient funds: {ctx.key} has {bal}, needs {amount}")
    ctx.put(bal - amount)
    await ctx.call("accounts", to, "deposit", amount)
    return bal - amount


@counters.function
async def bump(ctx: Context) -> int:
    """Add one; returns the value before."""
    v = int(ctx.get(default=0))
    ctx.put(v + 1)
    return v


@counters.function
async def value(ctx: Context) -> int:
    return int(ctx.get(default=0))


@counters.function
async def clock(ctx: Context, other: str) -> int:
    """Add this transaction's ``ctx.now()`` in microseconds (modulo a prime) to the key and,
    by a call, to ``other``'s — or, while the key's sum is odd, to ``other``'s twin: a
    conflicting run re-runs in the fallback phase, where it sees a newer sum; when that
    sum's parity differs it calls a key its first run did not touch, so it deviates and
    re-runs in a later epoch (whose replay must use its first run's now). Returns the
    key's new sum."""
    us = int(ctx.now() * 1e6)
    before = int(ctx.get(default=0))
    v = (before + us) % _PRIME
    ctx.put(v)
    await ctx.call("counters", other if before % 2 == 0 else f"{other}-twin", "add", us)
    return v


@counters.function
async def add(ctx: Context, amount: int) -> int:
    v = (int(ctx.get(default=0)) + amount) % _PRIME
    ctx.put(v)
    return v
