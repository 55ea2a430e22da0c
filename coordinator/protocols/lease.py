"""The coordinator's side of leased epochs (``worker.protocols.lease``; ``Settings.epoch_lease``).

A leased run begins with the coordinator's ``Begin`` of its first epoch and an ``EpochLease``
``epoch_lease`` epochs beyond it. From then on the workers begin and commit epochs
themselves, exchanging their reports; the coordinator gets the same reports and follows
the epochs one by one with the barrier test it would use itself, off their critical path:

- for its statistics and metrics (epochs, transactions, conflicts);
- to extend the lease once the workers are half-way through it, so they rarely wait;
- to place a snapshot round's marker (``RoundKeeper.marker``) or a rescale's switch: on
  a new lease's last epoch, which no worker can have begun yet. A switch holds the lease
  there: once the switch epoch is over everywhere the new membership is switched in and a
  new run begins. While the cluster is idle the coordinator looks every second (and
  when a rescale wakes it) whether a round or a switch is due; a marker ahead makes the
  idle workers run the (empty) epochs up to it.

A worker lost during a run interrupts it like a barrier (``Interrupted``); the recovery
that follows numbers its new epochs above every epoch leased before, and each run has a
random id its reports carry, so nothing from an earlier run is taken for this one's.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field

from coordinator.inbox import Inbox, Interrupted, Lost, Tick
from coordinator.needs import EpochEnds, EpochObserver, Workers
from coordinator.state import ClusterState
from sfaas.runtime import ports, wire
from sfaas.runtime.ports import ClockPort
from sfaas.runtime.txn.epochs import execution_finished
from sfaas.runtime.txn.loop import idle_after, merge_votes

log = logging.getLogger("sfaas.coordinator")

__all__ = ["LeasedEpochs", "IDLE_TICK"]

#: Seconds an idle cluster waits between looks at whether a round or a switch is due.
IDLE_TICK = 1.0


class LeasedEpochs:
    """Leased runs of ``width`` epochs (see the module docstring)."""

    def __init__(self, width: int, state: ClusterState, inbox: Inbox, workers: Workers,
                 ends: EpochEnds, observer: EpochObserver,
                 clock: ClockPort | None = None) -> None:
        self._width = width
        #: the clocks of the run's first ``now`` (wall) and its epochs' timings (monotonic;
        #: the process's when None)
        self._clock = clock or ports.current().clock
        self._state = state
        self._inbox = inbox
        self._workers = workers
        self._ends = ends
        self._observer = observer

    async def run(self, idle: bool = True) -> None:
        """Run leased epochs until interrupted (a loss raises ``Interrupted``). Whether the
        cluster is ``idle`` a run learns from the reports: the workers begin the epochs."""
        while True:
            await self._run()

    async def _run(self) -> None:
        """One leased run: until a rescale's switch (then the caller begins another)."""
        r = self._begin()
        while True:
            latest = await self._gather(r)
            if latest is None:  # idle, or woken: a round or a switch may be due
                self._mark_if_due(r)
                continue
            if await self._epoch_over(r, latest):
                return
            r.epoch += 1

    def _begin(self) -> _Run:
        state, workers, width = self._state, self._workers, self._width
        epoch = state.begin_lease_run()
        run = 1 + secrets.randbelow(2**62)
        workers.broadcast(wire.Begin(epoch, state.next_now(self._clock.time()), None))
        upto = epoch + width
        state.lease(upto)
        workers.broadcast(wire.EpochLease(upto, None, run))
        log.info("leased run from epoch %d: the workers begin and commit epochs themselves, "
                 "%d ahead", epoch, width)
        return _Run(run, epoch, upto, t_last=self._clock.monotonic())

    async def _gather(self, r: _Run) -> dict[int, wire.Report] | None:
        """Epoch ``r.epoch``'s reports once it is over everywhere; None when an idle
        cluster's tick passed or a ``Tick`` woke the run (the reports so far are kept)."""
        epoch, n = r.epoch, len(self._state.members)
        latest = r.ahead.pop(epoch, {})
        while not execution_finished(n, {i: (x.sent, x.served) for i, x in latest.items()}):
            msg = await self._next(r.idle and not latest and not r.ahead)
            if isinstance(msg, Lost):
                raise Interrupted(f"a worker was lost during epoch {epoch}")
            if msg is None or isinstance(msg, Tick):
                r.ahead[epoch] = latest
                return None
            self._take(r, msg, latest)
        return latest

    async def _next(self, idle: bool) -> wire.Message | None:
        """The inbox's next message; None when the cluster is ``idle`` and none came in
        ``IDLE_TICK``."""
        if not idle:
            return await self._inbox.get()
        try:
            return await asyncio.wait_for(self._inbox.get(), IDLE_TICK)
        except TimeoutError:
            return None

    def _take(self, r: _Run, msg: wire.Message, latest: dict[int, wire.Report]) -> None:
        """File a message that came during epoch ``r.epoch``: a report of it in ``latest``,
        of a later one in ``r.ahead``."""
        if not isinstance(msg, wire.Report):
            log.warning("ignoring %s during epoch %d", type(msg).__name__, r.epoch)
            return
        if msg.epoch < r.epoch or msg.run not in (r.id, 0):
            return  # a copy sent after the epoch was over, or of another run (0: made
            # before the worker got this run's lease)
        if msg.epoch > r.upto:
            self._workers.lose_slot(msg.index, f"protocol error: it reported epoch "
                                               f"{msg.epoch} beyond its lease ({r.upto})")
            return
        if msg.epoch > r.epoch:
            r.ahead.setdefault(msg.epoch, {})[msg.index] = msg
        else:
            latest[msg.index] = msg

    def _mark_if_due(self, r: _Run) -> None:
        """A round's marker or a switch due: lease one epoch more, ending on it."""
        if r.switch_at is not None:
            return
        state = self._state
        marker, switching = self._ends.end(r.upto + 1, state.stats.txns)
        if marker is not None:
            r.upto += 1
            state.lease(r.upto)
            if switching:
                r.switch_at, r.switch_round = r.upto, marker
            self._workers.broadcast(wire.EpochLease(r.upto, marker, r.id))

    async def _epoch_over(self, r: _Run, latest: dict[int, wire.Report]) -> bool:
        """Count epoch ``r.epoch`` (over everywhere, with ``latest`` its reports); extend
        the lease half-way through it. True when the run ended at a rescale's switch."""
        state = self._state
        reports = [latest[i] for i in sorted(latest)]
        conflicts, _aborts = merge_votes((x.conflicts, x.aborts) for x in reports)
        r.idle = idle_after((x.pending for x in reports), conflicts)
        now = self._clock.monotonic()
        self._observer.epoch(0.0, now - r.t_last)
        r.t_last = now
        state.count_epoch(sum(x.roots for x in reports), len(conflicts))
        state.reach_epoch(r.epoch)
        if r.epoch == r.switch_at:
            # no epoch begins until the new membership runs
            await self._ends.switch(r.switch_round)
            return True
        if r.switch_at is None and r.upto - r.epoch < max(1, self._width // 2):
            self._extend(r)
        return False

    def _extend(self, r: _Run) -> None:
        """A new lease ``width`` epochs beyond ``r.epoch`` (ending on a marker or a switch
        when one is due there)."""
        new = r.epoch + self._width
        marker, switching = self._ends.end(new, self._state.stats.txns)
        if switching:
            assert marker is not None
            r.switch_at, r.switch_round = new, marker
        r.upto = new
        self._state.lease(r.upto)
        self._workers.broadcast(wire.EpochLease(r.upto, marker, r.id))


@dataclass
class _Run:
    """One leased run's progress: its random ``id`` (the reports carry it), the epoch being
    followed, the lease's last epoch, the switch ahead if any, reports of later epochs."""

    id: int
    epoch: int
    upto: int
    t_last: float
    switch_at: int | None = None
    switch_round: int = 0
    ahead: dict[int, dict[int, wire.Report]] = field(default_factory=dict)
    #: whether the last epoch left the cluster idle (then a tick wakes the run)
    idle: bool = False
