"""Kafka plumbing shared by coordinator, workers and clients (aiokafka)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from sfaas.errors import ClusterError

log = logging.getLogger("sfaas.runtime.kafka")

__all__ = [
    "ensure_topics", "make_producer", "make_consumer", "consumer_group", "partition_count",
    "read_range",
]


async def ensure_topics(bootstrap: str, topics: dict[str, int], replication: int = 1,
                        ) -> dict[str, int]:
    """Create the ``topic → partitions`` that do not exist (each partition on
    ``replication`` brokers); return the actual partition counts."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(t, n, replication) for t, n in topics.items() if t not in existing]
        if new:
            try:
                await admin.create_topics(new)
                log.info("created topics %s", [t.name for t in new])
            except TopicAlreadyExistsError:
                pass
        # metadata of a just-created topic can lag: ask until every topic has partitions
        deadline = asyncio.get_running_loop().time() + 30.0
        while True:
            described = await admin.describe_topics(list(topics))
            counts = {d["topic"]: len(d["partitions"] or []) for d in described}
            if all(counts.get(t, 0) > 0 for t in topics) \
                    or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
    for t, n in topics.items():
        if counts.get(t, 0) == 0:
            raise ClusterError(f"topic {t} has no partitions after creation")
        if counts[t] != n:
            log.warning("topic %s exists with %d partitions (wanted %d); using %d",
                        t, counts[t], n, counts[t])
    return counts


#: Bytes of one partition's batch a producer holds; a send waits while that batch is full.
PRODUCE_BATCH_BYTES = 1 << 20
#: Bytes a consumer prefetches per partition, and per fetch in all: it fetches again for a
#: partition only once its records were taken, so what is not taken stays in Kafka. (4 and
#: 16 MiB made a worker's memory grow by a quarter under overload; these commit as much.)
FETCH_PARTITION_BYTES = 256 << 10
FETCH_BYTES = 1 << 20
#: How often producers and consumers refresh the cluster's metadata. aiokafka retries a
#: request to a broker it cannot reach without looking for the partition's new leader
#: (``NodeNotReadyError`` is not an "invalid metadata" error), so a lost broker's partitions
#: are found elsewhere only at the next refresh (measured: a broker stopped for 10 s held
#: replies for 13 s with aiokafka's default of 5 minutes). With several brokers (a list of
#: bootstrap servers) every 0.5 s: a broker loss then costs the brokers' session timeout
#: (deploy/images/kafka-entry.sh) plus at most this; a lone broker has no other leader to
#: find, its clients refresh every 2 s.
METADATA_MAX_AGE_MS = 500
METADATA_MAX_AGE_ONE_BROKER_MS = 2000


def metadata_max_age_ms(bootstrap: str) -> int:
    """The metadata refresh interval of clients of ``bootstrap`` (see above)."""
    return METADATA_MAX_AGE_MS if "," in bootstrap else METADATA_MAX_AGE_ONE_BROKER_MS


def make_producer(bootstrap: str, linger_ms: int = 0, *, durable: bool = False) -> AIOKafkaProducer:
    """A producer tuned for low latency with batching under load.

    ``durable`` (workers: replies and the epoch log): ``acks=all`` and idempotence, so an
    acknowledged record survives a broker failover and a retried send is never duplicated.
    """
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=linger_ms,
        acks="all" if durable else 1,
        enable_idempotence=durable,
        max_batch_size=PRODUCE_BATCH_BYTES,
        request_timeout_ms=30000,
        metadata_max_age_ms=metadata_max_age_ms(bootstrap),
    )


def consumer_group(settings: Any, app: str) -> str:
    """The consumer group of ``app``'s workers (offsets of their ingress partitions)."""
    return f"{settings.namespace}.{app}.workers"


def make_consumer(bootstrap: str, group: str | None, fetch_wait_ms: int) -> AIOKafkaConsumer:
    """A manually assigned consumer (no rebalancing) with a short fetch wait."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=fetch_wait_ms,
        max_partition_fetch_bytes=FETCH_PARTITION_BYTES,
        fetch_max_bytes=FETCH_BYTES,
        metadata_max_age_ms=metadata_max_age_ms(bootstrap),
    )


async def partition_count(producer: AIOKafkaProducer, topic: str, timeout: float = 30.0) -> int:
    """Partitions of ``topic``, waiting (up to ``timeout``) for the runtime to create it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            parts = await producer.partitions_for(topic)
            if parts:
                return len(parts)
        except Exception as exc:  # unknown topic while the coordinator is still starting
            log.debug("waiting for topic %s: %s", topic, exc)
        if asyncio.get_running_loop().time() > deadline:
            raise ClusterError(f"topic {topic} does not exist; is the coordinator running?")
        await asyncio.sleep(0.2)


async def read_range(
    bootstrap: str, starts: dict[TopicPartition, int]
) -> dict[int, list[tuple[int, bytes]]]:
    """Records of each partition from its start offset to its end now:
    partition → [(offset, value)]."""
    out: dict[int, list[tuple[int, bytes]]] = {tp.partition: [] for tp in starts}
    if not starts:
        return out
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False,
        max_partition_fetch_bytes=FETCH_PARTITION_BYTES, fetch_max_wait_ms=50)
    await consumer.start()
    try:
        tps = list(starts)
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, starts[tp])
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                out[tp.partition] += [(r.offset, r.value) for r in records if r.offset < ends[tp]]
    finally:
        await consumer.stop()
    return out
