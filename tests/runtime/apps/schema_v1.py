"""A test app for schema upcasters and TTL on a cluster, version 1 of its code: an order
is stored as its quantity (an int); sessions live 2 seconds after their last write.
``schema_v2`` is the same app ("schema") after its orders changed shape."""

from __future__ import annotations

from typing import Any

from sfaas import App, Context

app = App("schema")
orders = app.operator("orders", store="lsm")
sessions = app.operator("sessions", store="lsm", ttl=2.0)


@orders.function
async def put(ctx: Context, qty: int) -> int:
    ctx.put(qty)
    return qty


@orders.function
async def get(ctx: Context) -> Any:
    return ctx.get()


@orders.function
async def add(ctx: Context, n: int) -> int:
    qty = int(ctx.get(default=0)) + n
    ctx.put(qty)
    return qty


@sessions.function
async def login(ctx: Context, user: str) -> None:
    ctx.put({"user": user})


@sessions.function
async def who(ctx: Context) -> Any:
    return ctx.get(default="nobody")
