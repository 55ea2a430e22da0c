"""A recovery that must read back a big backlog ends, and loses and duplicates nothing.

A recovery's rebuild step decodes every ingress record, reply and epoch-log record since the
round. With 60,000 requests since the round that took 0.9–1.2 s on this machine; done in one
go, it kept the worker's event loop from sending heartbeats for longer than the heartbeat
timeout, so the coordinator declared the recovering worker lost and began again — reading
the same backlog again, and a little more: the recovery never ended (a storm). The rebuild
now gives the loop a turn every 20 ms (``sfaas.runtime.liveness.Turns``).

Here: a real cluster (Kafka, MinIO, ``sfaas up``) with no round yet (a recovery goes back to
round 0 and reads everything), 60,000 deposits, then a worker SIGKILLed. The next request
must be answered and every balance must hold each deposit exactly once.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas.client import Client
from tests.runtime.test_recovery import PARTITIONS, chaos_settings, log_tails
from tests.runtime.test_rounds import _read_topic

DEPOSITS = 60_000
ACCOUNTS = 500
#: below the unpaced rebuild's 0.9–1.2 s on this machine, with room for a paced one's turns
HEARTBEAT_TIMEOUT = 0.6


@pytest.mark.timeout(600)
def test_a_recovery_reading_sixty_thousand_requests_back_ends_and_keeps_each_once(
        kafka: Any, minio: Any, tmp_path: Path) -> None:
    faulthandler.dump_traceback_later(570, exit=False, file=sys.stderr)
    s = chaos_settings(kafka, minio, tmp_path, snapshot_interval=3600.0,
                       heartbeat_timeout=HEARTBEAT_TIMEOUT)
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]

        async def deposits() -> None:  # (through Kafka: the recovery reads them back)
            async with Client("ledger", settings=cs, direct_calls=False) as c:
                sem = asyncio.Semaphore(2000)

                async def one(i: int) -> None:
                    async with sem:
                        await c.call("accounts", f"a{i % ACCOUNTS}", "deposit", 1)
                await asyncio.gather(*(one(i) for i in range(DEPOSITS)))

        asyncio.run(deposits())

        async def committed() -> int:  # (a reply transaction stays open reply_commit_ms:
            for _ in range(100):         # the kill must find every reply committed)
                raw = await _read_topic(cs, cs.topics("ledger")[1], PARTITIONS, committed=True)
                if (n := sum(len(recs) for recs in raw.values())) >= DEPOSITS:
                    return n
                await asyncio.sleep(0.1)
            return n
        assert asyncio.run(committed()) == DEPOSITS
        victim = next(p for p in cluster.ps(s) if p.role == "worker" and p.alive)
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()

        async def after() -> list[int]:
            async with Client("ledger", settings=cs, timeout=120.0) as c:
                await c.call("accounts", "a0", "deposit", 1)
                return list(await asyncio.gather(*(c.call("accounts", f"a{i}", "balance")
                                                   for i in range(ACCOUNTS))))

        try:
            balances = asyncio.run(after())
        except Exception as exc:
            raise AssertionError(f"no answer {time.monotonic() - killed:.0f} s after the kill "
                                 f"({exc!r}):\n{log_tails(s)}") from None
        want = [DEPOSITS // ACCOUNTS + (i == 0) for i in range(ACCOUNTS)]
        assert balances == want, [(i, b) for i, (b, w) in enumerate(zip(balances, want, strict=True))
                                  if b != w][:10]
        coord = (cluster.state_dir(s) / "coordinator.log").read_text()
        assert re.search(r"recovery \d+ done in .*rolled back to round 0", coord), log_tails(s)
        rebuilt = [line for f in cluster.state_dir(s).glob("worker-*.log")
                   for line in f.read_text().splitlines() if "turns given to the loop" in line]
        assert rebuilt and all(f"{DEPOSITS} replies already out" in line for line in rebuilt), rebuilt
    finally:
        faulthandler.cancel_dump_traceback_later()
        cluster.down(s)
