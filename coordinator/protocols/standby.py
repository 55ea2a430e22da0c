"""The coordinator's standbys: who follows which worker, and who takes over when it dies.

With ``standbys`` = R > 0, registrants beyond the ``workers`` primaries become standbys
(a worker may also ask for the role with ``--standby-of``): each slot gets up to R,
fewest first. A standby is told ``Follow`` once its primary is ready (and again when the
primary was replaced: a new address). When a primary is lost and the slot has a
standby, the coordinator sends it ``Promote(slot, newest complete round, its partitions)``
and reserves the slot for it for :data:`RESERVE_SECONDS`, so the dead primary's restarted process
does not take the slot first: that process becomes the slot's new standby instead. A
promoted standby whose channel closed, or that has been silent past the heartbeat timeout
(standbys send heartbeats), and that has not registered :data:`GONE_SECONDS` later will
not come (it was cut off with the primary, or died): the reservation ends early; nor is
a silent standby promoted. A lost slot with no standby holding its state, but with
standbys that never followed anything (the restarted primary of a slot whose promotion
failed), recruits one of them: it is told to stop and register again, and then takes the
slot as a replacement (``slot_for``) instead of waiting for a primary that never comes.
A standby that lost this coordinator (a cut, a restart) registers again saying it holds
its slot's replicas (``Register.replicas``): it stands by for that slot only, and if the
slot was lost meanwhile with no promotion under way it is promoted at once — never handed
the lost slot as a replacement, which it would leave (its replicas are of that slot).

``Follow`` names the primary's partitions by the partition map in force, so after a
rescale (``coordinator.protocols.rescale``) a standby follows what its primary owns: it
is told again whenever its primary's address or partitions change (:meth:`Standbys.feed`,
on every Ready — a rescale's ``Reassign`` ends in one — and on :meth:`Standbys.rescaled`).
While a scale-up is under way registrants beyond its joiners stand by for the slots it
adds (:meth:`Standbys.expect`; they are told to follow once the new primary is ready), and
the standbys of the slots a scale-down retires are retired with them: a ``Follow`` that
names no partition (the process exits with ``EXIT_RETIRED``; its supervisor does not
restart it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.needs import Changes, NewestRound
from coordinator.state import ClusterView
from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, ports, wire
from sfaas.runtime.partitioning import owned
from sfaas.runtime.protocols.membership import REGISTER_AGAIN

log = logging.getLogger("sfaas.coordinator.standbys")

__all__ = ["Standby", "Standbys", "RESERVE_SECONDS"]

#: How long a slot waits for its promoted standby before any worker may take it.
RESERVE_SECONDS = 30.0
#: How long after its channel closed a promoted standby may take to register again.
GONE_SECONDS = 3.0


@dataclass
class Standby:
    name: str
    host: str
    pid: int
    channel: channels.Channel
    of: int
    #: the primary address it was last told to follow
    following: tuple[str, int] | None = None
    #: the partitions it was last told to follow (its primary's, by the map then)
    partitions: tuple[int, ...] = ()
    #: when it was last heard from (a following standby sends heartbeats; the
    #: coordinator's monotonic clock)
    last_seen: float = 0.0
    #: it registered again saying it holds replicas of its slot's stores
    #: (``Register.replicas``): promotable before this coordinator told it to follow
    replicas: bool = False

    @property
    def holds(self) -> bool:
        """Does it hold (some of) its slot's state: told to follow, or it says so?"""
        return self.following is not None or self.replicas

    @property
    def followed(self) -> str:
        """``host:port`` it follows ("" before its first ``Follow``)."""
        return f"{self.following[0]}:{self.following[1]}" if self.following else ""


class Standbys:
    """See the module docstring; owned by the coordinator's event loop. ``workers``: the
    primaries configured (the slots are the cluster state's: a rescale changes them),
    ``per_slot``: the standbys wanted for each; ``rounds``: the newest complete round to
    promote to; ``changes``: told whenever the standbys change; ``clock``: the monotonic
    clock silences and reservations are measured on (the process's clock port's)."""

    def __init__(self, state: ClusterView, workers: int, per_slot: int, rounds: NewestRound,
                 changes: Changes, silent_after: float = float("inf"),
                 clock: Callable[[], float] | None = None) -> None:
        self._state = state
        self._clock = clock or ports.current().clock.monotonic
        self._silent_after = silent_after
        del workers  # (the slots are ``state.slots``: a rescale changes them)
        #: the slots a rescale under way heads for (0: none)
        self._expected = 0
        self._per_slot = per_slot
        self._rounds = rounds
        self._changes = changes
        self.by_slot: dict[int, list[Standby]] = {}
        # slot → (standby name, until, the standby promoted)
        self._reserved: dict[int, tuple[str, float, Standby]] = {}
        self._gone: dict[int, float] = {}  # slot → when its promoted standby's channel closed
        self.promotions = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def reserved_for(self, slot: int) -> str | None:
        """The standby a lost slot waits for, if its reservation has not run out."""
        r = self._reserved.get(slot)
        if r is None:
            self._recruit(slot)
            return None
        now = self._clock()
        if r[2].channel.closed or now - r[2].last_seen > self._silent_after:
            self._gone.setdefault(slot, now)  # (closed or silent: it may still come back)
        else:
            self._gone.pop(slot, None)  # (heard from again)
        if now > r[1] or now - self._gone.get(slot, now) > GONE_SECONDS:
            del self._reserved[slot]
            self._gone.pop(slot, None)
            if self.promote(slot):  # another standby of the slot gets its chance
                log.warning("slot %d: promoted standby %s did not register within %.0f s; "
                            "promoting another", slot, r[0], RESERVE_SECONDS)
                return self._reserved[slot][0]
            log.warning("slot %d: promoted standby %s did not register within %.0f s; "
                        "any worker may take it", slot, r[0], now - r[1] + RESERVE_SECONDS)
            self._recruit(slot)
            return None
        return r[0]

    def _recruit(self, slot: int) -> None:
        """Lost ``slot`` has no promotion coming: a standby of it that holds nothing is told
        to register again, as the slot's replacement (see the module docstring)."""
        m = self._state.member(slot)
        if m is None or m.alive:
            return
        for sb in list(self.by_slot.get(slot, [])):
            if sb.holds:
                continue  # (holds state: ``promote`` would have taken it)
            self.by_slot[slot].remove(sb)
            log.warning("slot %d is lost with no standby holding its state: standby %s (pid %d) "
                        "registers again to take it", slot, sb.name, sb.pid)
            with contextlib.suppress(ChannelClosed):
                sb.channel.send(wire.Stop(f"worker {slot} is lost: {REGISTER_AGAIN}"))
                sb.channel.close()
            self._changes.changed()
            return

    def reservation(self, slot: int) -> str:
        """The standby a lost slot was promoted to ("" if none), without running out the
        reservation (:meth:`reserved_for` may promote another)."""
        r = self._reserved.get(slot)
        return r[0] if r is not None else ""

    def slot_for(self, reg: wire.Register) -> int | None:
        """The slot ``reg`` should stand by for, or None: it takes a primary slot (or is
        refused)."""
        n = max(self._state.slots, self._expected)
        if reg.index >= 0:
            return None  # re-registering for a slot it holds or was promoted to
        if reg.replicas and 0 <= reg.standby_of < n:
            return reg.standby_of  # (its slot's replicas: that slot or none, see ``add``)
        # a lost slot with no standby coming: this worker replaces it, even one that asked
        # to stand by (a promoted standby restarted while its slot had no other would
        # otherwise wait for a primary that never comes)
        orphaned = self._state.joined and any(
            not m.alive and self.reserved_for(m.index) in (None, reg.name)
            for m in self._state.members)
        if reg.standby_of >= 0 and not orphaned:
            if reg.standby_of >= n:
                log.warning("worker %s asked to stand by for worker %d; there are %d: any role",
                            reg.name, reg.standby_of, n)
            else:
                return reg.standby_of
        if not self._state.joined or orphaned:
            return None
        want = self._per_slot
        counts = {i: len(self.by_slot.get(i, [])) for i in range(n)}
        slot = min(counts, key=lambda i: (counts[i], i))
        return slot if counts[slot] < want else None

    def add(self, reg: wire.Register, chan: channels.Channel, slot: int) -> Standby:
        """``reg`` stands by for ``slot`` from now on. One that holds the slot's replicas
        (it registers again after losing this coordinator) while the slot is lost with no
        promotion under way is promoted at once: the slot's own process, if it comes back,
        is refused and starts over as a standby."""
        sb = Standby(reg.name, reg.host, reg.pid, chan, slot, last_seen=self._clock(),
                     replicas=bool(reg.replicas))
        self.by_slot.setdefault(slot, []).append(sb)
        log.info("worker %s (pid %d) stands by for worker %d%s", reg.name, reg.pid, slot,
                 " with its replicas" if sb.replicas else "")
        self.feed(slot)
        m = self._state.member(slot)
        if sb.replicas and m is not None and not m.alive and slot not in self._reserved:
            self.promote(slot)
        self._changes.changed()
        return sb

    async def stand_by(self, reg: wire.Register, chan: channels.Channel, slot: int) -> None:
        """Serve a registrant standing by for ``slot`` until its channel closes."""
        sb = self.add(reg, chan, slot)
        try:
            while True:
                await chan.recv()  # heartbeats; its closed channel says it is gone
                sb.last_seen = self._clock()  # (it sent something: a heartbeat)
        except ChannelClosed:
            self.remove(sb)
            raise

    def remove(self, sb: Standby) -> None:
        lst = self.by_slot.get(sb.of, [])
        if sb in lst:
            lst.remove(sb)
            log.warning("standby %s (pid %d) of worker %d is gone", sb.name, sb.pid, sb.of)
            self._changes.changed()

    def feed(self, slot: int) -> None:
        """Tell the slot's standbys where its primary ships from and which partitions it
        owns (once it is ready; again when either changed)."""
        state = self._state
        m = state.member(slot)
        if m is None or not m.alive or not m.ready.is_set() or not m.repl_port:
            return
        addr = (m.host, m.repl_port)
        parts = tuple(owned(list(state.owners), slot))
        for sb in self.by_slot.get(slot, []):
            if (sb.following, sb.partitions) != (addr, parts):
                try:
                    sb.channel.send(wire.Follow(slot, len(state.members), state.partitions,
                                                list(parts), *addr))
                except ChannelClosed:
                    continue
                if sb.following is not None and sb.partitions != parts:
                    log.info("standby %s of worker %d: follows partitions %s (were %s)",
                             sb.name, slot, list(parts), list(sb.partitions))
                sb.following, sb.partitions = addr, parts

    # -- rescales ------------------------------------------------------------------------------
    def expect(self, slots: int | None) -> None:
        """A rescale heads for ``slots`` slots (None: none is under way). Registrants may
        stand by for the slots a scale-up adds; standbys of slots beyond both the membership
        and ``slots`` (a scale-up given up) are retired."""
        self._expected = slots or 0
        self._retire_beyond(max(self._state.slots, self._expected))

    def rescaled(self) -> None:
        """A rescale's new membership and map are in force: the standbys of the slots it
        retired are retired too, the others follow their primary's partitions now."""
        self._retire_beyond(max(self._state.slots, self._expected))
        for slot in range(self._state.slots):
            self.feed(slot)

    def _retire_beyond(self, slots: int) -> None:
        for slot in [i for i in self.by_slot if i >= slots]:
            for sb in self.by_slot.pop(slot):
                log.warning("standby %s (pid %d) of worker %d retires: the cluster has %d "
                            "workers", sb.name, sb.pid, slot, self._state.slots)
                with contextlib.suppress(ChannelClosed):
                    sb.channel.send(wire.Follow(slot, self._state.slots, self._state.partitions,
                                                [], "", 0))
                self._changes.changed()

    def promote(self, slot: int) -> bool:
        """Primary ``slot`` was lost: promote one of its standbys; False if it has none."""
        for sb in list(self.by_slot.get(slot, [])):
            if not sb.holds:
                continue  # never followed anything: it holds nothing
            if (silent := self._clock() - sb.last_seen) > self._silent_after:
                log.warning("standby %s of worker %d is silent for %.1f s: not promoted",
                            sb.name, slot, silent)
                continue
            self.by_slot[slot].remove(sb)
            self._reserved[slot] = (sb.name, self._clock() + RESERVE_SECONDS, sb)
            self.promotions += 1
            task = asyncio.get_running_loop().create_task(self._promote(sb, slot),
                                                          name=f"promote-{slot}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self._changes.changed()
            return True
        return False

    async def _promote(self, sb: Standby, slot: int) -> None:
        """Send the promotion once a round being published has landed: the recovery that
        follows rolls back to the round MinIO then has, which must be the one promoted to."""
        rnd = await self._rounds.newest_complete()
        try:
            sb.channel.send(wire.Promote(slot, rnd, owned(list(self._state.owners), slot)))
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
            self._gone.pop(slot, None)

    def all(self) -> list[Standby]:
        """Every standby, slot by slot."""
        return [sb for lst in self.by_slot.values() for sb in lst]
