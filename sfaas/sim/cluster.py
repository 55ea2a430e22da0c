"""A whole cluster in one process (issue 51): the real ``Coordinator`` and N real ``Worker``s
as tasks of one :class:`~sfaas.sim.clock.VirtualLoop`, on the simulated log, object store
and network and the virtual clock, each process in a context of its own ports
(``sfaas.runtime.ports.context``); a bank workload through the ingress topic, and the
invariants checked at the end.

The workload (:class:`Bank`): deposit ``opening`` into each of ``accounts`` accounts,
then random transfers between them (some overdraw and abort), then read every balance.
The invariants: every request answered exactly once (no reply missing, none twice in the
committed egress), every deposit committed, and the balances summing to the deposits.

A run's trace is one line per request sent and reply read, and one per record appended,
transaction ended and offset committed in the simulated Kafka, each stamped with virtual
time: a function of the seed (``tests/sim/test_cluster.py`` runs a seed twice).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import itertools
import logging
import os
import random
import shutil
import tempfile
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import TopicPartition

from sfaas.app import App
from sfaas.runtime import ports, wire
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.settings import Settings
from sfaas.sim import clock, timed_faults
from sfaas.sim.checks import balances_violations
from sfaas.sim.disk import SimDisk
from sfaas.sim.faults import Schedule, Stale
from sfaas.sim.log import Faults, SimKafka
from sfaas.sim.network import SimNetwork, SimNetworkPort
from sfaas.sim.objects import ObjectFaults, SimObjectStore
from sfaas.sim.ports import ProcessExited, SimKafkaPort, WallClocks, process_ports
from sfaas.sim.replicas import SimReplicas
from sfaas.sim.stores import SMALL_STORES, with_store
from statestores import background

log = logging.getLogger("sfaas.sim.cluster")

__all__ = ["Bank", "Outcome", "Process", "Roles", "SimCluster", "simulate", "SMALL_STORES",
           "with_store"]

#: The cluster's secret (channels authenticate over the simulated network as over TCP).
SECRET = "simulated-cluster-secret-0123456789"


class Process(Protocol):
    """A process of the cluster: runs until it stops or is cancelled."""

    async def run(self) -> None: ...


@dataclass(frozen=True)
class Roles:
    """How the processes are made (the process-lifecycle port): the coordinator from
    ``(settings, app name, ports)``, a worker from ``(settings, app, name, ports)``. The
    real ones are ``coordinator.service.Coordinator`` and ``worker.service.Worker``, given
    by ``python -m sfaas.sim`` (``sfaas`` imports no service: ``tests/test_layout.py``)."""

    coordinator: Callable[[Settings, str, ports.Ports], Process]
    worker: Callable[[Settings, App, str, ports.Ports], Process]


#: The heartbeat timeout of a run: the product's default until 2026-11-30 (0.75 s since),
#: kept so the surveyed seeds and ``FOUND`` schedules replay as found. The heartbeats, the
#: fence lease, the coordinator's watchdog and the peers' connect deadline read the
#: process's clock port (virtual time here), so a run that takes long in wall time sees no
#: silence it did not simulate.
HEARTBEAT_TIMEOUT = 2.0

#: Simulated seconds a cancelled process (a crash, the run's end) has to end its task: its
#: stop waits at most a few heartbeat timeouts (``worker.egress.STOP_PATIENCE``)
STOP_WITHIN = 30.0

#: Simulated seconds into a run its standby processes start (the workers registered by then)
STANDBYS_AFTER = 0.2

#: The snapshot interval of a run with faults (simulated seconds): rounds on — so the
#: epoch log is written and a lost worker is recovered — and several due in a run, so a
#: recovery restores a real round and replays the log from there. The rounds' timing reads
#: the clock port (``coordinator/protocols/rounds.py``) and the stores' uploads run on the
#: loop (the background's ``loop`` mode, ``statestores/bgloop.py``): a seed's rounds start
#: at the same epochs and end at the same virtual time in every run.
ROUNDS = 2.5

#: An interval no round comes due at (``--rounds 1e9``): rounds on, every recovery from
#: round 0, replaying the whole epoch log (the simulator before rounds could run in it).
NEVER_DUE = 1e9


#: seconds each simulated Kafka request takes in a run with faults: a fetch answered at
#: once lets a consumer that keeps being rewound (a stale leader) spin without virtual time
#: passing, so the stale leader never ends (``worker/ingress.py:Ingress._rewound`` gives up
#: after 10 s read from ``time.monotonic``, the wall clock)
KAFKA_LATENCY = (0.0005, 0.002)


#: the supervisor's restart backoff: (first, longest) seconds (``launcher/supervisor.py``)
RESTART_BACKOFF = (0.2, 5.0)


@dataclass
class Bank:
    """The bank workload (see the module docstring)."""

    accounts: int = 8
    opening: int = 100
    transfers: int = 200
    #: requests per simulated second
    rate: float = 200.0
    operator: str = "accounts"
    #: simulated seconds the cluster idles after the transfers, before the balances
    idle: float = 0.0


@dataclass
class Outcome:
    """What a run saw: the trace, the replies, and the invariants that failed."""

    seed: int
    trace: list[str] = field(default_factory=list)
    sent: int = 0
    replies: dict[str, wire.Reply] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)
    #: the transfers sent: request id → (from, to, amount)
    transfers: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    committed: int = 0
    aborted: int = 0
    balances: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    simulated_seconds: float = 0.0
    #: objects in the simulated store at the end (snapshots, manifests, rounds)
    objects: int = 0


class SimCluster:
    """One simulated cluster (see the module docstring); :meth:`run` on a VirtualLoop."""

    def __init__(self, app: App, roles: Roles, seed: int, *, workers: int = 2,
                 partitions: int = 4, seconds: float = 60.0, bank: Bank | None = None,
                 rounds: float = 0.0, crash: tuple[float, float] | None = None,
                 cut: tuple[float, float] | None = None,
                 schedule: Schedule | None = None, store: str = "memonly") -> None:
        self.app = app
        #: the workers' store engine: ``memonly``, or one with files and background work
        #: (``hybridlog``, ``appendlog``, ``lsm``) on the process's home, a temp dir of its own
        self.store = store
        self.roles = roles
        self.workers = workers
        self.partitions = partitions
        self.seconds = seconds
        #: the snapshot interval (0: no rounds; then a lost worker stops the cluster)
        self.rounds = rounds
        #: ``(at, down)``: worker 1 crashes ``at`` simulated seconds into the run and a
        #: fresh process takes its slot ``down`` seconds later (None: no crash)
        self.crash = crash
        #: ``(at, for)``: worker 1 and the coordinator are cut apart ``at`` seconds into the
        #: run (their channel breaks, no new one connects) and healed ``for`` seconds later
        self.cut = cut
        #: the other faults (Kafka's and the object store's: ``sfaas.sim.faults``)
        self.schedule = schedule or Schedule()
        #: standby workers per worker (``standby-N`` processes, started after the workers)
        self.standbys = self.schedule.standbys
        self.bank = bank or Bank()
        self.outcome = Outcome(seed)
        self._tasks: list[asyncio.Task[None]] = []
        self._home = ""
        self._producer: Any = None
        self._stopping = False
        #: process name → how often it exited on its own (the supervisor's backoff)
        self._exits: dict[str, int] = {}
        #: process name → the ports of its current incarnation
        self._ports: dict[str, ports.Ports] = {}
        #: the tasks of processes that exited (cancelled by :meth:`_ended`): restarted
        self._exiting: set[asyncio.Task[None]] = set()
        #: the tasks of processes a fault crashed (``_crash`` restarts them)
        self._crashed: set[asyncio.Task[None]] = set()
        #: processes started so far, by name (each incarnation has a home of its own)
        self._incarnations: dict[str, int] = {}
        #: process name → the home of its current incarnation
        self._homes: dict[str, str] = {}
        #: the tasks each process started, by ``id`` of its ports (``_own``)
        self._owned: dict[int, weakref.WeakKeyDictionary[asyncio.Task[Any], int]] = {}
        self._born = itertools.count()  # (each task's number: ``_kill`` ends them in order)
        self._bootstrap = ""

    def _trace(self, line: str) -> None:
        now = asyncio.get_running_loop().time()
        self.outcome.trace.append(f"{now:12.6f} {line}")

    def _settings(self) -> Settings:
        return Settings.load({
            "secret": SECRET, "home": self._home, "kafka": "sim:9092", "minio": "sim:9000",
            "workers": self.workers, "partitions": self.partitions,
            # (memonly for all; another engine is the app's, with_store's small options)
            "store": "memonly" if self.store == "memonly" else "",
            "snapshot_interval": self.rounds, "background": "loop", "metrics_port": 0,
            "coordinator": "127.0.0.1:7700",
            "namespace": "sim",
            # (no gathering window: the pinned digests were taken without one; it runs on
            # the clock port since session 10 and replays alike, test_clock_reads.py)
            "epoch_gather": 0.0, "standbys": self.standbys,
            "heartbeat_timeout": HEARTBEAT_TIMEOUT}, env={})

    async def run(self) -> Outcome:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop), "a simulated cluster runs on a VirtualLoop"
        loop.set_task_factory(self._own)  # type: ignore[arg-type]
        rng = loop.random
        sched = self.schedule
        self.kafka = SimKafka(random.Random(rng.getrandbits(64)),
                              Faults(send_error=sched.kafka_errors,
                                     latency=KAFKA_LATENCY if sched.faults() else (0, 0)),
                              on_event=self.outcome.trace.append)  # (its lines say the time)
        objects = self.objects = SimObjectStore(random.Random(rng.getrandbits(64)),
                                                ObjectFaults(error=sched.object_errors),
                                                sleep=loop.clock.advance, clock=loop.time,
                                                on_event=lambda e: self._trace(f"object {e}"))
        self.net = SimNetwork(random.Random(rng.getrandbits(64)))
        self.replicas = SimReplicas(self.net, self._trace)
        self.walls = WallClocks()
        self._home = tempfile.mkdtemp(prefix="sfaas-sim-")
        try:
            s = self._settings()
            self._start("coordinator", self._coordinator, self._ports_of("coordinator"), s)
            for i in range(self.workers):
                name = f"worker-{i}"
                self._start(name, self._worker, self._ports_of(name), s)
            faults = [loop.create_task(self._standbys(s))] if self.standbys else []
            faults += [loop.create_task(self._crash(s, *self.crash))] if self.crash else []
            if self.cut:
                faults.append(loop.create_task(self._cut(*self.cut)))
            if sched.outage:
                faults.append(loop.create_task(self._outage(*sched.outage)))
            if sched.stale:
                faults.append(loop.create_task(self._stale(s, sched.stale)))
            if sched.coordinator:
                faults.append(loop.create_task(
                    self._crash(s, *sched.coordinator, name="coordinator")))
            faults += timed_faults.start(sched, self.net, self.walls, self.workers, self._trace,
                                         self._disk_of, self.kafka)
            await self._drive(s, random.Random(rng.getrandbits(64)))
            for task in faults:
                await task
        finally:
            await self._stop()
            shutil.rmtree(self._home, ignore_errors=True)
        self.outcome.simulated_seconds = loop.time()
        self.outcome.objects = len(objects.objects)
        return self.outcome

    def _start(self, name: str,
               process: Callable[[str, Settings, ports.Ports], Coroutine[Any, Any, None]],
               its: ports.Ports, s: Settings) -> None:
        """Run the process ``name`` as a task in a context of its own ports ``its`` (what
        the code not handed a port yet reads: ``sfaas.runtime.ports.current``)."""
        # (each process its own home, as on a machine of its own: a restarted coordinator
        # may give a worker another slot, whose stores a live worker holds open in its
        # home; and each incarnation a new one — a crashed process's stores stay open in
        # this one OS process, where a real crash would have released their locks — but
        # after a dead disk, which closed all it held: the same disk, a fresh file system)
        n = self._incarnations[name] = self._incarnations.get(name, 0) + 1
        before = self._ports[name].disk if name in self._ports else None
        if isinstance(before, SimDisk) and before.dead:
            self._trace(f"{name} starts over its dead disk's files, on a fresh file system")
        else:
            self._homes[name] = os.path.join(self._home, f"{name}.{n}")
        own = dataclasses.replace(s, home=self._homes[name])
        task = asyncio.get_running_loop().create_task(process(name, own, its), name=name,
                                                      context=ports.context(its))
        self._tasks.append(task)
        self._ports[name] = its
        task.add_done_callback(lambda t: self._exited(t, process, s))

    def _exited(self, task: asyncio.Task[None],
                process: Callable[[str, Settings, ports.Ports], Coroutine[Any, Any, None]],
                s: Settings) -> None:
        """The supervisor (``launcher/supervisor.py``): a process that exits on its own is
        restarted — at once the first time, then after a backoff doubling from 0.2 s to
        5 s (:data:`RESTART_BACKOFF`). A crash (a cancellation) is restarted by ``_crash``.
        A process whose main task ended on its own is dead whole, as an OS process whose
        main returned: its other tasks and its connections end with it (``_kill``)."""
        if (task.cancelled() and task not in self._exiting) or task in self._crashed \
                or self._stopping:
            return
        name = task.get_name()
        if task in self._exiting:
            self._exiting.discard(task)  # (its exit killed it already: ``_ended``)
        elif task in self._owned.get(id(self._ports[name]), ()):
            self._kill(name)
        exc = None if task.cancelled() else task.exception()
        n = self._exits[name] = self._exits.get(name, 0) + 1
        delay = 0.0 if n == 1 else min(RESTART_BACKOFF[1], RESTART_BACKOFF[0] * 2 ** (n - 2))
        self._trace(f"exit {name}: {type(exc).__name__ if exc else 'returned'}; "
                    f"restart in {delay:g} s")
        self._tasks.remove(task)
        asyncio.get_running_loop().call_later(delay, self._restart, name, process, s)

    def _restart(self, name: str,
                 process: Callable[[str, Settings, ports.Ports], Coroutine[Any, Any, None]],
                 s: Settings) -> None:
        if self._stopping:
            return
        self._trace(f"restart {name}")
        self._start(name, process, self._ports_of(name), s)

    def _ports_of(self, name: str) -> ports.Ports:
        """A new process ``name``'s ports."""
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop)
        disk = SimDisk(name, self._incarnations.get(name, 0) + 1, self.outcome.seed, self._trace)
        return process_ports(name, self.kafka, self.objects, self.net, loop.clock, self._ended,
                             self.walls, disk, self.replicas)

    def _disk_of(self, name: str) -> SimDisk | None:
        """The disk of process ``name`` if it runs (a disk fault's target)."""
        its = self._ports.get(name)
        running = any(t.get_name() == name for t in self._tasks)
        return its.disk if running and its is not None and isinstance(its.disk, SimDisk) else None

    def _ended(self, name: str, code: int) -> None:
        """Process ``name`` exits with ``code`` (``os._exit``: the fence, a failed ingest):
        cut off at once — nothing it still has in hand reaches the network or Kafka — and
        its task ended; the supervisor restarts it (:meth:`_exited`)."""
        self._trace(f"process {name} exits with {code}")
        for task in self._tasks:
            if task.get_name() == name:
                self._exiting.add(task)
        self._kill(name)

    def _kill(self, name: str) -> None:
        """The current process ``name`` dies: its network and Kafka ports go dead (nothing
        it still does reaches anyone) and every task it started is cancelled — its root
        task's ``finally`` still runs, as a real crash's would not. So is the task that
        called its exit, at its next ``await``: the real exit never returns, and a task
        going on (a fenced worker's rejoin on a dead network) would hold its slot."""
        its = self._ports[name]
        assert isinstance(its.network, SimNetworkPort) and isinstance(its.kafka, SimKafkaPort)
        its.network.kill()
        its.kafka.kill()
        # (in the order they were made: a weak set iterates in the order of addresses, which
        # depend on what the OS process ran before — the seeds before it in a budget run)
        owned = self._owned.get(id(its), weakref.WeakKeyDictionary())
        for task, _n in sorted(owned.items(), key=lambda tn: tn[1]):
            if not task.done():
                task.cancel()

    def _own(self, loop: asyncio.AbstractEventLoop, coro: Any,
             context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        """The loop's task factory: every task is noted under the ports of the process
        that made it (:meth:`_kill` ends them all)."""
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
        its = context.run(ports.current) if context is not None else ports.current()
        if its is not ports.REAL:
            self._owned.setdefault(id(its), weakref.WeakKeyDictionary())[task] = next(self._born)
        return task

    async def _coordinator(self, name: str, s: Settings, its: ports.Ports) -> None:
        await self.roles.coordinator(s, self.app.name, its).run()

    async def _worker(self, name: str, s: Settings, its: ports.Ports) -> None:
        await self.roles.worker(s, self.app, name, its).run()

    async def _standbys(self, s: Settings) -> None:
        """Start the standby processes (``standby-N``) :data:`STANDBYS_AFTER` s in: the
        same worker processes as ``sfaas up --standbys`` starts — the coordinator gives
        the first to register the slots, the others stand by where one is missing — late
        enough that the workers took the slots (a crash or a disk fault of ``worker-1``
        hits a primary), as after a standby's restart."""
        await asyncio.sleep(STANDBYS_AFTER)
        for i in range(self.standbys * self.workers):
            self._start(f"standby-{i}", self._worker, self._ports_of(f"standby-{i}"), s)

    async def _crash(self, s: Settings, at: float, down: float, name: str = "worker-1") -> None:
        """Process ``name`` (worker 1, or the coordinator) dies (its connections break, its
        task is cancelled), and a fresh process takes its place ``down`` seconds later."""
        await asyncio.sleep(at)
        process = self._coordinator if name == "coordinator" else self._worker
        self._trace(f"fault crash {name}")
        victim = next((t for t in self._tasks if t.get_name() == name), None)
        if victim is None:  # (it exited on its own and waits for its restart)
            self._trace(f"{name} is not running: nothing to crash")
            return
        self._crashed.add(victim)  # (restarted here, not by the supervisor)
        self._kill(name)
        await self._ended_within(victim, name)
        if victim in self._tasks:
            self._tasks.remove(victim)
        await asyncio.sleep(down)
        self._trace(f"fault restart {name}")
        self._start(name, process, self._ports_of(name), s)

    async def _cut(self, at: float, seconds: float) -> None:
        """Worker 1 and the coordinator cut apart for ``seconds``, then healed."""
        await asyncio.sleep(at)
        self._trace("fault cut worker-1 coordinator")
        self.net.cut("worker-1", "coordinator")
        await asyncio.sleep(seconds)
        self._trace("fault heal worker-1 coordinator")
        self.net.heal("worker-1", "coordinator")

    async def _outage(self, at: float, seconds: float) -> None:
        """Kafka unreachable for ``seconds`` from ``at`` on."""
        await asyncio.sleep(at)
        self.kafka.outage(seconds)

    async def _stale(self, s: Settings, stale: Stale) -> None:
        """A stale leader answers one partition for a while (``sfaas.sim.faults``)."""
        await asyncio.sleep(stale.at)
        ingress, egress = s.topics(self.app.name)
        topic = {"in": ingress, "out": egress,
                 "epochs": s.epoch_log_topic(self.app.name)}[stale.topic]
        tp = TopicPartition(topic, stale.partition)
        if stale.partition < len(self.kafka.broker.topics.get(topic, [])):
            self.kafka.stale_leader(tp, stale.seconds, stale.behind)

    async def _ended_within(self, task: asyncio.Task[None], name: str) -> None:
        """Wait for a crashed process's task to end — its ``finally`` still runs (a real
        crash runs nothing; nothing it does reaches the world any more) — for at most
        :data:`STOP_WITHIN` s: a stop that hangs is a finding."""
        await asyncio.wait({task}, timeout=STOP_WITHIN)
        if not task.done():
            self.outcome.violations.append(f"{name} did not stop within {STOP_WITHIN:g} s of "
                                           "being cancelled")
            return
        exc = None if task.cancelled() else task.exception()
        self._trace(f"{name} ended: {type(exc).__name__ if exc else 'CancelledError'}")

    async def _stop(self) -> None:
        self._stopping = True
        for task in reversed(self._tasks):
            if not task.done():
                task.cancel()
        await asyncio.wait(self._tasks, timeout=STOP_WITHIN)
        for task in self._tasks:
            if not task.done():
                self.outcome.violations.append(f"{task.get_name()} did not stop within "
                                               f"{STOP_WITHIN:g} s of being cancelled")
            elif not task.cancelled() and task.exception() is not None \
                    and not isinstance(task.exception(), ProcessExited):
                # a process that failed: the run says so (not one that exited meanwhile —
                # fenced as its lease lapsed: the supervisor would restart it)
                self.outcome.violations.append(f"{task.get_name()} failed: {task.exception()!r}")

    # -- the client ----------------------------------------------------------------------------
    async def _drive(self, s: Settings, rng: random.Random) -> None:
        """Send the workload to the ingress topic and read the replies from the egress topic
        until every request is answered or the time is up; then check the invariants."""
        loop = asyncio.get_running_loop()
        ingress, egress = s.topics(self.app.name)
        while ingress not in await self._topics():
            await asyncio.sleep(0.1)
        self._bootstrap = s.kafka
        self._producer = self.kafka.producer(bootstrap_servers=s.kafka)
        await self._producer.start()
        consumer = self.kafka.consumer(bootstrap_servers=s.kafka, enable_auto_commit=False,
                                       isolation_level="read_committed",
                                       auto_offset_reset="earliest")
        await consumer.start()
        consumer.assign([TopicPartition(egress, 0)])
        reader = loop.create_task(self._read(consumer))
        b, names = self.bank, [f"acct{i}" for i in range(self.bank.accounts)]
        try:
            for name in names:
                await self._send(ingress, name, "deposit", [b.opening])
            for _ in range(b.transfers):
                src, dst = rng.sample(names, 2)
                amount = rng.randint(1, b.opening)
                rid = await self._send(ingress, src, "transfer", [dst, amount])
                self.outcome.transfers[rid] = (src, dst, amount)
                await asyncio.sleep(rng.expovariate(b.rate))
            await self._answered(loop.time() + self.seconds)
            await asyncio.sleep(b.idle)
            reads = [await self._send(ingress, n, "balance", []) for n in names]
            await self._answered(loop.time() + self.seconds)
        finally:
            reader.cancel()
            await self._producer.stop()
            await consumer.stop()
        self._check(names, reads)

    async def _topics(self) -> list[str]:
        admin = self.kafka.admin()
        await admin.start()
        try:
            return list(await admin.list_topics())
        finally:
            await admin.close()

    async def _send(self, topic: str, key: str, function: str,
                    args: list[Any]) -> str:
        o = self.outcome
        rid = f"r{o.sent}"
        o.sent += 1
        req = wire.Request(rid, self.bank.operator, key, function, args, 0,
                           asyncio.get_running_loop().time())
        self._trace(f"send {rid} {key}.{function}{args}")
        part = partition_of(self.bank.operator, key, self.partitions)
        value = req.encode()
        while True:  # (a client retrying a failed send, knowing whether it landed)
            try:
                await (await self._producer.send(topic, value, partition=part))
                return rid
            except Exception as exc:
                self._trace(f"send {rid} failed: {type(exc).__name__}")
                landed = self.kafka.broker.partition(TopicPartition(topic, part)).entries
                if any(e.value == value for e in landed[-50:]):
                    return rid
                await self._producer.stop()  # (a producer out of sequence stays stuck)
                self._producer = self.kafka.producer(bootstrap_servers=self._bootstrap)
                await self._producer.start()

    async def _read(self, consumer: Any) -> None:
        o = self.outcome
        at: dict[TopicPartition, int] = {}  # the next offset wanted, per partition
        while True:
            got = await consumer.getmany(timeout_ms=100)
            for tp in sorted(got, key=lambda t: (t.topic, t.partition)):
                for record in got[tp]:
                    if record.offset < at.get(tp, 0):  # (rewound: a stale leader's reset)
                        continue
                    at[tp] = record.offset + 1
                    if record.value == wire.FENCE:  # (a recovery's, aborted)
                        continue
                    reply = wire.Reply.decode(record.value)
                    self._trace(f"reply {reply.rid}@{record.offset} ok={reply.ok} {reply.value!r} "
                                f"{reply.error_type or ''}")
                    if reply.rid in o.replies:
                        o.duplicates.append(reply.rid)
                    o.replies[reply.rid] = reply

    async def _answered(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while len(self.outcome.replies) < self.outcome.sent and loop.time() < deadline:
            await asyncio.sleep(0.05)

    def _check(self, names: list[str], reads: list[str]) -> None:
        o, b = self.outcome, self.bank
        missing = [f"r{i}" for i in range(o.sent) if f"r{i}" not in o.replies]
        if missing:
            o.violations.append(f"{len(missing)} requests never answered: {missing[:5]}")
        if o.duplicates:
            o.violations.append(f"answered twice: {o.duplicates[:5]}")
        o.committed = sum(r.ok for r in o.replies.values())
        o.aborted = len(o.replies) - o.committed
        deposits = [f"r{i}" for i in range(len(names))]
        if not all(d in o.replies and o.replies[d].ok for d in deposits):
            o.violations.append("an opening deposit did not commit")
        o.balances = {n: o.replies[r].value for n, r in zip(names, reads, strict=True)
                      if r in o.replies and o.replies[r].ok}
        if len(o.balances) == len(names):  # (exactly once: sfaas.sim.checks)
            o.violations += balances_violations(b.opening, o.balances, o.transfers, o.replies)


def simulate(app: App, roles: Roles, seed: int, *, seconds: float = 60.0, workers: int = 2,
             bank: Bank | None = None, crash: tuple[float, float] | None = None,
             cut: tuple[float, float] | None = None,
             schedule: Schedule | None = None, rounds: float | None = None,
             store: str = "memonly") -> Outcome:
    """Run one simulated cluster of ``app`` for ``seed`` (see the module docstring);
    ``crash``: ``(at, down)``, worker 1 crashes and a fresh process replaces it — with
    rounds on the cluster restores the newest round and replays the epoch log after it;
    ``cut``: ``(at, for)``, worker 1 and the coordinator cut apart for a while;
    ``schedule``: all of a run's faults (``sfaas.sim.faults``; its crash and cut stand in
    for the two above); ``rounds``: the snapshot interval (None: :data:`ROUNDS` in a run
    with faults or standbys, none without; 0: none); ``store``: the workers' store engine.
    The schedule's ``standbys``: standby workers per worker."""
    if schedule is not None:
        crash, cut = schedule.crash or crash, schedule.cut or cut
    faulty = crash or cut or (schedule is not None and schedule.faults())
    if rounds is None:
        rounds = schedule.rounds if schedule is not None else None
    if rounds is None:
        rounds = ROUNDS if faulty or (schedule is not None and schedule.standbys) else 0.0
    if store != "memonly":
        app = with_store(app, store)
    cluster = SimCluster(app, roles, seed, workers=workers, seconds=seconds, bank=bank,
                         rounds=rounds, crash=crash, cut=cut, schedule=schedule, store=store)
    # (the stores' uploads run on the loop: each Worker sets the mode its settings name,
    # "loop" in a run, for the whole OS process)
    mode = background.set_mode("loop")
    try:
        return clock.run(cluster.run(), seed=seed)
    finally:
        background.set_mode(mode)
