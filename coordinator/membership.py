"""Who is in the cluster: registrations, each worker's channel and losses.

A registrant (``coordinator.listener`` hands it over) takes a slot while the cluster forms,
replaces a lost worker, stands by for a slot (``coordinator.protocols.standby``) or joins a
rescale. Every message a member sends is checked (``coordinator.inbound``), then routed:
heartbeats, divergences and round reports to the bulletin (``coordinator.bulletin``: the
metrics, the snapshot rounds), rescale answers to the rescale, and reports and recovery
answers to the inbox the epoch protocols read. A closed channel, a protocol violation or
silence (``coordinator.watchdog``) is a loss: the round in flight fails, the epochs are
interrupted and a standby, if any, is promoted.

As a service it starts once every slot is taken and ready (it assigns them), and its stop
tells every member and joiner to stop.
"""

from __future__ import annotations

import asyncio
import logging

from coordinator.inbound import check
from coordinator.inbox import Inbox
from coordinator.needs import Joining, MemberEvents, StandbyRoles
from coordinator.state import ClusterState, Member
from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, wire
from sfaas.runtime.lifecycle import Service

log = logging.getLogger("sfaas.coordinator")

__all__ = ["Membership"]


class Membership(Service):
    """See the module docstring. ``topics``: the app's ingress and egress topics and the
    workers' consumer group (each ``Assign`` names them)."""

    part = "workers"

    def __init__(self, state: ClusterState, inbox: Inbox, standbys: StandbyRoles,
                 rescale: Joining, events: MemberEvents, *, topics: tuple[str, str, str]) -> None:
        self._state = state
        self._inbox = inbox
        self._standbys = standbys
        self._rescale = rescale
        self._events = events
        self._topics = topics

    async def on_start(self) -> None:
        await self.gather()

    async def on_stop(self) -> None:
        await self.dismiss()

    # -- the workers' channels -----------------------------------------------------------------
    async def register(self, reg: wire.Register, chan: channels.Channel) -> None:
        """Serve the channel of a worker that sent ``reg`` until it closes."""
        state = self._state
        self._supersede(reg)
        joins = self._joins(reg)
        slot = None if joins else self._standbys.slot_for(reg)
        if slot is not None:
            await self._standbys.stand_by(reg, chan, slot)
            return
        # a lost slot waiting for its promoted standby is not for anyone else
        dead = [m for m in state.members
                if not m.alive and self._standbys.reserved_for(m.index) in (None, reg.name)]
        if joins and not dead:
            member = state.joiner(reg, chan)
            self._rescale.add_joiner(member)
        elif not state.joined:
            member = Member.of(state.free_slot(reg.index), reg, chan)
            state.add_member(member)
            state.reach_epoch(reg.epoch)  # (a worker rejoining a restarted coordinator)
            log.info("worker %s (pid %d) registered as %d at %s:%d",
                     reg.name, reg.pid, member.index, reg.host, reg.port)
        elif dead and (lost := self._lost_slot_for(reg, dead)) is not None:
            member = lost
            state.replace(member, reg, chan)
            self._standbys.registered(member.index, reg.name)
            log.warning("worker %s (pid %d) replaces lost worker %d at %s:%d",
                        reg.name, reg.pid, member.index, reg.host, reg.port)
            # a replacement connects to its peers: only once every slot has a live worker
            # (an Assign naming a dead peer's old address would send it there)
            if state.all_alive():
                for m in state.members:
                    if not m.ready.is_set():
                        self.assign(m)
        else:
            why = (f"cluster already has {len(state.members)} workers" if not dead else
                   f"its slot {reg.index} is not free, and it rejoins no other")
            log.warning("refusing worker %s: %s", reg.name, why)
            chan.send(wire.Stop(why))
            await chan.drain()
            return
        try:
            await self._serve(member, chan)
        except (ChannelClosed, wire.ProtocolError) as exc:
            if member.channel is chan:
                self.lose(member, "its channel closed" if isinstance(exc, ChannelClosed)
                          else f"protocol error: {exc}")
            raise

    async def _serve(self, member: Member, chan: channels.Channel) -> None:
        while True:
            for msg in await chan.recv():
                check(msg, member.index, len(self._state.members))
                beat = msg if isinstance(msg, wire.Heartbeat) else None
                self._state.heard(member, beat)
                if isinstance(msg, wire.Wakeup):
                    self._inbox.wake()
                elif beat is not None:
                    # answered at once: the worker's lease runs from the beat's send time
                    # (worker.fence); a lost member's channel is closed, it gets none
                    chan.send(wire.Alive(member.index, member.generation, beat.sent))
                    self._events.heartbeat(member, beat)
                elif isinstance(msg, wire.Snapshotted):
                    self._events.snapshotted(msg)
                elif isinstance(msg, wire.Diverged):
                    self._events.diverged(msg)
                elif isinstance(msg, (wire.Shipped, wire.Following, wire.Released)):
                    self._rescale.on_message(msg)
                elif isinstance(msg, wire.PeerBroken):
                    self.peer_broken(member, msg)
                elif isinstance(msg, wire.Ready):
                    self._state.mark_ready(member)
                    self._standbys.feed(member.index)
                    self._events.changed()
                else:
                    await self._inbox.put(msg)  # waits while the inbox is full

    def _supersede(self, reg: wire.Register) -> None:
        """A worker registering again in the slot it holds here (the same process: name and
        pid; it lost this coordinator, we did not lose it yet — a one-way cut, a FIN dropped
        by a cut): its old channel is stale. Lose it — its standby not promoted, the process
        is here — so the registration takes the slot back. Before, the slot stayed taken by
        the stale channel: the process was refused or took another lost slot, and its own
        slot was lost when the old channel closed (the nemesis' seed 4: 5 s of slots changing
        hands after a coordinator cut)."""
        if reg.index < 0 or reg.standby_of >= 0:
            return
        for m in self._state.members:
            if m.alive and m.index == reg.index and (m.name, m.pid) == (reg.name, reg.pid):
                self.lose(m, "it registered again (its old channel is stale)", promote=False)

    @staticmethod
    def _lost_slot_for(reg: wire.Register, dead: list[Member]) -> Member | None:
        """The lost slot ``reg`` takes: the one it asks for if free, else the first free —
        but none for a worker rejoining with its state (``reg.epoch`` > 0): it leaves on any
        slot but its own (``worker.membership.Membership.rejoin``), and the slot it took is
        lost to its own worker meanwhile. After the nemesis' coordinator cut the returning
        workers and the standbys took each other's slots, each left and came back: 15 s."""
        own = next((m for m in dead if m.index == reg.index), None)
        if own is not None:
            return own
        return None if reg.epoch > 0 and reg.index >= 0 else dead[0]

    def _joins(self, reg: wire.Register) -> bool:
        """Does ``reg`` join for a scale-up (instead of taking or standing by for a slot)?"""
        return (self._state.joined and reg.index < 0 and reg.standby_of < 0
                and self._rescale.wants_joiner())

    def assign(self, m: Member) -> None:
        """Tell ``m`` its slot, the membership, the topics and the map."""
        state = self._state
        ingress, egress, group = self._topics
        m.channel.send(wire.Assign(m.index, len(state.members), state.peers(), state.partitions,
                                   ingress, egress, group, list(state.owners), m.generation))

    async def gather(self) -> None:
        """Once every slot is taken, assign them; returns when all are ready."""
        state = self._state
        await state.wait_joined()
        for m in state.members:
            self.assign(m)
        await state.wait_ready()
        log.info("all %d workers ready; running epochs", len(state.members))

    async def dismiss(self) -> None:
        """Tell every member and joiner to stop (the coordinator stops)."""
        for m in self._state.members + self._rescale.joining():
            try:
                m.channel.send(wire.Stop("coordinator stopping"))
                await asyncio.wait_for(m.channel.drain(), 1.0)
            except Exception as exc:
                log.debug("stopping worker %d: %s", m.index, exc)
            m.channel.close()

    # -- sending -------------------------------------------------------------------------------
    def broadcast(self, msg: wire.Message) -> None:
        for m in self._state.members:
            try:
                m.channel.send(msg)
            except ChannelClosed:
                self.lose(m, "its channel closed")

    # -- losses --------------------------------------------------------------------------------
    def lose(self, m: Member, why: str, *, promote: bool = True) -> None:
        """Worker ``m`` is gone (its channel closed, it broke the protocol or the watchdog
        lost it): stop the epochs and recover (``coordinator.protocols.recovery``);
        ``promote``: its standby takes the slot (not when its process registers again)."""
        if self._rescale.is_joiner(m):
            self._rescale.lost(m)
            return
        if not m.alive:
            return
        self._rescale.abandon(f"worker {m.index} lost")
        self._state.mark_lost(m)
        log.warning("lost worker %d (%s, pid %d): %s", m.index, m.name, m.pid, why)
        self._events.member_lost(f"worker {m.index} lost")
        self._inbox.interrupt()
        if self._state.joined and promote:
            self._standbys.promote(m.index)
        self._events.changed()

    def peer_broken(self, reporter: Member, msg: wire.PeerBroken) -> None:
        """A member's channel from a peer closed (``wire.PeerBroken``): what it carried may
        be lost and an epoch may wait for it for ever, every worker alive — recover, as for
        a loss, but losing nobody (the recovery's rollback connects the peers again).
        Stale, and ignored: a report of an earlier recovery's epochs, of a peer that left
        or was replaced (a loss, handled as one), from a worker no longer a member (a
        rescale retired it), or during a rescale (its switch closes channels on purpose;
        a switch that hangs is recovered by its own timeout)."""
        state = self._state
        peer = next((m for m in state.members if m.index == msg.peer), None)
        stale = ("an earlier recovery's" if msg.recovery < state.recoveries else
                 "a peer gone or replaced" if peer is None or not peer.alive
                 or peer.generation != msg.generation else
                 "from a worker no longer a member"
                 if not any(m is reporter for m in state.members) else
                 "a rescale is under way" if self._rescale.under_way() else "")
        if stale:
            log.info("worker %d's channel from worker %d closed (stale: %s)", msg.index,
                     msg.peer, stale)
            return
        why = f"worker {msg.index}'s channel from worker {msg.peer} closed"
        log.warning("%s: what it carried may be lost; recovering", why)
        self._events.member_lost(why)  # (the round in flight cannot complete either)
        self._inbox.interrupt()

    def lose_slot(self, index: int, why: str) -> None:
        for m in self._state.members:
            if m.index == index:
                self.lose(m, why)
