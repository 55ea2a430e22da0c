"""The watchdog: loses the members that fall silent, or are cut from Kafka.

Every quarter of ``heartbeat_timeout`` (at most 0.25 s) it looks at each member: a ready
one silent past ``heartbeat_timeout``, one not ready :data:`STARTUP_TIMEOUT` after it
registered, or a ready one cut from Kafka while another hears it (:meth:`Watchdog.cut_from_kafka`)
is lost (``coordinator.membership``); a lost slot's promotion that never registers runs out
(``coordinator.protocols.standby``). It starts once the cluster formed, feeding the standbys
their primaries first.
"""

from __future__ import annotations

import asyncio

from coordinator.needs import Losses, StandbyRoles
from coordinator.state import ClusterView, Member
from sfaas.runtime import ports
from sfaas.runtime.lifecycle import Service

__all__ = ["STARTUP_TIMEOUT", "Watchdog"]

#: Seconds a registered worker may take to get ready (open stores, connect peers and Kafka).
STARTUP_TIMEOUT = 30.0


class Watchdog(Service):
    """See the module docstring. ``kafka_silence_limit``: a worker hearing nothing from
    Kafka this long while another does is lost (0: never; ``sfaas.runtime.kafka.silence_limit``)."""

    part = "watchdog"

    def __init__(self, state: ClusterView, standbys: StandbyRoles, losses: Losses, *,
                 heartbeat_timeout: float, kafka_silence_limit: float = 0.0) -> None:
        self._state = state
        self._standbys = standbys
        self._losses = losses
        self._timeout = heartbeat_timeout
        self._kafka_limit = kafka_silence_limit
        self._task: asyncio.Task[None] | None = None

    async def on_start(self) -> None:
        """Feed the standbys their primaries, and lose members that fall silent."""
        for m in self._state.members:
            self._standbys.feed(m.index)
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="watchdog")

    async def on_stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        timeout = self._timeout
        while True:
            # (every tick, and at once when a beat says its worker hears no Kafka: each
            # tick of delay was a gap in a cut worker's replies)
            await self._state.kafka_silence_news(min(0.25, timeout / 4))
            now = ports.current().clock.monotonic()  # (virtual in the simulator)
            for m in self._state.members:
                if not m.alive:
                    # a promotion whose standby never registers runs out
                    self._standbys.reserved_for(m.index)
                    continue
                if m.ready.is_set() and now - m.last_seen > timeout:
                    self._losses.lose(m, f"silent for {now - m.last_seen:.1f} s "
                                         f"(heartbeat_timeout {timeout} s)")
                elif not m.ready.is_set() and now - m.last_seen > STARTUP_TIMEOUT:
                    self._losses.lose(m, f"not ready {STARTUP_TIMEOUT:.0f} s after it registered")
                elif m.ready.is_set() and (why := self.cut_from_kafka(m, now)):
                    self._losses.lose(m, why)

    def cut_from_kafka(self, m: Member, now: float) -> str:
        """Why ready member ``m`` counts as cut from Kafka ("" if it does not): it has heard
        nothing from any broker for the limit while another ready member hears them (all
        silent is Kafka's outage, and a replacement would not help). A worker cut from Kafka
        but not from this coordinator keeps its heartbeats, and its partitions' requests
        would wait in Kafka until the cut heals; its standby takes over instead."""
        limit, silent = self._kafka_limit, m.kafka_silent
        # (as its last beat said: a late beat is the heartbeat timeout's business)
        if limit <= 0 or silent <= limit:
            return ""
        hearing = [o for o in self._state.members if o is not m and o.alive
                   and o.ready.is_set() and o.kafka_heard and o.kafka_silent < limit / 2
                   and now - o.kafka_heard < 2 * self._timeout]
        if not hearing:
            return ""
        return (f"cut from Kafka: no answer from any broker for {silent:.1f} s while worker "
                f"{hearing[0].index} has them (limit {limit:.1f} s)")
