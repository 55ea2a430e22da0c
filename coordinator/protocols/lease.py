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
from typing import TYPE_CHECKING

from sfaas.runtime import wire
from sfaas.runtime.txn.epochs import execution_finished
from sfaas.runtime.txn.loop import idle_after, merge_votes
from sfaas.runtime.wire import Message

if TYPE_CHECKING:
    from coordinator.service import Coordinator

log = logging.getLogger("sfaas.coordinator")

__all__ = ["Tick", "leased_epochs"]

#: Seconds an idle cluster waits between looks at whether a round or a switch is due.
IDLE_TICK = 1.0


class Tick(Message):
    """Put into the inbox by :meth:`Coordinator.wake`: look now whether a round or a switch is due."""


async def leased_epochs(c: Coordinator) -> None:
    """Run leased epochs until interrupted (a loss raises ``Interrupted``)."""
    while True:
        await _run(c)


async def _run(c: Coordinator) -> None:
    """One leased run: until a rescale's switch (then the caller begins another)."""
    from coordinator.service import Interrupted, Lost

    width = c.settings.epoch_lease
    step = max(1, width // 2)
    # above every epoch leased before: a report still travelling from then is stale
    c.epoch = max(c.epoch, c.lease_upto) + 1
    epoch = c.epoch
    run = 1 + secrets.randbelow(2**62)
    c._broadcast(wire.Begin(epoch, time.time(), None))
    upto = c.lease_upto = epoch + width
    c._broadcast(wire.Lease(upto, None, run))
    log.info("leased run from epoch %d: the workers begin and commit epochs themselves, %d ahead", epoch, width)
    switch_at: int | None = None
    switch_round = 0
    ahead: dict[int, dict[int, wire.Report]] = {}
    idle = False
    t_last = time.perf_counter()
    while True:
        n = len(c.members)
        latest = ahead.pop(epoch, {})
        timed_out = False
        while not execution_finished(n, {i: (r.sent, r.served) for i, r in latest.items()}):
            if idle and not latest and not ahead:
                try:
                    msg = await asyncio.wait_for(c._inbox.get(), IDLE_TICK)
                except TimeoutError:
                    timed_out = True
                    break
            else:
                msg = await c._inbox.get()
            if isinstance(msg, Lost):
                raise Interrupted(f"a worker was lost during epoch {epoch}")
            if isinstance(msg, Tick):
                timed_out = True
                break
            if not isinstance(msg, wire.Report):
                log.warning("ignoring %s during epoch %d", type(msg).__name__, epoch)
                continue
            if msg.epoch < epoch or msg.run not in (run, 0):
                continue  # a copy sent after the epoch was over, or of another run (0: made
                # before the worker got this run's lease)
            if msg.epoch > upto:
                for m in c.members:
                    if m.index == msg.index:
                        c.lose(m, f"protocol error: it reported epoch {msg.epoch} beyond its lease ({upto})")
                continue
            if msg.epoch > epoch:
                ahead.setdefault(msg.epoch, {})[msg.index] = msg
            else:
                latest[msg.index] = msg
        if timed_out:  # idle, or woken: a round or a switch may be due
            ahead[epoch] = latest
            if switch_at is None:
                switch = c.rescale.due()
                marker = c.rounds.marker(upto + 1, c.stats["txns"], force=switch)
                if marker is not None:
                    upto = c.lease_upto = upto + 1
                    if switch:
                        c.rescale.arm(marker)
                        switch_at, switch_round = upto, marker
                    c._broadcast(wire.Lease(upto, marker, run))
            continue
        reports = [latest[i] for i in sorted(latest)]
        conflicts, _aborts = merge_votes((r.conflicts, r.aborts) for r in reports)
        idle = idle_after((r.pending for r in reports), conflicts)
        now = time.perf_counter()
        c.metrics.epoch(0.0, now - t_last)
        t_last = now
        c.stats["epochs"] += 1
        c.stats["txns"] += sum(r.roots for r in reports)
        c.stats["conflicts"] += len(conflicts)
        c.epoch = epoch
        if epoch == switch_at:
            await c.rescale.switch(switch_round)  # no epoch begins until the new membership runs
            return
        if switch_at is None and upto - epoch < step:
            switch = c.rescale.due()
            new = epoch + width
            marker = c.rounds.marker(new, c.stats["txns"], force=switch)
            if switch and marker is not None:
                c.rescale.arm(marker)
                switch_at, switch_round = new, marker
            upto = c.lease_upto = new
            c._broadcast(wire.Lease(upto, marker, run))
        epoch += 1
