"""A worker's metrics: what it counts as epochs commit, and what it reads when scraped.

Per epoch the worker calls :meth:`WorkerMetrics.executed` (its roots ran) and
:meth:`WorkerMetrics.committed` (the epoch's fates are decided and their replies queued):
that counts committed and aborted transactions, measures each request's latency — from
the client's send time (the ingress record's timestamp) to its reply handed to the
producer — and the two phases. Everything else (re-runs, fallbacks, queue depths, ingress
lag, store sizes, snapshot reports, channel traffic) is read from the worker's own state
at scrape time (:meth:`WorkerMetrics.collect`). The latency counts also ride every
heartbeat to the coordinator (its status page's p50/p99).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from sfaas.runtime import ports
from sfaas.runtime.metrics import (
    LATENCY_BOUNDS,
    PHASE_BOUNDS,
    Buckets,
    Collect,
    HttpServer,
    channel_traffic,
    new_registry,
)
from sfaas.runtime.settings import Settings
from statestores import background
from worker.clients import KafkaClients
from worker.egress import Egress
from worker.ingress import Ingress
from worker.links import CoordinatorLink, PeerLinks
from worker.state import WorkerState

if TYPE_CHECKING:
    from sfaas.runtime.txn.loop import Fate
    from statestores import Store

log = logging.getLogger("sfaas.worker.metrics")

__all__ = ["WorkerMetrics", "store_metrics"]


_WORLD_GAUGES = (
    ("effects_running", "ctx.run effects running on this worker now"),
    ("parked", "Transactions parked here until their ctx.run effect finishes"),
    ("actions_pending", "Post-commit actions committed here and not done yet"),
    ("timers", "Durable timers of this worker's partitions not delivered yet"),
)
_WORLD_COUNTERS = (
    ("effects_started", "ctx.run effects this worker started"),
    ("effects_failed", "ctx.run effects that raised or timed out (journaled as exceptions)"),
    ("actions_ran", "Post-commit actions that ran to the end on this worker"),
    ("action_tries_failed", "Tries of post-commit actions that raised (retried with backoff)"),
    ("timers_fired", "Durable timers this worker took to deliver"),
)


_DIRECT_GAUGES = (
    ("calls_pending", "Direct calls taken and not yet answered"),
    ("replies_kept", "Replies to direct calls kept until their clients acknowledge them"),
)
_DIRECT_COUNTERS = (
    ("calls_taken", "Direct calls this worker took to run"),
    ("calls_copies", "Copies of direct calls already known (a client resending): never run again"),
    ("calls_turned_away", "Direct calls answered NotHere (another owner, a recovery under way)"),
    ("answers_sent", "Answers sent to direct calls"),
)


class WorkerMetrics:
    """The metrics of one worker (see module docstring): counted as epochs go, and read
    from its ``state`` and parts when scraped."""

    def __init__(
        self, settings: Settings, app_name: str, name: str, state: WorkerState, *, ingress: Ingress,
        egress: Egress, links: PeerLinks, uplink: CoordinatorLink, kafka: KafkaClients,
        parts: Mapping[str, Callable[[], dict[str, float]]] | None = None,
    ) -> None:
        self._settings = settings
        self._app_name = app_name
        self._name = name
        self._state = state
        self._ingress = ingress
        self._egress = egress
        self._links = links
        self._uplink = uplink
        self._kafka = kafka
        #: the counters of parts by name: "world" (``worker.world.World.gauges``), "direct"
        #: (``worker.direct.DirectIngress.counters``), "rounds"
        #: (``worker.protocols.rounds.RoundTaker.counters``), "calls"
        #: (``worker.calls.PeerCalls.gauges``)
        self._parts = dict(parts or {})
        self.latency = Buckets(LATENCY_BOUNDS)
        self.phases = {"execute": Buckets(PHASE_BOUNDS), "commit": Buckets(PHASE_BOUNDS)}
        self.committed_total = 0
        self.aborted_total = 0
        # re-runs and fallbacks are the epoch loop's counters; a recovery starts a new
        # loop, so they are summed here epoch by epoch
        self.reruns_total = 0
        self.fallbacks_total = 0
        #: replayed requests whose reply differed from the one already out (``Diverged``)
        self.divergences_total = 0
        self._loop: Any = None  # the loop last counted (a reference: ids are reused) and its counts
        self._loop_counts = (0, 0)
        self.server: HttpServer | None = None
        self._age_sum = 0.0
        self._age_n = 0

    # -- counted as epochs go --------------------------------------------------------------------
    def executed(self, started: float) -> None:
        """This worker's roots of an epoch finished (``started``: ``perf_counter`` at Begin)."""
        self.phases["execute"].observe(time.perf_counter() - started)

    def committed(self, fates: Iterable[Fate[Any]], answered: Container[str],
                  started: float) -> None:
        """An epoch's ``fates`` are decided and their replies queued (``started``:
        ``perf_counter`` when its Commit arrived). Replays of requests whose replies are
        already out (``answered``) are not counted again."""
        now = ports.current().clock.time()
        observe = self.latency.observe
        for f in fates:
            req = f.item.request
            if req.rid in answered:
                continue
            if f.committed:
                self.committed_total += 1
            else:
                self.aborted_total += 1
            if req.sent_at > 0:  # (a client that sent no time: no latency to tell)
                observe(max(0.0, now - req.sent_at))
        loop = self._state.loop
        if loop is not None:
            reruns, fallbacks = self._loop_counts if loop is self._loop else (0, 0)
            self.reruns_total += loop.reruns - reruns
            self.fallbacks_total += loop.fallbacks - fallbacks
            self._loop, self._loop_counts = loop, (loop.reruns, loop.fallbacks)
        self.phases["commit"].observe(time.perf_counter() - started)

    def aged(self, age: float) -> None:
        """A request waited ``age`` seconds before its first epoch began."""
        self._age_sum += age
        self._age_n += 1

    def mean_age(self) -> float | None:
        """The mean of the ages since :meth:`reset_ages` (None: none)."""
        return self._age_sum / self._age_n if self._age_n else None

    def reset_ages(self) -> None:
        self._age_sum, self._age_n = 0.0, 0

    def heartbeat_latency(self) -> list[int]:
        """The latency histogram's counts (for ``wire.Heartbeat.latency``)."""
        return list(self.latency.counts)

    # -- the server ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve ``/metrics`` on ``host:metrics_port`` (nothing when the port is 0)."""
        s = self._settings
        if not s.metrics_port:
            return
        registry = new_registry()
        registry.register(Collect(self.collect))
        self.server = HttpServer(registry)
        port = await self.server.start(s.host, s.metrics_port)
        log.info("metrics on http://%s:%d/metrics", s.host, port)

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    # -- read at scrape time -------------------------------------------------------------------
    def collect(self) -> Iterator[Any]:
        st = self._state
        info = GaugeMetricFamily("sfaas_worker_info",
                                 "This worker process: its slot (-1: none, as a standby or while "
                                 "joining) and name", labels=["app", "index", "name"])
        info.add_metric([self._app_name, str(st.index), self._name], 1)
        yield info
        for name, value, doc in (
            ("sfaas_transactions_committed", self.committed_total,
             "Transactions committed (replies produced)"),
            ("sfaas_transactions_aborted", self.aborted_total,
             "Transactions rolled back for good (Abort or an exception in a function)"),
            ("sfaas_transactions_rerun", self.reruns_total,
             "Transactions re-run in a later epoch after a conflict"),
            ("sfaas_transactions_fallback", self.fallbacks_total,
             "Conflicting transactions re-run in the epoch's fallback phase"),
            ("sfaas_replay_divergences", self.divergences_total,
             "Requests a recovery's replay answered otherwise than before the crash (a "
             "function that is not deterministic)"),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        lat = HistogramMetricFamily("sfaas_request_latency_seconds",
                                    "From the client's send (ingress record timestamp) to the "
                                    "reply produced")
        self.latency.add_to(lat)
        yield lat
        ph = HistogramMetricFamily("sfaas_epoch_phase_seconds",
                                   "Duration of epoch phases on this worker", labels=["phase"])
        for phase, b in self.phases.items():
            b.add_to(ph, [phase])
        yield ph
        yield from self._queues()
        yield from self._world_metrics()
        yield from self._direct_metrics()
        yield from self._ingress_lag()
        yield from store_metrics(st.engine.stores if st.engine is not None else {})
        rounds = self._parts.get("rounds", dict)()
        if st.engine is not None and rounds:  # (the rounds begin with the engine)
            yield CounterMetricFamily("sfaas_worker_snapshots",
                                      "Snapshot rounds this worker took part in",
                                      value=rounds["taken"])
            yield CounterMetricFamily("sfaas_worker_snapshots_failed",
                                      "Snapshot rounds this worker's part failed",
                                      value=rounds["failed"])
        yield CounterMetricFamily("sfaas_worker_recoveries",
                                  "Recoveries this worker rolled back for", value=st.recovery)
        yield CounterMetricFamily("sfaas_worker_producer_renewals",
                                  "Kafka producers this worker replaced after they got stuck "
                                  "(OutOfOrderSequenceNumber and the like) or a reply "
                                  "transaction failed",
                                  value=self._kafka.producer_renewals + self._egress.renewals)
        yield CounterMetricFamily("sfaas_worker_reply_transactions",
                                  "Kafka transactions of replies this worker committed",
                                  value=self._egress.transactions)
        yield from channel_traffic()

    def _direct_metrics(self) -> Iterator[Any]:
        """Direct calls (``worker.direct``)."""
        d = self._parts.get("direct", dict)()
        if not d:
            return
        for name, doc in _DIRECT_GAUGES:
            yield GaugeMetricFamily(f"sfaas_direct_{name}", doc, value=d[name])
        for name, doc in _DIRECT_COUNTERS:
            yield CounterMetricFamily(f"sfaas_direct_{name}", doc, value=d[name])

    def _world_metrics(self) -> Iterator[Any]:
        """Effects, post-commit actions and timers (``worker.world``)."""
        w = self._parts.get("world", dict)()
        if not w:
            return
        for name, doc in _WORLD_GAUGES:
            yield GaugeMetricFamily(f"sfaas_{name}", doc, value=w[name])
        for name, doc in _WORLD_COUNTERS:
            yield CounterMetricFamily(f"sfaas_{name}", doc, value=w[name])

    def _queues(self) -> Iterator[Any]:
        st = self._state
        q = GaugeMetricFamily("sfaas_queue_depth", "Items waiting in the worker's queues",
                              labels=["queue"])
        loop = st.loop
        q.add_metric(["ingress"], len(loop.queue) if loop is not None else 0)
        q.add_metric(["rerun"], loop.sequencer.pending_retries if loop is not None else 0)
        q.add_metric(["egress"], len(self._egress.replies))
        q.add_metric(["deferred_calls"], self._parts.get("calls", dict)().get("deferred_calls", 0))
        yield q
        yield GaugeMetricFamily("sfaas_worker_in_flight_requests",
                                "Requests taken from Kafka and not completed (bounded by the "
                                "in-flight limit)",
                                value=st.offsets.in_flight)
        yield GaugeMetricFamily("sfaas_worker_in_flight_limit",
                                "The worker's in-flight limit (requests)",
                                value=self._ingress.limit)
        yield CounterMetricFamily("sfaas_worker_ingest_stalls",
                                  "Times ingest stopped fetching at the in-flight limit",
                                  value=self._ingress.stalls)
        buf = GaugeMetricFamily("sfaas_channel_buffered_bytes",
                                "Bytes written to a channel, not yet sent by the OS",
                                labels=["peer"])
        for j, ch in sorted(self._links.channels.items()):
            buf.add_metric([f"worker-{j}"], ch.buffered())
        coord = self._uplink.buffered()
        if coord is not None:
            buf.add_metric(["coordinator"], coord)
        yield buf

    def _ingress_lag(self) -> Iterator[Any]:
        st = self._state
        lag = GaugeMetricFamily("sfaas_ingress_lag_records",
                                "Ingress records not yet answered: the partition's end minus the "
                                "completed offset",
                                labels=["partition"])
        consumer = self._kafka.consumer
        if st.assigned.is_set() and consumer is not None:
            done = st.offsets.watermarks()
            # (the partitions it owns now)
            for tp in sorted(consumer.assignment(), key=lambda tp: tp.partition):
                high = consumer.highwater(tp)
                mark = done.get(tp.partition, st.start_offsets.get(tp.partition))
                if high is not None and mark is not None:
                    lag.add_metric([str(tp.partition)], max(0, high - mark))
        yield lag


def store_metrics(stores: Mapping[tuple[str, int], Store]) -> Iterator[Any]:
    """The gauges and counters of each store of ``stores``, and the stores' background CPU."""
    labels = ["operator", "partition", "engine"]
    keys = GaugeMetricFamily("sfaas_store_keys",
                             "Keys in a store (LSM: an upper bound, before merges)", labels=labels)
    disk = GaugeMetricFamily("sfaas_store_disk_bytes", "Bytes of a store's files on local disk",
                             labels=labels)
    mem = GaugeMetricFamily("sfaas_store_memory_bytes",
                            "Memory a store holds (memtable, index, tail)", labels=labels)
    files = GaugeMetricFamily("sfaas_store_files", "A store's data files per level",
                              labels=[*labels, "level"])
    merges = CounterMetricFamily("sfaas_store_merges", "Merges a store completed", labels=labels)
    flushes = CounterMetricFamily("sfaas_store_flushes", "Flushes a store completed", labels=labels)
    for (op, p), store in sorted(stores.items()):
        try:
            st = store.stats()
        except Exception as exc:  # closed during a promotion or shutdown
            log.debug("no stats of %s/p%d: %s", op, p, exc)
            continue
        lv = [op, str(p), str(st.get("engine", ""))]
        keys.add_metric(lv, st.get("keys", st.get("entries_upper_bound", 0)))
        disk.add_metric(lv, st.get("disk_bytes", 0))
        mem.add_metric(lv, st.get("memory_bytes", st.get("data_bytes", 0)))
        for level, n in sorted((st.get("files_per_level") or {}).items()):
            # (lsm: the names)
            files.add_metric([*lv, str(level)], n if isinstance(n, int) else len(n))
        merges.add_metric(lv, st.get("merges_done", 0))
        flushes.add_metric(lv, st.get("flushes", st.get("dumps", 0)))
    yield from (keys, disk, mem, files, merges, flushes)
    cpu = CounterMetricFamily("sfaas_store_background_cpu_seconds",
                              "CPU of the stores' background work (flushes, merges, uploads) in "
                              "this process",
                              labels=["lane"])
    for lane, secs in sorted(background.cpu_seconds().items()):
        cpu.add_metric([lane], secs)
    yield cpu
