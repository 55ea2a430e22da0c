"""``sfaas demo``: the whole system in one command.

1. start the local Kafka and MinIO (``sfaas services up``; reused if already running),
2. start a 2-worker cluster of ``examples/bank.py`` in a fresh namespace,
3. open 1,000 accounts and run random transfers at a fixed offered rate, with a progress bar,
   SIGKILLing a worker midway (``--no-chaos`` to leave it alone): the supervisor restarts
   it and the cluster recovers from the last snapshot round,
4. print committed/aborted counts, throughput, p50/p99 latency, the kill and how long
   replies stopped, the snapshot rounds taken, and check that no reply was lost or
   duplicated, the total balance is conserved and no balance is negative,
5. stop the cluster and the services this command started.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from typing import Any

from tqdm import tqdm

from launcher import cluster, services
from launcher.loadgen import run_open_loop
from sfaas.client import Client
from sfaas.runtime.settings import Settings

log = logging.getLogger("sfaas.demo")

__all__ = ["run_demo"]

START_BALANCE = 1_000


def run_demo(seconds: float = 10.0, rate: float = 1000.0, accounts: int = 1000,
             store: str = "hybridlog", keep: bool = False, chaos: bool = True) -> int:
    """Run the demo; returns the process exit code (0: invariants held)."""
    before = services.status()
    print("starting Kafka and MinIO (first run downloads/builds them; later runs reuse them) ...")
    ep = services.up(kafka=True, minio=True, progress=lambda m: print(f"  {m}", flush=True))
    s = Settings.load({
        "kafka": ep.kafka_bootstrap,
        "namespace": f"demo-{uuid.uuid4().hex[:8]}",
        "home": os.path.join(tempfile.gettempdir(), "sfaas-demo"),
        "store": store,
        "minio": ep.minio_endpoint, "minio_access_key": ep.minio_access_key,
        "minio_secret_key": ep.minio_secret_key,
    })
    ok = False
    try:
        print(f"starting a coordinator and 2 workers of examples.bank:app (store: {store}) "
              "...")
        procs = cluster.up(s, "examples.bank:app", 2)
        for p in procs:
            print(f"  {p.role:12} pid {p.pid:<8} {p.address}")
        print(f"  status page  {cluster.status_url(s)}  "
              "(live while the demo runs; metrics: sfaas ps)")
        ok = asyncio.run(_load(s, cluster.cluster_settings(s)[1], seconds, rate, accounts, chaos))
    finally:
        cluster.down(s)
        print("cluster stopped")
        if not keep:
            started = [name for name in ("kafka", "minio")
                       if not before.get(name, {}).get("running")]

            if started:
                services.down(kafka="kafka" in started, minio="minio" in started, progress=False)
                print(f"stopped {', '.join(started)}")
    return 0 if ok else 1


def _kill_a_worker(s: Settings, t0: float, what: dict[str, Any]) -> None:
    workers = [p for p in cluster.ps(s) if p.role == "worker" and p.alive]
    if not workers:
        return
    victim = workers[-1]
    os.kill(victim.pid, signal.SIGKILL)
    what.update(at=time.monotonic(), offset=time.monotonic() - t0, pid=victim.pid)
    tqdm.write(f"  killed worker pid {victim.pid} (SIGKILL) at {what['offset']:.1f} s")


async def _egress_duplicates(cs: Settings, rids: list[str]) -> tuple[int, int]:
    """``(request ids answered more than once, request ids answered)`` in the egress topic,
    read as a Kafka consumer that wants each reply once reads it (``read_committed``). A
    direct call's reply went to its client's channel, not to the topic."""
    from aiokafka import TopicPartition

    from sfaas.runtime.kafka import read_range
    from sfaas.runtime.wire import Reply

    topic = cs.topics("bank")[1]
    # (a worker's last reply transaction commits within reply_commit_ms of its last reply;
    # read_committed sees it only then)
    await asyncio.sleep(cs.reply_commit_ms / 1000 + 0.5)
    raw = await read_range(cs.kafka, {TopicPartition(topic, p): 0 for p in range(cs.partitions)},
                           committed=True)
    seen: dict[str, int] = {}
    for recs in raw.values():
        for _, v in recs:
            rid = Reply.decode(v).rid
            seen[rid] = seen.get(rid, 0) + 1
    return sum(1 for r in rids if seen.get(r, 0) > 1), sum(1 for r in rids if r in seen)


async def _load(s0: Settings, s: Settings, seconds: float, rate: float, accounts: int,
                chaos: bool) -> bool:
    names = [f"acct{i:05d}" for i in range(accounts)]
    async with Client("bank", settings=s, timeout=120) as client:
        print(f"opening {accounts} accounts with {START_BALANCE} each ...")
        for i in range(0, accounts, 500):
            await asyncio.gather(*(client.call("accounts", n, "deposit", START_BALANCE)
                                   for n in names[i:i + 500]))
        rnd = random.Random(42)

        def transfer(i: int) -> tuple[str, str, str, list[object]]:
            a, b = rnd.sample(names, 2)
            return ("accounts", a, "transfer", [b, rnd.randint(1, 2 * START_BALANCE // 3)])

        total = int(rate * seconds)
        print(f"running {total} transfers at {rate:.0f}/s (open loop)"
              + (f", killing a worker at {0.6 * seconds:.1f} s" if chaos else "") + " ...")
        kill: dict[str, Any] = {}
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        timer = loop.call_later(0.6 * seconds, _kill_a_worker, s0, t0, kill) if chaos else None
        with tqdm(total=total, unit="txn", file=sys.stdout, dynamic_ncols=True) as bar:
            res = await run_open_loop(client, transfer, rate, seconds, progress=bar.update,
                                      drain_timeout=60.0)
        if timer is not None:
            timer.cancel()
        balances: list[int] = []
        for i in range(0, accounts, 500):
            balances += await asyncio.gather(*(client.call("accounts", n, "balance")
                                               for n in names[i:i + 500]))
    summary = res.summary()
    conserved = sum(balances) == START_BALANCE * accounts
    nonneg = min(balances) >= 0
    dups, in_topic = await _egress_duplicates(s, res.rids)
    rounds = await asyncio.to_thread(_rounds, s0)
    print()
    if kill:
        gap, gap_at = res.longest_gap(after=kill["at"] - 1.0)
        restarts = sum(p.restarts for p in cluster.ps(s0))
        print(f"  worker killed    at {kill['offset']:.1f} s (pid {kill['pid']}); "
              f"replies stopped for {gap:.1f} s (from {gap_at - t0:.1f} s); "
              f"processes restarted by the supervisor: {restarts}")
    print(f"  committed        {res.committed}")
    print(f"  aborted          {res.aborted}   (insufficient funds: the bank's rule, rolled back)")
    print(f"  lost replies     {res.lost}")
    print(f"  throughput       {summary['committed_tps']:.0f} committed txn/s "
          f"(offered {rate:.0f}/s)")
    print(f"  latency          p50 {summary['p50_ms']:.1f} ms   p99 {summary['p99_ms']:.1f} ms")
    print(f"  total balance    {sum(balances)} (expected {START_BALANCE * accounts}): "
          f"{'conserved' if conserved else 'NOT CONSERVED'}")
    print(f"  negative balance {'none' if nonneg else 'FOUND'}")
    print(f"  egress topic     {in_topic} request ids answered through Kafka, {dups} of them "
          f"more than once; the other {len(res.rids) - in_topic} directly on their channels")
    print(f"  snapshot rounds  {rounds}")
    return conserved and nonneg and res.lost == 0 and dups == 0


def _rounds(s: Settings) -> str:
    from sfaas.runtime.protocols.rounds import Rounds
    from sfaas.runtime.state import rounds_remote

    try:
        r = Rounds(rounds_remote(s, "bank"))
        ids = r.ids()
        if not ids:
            return "none complete yet"
        last = r.read(ids[-1])
        return (f"{ids[-1]} taken (every {s.snapshot_interval:g} s); "
                f"the last at epoch {last.epoch}, {last.bytes_uploaded / 1e6:.2f} MB uploaded, "
                f"published {last.created - last.started:.2f} s after its marker")

    except Exception as exc:
        return f"could not be listed: {exc}"
