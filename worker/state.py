"""What one worker process knows, in one place: its slot and the partition map, its epoch
loop, and the bookkeeping of the requests it took.

Every part of the worker reads this state; the parts that must change it — a recovery
rolling back, a rescale moving partitions — do so through its methods, so each field has
one writer and one copy. In particular the partition map (``owners[p]``: the worker owning
partition ``p``) lives only here: the engine reads it through a callable.

Two trackers follow the ingress offsets (``sfaas.runtime.txn.offsets``): ``offsets``
completes a request once its reply is acknowledged — only offsets below every request not
yet completed are committed to the consumer group, so a restart never skips a request
still waiting to re-run — and ``applied`` completes it once its fate is in the state (at
its epoch's commit): its watermarks are where a replay from a snapshot round must start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sfaas.runtime import wire
from sfaas.runtime.partitioning import owned
from sfaas.runtime.txn.engine import Engine, RootCall
from sfaas.runtime.txn.epochs import Sequencer
from sfaas.runtime.txn.internal import RuntimeCall
from sfaas.runtime.txn.loop import Participant
from sfaas.runtime.txn.offsets import OffsetTracker

__all__ = ["Pending", "WorkerState", "request_of"]


@dataclass(slots=True)
class Pending:
    """A request waiting to commit (it may re-run several epochs)."""

    request: wire.Request
    #: ingress partition and offset the request was read from (see ``OffsetTracker``)
    partition: int = -1
    offset: int = -1
    now: float = 0.0
    attempts: int = 0
    #: the outcomes of its ``ctx.run`` effects so far (``sfaas.runtime.txn.effects``)
    journal: dict[str, Any] = field(default_factory=dict)
    #: a request a client sent straight to this worker (``worker.direct``): its record as
    #: sent, logged whole (its ``partition`` is its key's, its ``offset`` -1)
    raw: bytes = b""

    def rerun(self, now: float, journal: dict[str, Any]) -> None:
        """It runs again as it ran before: with the ``now`` of its first run and (a copy
        of) the journal of its effects so far."""
        self.now = now
        self.journal = dict(journal)

    def journaled(self, key: str, outcome: Any) -> None:
        """Its effect ``key`` finished with ``outcome``."""
        self.journal[key] = outcome

    @property
    def direct(self) -> bool:
        """Whether a client sent it straight to this worker (no ingress position)."""
        return self.offset < 0 <= self.partition

    def direct_record(self) -> bytes | None:
        """The request record of a direct request (logged whole), else None."""
        return self.raw if self.direct else None

    def runtime_request(self) -> tuple[str, str, str, list[Any]] | None:
        """``(operator, key, function, args)`` of a request the runtime made (a timer
        firing, an action's cleanup: no ingress position), else None."""
        r = self.request
        if not isinstance(r.operator, RuntimeCall):
            return None
        return str(r.operator), r.key, r.function, r.args

    @classmethod
    def runtime(cls, operator: str, key: str, function: str, args: list[Any]) -> Pending:
        """A request the runtime makes (``sfaas.runtime.txn.internal``): no reply, no
        ingress position; its id derives from what it does, the same after a replay."""
        from sfaas.runtime.txn.internal import runtime_rid

        rid = runtime_rid(function, args[0] if args else key)
        return cls(wire.Request(rid, RuntimeCall(operator), key, function, args, -1, 0.0))


def request_of(item: Pending) -> RootCall:
    """What the epoch loop runs for ``item``: its request's root call."""
    r = item.request
    return RootCall(r.operator, r.key, r.function, r.args)


@dataclass(frozen=True)
class Cut:
    """This worker's part of a snapshot round's cut, from :meth:`WorkerState.cut` to the
    round's report (``worker.protocols.rounds``, ``wire.Snapshotted``): where a replay from
    the round starts. ``ingress``: per owned partition, the first offset not applied;
    ``skip``: the offsets above it that are; ``retries``: the re-runs (and runs parked at
    an effect) waiting; ``egress``: per egress partition, the offset after the last reply
    acknowledged; ``epoch_log``: one past this worker's newest epoch-log record."""

    epoch: int
    ingress: dict[int, int]
    skip: dict[int, list[int]]
    retries: list[wire.Retry]
    egress: dict[int, int]
    epoch_log: int

    def report(self, round_id: int, index: int, stores: list[wire.StoreCut],
               error: str) -> wire.Snapshotted:
        """The round's report of this cut, with the stores' part and any ``error``."""
        return wire.Snapshotted(round_id, index, self.epoch, stores, self.ingress, self.skip,
                                self.egress, self.retries, self.epoch_log, error)


class WorkerState:
    """One worker's slot, partition map, epoch loop and request bookkeeping (see the
    module docstring). ``max_batch`` and ``local_fallback`` configure each epoch loop."""

    def __init__(self, max_batch: int, local_fallback: bool, log_topic: str = "") -> None:
        self.max_batch = max_batch
        self.local_fallback = local_fallback
        # -- the slot (set by ``adopt``; a rescale or a recovery changes the map) ------------
        self.index = -1
        self.n_workers = 0
        self.partitions = 0
        #: the partition map: ``owners[p]`` is the worker owning partition ``p``
        self.owners: list[int] = []
        #: the peers' ``[host, port, generation]``, by worker index
        self.peers: Sequence[Sequence[Any]] = []
        #: this process's assignment of its slot (``wire.Assign.generation``)
        self.generation = 0
        self.ingress_topic = ""
        self.egress_topic = ""
        self.group = ""
        #: partitions of the egress topic (a request's reply partition must be one)
        self.egress_partitions = 0
        #: set once the slot is known (a joining worker's peers may connect before)
        self.assigned = asyncio.Event()
        # -- execution ------------------------------------------------------------------------
        self.engine: Engine | None = None
        #: the snapshot a promotion opened each store at (``PartitionStores.opened_at``): the
        #: first rollback, before any epoch began here, adopts those at its round as they are
        self.opened_at: dict[tuple[str, int], int] = {}
        #: the epoch loop's state (queue, batch, re-runs, counters); made with the engine
        self.loop: Participant[Pending] | None = None
        #: the epoch running now is a recovery's replay (set at each Begin)
        self.replaying = False
        # -- the requests taken ---------------------------------------------------------------
        self.offsets = OffsetTracker()
        self.applied = OffsetTracker()
        #: per owned ingress partition, where this worker started reading it
        self.start_offsets: dict[int, int] = {}
        #: gained partitions: offsets a snapshot round holds (skipped when read again) and
        #: the round's waiting re-runs, ``(partition, offset) → (tid, now, journal)``
        self.skip: dict[int, set[int]] = {}
        self.retry_at: dict[tuple[int, int], tuple[int, float, dict[str, Any]]] = {}
        #: recovery: request ids whose replies are already in the egress topic, and the
        #: logged batches waiting for their replay epochs
        self.answered: dict[str, wire.Reply] = {}
        self.replay_batches: dict[int, list[tuple[int, Pending]]] = {}
        #: per replayed epoch, the journals its roots ran with (tid → effect key → outcome)
        self.replay_journals: dict[int, dict[int, dict[str, Any]]] = {}
        #: the last recovery this worker rolled back for (see ``wire.Call.recovery``)
        self.recovery = 0
        #: the recovery the current epoch began under: what its calls carry. Calls of an
        #: epoch a recovery interrupted must not carry the new one, or a peer that rolled
        #: back already serves them in its replay (the simulator's seed 191)
        self.epoch_recovery = 0
        #: state reads may be answered: the stores hold what the replies sent so far agree
        #: with — from this process's first live Begin until a recovery rolls them back
        #: (written by ``World``; read by the reads through Kafka and the direct ones)
        self.reads_open = False
        #: the epoch log (on with snapshot rounds): its topic, and one past this worker's
        #: newest acknowledged record (where a replay after the current cut may start)
        self.log_topic = log_topic
        self.log_pos = 0
        #: a rescale left this worker without a partition
        self.retired = False

    # -- the slot --------------------------------------------------------------------------------
    def adopt(self, assign: wire.Assign) -> None:
        """Take the slot ``assign`` gives (a join, a rejoin, a receiver's ``Reassign``)."""
        self.index = assign.index
        self.n_workers = assign.n_workers
        self.partitions = assign.partitions
        self.peers = assign.peers
        self.generation = assign.generation
        self.ingress_topic = assign.ingress_topic
        self.egress_topic = assign.egress_topic
        self.group = assign.group
        self.owners = list(assign.owners)
        self.assigned.set()

    def set_owners(self, owners: list[int], n_workers: int | None = None,
                   peers: Sequence[Sequence[Any]] | None = None) -> None:
        """A new partition map (and membership, when given): a rescale or a recovery."""
        self.owners = list(owners)
        if n_workers is not None:
            self.n_workers = n_workers
        if peers is not None:
            self.peers = peers

    def peer_generation(self, index: int) -> int:
        """The generation the membership names for worker ``index`` (0: unknown)."""
        if not 0 <= index < len(self.peers):
            return 0
        row = self.peers[index]
        return int(row[2]) if len(row) > 2 else 0

    def mine(self) -> list[int]:
        """The partitions the map gives this worker."""
        return owned(self.owners, self.index)

    def same_slot(self, a: wire.Assign) -> bool:
        """Does ``a`` give this worker the slot and map it holds (a restarted coordinator)?"""
        return (a.index == self.index and a.n_workers == self.n_workers
                and a.partitions == self.partitions and a.owners == self.owners)

    def reply_partitions(self, n: int) -> None:
        """The egress topic has ``n`` partitions."""
        self.egress_partitions = n

    def logged(self, pos: int) -> None:
        """The epoch log holds this worker's records up to ``pos`` (one past the newest)."""
        self.log_pos = pos

    def recovering(self, attempt: int) -> None:
        """Recovery ``attempt`` rolls this worker back (calls of earlier ones are refused)."""
        self.recovery = attempt

    def retire(self) -> None:
        """A rescale left this worker without a partition."""
        self.retired = True

    def open_reads(self) -> bool:
        """State reads may be answered from now on; whether they were closed until now."""
        was_closed, self.reads_open = not self.reads_open, True
        return was_closed

    def close_reads(self) -> None:
        """The stores go back to a round, behind the replies sent: no read is answered."""
        self.reads_open = False

    def started_at(self, partition: int, offset: int) -> None:
        """This worker started reading ingress ``partition`` at ``offset``."""
        self.start_offsets[partition] = offset

    def current_owners(self) -> list[int]:
        """The partition map now (the engine reads it through this)."""
        return self.owners

    # -- the epoch loop --------------------------------------------------------------------------
    def attach(self, engine: Engine, opened_at: dict[tuple[str, int], int] | None = None) -> None:
        """The engine is open: start the epoch loop on it. ``opened_at``: the snapshot a
        promotion opened each of its stores at (``PartitionStores.opened_at``)."""
        self.engine = engine
        self.opened_at = dict(opened_at or {})
        self.loop = self._new_loop()

    def take_opened_at(self) -> dict[tuple[str, int], int]:
        """(a rollback) The stores a promotion opened at a snapshot and nothing wrote to since
        — none once an epoch began here (epoch commits are their only writers) — once: the
        replay that follows writes them."""
        opened_at, self.opened_at = self.opened_at, {}
        if not opened_at or self.engine is None or self.engine.epoch != 0:
            return {}
        return opened_at

    def _new_loop(self) -> Participant[Pending]:
        assert self.engine is not None
        return Participant(self.engine, Sequencer(self.index), request_of, self.max_batch,
                           fallback=self.local_fallback)

    def restart(self, answered: dict[str, wire.Reply]) -> None:
        """A recovery: forget every request taken — new trackers, a new epoch loop;
        ``answered``: the replies already out, by request id."""
        self.offsets, self.applied = OffsetTracker(), OffsetTracker()
        self.loop = self._new_loop()
        self.answered = answered
        self.replay_batches, self.replay_journals = {}, {}

    def plan_replays(self, batches: dict[int, list[tuple[int, Pending]]],
                     journals: dict[int, dict[int, dict[str, Any]]] | None = None) -> None:
        """The logged batches a recovery replays, by epoch (each taken at its Begin), and
        the journals their roots ran with."""
        self.replay_batches = batches
        self.replay_journals = journals or {}

    def take_replay(self, epoch: int) -> list[tuple[int, Pending]]:
        """The logged batch of replayed epoch ``epoch``, each root holding the journal it
        ran with then (a run that went on after an effect holds more than it did before)."""
        batch = self.replay_batches.pop(epoch, [])
        journals = self.replay_journals.pop(epoch, {})
        for tid, item in batch:
            item.journal = dict(journals.get(tid, {}))
        return batch

    def epoch_began(self, replay: bool) -> None:
        """An epoch began: a recovery's replay, or live."""
        self.replaying = replay
        self.epoch_recovery = self.recovery

    def drop_replays(self) -> None:
        """Forget the replays planned (a recovery starts over)."""
        self.replay_batches, self.replay_journals = {}, {}

    def applied_item(self, item: Pending) -> None:
        """``item``'s fate is in the state."""
        if item.offset >= 0:
            self.applied.complete(item.partition, item.offset)

    # -- partitions arriving and leaving ---------------------------------------------------------
    def expect(self, skip: dict[int, list[int]] | None,
               retries: Iterable[Sequence[Any]] | None) -> None:
        """Gained partitions resume at a round: ``skip`` offsets the round holds,
        ``retries`` ``[tid, partition, offset, now, journal]`` re-runs keeping tids, ``now``
        and journals."""
        for p, offs in (skip or {}).items():
            self.skip.setdefault(p, set()).update(offs)
        for tid, p, off, now, *journal in retries or []:
            self.retry_at[(p, off)] = (tid, now, dict(journal[0]) if journal else {})

    def drop_expected(self) -> None:
        """Forget what :meth:`expect` said (a recovery: the rescale is abandoned)."""
        self.skip, self.retry_at = {}, {}

    def forget(self, partitions: Iterable[int]) -> None:
        """``partitions`` left this worker: their offsets no longer count here."""
        for p in partitions:
            self.offsets.drop(p)
            self.applied.drop(p)
            self.start_offsets.pop(p, None)

    def drop_waiting(self, partitions: set[int]) -> list[str]:
        """Drop the queued requests and waiting re-runs of ``partitions``; the request ids
        of the direct ones dropped (their clients must send them again elsewhere)."""
        assert self.loop is not None
        q = self.loop.queue
        dropped = [item for item in q if item.partition in partitions]
        kept = [item for item in q if item.partition not in partitions]
        q.clear()
        q.extend(kept)
        seq = self.loop.sequencer
        gone = [(tid, item) for tid, item in seq.retries() if item.partition in partitions]
        seq.discard([tid for tid, _ in gone])
        dropped += [item for _, item in gone]
        parked = self.loop.parked
        for tid in [t for t, item in parked.items() if item.partition in partitions]:
            dropped.append(parked.pop(tid))
        return [item.request.rid for item in dropped if item.direct]

    # -- a snapshot round's cut ------------------------------------------------------------------
    def cut(self, epoch: int, egress: dict[int, int]) -> Cut:
        """Where a replay from a round taken now, at epoch ``epoch``'s commit, starts
        (``egress``: the replies' acknowledged offsets, the egress's)."""
        assert self.loop is not None
        ingress = dict(self.start_offsets)
        ingress.update(self.applied.watermarks())
        # (runs parked at an effect wait like re-runs; the runtime's own requests are not
        # kept: their records are in the stores, which redo them)
        waiting = [*self.loop.sequencer.retries(), *sorted(self.loop.parked.items())]
        retries = [wire.Retry(tid, item.partition, item.offset, item.now, dict(item.journal))
                   for tid, item in waiting if item.offset >= 0]
        return Cut(epoch, ingress, self.applied.completed_above(), retries, egress,
                   self.log_pos)

    def direct_waiting(self) -> list[tuple[int, Pending]]:
        """``(tid, item)`` of the direct requests waiting to re-run or parked at an effect
        (a round's cut keeps them in the epoch log: ``sfaas.runtime.epochlog.CutRecord``)."""
        assert self.loop is not None
        waiting = [*self.loop.sequencer.retries(), *sorted(self.loop.parked.items())]
        return [(tid, item) for tid, item in waiting if item.direct]
