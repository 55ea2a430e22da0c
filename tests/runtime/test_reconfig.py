"""Safe reconfiguration on a cluster: ``sfaas up`` of an app whose earlier run in the same
namespace wrote its stores with another engine or partition count refuses to start,
naming both, before it starts anything."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas.client import Client
from sfaas.errors import ClusterError
from tests.runtime.test_recovery import chaos_settings


@pytest.mark.timeout(300)
def test_up_with_another_engine_or_partition_count_is_refused_before_anything_starts(
        kafka: Any, minio: Any, tmp_path: Path) -> None:
    s = chaos_settings(kafka, minio, tmp_path, store="lsm")
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]

        async def go() -> None:
            async with Client("ledger", settings=cs) as c:
                await c.call("accounts", "kept", "deposit", 42)
        asyncio.run(go())
    finally:
        cluster.down(s)
    for store, partitions, want in (("hybridlog", 4, "engine 'hybridlog' in 4 partitions"),
                                    ("lsm", 8, "engine 'lsm' in 8 partitions")):
        other = s.__class__.load({**{k: getattr(s, k) for k in ("kafka", "namespace", "home",
                                                                 "minio", "minio_access_key",
                                                                 "minio_secret_key", "bucket")},
                                  "store": store, "partitions": partitions})
        with pytest.raises(ClusterError, match=rf"written by app 'ledger' with engine 'lsm' in "
                                               rf"4 partitions; this run asks for {want}"):
            cluster.up(other, "tests.runtime.apps.ledger:app", 2, timeout=30)
        assert not any(p.alive for p in cluster.ps(other))  # nothing was started
