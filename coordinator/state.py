"""The coordinator's view of the cluster: one object, owned by its event loop.

It holds what several parts read and the protocols change — the membership (one
:class:`Member` per worker slot), the partition map, the current epoch and the leased
epochs, the epoch counters and the recoveries — and changes them only through its
methods, so each change (a loss, a replacement, a rescale's new map) is made in one place
and no part writes another part's fields (``tests/test_state_owners.py`` fails on an
assignment to a field of :class:`ClusterState` or :class:`Member` outside this module).
Everything else a part keeps (a round in flight, a rescale's plan, the standbys) stays in
that part.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sfaas.runtime import channels, ports, wire

__all__ = ["ClusterState", "ClusterView", "EpochStats", "Layout", "Member", "next_generation"]


def next_generation(last: int) -> int:
    """The generation of a new assignment of a slot: the wall clock in microseconds, and
    above ``last`` (the newest this process gave). Strictly increasing per slot, also across
    coordinator restarts: a restarted coordinator starts later, so its clock reads higher
    than any generation its predecessor gave — as long as the clock is not set back by more
    than the restart takes (NTP slews, it does not jump; a counter restored from the newest
    round would survive a jump, but the round is written after the assignment it would
    have to cover). Peers refuse a process whose generation is older than the one their
    membership names (``worker.calls``), so a higher one never locks anyone out."""
    return max(last + 1, int(ports.current().clock.time() * 1_000_000))


def _monotonic() -> float:
    """The process's monotonic clock (``sfaas.runtime.ports``: virtual in the simulator)."""
    return ports.current().clock.monotonic()


@dataclass
class Member:
    """A worker process in a slot (or joining a rescale, then ``index`` is its future slot)."""

    index: int
    name: str
    host: str
    port: int
    pid: int
    channel: channels.Channel
    last_seen: float = field(default_factory=_monotonic)
    committed: int = 0
    alive: bool = True
    #: set once the worker reported Ready (after its Assign)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: where its standbys follow its stores (0: it ships nothing)
    repl_port: int = 0
    #: this assignment of the slot (:func:`next_generation`; ``wire.Assign.generation``)
    generation: int = 0
    #: its last heartbeat's ``kafka_silent``, and when that beat arrived (monotonic)
    kafka_silent: float = 0.0
    kafka_heard: float = 0.0

    @classmethod
    def of(cls, index: int, reg: wire.Register, chan: channels.Channel) -> Member:
        return cls(index, reg.name, reg.host, reg.port, reg.pid, chan, repl_port=reg.repl_port)

    @property
    def peer(self) -> wire.Peer:
        """Where the other workers reach it, and its generation."""
        return wire.Peer(self.host, self.port, self.generation)


@dataclass(frozen=True)
class Layout:
    """The partition map in force: ``owners[p]`` is the slot owning partition ``p``, of
    ``workers`` slots."""

    partitions: int
    workers: int
    owners: tuple[int, ...]


@dataclass
class EpochStats:
    """Epochs committed, root transactions run in them (re-runs included), conflicts."""

    epochs: int = 0
    txns: int = 0
    conflicts: int = 0


class ClusterView(Protocol):
    """The cluster as a part that only reads it sees it (:class:`ClusterState` is one)."""

    @property
    def partitions(self) -> int: ...
    @property
    def owners(self) -> Sequence[int]: ...
    @property
    def members(self) -> Sequence[Member]: ...
    @property
    def joined(self) -> bool: ...
    @property
    def slots(self) -> int: ...
    @property
    def stats(self) -> EpochStats: ...
    @property
    def recoveries(self) -> int: ...
    @property
    def recovering(self) -> bool: ...
    @property
    def recovery_stopped(self) -> str: ...
    def member(self, index: int) -> Member | None: ...
    async def kafka_silence_news(self, timeout: float) -> None: ...


class ClusterState:
    """See the module docstring."""

    def __init__(self, workers: int) -> None:
        self.partitions = 0
        #: the slots: awaited before every worker joined, then the membership's size
        self.workers = workers
        #: the partition map: ``owners[p]`` is the index of the worker owning partition ``p``
        self.owners: list[int] = []
        self.members: list[Member] = []
        self.epoch = 0
        #: the newest ``now`` an epoch began with (``next_now``: never runs backwards)
        self.now = 0.0
        #: the last epoch the workers were leased (``coordinator.protocols.lease``)
        self.lease_upto = 0
        self.stats = EpochStats()
        #: recovery attempts, and the phases and durations of the last recovery (for logs,
        #: ``sfaas ps`` and benchmarks)
        self.recoveries = 0
        self.last_recovery: dict[str, Any] = {}
        #: a recovery is under way
        self.recovering = False
        #: why recovery stopped retrying ("" : it did not)
        self.recovery_stopped = ""
        #: the newest generation given (:func:`next_generation`)
        self.generation = 0
        self._all_joined = asyncio.Event()
        self._changed = asyncio.Event()  # membership changed (a loss, a replacement ready)
        #: the watchdog's wait for its next tick (:meth:`kafka_silence_news`)
        self._tick: asyncio.Future[None] | None = None

    # -- the map -------------------------------------------------------------------------------
    def configure(self, partitions: int, workers: int, owners: list[int]) -> None:
        """The topics' partitions, the slots awaited and the map they start under."""
        self.partitions, self.workers, self.owners = partitions, workers, list(owners)

    def layout(self) -> Layout:
        return Layout(self.partitions, self.workers, tuple(self.owners))

    def adopt(self, owners: list[int], members: list[Member]) -> None:
        """A rescale's new map and membership are in force: the slots beyond it leave (not
        a loss) and the rest are numbered by their position."""
        for m in self.members[len(members):]:
            m.alive = False
        for i, m in enumerate(members):
            m.index = i
        self.owners, self.members, self.workers = list(owners), list(members), len(members)

    # -- membership ----------------------------------------------------------------------------
    @property
    def joined(self) -> bool:
        """Has every awaited slot been taken once (the cluster formed)?"""
        return self._all_joined.is_set()

    async def wait_joined(self) -> None:
        await self._all_joined.wait()

    @property
    def slots(self) -> int:
        """The slots: the members once all joined (a rescale changes them), before that the
        count awaited."""
        return len(self.members) if self.joined else self.workers

    def free_slot(self, wanted: int) -> int:
        """The slot a registrant takes while the cluster forms: ``wanted`` if free (a
        restarted coordinator gives each worker its slot back), else the lowest free."""
        free = sorted(set(range(self.workers)) - {m.index for m in self.members})
        return wanted if wanted in free else free[0]

    def new_generation(self) -> int:
        """A generation for a new assignment of a slot."""
        self.generation = next_generation(self.generation)
        return self.generation

    def joiner(self, reg: wire.Register, chan: channels.Channel) -> Member:
        """A registrant joining a rescale: a member of no slot yet, with a generation."""
        m = Member.of(-1, reg, chan)
        m.generation = self.new_generation()
        return m

    def place_joiners(self, members: list[Member], first: int) -> None:
        """A rescale's plan: ``members[first:]`` (its joiners) speak for the slots they are
        about to take, their positions (``coordinator.inbound`` checks it)."""
        for i, m in enumerate(members[first:], start=first):
            m.index = i

    def add_member(self, m: Member) -> None:
        m.generation = self.new_generation()
        self.members.append(m)
        if len(self.members) == self.workers:
            self.members.sort(key=lambda x: x.index)
            self._all_joined.set()

    def member(self, index: int) -> Member | None:
        return next((m for m in self.members if m.index == index), None)

    def peers(self) -> list[wire.Peer]:
        return [m.peer for m in self.members]

    def all_alive(self) -> bool:
        return all(m.alive for m in self.members)

    def all_ready(self) -> bool:
        return all(m.alive and m.ready.is_set() for m in self.members)

    def not_ready(self) -> list[int]:
        return [m.index for m in self.members if not (m.alive and m.ready.is_set())]

    def replace(self, m: Member, reg: wire.Register, chan: channels.Channel) -> None:
        """A new process takes lost slot ``m``."""
        m.name, m.host, m.port, m.pid, m.channel = reg.name, reg.host, reg.port, reg.pid, chan
        m.alive, m.last_seen, m.repl_port = True, _monotonic(), reg.repl_port
        m.generation = self.new_generation()

    def heard(self, m: Member, beat: wire.Heartbeat | None = None) -> None:
        """``m`` sent something (a heartbeat says its newest committed epoch, and how long
        its Kafka clients have heard no broker)."""
        m.last_seen = _monotonic()
        if beat is not None:
            m.committed = beat.committed
            m.kafka_silent, m.kafka_heard = beat.kafka_silent, m.last_seen
            if beat.kafka_silent > 0 and self._tick is not None:
                _resolve(self._tick)

    async def kafka_silence_news(self, timeout: float) -> None:
        """Return after ``timeout`` seconds, or sooner once a heartbeat says its worker
        heard no Kafka broker for a while: the watchdog judges a cut at once. The timeout
        ends the wait in the very turn its timer fires, as a sleep does (``wait_for``'s
        cancellation took turns more: a coordinator resuming from a pause then handled its
        workers' closed channels before its watchdog, and promoted their standbys over the
        workers coming back — tests/runtime/test_fencing_cluster.py, coordinator-fenced)."""
        loop = asyncio.get_running_loop()
        tick = self._tick = loop.create_future()
        timer = loop.call_later(timeout, _resolve, tick)
        try:
            await tick
        finally:
            timer.cancel()
            self._tick = None

    def mark_ready(self, m: Member) -> None:
        m.ready.set()
        self._changed.set()

    def expect_ready(self) -> None:
        """Every member is told to take a new role (a rescale's ``Reassign``): none is ready
        until it says so again."""
        for m in self.members:
            m.ready.clear()

    async def wait_ready(self) -> None:
        """Wait until every member reported Ready."""
        await asyncio.gather(*(m.ready.wait() for m in self.members))

    def mark_lost(self, m: Member) -> None:
        m.alive = False
        m.ready.clear()
        m.channel.close()
        self._changed.set()

    async def wait_change(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the next membership change; did one happen?"""
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- epochs --------------------------------------------------------------------------------
    def next_epoch(self) -> int:
        self.epoch += 1
        return self.epoch

    def next_now(self, wall: float) -> float:
        """The ``now`` of the epoch that begins (what ``ctx.now()`` reads): the wall clock
        ``wall``, but never below an earlier epoch's — a clock stepped back (an NTP step, a
        replaced coordinator on a machine behind) holds it still until the wall catches up,
        so a function never sees time run backwards."""
        self.now = max(self.now, wall)
        return self.now

    def reach_now(self, now: float) -> None:
        """Epochs that began with ``now`` were used (a recovery's replay)."""
        self.now = max(self.now, now)

    def reach_epoch(self, epoch: int) -> None:
        """Epochs up to ``epoch`` were used: new ones are numbered above it."""
        self.epoch = max(self.epoch, epoch)

    def begin_lease_run(self) -> int:
        """The first epoch of a leased run: above every epoch leased before (a report still
        travelling from then is stale)."""
        self.epoch = max(self.epoch, self.lease_upto) + 1
        return self.epoch

    def lease(self, upto: int) -> None:
        self.lease_upto = upto

    def count_epoch(self, txns: int, conflicts: int) -> None:
        self.stats.epochs += 1
        self.stats.txns += txns
        self.stats.conflicts += conflicts

    # -- recoveries ----------------------------------------------------------------------------
    def resume(self) -> None:
        """A restarted coordinator: the cluster recovers before its first epoch."""
        self.recovering = True

    def begin_recovery(self) -> int:
        """A new recovery attempt; its number."""
        self.recoveries += 1
        self.recovering = True
        return self.recoveries

    def recovered(self, info: dict[str, Any]) -> None:
        self.recovering = False
        self.last_recovery = info

    def stop_recovering(self, why: str) -> None:
        """Recovery gave up: nothing will run until an operator intervenes."""
        self.recovering = False
        self.recovery_stopped = why


def _resolve(fut: asyncio.Future[None]) -> None:
    """End the wait on ``fut`` (if it is still waited for)."""
    if not fut.done():
        fut.set_result(None)
