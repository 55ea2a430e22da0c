"""A worker's membership: joining the cluster (directly or through a standby phase),
rejoining a restarted coordinator in the same slot, and starting Kafka clients patiently.

Functions of the :class:`~worker.service.Worker` they serve (they set its ``coord``
channel and read its settings); the epoch loop lives in ``worker.service``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition

from sfaas.errors import ChannelClosed, ClusterError
from sfaas.runtime import wire
from sfaas.runtime.kafka import consumer_group, make_consumer, make_producer
from sfaas.runtime.state import PartitionStores

if TYPE_CHECKING:
    from worker.service import Worker

log = logging.getLogger("sfaas.worker")

__all__ = ["join", "rejoin", "start_clients", "start_kafka", "warm_up"]


async def join(w: Worker, my_port: int) -> tuple[wire.Assign, PartitionStores | None, wire.Reassign | None]:
    """Register with the coordinator and get a slot: at once, or — answered ``Follow`` — as a
    standby first (``worker.protocols.standby``) until promoted, then for the dead primary's slot with
    the promoted stores, or — answered ``Move`` — as a worker joining a scale-up
    (``worker.protocols.rescale``), with the stores it took over and the ``Reassign`` saying where
    their requests resume. Raises :class:`ClusterError` if refused."""
    s = w.settings
    chost, cport = s.coordinator_address()
    repl_port = w.shipping.port if w.shipping else 0
    w.coord = await w._connect_retry(chost, cport)
    w.coord.send(wire.Register(w.name, s.host, my_port, os.getpid(), -1, s.standby_of, repl_port))
    assign = (await w.coord.recv())[0]
    promoted = None
    if isinstance(assign, wire.Move):
        from worker.protocols.rescale import join_as_receiver

        await _start_early(w)
        takeover, promoted = await join_as_receiver(w, assign)  # (it sets w.assign)
        return w.assign, promoted, takeover
    if isinstance(assign, wire.Follow):
        from worker.protocols.standby import run_standby

        # the Kafka clients take ~0.3 s to start: have them ready before a promotion needs them
        await _start_early(w)
        await warm_up(w)
        promoted, index = await run_standby(w, assign)
        w.coord.close()
        w.coord = await w._connect_retry(chost, cport)
        w.coord.send(wire.Register(w.name, s.host, my_port, os.getpid(), index, -1, repl_port))
        assign = (await w.coord.recv())[0]
    if isinstance(assign, wire.Stop):
        if promoted is not None:
            promoted.close()
        raise ClusterError(f"coordinator refused {w.name}: {assign.reason}")
    if not isinstance(assign, wire.Assign):
        raise ClusterError(f"expected Assign from the coordinator, got {type(assign).__name__}")
    return assign, promoted, None


async def _start_early(w: Worker) -> None:
    """The Kafka clients of a worker that is not serving yet (a standby, a rescale's receiver)."""
    s = w.settings
    w.producer = await start_kafka(w, lambda: make_producer(s.kafka, s.linger_ms, durable=True))
    w.consumer_group = consumer_group(s, w.app.name)
    w.consumer = await start_kafka(w, lambda: make_consumer(s.kafka, w.consumer_group, s.fetch_wait_ms))


async def _reply_and_log_partitions(w: Worker, egress: str) -> tuple[list[TopicPartition], list[TopicPartition]]:
    """The egress topic's partitions, and the epoch log's (none when it is off)."""
    out = [TopicPartition(egress, p) for p in await w.producer.partitions_for(egress)]
    return out, [TopicPartition(w._log_topic, 0)] if w._log_topic else []


async def start_clients(w: Worker, assign: wire.Assign) -> None:
    """The worker's Kafka clients for ``assign`` (a promoted standby's are running), and
    where its replies and epoch-log records will land from now on."""
    s = w.settings
    if w.producer is None:  # a promoted standby started its clients while standing by
        w.producer = await start_kafka(w, lambda: make_producer(s.kafka, s.linger_ms, durable=True))
    if w.consumer is None or w.consumer_group != assign.group:
        if w.consumer is not None:
            await w.consumer.stop()
        w.consumer = await start_kafka(w, lambda: make_consumer(s.kafka, assign.group, s.fetch_wait_ms))
        w.consumer_group = assign.group
    # end offsets before assign(): assign() narrows the consumer's metadata to the
    # ingress topic, and an offset lookup of another topic then waits ~0.1 s for a
    # refresh (a promoted standby fetched their metadata while standing by: warm_up)
    out_tps, log_tps = await _reply_and_log_partitions(w, assign.egress_topic)
    w.egress_partitions = len(out_tps)
    ends = await w.consumer.end_offsets(out_tps + log_tps)
    # every reply this worker produces from now on lands above these offsets
    w.egress.acked = {tp.partition: ends[tp] for tp in out_tps}
    if log_tps:
        w._log_pos = ends[log_tps[0]]


async def warm_up(w: Worker) -> None:
    """Fetch the metadata of the app's topics into the Kafka clients now: the first offset
    lookup of a topic new to a client waits ~0.1 s for a metadata refresh, which a standby
    would otherwise pay in the middle of its promotion."""
    try:
        out_tps, log_tps = await _reply_and_log_partitions(w, w.settings.topics(w.app.name)[1])
        await w.consumer.end_offsets(out_tps + log_tps)
    except Exception as exc:  # only a head start: the promotion fetches them anyway
        log.info("could not warm up the Kafka metadata: %s", exc)


async def start_kafka(w: Worker, make: Callable[[], Any], patience: float = 120.0) -> Any:
    """Start a Kafka client, retrying while the broker is unreachable (a broker restart
    must not make the supervisor give up on this worker)."""
    deadline = time.monotonic() + patience
    while True:
        client = make()
        try:
            await client.start()
            return client
        except Exception as exc:
            await client.stop()
            if time.monotonic() > deadline:
                raise ClusterError(f"Kafka at {w.settings.kafka} unreachable for {patience:.0f} s: {exc}") from exc
            log.warning("Kafka at %s unreachable (%s); retrying", w.settings.kafka, exc,
                        extra={"worker": w.index})
            await asyncio.sleep(1.0)

async def rejoin(w: Worker, my_port: int) -> bool:
    """Re-register with the restarted coordinator in the same slot; False: give up (the
    process exits and the supervisor starts a fresh one)."""
    s = w.settings
    log.warning("lost the coordinator; keeping the stores and waiting for it to come back",
                extra={"worker": w.index})
    try:
        w.coord = await w._connect_retry(*s.coordinator_address(), timeout=120.0)
        repl_port = w.shipping.port if w.shipping else 0
        w.coord.send(wire.Register(w.name, s.host, my_port, os.getpid(), w.index, -1, repl_port))
        msgs = await w.coord.recv()
        a = msgs[0] if msgs else None
        if not (isinstance(a, wire.Assign) and a.index == w.index and a.n_workers == w.assign.n_workers
                and a.partitions == w.assign.partitions and a.owners == w.assign.owners):
            log.error("the restarted coordinator assigned %r, not slot %d of %d: restarting",
                      a, w.index, w.assign.n_workers, extra={"worker": w.index})
            return False
        w.assign = a
        await w.reconnect_peers(a.peers)
        w.coord.send(wire.Ready(w.index))
    except (ClusterError, ChannelClosed, OSError) as exc:
        log.error("could not rejoin the coordinator: %s", exc, extra={"worker": w.index})
        return False
    log.info("rejoined the restarted coordinator as worker %d", w.index, extra={"worker": w.index})
    return True
