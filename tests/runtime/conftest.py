"""Runtime tests run the example apps on the in-memory engine unless told otherwise."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from sfaas.cli import cluster
from sfaas.settings import Settings
from tests.conftest import TEST_BUCKET

os.environ.setdefault("SFAAS_STORE", "memonly")


@pytest.fixture(scope="session")
def observed_cluster(kafka, minio, tmp_path_factory) -> Iterator[tuple[Settings, Settings]]:  # type: ignore[no-untyped-def]
    """A 2-worker ``tests.runtime.apps.ledger`` cluster (``sfaas up``: LSM stores, a snapshot
    round every second) whose processes serve metrics on free ports, for the tests that
    watch it. Yields its settings and the settings a client of it uses."""
    s = Settings.load({
        "kafka": kafka.kafka_bootstrap, "namespace": f"t{uuid.uuid4().hex[:10]}",
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
