"""The worker process: its parts, wired together, started in order and stopped in reverse.

Life of a worker: register with the coordinator (``worker.membership``), receive its slot
and the membership, connect to every peer, assign itself its ingress partitions, then
follow the coordinator (``worker.inbox``): epochs (``worker.epochs``: Begin → execute →
Report; ``worker.commits``: Commit; or leased, ``worker.protocols.lease``), snapshot rounds
(``worker.protocols.rounds``), recoveries (``worker.protocols.recovery``) and rescales
(``worker.protocols.rescale``).

Requests come in through ``worker.ingress`` and their replies leave through
``worker.egress``; calls between workers go over ``worker.calls``.

:class:`Worker` only wires the parts — each takes the few others it needs, through the
ports ``worker.needs`` declares; the loops between parts (a reply acknowledged completes
its request, work queued wakes the epochs, a call served reports the epoch again) are
closed in one place, once both ends exist — and is the root service
(``sfaas.runtime.lifecycle``): its parts with a lifetime (``worker.startup``) start in
dependency order and stop in reverse. What the process knows
— its slot, the partition map, the epoch loop, the offsets — is one
:class:`~worker.state.WorkerState`, which every part reads and only its methods change.
State lives in one store per (operator, owned partition), opened by ``sfaas.runtime.state``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from sfaas.app import App
from sfaas.errors import EXIT_RETIRED, ClusterError
from sfaas.runtime import wire
from sfaas.runtime.lifecycle import Service
from sfaas.runtime.ports import Ports
from sfaas.runtime.ports import current as current_ports
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import PartitionStores
from sfaas.runtime.txn.engine import Engine
from statestores import background
from worker.calls import PeerCalls
from worker.clients import KafkaClients
from worker.commits import EpochCommitter
from worker.cuts import RoundCut
from worker.direct import DirectIngress
from worker.egress import Egress
from worker.epoch_log import EpochLogWriter
from worker.epochs import EpochRunner
from worker.fence import FenceLease
from worker.heartbeat import Heartbeat
from worker.inbox import CoordinatorInbox
from worker.ingress import IN_FLIGHT_BATCHES, Ingress
from worker.links import CoordinatorLink, PeerLinks
from worker.membership import Membership
from worker.metrics import WorkerMetrics
from worker.protocols.fallback import CrossFallback
from worker.protocols.lease import EpochLeaseHolder
from worker.protocols.reads import ReadServer
from worker.protocols.recovery import Recovery, RollBack
from worker.protocols.replay import Replay
from worker.protocols.rescale import StoreMoves
from worker.protocols.rounds import RoundTaker
from worker.quiesce import Departures, Quiescer
from worker.replication import Replication
from worker.replies import Replies
from worker.startup import (
    Background,
    Ingest,
    Joining,
    MetricsServer,
    Peering,
    PeerServer,
    Rescales,
    Rounds,
    Stores,
    WorldService,
)
from worker.state import WorkerState
from worker.tasks import Tasks
from worker.traces import EpochTraces
from worker.watch import EpochWatch
from worker.world import World

log = logging.getLogger("sfaas.worker")

__all__ = ["Worker", "run_worker"]


class Worker(Service):
    """One worker process (see module docstring): builds its parts, runs them."""

    part = "worker"

    def __init__(self, settings: Settings, app: App, name: str | None = None,
                 ports: Ports | None = None) -> None:
        """``ports``: where the process gets its outside world (``sfaas.runtime.ports``;
        the process's — :data:`~sfaas.runtime.ports.REAL` in production — when None)."""
        s = self.settings = settings
        self.app = app
        self.ports = ports or current_ports()
        self.name = name or f"worker-{os.getpid()}"
        secret = self.secret = settings.shared_secret()
        self.mode = s.fallback_phase()
        background.set_mode(s.background)  # (one choice per process, like the lanes)
        log_topic = s.epoch_log_topic(app.name) if s.snapshot_interval > 0 else ""
        # the epoch loop's own (local) fallback phase only in "local" mode
        st = self.state = WorkerState(s.max_batch, self.mode == "local", log_topic)
        self.tasks = Tasks()
        self.uplink = CoordinatorLink(secret)
        #: the coordinator's lease on this process: nothing acts without it (``worker.fence``)
        self.lease = self.uplink.lease = FenceLease(s.heartbeat_timeout, self.uplink.is_closed,
                                                    rejoins=s.snapshot_interval > 0,
                                                    clock=self.ports.clock.monotonic)
        self.links = PeerLinks(secret, 2 * s.heartbeat_timeout + 2.0, gate=self.lease.check)
        self.kafka = KafkaClients(s, self.ports.kafka)
        #: the replication server (rescales ship stores too: on with rounds or standbys)
        self.replication = Replication(s, secret)
        self.egress = Egress(s, st, self.kafka, self.uplink, lease=self.lease,
                             kafka_port=self.ports.kafka)
        self.ingress = Ingress(s, st, self.kafka, self.egress)
        #: clients' direct state reads
        self.reads = ReadServer(st)
        #: requests (and reads) clients send straight to this worker
        self.direct = DirectIngress(st, None, limit=IN_FLIGHT_BATCHES * s.max_batch,
                                    retention=s.direct_retention, read=self.reads.answer,
                                    clock=self.ports.clock.monotonic)
        #: effects, post-commit actions, timers
        self.world = World(s, st, self.links, reads=self.ingress, wall=self.ports.clock.time)
        self.fallback = CrossFallback(st, self.links, self.tasks, self.world)
        #: calls to and from peers within an epoch (the engine's router)
        self.calls = PeerCalls(s, st, self.links, self.fallback, self.tasks, world=self.world,
                               broken=self._peer_broken)
        self.rounds = RoundTaker(st.index, self.uplink.send, self._held_by_standbys,
                                 s.snapshot_interval)
        self.metrics = WorkerMetrics(s, app.name, self.name, st, ingress=self.ingress,
                                     egress=self.egress, links=self.links, uplink=self.uplink,
                                     kafka=self.kafka,
                                     parts={"world": self.world.gauges,
                                            "direct": self.direct.counters,
                                            "rounds": self.rounds.counters,
                                            "calls": self.calls.gauges})
        self._epoch_parts()
        # the loops between parts (worker.needs): a reply acknowledged completes its request
        # in the ingress; work queued wakes the epochs; a call served reports the epoch
        # again; the fallback phase frees room for the peers' held calls
        self.egress.completes(self.ingress)
        for queues in (self.ingress, self.direct, self.world):
            queues.wakes(self.epochs)
        self.calls.reports_to(self.epochs)
        self.fallback.frees_room_in(self.calls)
        #: stops ingest and executions for a recovery or a rejoin
        self.quiet = Quiescer(st, self.epoch_lease, self.calls, self.ingress, self.direct,
                              self.egress, self.epoch_log)
        #: rescaling: stores moving in and out
        self.moving = StoreMoves(s, app, self.name, secret, st, uplink=self.uplink,
                                 links=self.links, ingress=self.ingress,
                                 standbys=self.replication,
                                 rescaled=Departures(self.epoch_lease, self.world, self.direct))
        self.recovery = Recovery(
            s, app, st, uplink=self.uplink,
            rollback=RollBack(s, app, st, quiet=self.quiet, world=self.world,
                              moving=self.moving, links=self.links,
                              newer=self.uplink.newer_recover),
            replay=Replay(s, app.name, st, kafka=self.kafka, ingress=self.ingress,
                          direct=self.direct, egress=self.egress, world=self.world,
                          log=self.epoch_log))
        self.membership = Membership(s, app, self.name, secret, st, uplink=self.uplink,
                                     links=self.links, kafka=self.kafka, moving=self.moving,
                                     egress=self.egress,
                                     warm_rounds=self.recovery.warm_rounds
                                     if s.snapshot_interval > 0 else None)
        self.inbox = CoordinatorInbox(self.uplink, self.tasks, epochs=self.commits,
                                      directions=self, state=st)
        self.lost_coordinator = False
        self._require_parts()

    def _epoch_parts(self) -> None:
        """The epochs' parts: begin/execute/report, commit, the lease, what watches them."""
        s, st = self.settings, self.state
        #: the spans and slow-request view of the epochs (``worker.traces``), and with the
        #: metrics what both halves of an epoch tell of its progress (``worker.watch``)
        traces = EpochTraces(s.namespace, s.trace_slow, self.metrics.latency)
        traces.timers = self.world.traced.timers  # (the timers set by traced transactions)
        watch = EpochWatch(self.metrics, traces)
        #: epochs this worker begins and commits itself, under the coordinator's lease
        #: (``worker.protocols.lease``: this worker is its ``LeaseHost``)
        self.epoch_lease = EpochLeaseHolder(self, wall=self.ports.clock.time)
        self.epoch_log = EpochLogWriter(st, self.kafka, self.uplink, self.lease)
        self.epochs = EpochRunner(
            s, st, uplink=self.uplink, calls=self.calls, world=self.world, watch=watch,
            epoch_log=self.epoch_log, lease=self.epoch_lease)
        self.commits = EpochCommitter(
            self.mode, st, fallback=self.fallback, world=self.world, watch=watch,
            replies=Replies(s, st, direct=self.direct, completions=self.ingress,
                            egress=self.egress, metrics=self.metrics, uplink=self.uplink),
            cut=RoundCut(s, st, rounds=self.rounds, direct=self.direct, egress=self.egress,
                         kafka=self.kafka, uplink=self.uplink))
        self.heartbeat = Heartbeat(s, st, self.uplink, self.metrics, self.lease,
                                   slow=traces.slow)

    def _require_parts(self) -> None:
        """The parts with a lifetime, in the order they start (``worker.startup``): each
        after what it needs; stopped in reverse."""
        s, st = self.settings, self.state
        self.server = PeerServer(s, self.secret, self.direct, self.calls, self.ports.network)
        joining = Joining(st, self.membership, self.uplink, self.links, self.server,
                          self.replication)
        stores = Stores(s, self.app, st, joining, self, self.ports.objects).requires(joining)
        self.replication.ships(stores).requires(stores)  # (stops before the stores close)
        self.server.requires(stores)  # (stops taking peers before the stores close)
        peering = Peering(st, joining, self.links).requires(joining)
        ingest = Ingest(self.membership, joining, stores, self.kafka, self.ingress,
                        self.egress).requires(peering, stores)
        tasks = Background(self.egress, self.heartbeat, self.ingress, self.uplink,
                           self.lease).requires(ingest)
        world = WorldService(self.world).requires(stores, tasks)
        self.requires(MetricsServer(self.metrics), joining, stores, self.replication,
                      self.server, Rounds(self.rounds).requires(stores),
                      Rescales(self.moving).requires(stores), peering, ingest, tasks, world)

    # -- what the epochs' lease needs (``worker.protocols.lease.LeaseHost``) ----------------------
    @property
    def index(self) -> int:
        return self.state.index

    @property
    def n_workers(self) -> int:
        return self.state.n_workers

    def tasks_add(self, task: asyncio.Future[Any]) -> None:
        self.tasks.add(task)

    def send_peers(self, msg: wire.Message) -> None:
        self.links.send_all(msg)

    def start_epoch(self, begin: wire.Begin) -> None:
        """Begin epoch ``begin.epoch`` now (the coordinator's Begin, or the lease's) and run
        its roots in a task. A live epoch ends a recovery's replay here, however it ran
        (a replay the coordinator drove after a leased one stalled sends no ``Replayed``):
        the worker takes requests again."""
        if not begin.replay:
            self.recovery.replayed()
        t0 = self.epochs.begin(begin)
        if t0 is not None:
            self.tasks.spawn(self.epochs.execute(begin, t0))

    async def commit_epoch(self, epoch: int, conflicts: dict[int, int],
                           aborts: dict[int, tuple[str, str]], marker: int | None) -> None:
        await self.commits.commit_epoch(epoch, conflicts, aborts, marker)

    def _peer_broken(self, peer: int, generation: int) -> None:
        """The channel worker ``peer`` opened to this one closed (``worker.calls``): tell
        the coordinator, which recovers (``wire.PeerBroken``)."""
        if self.uplink.closed:
            return
        log.warning("the channel from worker %d closed: telling the coordinator", peer,
                    extra={"worker": self.state.index})
        self.uplink.send(wire.PeerBroken(self.state.index, peer, generation,
                                         self.state.recovery))

    def replayed(self, epoch: int) -> None:
        """The recovery's leased replay committed its last epoch: tell the coordinator
        (a closed channel: the next coordinator recovers anew)."""
        self.recovery.replayed()
        if not self.uplink.closed:
            self.uplink.send(wire.Replayed(self.state.recovery, self.state.index, epoch))

    async def _held_by_standbys(self, round_id: int) -> bool:
        """A round's report waits until the standbys hold the round (``Shipping.wait_marks``)
        and the worker holds the coordinator's lease (a fenced worker reports no round:
        ``worker.fence``); False — not reported — once the coordinator's channel is closed:
        only a rejoin renews that lease, and a worker whose slot went to its standby never
        rejoins — its stop waited for this report for ever (the simulator's seeds 428, 686)."""
        shipping = self.replication.shipping
        if shipping is not None:
            await shipping.wait_marks(round_id)
        return await self.uplink.held_unless_closed()

    def start_engine(self, stores: PartitionStores) -> Engine:
        """The slot is known and its stores are open: execution can start."""
        st = self.state
        # (the engine reads the partition map from the state: one copy, one writer)
        engine = Engine(self.app, st.index, st.n_workers, st.partitions, stores, self.calls,
                        st.current_owners)
        st.attach(engine, stores.opened_at)
        self.world.attach(engine)
        self.rounds.index = st.index
        return engine

    # -- running ----------------------------------------------------------------------------------
    async def run(self) -> None:
        """Join the cluster and process epochs until the coordinator stops us or goes away."""
        try:
            await self.start()
            await self._follow()
        finally:
            await self.stop()

    async def on_start(self) -> None:
        """Every part runs: the coordinator may begin epochs here."""
        self.uplink.send(wire.Ready(self.state.index))

    async def _follow(self) -> None:
        while True:
            self.lost_coordinator = await self.inbox.follow()
            if not self.lost_coordinator or self.settings.snapshot_interval <= 0:
                break
            # the coordinator closed the channel of a worker it declared lost: such a
            # worker's lease has run out (worker.fence), so it leaves here — unless it ran
            # throughout and the silence was the coordinator's (paused, being restarted;
            # or this worker's heartbeat task left its channel): then it rejoins below
            self.lease.check()
            if cut := self.heartbeat.cut_from_kafka():
                # (the coordinator replaced it for that, or is gone while Kafka is: taking
                # the slot back would only be lost again, until the cut heals — the cuts
                # series' 10-16 s recoveries; a fresh process starts when Kafka answers it)
                self.lease.fence(f"lost the coordinator while cut from Kafka ({cut})")
                break
            # with rounds on, a restarted coordinator rolls everyone back to the newest
            # round: keep the stores and wait for it instead of restarting this process
            await self.quiet.quiesce(replies=False)  # (their commits wait for the rejoin)
            self.lease.suspend()
            if not await self.membership.rejoin(self.server.port, self.replication.port):
                # (nothing may act without a coordinator: leave now, no clean stop)
                self.lease.fence("could not rejoin the coordinator")
                break
            self.lost_coordinator = False
            if not self.ingress.started:  # no recovery follows when nothing ever ran
                self.ingress.start_where_taken()
                self.direct.restore([], set())

    async def handle(self, msg: wire.Message) -> bool:
        """Act on one message of the coordinator (but a Commit); False: stop following
        (``worker.needs.Directions``)."""
        if isinstance(msg, wire.Begin):
            self.start_epoch(msg)
        elif isinstance(msg, wire.EpochLease):
            self.epoch_lease.grant(msg)
        elif isinstance(msg, wire.ReplayLogged):
            if msg.attempt == self.state.recovery:  # (else: an abandoned recovery's)
                self.epoch_lease.replay(msg)
        elif isinstance(msg, wire.Recover):
            await self.recovery.run(msg)  # awaited: the replay's Begins come after it
        elif isinstance(msg, wire.Ship):
            self.uplink.send(self.moving.ship(msg))
        elif isinstance(msg, wire.Move):
            self.moving.follow(msg)
        elif isinstance(msg, wire.Hold):
            self.moving.hold(msg)
        elif isinstance(msg, wire.Release):
            self.uplink.send(await self.moving.release(msg))
        elif isinstance(msg, wire.Reassign):
            await self.moving.reassign(msg)
        elif isinstance(msg, wire.Stop):
            log.info("stopping: %s", msg.reason, extra={"worker": self.state.index})
            return False
        else:
            log.warning("unexpected %s from coordinator", type(msg).__name__)
        return True


async def run_worker(settings: Settings, app: App, name: str | None = None,
                     ports: Ports | None = None) -> None:
    """Run one worker until it is stopped; raises :class:`ClusterError` if it lost the
    coordinator."""
    w = Worker(settings, app, name, ports)
    await w.run()
    if w.state.retired:
        log.info("retired by a rescale; exiting with code %d", EXIT_RETIRED)
        raise SystemExit(EXIT_RETIRED)
    if w.lost_coordinator:
        raise ClusterError("lost the coordinator")
