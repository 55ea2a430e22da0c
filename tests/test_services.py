"""launcher.services against the real MinIO and Kafka: lifecycle, idempotency, failures."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher import kafka_broker, minio_server, services
from launcher.services import Endpoints, ServiceError, ServiceSettings


def free_port() -> int:
    """Outside the ephemeral range (see ``launcher.cluster.free_port``)."""
    from launcher.cluster import free_port as pick

    return pick("127.0.0.1")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceSettings]:
    """Settings for a private MinIO/Kafka (own state dir and ports); stopped afterwards."""
    monkeypatch.setenv("SFAAS_HOME", str(tmp_path / "state"))
    for var in ("SFAAS_MINIO_PORT", "SFAAS_MINIO_CONSOLE_PORT", "SFAAS_KAFKA_PORT", "SFAAS_KAFKA_CONTROLLER_PORT"):
        monkeypatch.setenv(var, str(free_port()))
    settings = ServiceSettings.from_env()
    try:
        yield settings
    finally:
        services.down(progress=False)


def test_shared_minio_status_and_idempotent_up(minio: Endpoints) -> None:
    st = services.status()["minio"]
    assert st["reachable"] is True
    assert st["endpoint"] == minio.minio_endpoint == services.endpoints().minio_endpoint
    again = services.up(kafka=False, progress=False)
    assert again == minio
    assert services.status()["minio"]["pid"] == st["pid"]  # nothing new was started


def test_private_minio_lifecycle(private: ServiceSettings) -> None:
    messages: list[str] = []
    ep = services.up(kafka=False, progress=messages.append)
    port = private.minio_port
    assert ep.minio_endpoint == f"127.0.0.1:{port}"
    st = services.status()["minio"]
    assert st["running"] is True and st["reachable"] is True
    pid = st["pid"]
    assert isinstance(pid, int)
    os.kill(pid, 0)
    assert Path(str(st["log"])).is_file()
    assert any("MinIO ready" in m for m in messages)

    assert services.up(kafka=False, progress=messages.append) == ep
    assert services.status()["minio"]["pid"] == pid
    assert "already running" in messages[-1]

    services.down(kafka=False, progress=False)
    st = services.status()["minio"]
    assert st["running"] is False and st["pid"] is None
    assert not port_open(port)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    services.down(kafka=False, progress=False)  # stopping twice is fine


def test_minio_port_taken_by_something_else(private: ServiceSettings) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", private.minio_port))
        squatter.listen(1)
        with pytest.raises(ServiceError, match="SFAAS_MINIO_PORT"):
            services.up(kafka=False, progress=False)
    assert services.status()["minio"]["running"] is False


def test_kafka_port_taken_by_something_else(private: ServiceSettings) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", private.kafka_port))
        squatter.listen(1)
        with pytest.raises(ServiceError, match="SFAAS_KAFKA_PORT"):
            services.up(minio=False, progress=False)
    assert services.status()["kafka"]["running"] is False


def test_using_stops_what_it_started_unless_others_still_use_it(private: ServiceSettings) -> None:
    with services.using(minio=True, progress=False) as ep:
        assert services.status()["minio"]["running"] is True
        assert ep.minio_endpoint.endswith(str(private.minio_port))
    assert services.status()["minio"]["running"] is False
    assert not port_open(private.minio_port)

    other = private.service_dir("minio") / "leases" / "1"  # pid 1 is alive: another user
    with services.using(minio=True, progress=False):
        other.touch()
    assert services.status()["minio"]["running"] is True
    other.unlink()

    # started explicitly (`sfaas services up`): a test session only borrows it
    services.down(kafka=False, progress=False)
    services.up(kafka=False, progress=False)
    with services.using(minio=True, progress=False):
        pass
    assert services.status()["minio"]["running"] is True


def test_private_jaeger_lifecycle(private: ServiceSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """``services up --tracing`` starts Jaeger on its four ports only; status and down know it."""
    ports = {}
    for var in ("SFAAS_JAEGER_PORT", "SFAAS_JAEGER_GRPC_PORT", "SFAAS_OTLP_GRPC_PORT", "SFAAS_OTLP_HTTP_PORT"):
        ports[var] = free_port()
        monkeypatch.setenv(var, str(ports[var]))
    assert services.status()["jaeger"]["running"] is False
    messages: list[str] = []
    ep = services.up(kafka=False, minio=False, tracing=True, progress=messages.append)
    assert (ep.jaeger_url, ep.otlp_endpoint) == (f"http://127.0.0.1:{ports['SFAAS_JAEGER_PORT']}",
                                                 f"http://127.0.0.1:{ports['SFAAS_OTLP_HTTP_PORT']}")
    assert any("Jaeger ready" in m for m in messages), messages
    st = services.status()["jaeger"]
    assert st["running"] is True and st["reachable"] is True and st["endpoint"] == ep.jaeger_url
    assert all(port_open(p) for p in ports.values())
    pid = st["pid"]
    assert isinstance(pid, int)
    # (its sockets: the four ports, on loopback; the stock configuration opens a dozen)
    listening = _listening(pid)
    assert listening == {("127.0.0.1", p) for p in ports.values()}, listening
    services.down(kafka=False, minio=False, progress=False)
    assert services.status()["jaeger"]["running"] is False
    assert not any(port_open(p) for p in ports.values())


def _listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) TCP sockets process ``pid`` listens on (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # (closed since the listing: a connection, not a listener)
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                addr, port = f[1].split(":")
                ip = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)) if len(addr) == 8 else addr
                out.add((ip, int(port, 16)))
    return out


def test_missing_build_tools_give_apt_hints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFAAS_CACHE", str(tmp_path / "empty-cache"))
    for module in (kafka_broker, minio_server):  # (jaeger_server finds Go as minio_server does)
        monkeypatch.setattr(module, "_which", lambda tool, extra=(): None)
    with pytest.raises(ServiceError, match="apt-get install maven"):
        services.ensure_kafka_libs(progress=False)
    with pytest.raises(ServiceError, match="apt-get install golang-go"):
        services.ensure_minio_binary(progress=False)
    with pytest.raises(ServiceError, match="building Jaeger needs Go.*apt-get install golang-go"):
        services.ensure_jaeger_binary(progress=False)


def test_warm_cache_is_used_as_is() -> None:
    assert os.access(services.ensure_minio_binary(progress=False), os.X_OK)
    libs = services.ensure_kafka_libs(progress=False)
    assert (libs / f"kafka_2.13-{services.KAFKA_VERSION}.jar").is_file()


def test_bad_port_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFAAS_KAFKA_PORT", "ninety")
    with pytest.raises(ValueError, match="SFAAS_KAFKA_PORT"):
        services.endpoints()


def test_endpoints_repr_hides_the_secret() -> None:
    ep = services.endpoints()
    assert ep.minio_secret_key not in repr(ep)


async def test_kafka_transactions_and_logs(kafka: Endpoints) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"svc-test-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
        producer = AIOKafkaProducer(bootstrap_servers=kafka.kafka_bootstrap, transactional_id=f"tx-{topic}")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b"committed", partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"aborted", partition=0)
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send_and_wait(topic, b"after", partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=kafka.kafka_bootstrap, isolation_level="read_committed",
            auto_offset_reset="earliest", enable_auto_commit=False,
        )
        await consumer.start()
        try:
            got: list[bytes] = []
            while len(got) < 2:
                batch = await consumer.getmany(timeout_ms=5000)
                assert batch, f"no committed records arrived; got so far {got}"
                got += [r.value for recs in batch.values() for r in recs if r.value is not None]
            assert got == [b"committed", b"after"]
        finally:
            await consumer.stop()
        await admin.delete_topics([topic])
    finally:
        await admin.close()
    st = services.status()["kafka"]
    assert st["reachable"] is True
    if st["running"]:  # started by sfaas: its broker log lands in the state dir
        logs = ServiceSettings.from_env().service_dir("kafka") / "logs"
        with open(logs / "server.log", errors="replace") as f:
            head = f.read(4096)
        assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] (TRACE|DEBUG|INFO|WARN|ERROR) ", head), head[:200]
        # log4j rolls server.log at 20 MB, keeping 3: the start stays in a log until the broker
        # has logged that much (the request logger at DEBUG, broker_requests.py, does in a minute)
        if not list(logs.glob("server.log.3")):
            assert any("Kafka Server started" in f.read_text(errors="replace") for f in logs.glob("server.log*"))


def test_a_kafka_cluster_id_never_begins_with_a_dash() -> None:
    # (the storage tool read such an id as an option and `services up` failed, 1 in 64)
    draws = iter([b"\xf9" + bytes(15), b"\x01" * 16])
    cid = kafka_broker.new_cluster_id(lambda: next(draws))
    assert cid == "AQEBAQEBAQEBAQEBAQEBAQ"
    assert all(not kafka_broker.new_cluster_id().startswith("-") for _ in range(2000))
