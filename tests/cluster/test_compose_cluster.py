"""The single-host compose cluster (docker-compose.yml, as a user runs it): the images built
offline, Kafka reachable from the host, the gateway, the status page and Prometheus, and a
killed worker container replaced by its standby without losing state."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

from sfaas.client import Client
from sfaas.runtime.settings import Settings
from tests.cluster.conftest import ROOT, compose, wait_ready

ACCOUNTS = [f"a{i}" for i in range(20)]


def _post(url: str, body: dict[str, object], token: str | None) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


async def _first_read(cs: Settings) -> object:
    """A read of an account nobody wrote, with a short timeout: the cluster serves."""
    async with Client("bank", settings=cs, timeout=10) as cl:
        return await asyncio.wait_for(cl.get("accounts", "nobody"), 15)


def test_the_compose_cluster_serves_the_host_and_survives_a_killed_worker(images: None) -> None:
    with compose([ROOT / "docker-compose.yml"]) as c:
        # ready means serving: every worker and standby up, and a read from here answered
        took = wait_ready(c, workers=2, standbys=1)
        print(f"compose cluster ready in {took:.1f} s after `up`")
        cs = c.client_settings()
        t0 = time.monotonic()  # so the first call succeeds at once: no "cannot reach Kafka"
        assert asyncio.run(_first_read(cs)) is None
        print(f"first call after ready answered in {time.monotonic() - t0:.1f} s")

        async def deposits(amount: int) -> list[int]:
            async with Client("bank", settings=cs, timeout=60) as cl:
                return list(await asyncio.gather(*(cl.call("accounts", a, "deposit", amount)
                                                   for a in ACCOUNTS)))

        async def balances() -> list[int]:
            async with Client("bank", settings=cs, timeout=60) as cl:
                return list(await asyncio.gather(*(cl.call("accounts", a, "balance") for a in ACCOUNTS)))

        assert asyncio.run(deposits(10)) == [10] * len(ACCOUNTS)
        # the gateway: with the token a deposit commits, without it a 401 naming the problem
        url = f"http://127.0.0.1:{c.ports['SFAAS_CLUSTER_GATEWAY_PORT']}/v1/bank/accounts/a0/deposit"
        assert _post(url, {"args": [5]}, c.secrets["SFAAS_GATEWAY_TOKEN"]) == (200, {"result": 15})
        code, body = _post(url, {"args": [5]}, None)
        assert code == 401 and "error" in body, (code, body)
        # Prometheus (Debian's, in its own image) scrapes every sfaas process
        prom = f"http://127.0.0.1:{c.ports['SFAAS_CLUSTER_PROMETHEUS_PORT']}/api/v1/targets"
        deadline, health = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(prom, timeout=5) as r:
                targets = json.loads(r.read())["data"]["activeTargets"]
            health = {t["labels"]["instance"]: t["health"] for t in targets}
            if len(health) == 6 and set(health.values()) == {"up"}:
                break
            time.sleep(2)
        assert len(health) == 6 and set(health.values()) == {"up"}, health
        assert "sfaas_worker_up" in c.metrics()
        # every coordinator, worker and standby touches its liveness file: healthy
        names = ["coordinator", "worker-0", "worker-1", "worker-0-standby", "worker-1-standby"]
        deadline, states = time.monotonic() + 90, {}
        while time.monotonic() < deadline:
            states = {n: c.docker("inspect", "-f", "{{.State.Health.Status}}", c.container(n)).strip()
                      for n in names}
            if set(states.values()) == {"healthy"}:
                break
            time.sleep(2)
        # (not healthy: what the probe said, each of its last runs, to tell a stale file
        # from a probe that timed out)
        assert set(states.values()) == {"healthy"}, (states, {
            n: c.docker("inspect", "-f", "{{json .State.Health}}", c.container(n))[-2000:]
            for n, st in states.items() if st != "healthy"})
        # a round holds the deposits; then worker-0's container dies: its standby takes over
        time.sleep(6)
        c.docker("kill", c.container("worker-0"))
        t0 = time.monotonic()
        assert asyncio.run(balances()) == [15] + [10] * (len(ACCOUNTS) - 1)
        print(f"after killing worker-0: all balances read back in {time.monotonic() - t0:.1f} s")
        log = c.run("logs", "--no-color", "coordinator")
        assert "promot" in log.lower(), log[-3000:]
        assert asyncio.run(deposits(1)) == [16] + [11] * (len(ACCOUNTS) - 1)
