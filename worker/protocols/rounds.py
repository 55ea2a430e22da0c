"""A worker's part of a snapshot round (see :mod:`sfaas.runtime.protocols.rounds`).

At the commit of the epoch carrying ``marker = n`` no transaction is in flight, so the
worker's state plus its replay positions are a consistent cut. :meth:`RoundTaker.take`
freezes every store there (``snapshot_async(n)``: milliseconds, on the event loop's thread
so nothing can write in between), records the positions, and returns; the uploads run on
the stores' uploader threads while epochs go on, ``UPLOAD_SPACING`` apart (at most half an
interval in all), so their requests and MinIO's CPU do not all land on the cores at once.
When they end, one ``wire.Snapshotted`` goes to the coordinator — with ``error`` set if
any store failed (MinIO down): the round then fails and the coordinator retries at the
next interval.

A round whose stores were restored before its report went out (a recovery rolled the
worker back: the coordinator gave the round up) is reported by nobody: a restore abandons
the uploads still running (``statestores.snapshots.SnapshotAbandoned``), and a report with
the old cut's positions must never reach a coordinator whose round in flight bears the same
id (a restarted coordinator numbers rounds from the last *published* one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from sfaas.runtime import wire
from sfaas.runtime.state import StoreKey
from statestores import SnapshotInfo, Store
from statestores.snapshots import restores
from worker.state import Cut

log = logging.getLogger("sfaas.worker.snapshots")

__all__ = ["RoundTaker", "UPLOAD_SPACING"]

#: Seconds between the starts of two stores' uploads of a round (less when the round's
#: stores would take more than half an interval so). At 1,000 TPS with 4 stores per worker
#: and rounds every second, lsm's p99 was lower in 5 of 7 interleaved pairs (medians of
#: the last 4: 17.3 ms against 19.7 without; benchmarks/README.md).
UPLOAD_SPACING = 0.08


class RoundTaker:
    """Takes this worker's part of each round; ``send`` delivers the report."""

    def __init__(self, index: int, send: Callable[[wire.Message], None],
                 held: Callable[[int], Awaitable[bool]] | None = None,
                 interval: float = 1.0) -> None:
        self.index = index
        #: the rounds' interval (seconds): a round's uploads spread over at most half of it
        self.interval = interval
        self._send = send
        #: awaited before a report: the standbys hold the round (``Shipping.wait_marks``) and
        #: the worker may report it (False: it may not: the coordinator's channel closed)
        self._held = held
        self._tasks: set[asyncio.Task[None]] = set()
        #: rounds this worker took part in, how many failed, and how many a rollback gave
        #: up before they were reported (not reported, nor counted as taken)
        self.taken = 0
        self.failed = 0
        self.abandoned = 0

    def counters(self) -> dict[str, float]:
        """What ``worker.metrics`` shows of the rounds: taken, and failed."""
        return {"taken": self.taken, "failed": self.failed}

    def take(self, round_id: int, cut: Cut, stores: Mapping[StoreKey, Store],
             durable: Callable[[], Awaitable[None]]) -> None:
        """Freeze every store for round ``round_id`` now, at ``cut``; report when the
        uploads ended and ``durable()`` (the replies of what the cut holds are
        acknowledged) returned."""
        t0 = time.perf_counter()
        futures: list[tuple[StoreKey, str, concurrent.futures.Future[SnapshotInfo]]] = []
        errors: list[str] = []
        spacing = min(UPLOAD_SPACING, self.interval / 2 / max(1, len(stores)))
        before = [(store, restores(store)) for store in stores.values()]
        for i, (key, store) in enumerate(stores.items()):
            try:
                futures.append((key, store.engine,
                                store.snapshot_async(round_id, delay=i * spacing)))
            except Exception as exc:  # e.g. an id not above the store's last snapshot
                errors.append(f"{key[0]}/p{key[1]}: {type(exc).__name__}: {exc}")
        freeze_ms = 1000 * (time.perf_counter() - t0)
        log.debug("round %d: froze %d stores in %.1f ms", round_id, len(futures), freeze_ms)
        task = asyncio.get_running_loop().create_task(
            self._report(round_id, cut, futures, errors, durable(), before),
            name=f"round-{round_id}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report(
        self, round_id: int, cut: Cut,
        futures: list[tuple[StoreKey, str, concurrent.futures.Future[SnapshotInfo]]],
        errors: list[str], durable: Awaitable[None], before: list[tuple[Store, int]],
    ) -> None:
        cuts: list[wire.StoreCut] = []
        try:
            await durable
        except Exception as exc:
            errors.append(f"replies not acknowledged: {type(exc).__name__}: {exc}")
        engines = {key: engine for key, engine, _ in futures}
        for (op, p), _, fut in futures:
            try:
                info = await asyncio.wrap_future(fut)
            except Exception as exc:
                errors.append(f"{op}/p{p}: {type(exc).__name__}: {exc}")
                continue
            cuts.append(wire.StoreCut(op, p, info.bytes_uploaded, info.files_total,
                                      info.bytes_total, engines[(op, p)]))
        if self._held is not None and not errors and not await self._held(round_id):
            self.abandoned += 1
            log.info("round %d: the coordinator's channel closed before its report (not sent)",
                     round_id, extra={"worker": self.index})
            return
        if any(restores(store) != n for store, n in before):
            self.abandoned += 1
            log.info("round %d: given up by a rollback before its report (not sent)", round_id,
                     extra={"worker": self.index})
            return
        self.taken += 1
        error = "; ".join(errors)[:2000]
        if error:
            self.failed += 1
            log.warning("round %d: this worker's snapshot failed: %s", round_id, error,
                        extra={"worker": self.index})
        self._send(cut.report(round_id, self.index, cuts, error))

    async def close(self) -> None:
        """Wait for the reports still pending (their uploads finish or fail first)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
