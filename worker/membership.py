"""A worker's membership: joining the cluster (directly, through a standby phase, or as a
scale-up's receiver), rejoining a restarted coordinator in the same slot, and starting
the Kafka clients for the slot it got."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition

from sfaas.app import App
from sfaas.errors import ChannelClosed, ClusterError, StartAgain
from sfaas.runtime import ports, wire
from sfaas.runtime.kafka import consumer_group
from sfaas.runtime.protocols.membership import REGISTER_AGAIN
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import PartitionStores
from worker.clients import KafkaClients, know_group, warm_topic
from worker.egress import Egress
from worker.links import CoordinatorLink, PeerLinks
from worker.protocols.rescale import StoreMoves, join_as_receiver
from worker.protocols.standby import run_standby
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker")

#: Seconds a worker that lost its coordinator waits for it to come back (and answer its
#: Register) before it gives up and exits for a fresh start.
REJOIN_PATIENCE = 120.0
#: Seconds a rejoin tries to reach each peer when a recovery follows it (epochs ran): a
#: peer not reached by then is left to that recovery, which connects the peers again.
REJOIN_PEER_PATIENCE = 1.0

__all__ = ["Membership"]


class Membership:
    """How this worker (``name``) gets and keeps its slot; it sets the coordinator's
    channel in ``uplink`` and the slot in ``state``."""

    def __init__(
        self, settings: Settings, app: App, name: str, secret: str, state: WorkerState, *,
        uplink: CoordinatorLink, links: PeerLinks, kafka: KafkaClients, moving: StoreMoves,
        egress: Egress, warm_rounds: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._settings = settings
        self._app = app
        self._name = name
        self._secret = secret
        self._state = state
        self._uplink = uplink
        self._links = links
        self._kafka = kafka
        self._moving = moving
        self._egress = egress
        #: opens the snapshot rounds' remote (a standby's warm-up; None: rounds are off)
        self._warm_rounds = warm_rounds
        self._warming: asyncio.Future[None] | None = None

    async def join(self, my_port: int, repl_port: int,
                   ) -> tuple[wire.Assign, PartitionStores | None, wire.Reassign | None]:
        """Register with the coordinator and get a slot: at once, or — answered ``Follow`` — as a
        standby first (``worker.protocols.standby``) until promoted, then for the dead primary's
        slot with the promoted stores, or — answered ``Move`` — as a worker joining a scale-up
        (``worker.protocols.rescale``), with the stores it took over and the ``Reassign`` saying
        where their requests resume. Raises :class:`ClusterError` if refused."""
        s, up = self._settings, self._uplink
        chost, cport = s.coordinator_address()
        async def register(standby_of: int = s.standby_of,
                           replicas: bool = False) -> list[wire.Message]:
            await up.connect(chost, cport)
            up.send(wire.Register(self._name, s.host, my_port, os.getpid(), -1, standby_of,
                                  repl_port, replicas=replicas or None))
            return await up.recv()

        assign = (await register())[0]
        promoted = None
        if isinstance(assign, wire.Move):
            await self._start_early()
            slot: list[wire.Assign] = []
            takeover, promoted = await join_as_receiver(self._moving, up, assign,
                                                        lambda m: slot.append(self._take_slot(m)))
            return slot[0], promoted, takeover
        if isinstance(assign, wire.Follow):
            # the Kafka clients take ~0.3 s to start: have them ready before a promotion needs them
            await self._start_early()
            await self.warm_up()
            if self._warm_rounds is not None:  # (beside the standby phase: MinIO may be down)
                self._warming = asyncio.ensure_future(self._warm_rounds())
            promoted, index = await run_standby(s, self._app, self._name, self._secret, up, assign,
                                                register)
            up.close()
            await up.connect(chost, cport)
            up.send(wire.Register(self._name, s.host, my_port, os.getpid(), index, -1, repl_port))
            assign = (await up.recv())[0]
        if isinstance(assign, wire.Stop):
            if promoted is not None:
                promoted.close()
            refused = f"coordinator refused {self._name}: {assign.reason}"
            raise StartAgain(refused) if assign.reason.endswith(REGISTER_AGAIN) else \
                ClusterError(refused)
        if not isinstance(assign, wire.Assign):
            raise ClusterError(f"expected Assign from the coordinator, got {type(assign).__name__}")
        return assign, promoted, None

    async def arrive(self, takeover: wire.Reassign) -> None:
        """A worker that joined a scale-up, its epoch loop running: the gained partitions'
        direct replies and re-runs from their previous owners' cut
        (``StoreMoves.arrive``)."""
        await self._moving.arrive(takeover)

    def _take_slot(self, msg: wire.Reassign) -> wire.Assign:
        """A receiver's slot, from its ``Reassign``."""
        ingress, egress = self._settings.topics(self._app.name)
        me = msg.peers[msg.index] if 0 <= msg.index < len(msg.peers) else ()
        assign = wire.Assign(msg.index, msg.n_workers, msg.peers, len(msg.owners), ingress, egress,
                             self._kafka.group, list(msg.owners), int(me[2]) if len(me) > 2 else 0)
        self._state.adopt(assign)
        return assign

    async def _start_early(self) -> None:
        """The Kafka clients of a worker that is not serving yet (a standby, a rescale's
        receiver)."""
        index = self._state.index
        await self._kafka.start_producer(index)
        await self._kafka.start_consumer(consumer_group(self._settings, self._app.name), index)

    async def _reply_and_log_partitions(
        self, egress: str,
    ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """The egress topic's partitions, and the epoch log's (none when it is off)."""
        out = [TopicPartition(egress, p) for p in await self._kafka.producer.partitions_for(egress)]
        log_topic = self._state.log_topic
        return out, [TopicPartition(log_topic, 0)] if log_topic else []

    async def start_clients(self, assign: wire.Assign) -> None:
        """The worker's Kafka clients for ``assign`` (a promoted standby's are running), and
        where its replies and epoch-log records will land from now on."""
        k, st = self._kafka, self._state
        starting = []  # (at once: a replacement's recovery waits for them)
        if k.producer is None:  # a promoted standby started its clients while standing by
            starting.append(k.start_producer(st.index))
        if k.consumer is None or k.group != assign.group:
            starting.append(k.start_consumer(assign.group, st.index))
        # the slot's reply producer: it fences the slot's earlier processes (never started
        # while standing by, which would fence the live primary)
        starting.append(self._egress.start(st.index))
        await asyncio.gather(*starting)
        # end offsets before assign(): assign() narrows the consumer's metadata to the
        # ingress topic, and an offset lookup of another topic then waits ~0.1 s for a
        # refresh (a promoted standby fetched their metadata while standing by: warm_up)
        out_tps, log_tps = await self._reply_and_log_partitions(assign.egress_topic)
        st.reply_partitions(len(out_tps))
        mine = [TopicPartition(st.ingress_topic, p) for p in st.mine()[:1]]
        ends, _ = await asyncio.gather(k.consumer.end_offsets(out_tps + log_tps),
                                       know_group(k.consumer, mine))  # (for the ingest, next)
        # every reply this worker produces from now on lands above these offsets
        self._egress.acked = {tp.partition: ends[tp] for tp in out_tps}
        if log_tps:
            st.logged(ends[log_tps[0]])

    async def _register_again(self, my_port: int, repl_port: int,
                              timeout: float) -> tuple[wire.Message | None, float]:
        """Connect to the coordinator and register in this worker's slot: its answer (None:
        none) and when the Register left."""
        s, st, up = self._settings, self._state, self._uplink
        await up.connect(*s.coordinator_address(), timeout=timeout)
        sent = ports.current().clock.monotonic()  # (the lease runs on the clock port)
        up.send(wire.Register(self._name, s.host, my_port, os.getpid(), st.index, -1,
                              repl_port, st.engine.epoch if st.engine is not None else 0))
        msgs = await up.recv()
        return (msgs[0] if msgs else None), sent

    async def warm_up(self) -> None:
        """Fetch the metadata of the app's topics into the Kafka clients now: the first offset
        lookup of a topic new to a client waits ~0.1 s for a metadata refresh, which a standby
        would otherwise pay in the middle of its promotion."""
        try:
            egress = self._settings.topics(self._app.name)[1]
            out_tps, log_tps = await self._reply_and_log_partitions(egress)
            await self._kafka.consumer.end_offsets(out_tps + log_tps)
            for tp in log_tps:  # (the recovery's fence record is the producer's first to it)
                await warm_topic(self._kafka.producer, tp.topic)
        except Exception as exc:  # only a head start: the promotion fetches them anyway
            log.info("could not warm up the Kafka metadata: %s", exc)

    async def rejoin(self, my_port: int, repl_port: int) -> bool:
        """Re-register with the restarted coordinator in the same slot; False: give up (the
        process exits and the supervisor starts a fresh one). A coordinator that goes away
        again before it answers (killed while restarting) is waited for again, up to
        :data:`REJOIN_PATIENCE` seconds in all."""
        st, up = self._state, self._uplink
        log.warning("lost the coordinator; keeping the stores and waiting for it to come back",
                    extra={"worker": st.index})
        clock = ports.current().clock  # (the process's: virtual in the simulator)
        deadline = clock.monotonic() + REJOIN_PATIENCE
        while True:
            try:
                a, sent = await self._register_again(my_port, repl_port,
                                                     max(1.0, deadline - clock.monotonic()))
                break
            except (ClusterError, ChannelClosed, OSError) as exc:
                if clock.monotonic() >= deadline:
                    log.error("could not rejoin the coordinator: %s", exc,
                              extra={"worker": st.index})
                    return False
                log.warning("the coordinator went away before it answered (%s): waiting for "
                            "it again", exc, extra={"worker": st.index})
                up.close()
                await asyncio.sleep(0.1)
        try:
            if not (isinstance(a, wire.Assign) and st.same_slot(a)):
                log.error("the restarted coordinator assigned %r, not slot %d of %d: restarting",
                          a, st.index, st.n_workers, extra={"worker": st.index})
                return False
            st.adopt(a)
            if up.lease is not None:  # (the Assign answers the Register: a new lease)
                up.lease.grant(sent)
            self._links.generation = st.generation
            if st.engine is not None and st.engine.epoch > 0:
                # epochs ran here: the restarted coordinator recovers before any epoch
                # begins (``coordinator.service``), and the recovery connects every peer
                # again — a peer gone meanwhile must not fail the rejoin (the faults series,
                # seed 777: a peer killed during the rejoin cost 3.6 s and this process)
                await self._links.connect_reachable(a.peers, st.index, REJOIN_PEER_PATIENCE)
            else:
                await self._links.connect(a.peers, st.index)
            up.send(wire.Ready(st.index))
        except (ClusterError, ChannelClosed, OSError) as exc:
            log.error("could not rejoin the coordinator: %s", exc, extra={"worker": st.index})
            return False
        log.info("rejoined the restarted coordinator as worker %d", st.index,
                 extra={"worker": st.index})
        return True
