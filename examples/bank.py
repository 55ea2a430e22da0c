"""A bank: deposit, withdraw, transfer between accounts (overdrafts abort).

The store engine is the ``SFAAS_STORE`` environment variable (default ``hybridlog``), so the
same app can be benchmarked on every engine.
"""

from __future__ import annotations

import os

from sfaas import Abort, App, Context

app = App("bank")
accounts = app.operator("accounts", store=os.environ.get("SFAAS_STORE", "hybridlog"))


@accounts.function
async def balance(ctx: Context) -> int:
    """The account's balance (0 for a new account)."""
    return int(ctx.get(default=0))


@accounts.function
async def deposit(ctx: Context, amount: int) -> int:
    """Add ``amount`` (> 0); returns the new balance."""
    if not isinstance(amount, int) or amount <= 0:
        raise Abort(f"deposit amount must be a positive int, got {amount!r}")
    new = int(ctx.get(default=0)) + amount
    ctx.put(new)
    return new


@accounts.function
async def withdraw(ctx: Context, amount: int) -> int:
    """Remove ``amount`` (> 0); aborts if the balance would go negative."""
    if not isinstance(amount, int) or amount <= 0:
        raise Abort(f"withdraw amount must be a positive int, got {amount!r}")
    bal = int(ctx.get(default=0))
    if bal < amount:
        raise Abort(f"insufficient funds: {ctx.key} has {bal}, needs {amount}")
    ctx.put(bal - amount)
    return bal - amount


@accounts.function
async def transfer(ctx: Context, to: str, amount: int) -> int:
    """Move ``amount`` from this account to ``to`` atomically; returns this account's new
    balance."""
    if to == ctx.key:
        raise Abort("cannot transfer to the same account")
    new = await withdraw(ctx, amount)
    await ctx.call("accounts", to, "deposit", amount)
    return new
