"""Session fixtures that start the real services (MinIO, Kafka) as plain processes.

A service that already runs (``sfaas services up``, or another test session) is reused.
One this session had to start is stopped at the end, unless another session still uses
it (see :func:`launcher.services.using`). A service that cannot start FAILS the tests that
need it, with the log tail; nothing is skipped.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from launcher import cluster, services
from launcher.services import Endpoints, ServiceError
from remotes.minio import MinioRemote
from sfaas.runtime.settings import Settings
from tests.namespaces import NAMESPACES, drop_objects, drop_topics, fresh_namespace

TEST_BUCKET = "sfaas-tests"

# The cluster's determinism check is on in the test suite (README, "Mistakes the runtime
# catches"): every cluster a test starts runs it, unless the test turns it off.
os.environ.setdefault("SFAAS_CHECK_DETERMINISM", "1")


@contextlib.contextmanager
def _service(**which: bool) -> Iterator[Endpoints]:
    cm = services.using(**which)
    try:
        ep = cm.__enter__()
    except ServiceError as e:
        pytest.fail(f"could not start {', '.join(k for k, v in which.items() if v)}: {e}", pytrace=False)
    try:
        yield ep
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def minio() -> Iterator[Endpoints]:
    """A running MinIO (endpoint + credentials in the returned :class:`Endpoints`); at the
    end the objects of this session's test namespaces are deleted (``tests.namespaces``)."""
    with _service(minio=True) as ep:
        yield ep
        drop_objects(ep, NAMESPACES)


@pytest.fixture(scope="session")
def kafka() -> Iterator[Endpoints]:
    """A running single-node Kafka; ``.kafka_bootstrap`` is its bootstrap address. At the
    end the topics of this session's test namespaces are deleted (``tests.namespaces``)."""
    with _service(kafka=True) as ep:
        yield ep
        drop_topics(ep.kafka_bootstrap, NAMESPACES)


def make_minio_remote(ep: Endpoints, prefix: str | None = None, **kwargs: object) -> MinioRemote:
    """A :class:`MinioRemote` on the shared test bucket under a fresh unique prefix."""
    return MinioRemote(
        ep.minio_endpoint,
        ep.minio_access_key,
        ep.minio_secret_key,
        TEST_BUCKET,
        prefix=prefix or f"t-{uuid.uuid4().hex[:12]}",
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def minio_remote(minio: Endpoints) -> Iterator[MinioRemote]:
    """A MinioRemote on a unique prefix of the test bucket; destroyed afterwards."""
    remote = make_minio_remote(minio)
    try:
        yield remote
    finally:
        remote.destroy()
        remote.close()


@pytest.fixture(scope="session")
def observed_cluster(kafka: Endpoints, minio: Endpoints, tmp_path_factory: pytest.TempPathFactory) \
        -> Iterator[tuple[Settings, Settings]]:
    """A 2-worker ``tests.runtime.apps.ledger`` cluster (``sfaas up``: LSM stores, a snapshot
    round every second) whose processes serve metrics on free ports, shared by the tests
    that watch it (metrics, the status page, the Grafana dashboard). Yields its settings
    and the settings a client of it uses."""
    s = Settings.load({
        "kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace(),
        "home": str(tmp_path_factory.mktemp("observed")), "store": "lsm", "partitions": 4,
        "snapshot_interval": 1.0, "snapshot_retain": 2, "minio": minio.minio_endpoint,
        "minio_access_key": minio.minio_access_key, "minio_secret_key": minio.minio_secret_key,
        "bucket": TEST_BUCKET,
    })
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        yield s, cluster.cluster_settings(s)[1]
    finally:
        cluster.down(s)
