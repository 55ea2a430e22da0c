"""Re-executing a cluster's epoch log in one process: the serial replay behind ``sfaas replay``.

A cluster's history after a snapshot round is fully recorded: the round's stores, the
epoch log (each worker's batch of each epoch, with tids, ``now`` and journals:
:mod:`sfaas.runtime.epochlog`) and the ingress records the batches point to. Executing
that history is deterministic, so re-running it here — on the stores of the round, with
the app's *current* code — gives every request the outcome the cluster gave it, unless the
code changed or is not deterministic. :class:`LogReplay` does it epoch by epoch on the
engines of an in-process :class:`~sfaas.testing.cluster.LocalCluster`, in the protocol's
serial order: each epoch's batches as logged (tids and ``now``), the votes merged, the
commit, the cross-worker fallback phase and each worker's deviated roots
(:func:`~sfaas.runtime.txn.loop.commit_together`) — as a recovery's replay runs it, but
on the caller's event loop and thread (a breakpoint in a function stops right there), and
with no effect, post-commit action or timer started: their outcomes and requests are in
the log.

:func:`compare` matches the outcomes with the replies the cluster committed
(:mod:`sfaas.runtime.recorded` reads both) and describes each :class:`Divergence` as the
worker's detector of replays that diverge does.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from remotes import Remote
from sfaas.app import App
from sfaas.errors import ReplayError
from sfaas.runtime import wire
from sfaas.runtime.epochlog import EpochRecord
from sfaas.runtime.partitioning import default_owners
from sfaas.runtime.protocols.rounds import RoundManifest
from sfaas.runtime.txn.effects import effect_scope
from sfaas.runtime.txn.engine import RootCall
from sfaas.runtime.txn.epochs import Sequencer
from sfaas.runtime.txn.internal import RuntimeCall, runtime_rid
from sfaas.runtime.txn.loop import Fate, Participant, commit_together, merge_votes
from sfaas.testing.cluster import LocalCluster

log = logging.getLogger("sfaas.testing.replay")

__all__ = ["Logged", "LogReplay", "Replayed", "Divergence", "Comparison", "compare",
           "describe_reply", "LogResult", "replay_log"]


@dataclass
class Logged:
    """A root of a logged batch, as the replay runs it."""

    rid: str
    request: RootCall
    now: float
    partition: int
    offset: int
    journal: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    attempts: int = 0

    @property
    def direct(self) -> bool:
        """A client's direct call: its reply went to its channel, not the egress topic."""
        return self.partition >= 0 > self.offset

    @property
    def runtime(self) -> bool:
        """A request the runtime made (a timer, an action's cleanup): nobody got a reply."""
        return self.partition < 0


def _request_of(item: Logged) -> RootCall:
    return item.request


@dataclass(frozen=True)
class Replayed:
    """A request decided in the replay: committed with ``value``, or aborted with
    ``(error type, reason)``."""

    epoch: int
    tid: int
    item: Logged
    committed: bool
    value: Any

    def reply(self) -> wire.Reply:
        """The reply a worker would produce for it."""
        if self.committed:
            return wire.Reply(self.item.rid, True, self.value)
        return wire.Reply(self.item.rid, False, None, str(self.value[0]), str(self.value[1]))


class LogReplay:
    """The epochs logged after round ``manifest`` (``records``), re-executed on its stores in
    ``directory`` (see the module docstring). ``requests``: the ingress records by
    ``(partition, offset)``; ``maps``: ``(epoch, owners)`` — the partition map the epochs
    after ``epoch`` ran under (rescales switch at rounds); ``store``: every operator's
    engine (None: each operator's own); ``fallback``: the cluster's phase (``cross``,
    ``local`` or ``off``, :meth:`Settings.fallback_phase`); ``idempotency_retention``: the
    cluster's (it dates the records of idempotent requests' outcomes)."""

    def __init__(
        self, app: App, manifest: RoundManifest, records: Iterable[EpochRecord],
        requests: Mapping[tuple[int, int], wire.Request], directory: str | os.PathLike[str], *,
        maps: Sequence[tuple[int, Sequence[int]]] = (), store: str | None = None,
        fallback: str = "cross", idempotency_retention: float = 86400.0,
    ) -> None:
        m = manifest
        self.app, self.manifest, self.requests = app, m, requests
        self.by_epoch: dict[int, dict[int, EpochRecord]] = {}
        for rec in records:  # (a worker's later record of an epoch wins, as in a recovery)
            if rec.epoch > m.epoch:
                self.by_epoch.setdefault(rec.epoch, {})[rec.worker] = rec
        self.epochs = sorted(self.by_epoch)
        most = max([m.workers, *(max(o) + 1 for _, o in maps),
                    *(w + 1 for recs in self.by_epoch.values() for w in recs)])
        self.cluster = LocalCluster(
            app, workers=most, partitions=m.partitions, store=store, store_options=None,
            directory=directory, max_batch=1 << 30, fallback=fallback != "off",
            check_determinism=False, effect_timeout=30.0, max_effects=1 << 30,
            idempotency_retention=idempotency_retention)
        self.cluster.actions.live = False  # (a replay runs no post-commit action)
        self.fallback = fallback
        self.loops = [Participant(eng, Sequencer(eng.index), _request_of, 1 << 30,
                                  fallback=fallback != "off") for eng in self.cluster.engines]
        self._maps = sorted((e, list(o)) for e, o in maps)
        if m.owners or most > m.workers:
            self.cluster.remap(list(m.owners) or default_owners(m.partitions, m.workers))
        #: the epoch replayed last (the round's before the first)
        self.epoch = m.epoch

    def restore(self, remote_of: Callable[[str, int], Remote]) -> None:
        """(blocking) Every store back to the round, from ``remote_of(operator, partition)``
        (downloading only what the directory lacks); round 0 is the empty state."""
        if self.manifest.round <= 0:
            return
        # (an operator the code declares since the round starts empty)
        held = {(st.operator, st.partition) for st in self.manifest.stores}
        for eng, timers in zip(self.cluster.engines, self.cluster.timers, strict=True):
            for (op, p), store in eng.stores.items():
                if held and (op, p) not in held:
                    log.warning("round %d holds no store of %s/p%d: it starts empty",
                                self.manifest.round, op, p)
                    continue
                store.remote = remote_of(op, p)
                try:
                    store.restore(self.manifest.round)
                except Exception as exc:
                    raise ReplayError(f"cannot restore {op}/p{p} to round {self.manifest.round}: "
                                      f"{type(exc).__name__}: {exc}") from exc
            timers.load(eng.stores)

    def _batch(self, rec: EpochRecord) -> list[tuple[int, Logged]]:
        """The batch ``rec`` logged, each root with the ``now`` and journal it ran with."""
        runtime, direct, journals = rec.runtime_requests(), dict(rec.direct), dict(rec.journals)
        batch = []
        for (tid, p, o), now in zip(rec.batch, rec.nows(), strict=True):
            if p < 0:
                op, key, fn, args = runtime[tid]
                item = Logged(runtime_rid(fn, args[0]), RootCall(RuntimeCall(op), key, fn, args),
                              now, p, o)
            else:
                req = wire.Request.decode(direct[tid]) if o < 0 else self.requests.get((p, o))
                if req is None:
                    raise ReplayError(f"epoch {rec.epoch} (worker {rec.worker}) ran ingress record "
                                      f"{p}:{o}, which the ingress topic no longer holds")
                item = Logged(req.rid, RootCall(req.operator, req.key, req.function, req.args),
                              now, p, o, idempotency_key=req.idempotency_key)
            item.journal = dict(journals.get(tid, {}))
            batch.append((tid, item))
        return batch

    async def run_epoch(self, epoch: int) -> list[Replayed]:
        """Replay logged epoch ``epoch`` (the next one); the requests it decided."""
        while self._maps and self._maps[0][0] < epoch:
            self.cluster.remap(self._maps.pop(0)[1])
        mine = self.by_epoch.get(epoch, {})
        fx = self.cluster.effects
        fx.begin_epoch()
        for i, lp in enumerate(self.loops):
            batch = self._batch(mine[i]) if i in mine else []
            for tid, it in batch:
                op, key, fn, _ = it.request
                fx.begin(tid, it.rid, it.journal, it.idempotency_key,
                         effect_scope(it.rid, str(op), key, fn, it.idempotency_key))
            lp.begin_replay(epoch, batch)
        await asyncio.gather(*(lp.execute() for lp in self.loops))
        conflicts, aborts = merge_votes(
            (c.items(), ((t, e, r) for t, (e, r) in u.items()))
            for c, u in (lp.votes() for lp in self.loops))
        fates: list[list[Fate[Logged]]]
        if self.fallback == "local":  # (each worker's phase on its own local-only roots)
            fates = [await lp.commit(conflicts, aborts) for lp in self.loops]
        else:
            fates = await commit_together(self.loops, conflicts, aborts, self.fallback == "cross")
        fx.launch(live=False)
        self.epoch = epoch
        return [Replayed(epoch, f.tid, f.item, f.committed, f.value) for fs in fates for f in fs]

    def items(self, operator: str) -> dict[str, Any]:
        """Every ``key → value`` of ``operator`` now (between epochs)."""
        return self.cluster.items(operator)

    def state(self) -> dict[str, dict[str, Any]]:
        """Every operator's ``key → value`` now."""
        return {op: self.items(op) for op in self.app.operators}

    async def close(self) -> None:
        """Close the stores (the directory stays, holding the state replayed so far)."""
        await self.cluster.close()


def describe_reply(reply: wire.Reply) -> str:
    """A short description of a reply: its value, or its error type and reason."""
    return f"{reply.value!r:.120}" if reply.ok else f"{reply.error_type}: {reply.reason!r:.120}"


@dataclass(frozen=True)
class Divergence:
    """A request the replay answered otherwise than the cluster did."""

    rid: str
    operator: str
    function: str
    key: str
    epoch: int
    committed: wire.Reply
    replayed: wire.Reply

    def describe(self) -> str:
        return (f"request {self.rid}: {self.operator}.{self.function} on key {self.key!r} "
                f"(epoch {self.epoch}): the cluster replied {describe_reply(self.committed)}, "
                f"the replay {describe_reply(self.replayed)}")


@dataclass
class Comparison:
    """What :func:`compare` found: requests compared, divergences, direct calls (whose
    replies are not in the egress topic) and requests without a committed reply."""

    compared: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    direct: int = 0
    unanswered: int = 0


def _head(r: wire.Reply) -> bytes:
    """A reply's bytes without its traceback (what a replay must reproduce)."""
    return wire.Reply(r.rid, r.ok, r.value, r.error_type, r.reason).encode()


def compare(decided: Iterable[Replayed], replies: Mapping[str, wire.Reply],
            into: Comparison | None = None) -> Comparison:
    """Match each decided client request with the committed reply of its request id."""
    out = into if into is not None else Comparison()
    for d in decided:
        it = d.item
        if it.runtime:
            continue
        if it.direct:
            out.direct += 1
            continue
        before = replies.get(it.rid)
        if before is None:
            out.unanswered += 1
            continue
        out.compared += 1
        after = d.reply()
        if _head(before) != _head(after):
            op, key, fn, _ = it.request
            out.divergences.append(Divergence(it.rid, str(op), fn, key, d.epoch, before, after))
    return out


@dataclass
class LogResult:
    """What :func:`replay_log` returns."""

    #: request id → ``(committed, value)`` of its last decision
    fates: dict[str, tuple[bool, Any]]
    #: every operator's state after the last epoch
    state: dict[str, dict[str, Any]]
    #: ``(request id, epoch)`` of requests committed a second time (a bug of the runtime)
    doubled: list[tuple[str, int]]
    #: of each in :attr:`doubled`: where both commits came from — ``(epoch, ingress
    #: partition, offset)`` of the first and of the second (to tell a record read twice
    #: from one request sent twice)
    origins: list[tuple[tuple[int, int, int], tuple[int, int, int]]] = field(
        default_factory=list)


async def replay_log(
    app: App, manifest: RoundManifest, records: Iterable[EpochRecord],
    requests: Mapping[tuple[int, int], wire.Request], directory: str | os.PathLike[str], *,
    maps: Sequence[tuple[int, Sequence[int]]] = (), store: str | None = None,
    fallback: str = "cross", remote_of: Callable[[str, int], Remote] | None = None,
) -> LogResult:
    """Replay every epoch logged after ``manifest`` (on its stores restored into
    ``directory`` with ``remote_of``; round 0 or no ``remote_of``: the directory as it is);
    the fates, the state and any request id committed twice."""
    replay = LogReplay(app, manifest, records, requests, directory, maps=maps, store=store,
                       fallback=fallback)
    try:
        if remote_of is not None:
            await asyncio.to_thread(replay.restore, remote_of)
        fates: dict[str, tuple[bool, Any]] = {}
        first: dict[str, tuple[int, int, int]] = {}  # request id → its first commit's origin
        doubled, origins = [], []
        for epoch in replay.epochs:
            for d in await replay.run_epoch(epoch):
                # exactly once: a request id commits at most once in the whole log (a copy
                # run under another tid after its first run aborted is one run)
                where = (epoch, d.item.partition, d.item.offset)
                if d.committed and fates.get(d.item.rid, (False,))[0]:
                    doubled.append((d.item.rid, epoch))
                    origins.append((first[d.item.rid], where))
                if d.committed:
                    first.setdefault(d.item.rid, where)
                fates[d.item.rid] = (d.committed, d.value)
        return LogResult(fates, replay.state(), doubled, origins)
    finally:
        await replay.close()
