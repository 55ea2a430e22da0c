"""A worker's epochs: begin, execute, report — the coordinator's or the lease's.

``Begin n``   take a bounded batch of requests (re-runs first), give each a tid, run all
              roots concurrently; calls to keys of other workers go over peer channels
              (``worker.calls``). When my roots are done, ``Report`` my conflicts, user
              aborts and call counters; report again after each call I serve later (see
              ``wire.Report``).
``Commit n``  is ``worker.commits``': apply, the fallback phase, the replies, a round's cut.

With snapshot rounds on, each batch is written to the epoch log while it executes; the
report (hence every reply of the epoch, anywhere) waits until the record is durable.
Under a lease (``worker.protocols.lease``) the workers begin and commit epochs themselves:
the report also goes to every peer, and the lease begins the next epoch; a recovery's
replay runs as such a lease, whose reports go to the peers only.
"""

from __future__ import annotations

import logging
import time

from sfaas.runtime import tracing, wire
from sfaas.runtime.settings import Settings
from sfaas.runtime.txn.determinism import check_local
from worker.calls import PeerCalls
from worker.epoch_log import EpochLogWriter
from worker.links import CoordinatorLink
from worker.protocols.lease import EpochLeaseHolder
from worker.state import WorkerState
from worker.watch import EpochWatch
from worker.world import World

log = logging.getLogger("sfaas.worker")

__all__ = ["EpochRunner"]


class EpochRunner:
    """Begins, executes and reports this worker's epochs (see the module docstring): the
    coordinator's Begins and the lease's. What an epoch's end hands on is
    ``worker.commits``'."""

    def __init__(
        self, settings: Settings, state: WorkerState, *, uplink: CoordinatorLink, calls: PeerCalls,
        world: World, epoch_log: EpochLogWriter, watch: EpochWatch, lease: EpochLeaseHolder,
    ) -> None:
        self._check = settings.check_determinism
        self._state = state
        self._uplink = uplink
        self._calls = calls
        self._world = world
        self._epoch_log = epoch_log
        self._watch = watch
        self._lease = lease
        # the coordinator starts idle: the first records must wake it up
        self._idle_reported = True

    # -- waking up --------------------------------------------------------------------------------
    def work_arrived(self) -> None:
        """Ingest took requests: begin an epoch for them (leased), or wake the coordinator
        if this worker reported it had nothing to do."""
        if self._lease.active:
            self._lease.work_arrived()
        elif self._idle_reported:
            self._idle_reported = False
            if not self._uplink.closed:
                self._uplink.send(wire.Wakeup(self._state.index))

    def leased(self, msg: wire.Report | wire.Wake) -> None:
        """A peer's Report or Wake of a leased run."""
        self._lease.receive(msg)

    # -- an epoch ---------------------------------------------------------------------------------
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
        st.epoch_began(begin.replay)
        if begin.replay:  # the batch as logged, each item with the now it ran with (recovery)
            batch = st.loop.begin_replay(begin.epoch, st.take_replay(begin.epoch))
        else:
            self._world.before_begin(begin.now)  # (the timers due join the batch)
            batch = st.loop.begin(begin.epoch, begin.now)
        self._world.install(batch)
        self._watch.began(begin, batch)
        self._lease.began(begin.epoch)
        self._calls.begin(begin.epoch, st.n_workers)
        return t0

    async def execute(self, begin: wire.Begin, t0: float) -> None:
        """Run the roots of the epoch :meth:`begin` opened, then report."""
        st = self._state
        assert st.loop is not None
        # the epoch-log write overlaps execution; the report (hence every reply of this
        # epoch, anywhere) waits for it to be durable
        logging_ns = time.time_ns() if tracing.ON else 0
        sent = await self._epoch_log.send(begin, self._world.effects.journals)
        await st.loop.execute()
        if self._check and not begin.replay:
            assert st.engine is not None
            await check_local(st.engine, st.loop.batch, st.loop.outcomes, st.loop.request_of)
        if sent is not None and not await self._epoch_log.durable(begin.epoch, sent):
            return
        if logging_ns and sent is not None:
            self._watch.logged(begin.epoch, logging_ns)
        self._calls.reported(begin.epoch)
        self._watch.reported(begin.epoch, t0)
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
        lease = self._lease
        calls = self._calls
        rep = wire.Report(
            st.engine.epoch, st.index, len(st.loop.batch),
            [wire.Conflict(t, b) for t, b in conflicts.items()],
            [wire.Aborted(t, e, r) for t, (e, r) in aborts.items()],
            list(calls.sent), list(calls.served), pending, lease.run,
        )
        if not lease.replaying:  # (a leased replay's reports are the peers' alone)
            self._uplink.send(rep)
        lease.reported(rep)
