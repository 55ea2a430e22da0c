"""Where a key lives: a stable hash of (operator, key) → partition → worker.

Clients use the same function to pick the Kafka ingress partition, so a request lands on
the worker that owns its root key. ``crc32c`` is stable across processes and versions
(Python's ``hash()`` is salted per process and must never be used here).
"""

from __future__ import annotations

from crc32c import crc32c

__all__ = ["partition_of", "owner_of_partition"]


def partition_of(operator: str, key: str, partitions: int) -> int:
    """The partition (0 ≤ p < ``partitions``) of ``key`` in ``operator``."""
    return crc32c(f"{operator}\x00{key}".encode()) % partitions


def owner_of_partition(partition: int, workers: int) -> int:
    """The worker index owning ``partition`` (round robin)."""
    return partition % workers
