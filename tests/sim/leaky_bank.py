"""``examples.bank`` with a bug planted for ``tests/sim/test_budget.py``: a transfer of more
than 90 credits deposits one less than it debits (money leaks), so a budget run must fail."""

from __future__ import annotations

from examples import bank
from sfaas import App, Context

app = App("bank")
accounts = app.operator("accounts", store="memonly")
accounts.function(bank.balance)
accounts.function(bank.deposit)


@accounts.function
async def transfer(ctx: Context, to: str, amount: int) -> int:
    new = await bank.withdraw(ctx, amount)
    await ctx.call("accounts", to, "deposit", amount - 1 if amount > 90 else amount)
    return new
