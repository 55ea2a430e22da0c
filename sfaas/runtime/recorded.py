"""What a cluster recorded after a snapshot round, read back for a replay.

A worker's recovery reads the same things for its own partitions
(``worker.protocols.recovery`` steps 3–4); ``sfaas replay`` (``sfaas.testing.replay``)
reads them for the whole app: the round's manifest (and those of later rounds, whose
partition maps say where a rescale moved partitions), the epoch log after the round's
position, every ingress partition from the round's positions, and the egress topic
``read_committed`` (replies are written in Kafka transactions: ``worker.egress``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from aiokafka import TopicPartition

from sfaas.errors import ReplayError
from sfaas.runtime import ports, wire
from sfaas.runtime.epochlog import EpochRecord, decode_record, live
from sfaas.runtime.kafka import read_range
from sfaas.runtime.partitioning import default_owners
from sfaas.runtime.ports import KafkaPort, ObjectsPort
from sfaas.runtime.protocols.rounds import RoundManifest, Rounds
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import rounds_remote

log = logging.getLogger("sfaas.runtime.recorded")

__all__ = ["Recorded", "empty_round", "read_round", "read_recorded"]


@dataclass
class Recorded:
    """A round and what the cluster recorded after it."""

    manifest: RoundManifest
    #: the epoch-log records of the epochs after the round, in log order
    records: list[EpochRecord]
    #: the ingress records from the round's positions, by ``(partition, offset)``
    requests: dict[tuple[int, int], wire.Request]
    #: the committed replies from the round's positions, by request id
    replies: dict[str, wire.Reply]
    #: ``(epoch, owners)``: the partition map epochs after ``epoch`` ran under (later rounds)
    maps: list[tuple[int, list[int]]]


def empty_round(partitions: int, workers: int) -> RoundManifest:
    """Round 0: the empty state before any round, the logs read from their beginnings."""
    return RoundManifest(0, 0, workers, partitions, (), {p: 0 for p in range(partitions)},
                         {}, {}, (), 0)


def read_round(settings: Settings, app_name: str, round_id: int, *,
               objects: ObjectsPort | None = None,
               ) -> tuple[RoundManifest, list[tuple[int, list[int]]]]:
    """(blocking) Round ``round_id``'s manifest and the partition maps of the rounds after
    it; :class:`ReplayError` naming the retained rounds when it is not one of them.
    ``objects``: the object port (``sfaas.runtime.ports``; the process's when None)."""
    rounds = Rounds(rounds_remote(settings, app_name, objects=objects))
    try:
        ids = rounds.ids()
        if round_id not in ids:
            raise ReplayError(
                f"round {round_id} of app {app_name!r} is not in MinIO (namespace "
                f"{settings.namespace!r}, bucket {settings.bucket!r}): the complete rounds "
                f"retained are {ids or 'none'} (sfaas snapshots --app {app_name})")
        m = rounds.read(round_id)
        later = [rounds.read(r) for r in ids if r > round_id]
    except ReplayError:
        raise
    except Exception as exc:  # RemoteError, RoundError: both name the remote
        raise ReplayError(f"cannot read round {round_id} of app {app_name!r}: {exc}") from None
    maps, now = [], _owners(m)
    for r in later:
        if _owners(r) != now:
            now = _owners(r)
            maps.append((r.epoch, now))
    return m, maps


def _owners(m: RoundManifest) -> list[int]:
    return list(m.owners) or default_owners(m.partitions, m.workers)


async def _partitions(bootstrap: str, topic: str, kafka: KafkaPort) -> int:
    """How many partitions ``topic`` has (0: it does not exist)."""
    admin = kafka.admin(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (found,) = await admin.describe_topics([topic])
        return 0 if found.get("error_code") else len(found.get("partitions") or ())
    finally:
        await admin.close()


async def read_recorded(settings: Settings, app_name: str, m: RoundManifest,
                        maps: list[tuple[int, list[int]]],
                        say: Callable[[str], None] = lambda _: None, *,
                        kafka: KafkaPort | None = None) -> Recorded:
    """The epoch log, ingress and committed replies after round ``m`` of ``app_name``, read
    through ``kafka`` (the Kafka port; the process's when None)."""
    log_topic = settings.epoch_log_topic(app_name)
    in_topic, out_topic = settings.topics(app_name)
    port = kafka or ports.current().kafka
    outs = await _partitions(settings.kafka, out_topic, port)
    if not await _partitions(settings.kafka, log_topic, port):
        raise ReplayError(f"topic {log_topic} does not exist: app {app_name!r} never ran with "
                          f"snapshot rounds in namespace {settings.namespace!r}")
    say(f"reading {log_topic} from offset {m.epoch_log}, {in_topic} and {out_topic} "
        f"(Kafka at {settings.kafka})")
    raw_log, raw_in, raw_out = await asyncio.gather(
        read_range(settings.kafka, {TopicPartition(log_topic, 0): m.epoch_log}, kafka=port),
        read_range(settings.kafka, {TopicPartition(in_topic, p): m.ingress.get(p, 0)
                                    for p in range(m.partitions)}, kafka=port),
        read_range(settings.kafka, {TopicPartition(out_topic, p): m.egress.get(p, 0)
                                    for p in range(outs)}, committed=True, kafka=port))
    decoded = [(off, decode_record(value, f"{log_topic}@{off}")) for off, value in raw_log[0]]
    records = [rec for _, rec in live(decoded, m.epoch_log)  # (void records never count)
               if isinstance(rec, EpochRecord) and rec.epoch > m.epoch]
    requests = {}
    for p, recs in raw_in.items():
        for off, value in recs:
            try:
                requests[(p, off)] = wire.Request.decode(value)
            except Exception as exc:  # (answered BadRequest, never run: not in the log)
                log.debug("ingress %d:%d does not decode: %s", p, off, exc)
    replies: dict[str, wire.Reply] = {}
    for recs in raw_out.values():
        for _, value in recs:
            try:
                reply = wire.Reply.decode(value)
            except Exception as exc:  # not ours to judge: a foreign record in the topic
                log.warning("skipping an undecodable egress record: %s", exc)
                continue
            replies.setdefault(reply.rid, reply)
    if m.round == 0 and records:  # (the empty round's workers: every one that logged)
        m = replace(m, workers=max(r.worker for r in records) + 1)
    return Recorded(m, records, requests, replies, maps)
