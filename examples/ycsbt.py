"""YCSB-T: every transaction reads and updates two keys (usually on different workers).

Keys are ``"0"`` … ``"N-1"`` of operator ``ycsb``; values are ints. ``transfer`` moves one
unit from this key to another, so the total is conserved — an invariant benchmarks check.
"""

from __future__ import annotations

import os

from sfaas import App, Context

app = App("ycsbt")
ycsb = app.operator("ycsb", store=os.environ.get("SFAAS_STORE", "hybridlog"))

#: Every key starts with this value (a missing key reads as it), so no load phase is needed.
INITIAL = 1_000_000


@ycsb.function
async def read(ctx: Context) -> int:
    """This key's value."""
    return int(ctx.get(default=INITIAL))


@ycsb.function
async def update(ctx: Context, delta: int) -> int:
    """Add ``delta`` to this key; returns the new value."""
    value = int(ctx.get(default=INITIAL)) + delta
    ctx.put(value)
    return value


@ycsb.function
async def transfer(ctx: Context, other: str) -> int:
    """The YCSB-T transaction: read and update this key and ``other`` (move one unit)."""
    value = int(ctx.get(default=INITIAL)) - 1
    ctx.put(value)
    await ctx.call("ycsb", other, "update", 1)
    return value
