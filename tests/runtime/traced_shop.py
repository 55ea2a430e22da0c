"""The gateway tests' shop (``tests.gateway.shop``) with what the tracing test's requests
do besides: a transfer that calls a key of the other worker, and a function with an effect,
a post-commit action and a timer (issue 50)."""

from __future__ import annotations

from sfaas import Context
from tests.gateway.shop import accounts, app

__all__ = ["app"]


@accounts.function
async def transfer(ctx: Context, to: str, amount: int) -> int:
    """Move ``amount`` from this key to ``to`` (its deposit counts its runs on ``runs:<to>``)."""
    left = int(ctx.get(default=0)) - amount
    ctx.put(left)
    await ctx.call("accounts", to, "deposit", amount)
    return left


def _note(amount: int) -> int:
    return amount


def mail(key: str, amount: int) -> None:
    """The post-commit action (stored by name: a module-level function)."""


@accounts.function
async def audited(ctx: Context, amount: int) -> int:
    """Deposit ``amount`` once an effect saw it; mail after the commit, bump a moment later."""
    seen = int(await ctx.run(_note, amount))
    ctx.put(int(ctx.get(default=0)) + seen)
    ctx.after_commit(mail, ctx.key, seen)
    ctx.send_after(0.2, "accounts", f"runs:{ctx.key}", "bump")
    return seen
