"""``sfaas demo``: the whole system in one command.

1. start the local Kafka and MinIO (``sfaas services up``; reused if already running),
2. start a 2-worker cluster of ``examples/bank.py`` in a fresh namespace,
3. open 1,000 accounts and run random transfers at a fixed offered rate, with a progress bar,
4. print committed/aborted counts, throughput, p50/p99 latency, and check that the total
   balance is conserved and no balance is negative,
5. stop the cluster and the services this command started.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sys
import tempfile
import uuid

from tqdm import tqdm

from . import cluster, services
from .client import Client
from .loadgen import run_open_loop
from .settings import Settings

log = logging.getLogger("sfaas.demo")

__all__ = ["run_demo"]

START_BALANCE = 1_000


def run_demo(seconds: float = 10.0, rate: float = 1000.0, accounts: int = 1000,
             store: str = "hybridlog", keep: bool = False) -> int:
    """Run the demo; returns the process exit code (0: invariants held)."""
    before = services.status()
    print("starting Kafka and MinIO (first run downloads/builds them; later runs reuse them) ...")
    ep = services.up(kafka=True, minio=True, progress=lambda m: print(f"  {m}", flush=True))
    s = Settings.load({
        "kafka": ep.kafka_bootstrap,
        "namespace": f"demo-{uuid.uuid4().hex[:8]}",
        "home": os.path.join(tempfile.gettempdir(), "sfaas-demo"),
        "store": store,
    })
    ok = False
    try:
        print(f"starting a coordinator and 2 workers of examples.bank:app (store: {store}) ...")
        procs = cluster.up(s, "examples.bank:app", 2)
        for p in procs:
            print(f"  {p.role:12} pid {p.pid:<8} {p.address}")
        ok = asyncio.run(_load(cluster.cluster_settings(s)[1], seconds, rate, accounts))
    finally:
        cluster.down(s)
        print("cluster stopped")
        if not keep:
            started = [name for name in ("kafka", "minio") if not before.get(name, {}).get("running")]
            if started:
                services.down(kafka="kafka" in started, minio="minio" in started, progress=False)
                print(f"stopped {', '.join(started)}")
    return 0 if ok else 1


async def _load(s: Settings, seconds: float, rate: float, accounts: int) -> bool:
    names = [f"acct{i:05d}" for i in range(accounts)]
    async with Client("bank", settings=s, timeout=120) as client:
        print(f"opening {accounts} accounts with {START_BALANCE} each ...")
        for i in range(0, accounts, 500):
            await asyncio.gather(*(client.call("accounts", n, "deposit", START_BALANCE) for n in names[i:i + 500]))
        rnd = random.Random(42)

        def transfer(i: int) -> tuple[str, str, str, list[object]]:
            a, b = rnd.sample(names, 2)
            return ("accounts", a, "transfer", [b, rnd.randint(1, 2 * START_BALANCE // 3)])

        total = int(rate * seconds)
        print(f"running {total} transfers at {rate:.0f}/s (open loop) ...")
        with tqdm(total=total, unit="txn", file=sys.stdout, dynamic_ncols=True) as bar:
            res = await run_open_loop(client, transfer, rate, seconds, progress=bar.update)
        balances: list[int] = []
        for i in range(0, accounts, 500):
            balances += await asyncio.gather(*(client.call("accounts", n, "balance") for n in names[i:i + 500]))
    summary = res.summary()
    conserved = sum(balances) == START_BALANCE * accounts
    nonneg = min(balances) >= 0
    print()
    print(f"  committed        {res.committed}")
    print(f"  aborted          {res.aborted}   (insufficient funds: the bank's rule, rolled back)")
    print(f"  lost replies     {res.lost}")
    print(f"  throughput       {summary['committed_tps']:.0f} committed txn/s (offered {rate:.0f}/s)")
    print(f"  latency          p50 {summary['p50_ms']:.1f} ms   p99 {summary['p99_ms']:.1f} ms")
    print(f"  total balance    {sum(balances)} (expected {START_BALANCE * accounts}): "
          f"{'conserved' if conserved else 'NOT CONSERVED'}")
    print(f"  negative balance {'none' if nonneg else 'FOUND'}")
    return conserved and nonneg and res.lost == 0
