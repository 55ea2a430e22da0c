"""The coordinator process: membership, partition assignment, heartbeats, the epoch barrier.

It creates the app's ingress/egress topics, waits for ``workers`` workers to register,
assigns each an index (ingress partition ``p`` and the keys hashing to it belong to worker
``p % n``), and then drives epochs eagerly: a new epoch begins as soon as the previous one
committed if any worker reported waiting work, otherwise when a worker wakes it up.
Each epoch has one barrier: workers report conflicts, user aborts and call counters
(``wire.Report``); when the counters show no call in flight, the union is broadcast in
``Commit``. Every ``snapshot_interval`` seconds a Commit carries a snapshot round's
marker (``coordinator.protocols.rounds``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from coordinator.inbound import check
from coordinator.metrics import CoordinatorMetrics
from coordinator.protocols.lease import Tick, leased_epochs
from coordinator.protocols.recovery import recover
from coordinator.protocols.rescale import Rescaler
from coordinator.protocols.rounds import RoundKeeper
from coordinator.protocols.standby import Standbys
from sfaas.errors import ChannelClosed, ClusterError
from sfaas.runtime import channels, wire
from sfaas.runtime.kafka import consumer_group, ensure_topics
from sfaas.runtime.partitioning import default_owners
from sfaas.runtime.protocols.rounds import Rounds
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import rounds_remote, store_remote
from sfaas.runtime.txn.epochs import execution_finished
from sfaas.runtime.txn.loop import idle_after, merge_votes
from sfaas.runtime.wire import Message

log = logging.getLogger("sfaas.coordinator")

__all__ = ["Coordinator", "run_coordinator"]

#: Seconds a registered worker may take to get ready (open stores, connect peers and Kafka).
STARTUP_TIMEOUT = 30.0
#: Messages (reports, recovery answers) waiting for the epoch barrier or a recovery. When
#: it is full, a worker's channel is not read until the barrier takes one; a loss marker
#: displaces the oldest waiting message (what it belonged to is abandoned by the loss).
INBOX_LIMIT = 4096


class Interrupted(Exception):
    """A worker was lost while the coordinator waited for the workers."""


@dataclass
class _Member:
    index: int
    name: str
    host: str
    port: int
    pid: int
    channel: channels.Channel
    last_seen: float = field(default_factory=time.monotonic)
    committed: int = 0
    alive: bool = True
    #: set once the worker reported Ready (after its Assign)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: where its standbys follow its stores (0: it ships nothing)
    repl_port: int = 0


class Lost(Message):
    """Put into the inbox when a worker is lost: interrupts a barrier or a recovery."""


class Coordinator:
    """See module docstring."""

    def __init__(self, settings: Settings, app_name: str) -> None:
        self.settings = settings
        self.app_name = app_name
        self.secret = settings.shared_secret()
        self.members: list[_Member] = []
        self._inbox: asyncio.Queue[wire.Message] = asyncio.Queue(maxsize=INBOX_LIMIT)
        self._wakeup = asyncio.Event()
        self._all_joined = asyncio.Event()
        self._loss = asyncio.Event()
        self._changed = asyncio.Event()  # membership changed (a loss, a replacement ready)
        self.recoveries = 0
        #: phases and durations of the last recovery (for logs, ``sfaas ps`` and benchmarks)
        self.last_recovery: dict[str, Any] = {}
        self.epoch = 0
        #: the last epoch the workers were leased (``coordinator.protocols.lease``)
        self.lease_upto = 0
        self._phases = [0.0, 0.0, 0.0, 0]
        self.stats: dict[str, Any] = {"epochs": 0, "txns": 0, "conflicts": 0}
        self.standbys = Standbys(self)
        self.rescale = Rescaler(self)
        #: the partition map: ``owners[p]`` is the index of the worker owning partition ``p``
        self.owners: list[int] = []
        self._bound: tuple[str, int] | None = None
        self.metrics = CoordinatorMetrics(self)

    async def run(self, ready: asyncio.Future[tuple[str, int]] | None = None) -> None:
        """Serve until stopped (cancelled); recover from every lost worker."""
        s = self.settings
        ingress, egress = s.topics(self.app_name)
        self._assign_args = (ingress, egress, consumer_group(s, self.app_name))
        topics = {ingress: s.partitions, egress: s.partitions}
        if s.snapshot_interval > 0:
            topics[s.epoch_log_topic(self.app_name)] = 1
        deadline = time.monotonic() + 120.0
        while True:  # a broker that is restarting must not make the supervisor give up on us
            try:
                counts = await ensure_topics(s.kafka, topics)
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("Kafka at %s unreachable (%s); retrying", s.kafka, exc)
                await asyncio.sleep(1.0)
        self.partitions = counts[ingress]
        if self.partitions < s.workers:
            raise ClusterError(f"topic {ingress} has {self.partitions} partitions < {s.workers} workers")
        self.n_workers = s.workers
        self.owners = default_owners(self.partitions, s.workers)
        resumed = s.snapshot_interval > 0 and await self._epoch_log_used()
        if resumed:
            await self._resume_map()
        app = self.app_name
        self.rounds = RoundKeeper(
            s.snapshot_interval, s.snapshot_retain, self.n_workers, self.partitions,
            lambda: rounds_remote(s, app), lambda op, p: store_remote(s, app, op, p),
        )
        self.rounds.owners = list(self.owners)
        self.rounds.warm_up()
        host, port = s.coordinator_address()
        server = await channels.serve(host, port, self.secret, self._on_worker)
        bound = server.sockets[0].getsockname()
        await self.metrics.start(host)
        log.info("coordinator of app %s listening on %s:%d, waiting for %d workers",
                 self.app_name, bound[0], bound[1], self.n_workers)
        if ready is not None and not ready.done():
            ready.set_result((bound[0], bound[1]))
        try:
            await self._all_joined.wait()
            for m in self.members:
                self._assign(m)
            for m in self.members:
                await m.ready.wait()
            log.info("all %d workers ready; running epochs", len(self.members))
            self._bound = (bound[0], bound[1])
            self.write_ready()
            for m in self.members:
                self.standbys.feed(m.index)
            watchdog = asyncio.create_task(self._watchdog())
            idle = True
            try:
                if resumed:
                    # a restarted coordinator: every worker rolls back to the newest round
                    # and the epoch log after it is replayed (with an empty log nothing ever
                    # ran here, so a new cluster starts at once, even while MinIO is down)
                    await recover(self)
                while True:
                    loop_task = asyncio.create_task(self._epochs(idle))
                    loss = asyncio.create_task(self._loss.wait())
                    await asyncio.wait([loop_task, loss], return_when=asyncio.FIRST_COMPLETED)
                    loop_task.cancel()
                    loss.cancel()
                    await asyncio.gather(loop_task, loss, return_exceptions=True)
                    if not self._loss.is_set():
                        loop_task.result()  # the epoch loop failed: a bug, raise it
                    if s.snapshot_interval <= 0:
                        raise ClusterError("lost a worker and snapshot rounds are off (snapshot_interval=0): "
                                           "recovery needs them; stopping")
                    await recover(self)
                    idle = False  # recovered work may be waiting: begin at once
            finally:
                watchdog.cancel()
                await self.rounds.close()
        finally:
            for m in self.members + self.rescale.joiners:
                try:
                    m.channel.send(wire.Stop("coordinator stopping"))
                    await asyncio.wait_for(m.channel.drain(), 1.0)
                except Exception as exc:
                    log.debug("stopping worker %d: %s", m.index, exc)
                m.channel.close()
            server.close()
            await self.metrics.close()

    def write_ready(self) -> None:
        """(Re)write ``ready_file``: the membership and the standbys (``sfaas ps`` reads it)."""
        s = self.settings
        if not s.ready_file or self._bound is None:
            return
        members = [{"index": m.index, "name": m.name, "pid": m.pid, "address": f"{m.host}:{m.port}",
                    "alive": m.alive} for m in self.members]
        doc = {"coordinator": f"{self._bound[0]}:{self._bound[1]}", "workers": members,
               "standbys": self.standbys.describe(), "promotions": self.standbys.promotions}
        tmp = s.ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, s.ready_file)

    async def _stand_by(self, reg: wire.Register, chan: channels.Channel, slot: int) -> None:
        sb = self.standbys.add(reg, chan, slot)
        try:
            while True:
                await chan.recv()  # a standby only listens; its closed channel says it is gone
        except ChannelClosed:
            self.standbys.remove(sb)
            raise

    async def _on_worker(self, chan: channels.Channel) -> None:
        msgs = await chan.recv()
        reg = msgs[0] if msgs else None
        if isinstance(reg, wire.Scale):
            await self.rescale.request(reg, chan)
            return
        if not isinstance(reg, wire.Register):
            log.warning("peer %s did not register; dropping", chan.peer)
            return
        slot = None if self._joins(reg) else self.standbys.slot_for(reg)
        if slot is not None:
            await self._stand_by(reg, chan, slot)
            return
        # a lost slot waiting for its promoted standby is not for anyone else
        dead = [m for m in self.members
                if not m.alive and self.standbys.reserved_for(m.index) in (None, reg.name)]
        if self._joins(reg) and not dead:
            member = _Member(-1, reg.name, reg.host, reg.port, reg.pid, chan, repl_port=reg.repl_port)
            self.rescale.add_joiner(member)
        elif not self._all_joined.is_set():
            # a worker that held a slot before (this coordinator restarted) gets it back
            free = sorted(set(range(self.n_workers)) - {m.index for m in self.members})
            index = reg.index if reg.index in free else free[0]
            member = _Member(index, reg.name, reg.host, reg.port, reg.pid, chan, repl_port=reg.repl_port)
            self.members.append(member)
            log.info("worker %s (pid %d) registered as %d at %s:%d",
                     reg.name, reg.pid, member.index, reg.host, reg.port)
            if len(self.members) == self.n_workers:
                self.members.sort(key=lambda m: m.index)
                self._all_joined.set()
        elif dead:
            member = next((m for m in dead if m.index == reg.index), dead[0])
            member.name, member.host, member.port, member.pid, member.channel = (
                reg.name, reg.host, reg.port, reg.pid, chan)
            member.alive, member.last_seen, member.repl_port = True, time.monotonic(), reg.repl_port
            self.standbys.registered(member.index, reg.name)
            log.warning("worker %s (pid %d) replaces lost worker %d at %s:%d",
                        reg.name, reg.pid, member.index, reg.host, reg.port)
            # a replacement connects to its peers: only once every slot has a live worker
            # (an Assign naming a dead peer's old address would send it there)
            if all(m.alive for m in self.members):
                for m in self.members:
                    if not m.ready.is_set():
                        self._assign(m)
        else:
            log.warning("refusing worker %s: cluster already has %d workers", reg.name, len(self.members))
            chan.send(wire.Stop(f"cluster already has {len(self.members)} workers"))
            await chan.drain()
            return
        try:
            while True:
                for msg in await chan.recv():
                    check(msg, member.index, len(self.members))
                    member.last_seen = time.monotonic()
                    if isinstance(msg, wire.Wakeup):
                        self._wakeup.set()
                    elif isinstance(msg, wire.Heartbeat):
                        member.committed = msg.committed
                        self.metrics.heartbeat(member, msg)
                    elif isinstance(msg, wire.Snapshotted):
                        self.rounds.on_report(msg)
                    elif isinstance(msg, (wire.Shipped, wire.Following, wire.Released)):
                        self.rescale.on_message(msg)
                    elif isinstance(msg, wire.Ready):
                        member.ready.set()
                        self._changed.set()
                        self.standbys.feed(member.index)
                        self.write_ready()
                    else:
                        await self._inbox.put(msg)  # waits while the inbox is full
        except (ChannelClosed, wire.ProtocolError) as exc:
            if member.channel is chan:
                self.lose(member, "its channel closed" if isinstance(exc, ChannelClosed) else f"protocol error: {exc}")
            raise

    async def _resume_map(self) -> None:
        """A restarted coordinator: the membership size and partition map of the newest
        round (a rescale may have changed them since the cluster started)."""
        deadline = time.monotonic() + 120.0
        while True:
            try:
                latest = await asyncio.to_thread(Rounds(rounds_remote(self.settings, self.app_name)).latest)
                break
            except Exception as exc:  # MinIO down: the recovery that follows needs it anyway
                if time.monotonic() > deadline:
                    raise
                log.warning("cannot read the snapshot rounds (%s); retrying", exc)
                await asyncio.sleep(1.0)
        if latest is None or not latest.owners:
            return
        if len(latest.owners) != self.partitions:
            log.warning("round %d's partition map has %d partitions, the topic %d: using round robin",
                        latest.round, len(latest.owners), self.partitions)
            return
        self.n_workers, self.owners = latest.workers, list(latest.owners)
        if self.n_workers != self.settings.workers:
            log.warning("round %d was taken with %d workers (a rescale); waiting for %d, not %d (settings)",
                        latest.round, self.n_workers, self.n_workers, self.settings.workers)

    async def _epoch_log_used(self) -> bool:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        tp = TopicPartition(self.settings.epoch_log_topic(self.app_name), 0)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka, enable_auto_commit=False)
        await consumer.start()
        try:
            return bool((await consumer.end_offsets([tp]))[tp])
        finally:
            await consumer.stop()

    def _joins(self, reg: wire.Register) -> bool:
        """Does ``reg`` join for a scale-up (instead of taking or standing by for a slot)?"""
        return self._all_joined.is_set() and reg.index < 0 and reg.standby_of < 0 and self.rescale.wants_joiner()

    def _assign(self, m: _Member) -> None:
        peers = [[x.host, x.port] for x in self.members]
        m.channel.send(wire.Assign(m.index, len(self.members), peers, self.partitions, *self._assign_args,
                                   list(self.owners)))

    def wake(self) -> None:
        """Begin an epoch soon even if no worker has work (an idle cluster must reach the
        epoch boundary a rescale switches at)."""
        self._wakeup.set()
        if self.settings.epoch_lease and not self._inbox.full():
            self._inbox.put_nowait(Tick())

    def force_recovery(self, why: str) -> None:
        """Stop the epochs and recover although no worker was lost."""
        log.warning("recovering: %s", why)
        self.rounds.abort(why)
        self._interrupt()

    def _interrupt(self) -> None:
        """Interrupt the barrier or recovery in progress, even with a full inbox."""
        if self._inbox.full():
            self._inbox.get_nowait()
        self._inbox.put_nowait(Lost())
        self._loss.set()

    def lose(self, m: _Member, why: str) -> None:
        """Worker ``m`` is gone: stop the epochs and recover (see ``coordinator.protocols.recovery``)."""
        if m in self.rescale.joiners:
            self.rescale.lost(m)
            return
        if not m.alive:
            return
        self.rescale.abandon(f"worker {m.index} lost")
        m.alive = False
        m.ready.clear()
        m.channel.close()
        log.warning("lost worker %d (%s, pid %d): %s", m.index, m.name, m.pid, why)
        self.rounds.abort(f"worker {m.index} lost")
        self._interrupt()
        self._changed.set()
        if self._all_joined.is_set():
            self.standbys.promote(m.index)
        self.write_ready()

    async def _barrier(self, epoch: int) -> list[wire.Report]:
        """Wait until epoch ``epoch`` finished executing everywhere (see ``wire.Report``);
        raises :class:`Interrupted` when a worker is lost meanwhile."""
        n = len(self.members)
        latest: dict[int, wire.Report] = {}
        while True:
            msg = await self._inbox.get()
            if isinstance(msg, Lost):
                raise Interrupted(f"a worker was lost during epoch {epoch}")
            if not isinstance(msg, wire.Report):
                log.warning("ignoring %s during epoch %d", type(msg).__name__, epoch)
                continue
            if msg.epoch < epoch:
                log.warning("ignoring a late report of epoch %d from worker %d", msg.epoch, msg.index)
                continue
            if msg.epoch != epoch:  # a worker that runs ahead of the barrier broke the protocol
                for m in self.members:
                    if m.index == msg.index:
                        self.lose(m, f"protocol error: it reported epoch {msg.epoch} during epoch {epoch}")
                continue
            latest[msg.index] = msg
            if execution_finished(n, {i: (r.sent, r.served) for i, r in latest.items()}):
                # in worker order: merge_votes keeps the first abort reported per tid, and a
                # replay (and a leased worker) merges in this order too
                return [latest[i] for i in sorted(latest)]

    def _broadcast(self, msg: wire.Message) -> None:
        for m in self.members:
            try:
                m.channel.send(msg)
            except ChannelClosed:
                self.lose(m, "its channel closed")

    async def _epochs(self, idle: bool = True) -> None:
        if self.settings.epoch_lease > 0:
            await leased_epochs(self)  # the workers begin and commit; see coordinator.protocols.lease
            return
        while True:
            t_idle = time.perf_counter()
            if idle:
                try:
                    await asyncio.wait_for(self._wakeup.wait(), 1.0)
                except TimeoutError:
                    pass
            self._wakeup.clear()
            self.epoch += 1
            epoch = self.epoch
            self._broadcast(wire.Begin(epoch, time.time(), None))
            t_begin = time.perf_counter()
            reports = await self._barrier(epoch)
            t_exec = time.perf_counter()
            ph = self._phases
            ph[0] += t_begin - t_idle
            ph[1] += t_exec - t_begin
            ph[3] += 1
            self.metrics.epoch(t_begin - t_idle, t_exec - t_begin)
            if ph[3] % 500 == 0:
                log.info("epochs %d; mean of the last 500 (ms): waiting for work %.2f, "
                         "execute+barrier %.2f", ph[3], ph[0] / 0.5, ph[1] / 0.5)
                ph[:] = [0.0, 0.0, 0.0, ph[3]]
            conflicts, aborts = merge_votes((r.conflicts, r.aborts) for r in reports)
            idle = idle_after((r.pending for r in reports), conflicts) and not self._wakeup.is_set()
            self.stats["epochs"] += 1
            self.stats["txns"] += sum(r.roots for r in reports)
            switch = self.rescale.due()
            marker = self.rounds.marker(epoch, self.stats["txns"], force=switch)
            if switch and marker is not None:
                self.rescale.arm(marker)
            self._broadcast(wire.Commit(epoch, [[t, b] for t, b in conflicts.items()],
                                        [[t, e, r] for t, (e, r) in aborts.items()], idle, marker))
            self.stats["conflicts"] += len(conflicts)
            if switch and marker is not None:
                await self.rescale.switch(marker)  # no epoch begins until the new membership runs
                idle = False

    async def _watchdog(self) -> None:
        timeout = self.settings.heartbeat_timeout
        while True:
            await asyncio.sleep(min(0.25, timeout / 4))
            now = time.monotonic()
            for m in self.members:
                if not m.alive:
                    self.standbys.reserved_for(m.index)  # a promotion that never registers runs out
                    continue
                if m.ready.is_set() and now - m.last_seen > timeout:
                    self.lose(m, f"silent for {now - m.last_seen:.1f} s (heartbeat_timeout {timeout} s)")
                elif not m.ready.is_set() and now - m.last_seen > STARTUP_TIMEOUT:
                    self.lose(m, f"not ready {STARTUP_TIMEOUT:.0f} s after it registered")


async def run_coordinator(settings: Settings, app_name: str) -> None:
    """Run a coordinator for ``app_name`` until cancelled or a worker is lost."""
    await Coordinator(settings, app_name).run()
