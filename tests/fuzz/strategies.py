"""Hostile inputs: random bytes, mutations of valid encodings, msgpack of the wrong shape.

Mutating a valid encoding (bit flips, truncation, splices, huge length prefixes, bytes
that are msgpack type markers) gets much further into a decoder than random bytes do;
:func:`wrong_fields` keeps a message's framing and replaces fields with values of other
types, which is what reaches the checks behind the framing.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
from hypothesis import strategies as st

#: msgpack markers that announce large or nested things (array32, map32, bin32, str32, ext32, ...)
MARKERS = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
           b"\xc9\xff\xff\xff\xff\x01", b"\xdc\xff\xff", b"\xde\xff\xff", b"\x9f", b"\x8f", b"\xc1", b"\xc0",
           b"\xd4\x00\x00", b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", b"\xd3\x80\x00\x00\x00\x00\x00\x00\x00",
           b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00"]
#: little- and big-endian length prefixes that are huge, zero or negative-looking
HUGE = [struct.pack("<I", 0xFFFFFFFF), struct.pack(">I", 0xFFFFFFFF), struct.pack("<Q", 1 << 62),
        struct.pack("<I", 0x7FFFFFFF), struct.pack(">I", 0x7FFFFFFF), b"\x00\x00\x00\x00",
        struct.pack(">I", (64 << 20) + 1), struct.pack("<I", (16 << 20) + 1)]

INT_EDGES = [0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, -(2**63), 2**64 - 1, 255, 256, 65535]


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), st.sampled_from(INT_EDGES), st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.binary(max_size=20),
    )


def values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """Any msgpack-able value (nested lists and maps of scalars)."""
    return st.recursive(
        scalars(),
        lambda inner: st.one_of(st.lists(inner, max_size=5),
                                st.dictionaries(st.one_of(st.text(max_size=5), st.integers(-5, 5)), inner, max_size=4)),
        max_leaves=max_leaves,
    )


def deep(depth: int, leaf: Any = 0) -> Any:
    """A list nested ``depth`` levels deep."""
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


@st.composite
def deep_values(draw: st.DrawFn) -> Any:
    """Values around and far beyond the nesting limit (msgpack itself stops at 1024)."""
    return deep(draw(st.sampled_from([63, 64, 65, 100, 500, 1000])), draw(scalars()))


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid encoding with one to four mutations."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "flip", "truncate", "splice", "insert", "delete", "marker",
                                   "huge", "duplicate", "zero"]))
        n = len(data)
        pos = draw(st.integers(0, n)) if n else 0
        if op == "flip" and n:
            i = min(pos, n - 1)
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[pos:]
        elif op == "splice":
            other = draw(valid)
            cut = draw(st.integers(0, len(other)))
            data[pos:] = other[cut:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and n:
            del data[pos:pos + draw(st.integers(1, 16))]
        elif op == "marker":
            m = draw(st.sampled_from(MARKERS))
            data[pos:pos + len(m)] = m
        elif op == "huge":
            h = draw(st.sampled_from(HUGE))
            data[pos:pos + len(h)] = h
        elif op == "duplicate" and n:
            end = min(n, pos + draw(st.integers(1, 64)))
            data[pos:pos] = data[pos:end]
        elif op == "zero" and n:
            end = min(n, pos + draw(st.integers(1, 32)))
            data[pos:end] = bytes(end - pos)
    return bytes(data)


def hostile(valid: st.SearchStrategy[bytes], *extra: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Random bytes, mutations of ``valid``, and ``extra`` strategies, mixed."""
    return st.one_of(
        st.binary(max_size=256),
        mutated(valid),
        mutated(valid),
        mutated(valid),
        *extra,
    )


@st.composite
def wrong_fields(draw: st.DrawFn, valid: st.SearchStrategy[list[Any]]) -> list[Any]:
    """A valid field list with some fields replaced by other values, removed or added."""
    fields = list(draw(valid))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["replace", "replace", "replace", "deep", "drop", "add"]))
        if op == "replace" and fields:
            fields[draw(st.integers(0, len(fields) - 1))] = draw(values())
        elif op == "deep" and fields:
            fields[draw(st.integers(0, len(fields) - 1))] = draw(deep_values())
        elif op == "drop" and fields:
            del fields[draw(st.integers(0, len(fields) - 1))]
        elif op == "add":
            fields.insert(draw(st.integers(0, len(fields))), draw(values()))
    return fields


def packed(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """``strategy``'s values as msgpack (values msgpack cannot encode are skipped)."""

    def pack(v: Any) -> bytes:
        try:
            return msgpack.packb(v, use_bin_type=True)  # type: ignore[no-any-return]
        except (TypeError, ValueError, OverflowError):
            return b"\xc0"

    return strategy.map(pack)


def deep_msgpack() -> st.SearchStrategy[bytes]:
    """Raw msgpack nested far beyond any limit (fixarray headers), as a whole or a field."""
    return st.sampled_from([60, 64, 65, 200, 1023, 1024, 5000]).map(lambda n: b"\x91" * n + b"\xc0")


def one_of_encoders(encoders: Sequence[Callable[[], bytes]]) -> st.SearchStrategy[bytes]:
    return st.sampled_from(list(encoders)).map(lambda f: f())


def mix(*weighted: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Draw from the strategies in proportion to their weights (``one_of`` leans on its
    first branches; this keeps the share of valid and hostile inputs as written)."""
    pool = [s for w, s in weighted for _ in range(w)]
    return st.sampled_from(pool).flatmap(lambda s: s)
