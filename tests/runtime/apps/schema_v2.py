"""Version 2 of ``schema_v1``'s code (the same app, "schema"): an order is now
``{"qty": n, "note": str}``; values stored by version 1 (plain ints) are upcast on read."""

from __future__ import annotations

from typing import Any

from sfaas import App, Context


def order_from_v1(qty: int) -> dict[str, Any]:
    """A version-1 order (its quantity) as a version-2 one."""
    return {"qty": qty, "note": ""}


app = App("schema")
orders = app.operator("orders", store="lsm", version=2, upcast={1: order_from_v1})
sessions = app.operator("sessions", store="lsm", ttl=2.0)


@orders.function
async def put(ctx: Context, qty: int, note: str = "") -> dict[str, Any]:
    ctx.put({"qty": qty, "note": note})
    return {"qty": qty, "note": note}


@orders.function
async def get(ctx: Context) -> Any:
    return ctx.get()


@orders.function
async def add(ctx: Context, n: int) -> dict[str, Any]:
    order = ctx.get(default={"qty": 0, "note": ""})
    order["qty"] += n
    ctx.put(order)
    return dict(order)


@sessions.function
async def login(ctx: Context, user: str) -> None:
    ctx.put({"user": user})


@sessions.function
async def who(ctx: Context) -> Any:
    return ctx.get(default="nobody")
