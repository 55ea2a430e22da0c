"""What a restarted worker's Kafka clients wait for before its recovery can start (issue 48).

**The reply producer's take-over.** A worker's replies leave in Kafka transactions (``worker.egress``). When a worker dies with
one open, the next process of its slot starts a producer of the same transactional id; the
broker aborts the open transaction and, until the abort is written, answers the new
producer's ``InitProducerId`` with ``CONCURRENT_TRANSACTIONS``. Each such answer costs the
producer one ``retry_backoff_ms``, and the recovery waits for the producer (issue 48).

Each take-over here: a producer made by the runtime's ``make_producer`` begins a
transaction, writes a record to each of 4 partitions and is abandoned with it open (its
connections closed, as a SIGKILL leaves them); a new producer of the same id is started
and timed. Pairs alternate the backoff under test with aiokafka's default (100 ms), in one
sitting; medians per backoff.

**The consumer's first lookups.** A restarted worker's consumer (``make_consumer``, in the
workers' group) asks the end offsets of the egress topic and the epoch log, then the
ingest's committed positions (``worker.membership.Membership.start_clients``,
``worker.ingress.Ingress.start_at_group``). Its first lookup of a topic it does not track,
and its first position before its group's coordinator is known, each fail once and wait a
retry backoff (100 ms). Timed from the started consumer to the last position, in
alternation: cold, and as a worker does (``worker.clients.know_group`` beside the end
offsets).

    python -m benchmarks.runtime.client_starts                 # both, 6 repeats
    python -m benchmarks.runtime.client_starts --backoffs 100 20 10 --repeats 8

Kafka must be running (``sfaas services up``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sfaas.runtime import kafka
from sfaas.runtime.settings import Settings
from worker.clients import know_group

PARTITIONS = 4


def _producer(bootstrap: str, tid: str, backoff_ms: int) -> Any:
    p = kafka.make_producer(bootstrap, transactional_id=tid)
    p._sender._retry_backoff = backoff_ms / 1000  # (the one knob under test)
    return p


async def _take_over(bootstrap: str, topic: str, tid: str, backoff_ms: int) -> float:
    """Seconds the new producer's start took over a transaction left open."""
    old = _producer(bootstrap, tid, kafka.TXN_RETRY_BACKOFF_MS)
    await old.start()
    await old.begin_transaction()
    for p in range(PARTITIONS):
        await old.send_and_wait(topic, b"open", partition=p)
    assert old._sender.sender_task is not None
    old._sender.sender_task.cancel()  # (dead: no abort, no goodbye)
    await old.client.close()
    old._closed = True  # (what it leaves is the broker's to clean up: no "unclosed" warning)
    new = _producer(bootstrap, tid, backoff_ms)
    t0 = time.perf_counter()
    await new.start()
    took = time.perf_counter() - t0
    await new.stop()
    return took


async def _first_lookups(bootstrap: str, topics: list[str], worker: bool) -> float:
    """Seconds from a started consumer to the end offsets of ``topics[:2]`` and the
    positions of ``topics[2]`` (the egress topic, the epoch log, the ingress); ``worker``:
    told as a worker's is."""
    out, log_topic, ingress = topics
    c = kafka.make_consumer(bootstrap, f"{ingress}.group", 10)
    await c.start()
    try:
        t0 = time.perf_counter()
        ins = [TopicPartition(ingress, p) for p in range(PARTITIONS)]
        ends = c.end_offsets([TopicPartition(out, p) for p in range(PARTITIONS)]
                             + [TopicPartition(log_topic, 0)])
        if worker:
            await asyncio.gather(ends, know_group(c, ins[:1]))
        else:
            await ends
        c.assign(ins)
        for tp in ins:
            await c.position(tp)
        return time.perf_counter() - t0
    finally:
        await c.stop()


async def run(bootstrap: str, backoffs: list[int],
              repeats: int) -> tuple[dict[int, list[float]], dict[bool, list[float]]]:
    topic = f"bench-client-starts-{uuid.uuid4().hex[:8]}"
    names = [f"{topic}.out", f"{topic}.epochs", f"{topic}.in"]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, PARTITIONS if t != names[1] else 1, 1)
                                   for t in names])
        await asyncio.sleep(2.0)  # (their leaders elected, as a running cluster's are)
        took: dict[int, list[float]] = {b: [] for b in backoffs}
        lookups: dict[bool, list[float]] = {False: [], True: []}
        for r in range(repeats):
            for b in backoffs:  # (interleaved: the machine's hour is the same for each)
                took[b].append(await _take_over(bootstrap, names[0], f"{topic}-{b}-{r}", b))
            for warm in (False, True):
                lookups[warm].append(await _first_lookups(bootstrap, names, warm))
        return took, lookups
    finally:
        await admin.delete_topics(names)
        await admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backoffs", type=int, nargs="+",
                    default=[kafka.TXN_RETRY_BACKOFF_MS, 100], help="retry_backoff_ms values")
    ap.add_argument("--repeats", type=int, default=6)
    a = ap.parse_args()
    took, lookups = asyncio.run(run(Settings.load().kafka, a.backoffs, a.repeats))
    print("| reply producer's retry_backoff_ms | take-over s (median) | each |")
    print("|---|---|---|")
    for b, xs in took.items():
        print(f"| {b} | **{statistics.median(xs):.3f}** | {', '.join(f'{x:.3f}' for x in xs)} |")
    print()
    print("| consumer's first lookups | s (median) | each |")
    print("|---|---|---|")
    for warm, xs in lookups.items():
        what = "with know_group" if warm else "cold"
        print(f"| {what} | **{statistics.median(xs):.3f}** | {', '.join(f'{x:.3f}' for x in xs)} |")


if __name__ == "__main__":
    main()
