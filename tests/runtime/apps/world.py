"""A test app that touches the world: orders on hot stock whose payment is a journaled
``ctx.run`` effect and whose confirmation is a post-commit action, and durable timers.

Effects and actions append a line (their name and :func:`sfaas.effect_key`) to files in
``$SFAAS_WORLD_DIR`` (a temporary directory when unset), so a test counts how often each
ran — across worker processes too. ``SFAAS_WORLD_FAIL`` makes the first tries of each
action fail that many times.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

from sfaas import Abort, App, Context, effect_key

app = App("world")
_store = os.environ.get("SFAAS_STORE", "memonly")
stock = app.operator("stock", store=_store)
orders = app.operator("orders", store=_store)
alarms = app.operator("alarms", store=_store)

_DIR = os.environ.get("SFAAS_WORLD_DIR") or tempfile.mkdtemp(prefix="sfaas-world-")
#: seconds each charge sleeps (an effect that takes long must stall nobody)
CHARGE_S = float(os.environ.get("SFAAS_WORLD_CHARGE_S", "0.005"))


def world_dir() -> str:
    return _DIR


def _note(kind: str, line: str) -> None:
    with open(os.path.join(_DIR, kind), "a") as f:
        f.write(line + "\n")


def lines(kind: str, directory: str | None = None) -> list[str]:
    """The lines ``kind`` (``charge``, ``email``) wrote so far."""
    try:
        with open(os.path.join(directory or _DIR, kind)) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


async def charge(order: str, amount: int) -> str:
    """The payment provider (an effect): one line per run (and one in ``charging`` as it
    starts)."""
    _note("charging", f"{order} {effect_key()}")
    await asyncio.sleep(CHARGE_S)
    _note("charge", f"{order} {effect_key()}")
    return f"paid-{order}-{amount}"


_failures: dict[str, int] = {}


def email(order: str, receipt: str) -> None:
    """The confirmation (a post-commit action): one line per successful try."""
    key = effect_key()
    fail = int(os.environ.get("SFAAS_WORLD_FAIL", "0"))
    if _failures.get(key, 0) < fail:
        _failures[key] = _failures.get(key, 0) + 1
        raise ConnectionError(f"mail server down (try {_failures[key]})")
    _note("email", f"{order} {key} {receipt}")


@stock.function
async def restock(ctx: Context, n: int) -> int:
    ctx.put(int(ctx.get(0)) + n)
    return int(ctx.get())


@stock.function
async def take(ctx: Context, n: int) -> int:
    left = int(ctx.get(0))
    if left < n:
        raise Abort(f"sold out ({left} left)")
    ctx.put(left - n)
    return left - n


@orders.function
async def order(ctx: Context, sku: str, amount: int) -> str:
    """Take one of ``sku``, charge (an effect), confirm after commit."""
    await ctx.call("stock", sku, "take", 1)
    receipt = await ctx.run(charge, ctx.key, amount)
    ctx.put({"sku": sku, "receipt": receipt})
    ctx.after_commit(email, ctx.key, receipt)
    return str(receipt)


@orders.function
async def pay(ctx: Context, amount: int) -> str:
    """Charge (an effect) and keep the receipt: sent with an idempotency key, its
    duplicates must charge once."""
    receipt = await ctx.run(charge, ctx.key, amount)
    ctx.put({"receipt": receipt, "paid": int(ctx.get({}).get("paid", 0)) + amount})
    return str(receipt)


@alarms.function
async def arm(ctx: Context, delay: float, name: str) -> str:
    """A timer calling ``ring(name)`` on this key after ``delay`` s; its id."""
    tid = ctx.send_after(delay, "alarms", ctx.key, "ring", name, ctx.now() + delay)
    ids = dict(ctx.get({}))
    ids[name] = tid
    ctx.put(ids)
    return tid


@alarms.function
async def disarm(ctx: Context, name: str) -> bool:
    ids = dict(ctx.get({}))
    if name not in ids:
        return False
    ctx.cancel_timer(ids.pop(name))
    ctx.put(ids)
    return True


@alarms.function
async def ring(ctx: Context, name: str, due: float) -> float:
    """A timer's call: counts per name and records how late it was (ctx.now() - due)."""
    await ctx.call("alarms", "rung:" + ctx.key, "log", name, ctx.now() - due)
    return ctx.now() - due


@alarms.function
async def noisy(ctx: Context) -> float:
    """Not deterministic: the determinism check must refuse it."""
    import random

    value = random.random()
    ctx.put(value)
    return value


@alarms.function
async def first_of(ctx: Context, names: list[str]) -> str:
    """Not deterministic across processes: a set's order depends on the hash seed."""
    pick = next(iter(set(names)))
    ctx.put(pick)
    return pick


@alarms.function
async def rung(ctx: Context) -> dict[str, list[float]]:
    """(on a ``rung:`` key) name → [times rung, seconds late]."""
    return {k: list(v) for k, v in dict(ctx.get({})).items()}


@alarms.function
async def log(ctx: Context, name: str, late: float) -> None:
    rung = dict(ctx.get({}))
    count, _ = rung.get(name, (0, 0.0))
    rung[name] = (count + 1, late)
    ctx.put(rung)


@alarms.function
async def broken(ctx: Context, card: str) -> None:
    """A bug: a plain exception (its traceback reaches the log, and the reply when asked)."""
    _check_card(card)


def _check_card(card: str) -> None:
    raise ValueError(f"card number invalid: {card}")
