"""Joining and leaving a cluster: a worker registers, the coordinator assigns it a slot,
the worker says it is ready; then heartbeats until a stop."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from sfaas.runtime.protocols.base import Message

__all__ = ["Peer", "Register", "Assign", "Ready", "Heartbeat", "Alive", "Stop", "SlowRequest"]


class Peer(NamedTuple):
    """Where the workers reach worker ``i`` (row ``i`` of a membership), and the
    generation of the process in that slot: a peer refuses a channel whose ``Hello``
    carries an older one (a fenced process, ``worker.fence``)."""

    host: str
    port: int
    generation: int = 0


@dataclass(slots=True)
class Register(Message):
    """Worker → coordinator: I am ``name``, my peers reach me at ``host:port``; ``index``:
    the slot I held before (re-registering with a restarted coordinator, or a promoted
    standby taking its primary's slot), or -1. ``standby_of``: I ask to be a standby of that
    slot (-1: any role). ``repl_port``: where standbys follow my stores (0: not shipping).
    ``epoch``: the last epoch I began (0: none) — a restarted coordinator numbers its
    epochs above it, and recovers when workers ran epochs it does not know of.
    ``replicas``: True from a standby registering again (it lost the coordinator) that
    holds replicas of ``standby_of``'s stores — it stands by for that slot only, and is
    promoted at once if the slot is lost (None: a new process, or not a standby)."""

    TAG: ClassVar[int] = 1
    OPTIONAL: ClassVar[int] = 1  # (replicas)
    name: str
    host: str
    port: int
    pid: int
    index: int = -1
    standby_of: int = -1
    repl_port: int = 0
    epoch: int = 0
    replicas: bool | None = None


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
    #: this assignment of the slot: strictly increasing per slot, also across coordinator
    #: restarts (``coordinator.state.next_generation``); the worker says it in its ``Hello``
    #: to peers and stamps its replies with it (the ``sfaas-gen`` Kafka header)
    generation: int = 0


@dataclass(slots=True)
class Ready(Message):
    """Worker → coordinator: peers connected, Kafka ready."""

    TAG: ClassVar[int] = 3
    index: int


class SlowRequest(NamedTuple):
    """One of a worker's slowest or aborted requests of the last minute, with its phases
    in seconds (``worker.slowest``; the status page's slow-request view): ``queued`` its
    client's send → the Begin of the epoch it was decided in (earlier epochs it re-ran in
    included), ``executed`` that Begin → the worker's report, ``barrier`` → the Commit,
    ``commit`` → its reply queued (the fallback phase included). ``outcome``:
    ``committed``, or the abort's ``error type: reason``; ``trace_id``: its trace when one
    was recorded (else empty)."""

    rid: str
    function: str
    outcome: str
    at: float
    epoch: int
    latency: float
    queued: float
    executed: float
    barrier: float
    commit: float
    attempts: int
    fallback: bool
    effects: int
    trace_id: str


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
    #: the worker's monotonic clock when it sent this beat (its ``Alive`` echoes it back)
    sent: float = 0.0
    #: seconds since a Kafka broker last answered the worker's probes (a TCP connection to
    #: each broker in turn; ``sfaas.runtime.kafka.Reachability``): a worker cut from Kafka
    #: and not from the coordinator is replaced (``coordinator.watchdog``)
    kafka_silent: float = 0.0
    #: the worker's slowest and aborted requests of the last minute, when ``slow_fresh``
    #: (they changed since its last beat; else the coordinator keeps what it has)
    slow: list[SlowRequest] = dataclasses.field(default_factory=list)
    slow_fresh: bool = False


@dataclass(slots=True)
class Alive(Message):
    """Coordinator → worker: the answer to each ``Heartbeat`` — the worker is still the
    slot's member, ``generation`` its current assignment. ``sent`` echoes the beat's send
    time: the worker's lease runs from there (``worker.fence``), never from when the
    answer arrived (answers that waited in a paused process's socket are old)."""

    TAG: ClassVar[int] = 37
    index: int
    generation: int
    sent: float


#: The end of a ``Stop``'s reason telling a worker to register again, as a new process
#: (a recruited standby: ``coordinator.protocols.standby``).
REGISTER_AGAIN = "register again to take it"


@dataclass(slots=True)
class Stop(Message):
    """Coordinator → worker: shut down cleanly."""

    TAG: ClassVar[int] = 11
    reason: str
