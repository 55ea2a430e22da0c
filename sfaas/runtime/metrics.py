"""What the coordinator and the workers share to be observed: histograms, quantiles, and
one small HTTP server for ``/metrics`` (Prometheus) and the coordinator's status page.

Metrics are read when Prometheus scrapes: each process registers a collector
(:class:`Collect`) that turns the counters it keeps anyway into metric families of
``prometheus_client``, which also renders the exposition format. The few durations
that are measured (request latency, epoch phases) go into :class:`Buckets`: a fixed
set of bounds and a count per bucket, cheap enough for every transaction, and the same
counts a worker sends the coordinator in its heartbeat (the status page's p50/p99).

The server runs on the process's event loop (what it reports is read on the thread that
changes it), answers ``GET`` only, closes every connection after one response, and bounds
what a client can make it read; it serves no secret (settings with credentials never
reach a page).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.samples import Exemplar

from sfaas.errors import ClusterError
from sfaas.runtime import ports
from sfaas.runtime.channels import TRAFFIC

log = logging.getLogger("sfaas.runtime.metrics")

__all__ = ["LATENCY_BOUNDS", "PHASE_BOUNDS", "Buckets", "quantile", "Collect", "HttpServer",
           "local_url", "new_registry", "channel_traffic"]

#: Request latency bucket bounds (seconds): from a fast epoch to a long recovery.
LATENCY_BOUNDS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1.0, 2.5, 5.0, 10.0, 30.0)
#: Bounds of phase durations (epoch phases, snapshot rounds, recovery phases; seconds).
PHASE_BOUNDS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                   0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Buckets:
    """A histogram: ``counts[i]`` observations ``<= bounds[i]`` and above the bound before
    (the last count: above every bound), and their sum; each bucket may carry an exemplar,
    the trace id of one observation in it (OpenMetrics). Not thread-safe: one owner thread."""

    __slots__ = ("bounds", "counts", "sum", "exemplars")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        #: per bucket, the newest ``(trace id, value, unix time)`` given (None: none yet)
        self.exemplars: list[tuple[str, float, float] | None] | None = None

    def exemplar(self, value: float, trace_id: str) -> None:
        """``value`` (observed too, by whoever observes) was that of a traced request: its
        bucket's exemplar names trace ``trace_id`` (32 hex digits) from now on."""
        if self.exemplars is None:
            self.exemplars = [None] * len(self.counts)
        at = ports.current().clock.time()
        self.exemplars[bisect.bisect_left(self.bounds, value)] = (trace_id, value, at)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def add_to(self, family: Any, labels: Sequence[str] = ()) -> None:
        """Add this histogram as one sample set of a ``HistogramMetricFamily``."""
        cumulative: list[Any] = []
        running = 0
        ex = self.exemplars or [None] * len(self.counts)
        for bound, n, e in zip((*self.bounds, math.inf), self.counts, ex, strict=True):
            running += n
            le = "+Inf" if bound == math.inf else repr(bound)
            cumulative.append((le, running) if e is None else
                              (le, running, Exemplar({"trace_id": e[0]}, e[1], e[2])))
        family.add_metric(list(labels), cumulative, self.sum)


def quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The ``q``-quantile of per-bucket ``counts`` (as :class:`Buckets` keeps them), linearly
    interpolated within its bucket like Prometheus' ``histogram_quantile``; None when empty.
    Observations above the last bound count as the last bound."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    running = 0.0
    for i, n in enumerate(counts):
        if n and running + n >= rank:
            if i == len(bounds):
                return float(bounds[-1])
            lo = bounds[i - 1] if i else 0.0
            return float(lo + (bounds[i] - lo) * max(0.0, rank - running) / n)
        running += n
    return float(bounds[-1])


class Collect:
    """A ``prometheus_client`` collector calling ``fn`` at every scrape."""

    def __init__(self, fn: Callable[[], Iterable[Any]]) -> None:
        self._fn = fn

    def collect(self) -> Iterable[Any]:
        return self._fn()


def new_registry() -> CollectorRegistry:
    """A registry of this process's own (not the library-global one, so several coordinators
    and workers can live in one test process), with the standard ``process_*`` metrics."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    return registry


def channel_traffic() -> Iterator[Any]:
    """This process's channel traffic (:data:`sfaas.runtime.channels.TRAFFIC`) as counters."""
    t = TRAFFIC
    for name, value, doc in (
        ("sfaas_channel_sent_bytes", t.sent_bytes,
         "Bytes this process sent on its channels (frames with headers)"),
        ("sfaas_channel_received_bytes", t.received_bytes,
         "Bytes this process received on its channels"),
        ("sfaas_channel_sent_frames", t.sent_frames, "Frames this process sent on its channels"),
        ("sfaas_channel_received_frames", t.received_frames,
         "Frames this process received on its channels"),
    ):
        yield CounterMetricFamily(name, doc, value=value)


def local_url(host: str, port: int, path: str = "/") -> str:
    """``http://host:port/path``; a wildcard host becomes the loopback address."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


#: A route: returns ``(content type, body)``.
Route = Callable[[], tuple[str, bytes]]

_MAX_HEAD = 8192
_READ_TIMEOUT = 5.0


class HttpServer:
    """``GET`` routes on the event loop: ``/metrics`` renders ``registry``; ``routes`` add
    more (the coordinator's status page)."""

    def __init__(self, registry: Any, routes: dict[str, Route] | None = None) -> None:
        self.registry = registry
        self.routes: dict[str, Route] = {"/metrics": self._metrics, **(routes or {})}
        self._server: asyncio.Server | None = None
        self.port = 0

    def _metrics(self, openmetrics: bool = False) -> tuple[str, bytes]:
        """The registry in Prometheus' text format, or (``openmetrics``: the scraper's
        ``Accept`` asked for it) in OpenMetrics, whose histograms carry exemplars."""
        if openmetrics:
            from prometheus_client.openmetrics import exposition

            body: bytes = exposition.generate_latest(self.registry)  # type: ignore[no-untyped-call]
            return exposition.CONTENT_TYPE_LATEST, body
        return CONTENT_TYPE_LATEST, generate_latest(self.registry)

    async def start(self, host: str, port: int, setting: str = "SFAAS_METRICS_PORT") -> int:
        """Listen on ``host:port``; the bound port. Raises :class:`ClusterError` naming
        ``setting`` when the port cannot be had."""
        try:
            self._server = await asyncio.start_server(self._serve, host, port, limit=_MAX_HEAD)
        except OSError as exc:
            raise ClusterError(f"cannot serve metrics on {host}:{port} ({setting}): "
                               f"{exc.strerror or exc}") from None
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
            except asyncio.LimitOverrunError:
                await self._respond(writer, 431, "text/plain", b"request head too large\n")
                return
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                return
            parts = head.split(b"\r\n", 1)[0].split(b" ")
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                await self._respond(writer, 400, "text/plain", b"bad request line\n")
                return
            method, target = parts[0], parts[1].decode("ascii", "replace")
            route = self.routes.get(target.split("?", 1)[0])
            if method not in (b"GET", b"HEAD"):
                await self._respond(writer, 405, "text/plain", b"only GET\n",
                                    extra="Allow: GET, HEAD\r\n")
            elif route is None:
                routes = ", ".join(sorted(self.routes))
                await self._respond(writer, 404, "text/plain",
                                    f"not found; try {routes}\n".encode())
            else:
                try:
                    if route == self._metrics and b"application/openmetrics-text" in head:
                        ctype, body = self._metrics(openmetrics=True)
                    else:
                        ctype, body = route()
                except Exception:
                    log.exception("serving %s failed", target)
                    await self._respond(writer, 500, "text/plain",
                                        b"internal error (see the process log)\n")
                    return
                await self._respond(writer, 200, ctype, body, head_only=method == b"HEAD")
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes, *,
                       extra: str = "", head_only: bool = False) -> None:
        # an HTML page may use its own inline script and style, and its JSON: nothing else
        if ctype.startswith("text/html"):
            extra += ("Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
                      "style-src 'unsafe-inline'; connect-src 'self'; img-src data:\r\n")
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  431: "Request Header Fields Too Large", 500: "Internal Server Error"}[status]
        writer.write((f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                      f"Content-Length: {len(body)}\r\n"
                      "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                      f"Connection: close\r\n{extra}\r\n").encode() + (b"" if head_only else body))
        await writer.drain()
