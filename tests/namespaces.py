"""Namespaces of the tests that run clusters, and dropping what they left in the services.

Every cluster test runs in its own namespace (``fresh_namespace``). The Kafka topics and
MinIO objects of those namespaces are deleted when the session's service fixtures end
(``tests/conftest.py``), so repeated test runs against the same local services do not
leave a broker and a bucket that keep growing (hundreds of leftover partitions measurably
slow the broker down: benchmarks/README.md). Only this session's namespaces are touched.
"""

from __future__ import annotations

import asyncio
import uuid
import warnings

from launcher.services import Endpoints

__all__ = ["NAMESPACES", "drop_objects", "drop_topics", "fresh_namespace"]

#: The namespaces this session handed out, in order.
NAMESPACES: list[str] = []


def fresh_namespace() -> str:
    """A new namespace for one test's cluster (``t`` + 10 hex digits), remembered for the cleanup."""
    ns = f"t{uuid.uuid4().hex[:10]}"
    NAMESPACES.append(ns)
    return ns


def drop_topics(bootstrap: str, namespaces: list[str]) -> int:
    """Delete the Kafka topics of ``namespaces``; how many were deleted (a failure warns)."""
    from aiokafka.admin import AIOKafkaAdminClient

    prefixes = tuple(f"{ns}." for ns in namespaces)

    async def drop() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            ours = [t for t in await admin.list_topics() if t.startswith(prefixes)]
            if ours:
                await admin.delete_topics(ours)
            return len(ours)
        finally:
            await admin.close()

    if not namespaces:
        return 0
    try:
        return asyncio.run(drop())
    except Exception as exc:
        warnings.warn(f"could not delete the topics of {len(namespaces)} test namespaces: {exc}", stacklevel=2)
        return 0


def drop_objects(ep: Endpoints, namespaces: list[str]) -> int:
    """Delete the MinIO objects under ``<namespace>/`` in every bucket; how many (a failure warns)."""
    if not namespaces:
        return 0
    try:
        from minio import Minio
        from minio.deleteobjects import DeleteObject

        mc = Minio(ep.minio_endpoint, ep.minio_access_key, ep.minio_secret_key, secure=False)
        n = 0
        for bucket in mc.list_buckets():
            for ns in namespaces:
                objs = [DeleteObject(o.object_name) for o in
                        mc.list_objects(bucket.name, prefix=f"{ns}/", recursive=True)]
                for err in mc.remove_objects(bucket.name, objs):
                    warnings.warn(f"could not delete {bucket.name}/{err.name}: {err.message}", stacklevel=2)
                n += len(objs)
        return n
    except Exception as exc:
        warnings.warn(f"could not delete the MinIO objects of {len(namespaces)} test namespaces: {exc}", stacklevel=2)
        return 0
