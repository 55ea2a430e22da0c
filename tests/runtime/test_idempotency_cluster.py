"""Idempotent requests on a real cluster: 1,000 deposits each sent three times —
concurrently, one after another, and again after a worker's SIGKILL — run exactly 1,000
times, and every duplicate gets the first outcome (``SFAAS_CHAOS_SEED`` reproduces the
kill's timing)."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas.client import Client
from tests.runtime.test_recovery import _kill, chaos_settings, log_tails

SEED = int(os.environ.get("SFAAS_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
ACCOUNTS = [f"idem-{i}" for i in range(20)]


@pytest.mark.timeout(600)
def test_a_thousand_deposits_sent_three_times_run_once_each(kafka: Any, minio: Any,
                                                            tmp_path: Path) -> None:
    rnd = random.Random(SEED)
    s = chaos_settings(kafka, minio, tmp_path)
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    report: dict[str, Any] = {"seed": SEED}
    try:
        cs = cluster.cluster_settings(s)[1]

        async def go() -> dict[str, list[Any]]:
            replies: dict[str, list[Any]] = {}
            async with Client("ledger", settings=cs, timeout=120) as c:
                def send(i: int) -> Any:
                    return c.submit("accounts", ACCOUNTS[i % 20], "deposit", 1,
                                    idempotency_key=f"dep-{i}")

                # 300 sent three times at once
                futs = {i: [await send(i) for _ in range(3)] for i in range(300)}
                for i, fs in futs.items():
                    replies[f"dep-{i}"] = list(await asyncio.gather(*fs))
                # 300 sent three times one after another
                for i in range(300, 600):
                    replies[f"dep-{i}"] = [await (await send(i)) for _ in range(3)]
                # 400 sent once while a worker is SIGKILLed, then twice more after it
                first = []
                kill_at = rnd.randrange(50, 350)
                for i in range(600, 1000):
                    if i - 600 == kill_at:
                        report["killed"] = _kill(s, "worker", rnd)
                    first.append(await send(i))
                    await asyncio.sleep(0.005)
                firsts = await asyncio.gather(*first)
                again = [[await send(i), await send(i)] for i in range(600, 1000)]
                for i, f, (a, b) in zip(range(600, 1000), firsts, again, strict=True):
                    replies[f"dep-{i}"] = [f, await a, await b]
                balances = await asyncio.gather(*(c.call("accounts", a, "balance")
                                                  for a in ACCOUNTS))
            report["total"] = sum(balances)
            return replies
        replies = asyncio.run(go())
        assert report.get("killed"), report
        for key, rs in replies.items():
            assert all(r.ok for r in rs), (key, rs)
            assert len({r.value for r in rs}) == 1, (key, [r.value for r in rs])
        # each of the 1,000 deposits ran exactly once: the balances hold exactly 1,000
        assert report["total"] == 1000, report
        print(f"idempotency report: {report}")
    except BaseException:
        print(f"idempotency test (seed {SEED}) failed; {report}\n{log_tails(s)}")
        raise
    finally:
        cluster.down(s)
