"""The coordinator's metrics, and the recent history its status page draws from.

The coordinator counts little itself: epoch phases (:meth:`CoordinatorMetrics.epoch`) and
recoveries (:meth:`CoordinatorMetrics.recovered`). The rest is read when scraped — epochs,
conflicts, members and standbys, snapshot rounds (``RoundKeeper``), channel traffic — or
comes with the workers' heartbeats: each carries the worker's request-latency histogram,
whose counts, summed over the workers and sampled every :data:`SAMPLE_SECONDS`, give the
status page its throughput and p50/p99 over the last minutes. A worker whose process
restarted starts counting from zero: its counts are accumulated across restarts here.

With ``metrics_port`` > 0 the coordinator serves ``/metrics`` and the pages it is given (the
status page ``/`` and its data ``/status.json``, ``coordinator.status``) on
``host:metrics_port``, ``host`` being the one it listens on for workers. Everything read
at scrape time comes from a :class:`~coordinator.snapshot.ClusterSnapshot`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from coordinator.slowview import SlowView
from coordinator.snapshot import ClusterSnapshot, RoundsView
from coordinator.state import Member
from sfaas.runtime import ports, wire
from sfaas.runtime.metrics import (
    LATENCY_BOUNDS,
    PHASE_BOUNDS,
    Buckets,
    Collect,
    HttpServer,
    channel_traffic,
    local_url,
    new_registry,
)
from sfaas.runtime.ports import ClockPort
from sfaas.runtime.protocols.rounds import RoundManifest

log = logging.getLogger("sfaas.coordinator.metrics")

__all__ = ["CoordinatorMetrics", "Page", "SAMPLE_SECONDS", "WINDOW_SECONDS"]

#: Seconds between two samples of the cluster's answered-request counts.
SAMPLE_SECONDS = 2.0
#: How far back the status page looks (seconds).
WINDOW_SECONDS = 300.0
#: Recovery phases as ``last_recovery`` names them → the metric's ``phase`` label.
RECOVERY_PHASES = {"detect+restart": "detect_restart", "restore": "restore", "replay": "replay",
                   "seconds": "total"}

#: A page served beside ``/metrics``: returns its content type and body.
Page = Callable[[], tuple[str, bytes]]


@dataclass
class _Latency:
    """One worker slot's latency counts, kept monotonic across its process's restarts."""

    pid: int = 0
    last: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))
    base: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))

    def update(self, pid: int, counts: list[int]) -> None:
        if pid != self.pid or any(n < o for n, o in zip(counts, self.last, strict=True)):
            # a new process counts from 0
            self.base = [b + o for b, o in zip(self.base, self.last, strict=True)]
        self.pid, self.last = pid, counts

    def total(self) -> list[int]:
        return [b + n for b, n in zip(self.base, self.last, strict=True)]


@dataclass(frozen=True)
class Sample:
    """The cluster's counts at time ``t``: requests answered per slot, latency counts summed."""

    t: float
    answered: dict[int, int]
    latency: list[int]


class CoordinatorMetrics:
    """The metrics and recent history of one coordinator; ``snapshot``: what it looks like
    now; ``clock``: its stamps' and ages' clocks (the process's clock port)."""

    def __init__(self, snapshot: Callable[[], ClusterSnapshot],
                 clock: ClockPort | None = None) -> None:
        self._snapshot = snapshot
        self.clock = clock or ports.current().clock
        self.phases = {"wait": Buckets(PHASE_BOUNDS), "barrier": Buckets(PHASE_BOUNDS)}
        self.recovery_phases = {label: Buckets(PHASE_BOUNDS) for label in RECOVERY_PHASES.values()}
        self.recoveries: collections.deque[dict[str, Any]] = collections.deque(maxlen=20)
        self.recovered_total = 0
        #: replayed requests answered otherwise than before a crash (``wire.Diverged``)
        self.divergences: collections.deque[dict[str, Any]] = collections.deque(maxlen=20)
        self.diverged_total = 0
        self.replayed_epochs_total = 0
        self.round_seconds = Buckets(PHASE_BOUNDS)
        self.uploaded_bytes_total = 0
        self._rounds_seen = 0  # the newest round already in round_seconds
        self.latency: dict[int, _Latency] = {}
        #: the workers' slowest and aborted requests of the last minute (the status page)
        self.slow = SlowView()
        self.samples: collections.deque[Sample] = collections.deque(
            maxlen=int(WINDOW_SECONDS / SAMPLE_SECONDS) + 1)
        self.server: HttpServer | None = None
        self.url = ""
        self._sampler: asyncio.Task[None] | None = None

    # -- told by the coordinator ---------------------------------------------------------------
    def epoch(self, waited: float, barrier: float) -> None:
        """An epoch: ``waited`` seconds for work before its Begin, ``barrier`` seconds from
        Begin until every worker's report was in."""
        self.phases["wait"].observe(waited)
        self.phases["barrier"].observe(barrier)

    def heartbeat(self, m: Member, msg: wire.Heartbeat) -> None:
        """Worker ``m``'s heartbeat; its latency counts are taken if well-formed."""
        self.slow.heartbeat(m.index, msg)
        counts = msg.latency
        if (not isinstance(counts, list) or len(counts) != len(LATENCY_BOUNDS) + 1
                or not all(type(n) is int and n >= 0 for n in counts)):
            if counts:
                log.debug("worker %d sent malformed latency counts; ignored", m.index)
            return
        self.latency.setdefault(m.index, _Latency()).update(m.pid, counts)

    def diverged(self, msg: wire.Diverged) -> None:
        """A worker's replay answered a request otherwise than before the crash."""
        self.diverged_total += 1
        self.divergences.append({"time": self.clock.time(), "worker": msg.index, "rid": msg.rid,
                                 "function": f"{msg.operator}.{msg.function}", "key": msg.key,
                                 "before": msg.before, "after": msg.after})
        log.error("worker %d's replay diverged: %s.%s on key %r (request %s) replied %s before "
                  "the crash and %s in the replay: the function is not deterministic (or the "
                  "app's code changed since the epoch was logged)",
                  msg.index, msg.operator, msg.function, msg.key, msg.rid, msg.before, msg.after)

    def recovered(self, info: dict[str, Any]) -> None:
        """A recovery finished (``ClusterState.last_recovery``)."""
        self.recovered_total += 1
        self.replayed_epochs_total += int(info.get("epochs_replayed", 0))
        for key, label in RECOVERY_PHASES.items():
            if key in info:
                self.recovery_phases[label].observe(float(info[key]))
        self.recoveries.append({"finished": self.clock.time(), **info})

    # -- the server ----------------------------------------------------------------------------
    async def start(self, host: str, port: int, pages: dict[str, Page]) -> None:
        """Serve ``/metrics`` and ``pages`` (path → page) on ``host:port`` (0: nothing)."""
        if not port:
            return
        registry = new_registry()
        registry.register(Collect(self.collect))
        self.server = HttpServer(registry, pages)
        bound = await self.server.start(host, port)
        self.url = local_url(host, bound)
        self._sampler = asyncio.get_running_loop().create_task(self._sample_every(),
                                                               name="metrics-sampler")
        log.info("status page %s, metrics %smetrics", self.url, self.url)

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
        if self.server is not None:
            await self.server.close()

    async def _sample_every(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_SECONDS)

    def current(self) -> Sample:
        """The cluster's counts now."""
        merged = [0] * (len(LATENCY_BOUNDS) + 1)
        answered = {}
        for slot, lat in self.latency.items():
            total = lat.total()
            answered[slot] = sum(total)
            merged = [a + b for a, b in zip(merged, total, strict=True)]
        return Sample(self.clock.time(), answered, merged)

    def sample(self) -> None:
        """Record the cluster's counts now (and take new rounds into their histogram)."""
        self.samples.append(self.current())
        self._take_rounds(self._snapshot().rounds)

    def _take_rounds(self, rounds: RoundsView) -> None:
        for m in rounds.history:
            if m.round > self._rounds_seen:
                self.round_seconds.observe(max(0.0, m.created - m.started))
                self.uploaded_bytes_total += m.bytes_uploaded
                self._rounds_seen = m.round

    # -- read at scrape time -------------------------------------------------------------------
    def collect(self) -> Iterator[Any]:
        c = self._snapshot()
        info = GaugeMetricFamily("sfaas_coordinator_info", "This coordinator",
                                 labels=["app", "namespace"])
        info.add_metric([c.app, c.namespace], 1)
        yield info
        yield CounterMetricFamily("sfaas_epochs", "Epochs committed", value=c.stats.epochs)
        yield CounterMetricFamily("sfaas_epoch_transactions",
                                  "Root transactions run in epochs (re-runs included)",
                                  value=c.stats.txns)
        yield CounterMetricFamily("sfaas_epoch_conflicts",
                                  "Transactions that conflicted and re-run",
                                  value=c.stats.conflicts)
        ph = HistogramMetricFamily(
            "sfaas_epoch_phase_seconds",
            "Epoch phases: waiting for work, Begin until every worker reported", labels=["phase"])
        for phase, b in self.phases.items():
            b.add_to(ph, [phase])
        yield ph
        yield from self._members(c)
        yield from self._rounds(c.rounds)
        yield CounterMetricFamily("sfaas_recoveries", "Recoveries completed",
                                  value=self.recovered_total)
        yield CounterMetricFamily("sfaas_replay_divergences",
                                  "Requests a recovery's replay answered otherwise than before "
                                  "the crash (a function that is not deterministic)",
                                  value=self.diverged_total)
        yield GaugeMetricFamily("sfaas_recovery_stopped",
                                "1: recovery failed the same way 3 times in a row and stopped "
                                "retrying (the status page says why)",
                                value=1 if c.recovery_stopped else 0)
        yield CounterMetricFamily("sfaas_recovery_attempts",
                                  "Recovery attempts (a loss during one starts another)",
                                  value=c.recoveries)
        yield CounterMetricFamily("sfaas_recovery_replayed_epochs",
                                  "Epochs replayed from the epoch log",
                                  value=self.replayed_epochs_total)
        rp = HistogramMetricFamily("sfaas_recovery_phase_seconds",
                                   "Duration of the phases of completed recoveries",
                                   labels=["phase"])
        for phase, b in self.recovery_phases.items():
            b.add_to(rp, [phase])
        yield rp
        q = GaugeMetricFamily("sfaas_queue_depth", "Items waiting in the coordinator's queues",
                              labels=["queue"])
        q.add_metric(["inbox"], c.inbox)
        yield q
        yield from channel_traffic()

    def _members(self, c: ClusterSnapshot) -> Iterator[Any]:
        now = self.clock.monotonic()
        up = GaugeMetricFamily("sfaas_worker_up", "1 while the worker in a slot is alive and ready",
                               labels=["worker"])
        age = GaugeMetricFamily("sfaas_worker_heartbeat_age_seconds",
                                "Seconds since a worker was last heard from", labels=["worker"])
        for m in c.members:
            up.add_metric([str(m.index)], int(m.alive and m.ready))
            age.add_metric([str(m.index)], max(0.0, now - m.last_seen))
        yield up
        yield age
        sb = GaugeMetricFamily("sfaas_standbys", "Standby workers following a slot's primary",
                               labels=["worker"])
        for slot, count in sorted(c.standby_counts.items()):
            sb.add_metric([str(slot)], count)
        yield sb
        yield CounterMetricFamily("sfaas_standby_promotions",
                                  "Standbys promoted to take over a lost primary",
                                  value=c.promotions)

    def _rounds(self, rounds: RoundsView) -> Iterator[Any]:
        self._take_rounds(rounds)
        yield CounterMetricFamily("sfaas_snapshot_rounds_completed", "Snapshot rounds published",
                                  value=rounds.completed)
        yield CounterMetricFamily("sfaas_snapshot_rounds_failed",
                                  "Snapshot rounds that failed (retried next interval)",
                                  value=rounds.failed)
        h = HistogramMetricFamily("sfaas_snapshot_round_seconds",
                                  "From a round's marker to its manifest published")
        self.round_seconds.add_to(h)
        yield h
        yield CounterMetricFamily("sfaas_snapshot_uploaded_bytes",
                                  "Bytes the stores uploaded for published rounds",
                                  value=self.uploaded_bytes_total)
        last = rounds.last_complete  # (before the first round the gauges have no sample)
        gauges: tuple[tuple[str, Callable[[RoundManifest], float], str], ...] = (
            ("sfaas_snapshot_last_round", lambda m: m.round, "Id of the newest complete round"),
            ("sfaas_snapshot_last_bytes", lambda m: m.total_bytes,
             "Bytes of state in the newest complete round"),
            ("sfaas_snapshot_last_files", lambda m: m.files, "Files of the newest complete round"),
            ("sfaas_snapshot_last_complete_timestamp_seconds", lambda m: m.created,
             "Unix time the newest complete round was published"),
            ("sfaas_snapshot_last_complete_age_seconds",
             lambda m: max(0.0, self.clock.time() - m.created),
             "Seconds since the newest complete round was published"),
        )
        for name, value, doc in gauges:
            g = GaugeMetricFamily(name, doc, labels=[])
            if last is not None:
                g.add_metric([], value(last))
            yield g
        per_op = GaugeMetricFamily("sfaas_operator_state_bytes",
                                   "An operator's state in the newest complete round",
                                   labels=["operator"])
        for op, nbytes in sorted(operator_bytes(last).items() if last is not None else ()):
            per_op.add_metric([op], nbytes)
        yield per_op


def operator_bytes(manifest: RoundManifest) -> dict[str, int]:
    """Bytes of each operator's state in a round manifest."""
    out: dict[str, int] = {}
    for st in manifest.stores:
        out[st.operator] = out.get(st.operator, 0) + st.total_bytes
    return out
