"""A shopping cart across three operators: ``stock``, ``cart`` and ``order``.

``order.checkout`` reserves stock for every item of a cart atomically: if any item is
short, nothing is reserved and the cart is left untouched.
"""

from __future__ import annotations

import os

from sfaas import Abort, App, Context

app = App("cart")
_store = os.environ.get("SFAAS_STORE", "hybridlog")
stock = app.operator("stock", store=_store)
cart = app.operator("cart", store=_store)
order = app.operator("order", store=_store)


@stock.function
async def restock(ctx: Context, quantity: int) -> int:
    """Add ``quantity`` units of this item; returns the units in stock."""
    if not isinstance(quantity, int) or quantity <= 0:
        raise Abort(f"restock quantity must be a positive int, got {quantity!r}")
    units = int(ctx.get(default=0)) + quantity
    ctx.put(units)
    return units


@stock.function
async def available(ctx: Context) -> int:
    """Units of this item in stock."""
    return int(ctx.get(default=0))


@stock.function
async def reserve(ctx: Context, quantity: int) -> int:
    """Take ``quantity`` units; aborts the transaction if fewer are in stock."""
    units = int(ctx.get(default=0))
    if units < quantity:
        raise Abort(f"out of stock: {ctx.key} has {units}, wanted {quantity}")
    ctx.put(units - quantity)
    return units - quantity


@cart.function
async def add(ctx: Context, item: str, quantity: int) -> dict[str, int]:
    """Put ``quantity`` of ``item`` in this cart; returns the cart."""
    if not isinstance(quantity, int) or quantity <= 0:
        raise Abort(f"quantity must be a positive int, got {quantity!r}")
    items = dict(ctx.get(default={}))
    items[item] = items.get(item, 0) + quantity
    ctx.put(items)
    return items


@cart.function
async def contents(ctx: Context) -> dict[str, int]:
    """The items in this cart."""
    return dict(ctx.get(default={}))


@cart.function
async def clear(ctx: Context) -> None:
    """Empty this cart."""
    ctx.delete()


@order.function
async def checkout(ctx: Context, cart_id: str) -> dict[str, int]:
    """Turn cart ``cart_id`` into this order: reserve every item's stock, all or nothing."""
    if ctx.get() is not None:
        raise Abort(f"order {ctx.key} already exists")
    items = await ctx.call("cart", cart_id, "contents")
    if not items:
        raise Abort(f"cart {cart_id} is empty")
    for item, quantity in sorted(items.items()):
        await ctx.call("stock", item, "reserve", quantity)
    ctx.send("cart", cart_id, "clear")
    ctx.put({"cart": cart_id, "items": items})
    return items


@order.function
async def get(ctx: Context) -> dict[str, object] | None:
    """The order, or None."""
    return ctx.get()  # type: ignore[no-any-return]
