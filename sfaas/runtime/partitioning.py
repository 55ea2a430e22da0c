"""Where a key lives: a stable hash of (operator, key) → partition → worker.

A cluster keeps an explicit **partition map** (``owners[p]`` = the worker index owning
partition ``p``): round robin when it starts, and after a rescale the map that moved the
fewest partitions (:func:`rebalance`), so only moved partitions' state travels.

Clients use the same function to pick the Kafka ingress partition, so a request lands on
the worker that owns its root key. ``crc32c`` is stable across processes and versions
(Python's ``hash()`` is salted per process and must never be used here).
"""

from __future__ import annotations

from crc32c import crc32c

__all__ = ["partition_of", "owner_of_partition", "default_owners", "rebalance", "owned"]


def partition_of(operator: str, key: str, partitions: int) -> int:
    """The partition (0 ≤ p < ``partitions``) of ``key`` in ``operator``; a runtime record's
    key (``"\\x00…\\x00owner"``, see ``sfaas.runtime.txn.internal``) is its owner key's."""
    if key[:1] == "\x00":
        key = key[key.index("\x00", 1) + 1:]
    return crc32c(f"{operator}\x00{key}".encode()) % partitions


def owner_of_partition(partition: int, workers: int) -> int:
    """The worker index owning ``partition`` (round robin)."""
    return partition % workers


def default_owners(partitions: int, workers: int) -> list[int]:
    """The partition map of a cluster that never rescaled: round robin."""
    if workers < 1 or partitions < workers:
        raise ValueError(f"need 1 <= workers <= partitions, got {workers} workers, "
                         f"{partitions} partitions")
    return [owner_of_partition(p, workers) for p in range(partitions)]


def rebalance(owners: list[int], workers: int) -> list[int]:
    """A map for ``workers`` workers that moves the fewest partitions away from ``owners``.

    Every worker ends with ``⌊P/n⌋`` or ``⌈P/n⌉`` partitions; a partition stays where it is
    unless its owner is gone (index ``>= workers``) or holds more than its share; the ones
    that move go to the least loaded workers, lowest partition first.
    """
    partitions = len(owners)
    if workers < 1 or partitions < workers:
        raise ValueError(f"need 1 <= workers <= partitions, got {workers} workers, "
                         f"{partitions} partitions")
    base, extra = divmod(partitions, workers)
    # the workers keeping the most partitions get the ⌈P/n⌉ quotas: fewer moves
    kept = {i: sum(1 for o in owners if o == i) for i in range(workers)}
    order = sorted(range(workers), key=lambda i: (-kept[i], i))
    quota = {i: base + (1 if rank < extra else 0) for rank, i in enumerate(order)}
    new = [-1] * partitions
    load = dict.fromkeys(range(workers), 0)
    for p, o in enumerate(owners):
        if o < workers and load[o] < quota[o]:
            new[p] = o
            load[o] += 1
    for p in range(partitions):
        if new[p] < 0:
            w = min((i for i in range(workers) if load[i] < quota[i]),
                    key=lambda i: (load[i] - quota[i], i))
            new[p] = w
            load[w] += 1
    return new


def owned(owners: list[int], index: int) -> list[int]:
    """The partitions worker ``index`` owns under ``owners``."""
    return [p for p, o in enumerate(owners) if o == index]
