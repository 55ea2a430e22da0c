"""Expiring values: the one part of a value the stores look inside (``FORMAT.md`` §
"Expiring values").

A value is opaque bytes to a store, except that one starting with ``0xC1`` and a flags
byte whose bit 0 is set carries, in bytes 2..9, a big-endian u64 expiry time in ms since
the Unix epoch. The store's *horizon* (:meth:`Store.set_expiry_horizon
<statestores.base.Store.set_expiry_horizon>`) says which of them are *expired* (expiry ≤
horizon); merges drop those (or turn them into tombstones where an older version of the
key may live outside the merge). Reads never look: the runtime decides visibility with its
own clock. ``0xC1`` is the one byte msgpack never uses, so a plain msgpack value (the
runtime's other values) is told apart by its first byte alone.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

__all__ = [
    "MARKER", "FLAG_EXPIRES", "HEADER_SIZE", "MAX_MS", "expiry_ms", "expired", "expired_positions",
    "encode", "check_horizon",
]

#: First byte of a value with a header (msgpack's unused "never used" code).
MARKER = 0xC1
#: Bit of the flags byte (byte 1) saying bytes 2..9 hold the expiry time.
FLAG_EXPIRES = 0x01
#: Bytes a value needs for its expiry to count: marker, flags, u64.
HEADER_SIZE = 10

_U64 = struct.Struct(">Q")
_unpack = _U64.unpack_from
#: The largest expiry time (and horizon) there is.
MAX_MS = (1 << 64) - 1


def expiry_ms(value: bytes) -> int | None:
    """The expiry time (ms since the epoch) ``value`` carries, or None if it never expires.

    The common case — a value that is not ``0xC1``-prefixed — costs one byte compare.
    """
    if not value or value[0] != MARKER:
        return None
    if len(value) < HEADER_SIZE or not value[1] & FLAG_EXPIRES:
        return None
    t: int = _unpack(value, 2)[0]
    return t


def expired(value: bytes | None, horizon: int | None) -> bool:
    """Whether ``value`` (None: a tombstone, never) is expired at ``horizon`` (None: no
    horizon set, nothing is)."""
    if horizon is None or not value or value[0] != MARKER:
        return False
    t = expiry_ms(value)
    return t is not None and t <= horizon


def expired_positions(values: Iterable[bytes | None], horizon: int | None) -> list[int]:
    """Indexes of the expired values among ``values`` (a merge's chunk): one byte
    compare per value that is not ``0xC1``-prefixed."""
    if horizon is None:
        return []
    values = values if isinstance(values, list) else list(values)
    marked = [i for i, v in enumerate(values) if v and v[0] == MARKER]
    return [i for i in marked if (t := expiry_ms(values[i])) is not None and t <= horizon]  # type: ignore[arg-type]


def encode(expires_ms: int, payload: bytes = b"", flags: int = FLAG_EXPIRES) -> bytes:
    """A value that expires at ``expires_ms`` followed by ``payload`` (tests, tools; the
    runtime writes its own header, in this format)."""
    return bytes((MARKER, flags)) + _U64.pack(expires_ms) + payload


def check_horizon(t_ms: object) -> int:
    """``t_ms`` as a horizon, or a ``TypeError``/``ValueError`` naming it."""
    if isinstance(t_ms, bool) or not isinstance(t_ms, int):
        raise TypeError(
            f"expiry horizon must be an int (ms since the Unix epoch), got "
            f"{type(t_ms).__name__} {t_ms!r:.60}"
        )
    if not 0 <= t_ms <= MAX_MS:
        raise ValueError(
            f"expiry horizon must be an int in [0, 2**64 - 1] (ms since the Unix epoch), "
            f"got {t_ms}"
        )
    return t_ms
