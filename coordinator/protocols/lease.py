"""The coordinator's side of leased epochs (``worker.protocols.lease``; ``Settings.epoch_lease``).

A leased run begins with the coordinator's ``Begin`` of its first epoch and a ``Lease``
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
import time

from coordinator.inbox import Inbox, Interrupted, Lost, Tick
from coordinator.ports import EpochObserver, Markers, Switches, Workers, end_of_epoch
from coordinator.state import ClusterState
from sfaas.runtime import wire
from sfaas.runtime.txn.epochs import execution_finished
from sfaas.runtime.txn.loop import idle_after, merge_votes

log = logging.getLogger("sfaas.coordinator")

__all__ = ["LeasedEpochs", "IDLE_TICK"]

#: Seconds an idle cluster waits between looks at whether a round or a switch is due.
IDLE_TICK = 1.0


class LeasedEpochs:
    """Leased runs of ``width`` epochs (see the module docstring)."""

    def __init__(self, width: int, state: ClusterState, inbox: Inbox, workers: Workers,
                 rounds: Markers, rescale: Switches, observe: EpochObserver) -> None:
        self._width = width
        self._state = state
        self._inbox = inbox
        self._workers = workers
        self._rounds = rounds
        self._rescale = rescale
        self._observe = observe

    async def run(self, idle: bool = True) -> None:
        """Run leased epochs until interrupted (a loss raises ``Interrupted``). Whether the
        cluster is ``idle`` a run learns from the reports: the workers begin the epochs."""
        while True:
            await self._run()

    async def _run(self) -> None:
        """One leased run: until a rescale's switch (then the caller begins another)."""
        state, workers, width = self._state, self._workers, self._width
        step = max(1, width // 2)
        epoch = state.begin_lease_run()
        run = 1 + secrets.randbelow(2**62)
        workers.broadcast(wire.Begin(epoch, time.time(), None))
        upto = epoch + width
        state.lease(upto)
        workers.broadcast(wire.Lease(upto, None, run))
        log.info("leased run from epoch %d: the workers begin and commit epochs themselves, "
                 "%d ahead", epoch, width)
        switch_at: int | None = None
        switch_round = 0
        ahead: dict[int, dict[int, wire.Report]] = {}
        idle = False
        t_last = time.perf_counter()
        while True:
            n = len(state.members)
            latest = ahead.pop(epoch, {})
            timed_out = False
            while not execution_finished(n, {i: (r.sent, r.served) for i, r in latest.items()}):
                if idle and not latest and not ahead:
                    try:
                        msg = await asyncio.wait_for(self._inbox.get(), IDLE_TICK)
                    except TimeoutError:
                        timed_out = True
                        break
                else:
                    msg = await self._inbox.get()
                if isinstance(msg, Lost):
                    raise Interrupted(f"a worker was lost during epoch {epoch}")
                if isinstance(msg, Tick):
                    timed_out = True
                    break
                if not isinstance(msg, wire.Report):
                    log.warning("ignoring %s during epoch %d", type(msg).__name__, epoch)
                    continue
                if msg.epoch < epoch or msg.run not in (run, 0):
                    continue  # a copy sent after the epoch was over, or of another run (0:
                    # made before the worker got this run's lease)
                if msg.epoch > upto:
                    workers.lose_slot(msg.index, f"protocol error: it reported epoch "
                                                 f"{msg.epoch} beyond its lease ({upto})")
                    continue
                if msg.epoch > epoch:
                    ahead.setdefault(msg.epoch, {})[msg.index] = msg
                else:
                    latest[msg.index] = msg
            if timed_out:  # idle, or woken: a round or a switch may be due
                ahead[epoch] = latest
                if switch_at is None:
                    marker, switching = end_of_epoch(self._rescale, self._rounds, upto + 1,
                                                     state.stats.txns)
                    if marker is not None:
                        upto += 1
                        state.lease(upto)
                        if switching:
                            switch_at, switch_round = upto, marker
                        workers.broadcast(wire.Lease(upto, marker, run))
                continue
            reports = [latest[i] for i in sorted(latest)]
            conflicts, _aborts = merge_votes((r.conflicts, r.aborts) for r in reports)
            idle = idle_after((r.pending for r in reports), conflicts)
            now = time.perf_counter()
            self._observe(0.0, now - t_last)
            t_last = now
            state.count_epoch(sum(r.roots for r in reports), len(conflicts))
            state.reach_epoch(epoch)
            if epoch == switch_at:
                # no epoch begins until the new membership runs
                await self._rescale.switch(switch_round)
                return
            if switch_at is None and upto - epoch < step:
                new = epoch + width
                marker, switching = end_of_epoch(self._rescale, self._rounds, new,
                                                 state.stats.txns)
                if switching:
                    assert marker is not None
                    switch_at, switch_round = new, marker
                upto = new
                state.lease(upto)
                workers.broadcast(wire.Lease(upto, marker, run))
            epoch += 1
