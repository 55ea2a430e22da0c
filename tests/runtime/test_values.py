"""The stored-value codec (``sfaas.runtime.values``): envelopes byte by byte, expiry,
schema upcasting, refusals, and the declarations that configure them."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statestores
from sfaas import App, ConfigError, SchemaTooNew, UpcastFailed
from sfaas.errors import BadStoredValue, TransactionAborted, error_class
from sfaas.runtime.codec import pack
from sfaas.runtime.values import (
    HORIZON_LAG,
    MARK,
    ValueCodec,
    Values,
    envelope,
    open_envelope,
    set_horizon,
    to_ms,
)

BODY = pack({"qty": 3})


# -- the envelope ---------------------------------------------------------------------------
@pytest.mark.parametrize("expiry", [None, 0, 1_700_000_000_123, (1 << 64) - 1])
@pytest.mark.parametrize("version", [1, 2, 65535])
def test_every_flag_combination_round_trips(expiry: int | None, version: int) -> None:
    raw = envelope(BODY, expiry, version)
    assert open_envelope(raw) == (expiry, version, BODY)
    if expiry is None and version == 1:
        assert raw == BODY  # no overhead, no format change
        return
    flags = (1 if expiry is not None else 0) | (2 if version != 1 else 0)
    head = bytes((MARK, flags))
    if expiry is not None:
        head += expiry.to_bytes(8, "big")
    if version != 1:
        head += version.to_bytes(2, "big")
    assert raw == head + BODY


def test_the_expiry_sits_where_the_stores_look_for_it() -> None:
    raw = envelope(BODY, 1234567, 7)
    assert statestores.expiry.expiry_ms(raw) == 1234567
    assert statestores.expiry.expiry_ms(envelope(BODY, None, 7)) is None
    assert statestores.expiry.expiry_ms(BODY) is None


def test_msgpack_never_starts_with_the_mark() -> None:
    for v in [None, True, 0, -1, 1 << 40, 1.5, "", "x" * 300, b"", [], {}, [1] * 20,
              {str(i): i for i in range(20)}]:
        assert pack(v)[0] != MARK


@pytest.mark.parametrize("raw,words", [
    (b"\xc1\x04" + BODY, "unknown envelope flags 0x04"),
    (b"\xc1\x83" + bytes(10) + BODY, "unknown envelope flags 0x83"),
    (b"\xc1", "without its flags byte"),
    (b"\xc1\x01\x00\x00", "expiry is truncated"),
    (b"\xc1\x02\x00", "schema version is truncated"),
    (b"\xc1\x03" + bytes(8) + b"\x01", "schema version is truncated"),
    (b"\xc1\x02\x00\x00" + BODY, "schema version 0"),
])
def test_malformed_envelopes_are_refused_by_name(raw: bytes, words: str) -> None:
    with pytest.raises(BadStoredValue, match=words):
        open_envelope(raw, "stored value orders/'a'")
    with pytest.raises(BadStoredValue, match="orders/'a'"):
        ValueCodec("orders", 2, {1: lambda v: v}).decode(raw, 0.0, "a")


def test_envelope_refuses_out_of_range_fields() -> None:
    with pytest.raises(ValueError, match="schema version"):
        envelope(BODY, None, 0)
    with pytest.raises(ValueError, match="schema version"):
        envelope(BODY, None, 1 << 16)
    with pytest.raises(ValueError, match="expiry"):
        envelope(BODY, -1)


# -- the codec -----------------------------------------------------------------------------
def test_a_plain_operator_writes_plain_msgpack() -> None:
    c = ValueCodec("accounts")
    assert c.plain and c.encode({"a": [1, 2]}, 5.0) == pack({"a": [1, 2]})
    assert c.decode(pack(7), 5.0) == 7
    assert c.decode(None, 5.0, default="d") == "d"


def test_ttl_values_expire_at_write_time_plus_ttl() -> None:
    c = ValueCodec("sessions", ttl=10)
    raw = c.encode("s", 1000.0, "k")
    assert open_envelope(raw) == (1_010_000, 1, pack("s"))
    assert c.decode(raw, 1000.0) == "s"
    assert c.decode(raw, 1009.999) == "s"
    assert c.decode(raw, 1010.0, default="gone") == "gone"
    assert c.decode(raw, 5000.0) is None
    assert c.live(raw, 1009.999) and not c.live(raw, 1010.0)
    # a plain value (written before the ttl was declared) never expires
    assert c.decode(pack("old"), 1e12) == "old"
    with pytest.raises(ValueError, match="sessions"):
        c.encode("s", None, "k")


def test_expiry_is_honoured_whatever_the_code_declares() -> None:
    # a value written under a ttl stays expiring if the ttl is dropped from the code
    raw = ValueCodec("sessions", ttl=1).encode("s", 100.0)
    assert ValueCodec("sessions").decode(raw, 100.5) == "s"
    assert ValueCodec("sessions").decode(raw, 101.0) is None


def test_upcasters_chain_from_any_older_version() -> None:
    v1_to_v2 = lambda v: {"qty": v}  # noqa: E731
    v2_to_v3 = lambda v: {**v, "note": ""}  # noqa: E731
    v3 = ValueCodec("orders", 3, {1: v1_to_v2, 2: v2_to_v3})
    v2 = ValueCodec("orders", 2, {1: v1_to_v2})
    plain = ValueCodec("orders").encode(5, 0.0)
    assert v3.decode(plain, 0.0) == {"qty": 5, "note": ""}
    assert v3.decode(v2.encode({"qty": 6}, 0.0), 0.0) == {"qty": 6, "note": ""}
    assert v3.decode(v3.encode({"qty": 7, "note": "x"}, 0.0), 0.0) == {"qty": 7, "note": "x"}
    assert open_envelope(v3.encode(1, 0.0))[1] == 3
    assert v2.decode(plain, 0.0) == {"qty": 5}


def test_a_value_newer_than_the_code_is_refused_naming_everything() -> None:
    raw = ValueCodec("orders", 3, {1: str, 2: str}).encode("x", 0.0)
    with pytest.raises(SchemaTooNew) as info:
        ValueCodec("orders", 2, {1: str}).decode(raw, 0.0, "o-17")
    msg = str(info.value)
    assert "'orders'" in msg and "'o-17'" in msg and "version 3" in msg and "version 2" in msg
    with pytest.raises(SchemaTooNew):
        ValueCodec("orders").decode(raw, 0.0, "o-17")
    assert isinstance(info.value, TransactionAborted)
    assert error_class("SchemaTooNew") is SchemaTooNew  # a client raises the same class


def test_an_expired_too_new_value_is_just_absent() -> None:
    raw = ValueCodec("s", 3, {1: str, 2: str}, ttl=1).encode("x", 0.0)
    assert ValueCodec("s").decode(raw, 2.0, "k", "none") == "none"


def test_upcaster_results_must_be_msgpack_values() -> None:
    bad = ValueCodec("orders", 2, {1: lambda v: {v}})
    with pytest.raises(UpcastFailed, match=r"upcaster 1→2 .* 'orders' .* not msgpack-able"):
        bad.decode(pack(1), 0.0, "k")
    boom = ValueCodec("orders", 2, {1: lambda v: v["missing"]})
    with pytest.raises(UpcastFailed, match=r"'orders' failed on key 'k': KeyError"):
        boom.decode(pack({}), 0.0, "k")
    # what a function sees is what msgpack would give back: tuples become lists
    assert ValueCodec("orders", 2, {1: lambda v: (v, v)}).decode(pack(1), 0.0) == [1, 1]


def test_internal_records_are_never_enveloped_nor_expired() -> None:
    app = App("vals")
    app.operator("sessions", ttl=1, version=2, upcast={1: str})
    vals = Values(app)
    record = ["accounts", "k", "f", [], 1.0]
    raw = vals.encode("sessions", "\x00t0000.1.0\x00k", record, 0.0)
    assert raw == pack(record)
    assert vals.decode("sessions", "\x00t0000.1.0\x00k", raw, 1e12) == record
    assert vals.encode("sessions", "k", 1, 0.0)[0] == MARK
    assert vals.ttl_operators == {"sessions"}


values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(value=values, now=st.floats(0, 4e9), ttl=st.none() | st.floats(0.001, 1e6),
       version=st.integers(1, 65535))
def test_any_value_round_trips_until_it_expires(value: Any, now: float, ttl: float | None,
                                                  version: int) -> None:
    upcast = {v: (lambda x: x) for v in range(1, version)}
    c = ValueCodec("op", version, upcast, ttl)
    raw = c.encode(value, now, "k")
    assert raw == c.encode(value, now, "k")  # deterministic given now
    assert c.decode(raw, now, "k", "absent") == value
    expiry, stored_version, body = open_envelope(raw)
    assert stored_version == version and msgpack.unpackb(body, raw=False) == value
    if ttl is None:
        assert expiry is None and c.decode(raw, 1e12, "k", "absent") == value
    else:
        assert expiry == max(to_ms(now + ttl), to_ms(now) + 1)
        assert c.decode(raw, (expiry + 1) / 1000, "k", "absent") == "absent"


# -- declarations ----------------------------------------------------------------------------
def _declare(**kw: Any) -> None:
    App("decl").operator("orders", **kw)


@pytest.mark.parametrize("kw,words", [
    ({"version": 0}, "version must be an int from 1 to 65535, got 0"),
    ({"version": "2"}, "version must be an int from 1 to 65535, got '2'"),
    ({"version": True}, "version must be an int"),
    ({"version": 70000}, "got 70000"),
    ({"version": 2}, r"needs upcast keys exactly \[1\].*missing \[1\]"),
    ({"version": 3, "upcast": {1: str}}, r"exactly \[1, 2\].*missing \[2\]"),
    ({"version": 2, "upcast": {1: str, 2: str}}, r"unexpected \[2\]"),
    ({"upcast": {1: str}}, r"version=1 needs upcast keys exactly \[\].*unexpected \[1\]"),
    ({"version": 2, "upcast": {"1": str}}, r"unexpected \['1'\]"),
    ({"version": 2, "upcast": [str]}, "upcast must be a dict"),
    ({"version": 2, "upcast": {1: "str"}}, r"upcast\[1\] must be a plain function"),
    ({"ttl": 0}, "ttl must be None or a number of seconds > 0"),
    ({"ttl": -5}, "got -5"),
    ({"ttl": "60"}, "got '60'"),
    ({"ttl": True}, "ttl must be"),
    ({"ttl": math.nan}, "got nan"),
    ({"ttl": math.inf}, "got inf"),
])
def test_bad_declarations_name_the_operator_and_the_input(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        _declare(**kw)
    assert "operator 'orders'" in str(info.value)


def test_an_async_upcaster_is_refused() -> None:
    async def up(v: Any) -> Any:
        return v

    with pytest.raises(ConfigError, match=r"upcast\[1\] must be a plain function .*not async"):
        _declare(version=2, upcast={1: up})


def test_good_declarations_are_kept() -> None:
    app = App("decl")
    op = app.operator("orders", version=3, upcast={1: str, 2: str.upper}, ttl=30)
    assert (op.version, sorted(op.upcast), op.ttl) == (3, [1, 2], 30.0)
    plain = app.operator("accounts")
    assert (plain.version, plain.upcast, plain.ttl) == (1, {}, None)


# -- the expiry horizon --------------------------------------------------------------------
def test_only_ttl_operators_stores_get_a_horizon(tmp_path: Path) -> None:
    stores = {(op, p): statestores.open("lsm", tmp_path / f"{op}{p}")
              for op in ("sessions", "accounts") for p in (0, 1)}
    try:
        h = set_horizon(stores, {"sessions"}, 1000.0)
        assert h == to_ms(1000.0 - HORIZON_LAG)
        assert [stores[("sessions", p)].expiry_horizon for p in (0, 1)] == [h, h]
        assert [stores[("accounts", p)].expiry_horizon for p in (0, 1)] == [None, None]
        assert set_horizon(stores, set(), 1000.0) is None
        assert set_horizon(stores, {"sessions"}, 1.0) == 0  # never below 0
    finally:
        for s in stores.values():
            s.close()


def test_a_merge_drops_expired_values_only_past_the_horizon(tmp_path: Path) -> None:
    """End to end through a real store: values written by the codec are dropped by a
    compaction once the runtime's horizon passes their expiry, not before."""
    c = ValueCodec("sessions", ttl=10)
    store = statestores.open("lsm", tmp_path / "s")
    try:
        store.write_batch([(f"k{i}".encode(), c.encode(i, 1000.0)) for i in range(100)])
        store.flush()
        set_horizon({("sessions", 0): store}, {"sessions"}, 1000.0 + 10 + HORIZON_LAG - 1)
        store.compact()
        assert len(list(store.items())) == 100
        set_horizon({("sessions", 0): store}, {"sessions"}, 1000.0 + 10 + HORIZON_LAG)
        store.compact()
        assert list(store.items()) == []
    finally:
        store.close()


def test_decode_is_usable_from_any_thread() -> None:
    # (reads are answered outside the event loop's epochs; nothing in the codec is async)
    c = ValueCodec("sessions", 2, {1: str}, ttl=5)
    raw = c.encode("v", 0.0)
    assert asyncio.run(asyncio.to_thread(c.decode, raw, 1.0)) == "v"
