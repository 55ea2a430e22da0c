"""The value codec: msgpack, never pickle.

Values users store, pass and return are msgpack-able Python values: ``None``, ``bool``,
``int`` (64-bit), ``float``, ``str``, ``bytes``, ``list``/``tuple`` and ``dict``. Tuples come
back as lists. Anything else raises :class:`~sfaas.errors.NotSerializable` naming the value.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .errors import NotSerializable

__all__ = ["pack", "unpack", "check_serializable", "MAX_NESTING"]

#: Deepest list/dict nesting accepted when decoding (bounds recursion on hostile input).
MAX_NESTING = 64

_packer_default_error = "not msgpack-able"


def _default(obj: Any) -> Any:
    raise TypeError(f"{type(obj).__name__} {_packer_default_error}")


def pack(value: Any, what: str = "value") -> bytes:
    """Encode ``value``; raise :class:`NotSerializable` naming ``what`` when it cannot be."""
    try:
        return msgpack.packb(value, use_bin_type=True, default=_default)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise NotSerializable(
            f"{what} {value!r:.100} is not serializable ({exc}); use None, bool, int, float, "
            "str, bytes, list or dict"
        ) from None


def unpack(data: bytes) -> Any:
    """Decode bytes produced by :func:`pack` (strict: no extension types, bounded sizes)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)


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
