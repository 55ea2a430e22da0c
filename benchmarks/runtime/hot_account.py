"""One hot account: N concurrent transfers out of it into M others, on a real 2-worker cluster.

Every transfer withdraws from the same key and deposits into one of ``--to`` others (on
both workers), so every one of them conflicts with every other in its epoch. Measures
committed transfers per second from the first request sent to the last reply, checks the
result is exact (every transfer committed once, the hot account holds what is left, money
conserved), and appends a JSON point to ``--out``.

    python -m benchmarks.runtime.hot_account --fallback cross     # the default
    python -m benchmarks.runtime.hot_account --fallback local     # the phase before 16341c2

Needs Kafka and MinIO (``sfaas services up``; started here when down).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.runtime.bench import _reruns, cleanup, machine_probe  # noqa: E402
from launcher import cluster, services  # noqa: E402
from sfaas.client import Client  # noqa: E402
from sfaas.runtime.settings import Settings  # noqa: E402

HERE = Path(__file__).resolve().parent


async def _drive(s: Settings, transfers: int, targets: int, amount: int) -> dict[str, object]:
    async with Client("bank", settings=s, timeout=300, max_in_flight=transfers + 10) as c:
        start = transfers * amount
        await c.call("accounts", "hot", "deposit", start)
        t0 = time.perf_counter()
        futs = [await c.submit("accounts", "hot", "transfer", f"to-{i % targets}", amount) for i in range(transfers)]
        replies = await asyncio.gather(*futs)
        seconds = time.perf_counter() - t0
        failed = [r for r in replies if not r.ok]
        hot = await c.call("accounts", "hot", "balance")
        others = await asyncio.gather(*(c.call("accounts", f"to-{i}", "balance") for i in range(targets)))
    exact = not failed and hot == 0 and sum(others) == start
    return {"committed": len(replies) - len(failed), "failed": len(failed), "seconds": round(seconds, 3),
            "committed_per_s": round((len(replies) - len(failed)) / seconds, 1), "exact": exact,
            "hot_left": hot, "others_sum": sum(others)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transfers", type=int, default=3000)
    ap.add_argument("--to", dest="targets", type=int, default=200, help="accounts the transfers go to")
    ap.add_argument("--fallback", choices=["cross", "local", "0"], default="cross")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--kafka", default=os.environ.get("SFAAS_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(HERE / "hot_account.jsonl"))
    a = ap.parse_args(argv)
    if a.transfers < 1 or a.targets < 1:
        ap.error("--transfers and --to must be >= 1")
    services.up(progress=False)
    os.environ.update({"SFAAS_STORE": "memonly", "SFAAS_FALLBACK": a.fallback})  # the workers inherit it
    s = Settings.load({"namespace": f"hot{uuid.uuid4().hex[:8]}", "partitions": a.partitions, "store": "memonly",
                       "kafka": a.kafka, "snapshot_interval": 5.0})
    probe = machine_probe()
    cluster.up(s, "examples.bank:app", 2, timeout=120)
    try:
        point = asyncio.run(_drive(s, a.transfers, a.targets, 1))
    finally:
        cluster.down(s)
    point.update({"reruns_per_txn": _reruns(s), "transfers": a.transfers, "targets": a.targets,
                  "fallback": a.fallback, "label": a.label, **probe,
                  "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    cleanup(s, app="bank")
    print(json.dumps(point), flush=True)
    with open(a.out, "a") as f:
        f.write(json.dumps(point) + "\n")
    return 0 if point["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
