"""The coordinator's side of snapshot rounds (see :mod:`sfaas.runtime.protocols.rounds`).

Every ``snapshot_interval`` seconds, if transactions committed since the last round, the
next epoch's ``Commit`` carries ``marker = n``. Each worker freezes its stores at that
commit and reports ``wire.Snapshotted`` once its uploads ended. With every report in, the
round's manifest is published (write-then-publish); every ``GC_PERIOD`` seconds (and
``GC_EVERY`` rounds), and when rounds pause, the store snapshots and files no retained
round needs are garbage-collected (no round starts meanwhile). Both run in a background
process at lower priority (``statestores.background``, lane ``upload``): never on the
epoch loop, and not on a thread of this process either, whose GIL the epoch loop needs
(the MinIO client's requests, signing and XML parsing held it for ~70 ms per round, the
main cause of the p99 spikes at every round). A round that fails (a worker's upload
failed, MinIO is down, or it took longer than ``ROUND_TIMEOUT``) is logged and the next
interval tries again; epochs never wait for a round.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from coordinator.needs import Switched
from coordinator.state import Layout
from coordinator.traces import steps_span
from remotes import Remote
from sfaas.runtime import ports, tracing, wire
from sfaas.runtime.lifecycle import Service
from sfaas.runtime.protocols.rounds import (
    RoundManifest,
    Rounds,
    StoreCut,
    collect_store_garbage,
    publish_round,
)
from statestores import background

log = logging.getLogger("sfaas.coordinator.rounds")

__all__ = ["RoundKeeper", "RoundSummary", "ROUND_TIMEOUT", "HISTORY", "GC_EVERY", "GC_PERIOD",
           "GC_PAUSE"]

T = TypeVar("T")

#: Complete rounds (their summaries) and failures remembered for the status page (and
#: between two scrapes).
HISTORY = 100
#: A round not complete after this many seconds (or 10 intervals, if longer) has failed.
ROUND_TIMEOUT = 60.0
#: Garbage is collected once ``GC_EVERY`` rounds were published and ``GC_PERIOD`` seconds
#: passed since the last collection began, and once rounds pause (none published for two
#: intervals). A collection costs ~8 requests per store (lists, manifest reads, two batch
#: deletes): with 8 stores ~200 ms of CPU, MinIO's and the background process's, on the
#: cores the epochs run on, and the rounds' own requests are ~20. So it runs at most every
#: ``GC_PERIOD`` (at 1 s rounds, every 5th made p99 twice as bad in the rounds after it),
#: with ``GC_PAUSE`` between stores. Until then a store keeps the snapshots' files of at
#: most ``max(GC_EVERY, GC_PERIOD / interval)`` more rounds.
GC_EVERY = 5
GC_PERIOD = 30.0
#: Seconds between two stores' collections (at most a quarter of an interval in all).
GC_PAUSE = 0.02


@dataclass(frozen=True, slots=True)
class RoundSummary:
    """What the status page and metrics show of a complete round — not its manifest, whose
    offsets and re-runs grow with the requests in flight (100 manifests under overload
    held ~16 MB)."""

    round: int
    epoch: int
    started: float
    created: float
    bytes_uploaded: int
    total_bytes: int
    files: int

    @classmethod
    def of(cls, m: RoundManifest) -> RoundSummary:
        return cls(m.round, m.epoch, m.started, m.created, m.bytes_uploaded, m.total_bytes, m.files)


@dataclass
class _InFlight:
    round: int
    epoch: int
    #: wall time (the manifest's ``started``)
    started: float
    #: monotonic time, what its age is measured from (a wall clock stepped by NTP would
    #: fail a healthy round, or keep a stuck one, by the step)
    began: float
    reports: dict[int, wire.Snapshotted] = field(default_factory=dict)


class RoundKeeper(Service):
    """Starts rounds, collects the workers' reports, publishes and collects garbage. As a
    service it warms up the process rounds are published in, and its stop waits for the
    loads, publishes and collections under way.

    ``layout``: the partition map in force (a round needs every slot's report, and its
    manifest names the map epochs after it run under); ``rounds_remote``: where rounds are
    published; ``store_remote``: a store's remote (for garbage collection); ``clock``:
    what the rounds' due times, timeouts and collections read (the process's clock port
    when None: virtual time in the simulator)."""

    part = "snapshot rounds"

    def __init__(
        self, interval: float, retain: int, layout: Callable[[], Layout],
        rounds_remote: Callable[[], Remote], store_remote: Callable[[str, int], Remote],
        clock: ports.ClockPort | None = None,
    ) -> None:
        self._clock = clock or ports.current().clock
        self.interval = interval
        self.retain = retain
        self._layout = layout
        self._rounds_remote = rounds_remote
        self._store_remote = store_remote
        self._rounds: Rounds | None = None
        self._next_id: int | None = None  # unknown until the published index was read
        #: the published index as this coordinator, its only writer, last read or wrote it
        #: (each publish then skips reading it); None after a publish failed midway
        self._index: list[int] | None = None
        #: rounds whose blobs failed publishes may have left: deleted by the next publish
        self._stale: set[int] = set()
        self._loading: asyncio.Task[None] | None = None
        self._inflight: _InFlight | None = None
        self._publishing: asyncio.Task[None] | None = None
        #: clear while a round's manifest is being written to MinIO
        self._written = asyncio.Event()
        self._written.set()
        self._next_at = self._clock.monotonic() + interval
        self._txns_at_last = -1
        #: counters for logs, ``sfaas ps`` and tests
        self.completed = 0
        self.failed = 0
        self.last_complete: RoundManifest | None = None
        #: a rescale's round: round id → (new map, new worker count, called once published)
        self._switch_at: dict[int, tuple[list[int], int, Switched]] = {}
        #: the newest complete rounds and failures ``(time, round, why)``, for the status
        #: page and metrics
        self.history: collections.deque[RoundSummary] = collections.deque(maxlen=HISTORY)
        self.failures: collections.deque[tuple[float, int, str]] = collections.deque(maxlen=HISTORY)
        #: garbage collection (see GC_EVERY): rounds published since the last one started,
        #: when that was, the rounds retained by the newest (whose stores it covers), when
        #: that was published, the task
        self._gc_due = 0
        self._collected_at = self._clock.monotonic()
        self._retained: list[int] = []
        self._published_at = 0.0
        self._collecting: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    async def on_start(self) -> None:
        self.warm_up()

    async def on_stop(self) -> None:
        await self.close()

    def warm_up(self) -> None:
        """Start the background process rounds are published in now, not at the first
        round (a process start is ~0.3 s of CPU on the cores the epochs run on)."""
        if self.enabled:
            background.warm_up("upload")

    # -- starting ----------------------------------------------------------------------------
    def marker(self, epoch: int, txns: int, force: bool = False) -> int | None:
        """The round id to put on epoch ``epoch``'s Commit, or None. ``txns``: transactions
        run so far (no round is taken when nothing happened since the last one).
        ``force``: a round now if none is in flight (a rescale switches at one)."""
        if not self.enabled:
            return None
        now = self._clock.monotonic()
        self._expire(now)
        quiet = self._inflight is None and self._publishing is None
        if self._gc_due and quiet and now - self._published_at >= 2 * self.interval:
            self._collect()  # rounds paused: collect what the last ones left
        # (no round while garbage is collected: a store's gc counts the snapshots it keeps,
        # and one a new round wrote meanwhile would take a retained round's place)
        busy = (self._inflight is not None or self._publishing is not None
                or self._collecting is not None)
        if busy or (now < self._next_at and not force):
            return None
        if self._next_id is None:
            if self._loading is None:
                self._loading = asyncio.get_running_loop().create_task(self._load())
            return None
        if txns == self._txns_at_last and not force:
            self._next_at = now + self.interval
            return None
        self._txns_at_last = txns
        round_id = self._next_id
        self._next_id += 1
        self._inflight = _InFlight(round_id, epoch, self._clock.time(), now)
        self._next_at = now + self.interval
        return round_id

    def recovered(self, epochs_replayed: int) -> None:
        """A recovery is done: having replayed epochs since the newest round, the next
        round is taken at the next epoch, not an interval after the last. A fault before it
        replays them all again — the faults series: a kill 10 ms after a recovery that
        replayed 586 epochs (MinIO's outage had paused the rounds) replayed the same 586."""
        if self.enabled and epochs_replayed > 0:
            self._next_at = self._clock.monotonic()

    async def _load(self) -> None:
        """Learn the newest published round, so new ids continue above it."""
        try:
            self._rounds = Rounds(self._rounds_remote())
            ids = await asyncio.to_thread(self._rounds.ids)
        except Exception as exc:
            log.warning("cannot read the published snapshot rounds (will retry): %s", exc)
            self._next_at = self._clock.monotonic() + self.interval
        else:
            self._next_id = (ids[-1] if ids else 0) + 1
            self._index = ids
            log.info("snapshot rounds every %.1f s, keeping %d; next round %d",
                     self.interval, self.retain, self._next_id)
        finally:
            self._loading = None

    def _expire(self, now_monotonic: float) -> None:
        f = self._inflight
        age = now_monotonic - f.began if f is not None else 0.0
        if f is not None and age > max(ROUND_TIMEOUT, 10 * self.interval):
            self._fail(f"not complete after {age:.0f} s "
                       f"(reports from workers {sorted(f.reports)} of {self._layout().workers})")

    def abort(self, why: str) -> None:
        """Fail the round in flight, if any (a worker was lost)."""
        if self._inflight is not None:
            self._fail(why)

    def arm_switch(self, round_id: int, owners: list[int], workers: int,
                   rescale: Switched) -> None:
        """Round ``round_id`` is a rescale's switch: its manifest names ``owners`` of
        ``workers`` slots, and ``rescale`` adopts them once it is published."""
        self._switch_at[round_id] = (list(owners), workers, rescale)

    def _fail(self, why: str) -> None:
        assert self._inflight is not None
        log.warning("snapshot round %d failed: %s; the next interval retries",
                    self._inflight.round, why)
        self._switch_at.pop(self._inflight.round, None)
        self.failed += 1
        self.failures.append((self._clock.time(), self._inflight.round, why))
        self._inflight = None

    # -- reports ---------------------------------------------------------------------------
    def on_report(self, msg: wire.Snapshotted) -> None:
        """A worker's part of a round (called on the event loop)."""
        f = self._inflight
        if f is None or msg.round != f.round:
            log.info("ignoring worker %d's report of round %d (not in flight)",
                     msg.index, msg.round)
            return
        if msg.error:
            self._fail(f"worker {msg.index}: {msg.error}")
            return
        f.reports[msg.index] = msg
        if len(f.reports) == self._layout().workers:
            self._inflight = None
            manifest = self._manifest(f)
            self._publishing = asyncio.get_running_loop().create_task(self._publish(manifest))

    def _manifest(self, f: _InFlight) -> RoundManifest:
        ingress: dict[int, int] = {}
        skip: dict[int, list[int]] = {}
        egress: dict[int, int] = {}
        stores: list[StoreCut] = []
        retries: list[tuple[int, int, int, float, dict[str, Any]]] = []
        for r in f.reports.values():
            ingress.update(r.ingress)
            skip.update(r.skip)
            for p, o in r.egress.items():
                egress[p] = min(o, egress.get(p, o))
            stores += [StoreCut(str(op), int(p), int(b), int(n), int(t), str(e))
                       for op, p, b, n, t, e in r.stores]
            retries += [(t, p, o, float(now), dict(j)) for t, p, o, now, j in r.retries]
        # an egress partition some worker did not report has no safe scan start: omit it
        egress = {p: o for p, o in egress.items()
                  if all(p in r.egress for r in f.reports.values())}
        stores.sort(key=lambda s: (s.operator, s.partition))
        layout = self._layout()
        owners, workers, _ = self._switch_at.get(
            f.round, (list(layout.owners), layout.workers, None))
        return RoundManifest(f.round, f.epoch, workers, layout.partitions, tuple(stores), ingress,
                             skip, egress, tuple(sorted(retries)),
                             min(r.epoch_log for r in f.reports.values()),
                             started=f.started, created=self._clock.time(),
                             owners=tuple(owners))

    async def _publish(self, manifest: RoundManifest) -> None:
        assert self._rounds is not None
        self._written.clear()
        reported = time.time_ns()  # (every worker's report is in)
        try:
            known, self._index = self._index, None  # (unknown until this publish returns)
            retained, dropped = await _in_background(
                publish_round, [self._rounds.remote], self._rounds.remote, manifest, self.retain,
                known, sorted(self._stale))
        except Exception as exc:
            self._stale |= set(known or ()) | {manifest.round}
            log.warning("publishing snapshot round %d failed: %s; the next interval retries",
                        manifest.round, exc)
            self._switch_at.pop(manifest.round, None)
            self.failed += 1
            self.failures.append((self._clock.time(), manifest.round,
                                  f"publishing failed: {exc}"))
            if tracing.ON:
                self._traced(manifest, reported, f"publishing failed: {exc}")
            self._publishing = None
            self._written.set()
            return
        self._index = retained
        self._stale.clear()
        self.completed += 1
        self.last_complete = manifest
        self.history.append(RoundSummary.of(manifest))
        switch = self._switch_at.pop(manifest.round, None)
        if switch is not None:  # the round names the new map: it is in force from now on
            switch[2].adopt(manifest.round)
        self._written.set()
        if tracing.ON:
            self._traced(manifest, reported)
        log.info("snapshot round %d complete: epoch %d, %d stores, %d files, %.1f MB uploaded, "
                 "published %.2f s after its marker", manifest.round, manifest.epoch,
                 len(manifest.stores), manifest.files, manifest.bytes_uploaded / 1e6,
                 manifest.created - manifest.started)
        if dropped:
            log.info("snapshot rounds %s dropped (retaining %s)", dropped, retained)
        self._retained = retained
        self._gc_due += 1
        self._published_at = self._clock.monotonic()
        self._publishing = None
        if self._gc_due >= GC_EVERY and self._published_at - self._collected_at >= GC_PERIOD:
            self._collect()

    def known_latest(self) -> RoundManifest | None:
        """The newest complete round, as this coordinator published it — None when it does
        not know for sure (none published by this process, one being published, or one
        that failed midway may be in MinIO): a recovery then reads MinIO."""
        if self._publishing is not None or self._stale or self._index is None:
            return None
        return self.last_complete

    @staticmethod
    def _traced(manifest: RoundManifest, reported: int, error: str | None = None) -> None:
        """The round's span: its marker → every worker's report → the manifest published."""
        started = int(manifest.started * 1e9)
        steps_span("snapshot round", started, [("workers' snapshots", started, reported),
                                               ("publish", reported, time.time_ns())], {
            "sfaas.round": manifest.round, "sfaas.epoch": manifest.epoch,
            "sfaas.files": manifest.files, "sfaas.bytes_uploaded": manifest.bytes_uploaded},
            error)

    def _collect(self) -> None:
        """Start collecting the garbage the rounds published so far left (one collection
        at a time; no round starts until it ends, see :meth:`marker`)."""
        if self._collecting is not None or self.last_complete is None:
            return
        stores = [(s.operator, s.partition) for s in self.last_complete.stores]
        self._gc_due = 0
        self._collected_at = self._clock.monotonic()
        self._collecting = asyncio.get_running_loop().create_task(
            self._collect_garbage(stores, self._retained))

    async def _collect_garbage(self, stores: list[tuple[str, int]], retained: list[int]) -> None:
        try:
            remotes = [(op, p, self._store_remote(op, p)) for op, p in stores]
            pause = min(GC_PAUSE, self.interval / 4 / max(1, len(remotes)))
            n, freed = await _in_background(collect_store_garbage, [r for _, _, r in remotes],
                                            remotes, retained, pause)
            if n or freed:
                log.info("snapshot gc: %d store snapshots dropped, %.1f MB deleted", n, freed / 1e6)
        except Exception as exc:
            self._gc_due += 1  # retried after the next rounds, or two intervals from now
            self._published_at = self._clock.monotonic()
            log.warning("snapshot garbage collection failed (retried later): %s", exc)
        finally:
            self._collecting = None

    async def newest_complete(self, timeout: float = 5.0) -> int:
        """The newest complete round (-1: none known), after a manifest being written now
        has landed (what a recovery starting next will find in MinIO)."""
        try:
            await asyncio.wait_for(self._written.wait(), timeout)
        except TimeoutError:
            pass
        return self.last_complete.round if self.last_complete is not None else -1

    async def wait_published(self, round_id: int, timeout: float = 60.0) -> RoundManifest | None:
        """Round ``round_id``'s manifest once published; None if the round failed (or took
        longer than ``timeout`` seconds)."""
        deadline = self._clock.monotonic() + timeout
        while self._clock.monotonic() < deadline:
            done = self.last_complete
            if done is not None and done.round >= round_id:
                return done if done.round == round_id else None
            f = self._inflight
            if (f is None or f.round != round_id) and self._publishing is None:
                return None  # failed (a completed one would be last_complete)
            await asyncio.sleep(0.002)
        return None

    async def close(self) -> None:
        for task in (self._loading, self._publishing, self._collecting):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)


async def _in_background(fn: Callable[..., T], remotes: list[Remote], *args: Any) -> T:
    """``fn(*args)`` in this process's ``upload`` background process (see the module
    docstring), or on a thread here when one of the ``remotes`` it uses is reachable from
    this process only."""
    local = not all(r.shareable for r in remotes)
    return await asyncio.wrap_future(background.submit(fn, *args, lane="upload", local=local))
