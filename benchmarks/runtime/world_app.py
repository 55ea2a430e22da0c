"""The app of the effect and timer benchmarks (``effect_stall``, ``timers``).

``kv.put`` is the unrelated traffic; ``slow.pay`` a transaction whose ``ctx.run`` effect
sleeps ``SFAAS_SLOW_EFFECT_S`` seconds (3 by default); ``alarms.arm`` sets a durable timer
calling ``alarms.ring``, which counts per timer name on ``rung:<key>`` and keeps how late
it fired (``ctx.now()`` minus its due time) and its due time.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sfaas import App, Context
from sfaas.runtime.settings import Settings

T = TypeVar("T")

app = App("worldbench")
_store = os.environ.get("SFAAS_STORE", "memonly")
kv = app.operator("kv", store=_store)
slow = app.operator("slow", store=_store)
alarms = app.operator("alarms", store=_store)

SLOW_S = float(os.environ.get("SFAAS_SLOW_EFFECT_S", "3"))


def on_cluster(prefix: str, kafka: str, run: Callable[[Settings], Coroutine[Any, Any, T]],
               snapshot_interval: float = 5.0) -> tuple[T, dict[str, float]]:
    """Start the services if down, run ``run(settings)`` against a fresh 2-worker cluster
    of this app (memonly, 8 partitions, namespace ``prefix`` + random), stop it and clean
    up; ``run``'s result and the machine probe taken before it."""
    from benchmarks.runtime.bench import cleanup, machine_probe
    from launcher import cluster, services

    services.up(progress=False)
    s = Settings.load({"namespace": f"{prefix}{uuid.uuid4().hex[:8]}", "partitions": 8,
                       "store": "memonly", "kafka": kafka,
                       "snapshot_interval": snapshot_interval})
    probe = machine_probe()
    cluster.up(s, "benchmarks.runtime.world_app:app", 2, timeout=120)
    try:
        return asyncio.run(run(cluster.cluster_settings(s)[1])), probe
    finally:
        cluster.down(s)
        cleanup(s, app="worldbench")


async def slow_call(order: str) -> str:
    await asyncio.sleep(SLOW_S)
    return f"paid-{order}"


@kv.function
async def put(ctx: Context, value: int) -> int:
    ctx.put(value)
    return value


@slow.function
async def pay(ctx: Context) -> str:
    receipt = str(await ctx.run(slow_call, ctx.key))
    ctx.put(receipt)
    return receipt


@alarms.function
async def arm(ctx: Context, delay: float, name: str) -> str:
    return ctx.send_after(delay, "alarms", ctx.key, "ring", name, ctx.now() + delay)


@alarms.function
async def ring(ctx: Context, name: str, due: float) -> None:
    await ctx.call("alarms", "rung:" + ctx.key, "log", name, ctx.now() - due, due)


@alarms.function
async def log(ctx: Context, name: str, late: float, due: float) -> None:
    rung = dict(ctx.get({}))
    count = rung.get(name, (0,))[0]
    rung[name] = (count + 1, late, due)
    ctx.put(rung)


@alarms.function
async def rung(ctx: Context) -> dict[str, list[float]]:
    return {k: list(v) for k, v in dict(ctx.get({})).items()}
