"""Does a slow ``ctx.run`` effect stall other transactions? The p99 of unrelated requests
at 1,000 TPS with and without transactions whose effect sleeps 3 s, in one run.

    python -m benchmarks.runtime.effect_stall [--pairs 3] [--seconds 15] [--rate 1000]

One 2-worker cluster (memonly, rounds every 5 s) runs ``kv.put`` on random keys at
``--rate`` for ``--seconds`` per phase; in the *with* phases ``--slow-rate`` transactions
per second also run ``slow.pay``, whose effect sleeps 3 s (so ~3 × slow-rate of them are
parked at any time). Phases alternate without/with (``--pairs`` pairs, after a warm-up);
prints each phase's p50/p99 of the unrelated requests and the median over pairs of the
p99 difference (the target: at most 20 ms). Appends a JSON point to ``--out``.
Needs Kafka and MinIO (``sfaas services up``; started here when down).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.runtime.world_app import on_cluster  # noqa: E402
from launcher.loadgen import percentile, run_open_loop  # noqa: E402
from sfaas.client import Client  # noqa: E402
from sfaas.runtime.settings import Settings  # noqa: E402

HERE = Path(__file__).resolve().parent


async def _phase(c: Client, rate: float, seconds: float, slow_rate: float,
                 rnd: random.Random) -> dict[str, float]:
    slow: list[asyncio.Future[object]] = []

    async def slow_stream() -> None:
        for _ in range(int(slow_rate * seconds)):
            await asyncio.sleep(1 / slow_rate)
            slow.append(await c.submit("slow", f"s{uuid.uuid4().hex[:8]}", "pay"))

    feeder = asyncio.create_task(slow_stream()) if slow_rate > 0 else None
    res = await run_open_loop(c, lambda i: ("kv", f"k{rnd.randrange(10_000)}", "put", [i]),
                              rate, seconds)
    if feeder is not None:
        await feeder
    slow_ok = sum(1 for r in await asyncio.gather(*slow) if getattr(r, "ok", False))
    lat = sorted(res.latencies_ms)
    return {"p50_ms": round(percentile(lat, 0.5), 2), "p99_ms": round(percentile(lat, 0.99), 2),
            "committed": res.committed, "lost": res.lost, "slow_committed": slow_ok,
            "slow_sent": len(slow)}


async def _run(s: Settings, a: argparse.Namespace) -> list[dict[str, object]]:
    rnd = random.Random(7)
    out: list[dict[str, object]] = []
    async with Client("worldbench", settings=s, timeout=120, max_in_flight=20_000) as c:
        await _phase(c, a.rate, 5.0, 0, rnd)  # warm-up
        for pair in range(a.pairs):
            for with_slow in (False, True):
                point = await _phase(c, a.rate, a.seconds, a.slow_rate if with_slow else 0, rnd)
                point.update({"pair": pair, "with_slow_effects": with_slow})
                print(json.dumps(point), flush=True)
                out.append(point)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--slow-rate", type=float, default=5.0,
                    help="transactions per second whose effect sleeps 3 s, in the with phases")
    ap.add_argument("--kafka", default=os.environ.get("SFAAS_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--out", default=str(HERE / "effect_stall.jsonl"))
    a = ap.parse_args(argv)
    if a.pairs < 1 or a.seconds <= 0 or a.rate <= 0 or a.slow_rate <= 0:
        ap.error("--pairs, --seconds, --rate and --slow-rate must be positive")
    points, probe = on_cluster("fx", a.kafka, lambda s: _run(s, a))
    diffs = [float(w["p99_ms"]) - float(wo["p99_ms"])  # type: ignore[arg-type]
             for wo, w in zip(points[::2], points[1::2], strict=True)]
    summary = {"benchmark": "effect_stall", "pairs": a.pairs, "seconds": a.seconds,
               "rate": a.rate, "slow_rate": a.slow_rate, "phases": points,
               "p99_added_ms": [round(d, 2) for d in diffs],
               "p99_added_median_ms": round(statistics.median(diffs), 2), **probe,
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"p99 added by the slow effects: {summary['p99_added_ms']} ms per pair, median "
          f"{summary['p99_added_median_ms']} ms (target <= 20 ms)")
    with open(a.out, "a") as f:
        f.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
