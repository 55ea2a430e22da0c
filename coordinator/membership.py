"""Who is in the cluster: registrations, each worker's channel, liveness and losses.

A registrant takes a slot while the cluster forms, replaces a lost worker, stands by for a
slot (``coordinator.protocols.standby``) or joins a rescale; an ``sfaas scale`` channel goes
to the rescale. Every message a member sends is checked (``coordinator.inbound``), then
routed: heartbeats to the metrics, round reports to the snapshot rounds, rescale answers
to the rescale, and reports and recovery answers to the inbox the epoch protocols read. A
closed channel, a protocol violation or silence (the watchdog) is a loss: the round in
flight fails, the epochs are interrupted and a standby, if any, is promoted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from coordinator.inbound import check
from coordinator.inbox import Inbox
from coordinator.protocols.standby import Standby
from coordinator.state import ClusterState, Member
from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, wire

log = logging.getLogger("sfaas.coordinator")

__all__ = ["Joining", "Membership", "StandbyRoles", "STARTUP_TIMEOUT"]

#: Seconds a registered worker may take to get ready (open stores, connect peers and Kafka).
STARTUP_TIMEOUT = 30.0


class StandbyRoles(Protocol):
    """The standbys, as registrations and losses change them."""

    def slot_for(self, reg: wire.Register) -> int | None: ...
    def add(self, reg: wire.Register, chan: channels.Channel, slot: int) -> Standby: ...
    def remove(self, sb: Standby) -> None: ...
    def reserved_for(self, slot: int) -> str | None: ...
    def registered(self, slot: int, name: str) -> None: ...
    def feed(self, slot: int) -> None: ...
    def promote(self, slot: int) -> bool: ...


class Joining(Protocol):
    """A rescale, as registrations and losses reach it."""

    async def request(self, msg: wire.Scale, chan: channels.Channel) -> None: ...
    def wants_joiner(self) -> bool: ...
    def add_joiner(self, m: Member) -> None: ...
    def is_joiner(self, m: Member) -> bool: ...
    def lost(self, m: Member) -> None: ...
    def abandon(self, why: str) -> None: ...
    def on_message(self, msg: wire.Message) -> None: ...
    def joining(self) -> list[Member]: ...


class Membership:
    """See the module docstring. ``topics``: the app's ingress and egress topics and the
    workers' consumer group (each ``Assign`` names them)."""

    def __init__(self, state: ClusterState, inbox: Inbox, standbys: StandbyRoles,
                 rescale: Joining, *, heartbeat_timeout: float, topics: tuple[str, str, str],
                 heartbeat: Callable[[Member, wire.Heartbeat], None],
                 snapshotted: Callable[[wire.Snapshotted], None],
                 wake: Callable[[], None], abort_round: Callable[[str], None],
                 changed: Callable[[], None],
                 diverged: Callable[[wire.Diverged], None] = lambda msg: None,
                 where: Callable[[channels.Channel, list[wire.Message]], Awaitable[None]]
                 | None = None, kafka_silence_limit: float = 0.0) -> None:
        self._state = state
        self._inbox = inbox
        self._standbys = standbys
        self._rescale = rescale
        self._timeout = heartbeat_timeout
        self._topics = topics
        self._heartbeat = heartbeat
        self._snapshotted = snapshotted
        self._wake = wake
        self._abort_round = abort_round
        self._changed = changed
        self._diverged = diverged
        self._where = where
        #: a worker hearing nothing from Kafka this long while another does is replaced
        #: (0: never; ``sfaas.runtime.kafka.silence_limit``)
        self._kafka_limit = kafka_silence_limit
        self._watchdog: asyncio.Task[None] | None = None

    # -- the workers' channels -----------------------------------------------------------------
    async def on_connection(self, chan: channels.Channel) -> None:
        """Serve one channel from a worker (or ``sfaas scale``) until it closes."""
        state = self._state
        msgs = await chan.recv()
        reg = msgs[0] if msgs else None
        if isinstance(reg, wire.Scale):
            await self._rescale.request(reg, chan)
            return
        if isinstance(reg, wire.Where) and self._where is not None:  # a client's direct reads
            await self._where(chan, msgs)
            return
        if not isinstance(reg, wire.Register):
            log.warning("peer %s did not register; dropping", chan.peer)
            return
        joins = self._joins(reg)
        slot = None if joins else self._standbys.slot_for(reg)
        if slot is not None:
            await self._stand_by(reg, chan, slot)
            return
        # a lost slot waiting for its promoted standby is not for anyone else
        dead = [m for m in state.members
                if not m.alive and self._standbys.reserved_for(m.index) in (None, reg.name)]
        if joins and not dead:
            member = Member.of(-1, reg, chan)
            member.generation = state.new_generation()
            self._rescale.add_joiner(member)
        elif not state.joined:
            member = Member.of(state.free_slot(reg.index), reg, chan)
            state.add_member(member)
            state.reach_epoch(reg.epoch)  # (a worker rejoining a restarted coordinator)
            log.info("worker %s (pid %d) registered as %d at %s:%d",
                     reg.name, reg.pid, member.index, reg.host, reg.port)
        elif dead:
            member = next((m for m in dead if m.index == reg.index), dead[0])
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
            log.warning("refusing worker %s: cluster already has %d workers",
                        reg.name, len(state.members))
            chan.send(wire.Stop(f"cluster already has {len(state.members)} workers"))
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
                self._state.heard(member, beat.committed if beat is not None else None)
                if isinstance(msg, wire.Wakeup):
                    self._wake()
                elif beat is not None:
                    # answered at once: the worker's lease runs from the beat's send time
                    # (worker.fence); a lost member's channel is closed, it gets none
                    chan.send(wire.Alive(member.index, member.generation, beat.sent))
                    member.kafka_silent, member.kafka_heard = beat.kafka_silent, time.monotonic()
                    self._heartbeat(member, beat)
                elif isinstance(msg, wire.Snapshotted):
                    self._snapshotted(msg)
                elif isinstance(msg, wire.Diverged):
                    self._diverged(msg)
                elif isinstance(msg, (wire.Shipped, wire.Following, wire.Released)):
                    self._rescale.on_message(msg)
                elif isinstance(msg, wire.Ready):
                    self._state.mark_ready(member)
                    self._standbys.feed(member.index)
                    self._changed()
                else:
                    await self._inbox.put(msg)  # waits while the inbox is full

    async def _stand_by(self, reg: wire.Register, chan: channels.Channel, slot: int) -> None:
        sb = self._standbys.add(reg, chan, slot)
        try:
            while True:
                await chan.recv()  # heartbeats; its closed channel says it is gone
                sb.last_seen = time.monotonic()
        except ChannelClosed:
            self._standbys.remove(sb)
            raise

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

    async def watch(self) -> None:
        """Feed the standbys their primaries, and lose members that fall silent."""
        for m in self._state.members:
            self._standbys.feed(m.index)
        self._watchdog = asyncio.get_running_loop().create_task(self._watch(), name="watchdog")

    async def unwatch(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)

    # -- sending -------------------------------------------------------------------------------
    def broadcast(self, msg: wire.Message) -> None:
        for m in self._state.members:
            try:
                m.channel.send(msg)
            except ChannelClosed:
                self.lose(m, "its channel closed")

    # -- losses --------------------------------------------------------------------------------
    def lose(self, m: Member, why: str) -> None:
        """Worker ``m`` is gone: stop the epochs and recover
        (``coordinator.protocols.recovery``)."""
        if self._rescale.is_joiner(m):
            self._rescale.lost(m)
            return
        if not m.alive:
            return
        self._rescale.abandon(f"worker {m.index} lost")
        self._state.mark_lost(m)
        log.warning("lost worker %d (%s, pid %d): %s", m.index, m.name, m.pid, why)
        self._abort_round(f"worker {m.index} lost")
        self._inbox.interrupt()
        if self._state.joined:
            self._standbys.promote(m.index)
        self._changed()

    def lose_slot(self, index: int, why: str) -> None:
        for m in self._state.members:
            if m.index == index:
                self.lose(m, why)

    async def _watch(self) -> None:
        timeout = self._timeout
        while True:
            await asyncio.sleep(min(0.25, timeout / 4))
            now = time.monotonic()
            for m in self._state.members:
                if not m.alive:
                    # a promotion whose standby never registers runs out
                    self._standbys.reserved_for(m.index)
                    continue
                if m.ready.is_set() and now - m.last_seen > timeout:
                    self.lose(m, f"silent for {now - m.last_seen:.1f} s "
                                 f"(heartbeat_timeout {timeout} s)")
                elif not m.ready.is_set() and now - m.last_seen > STARTUP_TIMEOUT:
                    self.lose(m, f"not ready {STARTUP_TIMEOUT:.0f} s after it registered")
                elif m.ready.is_set() and (why := self._cut_from_kafka(m, now)):
                    self.lose(m, why)

    def _cut_from_kafka(self, m: Member, now: float) -> str:
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
