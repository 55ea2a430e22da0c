"""What a coordinator learns before any worker registers: the app's topics, and whether it
restarts a cluster that ran before (then the map of the newest snapshot round stands).

:class:`Startup` is the coordinator's first service: it creates the topics, configures
the cluster state's layout and says whether the cluster resumes (then it recovers before
any epoch)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from coordinator.state import ClusterState
from remotes import Remote
from sfaas.errors import ClusterError
from sfaas.runtime import ports
from sfaas.runtime.epochlog import START_WINDOW, StartRecord, used_before
from sfaas.runtime.kafka import ensure_topics, make_producer, read_range
from sfaas.runtime.lifecycle import Service
from sfaas.runtime.partitioning import default_owners
from sfaas.runtime.ports import ClockPort, KafkaPort
from sfaas.runtime.protocols.rounds import Rounds
from sfaas.runtime.settings import Settings

log = logging.getLogger("sfaas.coordinator")

__all__ = ["Startup", "create_topics", "epoch_log_used", "resumed_map"]

#: Seconds a restarting broker or MinIO may take before the coordinator gives up.
PATIENCE = 120.0


class Startup(Service):
    """The topics, the layout, and whether the cluster resumes (see the module docstring);
    ``rounds_remote``: where the snapshot rounds are published."""

    part = "topics"

    def __init__(self, settings: Settings, app: str, state: ClusterState,
                 rounds_remote: Callable[[], Remote], *, kafka: KafkaPort | None = None,
                 clock: ClockPort | None = None) -> None:
        self._settings = settings
        self._app = app
        self._state = state
        self._rounds_remote = rounds_remote
        #: the Kafka and clock ports (``sfaas.runtime.ports``; the process's when None)
        self._kafka = kafka or ports.current().kafka
        self._clock = clock or ports.current().clock
        #: set by the start: a restarted coordinator recovers before any epoch
        self.resumed = False

    async def on_start(self) -> None:
        s, app, state = self._settings, self._app, self._state
        ingress, egress = s.topics(app)
        topics = {ingress: s.partitions, egress: s.partitions}
        if s.snapshot_interval > 0:
            topics[s.epoch_log_topic(app)] = 1
        partitions = (await create_topics(s.kafka, topics, s.replication, port=self._kafka,
                                          clock=self._clock))[ingress]
        if partitions < s.workers:
            raise ClusterError(f"topic {ingress} has {partitions} partitions < {s.workers} workers")
        state.configure(partitions, s.workers, default_owners(partitions, s.workers))
        self.resumed = s.snapshot_interval > 0 and await epoch_log_used(
            s.kafka, s.epoch_log_topic(app), port=self._kafka, clock=self._clock)
        if self.resumed:
            state.resume()  # (the ready file says so from its first writing)
            resumed = await resumed_map(self._rounds_remote, partitions, s.workers,
                                        clock=self._clock)
            if resumed is not None:
                state.configure(partitions, *resumed)


async def create_topics(kafka: str, topics: dict[str, int], replication: int = 1, *,
                        port: KafkaPort | None = None, clock: ClockPort | None = None,
                        ) -> dict[str, int]:
    """Create ``topics`` (name → partitions) if missing; their partition counts. A broker
    that is restarting must not make the supervisor give up on us: retried for a while.
    ``port``, ``clock``: the Kafka and clock ports (the process's when None)."""
    clock = clock or ports.current().clock
    deadline = clock.monotonic() + PATIENCE
    while True:
        try:
            return await ensure_topics(kafka, topics, replication, kafka=port)
        except Exception as exc:
            if clock.monotonic() > deadline:
                raise
            log.warning("Kafka at %s unreachable (%s); retrying", kafka, exc)
            await asyncio.sleep(1.0)


async def epoch_log_used(kafka: str, topic: str, *, port: KafkaPort | None = None,
                         clock: ClockPort | None = None) -> bool:
    """Did a cluster run on the epoch log ``topic`` before this coordinator? It writes its
    start record and reads the log up to it, so a stale leader's short end cannot make a
    used cluster look new (``sfaas.runtime.epochlog``, "Starts"). Kafka unreachable:
    retried for :data:`PATIENCE` seconds."""
    from aiokafka import TopicPartition

    clock = clock or ports.current().clock
    tp = TopicPartition(topic, 0)
    start = await _write_start(kafka, topic, port, clock)
    if start == 0:
        return False
    # (retry_backoff_ms: the lookup waits one backoff for the topic's metadata, 100 ms
    # by default — a tenth of a coordinator's restart)
    consumer = (port or ports.current().kafka).consumer(
        bootstrap_servers=kafka, enable_auto_commit=False, retry_backoff_ms=10)
    await consumer.start()
    try:
        beginning = (await consumer.beginning_offsets([tp]))[tp]
    finally:
        await consumer.stop()
    frm = max(beginning, start - START_WINDOW)
    got = await read_range(kafka, {tp: frm}, {tp: start + 1}, kafka=port)
    return used_before(got[0], start, beginning)


async def _write_start(kafka: str, topic: str, port: KafkaPort | None,
                       clock: ClockPort) -> int:
    """This coordinator's start record written to the epoch log (``acks=all``): its offset."""
    deadline = clock.monotonic() + PATIENCE
    record = StartRecord(clock.time()).encode()
    while True:
        producer = make_producer(kafka, durable=True, kafka=port)
        try:
            await producer.start()
            try:
                return int((await (await producer.send(topic, record, partition=0))).offset)
            finally:
                await producer.stop()
        except Exception as exc:
            if clock.monotonic() > deadline:
                raise
            log.warning("cannot write the start record to %s (%s); retrying", topic, exc)
            await asyncio.sleep(1.0)


async def resumed_map(rounds_remote: Callable[[], Remote], partitions: int,
                      workers: int, *, clock: ClockPort | None = None,
                      ) -> tuple[int, list[int]] | None:
    """A restarted coordinator: the membership size and partition map of the newest round
    (a rescale may have changed them since the cluster started); None: keep the default
    map of ``workers`` (the settings') slots."""
    clock = clock or ports.current().clock
    deadline = clock.monotonic() + PATIENCE
    while True:
        try:
            latest = await asyncio.to_thread(Rounds(rounds_remote()).latest)
            break
        except Exception as exc:  # MinIO down: the recovery that follows needs it anyway
            if clock.monotonic() > deadline:
                raise
            log.warning("cannot read the snapshot rounds (%s); retrying", exc)
            await asyncio.sleep(1.0)
    if latest is None or not latest.owners:
        return None
    if len(latest.owners) != partitions:
        log.warning("round %d's partition map has %d partitions, the topic %d: using round robin",
                    latest.round, len(latest.owners), partitions)
        return None
    if latest.workers != workers:
        log.warning("round %d was taken with %d workers (a rescale); waiting for %d, not %d "
                    "(settings)", latest.round, latest.workers, latest.workers, workers)
    return latest.workers, list(latest.owners)
