"""The value codec: msgpack, never pickle.

Values users store, pass and return are msgpack-able Python values: ``None``, ``bool``,
``int`` (64-bit), ``float``, ``str``, ``bytes``, ``list``/``tuple`` and ``dict``. Tuples come
back as lists. Anything else raises :class:`~sfaas.errors.NotSerializable` naming the value.

Two limits bound what a value may be, checked on every path a value takes into or out of
the runtime (:func:`pack`, :func:`unpack`, :func:`check_serializable`, the wire decoders):
lists and dicts nest at most :data:`MAX_NESTING` levels deep (hostile input must not
drive recursion in a decoder, a ``repr`` or a user function), and a request or call
carries at most :data:`MAX_ARGS` arguments (:func:`check_arguments`).
"""

from __future__ import annotations

from typing import Any

import msgpack

from sfaas.errors import BadArguments, NotSerializable

__all__ = [
    "pack", "unpack", "check_serializable", "check_arguments", "too_deep", "MAX_NESTING",
    "MAX_ARGS",
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
    raises :class:`NotSerializable` naming ``what`` for bytes that are not such a value."""
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
