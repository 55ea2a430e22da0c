"""Stored values: the schema version and expiry an operator's values carry in its store.

A value of a plain operator (neither ``version > 1`` nor ``ttl``) is stored as its msgpack
bytes (:func:`sfaas.runtime.codec.pack`), as it always was. An operator declared with
``version=N`` or ``ttl=seconds`` wraps the msgpack body in an *envelope* (specified byte by
byte in ``sfaas/runtime/FORMAT.md``, "Stored values")::

    0xC1  flags  [expiry: 8 bytes, ms since the Unix epoch]  [version: 2 bytes]  body

``0xC1`` is the one byte msgpack never produces, so a reader tells the two apart by the
first byte and old plain values stay readable (as schema version 1, never expiring).
All integers are big-endian unsigned. The bytes are built and split by
:func:`sfaas.runtime.codec.envelope` / :func:`~sfaas.runtime.codec.open_envelope`; this
module gives them their meaning.

:class:`ValueCodec` is one operator's encoder/decoder: :meth:`~ValueCodec.encode` stamps a
value with the code's version and ``now + ttl``; :meth:`~ValueCodec.decode` hides a value
whose expiry is at or before the reader's ``now``, passes an older schema version through
the operator's upcasters and refuses a newer one (:class:`~sfaas.errors.SchemaTooNew`).
Both are pure functions of their arguments (``now`` included), so a transaction's re-runs,
the determinism check and a recovery's replay see exactly what its first run saw.

The runtime's own records (keys starting with ``"\\x00"``: timers, actions, kept outcomes,
see :mod:`sfaas.runtime.txn.internal`) never pass through here: they keep their format and
never expire.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sfaas.errors import NotSerializable, SchemaTooNew, UpcastFailed
from sfaas.runtime.codec import (
    EXPIRES,
    MARK,
    MAX_VERSION,
    VERSIONED,
    envelope,
    open_envelope,
    pack,
    unpack,
)

if TYPE_CHECKING:
    from sfaas.app import App, Operator

__all__ = [
    "MARK", "EXPIRES", "VERSIONED", "MAX_VERSION", "ValueCodec", "Values", "codecs", "envelope",
    "open_envelope", "to_ms", "set_horizon", "HORIZON_LAG",
]

#: How far behind the oldest ``now`` a participant still runs transactions with the
#: expiry horizon its stores get stays (seconds): a store may drop an expired value only
#: when no transaction can still read it as live — not a re-run, not a run parked at an
#: effect, not a call from another worker's such run (see :func:`set_horizon`).
HORIZON_LAG = 60.0


def to_ms(t: float) -> int:
    """``t`` seconds as whole milliseconds, rounded down (every expiry comparison uses it)."""
    return math.floor(t * 1000.0)


class ValueCodec:
    """One operator's stored-value codec (see module docstring)."""

    __slots__ = ("operator", "version", "upcast", "ttl", "plain")

    def __init__(self, operator: str, version: int = 1,
                 upcast: Mapping[int, Callable[[Any], Any]] | None = None,
                 ttl: float | None = None) -> None:
        self.operator = operator
        self.version = version
        self.upcast = dict(upcast or {})
        self.ttl = ttl
        #: writes plain msgpack (no envelope): what every operator did before versions/TTL
        self.plain = version == 1 and ttl is None

    @classmethod
    def of(cls, op: Operator) -> ValueCodec:
        """The codec of a declared operator."""
        return cls(op.name, op.version, op.upcast, op.ttl)

    def encode(self, value: Any, now: float | None, key: str = "?") -> bytes:
        """The stored bytes of ``value`` written at ``now`` (seconds; needed with a ttl)."""
        body = pack(value, f"value for {self.operator}/{key!r}")
        if self.plain:
            return body
        expiry = None
        if self.ttl is not None:
            if now is None:
                raise ValueError(f"writing {self.operator}/{key!r} (ttl) needs the time")
            # (at least the next ms: a value is never expired for the run that wrote it)
            expiry = max(to_ms(now + self.ttl), to_ms(now) + 1)
        return envelope(body, expiry, self.version)

    def decode(self, raw: bytes | None, now: float | None, key: str = "?",
               default: Any = None) -> Any:
        """The value stored as ``raw`` as the code sees it at ``now``: ``default`` when there
        is none or it expired (expiry ≤ ``now``; ``now`` None: expiry not checked), else
        upcast to the code's version. Raises :class:`SchemaTooNew`, :class:`UpcastFailed`,
        :class:`BadStoredValue`."""
        if raw is None:
            return default
        if raw[:1] != b"\xc1":  # plain msgpack: version 1, never expires (the hot path)
            try:
                value = unpack(raw)
            except NotSerializable as exc:
                raise NotSerializable(f"stored value {self.operator}/{key!r}: {exc.reason}"
                                      ) from None
            return value if self.version == 1 else self._upcast(value, 1, key)
        where = f"stored value {self.operator}/{key!r}"
        expiry, version, body = open_envelope(raw, where)
        if expiry is not None and now is not None and expiry <= to_ms(now):
            return default
        if version > self.version:
            raise SchemaTooNew(
                f"{where} has schema version {version}, newer than the code's version "
                f"{self.version} of operator {self.operator!r}: deploy code declaring "
                f"version={version} or later (with upcasters), never older code over newer data")
        value = unpack(body, where)
        return value if version == self.version else self._upcast(value, version, key)

    def live(self, raw: bytes, now: float | None) -> bool:
        """Whether ``raw`` has not expired at ``now`` (without decoding its body)."""
        if raw[:1] != b"\xc1" or now is None:
            return True
        expiry = open_envelope(raw, f"stored value of {self.operator}")[0]
        return expiry is None or expiry > to_ms(now)

    def _upcast(self, value: Any, version: int, key: str) -> Any:
        """``value`` of schema ``version`` through ``upcast[version]``, … up to the code's."""
        for v in range(version, self.version):
            fn = self.upcast[v]
            name = getattr(fn, "__qualname__", repr(fn))
            try:
                value = fn(value)
            except Exception as exc:
                raise UpcastFailed(
                    f"upcaster {v}→{v + 1} ({name}) of operator {self.operator!r} failed on key "
                    f"{key!r:.80}: {type(exc).__name__}: {exc}") from exc
            try:  # what a function then sees is what msgpack would give back (tuples → lists)
                value = unpack(pack(value))
            except NotSerializable as exc:
                raise UpcastFailed(
                    f"upcaster {v}→{v + 1} ({name}) of operator {self.operator!r} returned "
                    f"{value!r:.80} for key {key!r:.80}, which is not msgpack-able: "
                    f"{exc.reason}") from None
        return value

    def __repr__(self) -> str:
        return (f"ValueCodec({self.operator!r}, version={self.version}, "
                f"upcast={sorted(self.upcast)}, ttl={self.ttl})")


def codecs(app: App) -> dict[str, ValueCodec]:
    """Each operator's codec, by operator name."""
    return {name: ValueCodec.of(op) for name, op in app.operators.items()}


class Values:
    """The stored values of an app's operators: each key's bytes through its operator's
    :class:`ValueCodec` — except the runtime's records (keys starting with ``"\\x00"``),
    which stay plain msgpack and never expire."""

    __slots__ = ("codecs", "ttl_operators")

    def __init__(self, app: App) -> None:
        self.codecs = codecs(app)
        #: the operators declared with a ttl (whose stores get an expiry horizon)
        self.ttl_operators = frozenset(n for n, c in self.codecs.items() if c.ttl is not None)

    def __getitem__(self, operator: str) -> ValueCodec:
        return self.codecs[operator]

    def encode(self, operator: str, key: str, value: Any, now: float | None) -> bytes:
        """The bytes storing ``value`` at ``operator``/``key``, written at ``now``."""
        if key[:1] == "\x00":
            return pack(value, f"value for {operator}/{key!r}")
        return self.codecs[operator].encode(value, now, key)

    def decode(self, operator: str, key: str, raw: bytes | None, now: float | None,
               default: Any = None) -> Any:
        """The value ``raw`` stores at ``operator``/``key`` as seen at ``now``
        (:meth:`ValueCodec.decode`)."""
        if key[:1] == "\x00":
            return default if raw is None else unpack(raw)
        return self.codecs[operator].decode(raw, now, key, default)


def set_horizon(stores: Mapping[tuple[str, int], Any], ttl_operators: Iterable[str],
                oldest_now: float) -> int | None:
    """Tell the stores of the ``ttl_operators`` that their merges may drop values expired
    by ``oldest_now - HORIZON_LAG`` (``oldest_now``: the oldest ``now`` a transaction
    still holds here). Returns the horizon (ms), None when no store was told.

    A store's merges drop what expired by its horizon, but reads are never filtered by it:
    the readers decide with their own ``now`` (:meth:`ValueCodec.decode`). Dropping only
    what no transaction can still read as live keeps re-runs and replays deterministic."""
    ops = set(ttl_operators)
    if not ops:
        return None
    horizon = max(0, to_ms(oldest_now - HORIZON_LAG))
    told = False
    for (op, _), store in stores.items():
        if op in ops:
            store.set_expiry_horizon(horizon)
            told = True
    return horizon if told else None
