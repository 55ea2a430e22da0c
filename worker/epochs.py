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
import logging
import time
from typing import Any

from sfaas.runtime import tracing, wire
from sfaas.runtime.settings import Settings
from sfaas.runtime.txn.determinism import check_local
from worker.cuts import RoundCut
from worker.epoch_log import EpochLogWriter
from worker.links import CoordinatorLink, PeerLinks
from worker.metrics import WorkerMetrics
from worker.peers import Peers
from worker.protocols.fallback import CrossFallback
from worker.protocols.lease import EpochLeaseHolder
from worker.replies import Replies
from worker.state import WorkerState
from worker.tasks import Tasks
from worker.traces import EpochTraces
from worker.world import World

log = logging.getLogger("sfaas.worker")

__all__ = ["EpochRunner"]


class EpochRunner:
    """Runs this worker's epochs (see the module docstring); also the host of its
    :class:`~worker.protocols.lease.EpochLeaseHolder`, under which it begins and commits
    them itself. What an epoch's end hands on is other parts': the replies
    (``worker.replies``), a round's cut (``worker.cuts``), the epoch log's record
    (``worker.epoch_log``)."""

    def __init__(
        self, settings: Settings, state: WorkerState, *, uplink: CoordinatorLink,
        links: PeerLinks, calls: Peers, fallback: CrossFallback, metrics: WorkerMetrics,
        tasks: Tasks, world: World, epoch_log: EpochLogWriter, replies: Replies, cut: RoundCut,
    ) -> None:
        self._settings = settings
        self._state = state
        #: "cross", "local" or "off": the epochs' fallback phase (``Settings.fallback_phase``)
        self.mode = settings.fallback_phase()
        self._uplink = uplink
        self._links = links
        self._calls = calls
        self._fallback = fallback
        self._metrics = metrics
        self._tasks = tasks
        self._world = world
        self._epoch_log = epoch_log
        self._replies = replies
        self._cut = cut
        #: the epoch running now is a recovery's replay
        self._replay = False
        #: epochs this worker begins and commits itself, under the coordinator's lease
        self.lease = EpochLeaseHolder(self)
        # the coordinator starts idle: the first records must wake it up
        self._idle_reported = True
        #: the spans of the epochs and their requests (``worker.traces``: only while
        #: tracing), and the slowest and aborted requests of the last minute
        self.traces = EpochTraces(settings.namespace, settings.trace_slow, metrics.latency)
        self.traces.timers = world.traced.timers  # (the timers set by traced transactions)

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

    def leased(self, msg: wire.Report | wire.Wake) -> None:
        """A peer's Report or Wake of a leased run."""
        self.lease.receive(msg)

    def end_lease(self) -> None:
        """No epoch begins on its own any more (a recovery, a rescale's new membership)."""
        self.lease.reset()

    async def halt(self) -> None:
        """Cancel every execution and call in flight, wait for them; forget the fallback
        phase's held messages (a recovery starts from a quiet worker)."""
        running = self._tasks.cancel()
        self._calls.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        self._calls.reset()
        self._fallback.reset()

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
        self.traces.began(begin.epoch, begin.now)
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
                self._metrics.aged(begin.now - item.request.sent_at)
        # the epoch-log write overlaps execution; the report (hence every reply of this
        # epoch, anywhere) waits for it to be durable
        logging_ns = time.time_ns() if tracing.ON else 0
        sent = await self._epoch_log.send(begin, self._world.effects.journals)
        await st.loop.execute()
        if self._settings.check_determinism and not begin.replay:
            assert st.engine is not None
            await check_local(st.engine, st.loop.batch, st.loop.outcomes, st.loop.request_of)
        if sent is not None and not await self._epoch_log.durable(begin.epoch, sent):
            return
        if logging_ns and sent is not None:
            self.traces.logged(begin.epoch, logging_ns)
        self._calls.reported_epoch = begin.epoch
        self._metrics.executed(t0)
        self.traces.reported(begin.epoch)
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
        self.traces.committing(epoch)
        batch = loop.batch  # (the epoch's, for its spans: settle starts a new list)
        if self.mode == "cross" and conflicts:
            candidates = loop.apply(conflicts, aborts)
            # the epoch's own commits and aborts are final now: their replies leave while
            # the conflicting ones re-run (a replay after a crash reproduces both)
            fates = loop.decided(conflicts, aborts)
            self._replies.reply(fates)
            phase_ns = time.time_ns() if tracing.ON else 0
            fb = await self._fallback.run(epoch, loop, candidates, set(conflicts))
            ended_ns = time.time_ns() if phase_ns else 0
            await loop.rerun_deviated(fb)  # (the phase ended everywhere: alone, in tid order)
            if phase_ns:
                self.traces.phase(epoch, phase_ns, ended_ns)
            late = loop.settle(conflicts, aborts, fb, decided_done=True)
            self._replies.reply(late)
            fates += late
        else:
            fates = await loop.commit(conflicts, aborts)
            self._replies.reply(fates)
        self._metrics.committed(fates, self._state.answered, t0)
        self.traces.committed(epoch, fates, self._replay, self._state.index, batch, conflicts,
                              self._state.recovery)
        self._world.committed(fates, self._replay)
        if marker is not None:
            self._cut.take(epoch, marker)
