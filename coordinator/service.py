"""The coordinator process: membership, partition assignment, heartbeats, the epoch barrier.

It creates the app's ingress/egress topics, waits for ``workers`` workers to register,
assigns each an index (ingress partition ``p`` and the keys hashing to it belong to worker
``p % n``), and then drives epochs eagerly: a new epoch begins as soon as the previous one
committed if any worker reported waiting work, otherwise when a worker wakes it up.
Each epoch has one barrier: workers report conflicts, user aborts and call counters
(``wire.Report``); when the counters show no call in flight, the union is broadcast in
``Commit``. Every ``snapshot_interval`` seconds a Commit carries a snapshot round's
marker (``coordinator.rounds``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from sfaas import channels, wire
from sfaas.errors import ChannelClosed, ClusterError
from sfaas.kafka import ensure_topics
from sfaas.settings import Settings
from sfaas.state import rounds_remote, store_remote
from sfaas.txn.epochs import execution_finished
from sfaas.txn.loop import merge_votes

from .rounds import RoundKeeper

log = logging.getLogger("sfaas.coordinator")

__all__ = ["Coordinator", "run_coordinator"]

#: A worker silent for this long is reported as unresponsive.
HEARTBEAT_TIMEOUT = 5.0


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


class Coordinator:
    """See module docstring."""

    def __init__(self, settings: Settings, app_name: str) -> None:
        self.settings = settings
        self.app_name = app_name
        self.secret = settings.shared_secret()
        self.members: list[_Member] = []
        self._inbox: asyncio.Queue[wire.Message] = asyncio.Queue()
        self._wakeup = asyncio.Event()
        self._all_joined = asyncio.Event()
        self._lost: asyncio.Future[str] | None = None
        self.epoch = 0
        self._phases = [0.0, 0.0, 0.0, 0]
        self.stats: dict[str, Any] = {"epochs": 0, "txns": 0, "conflicts": 0}

    async def run(self, ready: asyncio.Future[tuple[str, int]] | None = None) -> None:
        """Serve until stopped (cancelled) or a worker is lost."""
        s = self.settings
        self._lost = asyncio.get_running_loop().create_future()
        ingress, egress = s.topics(self.app_name)
        topics = {ingress: s.partitions, egress: s.partitions}
        if s.snapshot_interval > 0:
            topics[s.epoch_log_topic(self.app_name)] = 1
        counts = await ensure_topics(s.kafka, topics)
        self.partitions = counts[ingress]
        if self.partitions < s.workers:
            raise ClusterError(f"topic {ingress} has {self.partitions} partitions < {s.workers} workers")
        app = self.app_name
        self.rounds = RoundKeeper(
            s.snapshot_interval, s.snapshot_retain, s.workers, self.partitions,
            lambda: rounds_remote(s, app), lambda op, p: store_remote(s, app, op, p),
        )
        host, port = s.coordinator_address()
        server = await channels.serve(host, port, self.secret, self._on_worker)
        bound = server.sockets[0].getsockname()
        log.info("coordinator of app %s listening on %s:%d, waiting for %d workers",
                 self.app_name, bound[0], bound[1], s.workers)
        if ready is not None and not ready.done():
            ready.set_result((bound[0], bound[1]))
        try:
            await self._all_joined.wait()
            peers = [[m.host, m.port] for m in self.members]
            for m in self.members:
                m.channel.send(wire.Assign(m.index, len(self.members), peers, self.partitions,
                                           ingress, egress, f"{s.namespace}.{self.app_name}.workers"))
            await self._collect(wire.Ready, 0)
            log.info("all %d workers ready; running epochs", len(self.members))
            if s.ready_file:
                members = [{"index": m.index, "name": m.name, "pid": m.pid,
                            "address": f"{m.host}:{m.port}"} for m in self.members]
                tmp = s.ready_file + ".tmp"
                with open(tmp, "w") as f:
                    json.dump({"coordinator": f"{bound[0]}:{bound[1]}", "workers": members}, f)
                os.replace(tmp, s.ready_file)
            watchdog = asyncio.create_task(self._watchdog())
            loop_task = asyncio.create_task(self._epochs())
            waiters: list[asyncio.Future[Any]] = [loop_task, self._lost]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            watchdog.cancel()
            loop_task.cancel()
            await self.rounds.close()
            if self._lost.done():
                raise ClusterError(self._lost.result())
            loop_task.result()
        finally:
            for m in self.members:
                try:
                    m.channel.send(wire.Stop("coordinator stopping"))
                    await asyncio.wait_for(m.channel.drain(), 1.0)
                except Exception as exc:
                    log.debug("stopping worker %d: %s", m.index, exc)
                m.channel.close()
            server.close()

    async def _on_worker(self, chan: channels.Channel) -> None:
        msgs = await chan.recv()
        reg = msgs[0] if msgs else None
        if not isinstance(reg, wire.Register):
            log.warning("peer %s did not register; dropping", chan.peer)
            return
        if self._all_joined.is_set():
            log.warning("refusing worker %s: cluster already has %d workers", reg.name, len(self.members))
            chan.send(wire.Stop(f"cluster already has {len(self.members)} workers"))
            await chan.drain()
            return
        member = _Member(len(self.members), reg.name, reg.host, reg.port, reg.pid, chan)
        self.members.append(member)
        log.info("worker %s (pid %d) registered as %d at %s:%d",
                 reg.name, reg.pid, member.index, reg.host, reg.port)
        if len(self.members) == self.settings.workers:
            self._all_joined.set()
        try:
            while True:
                for msg in await chan.recv():
                    member.last_seen = time.monotonic()
                    if isinstance(msg, wire.Wakeup):
                        self._wakeup.set()
                    elif isinstance(msg, wire.Heartbeat):
                        member.committed = msg.committed
                    elif isinstance(msg, wire.Snapshotted):
                        self.rounds.on_report(msg)
                    else:
                        self._inbox.put_nowait(msg)
        except ChannelClosed:
            if self._lost is not None and not self._lost.done():
                self._lost.set_result(
                    f"lost worker {member.index} ({member.name}); recovery is not implemented, stopping"
                )
            raise

    async def _collect(self, kind: type[wire.Message], epoch: int) -> list[Any]:
        got: list[Any] = []
        while len(got) < len(self.members):
            msg = await self._inbox.get()
            if not isinstance(msg, kind):
                raise ClusterError(f"expected {kind.__name__}, got {msg!r:.100}")
            if epoch and getattr(msg, "epoch", epoch) != epoch:
                raise ClusterError(f"{kind.__name__} for epoch {msg.epoch}, expected {epoch}")  # type: ignore[attr-defined]
            got.append(msg)
        return got

    async def _barrier(self, epoch: int) -> list[wire.Report]:
        """Wait until epoch ``epoch`` finished executing everywhere (see ``wire.Report``)."""
        n = len(self.members)
        latest: dict[int, wire.Report] = {}
        while True:
            msg = await self._inbox.get()
            if not isinstance(msg, wire.Report):
                raise ClusterError(f"expected a Report, got {msg!r:.100}")
            if msg.epoch < epoch:
                log.warning("ignoring a late report of epoch %d from worker %d", msg.epoch, msg.index)
                continue
            if msg.epoch != epoch:
                raise ClusterError(f"Report for epoch {msg.epoch} during epoch {epoch}")
            latest[msg.index] = msg
            if execution_finished(n, {i: (r.sent, r.served) for i, r in latest.items()}):
                return list(latest.values())

    def _broadcast(self, msg: wire.Message) -> None:
        for m in self.members:
            m.channel.send(msg)

    async def _epochs(self) -> None:
        idle = True
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
            if ph[3] % 500 == 0:
                log.info("epochs %d; mean of the last 500 (ms): waiting for work %.2f, "
                         "execute+barrier %.2f", ph[3], ph[0] / 0.5, ph[1] / 0.5)
                ph[:] = [0.0, 0.0, 0.0, ph[3]]
            conflicts, aborts = merge_votes((r.conflicts, r.aborts) for r in reports)
            pending = sum(r.pending for r in reports)
            idle = pending == 0 and not conflicts and not self._wakeup.is_set()
            self.stats["epochs"] += 1
            self.stats["txns"] += sum(r.roots for r in reports)
            marker = self.rounds.marker(epoch, self.stats["txns"])
            self._broadcast(wire.Commit(epoch, [[t, b] for t, b in conflicts.items()],
                                        [[t, e, r] for t, (e, r) in aborts.items()], idle, marker))
            self.stats["conflicts"] += len(conflicts)

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for m in self.members:
                if now - m.last_seen > HEARTBEAT_TIMEOUT:
                    log.warning("worker %d silent for %.1f s", m.index, now - m.last_seen)


async def run_coordinator(settings: Settings, app_name: str) -> None:
    """Run a coordinator for ``app_name`` until cancelled or a worker is lost."""
    await Coordinator(settings, app_name).run()
