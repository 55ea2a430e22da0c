"""State reads under load: ``Client.get`` latency while the cluster runs 1,000 TPS.

    python -m benchmarks.runtime.reads [--seconds 15] [--rate 1000] [--reads-per-s 50]

One 2-worker cluster (memonly, rounds every 5 s): ``kv.put`` on 10K keys at ``--rate`` from
one client while two other clients read random keys with ``Client.get`` at ``--reads-per-s``
(each read waits for the previous one), taking turns: one reads straight from the owning
worker (``sfaas.reads``, the default), one through Kafka (``direct_reads=False``) — an A/B
pair in one run. Prints the reads' (both paths) and the writes' p50/p99 (the target: read
p50 <= 2 ms) and appends a JSON point to ``--out``.
Needs Kafka and MinIO (``sfaas services up``; started here when down).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.runtime.world_app import on_cluster  # noqa: E402
from launcher.loadgen import percentile, run_open_loop  # noqa: E402
from sfaas.client import Client  # noqa: E402
from sfaas.runtime.settings import Settings  # noqa: E402

HERE = Path(__file__).resolve().parent


async def _run(s: Settings, a: argparse.Namespace) -> dict[str, object]:
    rnd = random.Random(3)
    async with Client("worldbench", settings=s, timeout=60, max_in_flight=20_000) as writer, \
            Client("worldbench", settings=s, timeout=60) as reader, \
            Client("worldbench", settings=s, timeout=60, direct_reads=False) as kafka_reader:
        await run_open_loop(writer, lambda i: ("kv", f"k{i % 10_000}", "put", [i]), a.rate, 5.0)

        async def reads() -> tuple[list[float], list[float]]:
            out: tuple[list[float], list[float]] = ([], [])
            t_end = time.monotonic() + a.seconds
            turn = 0
            while time.monotonic() < t_end:
                t0 = time.perf_counter()
                await (reader, kafka_reader)[turn].get("kv", f"k{rnd.randrange(10_000)}")
                took = time.perf_counter() - t0
                out[turn].append(took * 1000)
                turn ^= 1
                await asyncio.sleep(max(0.0, 1 / a.reads_per_s - took))
            return out

        load = asyncio.create_task(run_open_loop(
            writer, lambda i: ("kv", f"k{rnd.randrange(10_000)}", "put", [i]), a.rate, a.seconds))
        direct, through_kafka = map(sorted, await reads())
        res = await load
        assert reader.direct is not None
        answered_directly = reader.direct.direct
    w = sorted(res.latencies_ms)
    return {"benchmark": "reads", "rate": a.rate, "seconds": a.seconds, "reads": len(direct),
            "answered_directly": answered_directly,
            "read_p50_ms": round(percentile(direct, 0.5), 2),
            "read_p99_ms": round(percentile(direct, 0.99), 2),
            "kafka_read_p50_ms": round(percentile(through_kafka, 0.5), 2),
            "kafka_read_p99_ms": round(percentile(through_kafka, 0.99), 2),
            "write_p50_ms": round(percentile(w, 0.5), 2),
            "write_p99_ms": round(percentile(w, 0.99), 2), "writes_committed": res.committed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--reads-per-s", type=float, default=50.0)
    ap.add_argument("--kafka", default=os.environ.get("SFAAS_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--out", default=str(HERE / "reads.jsonl"))
    a = ap.parse_args(argv)
    if a.seconds <= 0 or a.rate <= 0 or a.reads_per_s <= 0:
        ap.error("--seconds, --rate and --reads-per-s must be positive")
    point, probe = on_cluster("rd", a.kafka, lambda s: _run(s, a))
    point.update({**probe, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    print(json.dumps(point), flush=True)
    with open(a.out, "a") as f:
        f.write(json.dumps(point) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
