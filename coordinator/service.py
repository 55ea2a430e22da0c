"""The coordinator process: membership, partition assignment, heartbeats, the epoch barrier.

It creates the app's ingress/egress topics, waits for ``workers`` workers to register,
assigns each an index (ingress partition ``p`` and the keys hashing to it belong to worker
``p % n``), and then drives epochs eagerly (``coordinator.epochs``) or leases them to the
workers (``coordinator.protocols.lease``); every ``snapshot_interval`` seconds a Commit
carries a snapshot round's marker (``coordinator.protocols.rounds``), and a lost worker
makes the cluster recover (``coordinator.protocols.recovery``).

:class:`Coordinator` only wires the parts — each takes the few others it needs, through
the ports ``coordinator.needs`` declares — and is the root service
(``sfaas.runtime.lifecycle``): its parts with a lifetime are services it requires, started
in dependency order (topics → snapshot rounds → metrics → listener → workers → watchdog)
and stopped in reverse. The cluster view they share is ``coordinator.state``.
"""

from __future__ import annotations

import asyncio
import logging

from coordinator import traces
from coordinator.barrier import Barrier
from coordinator.boundary import Boundary
from coordinator.bulletin import Bulletin
from coordinator.epochs import EagerEpochs, until_interrupted
from coordinator.gathering import Gathering
from coordinator.inbox import Inbox
from coordinator.listener import Listener
from coordinator.membership import Membership
from coordinator.metrics import CoordinatorMetrics
from coordinator.protocols.lease import LeasedEpochs
from coordinator.protocols.reads import Placements
from coordinator.protocols.recovery import Recovery
from coordinator.protocols.rescale import Rescaler
from coordinator.protocols.rounds import RoundKeeper
from coordinator.protocols.standby import Standbys
from coordinator.ready_file import ReadyFile
from coordinator.snapshot import ClusterSnapshot, take
from coordinator.startup import Startup
from coordinator.state import ClusterState
from coordinator.status import StatusServer
from coordinator.watchdog import Watchdog
from remotes import Remote
from sfaas.errors import ClusterError, RecoveryStopped
from sfaas.runtime.kafka import consumer_group, silence_limit
from sfaas.runtime.lifecycle import Service
from sfaas.runtime.ports import Ports
from sfaas.runtime.ports import current as current_ports
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import rounds_remote, store_remote

log = logging.getLogger("sfaas.coordinator")

__all__ = ["Coordinator", "run_coordinator"]


class Coordinator(Service):
    """See the module docstring."""

    part = "coordinator"

    def __init__(self, settings: Settings, app_name: str, ports: Ports | None = None) -> None:
        """``ports``: where the process gets its outside world (``sfaas.runtime.ports``;
        the process's — :data:`~sfaas.runtime.ports.REAL` in production — when None)."""
        s = self.settings = settings
        self.app_name = app_name
        self.ports = ports or current_ports()
        traces.configure(s.namespace, s.trace_slow)
        self.state = ClusterState(s.workers)
        self.inbox = Inbox()
        self.startup = Startup(s, app_name, self.state, self._rounds_remote,
                               kafka=self.ports.kafka, clock=self.ports.clock)
        self.ready_file = ReadyFile(s.ready_file, self.snapshot)
        self.rounds = RoundKeeper(s.snapshot_interval, s.snapshot_retain, self.state.layout,
                                  self._rounds_remote, self._store_remote, clock=self.ports.clock)
        self.metrics = CoordinatorMetrics(self.snapshot, self.ports.clock)
        self.bulletin = Bulletin(self.metrics, self.rounds, self.ready_file)
        self.standbys = Standbys(self.state, s.workers, s.standbys, self.rounds, self.bulletin,
                                 silent_after=s.heartbeat_timeout,
                                 clock=self.ports.clock.monotonic)
        self.rescale = Rescaler(self.state, self.rounds, self, self.bulletin,
                                rounds_on=s.snapshot_interval > 0, standbys=s.standbys,
                                followers=self.standbys, clock=self.ports.clock.monotonic)
        self.placements = Placements(self.state, app_name, self.rescale)
        ingress, egress = s.topics(app_name)
        self.membership = Membership(self.state, self.inbox, self.standbys, self.rescale,
                                     self.bulletin,
                                     topics=(ingress, egress, consumer_group(s, app_name)))
        host, port = s.coordinator_address()
        self.listener = Listener(host, port, s.shared_secret(), app_name, self.state,
                                 self.membership, self.rescale, self.placements)
        self.watchdog = Watchdog(self.state, self.standbys, self.membership,
                                 heartbeat_timeout=s.heartbeat_timeout,
                                 kafka_silence_limit=silence_limit(s.kafka, s.heartbeat_timeout))
        self.barrier = Barrier(self.inbox, self.state, self.membership)
        self.boundary = Boundary(self.rounds, self.rescale)
        self.epochs: EagerEpochs | LeasedEpochs = (
            LeasedEpochs(s.epoch_lease, self.state, self.inbox, self.membership, self.boundary,
                         self.metrics, self.ports.clock) if s.epoch_lease > 0 else
            EagerEpochs(self.state, self.inbox, self.barrier, self.membership, self.boundary,
                        self.metrics, Gathering(s.epoch_gather, s.epoch_gather_adaptive),
                        self.ports.clock))
        self.recovery = Recovery(self.state, self.inbox, self.barrier, self._rounds_remote,
                                 self.bulletin, self.rounds.known_latest)
        # what runs before what: workers register once the layout is known, the watchdog
        # watches a formed cluster
        self.listener.requires(self.startup)
        self.membership.requires(self.listener)
        self.watchdog.requires(self.membership)
        self.requires(self.startup, self.rounds,
                      StatusServer(self.metrics, self.snapshot, host, s.metrics_port),
                      self.listener, self.membership, self.watchdog)

    # -- lifecycle -----------------------------------------------------------------------------
    async def run(self, ready: asyncio.Future[tuple[str, int]] | None = None) -> None:
        """Serve until stopped (cancelled); recover from every lost worker. ``ready`` gets
        the address workers register at, once the coordinator listens."""
        self.listener.announce(ready)
        try:
            await self.start()
            await self._serve()
        finally:
            await self.stop()

    async def on_start(self) -> None:
        """Every part runs and every worker is ready: the ready file says so from now on."""
        self.ready_file.open(*self.listener.address)

    async def _serve(self) -> None:
        try:
            await self._epochs_and_recoveries()
        except RecoveryStopped as stop:
            await self._stay_stopped(stop)

    async def _epochs_and_recoveries(self) -> None:
        # the first epoch at once: workers serve reads and calls from their first epoch on,
        # and ``sfaas up`` waits until they do (an idle cluster then waits for work)
        idle = False
        if self.startup.resumed or (self.settings.snapshot_interval > 0 and self.state.epoch > 0):
            # a restarted coordinator: every worker rolls back to the newest round and the
            # epoch log after it is replayed (with an empty log nothing ever ran here, so a
            # new cluster starts at once, even while MinIO is down) — also when the log is
            # empty but the rejoining workers began epochs (an epoch with no batch logged
            # may still wait for its Commit on them)
            await self._recover()
        while True:
            await until_interrupted(self.epochs.run(idle), self.inbox)
            if self.settings.snapshot_interval <= 0:
                raise ClusterError("lost a worker and snapshot rounds are off "
                                   "(snapshot_interval=0): recovery needs them; stopping")
            await self._recover()
            idle = False  # recovered work may be waiting: begin at once

    async def _recover(self) -> None:
        self.ready_file.write()  # (``recovering``: ``sfaas up`` waits for it to end)
        await self.recovery.run()

    async def _stay_stopped(self, stop: RecoveryStopped) -> None:
        """Recovery gave up: say why in the log, the ready file (``sfaas up``, ``sfaas ps``)
        and on the status page, which stays served; run no epoch; exit with the reason
        (and :data:`~sfaas.errors.EXIT_RECOVERY_STOPPED`) when stopped."""
        log.critical("%s — not retrying: fix the cause, then restart the cluster", stop)
        self.ready_file.write()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise stop from None

    # -- what the parts are given --------------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        """What the coordinator looks like now (for the metrics, status page, ready file)."""
        s = self.settings
        return take(self.app_name, s.namespace, s.heartbeat_timeout,
                             (s.secret, s.minio_secret_key, s.minio_access_key), self.state,
                             self.standbys, self.rescale, self.rounds, self.inbox.qsize(),
                             s.jaeger_ui)

    def wake(self) -> None:
        """Begin an epoch soon even if no worker has work (an idle cluster must reach the
        epoch boundary a rescale switches at)."""
        self.inbox.wake()
        if self.settings.epoch_lease:
            self.inbox.tick()

    def force_recovery(self, why: str) -> None:
        """Stop the epochs and recover although no worker was lost."""
        log.warning("recovering: %s", why)
        self.rounds.abort(why)
        self.inbox.interrupt()

    def _rounds_remote(self) -> Remote:
        return rounds_remote(self.settings, self.app_name, objects=self.ports.objects)

    def _store_remote(self, operator: str, partition: int) -> Remote:
        return store_remote(self.settings, self.app_name, operator, partition,
                            objects=self.ports.objects)


async def run_coordinator(settings: Settings, app_name: str, ports: Ports | None = None) -> None:
    """Run a coordinator for ``app_name`` until cancelled or a worker is lost."""
    await Coordinator(settings, app_name, ports).run()
