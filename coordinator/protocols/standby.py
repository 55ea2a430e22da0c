"""The coordinator's standbys: who follows which worker, and who takes over when it dies.

With ``standbys`` = R > 0, registrants beyond the ``workers`` primaries become standbys
(a worker may also ask for the role with ``--standby-of``): each slot gets up to R,
fewest first. A standby is told ``Follow`` once its primary is ready (and again when the
primary was replaced: a new address). When a primary is lost and the slot has a
standby, the coordinator sends it ``Promote(slot, newest complete round)`` and reserves
the slot for it for :data:`RESERVE_SECONDS`, so the dead primary's restarted process
does not take the slot first: that process becomes the slot's new standby instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from coordinator.state import ClusterView
from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, wire

log = logging.getLogger("sfaas.coordinator.standbys")

__all__ = ["Standby", "Standbys", "RESERVE_SECONDS"]

#: How long a slot waits for its promoted standby before any worker may take it.
RESERVE_SECONDS = 30.0


@dataclass
class Standby:
    name: str
    host: str
    pid: int
    channel: channels.Channel
    of: int
    #: the primary address it was last told to follow
    following: tuple[str, int] | None = None

    @property
    def followed(self) -> str:
        """``host:port`` it follows ("" before its first ``Follow``)."""
        return f"{self.following[0]}:{self.following[1]}" if self.following else ""


class Standbys:
    """See the module docstring; owned by the coordinator's event loop. ``workers``: the
    primaries configured, ``per_slot``: the standbys wanted for each; ``newest_round``: the
    newest complete round once one being published landed; ``changed``: told whenever the
    standbys change."""

    def __init__(self, state: ClusterView, workers: int, per_slot: int,
                 newest_round: Callable[[], Awaitable[int]], changed: Callable[[], None]) -> None:
        self._state = state
        self._workers = workers
        self._per_slot = per_slot
        self._newest_round = newest_round
        self._changed = changed
        self.by_slot: dict[int, list[Standby]] = {}
        self._reserved: dict[int, tuple[str, float]] = {}  # slot → (standby name, until)
        self.promotions = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def reserved_for(self, slot: int) -> str | None:
        """The standby a lost slot waits for, if its reservation has not run out."""
        r = self._reserved.get(slot)
        if r is None:
            return None
        if time.monotonic() > r[1]:
            del self._reserved[slot]
            if self.promote(slot):  # another standby of the slot gets its chance
                log.warning("slot %d: promoted standby %s did not register within %.0f s; "
                            "promoting another", slot, r[0], RESERVE_SECONDS)
                return self._reserved[slot][0]
            log.warning("slot %d: promoted standby %s did not register within %.0f s; "
                        "any worker may take it", slot, r[0], RESERVE_SECONDS)
            return None
        return r[0]

    def reservation(self, slot: int) -> str:
        """The standby a lost slot was promoted to ("" if none), without running out the
        reservation (:meth:`reserved_for` may promote another)."""
        r = self._reserved.get(slot)
        return r[0] if r is not None else ""

    def slot_for(self, reg: wire.Register) -> int | None:
        """The slot ``reg`` should stand by for, or None: it takes a primary slot (or is
        refused)."""
        n = self._workers
        if reg.index >= 0:
            return None  # re-registering for a slot it holds or was promoted to
        if reg.standby_of >= 0:
            if reg.standby_of >= n:
                log.warning("worker %s asked to stand by for worker %d; there are %d: any role",
                            reg.name, reg.standby_of, n)
            else:
                return reg.standby_of
        if not self._state.joined:
            return None
        if any(not m.alive and self.reserved_for(m.index) is None for m in self._state.members):
            return None  # a lost slot with no standby coming: this worker replaces it
        want = self._per_slot
        counts = {i: len(self.by_slot.get(i, [])) for i in range(n)}
        slot = min(counts, key=lambda i: (counts[i], i))
        return slot if counts[slot] < want else None

    def add(self, reg: wire.Register, chan: channels.Channel, slot: int) -> Standby:
        sb = Standby(reg.name, reg.host, reg.pid, chan, slot)
        self.by_slot.setdefault(slot, []).append(sb)
        log.info("worker %s (pid %d) stands by for worker %d", reg.name, reg.pid, slot)
        self.feed(slot)
        self._changed()
        return sb

    def remove(self, sb: Standby) -> None:
        lst = self.by_slot.get(sb.of, [])
        if sb in lst:
            lst.remove(sb)
            log.warning("standby %s (pid %d) of worker %d is gone", sb.name, sb.pid, sb.of)
            self._changed()

    def feed(self, slot: int) -> None:
        """Tell the slot's standbys where its primary ships from (once it is ready)."""
        state = self._state
        m = state.member(slot)
        if m is None or not m.alive or not m.ready.is_set() or not m.repl_port:
            return
        addr = (m.host, m.repl_port)
        for sb in self.by_slot.get(slot, []):
            if sb.following != addr:
                try:
                    sb.channel.send(wire.Follow(slot, len(state.members), state.partitions, *addr))
                    sb.following = addr
                except ChannelClosed:
                    continue

    def promote(self, slot: int) -> bool:
        """Primary ``slot`` was lost: promote one of its standbys; False if it has none."""
        for sb in list(self.by_slot.get(slot, [])):
            if sb.following is None:
                continue  # never followed anything: it holds nothing
            self.by_slot[slot].remove(sb)
            self._reserved[slot] = (sb.name, time.monotonic() + RESERVE_SECONDS)
            self.promotions += 1
            task = asyncio.get_running_loop().create_task(self._promote(sb, slot),
                                                          name=f"promote-{slot}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self._changed()
            return True
        return False

    async def _promote(self, sb: Standby, slot: int) -> None:
        """Send the promotion once a round being published has landed: the recovery that
        follows rolls back to the round MinIO then has, which must be the one promoted to."""
        rnd = await self._newest_round()
        try:
            sb.channel.send(wire.Promote(slot, rnd))
        except ChannelClosed:
            log.warning("standby %s of worker %d is gone; not promoted", sb.name, slot)
            return
        log.warning("promoting standby %s (pid %d) to worker %d at round %d",
                    sb.name, sb.pid, slot, rnd)

    def registered(self, slot: int, name: str) -> None:
        """A worker took ``slot``: a reservation it fulfilled ends."""
        r = self._reserved.get(slot)
        if r is not None and r[0] == name:
            del self._reserved[slot]

    def all(self) -> list[Standby]:
        """Every standby, slot by slot."""
        return [sb for lst in self.by_slot.values() for sb in lst]
