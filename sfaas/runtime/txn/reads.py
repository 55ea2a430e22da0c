"""State reads without a transaction: ``Client.get`` / ``Client.scan`` (and ``LocalRunner``'s).

A read names an internal function (``GET``, ``SCAN``) that no app can register. A worker
answers it as soon as it takes the request from its ingress partition, outside any epoch:
its stores then hold the committed state as of the last commit — an epoch boundary (or,
during a fallback phase, a point between two of its serial commits) — because an epoch's
writes stay buffered until its commit. The request never enters an epoch or the epoch
log; its reply goes out like any other. Values are decoded as functions see them
(upcast to the code's schema version; a value of a newer version refuses the read with
``SchemaTooNew``; an expired one is absent); the runtime's own records (timers, actions,
kept outcomes) are never shown.

A read's clock, for values under a ``ttl``, is the wall clock of the process answering it
(``LocalRunner``: its clock, ``advance`` included), not the last epoch's ``now``, which
lags the clock by as long as the cluster goes without an epoch (an idle one begins them
about once a second): a value whose time is up should not stay visible until then. A
transaction decides with its own ``ctx.now()``, so around the instant a value expires a
read may already miss it while a transaction sequenced a moment earlier still sees it.

A get goes to its key's partition; a scan to every partition (one request each, the
client merges them): each answers ``[[key, value], ...]`` of its partition in key order,
at most ``limit`` (≤ :data:`MAX_SCAN`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sfaas.app import App
from sfaas.errors import BadArguments, BadRequest
from sfaas.runtime import ports
from sfaas.runtime.values import ValueCodec

__all__ = ["GET", "SCAN", "READS", "MAX_SCAN", "read", "scan_partition", "check_scan"]

GET = "\x00get"
SCAN = "\x00scan"
READS = (GET, SCAN)

#: Most entries one scan returns.
MAX_SCAN = 10_000


def check_scan(prefix: object, limit: object) -> None:
    """Raise :class:`BadArguments` unless ``prefix`` is a str and ``limit`` an int in
    1..MAX_SCAN."""
    if not isinstance(prefix, str):
        raise BadArguments(f"a scan's prefix must be a str, got {prefix!r:.80}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SCAN:
        raise BadArguments(f"a scan's limit must be an int from 1 to {MAX_SCAN}, got "
                           f"{limit!r:.40}")


def scan_partition(store: Any, prefix: str, limit: int, codec: ValueCodec,
                   now: float) -> list[list[Any]]:
    """``[[key, value], ...]`` of ``store`` with keys starting with ``prefix``, in key order,
    at most ``limit``, decoded by ``codec`` at ``now``; the runtime's records and expired
    values left out."""
    want = prefix.encode()
    found = []
    for k, v in store.prefixed(want):  # (in key order: stops at the limit)
        if k[:1] != b"\x00" and codec.live(v, now):
            found.append((k, v))
            if len(found) == limit:
                break
    return [[k.decode(), codec.decode(v, now, k.decode())] for k, v in found]


def read(app: App, stores: Mapping[tuple[str, int], Any], partition_of_key: Any,
         operator: str, key: str, function: str, args: Sequence[Any],
         now: float | None = None) -> Any:
    """Answer a read (see the module docstring) from ``stores`` (``(operator, partition) →
    Store``; ``partition_of_key(operator, key)`` places a key) at ``now`` (None: the wall
    clock). Raises an ``SfaasError`` naming what is wrong (unknown operator, bad key or
    arguments, a partition not here, a value newer than the code)."""
    codec = ValueCodec.of(app.get_operator(operator))
    if now is None:
        now = ports.current().clock.time()
    if function == GET:
        if not isinstance(key, str) or not key or key[0] == "\x00":
            raise BadRequest(f"a get needs a non-empty key not starting with \\x00, got "
                             f"{key!r:.80}")
        where = (operator, partition_of_key(operator, key))
        store = stores.get(where)
        if store is None:
            raise BadRequest(f"partition {where[1]} of {operator!r} is not on this worker "
                             "(a rescale moved it): retry")
        return codec.decode(store.get(key.encode()), now, key)
    if function == SCAN:
        if len(args) != 3:
            raise BadArguments(f"a scan takes [partition, prefix, limit], got {list(args)!r:.80}")
        partition, prefix, limit = args
        check_scan(prefix, limit)
        store = stores.get((operator, partition))
        if store is None:
            raise BadRequest(f"partition {partition!r:.20} of {operator!r} is not on this "
                             "worker (a rescale moved it): retry")
        return scan_partition(store, prefix, limit, codec, now)
    raise BadRequest(f"not a read: {function!r:.40}")
