"""MinioRemote over several endpoints: failover between the nodes of a real distributed
MinIO (4 local ``minio server`` processes, ``launcher.minio_server.start_distributed``)."""

from __future__ import annotations

import logging
import pickle
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.minio_server import DistributedMinio, start_distributed
from launcher.services import Endpoints
from remotes import FileInfo, Manifest, RemoteError
from remotes._retry import RetryPolicy
from remotes.minio import FAILOVER_CONNECT_TIMEOUT, FIRST_READ_TIMEOUT, MinioRemote
from tests.conftest import TEST_BUCKET
from tests.remotes.relay import Proxy

BUCKET = "failover"
#: A short retry budget: what the runtime's snapshot rounds use (``sfaas.runtime.state``).
ROUNDS = RetryPolicy(deadline=5.0)
#: Right after losing a node, a loaded machine's MinIO answered writes with SlowDownWrite
#: (503, "reduce your request rate") for over 3 s once — on every node, so it is backed off
#: from, not failed over; a patient policy keeps that server-side blip out of the verdict.
PATIENT = RetryPolicy(attempts=100, base_delay=0.1, max_delay=1.0, deadline=30.0)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[DistributedMinio]:
    """A fresh 4-node distributed MinIO (EC:2) of its own; stopped afterwards."""
    with start_distributed(4, tmp_path / "minio") as cluster:
        yield cluster


def remote_on(cluster: DistributedMinio, endpoints: list[str] | None = None,
              prefix: str = "", **kwargs: object) -> MinioRemote:
    return MinioRemote(",".join(endpoints or cluster.endpoints), cluster.access_key,
                       cluster.secret_key, BUCKET, prefix=prefix or f"t-{uuid.uuid4().hex[:10]}",
                       **kwargs)  # type: ignore[arg-type]


def fill(remote: MinioRemote, tmp_path: Path) -> None:
    """Blobs, a file and a published snapshot."""
    for i in range(5):
        remote.put_blob(f"b{i}", f"blob {i}".encode() * 100)
    src = tmp_path / "src"
    src.write_bytes(b"file data " * 5000)
    remote.put_file("run-1", src)
    remote.write_manifest(Manifest(snapshot_id=1, engine="lsm", files={"run-1": FileInfo(50000, 0)}))


def reads_work(remote: MinioRemote, tmp_path: Path) -> None:
    assert remote.get_blob("b3") == b"blob 3" * 100
    assert remote.list_files() == {"run-1": 50000}
    assert remote.list_snapshots()[0] == 1
    assert remote.read_manifest(1).files["run-1"].size == 50000
    assert remote.get_file("run-1", tmp_path / "dst") == 50000
    assert (tmp_path / "dst").read_bytes() == b"file data " * 5000


def test_killing_the_node_in_use_moves_every_operation_to_another(
        nodes: DistributedMinio, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    remote = remote_on(nodes, retry=PATIENT)
    fill(remote, tmp_path)
    used = remote.endpoint
    t0 = time.perf_counter()
    remote.get_blob("b4")
    healthy = time.perf_counter() - t0
    nodes.kill(nodes.endpoints.index(used))

    caplog.set_level(logging.WARNING, logger="remotes.minio")
    t0, wall = time.perf_counter(), time.time()
    assert remote.get_blob("b1") == b"blob 1" * 100  # its pooled connection is dead now
    first = time.perf_counter() - t0
    assert remote.endpoint != used
    moved = [r for r in caplog.records if used in r.getMessage() and "trying" in r.getMessage()]
    assert moved
    detected = moved[0].created - wall
    t0 = time.perf_counter()
    assert remote.get_blob("b2") == b"blob 2" * 100
    after = time.perf_counter() - t0

    t0 = time.perf_counter()
    remote.put_blob("new", b"written after the failover")
    put = time.perf_counter() - t0
    remote.write_manifest(Manifest(snapshot_id=2, engine="lsm", files={"run-1": FileInfo(50000, 0)}))
    assert remote.list_snapshots() == [1, 2]
    assert remote.get_blob("new") == b"written after the failover"
    remote.delete_blob("b0")
    assert remote.get_blob("b0") is None
    reads_work(remote, tmp_path)

    # a remote that starts on the dead node (no pooled connection: a refused connect)
    fresh = remote_on(nodes, [used] + [e for e in nodes.endpoints if e != used],
                      prefix=remote.prefix, retry=PATIENT)
    t0 = time.perf_counter()
    fresh.put_blob("from-fresh", b"x")
    cold = time.perf_counter() - t0
    assert fresh.endpoint != used and remote.get_blob("from-fresh") == b"x"
    print(f"\nfailover after SIGKILL of {used}: a get took {healthy * 1000:.1f} ms before; "
          f"the first get after {first * 1000:.1f} ms (dead node detected after "
          f"{detected * 1000:.1f} ms), the next {after * 1000:.1f} ms; a fresh remote's first "
          f"put on the dead node {cold * 1000:.1f} ms")
    backoffs = [r.getMessage() for r in caplog.records if "transient error" in r.getMessage()]
    codes = sorted({m.partition("code: ")[2].partition(",")[0] or m[-80:] for m in backoffs})
    print(f"the first put after the kill took {put * 1000:.1f} ms; MinIO asked to back off "
          f"{len(backoffs)} times after the kill ({', '.join(codes) or 'never'})")
    # refused at once: no timeout is waited for, whatever the machine's speed
    assert not [m for r in moved if "timed out" in (m := r.getMessage()).lower() or "Timeout" in m], \
        [r.getMessage() for r in moved]


def test_two_of_four_nodes_down_reads_work_writes_fail_fast_deletes_time_out(
        nodes: DistributedMinio, tmp_path: Path) -> None:
    remote = remote_on(nodes, retry=PATIENT, read_timeout=2.0)
    fill(remote, tmp_path)
    used = remote.endpoint
    down = [nodes.endpoints.index(used), (nodes.endpoints.index(used) + 1) % 4]
    for i in down:
        nodes.kill(i)

    t0 = time.perf_counter()
    reads_work(remote, tmp_path)  # EC:2: any 2 of the 4 drives hold every object
    reads = time.perf_counter() - t0
    assert remote.endpoint not in [nodes.endpoints[i] for i in down]

    # no write quorum (3 of 4): every live node answers 503 SlowDownWrite at once, which
    # asks to back off, so it is retried (same endpoint) until the policy's deadline
    remote.retry = RetryPolicy(deadline=2.0)
    t0 = time.perf_counter()
    with pytest.raises(RemoteError, match="SlowDownWrite") as err:
        remote.put_blob("lost", b"x")
    writes = time.perf_counter() - t0
    assert nodes.secret_key not in str(err.value)
    assert writes < 2.0 + 2.0 + 1.0  # deadline + one request + slack

    # a delete waits for a lock quorum the server never gets: each live node costs the read
    # timeout, the dead ones are refused; the error names every endpoint and why
    t0 = time.perf_counter()
    with pytest.raises(RemoteError, match="on every endpoint") as err:
        remote.delete_blob("b1")
    deletes = time.perf_counter() - t0
    for ep in nodes.endpoints:
        assert f"http://{ep}" in str(err.value)
    assert "ReadTimeoutError" in str(err.value) and "NewConnectionError" in str(err.value)
    print(f"\n2 of 4 nodes down: reads OK ({reads * 1000:.0f} ms for 5 reads), put fails "
          f"in {writes:.2f}s (SlowDownWrite, retried to the 2 s deadline), delete fails in "
          f"{deletes:.2f}s (2 live nodes x the 2 s read timeout)")

    for i in down:  # back to quorum: writes work again
        nodes.start(i)
    nodes.wait_healthy()
    remote.retry = PATIENT
    remote.put_blob("after", b"y")
    assert remote.get_blob("after") == b"y"


def test_a_node_whose_host_is_gone_costs_one_connect_timeout(
        minio: Endpoints, caplog: pytest.LogCaptureFixture) -> None:
    # a listener whose backlog is full drops SYNs, like a host that vanished: no refusal
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    filler = socket.create_connection(hole.getsockname())
    remote = MinioRemote(f"127.0.0.1:{hole.getsockname()[1]},{minio.minio_endpoint}",
                         minio.minio_access_key, minio.minio_secret_key, TEST_BUCKET,
                         prefix=f"t-{uuid.uuid4().hex[:10]}", retry=ROUNDS)
    dead = f"127.0.0.1:{hole.getsockname()[1]}"
    caplog.set_level(logging.WARNING, logger="remotes.minio")

    def left_dead() -> int:
        return len([r for r in caplog.records if f"MinIO at http://{dead} failed" in r.getMessage()])

    try:
        t0 = time.perf_counter()
        remote.put_blob("a", b"x")
        first = time.perf_counter() - t0
        assert remote.endpoint == minio.minio_endpoint
        assert left_dead() == 1, caplog.text
        t0 = time.perf_counter()
        assert remote.get_blob("a") == b"x"
        after = time.perf_counter() - t0
        print(f"\nfailover from a node that takes no connection: first call {first:.3f}s "
              f"(connect timeout {FAILOVER_CONNECT_TIMEOUT}s), the next {after * 1000:.1f} ms")
        # the timeout fires (a slow machine only makes it later), once: a second one would
        # double it
        assert FAILOVER_CONNECT_TIMEOUT * 0.9 <= first < FAILOVER_CONNECT_TIMEOUT * 2
        assert left_dead() == 1, caplog.text  # the next call went straight to the live node
    finally:
        remote.destroy()
        filler.close()
        hole.close()


def test_every_endpoint_down_names_each_and_why(tmp_path: Path) -> None:
    from launcher.cluster import free_port

    ports: list[int] = []
    for _ in range(3):
        ports.append(free_port("127.0.0.1", avoid=ports))
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    remote = MinioRemote(",".join(endpoints), "sfaas", "Zq9-very-secret-value-7731", BUCKET,
                         retry=RetryPolicy(attempts=1))
    with pytest.raises(RemoteError) as err:
        remote.get_blob("x")
    text = str(err.value)
    assert "failed after 1 tries" in text and "on every endpoint" in text
    for ep in endpoints:  # each once, with its reason: refused at once, not timed out
        assert text.count(f"http://{ep}: NewConnectionError") == 1
    assert text.count("Connection refused") == len(endpoints) and "timed out" not in text, text
    assert "Zq9-very-secret" not in text and "Zq9-very-secret" not in repr(remote)


def test_endpoint_lists_parse_pickle_and_name_bad_entries() -> None:
    secret = "Zq9-very-secret-value-7731"
    r = MinioRemote("https://a:9000,https://b:9000", "sfaas", secret, BUCKET)
    assert r.endpoints == ("a:9000", "b:9000") and r.secure and r.endpoint == "a:9000"
    assert MinioRemote(["a:1", "b:2"], "sfaas", secret, BUCKET).endpoints == ("a:1", "b:2")
    assert MinioRemote("a:1", "sfaas", secret, BUCKET)._rotation is None  # no failover work
    data = pickle.dumps(r)
    assert secret.encode() not in data
    copy = pickle.loads(data)
    assert copy.endpoints == r.endpoints and copy.secure
    for bad, says in (("a:1,,b:2", "entry 2"), ("a:1, b:2", "entry 2"), ("a:1,a:1", "twice"),
                      ("http://a:1,https://b:2", "mix"), ("a:1,b:2/x", "entry 2"), ("", "non-empty")):
        with pytest.raises(ValueError, match=says):
            MinioRemote(bad, "sfaas", secret, BUCKET)


def _port(minio: Endpoints) -> int:
    return int(minio.minio_endpoint.rsplit(":", 1)[1])


def test_a_node_that_holds_a_request_costs_the_first_read_timeout(minio: Endpoints) -> None:
    """A distributed MinIO node serving a request when a peer node died can hold it until
    the peer is back (a GET held 7.1 s; a recovery's restore 5.2 s of a nemesis reply gap),
    while any node answers a new request at once. The first endpoint of a try gets
    :data:`FIRST_READ_TIMEOUT`, not the 30 s ``read_timeout``, before the next is tried."""
    held = Proxy(_port(minio), silent=True)
    held.start()
    remote = MinioRemote(f"{held.endpoint},{minio.minio_endpoint}", minio.minio_access_key,
                         minio.minio_secret_key, TEST_BUCKET,
                         prefix=f"t-{uuid.uuid4().hex[:10]}", retry=ROUNDS)
    try:
        t0 = time.perf_counter()
        remote.put_blob("a", b"x")
        took = time.perf_counter() - t0
        assert remote.endpoint == minio.minio_endpoint
        assert remote.get_blob("a") == b"x"
        print(f"\na request held by the first node: answered by the next in {took:.2f} s "
              f"(first read timeout {FIRST_READ_TIMEOUT} s)")
        assert FIRST_READ_TIMEOUT * 0.9 <= took < FIRST_READ_TIMEOUT * 2 + 1
    finally:
        remote.destroy()
        held.stop()


def test_answers_slow_on_every_node_still_arrive(minio: Endpoints,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Only the first endpoint of a try is hurried: when every node answers slowly (a
    listing while MinIO itself still waits for a dead node), the next one gets the whole
    ``read_timeout`` and the call succeeds — a timeout on every endpoint would turn slow
    into never."""
    relays = [Proxy(_port(minio), delay=0.5) for _ in range(2)]
    for r in relays:
        r.start()
    remote = MinioRemote(",".join(r.endpoint for r in relays), minio.minio_access_key,
                         minio.minio_secret_key, TEST_BUCKET, prefix=f"t-{uuid.uuid4().hex[:10]}",
                         retry=RetryPolicy(attempts=1), read_timeout=10.0, first_read_timeout=0.2)
    caplog.set_level(logging.WARNING, logger="remotes.minio")
    try:
        def hurried() -> int:
            return len([r for r in caplog.records if "timed out" in r.getMessage().lower()])

        t0 = time.perf_counter()
        remote.put_blob("a", b"slow")
        took = time.perf_counter() - t0
        first = hurried()
        assert first >= 1, caplog.text  # the first endpoint was given up after 0.2 s
        assert "answers slowly on every endpoint" in caplog.text
        t0 = time.perf_counter()
        assert remote.get_blob("a") == b"slow"
        then = time.perf_counter() - t0
        print(f"\nslow on every node: the put took {took:.2f} s, hurried away {first} times; "
              f"the get after it {then:.2f} s, hurried away {hurried() - first} times")
        assert hurried() == first, caplog.text  # patient now: no endpoint is hurried
    finally:
        remote.destroy()
        for r in relays:
            r.stop()
