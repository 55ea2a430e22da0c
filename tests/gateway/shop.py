"""The app behind the gateway's tests: accounts (deposits count their runs, overdrafts
abort), a ``slow`` function whose effect sleeps (to hold requests in flight), and values
JSON cannot hold as such (bytes, NaN) plus a signature with every annotation the OpenAPI
document maps. Every function but ``slow`` takes any arguments safely (the contract test
fuzzes them)."""

from __future__ import annotations

import asyncio
from typing import Optional

from sfaas import Abort, App, Context

app = App("gwshop")
accounts = app.operator("accounts", store="memonly")
misc = app.operator("misc", store="memonly")


@accounts.function
async def deposit(ctx: Context, amount: int) -> int:
    """Add ``amount``; returns the new balance (``runs:<key>`` counts executions)."""
    new = int(ctx.get(default=0)) + amount
    ctx.put(new)
    await ctx.call("accounts", f"runs:{ctx.key}", "bump")
    return new


@accounts.function
async def bump(ctx: Context) -> int:
    v = int(ctx.get(default=0)) + 1
    ctx.put(v)
    return v


@accounts.function
async def withdraw(ctx: Context, amount: int) -> int:
    bal = int(ctx.get(default=0))
    if bal < amount:
        raise Abort(f"insufficient funds: {ctx.key} has {bal}, needs {amount}")
    ctx.put(bal - amount)
    return bal - amount


async def _sleep(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@misc.function
async def slow(ctx: Context, seconds: float) -> float:
    return float(await ctx.run(_sleep, seconds))


@misc.function
async def odd(ctx: Context) -> dict[str, object]:
    # (no NaN: it differs from itself, so the determinism check would abort the transaction)
    return {"raw": b"\x00\xffok", "inf": float("-inf"), "n": {1: "one"}}


@misc.function
async def echo(ctx: Context, name: str, tags: list[str], meta: Optional[dict[str, int]] = None,  # noqa: UP045
               flag: bool = False, ratio: float = 1.5, *rest: int | None) -> list[object]:
    return [name, tags, meta, flag, ratio, list(rest)]


@misc.function
async def untyped(ctx, a, b=2):  # type: ignore[no-untyped-def]
    return [a, b]


@misc.function
async def size(ctx: Context, value: object) -> int:
    """How long ``value`` is (a large argument, a small result)."""
    return len(value) if isinstance(value, str | bytes | list | dict) else 0
