"""Live epochs driven by the coordinator (``epoch_lease`` = 0): Begin, barrier, Commit.

A new epoch begins as soon as the previous one committed if any worker reported waiting
work, otherwise when a worker wakes it up (``wire.Wakeup``) or after a second — but never
less than the gathering window (``coordinator.gathering``: up to ``Settings.epoch_gather``
seconds, less at light load) after the previous Begin. Each Commit
carries the union of the reports' conflicts and aborts and, every ``snapshot_interval``
seconds, a snapshot round's marker; a rescale switches in at such a Commit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from coordinator.barrier import Barrier
from coordinator.gathering import Gathering
from coordinator.inbox import Inbox
from coordinator.needs import EpochEnds, EpochObserver, Workers
from coordinator.state import ClusterState
from coordinator.traces import epoch_span
from sfaas.runtime import ports, tracing, wire
from sfaas.runtime.ports import ClockPort
from sfaas.runtime.txn.loop import idle_after, merge_votes

log = logging.getLogger("sfaas.coordinator")

__all__ = ["EagerEpochs", "until_interrupted"]

#: Epochs between two log lines of the mean phases.
LOG_EVERY = 500


class EagerEpochs:
    """See the module docstring."""

    def __init__(self, state: ClusterState, inbox: Inbox, barrier: Barrier, workers: Workers,
                 ends: EpochEnds, observer: EpochObserver,
                 gather: Gathering | None = None, clock: ClockPort | None = None) -> None:
        self._state = state
        #: the clocks of each epoch's ``now`` (wall) and of the gathering window (monotonic;
        #: the process's when None)
        self._clock = clock or ports.current().clock
        self.gathering = gather or Gathering(0.0)
        self._inbox = inbox
        self._barrier = barrier
        self._workers = workers
        self._ends = ends
        self._observer = observer
        #: waiting for work and execute+barrier seconds, epochs since the last log line
        self._waited = 0.0
        self._executed = 0.0
        self._count = 0

    async def run(self, idle: bool = True) -> None:
        """Run epochs until cancelled (a barrier interrupted by a loss raises)."""
        state, mono = self._state, self._clock.monotonic  # (the gathering window's clock too)
        began = committed = 0.0
        while True:
            t_idle = mono()
            if idle:
                await self._inbox.wait_woken(1.0)
            window = self.gathering.window
            if window > 0 and (wait := began + window - mono()) > 0:
                await asyncio.sleep(wait)  # requests gather: fewer, fuller epochs
            began = mono()
            self._inbox.take_wakeup()
            epoch, now = state.next_epoch(), state.next_now(self._clock.time())
            self._workers.broadcast(wire.Begin(epoch, now, None))
            t_begin = mono()
            reports = await self._barrier.wait(epoch)
            t_exec = mono()
            stamps = [time.time_ns()] if tracing.ON else None
            self._phases(t_begin - t_idle, t_exec - t_begin)
            conflicts, aborts = merge_votes((r.conflicts, r.aborts) for r in reports)
            idle = (idle_after((r.pending for r in reports), conflicts)
                    and not self._inbox.woken)
            roots = sum(r.roots for r in reports)
            state.count_epoch(roots, len(conflicts))
            if committed:
                self.gathering.observe(roots, t_exec - committed, t_exec - t_begin)
            committed = t_exec
            marker, switching = self._ends.end(epoch, state.stats.txns)
            self._workers.broadcast(wire.Commit(
                epoch, [wire.Conflict(t, b) for t, b in conflicts.items()],
                [wire.Aborted(t, e, r) for t, (e, r) in aborts.items()], idle, marker))
            if stamps is not None:
                end = time.time_ns()
                epoch_span(epoch, now, (int(now * 1e9), stamps[0], end), {
                    "sfaas.roots": roots, "sfaas.conflicts": len(conflicts),
                    "sfaas.aborts": len(aborts), "sfaas.round": marker or 0})
            if switching:
                assert marker is not None
                await self._ends.switch(marker)  # no epoch begins until the new membership runs
                idle = False

    def _phases(self, waited: float, executed: float) -> None:
        self._observer.epoch(waited, executed)
        self._waited += waited
        self._executed += executed
        self._count += 1
        if self._count % LOG_EVERY == 0:
            g = self.gathering
            log.info("epochs %d; mean of the last %d (ms): waiting for work %.2f, "
                     "execute+barrier %.2f; %.0f txn/s, gathering window %.2f ms",
                     self._count, LOG_EVERY, self._waited / LOG_EVERY * 1000,
                     self._executed / LOG_EVERY * 1000, g.rate, g.window * 1000)
            self._waited = self._executed = 0.0


async def until_interrupted(epochs: Coroutine[Any, Any, None], inbox: Inbox) -> None:
    """Run ``epochs`` until a loss interrupts them (returns then); a failure of the epochs
    themselves is a bug and raises."""
    loop_task = asyncio.create_task(epochs)
    loss = asyncio.create_task(inbox.wait_interrupted())
    await asyncio.wait([loop_task, loss], return_when=asyncio.FIRST_COMPLETED)
    loop_task.cancel()
    loss.cancel()
    await asyncio.gather(loop_task, loss, return_exceptions=True)
    if not inbox.interrupted:
        loop_task.result()
