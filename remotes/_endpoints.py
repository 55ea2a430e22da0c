"""The endpoints of one S3 service (e.g. the nodes of a distributed MinIO) and failover
between them.

Every endpoint serves the same objects, so an operation may run on any of them. A remote
uses one endpoint at a time (:class:`Rotation`); when a try fails at the connection level
(:func:`fails_over`), :func:`on_some_endpoint` runs the operation on the next endpoint,
each endpoint at most once per try, and raises :class:`EndpointsFailed` naming every
endpoint and its error when none of them answered.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import urllib3
from minio.error import InvalidResponseError, S3Error, ServerError

__all__ = ["parse_endpoints", "fails_over", "EndpointsFailed", "Rotation", "on_some_endpoint",
           "Hurry", "FIRST_READ_TIMEOUT", "PATIENT_FOR"]

log = logging.getLogger("remotes.minio")

T = TypeVar("T")
C = TypeVar("C")

#: S3 codes of a node that cannot serve now while others may ("not initialized" while it
#: starts, its drives unreachable).
_NODE_CODES = frozenset({"XMinioServerNotInitialized", "ServiceUnavailable",
                         "XMinioBackendDown"})

#: With several endpoints, how long the first endpoint of each try may keep a request
#: without a byte of answer before the next one is tried (the others get a remote's
#: ``read_timeout``). A distributed MinIO node holds a request it was serving when a peer
#: node died (a ``docker stop``): it waits on the dead peer's connection until that peer
#: is back, while a new request to any node is answered at once. Seen: a GET held 7.1 s in
#: one of six stops of a non-serving node; in the nemesis a recovery's restore held 5.2 s
#: (seed 2949546457, 5 s of its 16.75 s reply gap). Only the first endpoint is hurried: an
#: answer that is slow everywhere (MinIO's nodes all waiting on the dead one: 2.0–2.6 s
#: answers in another nemesis run, which 2 s turned into 4.0–4.6 s) costs this at most
#: once, then waits as long as ``read_timeout`` allows.
FIRST_READ_TIMEOUT = 3.0
#: Seconds every endpoint gets the whole ``read_timeout`` after a call answered slowly by
#: the endpoint tried after a hurried one: MinIO is slow everywhere, and hurrying would
#: only add :data:`FIRST_READ_TIMEOUT` to every call.
PATIENT_FOR = 30.0


class Hurry:
    """Whether the first endpoint of a try is hurried (given ``timeout`` s, the others the
    remote's whole read timeout): yes, but for :data:`PATIENT_FOR` s after a call the next
    endpoint answered slower than ``timeout``."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        #: until when (``time.monotonic``) no endpoint is hurried
        self._patient_until = 0.0

    def now(self) -> bool:
        return time.monotonic() >= self._patient_until

    def answered_after(self, took: float) -> None:
        """A call succeeded in ``took`` s on the endpoint tried after a hurried one."""
        if took > self.timeout:
            self._patient_until = time.monotonic() + PATIENT_FOR
            log.warning("MinIO answers slowly on every endpoint (%.1f s): no endpoint is "
                        "hurried for %.0f s", took, PATIENT_FOR)


def parse_endpoints(endpoint: str | Sequence[str], secure: bool) -> tuple[tuple[str, ...], bool]:
    """``(host:port entries, secure)`` of ``endpoint``: one ``host:port``, several separated
    by commas, or a sequence of them. An ``http://``/``https://`` scheme sets ``secure``;
    every entry must use the same one. Raises ``ValueError`` naming a bad entry."""
    if isinstance(endpoint, str):
        entries = endpoint.split(",")
    elif isinstance(endpoint, Sequence) and all(isinstance(e, str) for e in endpoint):
        entries = list(endpoint)
    else:
        raise ValueError(f"endpoint must be a non-empty 'host:port' str or a list of them, "
                         f"got {endpoint!r}")
    if not entries or entries == [""]:
        raise ValueError(f"endpoint must be a non-empty 'host:port' str, got {endpoint!r}")
    hosts: list[str] = []
    schemes: set[str] = set()
    for i, raw in enumerate(entries, 1):
        entry = raw
        for scheme in ("https://", "http://"):
            if entry.startswith(scheme):
                entry = entry[len(scheme):]
                schemes.add(scheme)
        entry = entry.rstrip("/")
        where = f"endpoint entry {i} ({raw!r}) of {endpoint!r}" if len(entries) > 1 \
            else f"endpoint {raw!r}"
        if not entry or "/" in entry or entry != entry.strip() or any(c.isspace() for c in entry):
            raise ValueError(f"{where} must be 'host:port' (an optional http:// or https://), "
                             "without a path or blanks")
        if entry in hosts:
            raise ValueError(f"{where} is listed twice")
        hosts.append(entry)
    if len(schemes) > 1:
        raise ValueError(f"endpoints {endpoint!r} mix http:// and https://; use one scheme")
    if schemes:
        secure = schemes == {"https://"}
    return tuple(hosts), bool(secure)


def fails_over(e: BaseException) -> bool:
    """Whether ``e`` says the endpoint (not the request, nor the whole service) failed:
    refused, reset or timed-out connections, and 502/503/504 or "not initialized" answers —
    but not ``SlowDown*`` (a 503 too), which asks to back off, not to move."""
    if isinstance(e, S3Error):
        if (e.code or "").startswith("SlowDown"):
            return False
        status = e.response.status if e.response is not None else 0
        return e.code in _NODE_CODES or status in (502, 503, 504)
    if isinstance(e, ServerError):
        return e.status_code in (502, 503, 504)
    if isinstance(e, InvalidResponseError):
        return int(getattr(e, "_code", 0) or 0) in (502, 503, 504)
    return isinstance(
        e, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, http.client.HTTPException)
    )


class EndpointsFailed(Exception):
    """Every endpoint failed one try of an operation; ``failures`` holds
    ``(endpoint URL, error)`` in the order tried."""

    def __init__(self, failures: list[tuple[str, BaseException]], scrub: Callable[[str], str]):
        self.failures = failures
        super().__init__("; ".join(f"{url}: {type(e).__name__}: {scrub(str(e))}"
                                   for url, e in failures))


class Rotation:
    """Which endpoint (an index into ``urls``) operations start on; shared by threads."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = tuple(urls)
        self.current = 0
        self._lock = threading.Lock()

    def leave(self, i: int) -> None:
        """Endpoint ``i`` failed: the next operation starts on the one after it — unless
        another thread moved on already (so threads failing together skip one endpoint,
        not several)."""
        with self._lock:
            if self.current == i:
                self.current = (i + 1) % len(self.urls)


def on_some_endpoint(rotation: Rotation, clients: Sequence[C], fn: Callable[[C], T], *,
                     what: str, scrub: Callable[[str], str],
                     first: Sequence[C] | None = None,
                     after_first: Callable[[float], None] | None = None) -> T:
    """``fn(client)`` on the current endpoint; on an error that :func:`fails_over`, on each
    following endpoint in turn (each once). Other errors propagate at once; when every
    endpoint failed, :class:`EndpointsFailed` names them all. ``first``: the clients of
    the first endpoint tried (the same endpoints as ``clients``, with a shorter timeout);
    ``after_first(seconds)``: told how long the call that succeeded after ``first`` failed
    took."""
    start = rotation.current
    n = len(clients)
    failures: list[tuple[str, BaseException, bool]] = []
    for k in range(n):
        i = (start + k) % n
        use = first if first is not None and k == 0 else clients
        hurried = use is not clients
        t0 = time.monotonic()
        try:
            got = fn(use[i])
        except Exception as e:
            if not fails_over(e):
                raise
            failures.append((rotation.urls[i], e, hurried))
            rotation.leave(i)
            if k + 1 < n:
                log.warning("%s: MinIO at %s failed (%s: %s); trying %s", what, rotation.urls[i],
                            type(e).__name__, scrub(str(e)), rotation.urls[(i + 1) % n])
            continue
        if failures and failures[0][2] and after_first is not None:
            after_first(time.monotonic() - t0)
        return got
    raise EndpointsFailed([(url, e) for url, e, _ in failures], scrub)
