"""A simulated Kafka: :class:`SimKafka` makes producers, consumers and admin clients that
behave, for what the product uses, like aiokafka's against a broker — duck-typed, with
aiokafka's own ``TopicPartition``, ``RecordMetadata``, ``ConsumerRecord``,
``OffsetAndMetadata`` and exception classes.

    kafka = SimKafka(random.Random(seed))
    kafka.create_topic("ns.app.in", 4)
    producer = kafka.producer(transactional_id="t")      # as AIOKafkaProducer(**kw)
    consumer = kafka.consumer(isolation_level="read_committed")
    admin = kafka.admin()

What it simulates (``sfaas/sim/README.md`` has the list and what it leaves out): topics of
partitions with dense offsets; sends delivered in order per producer; idempotent and
transactional producers, a new producer of a transactional id fencing the old
(``ProducerFenced``), a transaction outliving its timeout aborted by the broker; control
markers taking offsets; ``read_committed`` readers stopping at the last stable offset and
skipping aborted records; consumer groups' committed offsets; the log start rising with
retention (an offset below it is out of range: ``auto_offset_reset``, or
``OffsetOutOfRangeError`` with ``"none"``).

Faults, drawn from the seeded ``random.Random`` (:class:`~sfaas.sim.broker.Faults`) or
switched on for a while: a send that fails, one whose answer is lost after the append, a
producer stuck out of sequence, an empty fetch, latency; the cluster unreachable
(:meth:`SimKafka.outage`), one process cut from it (:meth:`SimKafka.cut`), a partition's
leader unavailable (:meth:`SimKafka.leader_down`), a stale leader answering a shorter log
(:meth:`SimKafka.stale_leader`), records deleted (:meth:`SimKafka.delete_records`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from aiokafka import TopicPartition
from aiokafka.errors import TopicAlreadyExistsError

from sfaas.sim.broker import Broker, Faults
from sfaas.sim.log_clients import SimConsumer, SimProducer, until_reachable

__all__ = ["SimKafka", "SimAdmin", "SimProducer", "SimConsumer", "Faults", "CreateTopicsResult"]

#: the node id, host and port the simulated cluster describes itself with
NODE = {"node_id": 1, "host": "sim", "port": 9092, "rack": None}


class SimKafka:
    """One simulated Kafka cluster and the factories of its clients."""

    def __init__(self, rng: random.Random | None = None, faults: Faults | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        """``rng``: the run's seeded random source (faults, partitions of keyless sends);
        ``on_event``: called with one line per append, transaction end, commit and fault
        (a run's trace)."""
        self.broker = Broker(rng if rng is not None else random.Random(0), faults, on_event)

    @property
    def faults(self) -> Faults:
        return self.broker.faults

    # -- clients (the factories a port would hand the product) ---------------------------------
    def producer(self, **kwargs: Any) -> SimProducer:
        """A producer, as ``AIOKafkaProducer(**kwargs)``."""
        return SimProducer(self.broker, **kwargs)

    def consumer(self, *topics: str, **kwargs: Any) -> SimConsumer:
        """A consumer, as ``AIOKafkaConsumer(**kwargs)`` (assigned by hand: no topics)."""
        if topics:
            raise NotImplementedError("the simulated consumer has no group subscription")
        return SimConsumer(self.broker, **kwargs)

    def admin(self, **kwargs: Any) -> SimAdmin:
        """An admin client, as ``AIOKafkaAdminClient(**kwargs)``."""
        return SimAdmin(self.broker, **kwargs)

    # -- topics and retention -----------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, retained: int | None = None) -> None:
        """Create ``name`` with ``partitions`` partitions, each keeping its newest
        ``retained`` records (default ``broker.RETAINED_RECORDS``)."""
        self.broker.create_topic(name, partitions, retained)

    def delete_records(self, tp: TopicPartition, before: int) -> int:
        """Delete ``tp``'s records below ``before`` (retention); the new log start."""
        start = self.broker.partition(tp).delete_before(before)
        self.broker.event(f"retention {tp.topic}[{tp.partition}] start {start}")
        return start

    # -- faults for a while --------------------------------------------------------------------
    def outage(self, seconds: float) -> None:
        """No client reaches the cluster for ``seconds``: requests wait (up to their request
        timeout: ``KafkaTimeoutError``), fetches return nothing."""
        until = self.broker.now() + seconds
        self.broker.down_until = max(self.broker.down_until, until)
        self.broker.event(f"fault outage {seconds}")
        self.broker.fault_over(until)

    def cut(self, process: str, seconds: float) -> None:
        """Process ``process`` reaches no broker for ``seconds`` (its link cut; every other
        process still does): its requests wait, its fetches return nothing, its probes
        fail; the request it has on the wire if it dies meanwhile lands after the heal."""
        until = self.broker.now() + seconds
        self.broker.cut_off[process] = max(self.broker.cut_off.get(process, until), until)
        self.broker.event(f"fault kafka-cut {process} {seconds}")
        self.broker.fault_over(until)

    def leader_down(self, tp: TopicPartition, seconds: float) -> None:
        """``tp`` has no leader for ``seconds``: its sends wait, its fetches return nothing."""
        until = self.broker.now() + seconds
        self.broker.leaderless[tp] = max(self.broker.leaderless.get(tp, until), until)
        self.broker.event(f"fault leader-down {tp.topic}[{tp.partition}] {seconds}")
        self.broker.fault_over(until)

    def stale_leader(self, tp: TopicPartition, seconds: float, behind: int) -> None:
        """For ``seconds``, ``tp`` is answered by a stale leader missing its last ``behind``
        records: end offsets and high watermarks short by that much, and a position past
        its end out of range — reset by the consumer's ``auto_offset_reset`` (``earliest``
        rewinds to the log start) or ``OffsetOutOfRangeError`` (``none``)."""
        part = self.broker.partition(tp)
        until = self.broker.now() + seconds
        self.broker.stale[tp] = (until, max(part.start, part.hw - behind))
        self.broker.event(f"fault stale-leader {tp.topic}[{tp.partition}] {seconds} {behind}")
        self.broker.fault_over(until)


class CreateTopicsResult(NamedTuple):
    """The answer to ``create_topics``: (topic, error code, message) per topic."""

    topic_errors: list[tuple[str, int, str | None]]


class SimAdmin:
    """``AIOKafkaAdminClient``: topics, their description, the cluster's, record deletion."""

    def __init__(self, broker: Broker, *, request_timeout_ms: int = 40_000,
                 owner: str | None = None, **_: Any) -> None:
        self._broker = broker
        self._owner = owner
        self._timeout = request_timeout_ms / 1000

    async def start(self) -> None:
        await until_reachable(self._broker, None, self._timeout, self._owner)

    async def close(self) -> None:
        pass

    async def create_topics(self, new_topics: Iterable[Any], timeout_ms: int | None = None,
                            validate_only: bool = False) -> CreateTopicsResult:
        """Create each ``NewTopic``; as aiokafka's, an existing one is no exception but an
        error code in the answer's ``topic_errors`` (36: it exists)."""
        await until_reachable(self._broker, None, self._timeout, self._owner)
        errors: list[tuple[str, int, str | None]] = []
        for t in new_topics:
            try:
                self._broker.create_topic(t.name, t.num_partitions)
                errors.append((t.name, 0, None))
            except TopicAlreadyExistsError:
                errors.append((t.name, TopicAlreadyExistsError.errno,
                               f"Topic '{t.name}' already exists."))
        return CreateTopicsResult(errors)

    async def delete_topics(self, topics: Iterable[str], timeout_ms: int | None = None) -> None:
        await until_reachable(self._broker, None, self._timeout, self._owner)
        for t in topics:
            self._broker.topics.pop(t, None)

    async def list_topics(self) -> list[str]:
        await until_reachable(self._broker, None, self._timeout, self._owner)
        return sorted(self._broker.topics)

    async def describe_topics(self, topics: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Each topic as aiokafka describes it (``error_code`` 3: no such topic)."""
        await until_reachable(self._broker, None, self._timeout, self._owner)
        out = []
        for t in (topics if topics is not None else sorted(self._broker.topics)):
            parts = self._broker.topics.get(t)
            out.append({
                "error_code": 0 if parts is not None else 3, "topic": t, "is_internal": False,
                "partitions": [{"error_code": 0, "partition": p.tp.partition,
                                "leader": NODE["node_id"], "replicas": [NODE["node_id"]],
                                "isr": [NODE["node_id"]], "offline_replicas": []}
                               for p in parts or ()]})
        return out

    async def describe_cluster(self) -> dict[str, Any]:
        await until_reachable(self._broker, None, self._timeout, self._owner)
        return {"throttle_time_ms": 0, "brokers": [dict(NODE)], "cluster_id": "sim",
                "controller_id": NODE["node_id"]}

    async def delete_records(self, records_to_delete: Mapping[TopicPartition, Any],
                             timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        """Delete each partition's records below its ``RecordsToDelete.before_offset``; the
        new log starts."""
        await until_reachable(self._broker, None, self._timeout, self._owner)
        return {tp: self._broker.partition(tp).delete_before(r.before_offset)
                for tp, r in records_to_delete.items()}
