"""The Kafka client's floor: CPU per record of one hop (a produce, a fetch) at a fixed rate.

No sfaas process runs: a producer made by the runtime's own ``make_producer`` (the client's:
``acks=1``; the workers': ``durable``, ``acks=all`` and idempotent) writes ``--rate`` small
records a second to a fresh one-partition topic, ``k`` at a time (one produce request each:
the ``k`` records are appended in one turn of the event loop), and two readers in their
own processes read them as they come:

- ``aiokafka``: the runtime's ``make_consumer`` (as a worker's ingress and the client's
  replies), ``getmany`` in a loop;
- ``raw``: one ``FetchRequest`` at a time on aiokafka's connection, its records read with
  aiokafka's C batch reader — what a reader costs without aiokafka's fetcher and its
  record objects.

A third producer, ``raw``, builds each request by hand (aiokafka's C batch builder, one
``ProduceRequest`` on its connection, ``acks=1``): what a producer costs without aiokafka's
accumulator, sender and per-record futures.

Each process's CPU (user and system, ``getrusage``) over the measured part is divided by
the records it handled. This is what the runtime pays per Kafka request at low load: at
1,000 TPS a transaction costs the client and the workers about 3.5 requests
(``broker_requests.py``), each carrying one or two records.

    python benchmarks/runtime/kafka_floor.py                 # k = 1, 2, 4, 8; 1,000 records/s
    python benchmarks/runtime/kafka_floor.py --k 1 --seconds 20 --rate 1000

Kafka must be running (``sfaas services up``). Prints a table; ``--out`` appends JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sfaas.runtime.kafka import ensure_topics, make_consumer, make_producer  # noqa: E402

BOOT = os.environ.get("SFAAS_KAFKA", "127.0.0.1:9092")
VALUE = b"x" * 100  # about a YCSB-T request's size


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def _per_record(c0: tuple[float, float], n: int) -> dict[str, float]:
    c1 = _cpu()
    return {"user_us": round((c1[0] - c0[0]) / n * 1e6, 1), "sys_us": round((c1[1] - c0[1]) / n * 1e6, 1)}


async def _open_loop(rate: float, n: int, k: int,
                     send: Callable[[], Awaitable[list[Awaitable[object]]]]) -> tuple[float, float]:
    """Call ``send`` (``k`` records) every ``k / rate`` s until ``n`` records went, then wait
    for what each call returned; the CPU when the sending began."""
    t0, c0 = time.perf_counter(), _cpu()
    acks: list[Awaitable[object]] = []
    for i in range(0, n, k):
        wait = t0 + i / rate - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        acks += await send()
    await asyncio.gather(*acks)
    return c0


async def produce(topic: str, rate: float, n: int, k: int, durable: bool) -> dict:
    """Send ``n`` records, ``k`` per request, open loop; CPU per record."""
    p = make_producer(BOOT, durable=durable)
    await p.start()
    try:
        await p.send_and_wait(topic, b"warm", partition=0)
        await asyncio.sleep(1.0)  # the readers see the first record and start measuring

        async def send() -> list[Awaitable[object]]:
            return [await p.send(topic, VALUE, partition=0) for _ in range(k)]

        c0 = await _open_loop(rate, n, k, send)
        return {"role": "produce", "records": n, **_per_record(c0, n)}
    finally:
        await p.stop()


async def produce_raw(topic: str, rate: float, n: int, k: int) -> dict:
    """The same sends as :func:`produce` (``acks=1``), each request built by hand: a record
    batch from aiokafka's C builder in one ``ProduceRequest`` on its connection."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.produce import ProduceRequest
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    from aiokafka.structs import TopicPartition

    c = AIOKafkaClient(bootstrap_servers=BOOT)
    await c.bootstrap()
    try:
        await c._wait_on_metadata(topic)
        node = c.cluster.leader_for_partition(TopicPartition(topic, 0))

        async def send(values: list[bytes]) -> None:
            b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, 0, 1 << 20)
            now = int(time.time() * 1000)
            for i, v in enumerate(values):
                b.append(i, now, None, v, [])
            resp = await c.send(node, ProduceRequest(None, 1, 30000, [(topic, [(0, bytes(b.build()))])]))
            for _t, parts in resp.topics:
                for _p, err, *_ in parts:
                    if err:
                        raise SystemExit(f"produce failed with Kafka error {err}")

        await send([b"warm"])
        await asyncio.sleep(1.0)

        async def send_k() -> list[Awaitable[object]]:
            return [asyncio.ensure_future(send([VALUE] * k))]  # (requests in flight at once)

        c0 = await _open_loop(rate, n, k, send_k)
        return {"role": "produce raw", "records": n, **_per_record(c0, n)}
    finally:
        await c.close()


async def read_aiokafka(topic: str, n: int) -> dict:
    from aiokafka import TopicPartition

    c = make_consumer(BOOT, None, 500)
    await c.start()
    try:
        c.assign([TopicPartition(topic, 0)])
        got, c0, quiet = 0, None, 0
        while got < n:
            batch = await c.getmany(timeout_ms=2000)
            quiet = 0 if batch else quiet + 1
            if quiet > 15:
                raise SystemExit(f"{topic}: no record for 30 s, {got} of {n} read")
            if c0 is None and batch:
                c0 = _cpu()  # (from the first batch: the warm-up record, then the measured ones)
            for recs in batch.values():
                got += sum(1 for r in recs if r.value != b"warm")
        assert c0 is not None
        return {"role": "read aiokafka", "records": n, **_per_record(c0, n)}
    finally:
        await c.stop()


async def read_raw(topic: str, n: int) -> dict:
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.fetch import FetchRequest
    from aiokafka.record.memory_records import MemoryRecords
    from aiokafka.structs import TopicPartition

    c = AIOKafkaClient(bootstrap_servers=BOOT)
    await c.bootstrap()
    try:
        await c._wait_on_metadata(topic)
        node = c.cluster.leader_for_partition(TopicPartition(topic, 0))
        offset, got, c0, requests, quiet = 0, 0, None, 0, 0
        while got < n:
            resp = await c.send(node, FetchRequest(500, 1, 1 << 20, 0, [(topic, [(0, offset, 1 << 20)])]))
            requests += 1
            seen = 0
            for _t, parts in resp.topics:
                for _p, err, _hw, *data in parts:
                    if err:
                        raise SystemExit(f"fetch failed with Kafka error {err}")
                    records = MemoryRecords(data[-1])
                    while (b := records.next_batch()) is not None:
                        for r in b:
                            offset = r.offset + 1
                            seen += 1
                            got += r.value != b"warm"
            quiet = 0 if seen else quiet + 1
            if quiet > 60:
                raise SystemExit(f"{topic}: no record for 30 s, {got} of {n} read")
            if c0 is None and seen:
                c0, requests = _cpu(), 0  # (from the first batch, as read_aiokafka)
        assert c0 is not None
        return {"role": "read raw", "records": n, "requests": requests, **_per_record(c0, n)}
    finally:
        await c.close()


def one(rate: float, seconds: float, k: int, durable: bool, raw: bool = False) -> list[dict]:
    topic = f"floor-{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topics(BOOT, {topic: 1}))
    n = int(rate * seconds) // k * k
    readers = [subprocess.Popen([sys.executable, __file__, "--read", kind, topic, str(n)],
                                stdout=subprocess.PIPE, text=True) for kind in ("aiokafka", "raw")]
    time.sleep(3.0)  # both readers connected and polling
    if raw:
        rows = [asyncio.run(produce_raw(topic, rate, n, k))]
    else:
        rows = [asyncio.run(produce(topic, rate, n, k, durable))]
    for r in readers:
        out, _ = r.communicate(timeout=seconds + 60)
        if r.returncode != 0:
            raise SystemExit(f"a reader of {topic} failed (exit {r.returncode})")
        rows.append(json.loads(out))
    for row in rows:
        row.update(k=k, rate=rate, durable=durable, raw_producer=raw, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return rows


def _cell(r: dict) -> str:
    return f"{r['user_us'] + r['sys_us']:.0f} ({r['user_us']:.0f} + {r['sys_us']:.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="records a second")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--k", default="1,2,4,8", help="records per produce request")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    ap.add_argument("--read", nargs=3, help=argparse.SUPPRESS)  # (a reader process)
    a = ap.parse_args()
    if a.read:
        kind, topic, n = a.read
        reader = read_aiokafka if kind == "aiokafka" else read_raw
        print(json.dumps(asyncio.run(reader(topic, int(n)))))
        return
    print("| k (records per request) | producer | produce µs/record (user + sys) | aiokafka reader µs/record "
          "| raw reader µs/record (requests per record) |")
    print("|---|---|---|---|---|")
    for k in [int(x) for x in a.k.split(",")]:
        for durable, raw in ((False, False), (True, False), (False, True)):
            rows = one(a.rate, a.seconds, k, durable, raw)
            if a.out:
                with a.out.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
            p, ak, rr = rows
            who = "raw (acks=1)" if raw else "workers (acks=all, idempotent)" if durable else "client (acks=1)"
            print(f"| {k} | {who} | {_cell(p)} | "
                  f"{_cell(ak)} | {_cell(rr)} ({rr['requests'] / rr['records']:.2f}) |", flush=True)


if __name__ == "__main__":
    main()
