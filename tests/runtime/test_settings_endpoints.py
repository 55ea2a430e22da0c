"""``SFAAS_KAFKA`` and ``SFAAS_MINIO`` take lists (an HA Kafka and a distributed MinIO):
validation names the bad entry, and the list reaches the Kafka and MinIO clients."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from launcher.cluster import free_port
from launcher.services import Endpoints
from sfaas.errors import ConfigError
from sfaas.runtime.settings import Settings
from tests.namespaces import fresh_namespace


@pytest.mark.parametrize("name", ["kafka", "minio"])
def test_a_comma_separated_list_is_accepted(name: str) -> None:
    value = "h1.example:9092,10.0.0.2:9092,[::1]:9092"
    s = Settings.load(env={f"SFAAS_{name.upper()}": value})
    assert getattr(s, name) == value
    entries = s.kafka_servers() if name == "kafka" else s.minio_endpoints()
    assert entries == ["h1.example:9092", "10.0.0.2:9092", "[::1]:9092"]
    assert s.as_env()[f"SFAAS_{name.upper()}"] == value  # children get the same list


@pytest.mark.parametrize("name", ["kafka", "minio"])
@pytest.mark.parametrize("value, says", [
    ("h1:9092,h2,h3:9092", "entry 2 of 3 ('h2') is not host:port"),
    ("h1:9092,h2:99999", "entry 2 of 2 ('h2:99999') is not host:port with a port 1-65535"),
    ("h1:9092,h2:x", "entry 2 of 2 ('h2:x')"),
    ("h1:9092,,h3:9092", "entry 2 of 3 ('') is empty"),
    ("h1:9092,", "entry 2 of 2 ('') is empty"),
    (",h1:9092", "entry 1 of 2 ('') is empty"),
    ("h1:9092, h2:9092", "entry 2 of 2 (' h2:9092') has blanks"),
    ("h1:9092 ,h2:9092", "entry 1 of 2 ('h1:9092 ') has blanks"),
    (" h1:9092", "(' h1:9092') has blanks"),
    ("h1:9092,h2 x:9092", "entry 2 of 2 ('h2 x:9092') has blanks"),
    ("h1:9092,h1:9092", "entry 2 of 2 ('h1:9092') is listed twice"),
    ("h1:9092,h2:9092/path", "entry 2 of 2"),
])
def test_a_bad_entry_is_named(name: str, value: str, says: str) -> None:
    if name == "minio" and value == "h1:9092,h2,h3:9092":
        value, says = "h1:9092,h2:,h3:9092", "entry 2 of 3 ('h2:') is not host:port"
    with pytest.raises(ConfigError, match=f"^{name} {re.escape(says)}") as err:
        Settings.load({name: value})
    assert "without blanks (h1:1234,h2:1234)" in str(err.value)  # says what is expected
    with pytest.raises(ConfigError, match=f"^{name} {re.escape(says)}"):
        Settings.load(env={f"SFAAS_{name.upper()}": value})


def test_minio_entries_may_have_one_scheme_and_no_port() -> None:
    s = Settings.load({"minio": "https://m1:9000,https://m2:9000,https://m3"})
    assert s.minio_endpoints() == ["https://m1:9000", "https://m2:9000", "https://m3"]
    with pytest.raises(ConfigError, match="same scheme"):
        Settings.load({"minio": "https://m1:9000,m2:9000"})
    with pytest.raises(ConfigError, match=re.escape("kafka entry 2 of 2 ('k2') is not host:port")):
        Settings.load({"kafka": "k1:9092,k2"})  # Kafka needs the port


def test_the_minio_list_reaches_the_store_remotes() -> None:
    from sfaas.runtime.state import rounds_remote, store_remote

    s = Settings.load({"minio": "m1:9000,m2:9000,m3:9000,m4:9000"})
    for remote in (store_remote(s, "app", "op", 0), rounds_remote(s, "app")):
        assert remote.endpoints == ("m1:9000", "m2:9000", "m3:9000", "m4:9000")  # type: ignore[attr-defined]


def test_a_kafka_list_with_dead_brokers_reaches_every_kafka_client(kafka: Endpoints) -> None:
    from coordinator.startup import epoch_log_used
    from sfaas.runtime.kafka import ensure_topics, make_consumer, make_producer, read_range

    dead = [free_port("127.0.0.1") for _ in range(2)]
    listed = f"127.0.0.1:{dead[0]},{kafka.kafka_bootstrap},127.0.0.1:{dead[1]}"
    s = Settings.load({"kafka": listed, "namespace": fresh_namespace()})
    topic = s.topics("eps")[0]

    async def use() -> None:
        assert await ensure_topics(s.kafka, {topic: 2}) == {topic: 2}  # admin client
        producer = make_producer(s.kafka, s.linger_ms, durable=True)
        await producer.start()
        try:
            for i in range(4):
                await producer.send_and_wait(topic, f"v{i}".encode(), partition=i % 2)
        finally:
            await producer.stop()
        got = await read_range(s.kafka, {TopicPartition(topic, p): 0 for p in (0, 1)})
        assert sorted(v for recs in got.values() for _, v in recs) == [b"v0", b"v1", b"v2", b"v3"]
        consumer = make_consumer(s.kafka, f"{s.namespace}.eps.g", s.fetch_wait_ms)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            batch = await consumer.getmany(timeout_ms=5000)
            assert [r.value for recs in batch.values() for r in recs] == [b"v0", b"v2"]
        finally:
            await consumer.stop()
        assert await epoch_log_used(s.kafka, topic)  # the coordinator's own consumer

    asyncio.run(asyncio.wait_for(use(), 60))


@pytest.mark.timeout(300)
def test_a_cluster_runs_and_snapshots_with_a_dead_entry_in_each_list(
        kafka: Endpoints, minio: Endpoints, tmp_path: Path) -> None:
    """``sfaas up`` hands both lists to its processes; a dead broker and a dead MinIO node
    listed FIRST change nothing: calls work and snapshot rounds get published."""
    from launcher import cluster
    from sfaas.client import Client
    from sfaas.runtime.protocols.rounds import Rounds
    from sfaas.runtime.state import rounds_remote, store_remote
    from tests.conftest import TEST_BUCKET
    from tests.runtime.apps import ledger

    dead = [free_port("127.0.0.1") for _ in range(2)]
    s = Settings.load({
        "kafka": f"127.0.0.1:{dead[0]},{kafka.kafka_bootstrap}",
        "minio": f"127.0.0.1:{dead[1]},{minio.minio_endpoint}",
        "minio_access_key": minio.minio_access_key, "minio_secret_key": minio.minio_secret_key,
        "bucket": TEST_BUCKET, "namespace": fresh_namespace(), "home": str(tmp_path),
        "store": "lsm", "partitions": 2, "snapshot_interval": 0.5,
    })
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        client_settings = cluster.cluster_settings(s)[1]
        assert client_settings.kafka == s.kafka

        async def calls() -> list[int]:
            async with Client("ledger", settings=client_settings) as c:
                return [await c.call("accounts", f"a{i}", "deposit", 5) for i in range(4)]

        assert asyncio.run(asyncio.wait_for(calls(), 60)) == [5, 5, 5, 5]
        rounds = Rounds(rounds_remote(s, "ledger"))
        deadline = time.monotonic() + 60
        while not rounds.ids():
            assert time.monotonic() < deadline, "no snapshot round published in 60 s"
            time.sleep(0.5)
    finally:
        cluster.down(s)
        rounds_remote(s, "ledger").destroy()
        for op in ledger.app.operators:
            for p in range(2):
                store_remote(s, "ledger", op, p).destroy()
