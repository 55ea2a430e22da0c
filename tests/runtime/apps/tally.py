"""A test app for ``sfaas replay`` (``tests/runtime/test_replay_cluster.py``): accounts with
transfers across keys (overdrafts abort) and counters whose ``bump`` returns the value
before. :func:`build` with ``planted`` keys makes the same app whose ``bump`` answers
otherwise on those keys — the code change a replay must find, reply by reply (the state it
leaves is the same, so no other reply changes)."""

from __future__ import annotations

import os
from collections.abc import Collection

from sfaas import Abort, App, Context


def build(planted: Collection[str] = ()) -> App:
    """The app; ``bump`` on a ``planted`` key replies 1000 more than it should."""
    app = App("tally")
    store = os.environ.get("SFAAS_STORE", "lsm")
    accounts = app.operator("accounts", store=store)
    counters = app.operator("counters", store=store)

    @accounts.function
    async def deposit(ctx: Context, amount: int) -> int:
        new = int(ctx.get(default=0)) + amount
        ctx.put(new)
        return new

    @accounts.function
    async def transfer(ctx: Context, to: str, amount: int) -> int:
        bal = int(ctx.get(default=0))
        if bal < amount:
            raise Abort(f"insufficient funds: {ctx.key} has {bal}, needs {amount}")
        ctx.put(bal - amount)
        await ctx.call("accounts", to, "deposit", amount)
        return bal - amount

    @counters.function
    async def bump(ctx: Context) -> int:
        v = int(ctx.get(default=0))
        ctx.put(v + 1)
        return v + 1000 if ctx.key in planted else v

    return app


app = build()
