"""``close()`` and ``down`` give back everything: 200 clients, and local clusters started
and stopped one after another, leave this process holding the threads, child processes,
descriptors and sockets it held before.

A local cluster takes about a second to start and stop, so CI runs as many of the 200 as
fit ``CLUSTER_BUDGET`` (30 s; about 30 on two cores); ``SFAAS_FUZZ_FULL=1`` (the fuzz
suites' full run) runs all 200.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from launcher import cluster
from sfaas.client import Client, SyncClient
from sfaas.runtime.kafka import ensure_topics
from sfaas.runtime.settings import Settings
from tests.fuzz.budget import FULL
from tests.namespaces import fresh_namespace
from tests.resources import held, leftover

N_CLIENTS = 200
CLUSTERS = 200
CLUSTER_BUDGET = None if FULL else 30.0  # seconds of cluster cycles in CI


@pytest.mark.timeout(900)
def test_200_clients_opened_and_closed_hold_nothing(kafka) -> None:
    s = Settings.load({"kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace()})
    ingress, egress = s.topics("res")
    asyncio.run(ensure_topics(s.kafka, {ingress: 2, egress: 2}))

    async def clients(n: int) -> None:
        for _ in range(n):
            c = Client("res", settings=s)
            await c.start()
            await c.close()

    def sync_client() -> None:
        c = SyncClient("res", settings=s)
        c._run(c._client.start())
        c.close()

    asyncio.run(clients(1))  # first use: imports, aiokafka's first connection
    sync_client()
    baseline = held()
    asyncio.run(clients(N_CLIENTS // 2))
    for _ in range(N_CLIENTS // 2):
        sync_client()
    extra = leftover(baseline)
    assert not extra, f"after {N_CLIENTS} clients the process holds {extra} more than before ({baseline})"


@pytest.mark.timeout(7200)
def test_local_clusters_started_and_stopped_hold_nothing(kafka, tmp_path: Path) -> None:
    s = Settings.load({"kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace(),
                       "home": str(tmp_path), "store": "memonly", "partitions": 2, "snapshot_interval": 0})

    def cycle() -> None:
        cluster.up(s, "examples.bank:app", 2, timeout=90)
        procs = cluster.down(s)
        assert procs and not any(p.alive for p in cluster.ps(s))

    cycle()
    baseline = held()
    t0 = time.monotonic()
    done = 1
    while done < CLUSTERS and (CLUSTER_BUDGET is None or time.monotonic() - t0 < CLUSTER_BUDGET):
        cycle()
        done += 1
    extra = leftover(baseline)
    print(f"{done} local clusters started and stopped in {time.monotonic() - t0:.0f} s")
    assert not extra, f"after {done} clusters the process holds {extra} more than before ({baseline})"
