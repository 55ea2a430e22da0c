"""A recovery's reads and rebuild: what happened after the round, and the epoch loop again.

Steps 4–6 of a worker's recovery (``worker.protocols.recovery``, whose docstring tells
the whole): read the epoch log after the round, this worker's ingress and the egress
topic from the round's positions; decode them (giving the event loop its turns, so the
heartbeats go on); rebuild the epoch loop — logged batches wait for their replay epochs,
the round's waiting re-runs keep their tids, everything else is queued in offset order —
and go live again after the replay.
"""

from __future__ import annotations

import logging
from collections import ChainMap
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from aiokafka import TopicPartition

from sfaas.runtime import wire
from sfaas.runtime.epochlog import AnyRecord, CutRecord, EpochRecord, Logged, decode_record, live
from sfaas.runtime.kafka import read_range
from sfaas.runtime.liveness import Turns
from sfaas.runtime.protocols.rounds import RoundManifest
from sfaas.runtime.settings import Settings
from worker.clients import KafkaClients
from worker.direct import DirectIngress
from worker.ingress import Ingress
from worker.needs import FencedReplies, Fencing, WorldRollback
from worker.state import Pending, WorkerState

log = logging.getLogger("sfaas.worker.recovery")

T = TypeVar("T", bound=Logged)

#: per partition, ``(offset, record)`` as read
Raw = dict[int, list[tuple[int, bytes]]]

__all__ = ["Logs", "Replay", "direct_items", "replay_batch"]


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


class Logs:
    """What the epoch log and the egress topic say after the round (decoded)."""

    def __init__(self) -> None:
        #: the logged epochs after the round, every worker's
        self.later: list[EpochRecord] = []
        #: the round's cut of the direct requests, every worker's
        self.cuts: list[CutRecord] = []
        #: request ids whose replies are already in the egress topic
        self.answered: dict[str, wire.Reply] = {}


class Replay:
    """Steps 4–6 of this worker's recovery (see the module docstring)."""

    def __init__(self, settings: Settings, app_name: str, state: WorkerState, *,
                 kafka: KafkaClients, ingress: Ingress, direct: DirectIngress,
                 egress: FencedReplies, world: WorldRollback, log: Fencing) -> None:
        self._settings = settings
        self._log_topic = settings.epoch_log_topic(app_name)
        self._state = state
        self._kafka = kafka
        self._ingress = ingress
        self._direct = direct
        self._egress = egress
        self._world = world
        self._log = log
        #: what goes live once the replay is over (:meth:`live`)
        self._waiting: tuple[list[CutRecord], set[int], dict[int, int]] | None = None

    async def reply_partitions(self) -> Iterable[int]:
        """The egress topic's partitions."""
        parts: Iterable[int] = await self._kafka.producer.partitions_for(self._state.egress_topic)
        return parts

    def reads(self, m: RoundManifest, out_parts: Iterable[int],
              attempt: int) -> list[Coroutine[Any, Any, Raw]]:
        """The three reads after round ``m`` for recovery ``attempt``: the epoch log, this
        worker's ingress, the replies (``read_committed``: a dead predecessor's aborted
        replies, ``worker.egress``)."""
        s, st = self._settings, self._state
        # (each read reaches at least what this process knows was acknowledged: a stale
        # leader's end offsets are short, and a record a recovery misses runs twice)
        taken = self._ingress.read_to()
        return [
            self._read_log(m, attempt),
            read_range(s.kafka, {TopicPartition(st.ingress_topic, p): m.ingress.get(p, 0)
                                 for p in st.mine()},
                       {TopicPartition(st.ingress_topic, p): o for p, o in taken.items()}),
            self._read_replies(m, out_parts),
        ]

    async def _read_log(self, m: RoundManifest, attempt: int) -> Raw:
        """The epoch log from round ``m``'s position to at least this worker's fence for
        ``attempt``, written first (``sfaas.runtime.epochlog``, "Fences"): every record
        before the fence is in the read, whatever a stale leader answers, and one landing
        after it is void."""
        tp = TopicPartition(self._log_topic, 0)
        end = await self._log.fence(attempt)  # (past every record this process had acked)
        return await read_range(self._settings.kafka, {tp: m.epoch_log}, {tp: end})

    async def _read_replies(self, m: RoundManifest, out_parts: Iterable[int]) -> Raw:
        """The replies committed from round ``m``'s positions, at least up to the fence
        records this worker writes first (``worker.egress.Egress.fence``): a stale leader's
        short end would leave replies out, and the replay would produce them again."""
        topic, parts = self._state.egress_topic, list(out_parts)
        # (a fence follows every reply this process had acknowledged: no other bound needed)
        fenced = await self._egress.fence(parts)
        return await read_range(
            self._settings.kafka, {TopicPartition(topic, p): m.egress.get(p, 0) for p in parts},
            {TopicPartition(topic, p): fenced[p] for p in parts}, committed=True)

    async def decode(self, m: RoundManifest, raw_log: Raw, raw_out: Raw, turn: Turns) -> Logs:
        """The log's records after round ``m`` and the replies already out."""
        logs = Logs()
        records: list[tuple[int, AnyRecord]] = []
        for o, v in raw_log[0]:
            await turn()
            records.append((o, decode_record(v, f"{self._log_topic}@{o}")))
        for _, r in live(records, m.epoch_log):
            if isinstance(r, CutRecord):
                if r.round == m.round:
                    logs.cuts.append(r)
            elif isinstance(r, EpochRecord) and r.epoch > m.epoch:
                logs.later.append(r)
        for recs in raw_out.values():
            for _, v in recs:
                await turn()
                if v == wire.FENCE:  # (a recovery's: read_committed leaves them out anyway)
                    continue
                try:
                    reply = wire.Reply.decode(v)
                    logs.answered[reply.rid] = reply
                except Exception as exc:  # not ours to judge: a foreign record in the topic
                    log.warning("skipping an undecodable egress record: %s", exc)
        return logs

    async def rebuild(self, m: RoundManifest, raw_in: Raw, logs: Logs, turn: Turns) -> None:
        """5. the epoch loop, rebuilt: every request after the round taken as ingest takes it."""
        st = self._state
        st.restart(logs.answered)
        self._ingress.forget_held_reads()  # (taken again below)
        loop = st.loop
        assert loop is not None
        mine = st.mine()
        items: dict[tuple[int, int], Pending] = {}
        for p in mine:
            held = set(m.skip.get(p, ()))  # in the state, its reply out (see the module docstring)
            for off, value in raw_in.get(p, []):
                await turn()
                item = self._ingress.take(p, off, value, held)
                if item is not None:
                    items[(p, off)] = item
        in_log = await self._plan(m, items, logs.later, turn)
        self._direct.requeue(logs.cuts, set(mine), in_log)
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

    async def _plan(self, m: RoundManifest, items: dict[tuple[int, int], Pending],
                    later: list[EpochRecord], turn: Turns) -> set[object]:
        """The logged batches of this worker wait for their replay epochs; what they hold
        (positions, and direct requests' ids)."""
        st = self._state
        in_log: set[object] = set()
        replays = {}
        journals: dict[int, dict[int, dict[str, object]]] = {}
        for r in later:
            if r.worker != st.index:
                continue
            await turn()
            own = {(-1, -1 - tid): Pending.runtime(*req)
                   for tid, req in r.runtime_requests().items()}
            own.update(direct_items(r))
            # (a view, not a copy: copying every request after the round for each record
            # with direct or runtime requests made the rebuild quadratic — 0.4 s of a
            # 2,700-epoch recovery's restore)
            replays[r.epoch] = replay_batch(r, ChainMap(own, items) if own else items, m.round)
            journals[r.epoch] = dict(r.journals)
            in_log.update((p, off) for _, p, off in r.batch)
            in_log.update(_rids(own.values()))
        st.plan_replays(replays, journals)
        self._direct.expect(item for batch in replays.values() for _, item in batch)
        return in_log

    def live(self, m: RoundManifest, raw_in: Raw, cuts: list[CutRecord], later: bool) -> None:
        """6. live again after the replay: ingest from past what was read. With logged
        epochs to replay (``later``) the ingest waits until they are (:meth:`replayed`):
        what it takes could only queue, and it would take the event loop from the replay."""
        st = self._state
        assert st.engine is not None
        mine = st.mine()
        at = {}
        for p in mine:
            recs = raw_in.get(p, [])
            at[p] = recs[-1][0] + 1 if recs else m.ingress.get(p, 0)
        st.engine.begin(m.epoch)  # a peer's replay call for epoch > m.epoch waits for its Begin
        self._world.restored()
        self._waiting = (cuts, set(mine), at)
        if not later:
            self.replayed()

    def replayed(self) -> None:
        """The replay is over here: take requests again."""
        if self._waiting is None:
            return
        cuts, mine, at = self._waiting
        self._waiting = None
        self._direct.restore(cuts, mine)
        self._ingress.restart_at(at)


def direct_items(rec: EpochRecord) -> dict[tuple[int, int], Pending]:
    """The direct requests ``rec`` logged whole, by ``(partition, -1 - tid)``."""
    at = {t: p for t, p, o in rec.batch if o < 0 <= p}
    return {(at[t], -1 - t): Pending(wire.Request.decode(raw), at[t], -1, raw=raw)
            for t, raw in rec.direct}


def _rids(items: Iterable[Pending]) -> set[str]:
    return {it.request.rid for it in items if it.direct}
