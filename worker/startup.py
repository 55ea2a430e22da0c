"""The worker's parts with a lifetime, as services (``sfaas.runtime.lifecycle.Service``).

``worker.service.Worker`` requires them in this order, and :meth:`Service.stop` stops them
in reverse: the metrics server → :class:`Joining` (the coordinator gives the slot) →
:class:`Stores` (the slot's stores, the engine on them) → the replication server
(``worker.replication.Replication``) → :class:`PeerServer` → :class:`Rounds` →
:class:`Rescales` → :class:`Peering` (channels to every peer) → :class:`Ingest` (the Kafka
clients, ingest from where the slot's requests resume) → :class:`Background` (replies,
heartbeats, offset commits) → :class:`WorldService` (effects, actions, timers).

The peer server and the replication server listen before the join (their ports go in the
``Register``), yet stop before the stores close: each is a service started after the
stores, whose port the join asks for first. A part whose start did not get as far as
holding something (a join refused, Kafka clients not started) stops nothing.
"""

from __future__ import annotations

import asyncio
import logging

from sfaas.app import App
from sfaas.runtime import channels, wire
from sfaas.runtime.lifecycle import Service
from sfaas.runtime.ports import NetworkPort, ObjectsPort
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import PartitionStores, open_stores
from sfaas.runtime.txn.engine import Engine
from worker.calls import PeerCalls
from worker.clients import KafkaClients
from worker.direct import DirectIngress
from worker.egress import Egress
from worker.fence import FenceLease
from worker.heartbeat import Heartbeat
from worker.ingress import Ingress
from worker.links import CoordinatorLink, PeerLinks
from worker.membership import Membership
from worker.metrics import WorkerMetrics
from worker.needs import EngineStarter
from worker.protocols.rescale import StoreMoves
from worker.protocols.rounds import RoundTaker
from worker.replication import Replication
from worker.state import WorkerState
from worker.world import World

log = logging.getLogger("sfaas.worker")

__all__ = ["Background", "Ingest", "Joining", "MetricsServer", "PeerServer",
           "Peering", "Rescales", "Rounds", "Stores", "WorldService"]


class MetricsServer(Service):
    """``/metrics`` (``worker.metrics``)."""

    part = "metrics"

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    async def on_start(self) -> None:
        await self._metrics.start()

    async def on_stop(self) -> None:
        await self._metrics.close()


class PeerServer(Service):
    """Where peers' calls and clients' direct requests and reads reach this worker."""

    part = "peer server"

    def __init__(self, settings: Settings, secret: str, direct: DirectIngress,
                 calls: PeerCalls, network: NetworkPort | None = None) -> None:
        self._settings = settings
        self._secret = secret
        #: where it listens (``sfaas.runtime.ports``; the process's when None)
        self._network = network
        self._direct = direct
        self._calls = calls
        self._server: asyncio.Server | None = None
        #: where peers reach this worker (known once it listens)
        self.port = 0

    async def listen(self) -> int:
        """Listen (before the join: the port goes in the ``Register``); the port."""
        s = self._settings
        self._server = await channels.serve(s.host, s.port, self._secret, self._on_peer,
                                            network=self._network)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def on_stop(self) -> None:
        if self._server is not None:  # (stops taking peers before the stores close)
            self._server.close()

    async def _on_peer(self, chan: channels.Channel) -> None:
        """One channel: a peer's calls, or a client's direct requests and reads."""
        first = await chan.recv()
        if first and isinstance(first[0], (wire.Read, wire.Submit, wire.Acked)):
            await self._direct.serve(chan, first)
        else:
            await self._calls.serve(chan, first)


class Joining(Service):
    """The coordinator gives this worker its slot (``worker.membership``); stopping closes
    the coordinator's channel."""

    part = "coordinator"

    def __init__(self, state: WorkerState, membership: Membership, uplink: CoordinatorLink,
                 links: PeerLinks, server: PeerServer, replication: Replication) -> None:
        self._state = state
        self._membership = membership
        self._uplink = uplink
        self._links = links
        self._server = server
        self._replication = replication
        self.assign: wire.Assign | None = None
        #: a promoted standby's stores; a joining worker's ``Reassign``
        self.promoted: PartitionStores | None = None
        self.takeover: wire.Reassign | None = None

    async def on_start(self) -> None:
        port = await self._server.listen()
        self._replication.open()
        self.assign, self.promoted, self.takeover = await self._membership.join(
            port, self._replication.port)
        st = self._state
        st.adopt(self.assign)
        self._links.generation = st.generation
        log.info("joined as worker %d of %d (generation %d)", st.index, st.n_workers,
                 st.generation, extra={"worker": st.index})

    async def on_stop(self) -> None:
        if self.assign is not None:
            self._uplink.close()


class Stores(Service):
    """The slot's stores (a promoted standby's, when they are the slot's) and the engine
    on them; stopping closes them."""

    part = "stores"

    def __init__(self, settings: Settings, app: App, state: WorkerState, joining: Joining,
                 starter: EngineStarter, objects: ObjectsPort | None = None) -> None:
        self._settings = settings
        self._app = app
        self._state = state
        self._joining = joining
        self._starter = starter
        #: the stores' remotes' object store (``sfaas.runtime.ports``)
        self._objects = objects
        self._engine: Engine | None = None
        #: the stores opened (None until started)
        self.opened: PartitionStores | None = None
        #: whether they are a promoted standby's (the recovery next seeks the ingest)
        self.promoted = False

    async def on_start(self) -> None:
        st, promoted = self._state, self._joining.promoted
        mine = st.mine()
        slot_stores = {(op, p) for op in self._app.operators for p in mine}
        if promoted is not None and set(promoted) != slot_stores:
            log.warning("the promoted stores are not this slot's; opening the slot's own",
                        extra={"worker": st.index})
            promoted.close()
            promoted = None
        self.promoted = promoted is not None
        stores = promoted if promoted is not None else open_stores(
            self._settings, self._app, mine, st.partitions, objects=self._objects)
        self._engine = self._starter.start_engine(stores)
        self.opened = stores

    async def on_stop(self) -> None:
        if self._engine is not None:
            self._engine.close()


class Rounds(Service):
    """Snapshot rounds' reports: stopping waits for those pending."""

    part = "rounds"

    def __init__(self, rounds: RoundTaker) -> None:
        self._rounds = rounds

    async def on_stop(self) -> None:
        await self._rounds.close()


class Rescales(Service):
    """Stores moving in: stopping stops following them."""

    part = "moving"

    def __init__(self, moving: StoreMoves) -> None:
        self._moving = moving

    async def on_stop(self) -> None:
        self._moving.stop()


class Peering(Service):
    """A channel to every peer of the membership the join gave."""

    part = "peers"

    def __init__(self, state: WorkerState, joining: Joining, links: PeerLinks) -> None:
        self._state = state
        self._joining = joining
        self._links = links
        self._connected = False

    async def on_start(self) -> None:
        assert self._joining.assign is not None
        await self._links.connect(self._joining.assign.peers, self._state.index)
        self._connected = True

    async def on_stop(self) -> None:
        if self._connected:
            self._links.close()


class Ingest(Service):
    """The Kafka clients, and ingest from where the slot's requests resume; stopping sends
    the replies queued and commits the offsets they complete."""

    part = "kafka"

    def __init__(self, membership: Membership, joining: Joining, stores: Stores,
                 kafka: KafkaClients, ingress: Ingress, egress: Egress) -> None:
        self._membership = membership
        self._joining = joining
        self._stores = stores
        self._kafka = kafka
        self._ingress = ingress
        self._egress = egress
        self._clients = False

    async def on_start(self) -> None:
        assert self._joining.assign is not None
        await self._membership.start_clients(self._joining.assign)
        self._clients = True
        takeover = self._joining.takeover
        if takeover is not None:  # a joining worker: resume where the rescale's round left off
            await self._ingress.resume(takeover.ingress, takeover.skip, takeover.retries)
            await self._membership.arrive(takeover)
        else:  # (a promoted standby's recovery, next, seeks and starts the ingest)
            await self._ingress.start_at_group(record_start=not self._stores.promoted)

    async def on_stop(self) -> None:
        if not self._clients:
            return
        await self._egress.stop()  # (the replies queued first, within its patience)
        await self._kafka.stop_producer()  # waits for outstanding deliveries
        await self._egress.commit_offsets()
        await self._kafka.consumer.stop()


class Background(Service):
    """The worker's long-running tasks — replies, heartbeats, offset commits — and the
    coordinator's answers to the heartbeats, which renew the lease (``worker.fence``)."""

    part = "tasks"

    def __init__(self, egress: Egress, heartbeat: Heartbeat, ingress: Ingress,
                 uplink: CoordinatorLink, lease: FenceLease) -> None:
        self._egress = egress
        self._heartbeat = heartbeat
        self._ingress = ingress
        self._uplink = uplink
        self._lease = lease
        self._tasks: list[asyncio.Task[None]] = []

    async def on_start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._egress.run(), name="egress"),
            asyncio.create_task(self._heartbeat.run(), name="heartbeat"),
            asyncio.create_task(self._egress.commit_loop(), name="offsets"),
        ]
        self._uplink.listen(self._lease.alive)

    async def on_stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._ingress.pause()


class WorldService(Service):
    """Effects, post-commit actions and timers (``worker.world``)."""

    part = "world"

    def __init__(self, world: World) -> None:
        self._world = world

    async def on_start(self) -> None:
        self._world.start()

    async def on_stop(self) -> None:
        await self._world.close()
