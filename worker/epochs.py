"""A worker's epochs: begin, execute, report, commit, reply — the coordinator's or the lease's.

``Begin n``   take a bounded batch of requests (re-runs first), give each a tid, run all
              roots concurrently; calls to keys of other workers go over peer channels
              (``worker.peers``). When my roots are done, ``Report`` my conflicts, user
              aborts and call counters; report again after each call I serve later (see
              ``wire.Report``).
``Commit n``  apply surviving writes (one ``write_batch`` per operator store); run the
              *fallback phase* (``worker.protocols.fallback``): every conflicting root of
              the epoch, on every worker, re-runs at once against the just-committed state
              under ordered locks — a key is used by the re-runs in tid order — so a hot-key
              chain commits whole, also across workers; the re-runs that deviated (used a
              key their first run did not) run again once the phase ended everywhere, one
              at a time on their worker, and only those that would leave it are requeued
              (``Participant.rerun_deviated``); queue the replies (``worker.egress``);
              when the Commit carries a snapshot round's marker, every store is frozen there
              — a consistent cut — and uploads while epochs go on (``worker.protocols.rounds``).

With snapshot rounds on, each batch is written to the epoch log while it executes; the
report (hence every reply of the epoch, anywhere) waits until the record is durable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from sfaas.runtime import wire
from sfaas.runtime.epochlog import EpochRecord
from sfaas.runtime.kafka import Reachability
from sfaas.runtime.settings import Settings
from sfaas.runtime.txn.determinism import check_local
from sfaas.runtime.txn.loop import Fate
from worker.clients import KafkaClients
from worker.direct import DirectIngress
from worker.egress import Egress
from worker.fence import FenceLease
from worker.ingress import Ingress
from worker.links import CoordinatorLink, PeerLinks
from worker.metrics import WorkerMetrics
from worker.peers import Peers
from worker.protocols.fallback import CrossFallback
from worker.protocols.lease import EpochLeaseHolder
from worker.protocols.rounds import RoundTaker
from worker.state import Pending, WorkerState
from worker.tasks import Tasks
from worker.traces import EpochTraces
from worker.world import World

log = logging.getLogger("sfaas.worker")

__all__ = ["EpochRunner"]


def astuple_head(r: wire.Reply) -> tuple[str, bool, Any, str | None, str | None]:
    """A reply without its traceback (what a replay must reproduce)."""
    return r.rid, r.ok, r.value, r.error_type, r.reason


def _fresh(view: list[wire.SlowRequest] | None) -> tuple[list[wire.SlowRequest], bool]:
    """``Heartbeat.slow`` and ``slow_fresh`` of a changed view (None: unchanged)."""
    return ([], False) if view is None else (view, True)


class EpochRunner:
    """Runs this worker's epochs (see the module docstring); also the host of its
    :class:`~worker.protocols.lease.EpochLeaseHolder`, under which it begins and commits
    them itself."""

    def __init__(
        self, settings: Settings, state: WorkerState, mode: str, *, uplink: CoordinatorLink,
        links: PeerLinks, calls: Peers, fallback: CrossFallback, ingress: Ingress, egress: Egress,
        metrics: WorkerMetrics, rounds: RoundTaker, kafka: KafkaClients, tasks: Tasks,
        world: World, direct: DirectIngress, fence: FenceLease | None = None,
    ) -> None:
        self._settings = settings
        #: requests clients sent straight to this worker, answered here
        self._direct = direct
        #: the coordinator's lease on this process (``worker.fence``): the epoch log is
        #: written, and heartbeats' answers renew it, only under it
        self._fence = fence
        self._state = state
        self.mode = mode
        self._uplink = uplink
        self._links = links
        self._calls = calls
        self._fallback = fallback
        self._ingress = ingress
        self._egress = egress
        self._metrics = metrics
        self._rounds = rounds
        self._kafka = kafka
        #: whether this process reaches any Kafka broker (its heartbeats say so)
        self._reach = Reachability(settings.kafka)
        self._probe: asyncio.Future[None] | None = None
        self._tasks = tasks
        self._world = world
        #: the epoch running now is a recovery's replay
        self._replay = False
        #: epochs this worker begins and commits itself, under the coordinator's lease
        self.lease = EpochLeaseHolder(self)
        # the coordinator starts idle: the first records must wake it up
        self._idle_reported = True
        self._age_sum = 0.0
        self._age_n = 0
        #: the spans of the epochs and their requests (``worker.traces``: only while
        #: tracing), and the slowest and aborted requests of the last minute
        self._traces = EpochTraces(settings.namespace, settings.trace_slow,
                                   metrics.latency)

    # -- what the lease needs (``LeaseHost``) -----------------------------------------------------
    @property
    def index(self) -> int:
        return self._state.index

    @property
    def n_workers(self) -> int:
        return self._state.n_workers

    def tasks_add(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)

    def send_peers(self, msg: wire.Message) -> None:
        self._links.send_all(msg)

    # -- waking up --------------------------------------------------------------------------------
    def work_arrived(self) -> None:
        """Ingest took requests: begin an epoch for them (leased), or wake the coordinator
        if this worker reported it had nothing to do."""
        if self.lease.active:
            self.lease.work_arrived()
        elif self._idle_reported:
            self._idle_reported = False
            if not self._uplink.closed:
                self._uplink.send(wire.Wakeup(self._state.index))

    def waits_on_peers(self, msg: wire.Commit) -> bool:
        """Does this Commit's fallback phase wait on peers (so it runs as a task)?"""
        return bool(msg.conflicts) and self.mode == "cross"

    # -- an epoch ---------------------------------------------------------------------------------
    def start_epoch(self, begin: wire.Begin) -> None:
        """Begin epoch ``begin.epoch`` now (the coordinator's Begin, or the lease's) and run
        its roots in a task."""
        t0 = self.begin(begin)
        if t0 is not None:
            self._tasks.spawn(self.execute(begin, t0))

    def begin(self, begin: wire.Begin) -> float | None:
        """Open epoch ``begin.epoch`` (None: ignored, it began here already); returns the
        time it began, for :meth:`execute`."""
        st = self._state
        assert st.engine is not None and st.loop is not None
        if begin.epoch <= st.engine.epoch and not begin.replay:
            log.warning("ignoring a Begin of epoch %d: epoch %d began here", begin.epoch,
                        st.engine.epoch, extra={"worker": st.index})
            return None
        t0 = time.perf_counter()
        self._traces.began(begin.epoch, begin.now)
        self._replay = begin.replay
        if begin.replay:  # the batch as logged, each item with the now it ran with (recovery)
            batch = st.loop.begin_replay(begin.epoch, st.take_replay(begin.epoch))
        else:
            self._world.before_begin(begin.now)  # (the timers due join the batch)
            batch = st.loop.begin(begin.epoch, begin.now)
        self._world.install(batch)
        self.lease.began(begin.epoch)
        self._calls.begin(begin.epoch, st.n_workers)
        return t0

    async def execute(self, begin: wire.Begin, t0: float) -> None:
        """Run the roots of the epoch :meth:`begin` opened, then report."""
        st = self._state
        assert st.loop is not None
        for _, item in st.loop.batch:
            if item.attempts == 0:
                self._age_sum += begin.now - item.request.sent_at
                self._age_n += 1
        sent = None
        if st.log_topic and st.loop.batch and not begin.replay:
            # the epoch-log write overlaps execution; the report (hence every reply of
            # this epoch, anywhere) waits for it to be durable
            rec = EpochRecord.of(begin.epoch, st.index, begin.now, st.loop.batch,
                                 st.generation)
            if rec.journals:  # (what the runs see: the journals as installed at the Begin)
                seen = self._world.effects.journals
                rec = dataclasses.replace(rec, journals=tuple(
                    (tid, seen[tid]) for tid, _ in rec.journals if seen.get(tid)))
            fence = self._fence
            if fence is not None and not fence.valid():
                await fence.held()
            sent = await self._kafka.send(st.log_topic, rec.encode(), 0)
        await st.loop.execute()
        if self._settings.check_determinism and not begin.replay:
            assert st.engine is not None
            await check_local(st.engine, st.loop.batch, st.loop.outcomes, st.loop.request_of)
        if sent is not None:
            try:
                # (a stuck producer is replaced and the record sent again: the broker took
                # none of it, and a copy that did land twice replays once — worker.clients)
                md = await self._kafka.delivered(sent, self._fence)
            except Exception as exc:
                # without the record no reply of this epoch may leave: stop loudly
                log.error("writing epoch %d to the epoch log failed: %s; leaving the cluster",
                          begin.epoch, exc, extra={"worker": st.index})
                self._uplink.close()
                return
            st.log_pos = md.offset + 1
        self._calls.reported_epoch = begin.epoch
        self._metrics.executed(t0)
        self._traces.reported(begin.epoch)
        self.report()

    def report(self) -> None:
        """This worker's votes and call counters of the current epoch, to the coordinator
        (and to the peers under a lease)."""
        st = self._state
        assert st.engine is not None and st.loop is not None
        conflicts, aborts = st.loop.votes()
        pending = st.loop.pending
        self._idle_reported = pending == 0
        if self._uplink.closed:  # the coordinator is gone: this epoch is rolled back anyway
            return
        calls = self._calls
        rep = wire.Report(
            st.engine.epoch, st.index, len(st.loop.batch),
            [wire.Conflict(t, b) for t, b in conflicts.items()],
            [wire.Aborted(t, e, r) for t, (e, r) in aborts.items()],
            list(calls.sent), list(calls.served), pending, self.lease.run,
        )
        self._uplink.send(rep)
        if self.lease.active:
            self.send_peers(rep)
        self.lease.on_report(rep)

    async def commit(self, msg: wire.Commit) -> None:
        """The coordinator's Commit."""
        await self.commit_epoch(msg.epoch, {c.tid: c.blocker for c in msg.conflicts},
                                {a.tid: (a.error_type, a.reason) for a in msg.aborts},
                                msg.marker)

    async def commit_epoch(self, epoch: int, conflicts: dict[int, int],
                           aborts: dict[int, tuple[str, str]], marker: int | None) -> None:
        """Commit epoch ``epoch`` with the merged votes (the coordinator's Commit, or the
        lease's)."""
        loop = self._state.loop
        assert loop is not None
        t0 = time.perf_counter()
        self._traces.committing(epoch)
        if self.mode == "cross" and conflicts:
            candidates = loop.apply(conflicts, aborts)
            # the epoch's own commits and aborts are final now: their replies leave while
            # the conflicting ones re-run (a replay after a crash reproduces both)
            fates = loop.decided(conflicts, aborts)
            self._reply(fates)
            fb = await self._fallback.run(epoch, loop, candidates, set(conflicts))
            await loop.rerun_deviated(fb)  # (the phase ended everywhere: alone, in tid order)
            late = loop.settle(conflicts, aborts, fb, decided_done=True)
            self._reply(late)
            fates += late
        else:
            fates = await loop.commit(conflicts, aborts)
            self._reply(fates)
        self._metrics.committed(fates, self._state.answered, t0)
        self._traces.committed(epoch, fates, self._replay, self._state.index)
        self._world.committed(fates, self._replay)
        if marker is not None:
            self._snapshot(epoch, marker)

    def _reply(self, fates: list[Fate[Pending]]) -> None:
        """Queue the replies of decided ``fates`` (a replay's already out: only mark them done)."""
        st = self._state
        for f in fates:
            req = f.item.request
            if f.item.partition < 0:  # a request the runtime made: nobody waits for a reply
                continue
            if f.committed:
                reply = wire.Reply(req.rid, True, f.value)
            else:
                reply = wire.Reply(req.rid, False, None, str(f.value[0]), str(f.value[1]))
                if self._settings.reply_tracebacks and st.engine is not None:
                    reply.traceback = st.engine.tracebacks.get((f.tid, str(f.value[1])))
            if f.item.direct:  # (its epoch is durable: answered on its client's channel)
                self._direct.replied(f.item, reply)
                continue
            before = st.answered.get(req.rid)
            if before is not None:  # a replay: this reply is already in the egress topic
                if wire.Reply(*astuple_head(before)).encode() \
                        != wire.Reply(*astuple_head(reply)).encode():
                    self._diverged(req, before, reply)
                st.applied_item(f.item)
                if f.item.offset >= 0:
                    self._ingress.complete(f.item.partition, f.item.offset)
                continue
            self._egress.add(req.reply_partition, reply.encode(), f.item.partition, f.item.offset)
            st.applied_item(f.item)

    def _diverged(self, req: wire.Request, before: wire.Reply, after: wire.Reply) -> None:
        """A replayed request answered otherwise than before the crash: say so, loudly."""
        def brief(r: wire.Reply) -> str:
            return f"{r.value!r:.120}" if r.ok else f"{r.error_type}: {r.reason!r:.120}"

        b, a = brief(before), brief(after)
        self._metrics.divergences_total += 1
        log.error("replay diverged: %s.%s on key %r (request %s) replied %s before the crash "
                  "and %s in the replay: it is not deterministic (use ctx.now(), ctx.random() "
                  "or ctx.run for what may differ between runs) — or the app's code changed "
                  "since the epoch was logged", req.operator, req.function,
                  req.key, req.rid, b, a, extra={"worker": self._state.index})
        if not self._uplink.closed:
            self._uplink.send(wire.Diverged(self._state.index, req.rid, req.operator,
                                            req.function, req.key[:200], b, a))

    def _snapshot(self, epoch: int, marker: int) -> None:
        """Epoch ``epoch`` committed carrying round ``marker``: no transaction is in flight
        here, so the stores and positions are a consistent cut — take this worker's part."""
        st = self._state
        assert st.engine is not None
        if self._settings.snapshot_interval <= 0:
            log.warning("round %d requested but snapshot rounds are off here", marker)
            self._uplink.send(wire.Snapshotted(
                marker, st.index, epoch, [], {}, {}, {}, [], 0,
                "snapshot rounds are off on this worker (snapshot_interval=0)"))
            return
        ingress, skip, retries = st.cut()
        direct = [r.encode() for r in self._direct.cut(marker, epoch)]

        async def durable() -> None:
            # (the round waits until every reply made so far is acknowledged — a round
            # holding a request must never need its reply again, a recovery could not
            # reproduce it — and until the direct requests' cut is in the epoch log)
            acks = [await self._kafka.producer.send(st.log_topic, r, partition=0)
                    for r in direct]
            await self._egress.durable()
            await asyncio.gather(*acks)

        self._rounds.take(marker, epoch, st.engine.stores, ingress, skip, dict(self._egress.acked),
                          retries, st.log_pos, durable)

    # -- liveness ---------------------------------------------------------------------------------
    async def heartbeat(self) -> None:
        """Tell the coordinator this worker lives, every quarter of its timeout (the first
        at once: its answer starts the lease); leave when the lease is past saving
        (``worker.fence``); log the epochs' counters now and then."""
        beat = self._settings.heartbeat_timeout / 4
        last_log = time.monotonic()
        fence = self._fence
        if fence is not None:
            # assigned and not yet ready: the coordinator loses it only with its channel
            # (or after STARTUP_TIMEOUT), so the lease starts now
            fence.grant(time.monotonic())
        while True:
            lp = self._state.loop
            assert lp is not None
            if not self._uplink.closed:  # (while the coordinator restarts, nobody listens)
                self._uplink.send(wire.Heartbeat(
                    self._state.index, lp.committed, self._metrics.heartbeat_latency(),
                    time.monotonic(), self._reach.silence(),
                    *_fresh(self._traces.slow.fresh(time.time()))))
            self._probe = asyncio.ensure_future(self._reach.probe())  # (one broker, in turn)
            await asyncio.sleep(beat)
            if fence is not None and not fence.valid():
                await asyncio.sleep(0.05)  # (answers waiting in the socket are read first)
                fence.check()
            if self._age_n and time.monotonic() - last_log >= 5.0:
                last_log = time.monotonic()
                log.info("epochs=%d committed=%d reruns=%d fallbacks=%d mean request age at epoch "
                         "start %.1f ms", lp.epochs, lp.committed, lp.reruns, lp.fallbacks,
                         1000 * self._age_sum / self._age_n)
                self._age_sum, self._age_n = 0.0, 0
