"""Joining and leaving a cluster: a worker registers, the coordinator assigns it a slot,
the worker says it is ready; then heartbeats until a stop."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from sfaas.runtime.protocols.base import Message

__all__ = ["Peer", "Register", "Assign", "Ready", "Heartbeat", "Stop"]


class Peer(NamedTuple):
    """Where the workers reach worker ``i`` (row ``i`` of a membership)."""

    host: str
    port: int


@dataclass(slots=True)
class Register(Message):
    """Worker → coordinator: I am ``name``, my peers reach me at ``host:port``; ``index``:
    the slot I held before (re-registering with a restarted coordinator, or a promoted
    standby taking its primary's slot), or -1. ``standby_of``: I ask to be a standby of that
    slot (-1: any role). ``repl_port``: where standbys follow my stores (0: not shipping)."""

    TAG: ClassVar[int] = 1
    name: str
    host: str
    port: int
    pid: int
    index: int = -1
    standby_of: int = -1
    repl_port: int = 0


@dataclass(slots=True)
class Assign(Message):
    """Coordinator → worker: your index, the membership, the topics and partition count.
    ``owners``: the partition map (``owners[p]`` = index owning partition ``p``; see
    :mod:`sfaas.runtime.partitioning`)."""

    TAG: ClassVar[int] = 2
    index: int
    n_workers: int
    peers: list[Peer]  # one per worker index
    partitions: int
    ingress_topic: str
    egress_topic: str
    group: str
    owners: list[int]


@dataclass(slots=True)
class Ready(Message):
    """Worker → coordinator: peers connected, Kafka ready."""

    TAG: ClassVar[int] = 3
    index: int


@dataclass(slots=True)
class Heartbeat(Message):
    """Worker → coordinator: still alive (with counters for ``sfaas ps``). ``latency``: the
    worker's request-latency histogram so far (counts per
    ``sfaas.runtime.metrics.LATENCY_BOUNDS`` bucket, the last above them all) for the
    coordinator's status page."""

    TAG: ClassVar[int] = 10
    index: int
    committed: int
    latency: list[int] = dataclasses.field(default_factory=list)


@dataclass(slots=True)
class Stop(Message):
    """Coordinator → worker: shut down cleanly."""

    TAG: ClassVar[int] = 11
    reason: str
