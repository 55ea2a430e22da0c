"""Effects once per logical request on a real cluster (Kafka, MinIO, ``sfaas up``, 2
workers): duplicates of an idempotent request whose function runs a ``ctx.run`` effect —
sent concurrently, again after they were answered, and across a worker's SIGKILL — charge
once, under one effect key derived from the idempotency key (``"i…"``), and all get the
same reply. ``SFAAS_CHAOS_SEED`` reproduces the choice of keys and kills."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas.client import Client
from sfaas.runtime.partitioning import owner_of_partition, partition_of
from tests.runtime.apps import world
from tests.runtime.test_recovery import PARTITIONS, chaos_settings, log_tails

SEED = int(os.environ.get("SFAAS_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
COPIES = 10


def _owner(key: str) -> int:
    return owner_of_partition(partition_of("orders", key, PARTITIONS), 2)


def _kill_worker(s: Any, index: int) -> int:
    """SIGKILL worker ``index``; its pid (the test fails if there is none to kill)."""
    procs = [p for p in cluster.ps(s) if p.role == "worker" and p.alive and p.index == index]
    assert procs, f"no live worker {index} to kill: {cluster.ps(s)}"
    os.kill(procs[0].pid, signal.SIGKILL)
    return procs[0].pid


async def _copies(c: Client, key: str, n: int = COPIES) -> list[Any]:
    """``n`` duplicates of one idempotent payment, sent at once; their replies."""
    futs = [await c.submit("orders", key, "pay", 7, idempotency_key=f"pay-{key}")
            for _ in range(n)]
    return list(await asyncio.gather(*futs))


@pytest.mark.timeout(600)
def test_duplicates_of_an_idempotent_payment_charge_once_with_one_stable_key(
        kafka: Any, minio: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(SEED)
    print(f"idempotent effects: seed {SEED} (SFAAS_CHAOS_SEED reproduces it)")
    wdir = tmp_path / "world"
    wdir.mkdir()
    monkeypatch.setenv("SFAAS_WORLD_DIR", str(wdir))
    # a charge takes 1.5 s, so later duplicates arrive while it runs, and a kill lands in it
    monkeypatch.setenv("SFAAS_WORLD_CHARGE_S", "1.5")
    s = chaos_settings(kafka, minio, tmp_path, store="memonly", snapshot_interval=30.0)
    cluster.up(s, "tests.runtime.apps.world:app", 2, timeout=90)
    report: dict[str, Any] = {"seed": SEED}
    try:
        cs = cluster.cluster_settings(s)[1]
        keys = [f"o{rnd.randrange(1 << 30):x}" for _ in range(40)]
        on = {w: [k for k in keys if _owner(k) == w] for w in (0, 1)}
        assert on[0] and on[1], keys
        calm, early = on[0][0], on[1][0]
        during = on[rnd.randrange(2)][1]
        after = on[0][2] if _owner(during) == 1 else on[1][2]

        async def go() -> dict[str, list[Any]]:
            r: dict[str, list[Any]] = {}
            async with Client("world", settings=cs, timeout=120) as c:
                # 1. concurrent duplicates, then more after they were answered
                r[calm] = await _copies(c, calm)
                r[calm] += await _copies(c, calm)
                # 2. duplicates in later epochs join the charge that is running
                first = asyncio.ensure_future(_copies(c, early))
                await asyncio.sleep(0.5)
                r[early] = await _copies(c, early) + await first
                # 3. the OTHER worker is SIGKILLed while the charge runs: the recovery
                # rolls both workers back; the duplicates still get the one charge
                pending = asyncio.ensure_future(_copies(c, during))
                await _started(wdir, during)
                report["killed_during"] = _kill_worker(s, 1 - _owner(during))
                r[during] = await pending + await _copies(c, during)
                # 4. the OWNER is SIGKILLed after the duplicates were answered; more come
                r[after] = await _copies(c, after)
                report["killed_after"] = _kill_worker(s, _owner(after))
                r[after] += await _copies(c, after)
            return r

        replies = asyncio.run(go())
        charges = [line.split() for line in world.lines("charge", str(wdir))]
        report["charges"] = Counter(order for order, _ in charges)
        for key, rs in replies.items():
            assert all(x.ok for x in rs), (key, [x for x in rs if not x.ok][:2], report)
            assert len({x.value for x in rs}) == 1, (key, {x.value for x in rs})
            mine = [ekey for order, ekey in charges if order == key]
            assert len(mine) == 1, (key, mine, report)
            assert mine[0].startswith("i") and mine[0].endswith(f":orders:{key}:0"), mine
        print(f"idempotent effects report: {report}")
    except BaseException:
        print(f"idempotent effects (seed {SEED}) failed: {report}\n{log_tails(s)}")
        raise
    finally:
        cluster.down(s)


async def _started(wdir: Path, key: str, timeout: float = 60.0) -> None:
    """Wait until the charge of ``key`` is under way (its ``charging`` line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(line.split()[0] == key for line in world.lines("charging", str(wdir))):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the charge of {key} never started")
