"""A worker's heartbeats: it lives, it reaches Kafka, and its lease from the coordinator.

Every quarter of ``heartbeat_timeout`` the worker tells the coordinator it lives (the first
beat at once: its answer starts the lease, ``worker.fence``), with how far its epochs got
and whether it reaches a Kafka broker; it leaves when the lease is past saving (or, when
the coordinator stood still while this process ran, leaves the coordinator's channel to
rejoin it: ``worker.fence``), and logs the epochs' counters now and then.
"""

from __future__ import annotations

import asyncio
import logging

from sfaas.runtime import ports, wire
from sfaas.runtime.kafka import Reachability, silence_limit
from sfaas.runtime.settings import Settings
from worker.fence import LEASE_FRACTION, FenceLease
from worker.links import CoordinatorLink
from worker.needs import Latency, SlowView
from worker.state import WorkerState

log = logging.getLogger("sfaas.worker")

__all__ = ["Heartbeat"]


class Heartbeat:
    """This worker's heartbeats (see the module docstring)."""

    def __init__(self, settings: Settings, state: WorkerState, uplink: CoordinatorLink,
                 metrics: Latency, fence: FenceLease | None = None,
                 slow: SlowView | None = None) -> None:
        self._settings = settings
        self._state = state
        self._uplink = uplink
        self._metrics = metrics
        #: the coordinator's lease on this process (``worker.fence``)
        self._fence = fence
        #: the slowest and aborted requests of the last minute (the status page's view)
        self._slow = slow
        #: whether this process reaches any Kafka broker (its heartbeats say so)
        self._reach = Reachability(settings.kafka)
        self._probe: asyncio.Future[None] | None = None
        #: the coordinator was told at once that this worker is cut from Kafka
        self._told_cut = False

    def _beat(self) -> None:
        """Send one heartbeat (while the coordinator restarts, nobody listens: none)."""
        lp = self._state.loop
        if lp is None or self._uplink.closed:
            return
        self._uplink.send(wire.Heartbeat(
            self._state.index, lp.committed, self._metrics.heartbeat_latency(),
            ports.current().clock.monotonic(), self._reach.silence(), *self._slow_fields()))

    def _probed(self, probe: asyncio.Future[None]) -> None:
        """(the loop's callback) A probe that finds this worker newly cut from Kafka is
        told at once, not at the next beat: the coordinator replaces a cut worker, and
        each step of the wait is a gap in its partitions' replies."""
        if probe.cancelled() or probe.exception() is not None:
            return
        cut = bool(self.cut_from_kafka())
        if cut and not self._told_cut:
            self._beat()
        self._told_cut = cut

    def cut_from_kafka(self) -> str:
        """Why this process counts as cut from Kafka ("" if it does not): no broker answered
        its probes for the coordinator's limit (``sfaas.runtime.kafka.silence_limit``)."""
        silent = self._reach.silence()
        limit = silence_limit(self._settings.kafka, self._settings.heartbeat_timeout)
        return f"no Kafka broker answered for {silent:.1f} s" if silent > limit else ""

    def _leave_silent(self, fence: FenceLease) -> None:
        """The coordinator stands still while this process runs: close its channel, so the
        worker rejoins it (``worker.service.Worker._follow``) instead of leaving."""
        if fence.coordinator_silent():
            log.warning("no word from the coordinator for %.1f s while this worker ran: "
                        "leaving its channel to rejoin it", fence.expired_for()
                        + self._settings.heartbeat_timeout * LEASE_FRACTION,
                        extra={"worker": self._state.index})
            self._uplink.close()

    def _slow_fields(self) -> tuple[list[wire.SlowRequest], bool]:
        """``Heartbeat.slow`` and ``slow_fresh``: the view if it changed since the last beat."""
        view = None if self._slow is None else self._slow.fresh(ports.current().clock.time())
        return ([], False) if view is None else (view, True)

    async def run(self) -> None:
        """Tell the coordinator this worker lives, every quarter of its timeout (the first
        at once: its answer starts the lease); leave when the lease is past saving
        (``worker.fence``); log the epochs' counters now and then."""
        beat = self._settings.heartbeat_timeout / 4
        clock = ports.current().clock  # (the process's: virtual in the simulator)
        last_log = clock.monotonic()
        fence = self._fence
        if fence is not None:
            # assigned and not yet ready: the coordinator loses it only with its channel
            # (or after STARTUP_TIMEOUT), so the lease starts now
            fence.start(clock.monotonic())
        while True:
            lp = self._state.loop
            assert lp is not None
            self._beat()
            self._probe = asyncio.ensure_future(self._reach.probe())  # (one broker, in turn)
            self._probe.add_done_callback(self._probed)
            await asyncio.sleep(beat)
            if fence is not None:
                fence.tick()  # (this process runs: a long gap before it was a pause of its own)
                if not fence.valid():
                    await asyncio.sleep(0.05)  # (answers waiting in the socket are read first)
                    fence.check()
                    self._leave_silent(fence)
            age = self._metrics.mean_age()
            if age is not None and clock.monotonic() - last_log >= 5.0:
                last_log = clock.monotonic()
                log.info("epochs=%d committed=%d reruns=%d fallbacks=%d mean request age at epoch "
                         "start %.1f ms", lp.epochs, lp.committed, lp.reruns, lp.fallbacks,
                         1000 * age)
                self._metrics.reset_ages()
