"""Leased epochs: the workers begin and commit epochs themselves (``wire.EpochLease``).

Without a lease the coordinator drives every epoch: ``Begin`` → execute → ``Report`` →
``Commit``, two hops through the coordinator between one epoch's end and the next one's
start. Under a lease up to epoch ``U`` each worker also sends its Reports to every peer,
and then:

- it commits epoch ``e`` once it holds every worker's latest report of ``e`` and the call
  counters show no call in flight (``execution_finished``, the coordinator's own barrier
  test). No report of ``e`` can follow that, so every worker merges the same reports (in
  worker order) into the same conflicts and aborts — the same Commit the coordinator would
  have sent;
- it begins ``e + 1`` at once (while ``e + 1 ≤ U``), unless those reports say the cluster
  is idle: no worker has waiting work and nothing conflicted, the same verdict everywhere.
  After an idle commit a worker begins ``e + 1`` when work arrives here or a round's
  marker lies ahead, and first tells its peers with ``Wake(e + 1)``; a peer idle at ``e``
  begins ``e + 1`` on it;
- it stops after ``U`` until the coordinator extends the lease. The coordinator follows
  the reports (for its statistics, rounds and rescales) off the epochs' critical path and
  extends the lease while the workers are still well inside it. A lease's ``marker`` goes
  on epoch ``U``'s commit (a snapshot round, the coordinator's choice of epoch).

The coordinator begins the first epoch of a leased run itself (a ``Begin`` followed by the
``EpochLease``): at start-up, after a recovery and after a rescale. Each run has a random
id that its Reports and Wakes carry; a recovery (or a lost coordinator) ends the lease
(:meth:`EpochLeaseHolder.end_lease`), and what still travels from the old run is dropped by
its id.

A recovery's replay runs the same way (``wire.ReplayLogged``, :meth:`EpochLeaseHolder.replay`):
the logged epochs, given in order with their ``now``, each begun as ``Begin(replay=True)``
once the one before committed — whatever the reports say of idleness, with no marker —
and the Reports go to the peers only. After the last commit the worker tells the
coordinator (``LeaseHost.replayed``) and the lease is over; the coordinator, which drove
each replayed epoch with a Begin and a Commit (two hops per epoch), waits for that one
answer.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any, Protocol

from sfaas.runtime import ports, wire
from sfaas.runtime.txn.epochs import execution_finished
from sfaas.runtime.txn.loop import idle_after, merge_votes

log = logging.getLogger("sfaas.worker")

__all__ = ["EpochLeaseHolder", "LeaseHost"]


class LeaseHost(Protocol):
    """What a lease needs of its worker: its slot, its peers, and its epochs."""

    @property
    def index(self) -> int: ...

    @property
    def n_workers(self) -> int: ...

    def tasks_add(self, task: asyncio.Future[Any]) -> None: ...

    def send_peers(self, msg: wire.Message) -> None: ...

    def start_epoch(self, begin: wire.Begin) -> None: ...

    async def commit_epoch(self, epoch: int, conflicts: dict[int, int],
                           aborts: dict[int, tuple[str, str]], marker: int | None) -> None: ...

    def replayed(self, epoch: int) -> None:
        """A leased replay committed its last epoch, ``epoch``."""


class EpochLeaseHolder:
    """One worker's side of leased epochs (see the module docstring); ``wall``: the wall
    clock an epoch it begins takes its ``now`` from (the process's clock port's ``time``)."""

    def __init__(self, host: LeaseHost, wall: Callable[[], float] | None = None) -> None:
        self._host = host
        self._wall = wall or ports.current().clock.time
        #: the last epoch this worker may begin on its own (0: no lease, the coordinator drives)
        self.upto = 0
        #: the leased run's id (``wire.EpochLease.run``)
        self.run = 0
        #: epoch → the snapshot round whose marker its commit carries
        self.markers: dict[int, int] = {}
        #: the last epoch begun here, and the last one committed (under the lease)
        self.begun = 0
        self.committed = 0
        #: the epoch whose commit found the cluster idle (-1: not idle)
        self.idle_at = -1
        #: a reason to begin after an idle commit came (work here, a peer's Wake)
        self.woken = False
        #: epoch → worker index → that worker's latest report of the epoch
        self.reports: dict[int, dict[int, wire.Report]] = {}
        #: a leased replay's epochs still to begin, in order, with the ``now`` each ran with
        self.replays: collections.deque[wire.LoggedEpoch] = collections.deque()
        #: a leased replay runs (its reports go to the peers only)
        self.replaying = False
        self._committing = False

    @property
    def active(self) -> bool:
        return self.upto > 0

    def end_lease(self) -> None:
        """A recovery or a new membership: the lease is over (the coordinator begins the
        next run with a Begin and a new EpochLease); ``worker.needs.LeaseEnd``."""
        self.upto = 0
        self.run = 0
        self.markers.clear()
        self.reports.clear()
        self.idle_at = -1
        self.woken = False
        self.replays.clear()
        self.replaying = False
        self._committing = False
        # (what began and committed under the lease is over: a report of the next run's
        # epochs, whatever their numbers, is kept from now on — a replay's start below an
        # epoch committed before the recovery, or a restarted coordinator's)
        self.begun = self.committed = 0

    # -- what arrives -----------------------------------------------------------------------------
    def grant(self, msg: wire.EpochLease) -> None:
        """The coordinator's lease (it only grows)."""
        new_run = msg.run != self.run
        if new_run:  # what came from another run is stale
            self.run = msg.run
            self.markers.clear()
            for reps in self.reports.values():
                for i in [i for i, r in reps.items() if r.run != msg.run and i != self._host.index]:
                    del reps[i]
        elif msg.upto < self.upto:
            log.warning("ignoring a lease up to epoch %d below the one held (%d)", msg.upto,
                        self.upto, extra={"worker": self._host.index})
            return
        self.upto = msg.upto
        if msg.marker is not None:
            self.markers[msg.upto] = msg.marker
        own = self.reports.get(self.begun, {}).get(self._host.index)
        if new_run and own is not None and self.committed < self.begun:
            own.run = self.run  # reported before the lease came: the peers need it now
            self._host.send_peers(own)
        self.advance()

    def replay(self, msg: wire.ReplayLogged) -> None:
        """A recovery's logged epochs, replayed under a lease of run ``msg.run`` (see the
        module docstring); begins the first at once. (The recovery ended the lease before:
        a peer's report of this run may be here already, and is kept.)"""
        epochs = sorted(msg.epochs)
        assert epochs, "a replay of no epoch"
        assert len({e for e, _ in epochs}) == len(epochs), f"an epoch given twice: {epochs}"
        self.run = msg.run
        self.upto = epochs[-1].epoch
        self.markers.clear()
        self.idle_at = -1
        self.replaying = True
        self.replays = collections.deque(epochs)
        for reps in self.reports.values():  # (this worker's own from before the recovery too)
            for i in [i for i, r in reps.items() if r.run != msg.run]:
                del reps[i]
        self._begin_replayed()

    def _begin_replayed(self) -> None:
        e, now = self.replays.popleft()
        self._host.start_epoch(wire.Begin(e, now, None, True))

    def began(self, epoch: int) -> None:
        """Epoch ``epoch`` began here (the coordinator's Begin or our own)."""
        self.begun = epoch
        self.committed = epoch - 1  # (a coordinator's Begin comes after the last commit)
        self.idle_at = -1
        self.woken = False
        for e in [e for e in self.reports if e < epoch]:  # from before a recovery: stale
            del self.reports[e]

    def on_report(self, r: wire.Report) -> None:
        """A report of this worker's or a peer's (a peer's may come before our lease; one of
        another run waits here until it is overwritten, pruned or dropped with its run)."""
        if r.epoch <= self.committed:
            return  # a late copy: that epoch is over here
        self.reports.setdefault(r.epoch, {})[r.index] = r
        self.advance()

    def reported(self, r: wire.Report) -> None:
        """This worker's own report (sent to the coordinator): under a lease, also to
        every peer."""
        if self.active:
            self._host.send_peers(r)
        self.on_report(r)

    def receive(self, msg: wire.Report | wire.Wake) -> None:
        """A peer's Report or Wake."""
        if isinstance(msg, wire.Wake):
            self.on_wake(msg)
        else:
            self.on_report(msg)

    def on_wake(self, msg: wire.Wake) -> None:
        if self.active and msg.run == self.run and msg.epoch == self.begun + 1:
            self.woken = True
            self.advance()

    def work_arrived(self) -> None:
        self.woken = True
        self.advance()

    # -- what it does -----------------------------------------------------------------------------
    def advance(self) -> None:
        """Commit the current epoch, or begin the next, if the lease says so now."""
        if not self.active or self._committing:
            return
        w = self._host
        e = self.begun
        if self.committed < e:
            reps = {i: r for i, r in self.reports.get(e, {}).items()
                    if r.run == self.run or i == w.index}
            n = w.n_workers
            if execution_finished(n, {i: (r.sent, r.served) for i, r in reps.items()}):
                self._committing = True
                w.tasks_add(asyncio.ensure_future(self._commit(e, [reps[i] for i in sorted(reps)])))
            return
        if self.replaying:
            if self.replays:
                self._begin_replayed()
            else:  # the replay is over: live epochs are the coordinator's again
                self.end_lease()
                w.replayed(e)
            return
        nxt = e + 1
        if nxt > self.upto:
            return  # the coordinator extends the lease
        if self.idle_at == e:
            if not self.woken and not any(m > e for m in self.markers):
                return
            w.send_peers(wire.Wake(w.index, nxt, self.run))
        w.start_epoch(wire.Begin(nxt, self._wall()))

    async def _commit(self, epoch: int, reports: list[wire.Report]) -> None:
        try:
            conflicts, aborts = merge_votes((r.conflicts, r.aborts) for r in reports)
            idle = idle_after((r.pending for r in reports), conflicts)
            await self._host.commit_epoch(epoch, conflicts, aborts, self.markers.pop(epoch, None))
            self.committed = epoch
            self.idle_at = epoch if idle else -1
            self.reports.pop(epoch, None)
        finally:
            self._committing = False
        self.advance()
