"""The epoch loop, once: a worker's :class:`Participant` and the coordinator's :func:`merge_votes`.

The worker process, :class:`sfaas.testing.LocalRunner` and the tests all drive these, so
the cluster and the local runner share one semantics (and recovery restarts one loop).
Per epoch, on every participant::

    batch = p.begin(epoch, now, blocked)     # re-runs first (keeping their tids), then new work
    outcomes = await p.execute()             # every root concurrently against the epoch-start state
    votes = p.votes()                        # → the coordinator: merge_votes(all votes)
    fates = await p.commit(conflicts, aborts)  # apply, fallback phase, requeue; the decided items

``commit`` runs the *fallback phase* (see :mod:`sfaas.runtime.txn.epochs`): conflicting roots whose
calls never left this participant re-run at once, alone and in tid order, against the
just-committed state. What reaches a reply is returned as :class:`Fate`; re-runs stay in
the participant's sequencer. No I/O here beyond the engine's stores.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sfaas.runtime.txn.effects import SUSPENDED
from sfaas.runtime.txn.engine import Engine, Outcome, RootCall
from sfaas.runtime.txn.epochs import Sequencer
from sfaas.runtime.values import set_horizon

__all__ = ["Item", "Fate", "Participant", "merge_votes", "idle_after", "commit_together"]


class Item(Protocol):
    """What a participant needs of a queued request."""

    now: float
    attempts: int


T = TypeVar("T", bound=Item)


@dataclass(slots=True)
class Fate(Generic[T]):
    """A request whose fate is final this epoch: ``committed`` with ``value``, or
    ``aborted`` with ``(error type, reason)`` in ``value``. ``fallback``: decided in the
    fallback phase (serially after the epoch's other commits, in tid order); ``alone``:
    decided after it, by its worker's run of the roots that deviated there
    (:meth:`Participant.rerun_deviated`)."""

    tid: int
    item: T
    committed: bool
    value: Any
    fallback: bool = False
    alone: bool = False


class Participant(Generic[T]):
    """One worker's side of the epoch loop (see module docstring).

    ``request_of(item)`` gives the root call an item runs.
    """

    def __init__(
        self, engine: Engine, sequencer: Sequencer,
        request_of: Callable[[T], RootCall], max_batch: int,
        fallback: bool = True,
    ) -> None:
        self.engine = engine
        self.sequencer = sequencer
        self.request_of = request_of
        self.max_batch = max_batch
        self.fallback = fallback
        #: new requests waiting for an epoch, in arrival order
        self.queue: collections.deque[T] = collections.deque()
        self.batch: list[tuple[int, T]] = []
        self.outcomes: list[Outcome] = []
        #: the conflicting tids of the last commit (their re-runs wait for their blockers)
        self.last_conflicts: set[int] = set()
        #: runs suspended at a ``ctx.run`` whose outcome is not journaled yet: tid → item,
        #: until :meth:`resume` (``sfaas.runtime.txn.effects``)
        self.parked: dict[int, T] = {}
        #: the tids parked by the last commit
        self.just_parked: list[int] = []
        #: the tids :meth:`rerun_deviated` ran this epoch
        self._alone: set[int] = set()
        self.committed = self.aborted = self.reruns = self.fallbacks = self.epochs = 0
        self.suspended = 0
        #: the current epoch's ``now`` (what its new requests got)
        self.now = 0.0
        #: the expiry horizon (ms) last given to the stores of the ttl operators, if any
        self.horizon: int | None = None

    @property
    def pending(self) -> int:
        """Requests waiting for a later epoch (new and re-runs)."""
        return len(self.queue) + self.sequencer.pending_retries

    def resume(self, tid: int) -> bool:
        """The effects parked ``tid`` waited for are journaled: it runs again (keeping its
        tid) in a coming epoch. False if it is not parked here."""
        item = self.parked.pop(tid, None)
        if item is None:
            return False
        self.sequencer.requeue(tid, item, -1)
        return True

    def find(self, tid: int) -> T | None:
        """The item of ``tid`` if it waits here (parked, re-running or in the batch)."""
        item = self.parked.get(tid)
        if item is not None:
            return item
        for t, it in self.sequencer.retries():
            if t == tid:
                return it  # type: ignore[no-any-return]
        for t, it in self.batch:
            if t == tid:
                return it
        return None

    def _park(self, tid: int, item: T) -> None:
        self.parked[tid] = item
        self.just_parked.append(tid)
        self.suspended += 1

    def begin(self, epoch: int, now: float, blocked: Iterable[int] = ()) -> list[tuple[int, T]]:
        """Start ``epoch``: take re-runs whose blocker is not pending (here, in ``blocked``
        or conflicting last epoch), then new requests, up to ``max_batch``; new ones get
        ``now`` and fresh tids."""
        self.engine.begin(epoch)
        self.now = now
        block = self.last_conflicts | self.sequencer.pending_tids() | set(blocked)
        retries = self.sequencer.take_retries(self.max_batch, block)
        q = self.queue
        new = [q.popleft() for _ in range(min(len(q), self.max_batch - len(retries)))]
        for item in new:
            item.now = now
        self.batch = retries + self.sequencer.assign(epoch, new)
        return self.batch

    def begin_replay(self, epoch: int, batch: list[tuple[int, T]]) -> list[tuple[int, T]]:
        """Start ``epoch`` with exactly ``batch`` — tids and items (with their ``now``) as
        the epoch log recorded them — instead of choosing one. Re-runs named in it leave
        the sequencer; execution, votes and commit then go as in a live epoch."""
        self.engine.begin(epoch)
        self.sequencer.discard(tid for tid, _ in batch)
        for tid, _ in batch:  # (a run parked at an effect went on in this epoch)
            self.parked.pop(tid, None)
        self.batch = list(batch)
        self.now = max((item.now for _, item in batch), default=self.now)
        return self.batch

    async def execute(self) -> list[Outcome]:
        """Run every root of the batch concurrently; their outcomes, in batch order."""
        run, req = self.engine.run_root, self.request_of
        self.outcomes = list(await asyncio.gather(
            *(run(tid, item.now, req(item)) for tid, item in self.batch)))
        return self.outcomes

    def votes(self) -> tuple[dict[int, int], dict[int, tuple[str, str]]]:
        """This participant's conflicts (tid → blocker) and user aborts so far."""
        return self.engine.votes()

    async def commit(
        self, conflicts: Mapping[int, int], aborts: Mapping[int, tuple[str, str]],
    ) -> list[Fate[T]]:
        """Apply the epoch's surviving writes, run this participant's fallback phase for
        its local-only conflicting roots, requeue the rest.

        ``conflicts``/``aborts``: the union over every participant. Returns the fates of
        the batch's requests that are final, in batch order.
        """
        eng = self.engine
        rerun = self.apply(conflicts, aborts)
        items = dict(rerun)
        fb = [t for t, _ in rerun if eng.local_only(t)] if self.fallback else []
        fb_fates: dict[int, tuple[str, Any]] = {}
        if fb:
            out = await eng.run_fallback([(t, items[t].now, self.request_of(items[t])) for t in fb])
            fb_fates = dict(zip(fb, out, strict=True))
            self.fallbacks += len(fb)
        return self.settle(conflicts, aborts, fb_fates)

    def apply(
        self, conflicts: Mapping[int, int], aborts: Mapping[int, tuple[str, str]]
    ) -> list[tuple[int, T]]:
        """Apply the writes of the batch's transactions that neither conflict nor failed;
        return the conflicting ones (the fallback phase's candidates), in tid order."""
        self.last_conflicts = set(conflicts)
        self.engine.commit(conflicts, aborts)
        self._expire()
        items = dict(self.batch)
        return [(t, items[t]) for t in sorted(items) if t in self.last_conflicts]

    def _expire(self) -> None:
        """After a commit: let the stores of ttl operators drop what expired before the
        oldest ``now`` any transaction held here may still read with (the epoch's, or an
        older one a re-run or a parked run keeps; ``runtime.values.set_horizon``)."""
        ttl = self.engine.values.ttl_operators
        if ttl:
            held = [it.now for _, it in self.batch] + [it.now for _, it in
                                                       self.sequencer.retries()]
            oldest = min([self.now, *held, *(it.now for it in self.parked.values())])
            self.horizon = set_horizon(self.engine.stores, ttl, oldest)

    async def run_fallback(
        self, candidates: Sequence[tuple[int, T]], finish: Callable[[int, bool], Awaitable[None]],
    ) -> dict[int, tuple[str, Any]]:
        """The cross-worker fallback phase for this participant's conflicting roots: all
        re-run at once under the engines' ordered locks (``Engine.begin_fallback`` on every
        engine first); ``finish(tid, commit)`` must end each on every engine. Returns each
        root's ``(kind, detail)`` (see ``Engine.run_fallback_root``)."""
        eng = self.engine
        out: dict[int, tuple[str, Any]] = {}

        async def one(tid: int, item: T) -> None:
            kind, detail = await eng.run_fallback_root(tid, item.now, self.request_of(item))
            await finish(tid, kind == "committed")
            out[tid] = (kind, detail)

        await asyncio.gather(*(one(t, i) for t, i in candidates))
        self.fallbacks += len(candidates)
        return out

    async def rerun_deviated(self, fb_fates: dict[int, tuple[str, Any]]) -> None:
        """After the cross-worker fallback phase ended *everywhere* (and each engine's
        ``end_fallback``): this participant's roots that deviated in it (``"rerun"`` in
        ``fb_fates``) run once more, one at a time in tid order, alone on this worker
        (``Engine.run_fallback``); ``fb_fates`` takes their new fates. A run that stays on
        this worker commits now instead of next epoch; one that would leave it still
        re-runs next epoch.

        Nothing else touches this worker's keys meanwhile: every root of the phase
        finished on every worker, and a peer's calls of the next epoch wait until this
        worker begins it. Another worker's such runs touch only its own keys, so they
        commute with these. The serial order is: the epoch's commits by tid, the phase's
        commits by tid, then each worker's runs here by tid.

        Without it a hot key's deviating roots cascade: once one re-run of the phase sees
        a state its first run did not, so does every later one on that key, and each
        re-runs next epoch as a chain of blockers that drains one root per epoch."""
        self._alone = set()
        again = [t for t in sorted(fb_fates) if fb_fates[t][0] == "rerun"]
        if not again:
            return
        items = dict(self.batch)
        out = await self.engine.run_fallback(
            [(t, items[t].now, self.request_of(items[t])) for t in again])
        fb_fates.update(zip(again, out, strict=True))
        self._alone = set(again)
        self.fallbacks += len(again)

    def decided(
        self, conflicts: Mapping[int, int], aborts: Mapping[int, tuple[str, str]]
    ) -> list[Fate[T]]:
        """After :meth:`apply`: the fates of the batch's transactions that did not conflict
        — final already, their replies need not wait for the fallback phase. A later
        :meth:`settle` with ``decided_done`` leaves them out."""
        fates: list[Fate[T]] = []
        self.just_parked = []
        for (tid, item), (ok, value) in zip(self.batch, self.outcomes, strict=True):
            if tid in conflicts:
                continue
            if tid in aborts and aborts[tid][0] == SUSPENDED:
                self._park(tid, item)
                continue
            if tid in aborts:
                fates.append(Fate(tid, item, False, tuple(value) if not ok else aborts[tid]))
            else:
                fates.append(Fate(tid, item, True, value))
        self._count(fates)
        return fates

    def settle(
        self, conflicts: Mapping[int, int], aborts: Mapping[int, tuple[str, str]],
        fb_fates: Mapping[int, tuple[str, Any]], *, decided_done: bool = False,
    ) -> list[Fate[T]]:
        """The batch's final fates after the fallback phase (``fb_fates``: its results per
        tid); requeue what still must re-run. Ends the epoch on this participant.
        ``decided_done``: :meth:`decided` returned the others already."""
        fates: list[Fate[T]] = [] if decided_done else self.decided(conflicts, aborts)
        for tid, item in self.batch:
            if tid not in conflicts:
                continue
            fate = fb_fates.get(tid)
            if fate is None or fate[0] == "rerun":
                self._requeue(tid, item, conflicts[tid])
                continue
            kind, detail = fate
            if kind != "committed" and detail[0] == SUSPENDED:
                self._park(tid, item)
                continue
            alone = tid in self._alone
            if kind == "committed":
                fates.append(Fate(tid, item, True, detail[1], fallback=True, alone=alone))
            else:
                fates.append(Fate(tid, item, False, (str(detail[0]), str(detail[1])),
                                  fallback=True, alone=alone))
        self._alone = set()
        self._count([f for f in fates if f.fallback])
        order = {tid: i for i, (tid, _) in enumerate(self.batch)}
        fates.sort(key=lambda f: order[f.tid])  # batch order
        self.batch, self.outcomes = [], []
        self.epochs += 1
        return fates

    def _count(self, fates: list[Fate[T]]) -> None:
        for f in fates:
            if f.committed:
                self.committed += 1
            else:
                self.aborted += 1

    def _requeue(self, tid: int, item: T, blocker: int) -> None:
        item.attempts += 1
        self.reruns += 1
        self.sequencer.requeue(tid, item, blocker)


def merge_votes(
    votes: Iterable[tuple[Iterable[Sequence[Any]], Iterable[Sequence[Any]]]],
) -> tuple[dict[int, int], dict[int, tuple[str, str]]]:
    """The coordinator's barrier: the union of every participant's conflicts (a tid's
    highest blocker) and user aborts (the first reported per tid). Each vote is
    ``(conflicts as (tid, blocker) pairs, aborts as (tid, error type, reason))``: a
    ``wire.Report``'s ``Conflict`` and ``Aborted`` rows, or plain tuples in one process."""
    conflicts: dict[int, int] = {}
    aborts: dict[int, tuple[str, str]] = {}
    for cs, us in votes:
        for tid, blocker in cs:
            conflicts[tid] = max(blocker, conflicts.get(tid, -1))
        for tid, etype, reason in us:
            aborts.setdefault(tid, (etype, reason))
    return conflicts, aborts


def idle_after(pending: Iterable[int], conflicts: Mapping[int, int]) -> bool:
    """Whether an epoch leaves the cluster idle: no participant reported waiting work
    (``pending``, one count each) and nothing conflicted (no re-run waits)."""
    return not conflicts and sum(pending) == 0


async def commit_together(
    loops: Sequence[Participant[T]], conflicts: Mapping[int, int],
    aborts: Mapping[int, tuple[str, str]], fallback: bool = True,
) -> list[list[Fate[T]]]:
    """Commit one epoch on participants sharing one process (``LocalRunner``, a test's
    replay), as the workers of a cluster do: apply, then — with ``fallback`` and any
    conflict — the cross-worker fallback phase (``worker.protocols.fallback`` across processes),
    then each participant's re-run of the roots that deviated there, then settle. Returns
    each participant's fates; the serial order is the epoch's commits by tid, then the
    fallback phase's commits by tid, then each participant's ``alone`` ones by tid
    (:meth:`Participant.rerun_deviated`)."""
    candidates = [lp.apply(conflicts, aborts) for lp in loops]
    fb: list[dict[int, tuple[str, Any]]] = [{} for _ in loops]
    if fallback and any(candidates):
        engines = [lp.engine for lp in loops]
        tids = {t for c in candidates for t, _ in c}
        for eng in engines:
            eng.begin_fallback(tids)

        async def finish(tid: int, commit: bool) -> None:
            for eng in engines:
                eng.finish_fallback(tid, commit)

        try:
            fb = list(await asyncio.gather(
                *(lp.run_fallback(c, finish) for lp, c in zip(loops, candidates, strict=True))))
        finally:
            for eng in engines:
                eng.end_fallback()
        for lp, f in zip(loops, fb, strict=True):
            await lp.rerun_deviated(f)
    return [lp.settle(conflicts, aborts, f) for lp, f in zip(loops, fb, strict=True)]
