"""The worker process: its parts, wired together, started in order and stopped in reverse.

Life of a worker: register with the coordinator (``worker.membership``), receive its slot
and the membership, connect to every peer, assign itself its ingress partitions, then
follow the coordinator (``worker.inbox``): epochs (``worker.epochs``: Begin → execute →
Report → Commit, or leased, ``worker.protocols.lease``), snapshot rounds
(``worker.protocols.rounds``), recoveries (``worker.protocols.recovery``) and rescales
(``worker.protocols.rescale``).

Requests come in through ``worker.ingress`` and their replies leave through
``worker.egress``; calls between workers go over ``worker.peers``. What the process knows
— its slot, the partition map, the epoch loop, the offsets — is one
:class:`~worker.state.WorkerState`, which every part reads and only its methods change.
State lives in one store per (operator, owned partition), opened by ``sfaas.runtime.state``.
"""

from __future__ import annotations

import asyncio
import logging
import os

from sfaas.app import App
from sfaas.errors import EXIT_RETIRED, ClusterError
from sfaas.runtime import channels, wire
from sfaas.runtime.lifecycle import Lifecycle
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import PartitionStores, open_stores
from sfaas.runtime.txn.engine import Engine
from statestores import background
from worker.clients import KafkaClients
from worker.direct import DirectIngress
from worker.egress import Egress
from worker.epochs import EpochRunner
from worker.fence import FenceLease
from worker.inbox import CoordinatorInbox
from worker.ingress import IN_FLIGHT_BATCHES, Ingress
from worker.links import CoordinatorLink, PeerLinks
from worker.membership import Membership
from worker.metrics import WorkerMetrics
from worker.peers import Peers
from worker.protocols.fallback import CrossFallback
from worker.protocols.reads import ReadServer
from worker.protocols.recovery import Recovery
from worker.protocols.rescale import Moving
from worker.protocols.rounds import RoundTaker
from worker.replication import Shipping
from worker.state import WorkerState
from worker.tasks import Tasks
from worker.world import World

log = logging.getLogger("sfaas.worker")

__all__ = ["Worker", "run_worker"]


class Worker:
    """One worker process (see module docstring): builds its parts, runs them."""

    def __init__(self, settings: Settings, app: App, name: str | None = None) -> None:
        s = self.settings = settings
        self.app = app
        self.name = name or f"worker-{os.getpid()}"
        secret = self.secret = settings.shared_secret()
        self.mode = s.fallback_phase()
        background.set_mode(s.background)  # (one choice per process, like the lanes)
        log_topic = s.epoch_log_topic(app.name) if s.snapshot_interval > 0 else ""
        # the epoch loop's own (local) fallback phase only in "local" mode
        st = self.state = WorkerState(s.max_batch, self.mode == "local", log_topic)
        self.tasks = Tasks()
        self.parts = Lifecycle(log)
        self.uplink = CoordinatorLink(secret)
        #: the coordinator's lease on this process: nothing acts without it (``worker.fence``)
        self.lease = self.uplink.lease = FenceLease(s.heartbeat_timeout, lambda: self.uplink.closed)
        self.links = PeerLinks(secret, 2 * s.heartbeat_timeout + 2.0, gate=self.lease.check)
        self.kafka = KafkaClients(s)
        #: the replication server (rescales ship stores too: on with rounds or standbys)
        self.shipping: Shipping | None = None
        # (the lambdas close the loops between parts built one after the other)
        self.egress = Egress(s, st, self.kafka, self.uplink,
                             completed=lambda p, o: self.ingress.complete(p, o), lease=self.lease)
        self.ingress = Ingress(s, st, self.kafka, self.egress,
                               arrived=lambda: self.epochs.work_arrived())
        #: clients' direct state reads
        self.reads = ReadServer(st)
        #: requests (and reads) clients send straight to this worker
        self.direct = DirectIngress(st, arrived=lambda: self.epochs.work_arrived(),
                                    limit=IN_FLIGHT_BATCHES * s.max_batch,
                                    retention=s.direct_retention, read=self.reads.answer)
        #: effects, post-commit actions, timers
        self.world = World(s, st, self.links.send_all, arrived=lambda: self.epochs.work_arrived(),
                           reads_open=lambda: self.ingress.answer_held_reads())
        self.fallback = CrossFallback(lambda: st.index, lambda: st.engine, self.links.send_all,
                                      self.links.send_to, self.tasks.spawn, lambda: st.recovery,
                                      lambda: self.calls.room(), self.world.on_call)
        #: calls to and from peers within an epoch (the engine's router)
        self.calls = Peers(s, st, self.links, self.fallback, self.tasks.spawn,
                           report=lambda: self.epochs.report(),
                           leased=lambda m: self.epochs.lease.receive(m), world=self.world)
        self.rounds = RoundTaker(st.index, self.uplink.send, self._held_by_standbys,
                                 s.snapshot_interval)
        self.metrics = WorkerMetrics(s, app.name, self.name, st, ingress=self.ingress,
                                     egress=self.egress, calls=self.calls, links=self.links,
                                     uplink=self.uplink, kafka=self.kafka, rounds=self.rounds,
                                     parts={"world": self.world.gauges,
                                            "direct": self.direct.counters})
        self.epochs = EpochRunner(s, st, self.mode, uplink=self.uplink, links=self.links,
                                  calls=self.calls, fallback=self.fallback, ingress=self.ingress,
                                  egress=self.egress, metrics=self.metrics, rounds=self.rounds,
                                  kafka=self.kafka, tasks=self.tasks, world=self.world,
                                  direct=self.direct, fence=self.lease)
        #: rescaling: stores moving in and out
        self.moving = Moving(s, app, self.name, secret, st, uplink=self.uplink, links=self.links,
                             ingress=self.ingress, shipping=lambda: self.shipping,
                             end_lease=self.epochs.lease.reset, moved=self.world.moved,
                             dropped=self.direct.dropped)
        self.recovery = Recovery(s, app, st, uplink=self.uplink, links=self.links, kafka=self.kafka,
                                 ingress=self.ingress, direct=self.direct, moving=self.moving,
                                 quiesce=self.quiesce,
                                 rolling_back=self.world.recovering,
                                 restored=lambda: self.world.restored(self._stores()),
                                 replies_acked=lambda: dict(self.egress.acked))
        self.membership = Membership(s, app, self.name, secret, st, uplink=self.uplink,
                                     links=self.links, kafka=self.kafka, moving=self.moving,
                                     egress=self.egress)
        self.inbox = CoordinatorInbox(self.uplink, self.tasks, commit=self.epochs.commit,
                                      waits_on_peers=self.epochs.waits_on_peers,
                                      handle=self._on_coordinator, index=lambda: st.index)
        self.lost_coordinator = False
        #: where peers reach this worker (known once the peer server listens)
        self._port = 0

    async def _held_by_standbys(self, round_id: int) -> object:
        """A round's report waits until the standbys hold the round (``Shipping.wait_marks``)."""
        shipping = self.shipping
        held = None if shipping is None else await asyncio.to_thread(shipping.wait_marks, round_id)
        await self.uplink.held()  # (a fenced worker reports no round: worker.fence)
        return held

    def start_engine(self, stores: PartitionStores) -> Engine:
        """The slot is known and its stores are open: execution can start."""
        st = self.state
        # (the engine reads the partition map from the state: one copy, one writer)
        engine = Engine(self.app, st.index, st.n_workers, st.partitions, stores, self.calls,
                        lambda: st.owners)
        st.attach(engine)
        self.world.attach(engine)
        self.rounds.index = st.index
        return engine

    async def _on_peer(self, chan: channels.Channel) -> None:
        """One channel to the peer server: a peer's calls, or a client's direct requests
        and reads."""
        first = await chan.recv()
        if first and isinstance(first[0], (wire.Read, wire.Submit, wire.Acked)):
            await self.direct.serve(chan, first)
        else:
            await self.calls.serve(chan, first)

    def _stores(self) -> dict[tuple[str, int], object]:
        assert self.state.engine is not None
        return dict(self.state.engine.stores)

    # -- running ----------------------------------------------------------------------------------
    async def run(self) -> None:
        """Join the cluster and process epochs until the coordinator stops us or goes away."""
        try:
            await self._start()
            await self._follow()
        finally:
            await self.parts.stop()

    async def _start(self) -> None:
        s, st, parts = self.settings, self.state, self.parts
        await self.metrics.start()
        parts.started("metrics", self.metrics.close)
        server = await channels.serve(s.host, s.port, self.secret, self._on_peer)
        self._port = server.sockets[0].getsockname()[1]
        if s.standbys > 0 or s.snapshot_interval > 0:
            self.shipping = Shipping(s, self.secret)
        assign, promoted, takeover = await self.membership.join(self._port, self._repl_port())
        parts.started("coordinator", self.uplink.close)
        st.adopt(assign)
        self.links.generation = st.generation
        log.info("joined as worker %d of %d (generation %d)", st.index, st.n_workers,
                 st.generation, extra={"worker": st.index})
        mine = st.mine()
        slot_stores = {(op, p) for op in self.app.operators for p in mine}
        if promoted is not None and set(promoted) != slot_stores:
            log.warning("the promoted stores are not this slot's; opening the slot's own",
                        extra={"worker": st.index})
            promoted.close()
            promoted = None
        stores = promoted if promoted is not None else open_stores(s, self.app, mine, st.partitions)
        parts.started("stores", self.start_engine(stores).close)
        if self.shipping is not None:  # (stopped before the stores close)
            parts.started("shipping", self.shipping.close)
            if s.standbys > 0:
                self.shipping.attach(stores)
        parts.started("peer server", server.close)  # (stops taking peers before the stores close)
        parts.started("rounds", self.rounds.close)
        parts.started("moving", self.moving.stop)
        await self.links.connect(assign.peers, st.index)
        parts.started("peers", self.links.close)
        await self.membership.start_clients(assign)
        parts.started("kafka", self._stop_kafka)
        if takeover is not None:  # a joining worker: resume where the rescale's round left off
            await self.ingress.resume(takeover.ingress, takeover.skip, takeover.retries)
        else:  # (a promoted standby's recovery, next, seeks and starts the ingest)
            await self.ingress.start_at_group(record_start=promoted is None)
        background = [
            asyncio.create_task(self.egress.run(), name="egress"),
            asyncio.create_task(self.epochs.heartbeat(), name="heartbeat"),
            asyncio.create_task(self.egress.commit_loop(), name="offsets"),
        ]
        parts.started("tasks", lambda: self._stop_tasks(background))
        self.uplink.listen(lambda m: self.lease.on_alive(m.index, m.generation, m.sent))
        self.world.start()
        parts.started("world", self.world.close)
        self.uplink.send(wire.Ready(st.index))

    async def _follow(self) -> None:
        while True:
            self.lost_coordinator = await self.inbox.follow()
            if not self.lost_coordinator or self.settings.snapshot_interval <= 0:
                break
            # the coordinator closed the channel of a worker it declared lost: such a
            # worker's lease has run out (worker.fence), so it leaves here
            self.lease.check()
            # with rounds on, a restarted coordinator rolls everyone back to the newest
            # round: keep the stores and wait for it instead of restarting this process
            await self.quiesce()
            self.lease.suspend()
            if not await self.membership.rejoin(self._port, self._repl_port()):
                # (nothing may act without a coordinator: leave now, no clean stop)
                self.lease.fence("could not rejoin the coordinator")
                break
            self.lost_coordinator = False
            if not self.ingress.started:  # no recovery follows when nothing ever ran
                self.ingress.start()
                self.direct.restore([], set())

    def _repl_port(self) -> int:
        return self.shipping.port if self.shipping is not None else 0

    async def _stop_tasks(self, background: list[asyncio.Task[None]]) -> None:
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self.ingress.pause()

    async def _stop_kafka(self) -> None:
        await self.egress.flush()
        await self.egress.stop()
        await self.kafka.stop_producer()  # waits for outstanding deliveries
        await self.egress.commit_offsets()
        await self.kafka.consumer.stop()

    async def quiesce(self) -> None:
        """Stop ingest and every execution in flight; wait until the replies already made
        are acknowledged (recovery starts from a quiet worker)."""
        self.epochs.lease.reset()  # no epoch begins on its own any more
        await self.ingress.pause()
        self.direct.rollback()  # (its clients send again what has no answer)
        running = self.tasks.cancel()
        self.calls.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        self.calls.reset()
        self.fallback.reset()
        self.state.drop_replays()
        try:
            await self.egress.durable()
        except Exception as exc:
            log.warning("flushing replies before the recovery failed: %s", exc,
                        extra={"worker": self.state.index})

    async def _on_coordinator(self, msg: wire.Message) -> bool:
        """Act on one message of the coordinator (but a Commit); False: stop following."""
        if isinstance(msg, wire.Begin):
            self.epochs.start_epoch(msg)
        elif isinstance(msg, wire.EpochLease):
            self.epochs.lease.grant(msg)
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


async def run_worker(settings: Settings, app: App, name: str | None = None) -> None:
    """Run one worker until it is stopped; raises :class:`ClusterError` if it lost the
    coordinator."""
    w = Worker(settings, app, name)
    await w.run()
    if w.state.retired:
        log.info("retired by a rescale; exiting with code %d", EXIT_RETIRED)
        raise SystemExit(EXIT_RETIRED)
    if w.lost_coordinator:
        raise ClusterError("lost the coordinator")
