"""Safe reconfiguration on a cluster: ``sfaas up`` of an app whose earlier run in the same
namespace wrote its stores with another engine or partition count refuses to start,
naming both, before it starts anything."""

from __future__ import annotations

import asyncio
import re
import time
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
    _first_run(s)
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


@pytest.mark.timeout(300)
def test_a_recovery_that_fails_the_same_way_three_times_stops_and_says_why(
        kafka: Any, minio: Any, tmp_path: Path) -> None:
    """Another host (an empty data directory) starts the app's namespace with another
    engine: the layout files are not there to refuse it, the workers' rollback to the
    round in MinIO is. ``sfaas up`` fails with the reason, the coordinator stops retrying
    after three identical failures and says why on its status page, in /metrics, in
    ``sfaas ps`` and in its exit message."""
    import json
    import urllib.request

    s = chaos_settings(kafka, minio, tmp_path / "first-host", store="lsm")
    _first_run(s, until_a_round=True)
    other = s.__class__.load({**{k: getattr(s, k) for k in ("kafka", "namespace", "minio",
                                                             "minio_access_key", "minio_secret_key",
                                                             "bucket", "partitions")},
                              "home": str(tmp_path / "second-host"), "store": "hybridlog"})
    why = (r"recovery failed 3 times in a row the same way: worker \d could not roll back: "
           r"ConfigError: round \d+ holds operator 'accounts' \(partition \d+\) written by engine "
           r"'lsm'; this run opens it with engine 'hybridlog'")
    t0 = time.monotonic()
    try:
        with pytest.raises(ClusterError, match=why):
            cluster.up(other, "tests.runtime.apps.ledger:app", 2, timeout=120)
        assert time.monotonic() - t0 < 60, "it should stop after three attempts, not time out"
        coord = next(p for p in cluster.ps(other) if p.role == "coordinator")
        assert coord.alive, "the coordinator stays up to show why"
        assert re.search(why, coord.gave_up), coord.gave_up
        url = cluster.status_url(other, required=True)
        with urllib.request.urlopen(url.rstrip("/") + "/status.json", timeout=10) as r:
            status = json.load(r)
        assert re.search(why, status["recovery_stopped"])
        assert status["summary"][0][1] == "RECOVERY STOPPED"

        def metrics() -> str:
            with urllib.request.urlopen(coord.metrics, timeout=10) as r:
                return str(r.read().decode())

        first = metrics()
        assert "sfaas_recovery_stopped 1.0" in first
        attempts = re.search(r"^sfaas_recovery_attempts_total (\S+)$", first, re.M)
        assert attempts and float(attempts[1]) >= 3
        time.sleep(2.0)  # no more attempts: it stopped retrying
        assert f"sfaas_recovery_attempts_total {attempts[1]}" in metrics()
    finally:
        cluster.down(other)
    log = (cluster.state_dir(other) / "coordinator.log").read_text()
    assert re.search("error: " + why, log), log[-3000:]


def _first_run(s: Any, until_a_round: bool = False) -> None:
    """The app's first run in ``s``'s namespace: a ledger cluster that commits one deposit
    (and, ``until_a_round``, publishes a snapshot round holding it), then stops."""
    from sfaas.runtime.protocols.rounds import Rounds
    from sfaas.runtime.state import rounds_remote

    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]

        async def go() -> None:
            async with Client("ledger", settings=cs) as c:
                await c.call("accounts", "kept", "deposit", 42)
        asyncio.run(go())
        deadline = time.monotonic() + 30
        while until_a_round and not Rounds(rounds_remote(s, "ledger")).ids():
            assert time.monotonic() < deadline, "no snapshot round within 30 s"
            time.sleep(0.2)
    finally:
        cluster.down(s)
