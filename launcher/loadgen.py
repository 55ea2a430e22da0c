"""An open-loop load generator: requests at a fixed offered rate, latency per reply.

Open loop means a request is sent at its scheduled time whether or not earlier ones have
been answered, so queueing delay shows up in the latencies (a closed loop would hide it).
Used by ``sfaas demo`` and the runtime benchmark.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sfaas.client import Client
from sfaas.errors import reply_error

log = logging.getLogger("sfaas.loadgen")

__all__ = ["LoadResult", "run_open_loop", "percentile", "Zipf"]

#: A request: (operator, key, function, args)
RequestSpec = tuple[str, str, str, list[Any]]


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of an already sorted list (nearest rank); nan if empty."""
    if not sorted_values:
        return math.nan
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


@dataclass
class LoadResult:
    """What one open-loop run measured."""

    offered_rate: float
    seconds: float
    sent: int = 0
    committed: int = 0
    aborted: int = 0
    lost: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    abort_reasons: dict[str, int] = field(default_factory=dict)
    results: list[tuple[RequestSpec, bool, Any]] = field(default_factory=list)
    #: ``time.monotonic()`` of each reply's arrival, in arrival order
    arrivals: list[float] = field(default_factory=list)
    #: request ids of the requests sent
    rids: list[str] = field(default_factory=list)

    def longest_gap(self, after: float = 0.0) -> tuple[float, float]:
        """``(seconds, start)``: the longest time without a reply, among arrivals after ``after``
        (monotonic), and when it began."""
        times = [t for t in self.arrivals if t >= after]
        best = (0.0, after)
        for a, b in zip(times, times[1:], strict=False):
            if b - a > best[0]:
                best = (b - a, a)
        return best

    @property
    def throughput(self) -> float:
        """Committed transactions per second over the sending window."""
        return self.committed / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float:
        """Latency quantile in ms over all replies (committed and aborted)."""
        return percentile(sorted(self.latencies_ms), q)

    def summary(self) -> dict[str, Any]:
        """The headline numbers as a dict."""
        return {
            "offered_tps": self.offered_rate, "sent": self.sent, "committed": self.committed,
            "aborted": self.aborted, "lost": self.lost, "committed_tps": round(self.throughput, 1),
            "abort_rate": round(self.aborted / max(1, self.committed + self.aborted), 4),
            "p50_ms": round(self.p(0.50), 2), "p95_ms": round(self.p(0.95), 2),
            "p99_ms": round(self.p(0.99), 2),
        }


class Zipf:
    """Draw ints in [0, n) with P(i) ∝ 1/(i+1)^theta (YCSB's scrambled-free Zipfian)."""

    def __init__(self, n: int, theta: float, rnd: random.Random) -> None:
        import bisect
        import itertools

        weights = [1.0 / (i + 1) ** theta for i in range(n)]
        self._cum = list(itertools.accumulate(weights))
        self._total = self._cum[-1]
        self._rnd = rnd
        self._bisect = bisect.bisect_left
        self._perm = list(range(n))
        rnd.shuffle(self._perm)  # hot keys spread over partitions

    def __call__(self) -> int:
        return self._perm[self._bisect(self._cum, self._rnd.random() * self._total)]


async def run_open_loop(
    client: Client,
    make_request: Callable[[int], RequestSpec],
    rate: float,
    seconds: float,
    *,
    drain_timeout: float = 30.0,
    keep_results: bool = False,
    progress: Callable[[int], None] | None = None,
) -> LoadResult:
    """Send ``rate`` requests/s for ``seconds``, then wait for the outstanding replies."""
    res = LoadResult(rate, seconds)
    total = int(rate * seconds)
    outstanding: set[asyncio.Future[Any]] = set()
    loop = asyncio.get_running_loop()

    def on_reply(spec: RequestSpec, t0: float, fut: asyncio.Future[Any]) -> None:
        outstanding.discard(fut)
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            res.lost += 1
            return
        reply = fut.result()
        res.arrivals.append(time.monotonic())
        res.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        if reply.ok:
            res.committed += 1
        else:
            res.aborted += 1
            key = (reply.reason or "")[:60]
            res.abort_reasons[key] = res.abort_reasons.get(key, 0) + 1
        if keep_results:
            res.results.append((spec, reply.ok, reply.value if reply.ok else reply_error(
                reply.error_type or "TransactionAborted", reply.reason or "")))
        if progress is not None:
            progress(1)

    start = loop.time()
    for i in range(total):
        target = start + i / rate
        delay = target - loop.time()
        if delay > 0.0005:
            await asyncio.sleep(delay)
        spec = make_request(i)
        t0 = time.perf_counter()
        fut = await client.submit(spec[0], spec[1], spec[2], *spec[3])
        res.rids.append(client.last_rid)
        outstanding.add(fut)
        fut.add_done_callback(functools.partial(on_reply, spec, t0))
        res.sent += 1
    res.seconds = max(seconds, loop.time() - start)
    if outstanding:
        done, pending = await asyncio.wait(list(outstanding), timeout=drain_timeout)
        for f in pending:
            f.cancel()
        res.lost += len(pending)
    return res
