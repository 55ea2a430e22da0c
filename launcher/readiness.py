"""Up means up: a cluster is ready when a call from the host would succeed.

A coordinator that sees every worker (and its standbys) is not yet a cluster a client can
use: the brokers' listeners for the host, the topics' leaders and the workers' consumers
come a few seconds (up to 17 s seen for the HA profile) later, and the first ``Client``
failed with "cannot reach Kafka". :func:`wait_serving` therefore waits for the status
page's ``/metrics`` to show every worker and standby up, then for one read to round-trip
from the host — produced to the app's ingress topic, answered by a worker on the egress
topic. The read names an operator no app has, so it touches no state: the worker's
answer ("no operator ...") proves the path; only a failure to connect or a timeout means
not yet. A profile with an HTTP gateway is ready once its ``/healthz`` answers too: Docker's
port proxy accepts a connection before the gateway listens, and a request on it then
fails with a broken pipe (seen in CI, 2026-11-29).
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Serving", "NotServing", "metrics_status", "round_trip", "wait_serving"]

#: the operator the probe reads (no app has it; the worker answers that it does not exist)
PROBE_OPERATOR = "sfaas-readiness-probe"
_INFO = re.compile(r'^sfaas_coordinator_info\{([^}]*)\} 1(\.0)?$', re.M)


class NotServing(Exception):
    """The cluster did not serve a call within the time given (the message says what lacked)."""


@dataclass(frozen=True)
class Serving:
    """What the cluster showed when it was ready: the app, and the seconds it took."""

    app: str
    namespace: str
    seconds: float


def metrics_status(text: str, workers: int, standbys: int) -> tuple[str, str] | str:
    """``(app, namespace)`` when the coordinator's metrics ``text`` show ``workers`` ready
    workers with ``standbys`` standbys each; else what is missing."""
    lines = text.splitlines()
    up = sum(1 for line in lines
             if line.startswith("sfaas_worker_up{") and line.rstrip().endswith(" 1.0"))
    sb = sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("sfaas_standbys{"))
    info = _INFO.search(text)
    if up < workers or sb < workers * standbys or info is None:
        return f"{up} of {workers} workers up, {sb:.0f} of {workers * standbys} standbys"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
    return labels.get("app", ""), labels.get("namespace", "")


async def round_trip(kafka: str, app: str, namespace: str, timeout: float,
                     replication: int | None = None) -> str:
    """One read from the host through the cluster; what answered it. Raises
    :class:`sfaas.errors.ClusterError` (Kafka unreachable), ``RequestTimeout`` or
    ``TimeoutError`` when it did not come back. ``replication``: the topics' (by default
    3 with several brokers, as the HA profile has)."""
    from sfaas.client import Client
    from sfaas.errors import TransactionAborted
    from sfaas.runtime.settings import Settings

    if replication is None:
        replication = 3 if "," in kafka else 1
    s = Settings.load({"kafka": kafka, "namespace": namespace, "replication": replication},
                      env={})
    async with asyncio.timeout(timeout):
        async with Client(app, settings=s, timeout=timeout, direct_reads=False) as c:
            try:
                await c.get(PROBE_OPERATOR, "ready")
            except TransactionAborted as exc:  # a worker answered: the path works
                return f"a worker answered ({type(exc).__name__})"
    return "a worker answered"


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def _gateway_answers(gateway: str) -> str | None:
    """None when the gateway at ``gateway`` answers ``/healthz`` with 200, else why not."""
    try:
        with urllib.request.urlopen(f"{gateway.rstrip('/')}/healthz", timeout=5) as r:
            return None if r.status == 200 else f"gateway {gateway}: /healthz {r.status}"
    except OSError as exc:
        return f"gateway {gateway}: {type(exc).__name__}: {exc}"[:300]


def wait_serving(status_url: str, kafka: str, workers: int, standbys: int,
                 timeout: float = 300.0,
                 say: Callable[[str], None] | None = None,
                 gateway: str | None = None) -> Serving:
    """Wait until the cluster whose status page is ``status_url`` (``http://host:port``)
    and brokers ``kafka`` serves a call from here — and its HTTP gateway at ``gateway``
    (``http://host:port``), if given, answers (the module docstring); raise
    :class:`NotServing` naming what lacked after ``timeout`` seconds."""
    from sfaas.errors import ClusterError, RequestTimeout

    t0 = time.monotonic()
    deadline, last = t0 + timeout, "nothing tried yet"
    while time.monotonic() < deadline:
        try:
            status = metrics_status(_metrics(f"{status_url.rstrip('/')}/metrics"), workers,
                                    standbys)
        except OSError as exc:
            status = f"status page {status_url}: {exc}"
        if isinstance(status, str):
            last = status
            time.sleep(1.0)
            continue
        app, namespace = status
        left = max(1.0, min(20.0, deadline - time.monotonic()))
        try:
            asyncio.run(round_trip(kafka, app, namespace, left))
            lacking = None if gateway is None else _gateway_answers(gateway)
            if lacking is None:
                return Serving(app, namespace, time.monotonic() - t0)
            last = lacking
        except (ClusterError, RequestTimeout, TimeoutError, OSError) as exc:
            last = f"a read from here did not round-trip: {type(exc).__name__}: {exc}"[:300]
        if say is not None:
            say(f"not serving yet: {last}")
        time.sleep(1.0)
    raise NotServing(f"the cluster did not serve a call within {timeout:.0f} s ({last})")
