"""The value codec: msgpack, never pickle.

Values users store, pass and return are msgpack-able Python values: ``None``, ``bool``,
``int`` (64-bit), ``float``, ``str``, ``bytes``, ``list``/``tuple`` and ``dict``. Tuples come
back as lists. Anything else raises :class:`~sfaas.errors.NotSerializable` naming the value.

Two limits bound what a value may be, checked on every path a value takes into or out of
the runtime (:func:`pack`, :func:`unpack`, :func:`check_serializable`, the wire decoders):
lists and dicts nest at most :data:`MAX_NESTING` levels deep (hostile input must not
drive recursion in a decoder, a ``repr`` or a user function), and a request or call
carries at most :data:`MAX_ARGS` arguments (:func:`check_arguments`).

A stored value may wrap its msgpack body in an *envelope* — ``0xC1``, flags, an optional
expiry and schema version (``sfaas/runtime/FORMAT.md``, "Stored values"): :func:`envelope`
and :func:`open_envelope` build and split its bytes; :mod:`sfaas.runtime.values` gives
them their meaning (expiry, upcasting).
"""

from __future__ import annotations

from typing import Any

import msgpack

from sfaas.errors import BadArguments, BadStoredValue, NotSerializable

__all__ = [
    "pack", "unpack", "check_serializable", "check_arguments", "too_deep", "MAX_NESTING",
    "MAX_ARGS", "envelope", "open_envelope", "MARK", "EXPIRES", "VERSIONED", "MAX_VERSION",
]

#: Deepest list/dict nesting of a value (a flat list is 1 deep); deeper values are refused
#: when encoding and decoding (bounds recursion on hostile input).
MAX_NESTING = 64
#: Most arguments one request or call may carry.
MAX_ARGS = 256

_CONTAINERS = (list, dict, tuple)


def too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether ``value`` nests lists/dicts/tuples more than ``limit`` levels deep.

    Iterative (no recursion, whatever the input) and quick for scalars and flat lists.
    """
    if type(value) not in _CONTAINERS:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        if type(v) is dict:
            for k, x in v.items():
                if type(k) in _CONTAINERS:
                    stack.append((k, depth + 1))
                if type(x) in _CONTAINERS:
                    stack.append((x, depth + 1))
        else:
            for x in v:
                if type(x) in _CONTAINERS:
                    stack.append((x, depth + 1))
    return False


def _nesting_error(what: str) -> NotSerializable:
    return NotSerializable(f"{what} nests lists/dicts more than {MAX_NESTING} levels deep "
                           "(the limit, MAX_NESTING)")

_packer_default_error = "not msgpack-able"


def _default(obj: Any) -> Any:
    raise TypeError(f"{type(obj).__name__} {_packer_default_error}")


def pack(value: Any, what: str = "value") -> bytes:
    """Encode ``value``; raise :class:`NotSerializable` naming ``what`` when it cannot be."""
    if type(value) in _CONTAINERS and too_deep(value):
        raise _nesting_error(what)
    try:
        return msgpack.packb(value, use_bin_type=True, default=_default)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise NotSerializable(
            f"{what} {value!r:.100} is not serializable ({exc}); use None, bool, int, float, "
            "str, bytes, list or dict"
        ) from None


def unpack(data: bytes, what: str = "value") -> Any:
    """Decode bytes produced by :func:`pack` (strict: no extension types, bounded sizes);
    raises :class:`NotSerializable` naming ``what`` for bytes that are not such a value.

    Bytes starting with ``0xC1`` (which msgpack never produces) are a stored value's
    envelope (:mod:`sfaas.runtime.values`): its body is decoded, its expiry and schema
    version are *not* looked at — what code showing stored bytes (the determinism check's
    message) needs; reads of state go through ``runtime.values``, which honours them."""
    if data[:1] == b"\xc1":
        data = open_envelope(data, what)[2]
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several types for malformed input
        raise NotSerializable(f"{what} does not decode: {type(exc).__name__}: {exc}") from None
    if type(value) in _CONTAINERS and too_deep(value):
        raise _nesting_error(what)
    return value


_SCALARS = (str, float, bool, bytes, type(None))


def check_serializable(value: Any, what: str = "value") -> None:
    """Raise :class:`NotSerializable` if ``value`` cannot cross a process boundary."""
    if type(value) in _SCALARS:
        return
    if type(value) is int and -(1 << 63) <= value < (1 << 64):
        return
    if type(value) in (list, tuple) and all(
        type(v) in _SCALARS or (type(v) is int and -(1 << 63) <= v < (1 << 64)) for v in value
    ):
        return  # flat lists of scalars (most argument lists) skip the trial encoding
    pack(value, what)


def check_arguments(args: Any, what: str = "arguments") -> None:
    """Raise :class:`BadArguments` for more than :data:`MAX_ARGS` arguments and
    :class:`NotSerializable` for arguments that cannot cross a process boundary."""
    if len(args) > MAX_ARGS:
        raise BadArguments(
            f"{what}: {len(args)} arguments, more than the limit of {MAX_ARGS} (MAX_ARGS)")
    check_serializable(args, what)


# -- the envelope of a stored value (its meaning: sfaas.runtime.values) ------------------------
#: The first byte of an envelope (msgpack's one unused byte).
MARK = 0xC1
#: Flag bit: an 8-byte expiry (ms since the Unix epoch) follows the flags.
EXPIRES = 1
#: Flag bit: a 2-byte schema version follows (after the expiry, if any).
VERSIONED = 2
_KNOWN_FLAGS = EXPIRES | VERSIONED
#: Highest schema version (it is stored in 2 bytes).
MAX_VERSION = 0xFFFF
_MAX_EXPIRY = (1 << 64) - 1


def envelope(body: bytes, expiry_ms: int | None = None, version: int = 1) -> bytes:
    """``body`` (msgpack bytes) wrapped with an expiry (when not None) and a schema version
    (when above 1); just ``body`` when neither."""
    flags = 0
    head = b""
    if expiry_ms is not None:
        if not 0 <= expiry_ms <= _MAX_EXPIRY:
            raise ValueError(f"an expiry must be 0..2**64-1 ms, got {expiry_ms}")
        flags |= EXPIRES
        head += expiry_ms.to_bytes(8, "big")
    if version != 1:
        if not 1 <= version <= MAX_VERSION:
            raise ValueError(f"a schema version must be 1..{MAX_VERSION}, got {version}")
        flags |= VERSIONED
        head += version.to_bytes(2, "big")
    if not flags:
        return body
    return bytes((MARK, flags)) + head + body


def open_envelope(raw: bytes, what: str = "stored value") -> tuple[int | None, int, bytes]:
    """``(expiry ms or None, schema version, msgpack body)`` of a stored value; raises
    :class:`BadStoredValue` naming ``what`` for a truncated envelope or unknown flags."""
    if raw[:1] != b"\xc1":
        return None, 1, raw
    if len(raw) < 2:
        raise BadStoredValue(f"{what}: an envelope without its flags byte")
    flags = raw[1]
    if flags & ~_KNOWN_FLAGS:
        raise BadStoredValue(
            f"{what}: unknown envelope flags 0x{flags:02x} (known: 0x01 expiry, 0x02 schema "
            "version; written by a newer sfaas?)")
    pos = 2
    expiry = None
    version = 1
    if flags & EXPIRES:
        if len(raw) < pos + 8:
            raise BadStoredValue(f"{what}: the envelope's expiry is truncated")
        expiry = int.from_bytes(raw[pos:pos + 8], "big")
        pos += 8
    if flags & VERSIONED:
        if len(raw) < pos + 2:
            raise BadStoredValue(f"{what}: the envelope's schema version is truncated")
        version = int.from_bytes(raw[pos:pos + 2], "big")
        pos += 2
        if version < 1:
            raise BadStoredValue(f"{what}: schema version 0 (versions start at 1)")
    return expiry, version, raw[pos:]
