"""A worker's part of a recovery: roll back to a round, prepare the epoch log's replay.

On ``wire.Recover(attempt, round, peers)`` every worker — survivors and the replacement of
a dead one alike — does the same (global rollback, Styx's way):

1. stop: cancel ingest and every execution in flight, fail calls waiting on peers;
   let replies already handed to Kafka finish (they are correct: deterministic);
2. reconnect peers whose address changed (a replaced worker);
3. restore every store to the round (``restore`` downloads only files the local directory
   lacks; round 0 = the empty state before any round);
4. read the epoch log after the round (``sfaas.runtime.epochlog``), this worker's ingress from the
   round's positions, and the egress topic from the round's positions (request ids
   already answered: their replies are not produced again) — these reads and the stores'
   restores (a thread each) run at once;
5. rebuild the epoch loop: logged batches wait for their replay epochs; requests the round
   holds are done; the round's waiting re-runs go back to the sequencer with their tids;
   everything else is queued in offset order;
6. seek ingress past what was read, restart ingest, and report ``wire.Recovered`` with the
   logged epochs to replay (the coordinator then drives them as ``Begin(replay=True)``).

A round's report is sent only once the replies of every request it holds are acknowledged
(``Worker.on_epoch_committed``), so a rollback never needs a reply it cannot reproduce.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from aiokafka import TopicPartition

from sfaas.runtime import wire
from sfaas.runtime.epochlog import EpochRecord, Logged
from sfaas.runtime.kafka import read_range
from sfaas.runtime.partitioning import owned
from sfaas.runtime.protocols.rounds import RoundManifest, Rounds
from sfaas.runtime.state import open_stores, rounds_remote
from sfaas.runtime.txn.epochs import Sequencer
from sfaas.runtime.txn.loop import Participant
from sfaas.runtime.txn.offsets import OffsetTracker
from worker.ingress import admit

if TYPE_CHECKING:
    from statestores import Store
    from worker.service import Worker, _Pending

log = logging.getLogger("sfaas.worker.recovery")

T = TypeVar("T", bound=Logged)

__all__ = ["recover", "replay_batch"]


def _adopt_map(w: Worker, owners: list[int], n_workers: int) -> None:
    """(a thread) Close the stores of partitions ``owners`` no longer gives ``w``, open
    those it now owns (the restore that follows fills them from the round)."""
    assert w.engine is not None
    mine = set(owned(owners, w.index))
    have = {p for _, p in w.engine.stores}
    gone = have - mine
    w.moving.detach(gone, len(owners)).close()
    if mine - have:
        w.engine.stores.update(open_stores(w.settings, w.app, sorted(mine - have), len(owners)).items())
        log.warning("recovery under a new partition map: opened partitions %s, closed %s", sorted(mine - have),
                    sorted(gone), extra={"worker": w.index})
    w.engine.owners = list(owners)
    w.engine.n_workers = n_workers
    w.assign.owners, w.assign.n_workers = list(owners), n_workers


def _empty_round(partitions: int) -> RoundManifest:
    return RoundManifest(0, 0, 0, partitions, (), {p: 0 for p in range(partitions)}, {}, {}, (), 0)


def replay_batch(rec: EpochRecord, items: Mapping[tuple[int, int], T], round_id: int) -> list[tuple[int, T]]:
    """The batch ``rec`` logged, as ``(tid, item)`` from ``items`` (by ingress partition and
    offset), each item given the ``now`` it ran with: a re-run's from its first run, a new
    one's its epoch's (this worker's: under a lease each worker's epoch has its own)."""
    batch = []
    for (tid, p, off), now in zip(rec.batch, rec.nows(), strict=True):
        item = items.get((p, off))
        if item is None:
            raise RuntimeError(f"epoch {rec.epoch} logged ingress {p}:{off}, which is not after round {round_id}")
        item.now = now
        batch.append((tid, item))
    return batch


async def recover(w: Worker, msg: wire.Recover) -> list[list[Any]]:
    """Roll ``w`` back to round ``msg.round``; returns the logged epochs to replay, ``[epoch, now]``."""
    from worker.service import _Pending, _request_of

    assert w.engine is not None and w.loop is not None
    s, assign, me = w.settings, w.assign, w.index
    # 1. stop
    await w.stop_activity()
    w.moving.stop()  # a rescale in progress is abandoned (the coordinator starts it over)
    w.moving.resume_merges()
    w._skip, w._retry_at = {}, {}
    # 2. peers, and the partition map (a rescale may have changed it)
    for j in [j for j in w.peers if j >= len(msg.peers)]:
        w.peers.pop(j).close()
    await w.reconnect_peers(msg.peers)
    await asyncio.to_thread(_adopt_map, w, msg.owners, len(msg.peers))
    # 3. the round, and every store back to it
    if msg.round > 0:
        m = await asyncio.to_thread(Rounds(rounds_remote(s, w.app.name)).read, msg.round)
    else:
        m = _empty_round(assign.partitions)
    # the stores' restores (threads: file moves, MinIO) overlap the three Kafka reads
    def restore(op: str, p: int, store: Store) -> None:
        if m.round > 0:
            info = store.restore(m.round)
            log.info("restored %s/p%d to round %d: %d of %d files downloaded", op, p, m.round,
                     info.files_downloaded, info.files_total, extra={"worker": me})
        else:  # no round yet: back to empty
            store.write_batch([(k, None) for k, _ in store.items()])

    # 4. the log after the round, my ingress, the replies already out
    mine = owned(assign.owners, me)
    log_topic = s.epoch_log_topic(w.app.name)
    out_parts = await w.producer.partitions_for(assign.egress_topic)
    restores = asyncio.gather(*(asyncio.to_thread(restore, op, p, store) for (op, p), store in w.engine.stores.items()),
                              return_exceptions=True)
    got = await asyncio.gather(  # every part ends before this recovery does, failed or not
        restores,
        read_range(s.kafka, {TopicPartition(log_topic, 0): m.epoch_log}),
        read_range(s.kafka, {TopicPartition(assign.ingress_topic, p): m.ingress.get(p, 0) for p in mine}),
        read_range(s.kafka, {TopicPartition(assign.egress_topic, p): m.egress.get(p, 0) for p in out_parts}),
        return_exceptions=True,
    )
    parts = [*(got[0] if isinstance(got[0], list) else [got[0]]), *got[1:]]
    errors = [x for x in parts if isinstance(x, BaseException)]
    if errors:
        raise errors[0]
    raw_log, raw_in, raw_out = cast("list[dict[int, list[tuple[int, bytes]]]]", got[1:])
    records = [EpochRecord.decode(v, f"{log_topic}@{o}") for o, v in raw_log[0]]
    later = [r for r in records if r.epoch > m.epoch]
    answered: set[str] = set()
    for recs in raw_out.values():
        for _, v in recs:
            try:
                answered.add(wire.Reply.decode(v).rid)
            except Exception as exc:  # not ours to judge: a foreign record in the topic
                log.warning("skipping an undecodable egress record: %s", exc)
    # 5. the epoch loop, rebuilt
    w.offsets, w.applied = OffsetTracker(), OffsetTracker()
    w.loop = Participant(w.engine, Sequencer(me), _request_of, s.max_batch, fallback=w.fallback_enabled)
    w.answered = answered
    items: dict[tuple[int, int], _Pending] = {}
    for p in mine:
        skip = set(m.skip.get(p, ()))
        for off, value in raw_in.get(p, []):
            w.offsets.take(p, off)
            w.applied.take(p, off)
            if off in skip:  # in the state, and its reply is out (see the module docstring)
                w.offsets.complete(p, off)
                w.applied.complete(p, off)
                continue
            req = admit(w, p, off, value)
            if req is None:  # rejected (and answered, unless its reply is already out)
                continue
            items[(p, off)] = _Pending(req, p, off)
    in_log: set[tuple[int, int]] = set()
    w.replay_batches = {}
    for r in later:
        if r.worker != me:
            continue
        w.replay_batches[r.epoch] = replay_batch(r, items, m.round)
        in_log.update((p, off) for _, p, off in r.batch)
    waiting = {(p, off): (tid, now) for tid, p, off, now in m.retries if p in mine}
    for key, item in sorted(items.items()):
        if key in waiting:
            tid, item.now = waiting[key]  # (a logged re-run's record says the same now)
            w.loop.sequencer.requeue(tid, item)
        elif key not in in_log:
            w.loop.queue.append(item)
    # 6. live again after the replay
    w.consumer.assign([TopicPartition(assign.ingress_topic, p) for p in mine])
    for p in mine:
        recs = raw_in.get(p, [])
        nxt = recs[-1][0] + 1 if recs else m.ingress.get(p, 0)
        w.consumer.seek(TopicPartition(assign.ingress_topic, p), nxt)
        w.start_offsets[p] = nxt
    w.engine.begin(m.epoch)  # a peer's replay call for epoch > m.epoch waits for its Begin
    w.start_ingest()
    epochs = sorted({(r.epoch, r.now) for r in later})
    log.info("recovery %d: rolled back to round %d (epoch %d); %d logged epochs to replay, %d requests queued, "
             "%d replies already out", msg.attempt, m.round, m.epoch, len(epochs), len(w.loop.queue),
             len(answered), extra={"worker": me})
    return [[e, now] for e, now in epochs]
