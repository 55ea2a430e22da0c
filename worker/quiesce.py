"""Stopping a worker's work for a recovery or a rejoin, and what a rescale tells the rest.

A recovery (``worker.protocols.recovery``) and a worker waiting for a restarted
coordinator (``worker.service``) start from a quiet worker: :class:`Quiescer` stops ingest
and every execution in flight and waits until the replies already made are acknowledged.
A rescale (``worker.protocols.rescale``) tells the epochs, the world and the direct
ingress what moved through :class:`Departures` (``worker.needs.Rescaled``).
"""

from __future__ import annotations

import logging

from sfaas.errors import ChannelClosed
from sfaas.runtime.epochlog import CutRecord
from worker.direct import DirectIngress
from worker.egress import Egress
from worker.ingress import Ingress
from worker.needs import Halting, LeaseEnd, Settling
from worker.state import WorkerState
from worker.world import World

log = logging.getLogger("sfaas.worker")

__all__ = ["Departures", "Quiescer"]


class Quiescer:
    """Stops ingest and every execution in flight; waits until the replies already made are
    acknowledged (``worker.needs.Quiet``)."""

    def __init__(self, state: WorkerState, lease: LeaseEnd, halting: Halting,
                 ingress: Ingress, direct: DirectIngress, egress: Egress,
                 epoch_log: Settling) -> None:
        self._state = state
        self._lease = lease
        self._halting = halting
        self._epoch_log = epoch_log
        self._ingress = ingress
        self._direct = direct
        self._egress = egress

    async def quiesce(self, replies: bool = True) -> None:
        """Stop ingest and every execution in flight; wait until the replies already made
        are acknowledged (recovery starts from a quiet worker). ``replies=False`` (a rejoin
        of a lost coordinator): do not wait for them — a reply transaction commits only
        under the coordinator's lease, which the rejoin renews; waiting here for it
        deadlocked the rejoin (the simulator, seed 16, once its heartbeats ran on virtual
        time); the recovery that follows the rejoin waits for them."""
        self._lease.end_lease()  # no epoch begins on its own any more
        await self._ingress.pause()
        self._direct.rollback()  # (its clients send again what has no answer)
        await self._halting.halt()
        # (an epoch's record still in flight lands now, before this worker's fence, and
        # counts; one that lands after the fence is void: sfaas.runtime.epochlog, "Fences")
        await self._epoch_log.settle()
        self._state.drop_replays()
        if not replies:
            return
        try:
            await self._egress.durable(recovering=True)
        except ChannelClosed:
            raise  # (the recovery ends; the worker rejoins: Egress.durable)
        except Exception as exc:
            log.warning("flushing replies before the recovery failed: %s", exc,
                        extra={"worker": self._state.index})


class Departures:
    """What a rescale tells the rest of the worker (``worker.needs.Rescaled``): the epochs
    that their lease is over, the world that stores moved, the direct ingress which of its
    requests were dropped."""

    def __init__(self, lease: LeaseEnd, world: World, direct: DirectIngress) -> None:
        self._lease = lease
        self._world = world
        self._direct = direct

    def lease_over(self) -> None:
        self._lease.end_lease()

    def moved(self) -> None:
        self._world.moved()

    def dropped(self, rids: list[str]) -> None:
        self._direct.dropped(rids)

    def arriving(self) -> None:
        self._direct.arriving()

    def arrived(self, cuts: list[CutRecord], gained: set[int]) -> None:
        self._direct.take_over(cuts, gained)
