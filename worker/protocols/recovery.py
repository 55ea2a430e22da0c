"""A worker's part of a recovery: roll back to a round, prepare the epoch log's replay.

On ``wire.Recover(attempt, round, peers)`` every worker — survivors and the replacement of
a dead one alike — does the same (global rollback, Styx's way):

1. stop: cancel ingest and every execution in flight, fail calls waiting on peers;
   let replies already handed to Kafka finish (they are correct: deterministic);
2. reconnect peers whose address changed (a replaced worker);
3. restore every store to the round (``restore`` downloads only files the local directory
   lacks; round 0 = the empty state before any round);
4. read the epoch log after the round (``sfaas.runtime.epochlog``), this worker's ingress from the
   round's positions, and the egress topic from the round's positions, ``read_committed``
   (request ids already answered: their replies are not produced again; a dead
   predecessor's open transaction was aborted when this slot's producer started,
   ``worker.egress``) — these reads and the stores' restores (a thread each) run at once;
5. rebuild the epoch loop: logged batches wait for their replay epochs; requests the round
   holds are done; the round's waiting re-runs go back to the sequencer with their tids;
   everything else is queued in offset order;
6. seek ingress past what was read, restart ingest, and report ``wire.Recovered`` with the
   logged epochs to replay (the coordinator then drives them as ``Begin(replay=True)``).

A round's report is sent only once the replies of every request it holds are acknowledged
(``worker.epochs.EpochRunner``), so a rollback never needs a reply it cannot reproduce.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar, cast

from aiokafka import TopicPartition

from remotes.manifest import ManifestError
from sfaas.app import App
from sfaas.errors import ConfigError
from sfaas.runtime import wire
from sfaas.runtime.epochlog import CutRecord, EpochRecord, Logged, decode_record
from sfaas.runtime.kafka import read_range
from sfaas.runtime.liveness import Turns
from sfaas.runtime.partitioning import owned
from sfaas.runtime.protocols.rounds import RoundError, RoundManifest, Rounds
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import open_stores, rounds_remote
from statestores.errors import (
    BackgroundBusy,
    BackgroundDied,
    LockedError,
    StoreClosedError,
    StoreError,
)
from worker.clients import KafkaClients
from worker.direct import DirectIngress
from worker.ingress import Ingress
from worker.links import CoordinatorLink, PeerLinks
from worker.protocols.rescale import Moving
from worker.state import Pending, WorkerState

if TYPE_CHECKING:
    from statestores import Store

log = logging.getLogger("sfaas.worker.recovery")

T = TypeVar("T", bound=Logged)

__all__ = ["Recovery", "check_round_layout", "permanent", "replay_batch"]


def _empty_round(partitions: int) -> RoundManifest:
    return RoundManifest(0, 0, 0, partitions, (), {p: 0 for p in range(partitions)}, {}, {}, (), 0)


def replay_batch(rec: EpochRecord, items: Mapping[tuple[int, int], T],
                 round_id: int) -> list[tuple[int, T]]:
    """The batch ``rec`` logged, as ``(tid, item)`` from ``items`` (by ingress partition and
    offset), each item given the ``now`` it ran with: a re-run's from its first run, a new
    one's its epoch's (this worker's: under a lease each worker's epoch has its own)."""
    batch = []
    for (tid, p, off), now in zip(rec.batch, rec.nows(), strict=True):
        # (a request the runtime made, or a direct one, is found as (partition, -1 - tid))
        item = items.get((p, off) if off >= 0 else (p, -1 - tid))
        if item is None:
            raise RuntimeError(f"epoch {rec.epoch} logged ingress {p}:{off}, which is not after "
                               f"round {round_id}")
        item.now = now
        batch.append((tid, item))
    return batch


class Recovery:
    """This worker's part of each recovery (see the module docstring).

    ``quiesce()`` stops ingest and every execution in flight and waits until the replies
    already made are acknowledged (step 1).
    """

    def __init__(
        self, settings: Settings, app: App, state: WorkerState, *, uplink: CoordinatorLink,
        links: PeerLinks, kafka: KafkaClients, ingress: Ingress, direct: DirectIngress,
        moving: Moving, quiesce: Callable[[], Awaitable[None]],
        rolling_back: Callable[[], None] = lambda: None,
        restored: Callable[[], None] = lambda: None,
        replies_acked: Callable[[], dict[int, int]] = dict,
    ) -> None:
        self._settings = settings
        self._app = app
        self._state = state
        self._uplink = uplink
        self._links = links
        self._kafka = kafka
        self._ingress = ingress
        self._direct = direct
        self._moving = moving
        self._quiesce = quiesce
        self._rolling_back = rolling_back
        self._restored = restored
        #: egress partition → the offset after this process's last acknowledged reply
        self._replies_acked = replies_acked

    async def run(self, msg: wire.Recover) -> None:
        """Recover for ``msg``; answer ``Recovered`` (with the error, if it failed)."""
        st = self._state
        st.recovering(msg.attempt)
        try:
            epochs = await self.recover(msg)
        except Exception as exc:
            log.exception("recovery %d failed", msg.attempt, extra={"worker": st.index})
            error = f"{type(exc).__name__}: {exc}"[:2000]
            self._uplink.send(wire.Recovered(msg.attempt, st.index, [], error, permanent(exc)))
            return
        await self._uplink.held()  # (a fenced worker answers nothing: worker.fence)
        self._uplink.send(wire.Recovered(msg.attempt, st.index, epochs, "", False))

    def _adopt_map(self, owners: list[int]) -> None:
        """(a thread) Close the stores of partitions ``owners`` no longer gives this worker,
        open those it now owns (the restore that follows fills them from the round)."""
        st = self._state
        assert st.engine is not None
        mine = set(owned(owners, st.index))
        have = {p for _, p in st.engine.stores}
        gone = have - mine
        self._moving.detach(gone, len(owners)).close()
        if mine - have:
            opened = open_stores(self._settings, self._app, sorted(mine - have), len(owners))
            st.engine.stores.update(opened.items())
            self._moving.ship_to_standbys(opened)  # (the coordinator tells them to follow)
            log.warning("recovery under a new partition map: opened partitions %s, closed %s",
                        sorted(mine - have), sorted(gone), extra={"worker": st.index})

    async def recover(self, msg: wire.Recover) -> list[wire.LoggedEpoch]:
        """Roll back to round ``msg.round``; returns the logged epochs to replay."""
        st, s, me = self._state, self._settings, self._state.index
        assert st.engine is not None and st.loop is not None
        steps: dict[str, float] = {}  # where this recovery's time went (logged at the end)
        t = time.perf_counter()

        def step(name: str) -> None:
            nonlocal t
            now = time.perf_counter()
            steps[name] = now - t
            t = now

        # 1. stop
        await self._quiesce()
        self._rolling_back()
        self._moving.stop()  # a rescale in progress is abandoned (the coordinator starts it over)
        self._moving.resume_merges()
        st.drop_expected()
        # 2. peers, and the partition map (a rescale may have changed it)
        self._links.drop_from(len(msg.peers))
        await self._links.connect(msg.peers, me)
        await asyncio.to_thread(self._adopt_map, msg.owners)
        st.set_owners(msg.owners, len(msg.peers), msg.peers)
        step("stop+peers")
        # 3. the round, and every store back to it
        if msg.round > 0:
            m = await asyncio.to_thread(Rounds(rounds_remote(s, self._app.name)).read, msg.round)
        else:
            m = _empty_round(st.partitions)
        check_round_layout(m, {k: store.engine for k, store in st.engine.stores.items()},
                           st.partitions)
        step("round")
        # the stores' restores (threads: file moves, MinIO) overlap the three Kafka reads
        def restore(op: str, p: int, store: Store) -> float:
            """(a thread) Store ``(op, p)`` back to the round; the seconds since the round
            was read until it was done."""
            if m.round > 0:
                info = store.restore(m.round)
                log.info("restored %s/p%d to round %d: %d of %d files downloaded", op, p, m.round,
                         info.files_downloaded, info.files_total, extra={"worker": me})
            else:  # no round yet: back to empty
                store.write_batch([(k, None) for k, _ in store.items()])
            return time.perf_counter() - t

        # 4. the log after the round, my ingress, the replies already out
        mine = st.mine()
        log_topic = s.epoch_log_topic(self._app.name)
        out_parts = await self._kafka.producer.partitions_for(st.egress_topic)
        restores = asyncio.gather(*(asyncio.to_thread(restore, op, p, store)
                                    for (op, p), store in st.engine.stores.items()),
                                  return_exceptions=True)
        # (each read reaches at least what this process knows was acknowledged: a stale
        # leader's end offsets are short, and a record a recovery misses runs twice)
        taken, acked = self._ingress.read_to(), self._replies_acked()
        got = await asyncio.gather(  # every part ends before this recovery does, failed or not
            restores,
            read_range(s.kafka, {TopicPartition(log_topic, 0): m.epoch_log},
                       {TopicPartition(log_topic, 0): st.log_pos}),
            read_range(s.kafka, {TopicPartition(st.ingress_topic, p): m.ingress.get(p, 0)
                                 for p in mine},
                       {TopicPartition(st.ingress_topic, p): o for p, o in taken.items()}),
            read_range(s.kafka, {TopicPartition(st.egress_topic, p): m.egress.get(p, 0)
                                 for p in out_parts},
                       {TopicPartition(st.egress_topic, p): o for p, o in acked.items()},
                       committed=True),  # (a dead predecessor's aborted replies: worker.egress)
            return_exceptions=True,
        )
        parts = [*(got[0] if isinstance(got[0], list) else [got[0]]), *got[1:]]
        errors = [x for x in parts if isinstance(x, BaseException)]
        if errors:
            raise errors[0]
        steps["stores"] = max(cast("list[float]", got[0]), default=0.0)  # (beside the reads)
        step("stores+reads")
        raw_log, raw_in, raw_out = cast("list[dict[int, list[tuple[int, bytes]]]]", got[1:])
        # (the heartbeats go on while the records are decoded and taken: decoding 60,000
        # in one go held the loop past the heartbeat timeout, the coordinator declared the
        # worker lost and started the recovery over — which read as much again, a storm)
        turn = Turns()
        later: list[EpochRecord] = []
        cuts: list[CutRecord] = []  # (the round's cut of the direct requests, every worker's)
        for o, v in raw_log[0]:
            await turn()
            r = decode_record(v, f"{log_topic}@{o}")
            if isinstance(r, CutRecord):
                if r.round == m.round:
                    cuts.append(r)
            elif r.epoch > m.epoch:
                later.append(r)
        answered: dict[str, wire.Reply] = {}
        for recs in raw_out.values():
            for _, v in recs:
                await turn()
                try:
                    reply = wire.Reply.decode(v)
                    answered[reply.rid] = reply
                except Exception as exc:  # not ours to judge: a foreign record in the topic
                    log.warning("skipping an undecodable egress record: %s", exc)
        # 5. the epoch loop, rebuilt: every request after the round taken as ingest takes it
        st.restart(answered)
        self._ingress.forget_held_reads()  # (taken again below)
        loop = st.loop
        assert loop is not None
        items: dict[tuple[int, int], Pending] = {}
        for p in mine:
            held = set(m.skip.get(p, ()))  # in the state, its reply out (see the module docstring)
            for off, value in raw_in.get(p, []):
                await turn()
                item = self._ingress.take(p, off, value, held)
                if item is not None:
                    items[(p, off)] = item
        in_log: set[object] = set()  # (positions, and direct requests' ids)
        replays = {}
        journals: dict[int, dict[int, dict[str, object]]] = {}
        for r in later:
            if r.worker != me:
                continue
            await turn()
            own = {(-1, -1 - tid): Pending.runtime(*req)
                   for tid, req in r.runtime_requests().items()}
            own.update(direct_items(r))
            replays[r.epoch] = replay_batch(r, {**items, **own} if own else items, m.round)
            journals[r.epoch] = dict(r.journals)
            in_log.update((p, off) for _, p, off in r.batch)
            in_log.update(_rids(own.values()))
        st.plan_replays(replays, journals)
        self._direct.expect(item for batch in replays.values() for _, item in batch)
        self._requeue_direct(cuts, set(mine), in_log)
        waiting = {(p, off): (tid, now, j) for tid, p, off, now, j in m.retries if p in mine}
        for key, item in sorted(items.items()):
            await turn()
            if key in waiting:
                # (a logged re-run's record says the same now; its journal as of the cut)
                tid, now, journal = waiting[key]
                item.rerun(now, journal)
                loop.sequencer.requeue(tid, item)
            elif key not in in_log:
                loop.queue.append(item)
        # 6. live again after the replay
        at = {}
        for p in mine:
            recs = raw_in.get(p, [])
            at[p] = recs[-1][0] + 1 if recs else m.ingress.get(p, 0)
        self._direct.restore(cuts, set(mine))
        st.engine.begin(m.epoch)  # a peer's replay call for epoch > m.epoch waits for its Begin
        self._restored()
        self._ingress.restart_at(at)
        epochs = sorted({(r.epoch, r.now) for r in later})
        step("rebuild")
        log.info("recovery %d: rolled back to round %d (epoch %d); %d logged epochs to replay, %d "
                 "requests queued, %d replies already out, %d turns given to the loop (%s)",
                 msg.attempt, m.round, m.epoch, len(epochs), len(loop.queue), len(answered),
                 turn.given,
                 ", ".join(f"{k} {v:.2f} s" for k, v in steps.items()), extra={"worker": me})
        return [wire.LoggedEpoch(e, now) for e, now in epochs]


    def _requeue_direct(self, cuts: list[CutRecord], mine: set[int],
                        in_log: set[object]) -> None:
        """The direct requests the round's cut kept waiting (their tids, first ``now`` and
        journals), but those a logged epoch after the round runs again."""
        loop = self._state.loop
        assert loop is not None
        back = []
        for cut in cuts:
            for tid, p, now, journal, raw in cut.retries:
                if p not in mine:
                    continue
                item = Pending(wire.Request.decode(raw), p, -1, now, journal=dict(journal),
                               raw=raw)
                if item.request.rid not in in_log:
                    loop.sequencer.requeue(tid, item)
                    back.append(item)
        self._direct.expect(back)


def direct_items(rec: EpochRecord) -> dict[tuple[int, int], Pending]:
    """The direct requests ``rec`` logged whole, by ``(partition, -1 - tid)``."""
    at = {t: p for t, p, o in rec.batch if o < 0 <= p}
    return {(at[t], -1 - t): Pending(wire.Request.decode(raw), at[t], -1, raw=raw)
            for t, raw in rec.direct}


def _rids(items: Iterable[Pending]) -> set[str]:
    return {it.request.rid for it in items if it.direct}


def permanent(exc: BaseException) -> bool:
    """Whether a failed rollback cannot succeed by trying again: the round or the stores
    disagree with this run's configuration, or a file or manifest is corrupt. A lost
    connection, an unreachable MinIO or a busy background process can."""
    if isinstance(exc, (BackgroundBusy, BackgroundDied, LockedError, StoreClosedError)):
        return False
    return isinstance(exc, (ConfigError, StoreError, ManifestError, RoundError))


def check_round_layout(m: RoundManifest, engines: Mapping[tuple[str, int], str],
                       partitions: int) -> None:
    """Refuse to roll back to round ``m`` when it was taken in another partition count or
    with another engine than this worker's stores (``engines``) — its keys would read as
    absent — naming both."""
    if m.round > 0 and m.partitions != partitions:
        raise ConfigError(
            f"round {m.round} was taken in {m.partitions} partitions; this cluster runs "
            f"{partitions}: its keys would be looked up in the wrong partitions. Use the "
            "partition count the state was written with, or a fresh namespace")
    for cut in m.stores:
        have = engines.get((cut.operator, cut.partition))
        if cut.engine and have is not None and have != cut.engine:
            raise ConfigError(
                f"round {m.round} holds operator {cut.operator!r} (partition "
                f"{cut.partition}) written by engine {cut.engine!r}; this run opens it with "
                f"engine {have!r}. Use the engine the state was written with, or a fresh "
                "namespace")
