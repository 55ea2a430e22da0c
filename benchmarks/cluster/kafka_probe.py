"""Does the HA profile's Kafka lose acknowledged records when a leader is cut off or stopped,
and what do its clients see? Kafka alone (docker-compose.ha.yml's three brokers: RF 3,
min ISR 2), under the runtime's own aiokafka clients — no sfaas process runs.

    python -m benchmarks.cluster.kafka_probe [--seed 1] [--faults cut cut stop cut stop]

A producer (``make_producer(durable=True)``: acks=all, idempotent) writes numbered records
to 4 partitions; a consumer (``make_consumer``, as ingest's) reads them and reports every
time it goes *back* (a position reset after "out of range"); every second ``read_range``
(the recovery's reader) reads the last ~300 records of each partition and reports any it
skipped or stopped short of. Meanwhile one fault at a time hits a broker that leads some
partition: ``cut`` disconnects it from the network for 3–7 s (healed with the same address
and names, ``Compose.cut``), ``stop`` stops it as long. At the end every partition is read
again from the start and checked against every acknowledged record and every record the
consumer saw. Prints one JSON line; the findings of 2026-11-27 are in benchmarks/README.md
("The HA cluster's Kafka under faults").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient  # noqa: E402

from launcher import containers  # noqa: E402
from launcher.compose_project import ROOT, Compose, compose  # noqa: E402
from launcher.procs import ServiceSettings  # noqa: E402
from sfaas.runtime.kafka import ensure_topics, make_consumer, make_producer, read_range  # noqa: E402

TOPIC, PARTS = "probe", 4
BROKERS = ["kafka-1", "kafka-2", "kafka-3"]


async def _leaders(boot: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=boot)
    await admin.start()
    try:
        d = await admin.describe_topics([TOPIC])
        return {p["partition"]: p["leader"] for p in d[0]["partitions"]}
    finally:
        await admin.close()


async def _read_all(boot: str, tps: list[TopicPartition]) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    rc = AIOKafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False,
                          auto_offset_reset="earliest")
    await rc.start()
    try:
        rc.assign(tps)
        ends = await rc.end_offsets(tps)
        for tp in tps:
            rc.seek(tp, 0)
        while [tp for tp in tps if await rc.position(tp) < ends[tp]]:
            for tp, recs in (await rc.getmany(timeout_ms=500)).items():
                out.update({(tp.partition, r.offset): r.value for r in recs})
    finally:
        await rc.stop()
    return out


async def probe(c: Compose, seed: int, faults: list[str]) -> dict[str, Any]:
    rnd = random.Random(seed)
    boot = c.kafka()
    acked: dict[tuple[int, int], bytes] = {}
    seen: dict[tuple[int, int], bytes] = {}
    report: dict[str, Any] = {"seed": seed, "faults": [], "rewinds": [], "send_errors": {},
                              "reads": {"calls": 0, "skipped": 0, "short": 0, "failed": 0}}
    for _ in range(60):
        try:
            await ensure_topics(boot, {TOPIC: PARTS}, 3)
            break
        except Exception as exc:  # (brokers still starting)
            print(f"waiting for the brokers: {exc}", flush=True)
            await asyncio.sleep(2)
    producer = make_producer(boot, 0, durable=True)
    consumer = make_consumer(boot, None, 5)
    await producer.start()
    await consumer.start()
    tps = [TopicPartition(TOPIC, p) for p in range(PARTS)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    stop = asyncio.Event()

    async def produce() -> None:
        n = 0
        in_flight: set[asyncio.Future[Any]] = set()
        while not stop.is_set():
            value = str(n).encode()
            n += 1
            try:
                fut = await producer.send(TOPIC, value, partition=n % PARTS)
            except Exception as exc:
                kind = type(exc).__name__
                report["send_errors"][kind] = report["send_errors"].get(kind, 0) + 1
                await asyncio.sleep(0.1)
                continue

            def done(f: asyncio.Future[Any], value: bytes = value) -> None:
                if f.cancelled():
                    return
                if f.exception() is not None:
                    kind = type(f.exception()).__name__
                    report["send_errors"][kind] = report["send_errors"].get(kind, 0) + 1
                    return
                acked[(f.result().partition, f.result().offset)] = value
            fut.add_done_callback(done)
            in_flight = {f for f in in_flight | {fut} if not f.done()}
            while len(in_flight) > 500:
                await asyncio.sleep(0.01)
                in_flight = {f for f in in_flight if not f.done()}
            await asyncio.sleep(0.002)

    async def consume() -> None:
        last = {p: -1 for p in range(PARTS)}
        while not stop.is_set():
            for tp, recs in (await consumer.getmany(timeout_ms=100)).items():
                for r in recs:
                    if r.offset <= last[tp.partition]:
                        report["rewinds"].append([round(time.time(), 2), tp.partition,
                                                  last[tp.partition], r.offset])
                    last[tp.partition] = r.offset
                    seen[(tp.partition, r.offset)] = r.value

    async def reads() -> None:
        r = report["reads"]
        while not stop.is_set():
            await asyncio.sleep(1.0)
            known: dict[int, int] = {}
            for part, off in list(acked):
                known[part] = max(known.get(part, -1), off)
            starts = {TopicPartition(TOPIC, q): max(0, known.get(q, 0) - 300)
                      for q in range(PARTS)}
            try:
                got = await read_range(boot, starts)
            except Exception as exc:
                r["failed"] += 1
                print(f"read_range failed: {exc}", flush=True)
                continue
            r["calls"] += 1
            for q in range(PARTS):
                offs = [o for o, _ in got[q]]
                have = set(offs)
                missing = [o for o in range(starts[tps[q]], known.get(q, -1) + 1)
                           if o not in have]
                if missing:
                    r["skipped" if offs and missing[0] < offs[-1] else "short"] += 1

    tasks = [asyncio.create_task(f()) for f in (produce, consume, reads)]
    try:
        await asyncio.sleep(8)
        for fault in faults:
            victim = f"kafka-{rnd.choice(sorted(set((await _leaders(boot)).values())))}"
            seconds = rnd.uniform(3, 7)
            print(f"{time.strftime('%X')} {fault} {victim} for {seconds:.1f} s "
                  f"({len(acked)} acknowledged so far)", flush=True)
            report["faults"].append([fault, victim, round(seconds, 1)])
            if fault == "cut":
                heal = await asyncio.to_thread(c.cut, victim, "data")
                await asyncio.sleep(seconds)
                await asyncio.to_thread(c.docker, *heal)
            else:
                await asyncio.to_thread(c.run, "stop", "-t", "2", victim)
                await asyncio.sleep(seconds)
                await asyncio.to_thread(c.run, "start", victim)
            await asyncio.sleep(rnd.uniform(6, 10))
        await asyncio.sleep(5)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await producer.stop()
        await consumer.stop()
    final = await _read_all(boot, tps)
    report.update({
        "acknowledged": len(acked), "consumed": len(seen), "in_kafka": len(final),
        "acknowledged_missing": sorted(k for k, v in acked.items() if final.get(k) != v)[:10],
        "consumed_missing": sorted(k for k, v in seen.items() if final.get(k) != v)[:10],
        "values_twice": len(final) - len(set(final.values())),
    })
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults", nargs="*", default=["cut", "cut", "stop", "cut", "stop"],
                   choices=["cut", "stop"])
    a = p.parse_args()
    cache = ServiceSettings.from_env().cache_dir
    daemon = containers.ensure_docker(cache)
    try:
        containers.build_images(cache, only=["kafka"])
        with compose([ROOT / "docker-compose.ha.yml"], kafka_brokers=3, services=BROKERS) as c:
            print(json.dumps(asyncio.run(probe(c, a.seed, a.faults))), flush=True)
    finally:
        if daemon is not None:
            containers.stop_docker(daemon)


if __name__ == "__main__":
    main()
