"""Schema upcasters and TTL on a real cluster (Kafka, MinIO, worker processes): the app's
code is upgraded between ``cluster.down`` and ``cluster.up`` on the same namespace and
data, values written by the old code are read upcast by transactions and by
``Client.get``/``scan``, older code over newer data is refused by name, and values under a
``ttl`` vanish for functions and reads once it passed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas import SchemaTooNew
from sfaas.client import Client
from sfaas.runtime.settings import Settings
from tests.runtime.test_recovery import chaos_settings, log_tails

V1 = "tests.runtime.apps.schema_v1:app"
V2 = "tests.runtime.apps.schema_v2:app"
ORDERS = [f"order-{i}" for i in range(8)]


def _client(s: Settings) -> Client:
    return Client("schema", settings=cluster.cluster_settings(s)[1], timeout=60)


async def _settle_round(s: Settings) -> None:
    """Let a snapshot round cover everything written so far (rounds every second), so the
    next start's recovery replays no epoch of the old code (see docs/guide/schemas-and-ttl.md's upgrade
    section)."""
    await asyncio.sleep(3 * s.snapshot_interval + 1.0)


@pytest.mark.timeout(600)
def test_upgraded_code_reads_old_values_upcast_and_downgrade_is_refused(
        kafka: Any, minio: Any, tmp_path: Path) -> None:
    s = chaos_settings(kafka, minio, tmp_path)
    try:
        cluster.up(s, V1, 2, timeout=90)

        async def v1() -> None:
            async with _client(s) as c:
                for i, k in enumerate(ORDERS):
                    assert await c.call("orders", k, "put", i) == i
                assert await c.get("orders", "order-3") == 3  # v1: plain ints
            await _settle_round(s)

        asyncio.run(v1())
        cluster.down(s)

        cluster.up(s, V2, 2, timeout=90)

        async def v2() -> None:
            async with _client(s) as c:
                # transactions and reads see the version-2 shape of version-1 values
                assert await c.call("orders", "order-2", "get") == {"qty": 2, "note": ""}
                assert await c.get("orders", "order-5") == {"qty": 5, "note": ""}
                assert await c.scan("orders", prefix="order-") == [
                    (k, {"qty": i, "note": ""}) for i, k in enumerate(ORDERS)]
                # a write stores version 2; the reads agree with the transactions
                assert await c.call("orders", "order-1", "add", 10) == {"qty": 11, "note": ""}
                assert await c.call("orders", "order-9", "put", 9, "new") == {"qty": 9,
                                                                          "note": "new"}
                assert await c.get("orders", "order-1") == {"qty": 11, "note": ""}
                assert await c.call("orders", "order-1", "get") == {"qty": 11, "note": ""}
            await _settle_round(s)

        asyncio.run(v2())
        # a round covered every epoch of the old code: the start's recovery replayed none
        # of them with the new code, so no reply of the old code was contradicted
        assert "replay diverged" not in log_tails(s, 50_000, 50_000)
        cluster.down(s)

        # older code over newer data: refused by name, never misread
        cluster.up(s, V1, 2, timeout=90)

        async def back_to_v1() -> None:
            async with _client(s) as c:
                with pytest.raises(SchemaTooNew) as info:
                    await c.call("orders", "order-1", "add", 1)
                msg = str(info.value)
                assert "'orders'" in msg and "'order-1'" in msg and "version 2" in msg \
                    and "version 1" in msg, msg
                with pytest.raises(SchemaTooNew):
                    await c.get("orders", "order-9")
                # a key still holding a version-1 value works with the old code
                assert await c.call("orders", "order-4", "add", 1) == 5

        asyncio.run(back_to_v1())
    except BaseException:
        print(f"schema cluster test failed\n{log_tails(s)}")
        raise
    finally:
        cluster.down(s)


@pytest.mark.timeout(300)
def test_ttl_values_vanish_for_functions_and_reads(kafka: Any, minio: Any,
                                                   tmp_path: Path) -> None:
    s = chaos_settings(kafka, minio, tmp_path)
    try:
        cluster.up(s, V2, 2, timeout=90)

        async def go() -> None:
            async with _client(s) as c:
                users = [f"s-{i}" for i in range(6)]
                await asyncio.gather(*(c.call("sessions", u, "login", u) for u in users))
                t0 = time.time()
                assert await c.call("sessions", "s-0", "who") == {"user": "s-0"}
                assert await c.get("sessions", "s-1") == {"user": "s-1"}
                assert len(await c.scan("sessions")) == 6
                await asyncio.sleep(max(0.0, t0 + 2.5 - time.time()))
                await c.call("sessions", "s-fresh", "login", "late")
                for u in users:
                    assert await c.call("sessions", u, "who") == "nobody"
                    assert await c.get("sessions", u) is None
                    assert await c.get("sessions", u, "gone") == "gone"
                assert await c.scan("sessions") == [("s-fresh", {"user": "late"})]
                # an operator without a ttl keeps its values all along
                await c.call("orders", "o", "put", 1)
                await asyncio.sleep(2.5)
                assert await c.get("orders", "o") == {"qty": 1, "note": ""}
                assert await c.get("sessions", "s-fresh") is None

        asyncio.run(go())
    except BaseException:
        print(f"ttl cluster test failed\n{log_tails(s)}")
        raise
    finally:
        cluster.down(s)
