"""Argument checks and engine options, shared by every engine: bad input gets an error
that names it and says what was expected, before anything is changed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_VALUE_BYTES",
    "SYNC_MODES",
    "Option",
    "check_key",
    "check_value",
    "check_put",
    "check_ops",
    "parse_options",
]

#: Largest key accepted (keys of 64 KiB must fit).
MAX_KEY_BYTES = 1 << 20
#: Largest value accepted (values of 64 MiB must fit).
MAX_VALUE_BYTES = 1 << 28

def check_key(key: object) -> bytes:
    """Return ``key`` as ``bytes`` or raise a ``TypeError``/``ValueError`` naming it."""
    if isinstance(key, (bytearray, memoryview)):
        key = bytes(key)
    if not isinstance(key, bytes):
        raise TypeError(f"key must be bytes, got {type(key).__name__}: {key!r:.80}")
    if not key:
        raise ValueError("key must not be empty (b'')")
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(
            f"key of {len(key)} bytes is larger than the maximum {MAX_KEY_BYTES} bytes"
        )
    return key


def check_value(value: object, key: bytes = b"") -> bytes:
    """Return ``value`` as ``bytes`` or raise a ``TypeError``/``ValueError`` naming it."""
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise TypeError(
            f"value for key {key!r:.60} must be bytes, got {type(value).__name__} "
            "(use store.delete(key) to delete)"
            if value is None
            else f"value for key {key!r:.60} must be bytes, got {type(value).__name__}"
        )
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(
            f"value for key {key!r:.60} of {len(value)} bytes is larger than the maximum "
            f"{MAX_VALUE_BYTES} bytes"
        )
    return value


def check_put(key: object, value: object) -> tuple[bytes, bytes]:
    """``(key, value)`` of a ``put`` checked: both ``bytes`` (a ``bytearray`` or
    ``memoryview`` is copied), the key non-empty, both within their limits; otherwise a
    ``TypeError``/``ValueError`` naming them. Every engine's ``put`` calls it first."""
    if (
        type(key) is not bytes
        or type(value) is not bytes
        or not key
        or len(key) > MAX_KEY_BYTES
        or len(value) > MAX_VALUE_BYTES
    ):
        key = check_key(key)
        return key, check_value(value, key)
    return key, value


def check_ops(ops: Iterable[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
    """Validate a whole batch before anything is applied (a bad op leaves the store intact)."""
    checked: list[tuple[bytes, bytes | None]] = []
    for i, op in enumerate(ops):
        try:
            key, value = op
        except (TypeError, ValueError):
            raise TypeError(
                f"write_batch op #{i} must be a (key, value) pair, got {op!r:.80}"
            ) from None
        key = check_key(key)
        checked.append((key, None if value is None else check_value(value, key)))
    return checked


@dataclass(frozen=True)
class Option:
    """One engine option: its default, accepted types, and a check with a message."""

    default: Any
    types: type | tuple[type, ...]
    check: Any = None  # callable(value) -> bool
    expect: str = ""  # what a valid value looks like, for the error message




SYNC_MODES = ("none", "os", "fsync")


def parse_options(
    engine: str, options: dict[str, Option], default_sync: str, given: dict[str, Any]
) -> dict[str, Any]:
    """``given`` checked against ``options`` (plus ``sync``), defaults filled in; a
    ``TypeError``/``ValueError`` naming the option and what was expected otherwise."""
    specs = dict(options)
    specs["sync"] = Option(
        default_sync, str, lambda v: v in SYNC_MODES, "one of 'none', 'os', 'fsync'"
    )
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise TypeError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for engine {engine!r}; "
            f"known: {', '.join(sorted(specs))}"
        )
    out: dict[str, Any] = {}
    for name, spec in specs.items():
        if name not in given:
            out[name] = spec.default
            continue
        value = given[name]
        if isinstance(value, bool) and spec.types in (int, float, (int, float)):
            raise TypeError(
                f"option {name!r} for engine {engine!r} must be {spec.expect or spec.types}, got "
                f"{value!r}"
            )
        if spec.types is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, spec.types):
            raise TypeError(
                f"option {name!r} for engine {engine!r} must be {spec.expect or spec.types}, "
                f"got {type(value).__name__} {value!r:.60}"
            )
        if spec.check is not None and not spec.check(value):
            raise ValueError(
                f"option {name!r} for engine {engine!r} must be {spec.expect}, got {value!r:.60}"
            )
        out[name] = value
    return out
