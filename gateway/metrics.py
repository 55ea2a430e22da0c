"""What the gateway reports on ``/metrics`` (Prometheus text, like every sfaas process):
requests by route and status, a latency histogram per route, and the requests in flight.

Routes are the path templates (``/v1/{app}/{operator}/{key}/{function}``, …), never the
requested path, so a client cannot grow the label set; unmatched paths count as ``other``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from sfaas.runtime.metrics import LATENCY_BOUNDS, Buckets, Collect, new_registry

__all__ = ["GatewayMetrics", "CALL", "GET", "SCAN", "ROUTES"]

CALL = "/v1/{app}/{operator}/{key}/{function}"
GET = "/v1/{app}/{operator}/{key}"
SCAN = "/v1/{app}/{operator}"
ROUTES = (CALL, GET, SCAN, "/openapi.json", "/healthz", "/metrics", "other")


class GatewayMetrics:
    """Counters kept by the gateway's event loop, rendered at each scrape."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.latency = {route: Buckets(LATENCY_BOUNDS) for route in ROUTES}
        #: /v1 requests being worked on (the ones ``max_in_flight`` bounds)
        self.in_flight = 0
        self.registry = new_registry()
        self.registry.register(Collect(self._collect))  # type: ignore[arg-type]

    def observe(self, route: str, status: int, seconds: float) -> None:
        route = route if route in self.latency else "other"
        self.requests[route, status] = self.requests.get((route, status), 0) + 1
        self.latency[route].observe(seconds)

    def _collect(self) -> Iterator[Any]:
        req = CounterMetricFamily("sfaas_gateway_requests",
                                  "HTTP requests the gateway answered, by route and status",
                                  labels=["route", "status"])
        for (route, status), n in sorted(self.requests.items()):
            req.add_metric([route, str(status)], n)
        yield req
        lat = HistogramMetricFamily("sfaas_gateway_request_seconds",
                                    "Time from a request's arrival to its response, by route",
                                    labels=["route"])
        for route, buckets in self.latency.items():
            if buckets.count:
                buckets.add_to(lat, [route])
        yield lat
        yield GaugeMetricFamily("sfaas_gateway_in_flight",
                                "/v1 requests the gateway is working on", value=self.in_flight)
