"""Schema upcasters and state TTL in LocalRunner: code changes over a reopened directory,
downgrades refused, values expiring with the runner's clock — for functions and for the
reads alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sfaas import App, Context, SchemaTooNew, TransactionAborted, UpcastFailed
from sfaas.runtime.codec import pack
from sfaas.runtime.values import HORIZON_LAG, open_envelope, to_ms
from sfaas.testing import LocalRunner

KEYS = [f"o-{i}" for i in range(12)]


def orders_app(version: int, upcast: dict[int, Any] | None = None) -> App:
    """The same app ("shop") as its code evolves: v1 stores an order as its quantity (an
    int), v2 as ``{"qty": n}``, v3 adds ``"note"``."""
    app = App("shop")
    kw: dict[str, Any] = {} if version == 1 else {"version": version, "upcast": upcast}
    orders = app.operator("orders", store="lsm", **kw)

    @orders.function
    async def put(ctx: Context, value: Any) -> None:
        ctx.put(value)

    @orders.function
    async def get(ctx: Context) -> Any:
        return ctx.get()

    @orders.function
    async def add(ctx: Context, n: int) -> Any:
        order = ctx.get(default={"qty": 0} if version > 1 else 0)
        if version == 1:
            ctx.put(order + n)
        else:
            ctx.put({**order, "qty": order["qty"] + n})
        return ctx.get()

    @orders.function
    async def peek_safely(ctx: Context) -> str:
        try:
            ctx.get()
        except SchemaTooNew:
            return "caught"  # the transaction aborts anyway
        return "read"

    return app


def v1_to_v2(qty: int) -> dict[str, Any]:
    return {"qty": qty}


def v2_to_v3(order: dict[str, Any]) -> dict[str, Any]:
    return {**order, "note": ""}


def raw(runner: LocalRunner, operator: str, key: str) -> bytes | None:
    eng = runner.engines[runner.engines[0].owner(operator, key)]
    return eng.store_of(operator, key).get(key.encode())  # type: ignore[no-any-return]


def test_new_code_sees_old_values_upcast_and_writes_them_back_new(tmp_path: Path) -> None:
    with LocalRunner(orders_app(1), directory=tmp_path) as r:
        for i, k in enumerate(KEYS):
            r.call("orders", k, "put", i)
        assert raw(r, "orders", "o-1") == pack(1)  # v1 code: plain msgpack, as always
    with LocalRunner(orders_app(2, {1: v1_to_v2}), directory=tmp_path) as r:
        # every way of reading sees the upcast shape
        assert r.call("orders", "o-3", "get") == {"qty": 3}
        assert r.get("orders", "o-4") == {"qty": 4} and r.state("orders", "o-4") == {"qty": 4}
        assert r.items("orders") == {k: {"qty": i} for i, k in enumerate(KEYS)}
        assert r.scan("orders", prefix="o-1") == [("o-1", {"qty": 1}), ("o-10", {"qty": 10}),
                                                  ("o-11", {"qty": 11})]
        # a write stores the new version; untouched keys stay as they were on disk
        assert r.call("orders", "o-5", "add", 10) == {"qty": 15}
        assert open_envelope(raw(r, "orders", "o-5") or b"") == (None, 2, pack({"qty": 15}))
        assert raw(r, "orders", "o-6") == pack(6)
        # concurrent transactions upcasting the same old values commit as usual
        results = r.gather(*(("orders", k, "add", 1) for k in KEYS[6:]))
        assert results == [{"qty": i + 1} for i in range(6, 12)]


def test_v3_code_reads_v1_and_v2_values(tmp_path: Path) -> None:
    with LocalRunner(orders_app(1), directory=tmp_path) as r:
        r.call("orders", "a", "put", 1)
        r.call("orders", "b", "put", 2)
    with LocalRunner(orders_app(2, {1: v1_to_v2}), directory=tmp_path) as r:
        r.call("orders", "b", "add", 5)  # b is v2 now, a still v1
    with LocalRunner(orders_app(3, {1: v1_to_v2, 2: v2_to_v3}), directory=tmp_path) as r:
        assert r.call("orders", "a", "get") == {"qty": 1, "note": ""}
        assert r.call("orders", "b", "get") == {"qty": 7, "note": ""}
        assert r.items("orders") == {"a": {"qty": 1, "note": ""}, "b": {"qty": 7, "note": ""}}
        r.call("orders", "a", "put", {"qty": 1, "note": "gift"})
        assert open_envelope(raw(r, "orders", "a") or b"")[1] == 3


def test_a_downgrade_is_refused_by_name_not_misread(tmp_path: Path) -> None:
    with LocalRunner(orders_app(2, {1: v1_to_v2}), directory=tmp_path) as r:
        r.call("orders", "new", "put", {"qty": 1})
    with LocalRunner(orders_app(1), directory=tmp_path) as r:
        with pytest.raises(SchemaTooNew) as info:
            r.call("orders", "new", "add", 1)
        msg = str(info.value)
        assert "'orders'" in msg and "'new'" in msg and "version 2" in msg and "version 1" in msg
        # catching it inside the function does not let the transaction commit
        with pytest.raises(SchemaTooNew):
            r.call("orders", "new", "peek_safely")
        with pytest.raises(SchemaTooNew):
            r.get("orders", "new")
        with pytest.raises(SchemaTooNew):
            r.scan("orders")
        assert open_envelope(raw(r, "orders", "new") or b"")[1] == 2  # nothing was rewritten
        # keys without a newer value still work
        assert r.call("orders", "other", "add", 3) == 3


def test_a_failing_upcaster_aborts_the_transaction_naming_it(tmp_path: Path) -> None:
    with LocalRunner(orders_app(1), directory=tmp_path) as r:
        r.call("orders", "a", "put", "not a number")

    def strict(qty: int) -> dict[str, Any]:
        return {"qty": int(qty)}

    with LocalRunner(orders_app(2, {1: strict}), directory=tmp_path) as r:
        with pytest.raises(UpcastFailed, match=r"upcaster 1→2 \(.*strict\).*'orders'.*'a'"):
            r.call("orders", "a", "get")
        assert isinstance(UpcastFailed("x"), TransactionAborted)


# -- TTL -------------------------------------------------------------------------------------
def sessions_app(ttl: float) -> App:
    app = App("web")
    sessions = app.operator("sessions", store="lsm", ttl=ttl)
    carts = app.operator("carts", store="lsm")

    @sessions.function
    async def login(ctx: Context, user: str) -> None:
        ctx.put({"user": user})

    @sessions.function
    async def who(ctx: Context) -> Any:
        return ctx.get(default="nobody")

    @sessions.function
    async def touch(ctx: Context) -> bool:
        s = ctx.get()
        if s is not None:
            ctx.put(s)
        return s is not None

    @sessions.function
    async def login_and_check(ctx: Context, user: str) -> Any:
        ctx.put({"user": user})
        return ctx.get()  # its own write: never expired for the run that wrote it

    @carts.function
    async def add(ctx: Context, item: str) -> list[str]:
        cart = [*ctx.get(default=[]), item]
        ctx.put(cart)
        return cart

    return app


def test_a_value_expires_ttl_seconds_after_its_last_write() -> None:
    with LocalRunner(sessions_app(60)) as r:
        r.call("sessions", "s1", "login", "ann")
        r.call("sessions", "s2", "login", "bob")
        r.call("carts", "c", "add", "tea")
        r.advance(59)
        assert r.call("sessions", "s1", "who") == {"user": "ann"}
        assert r.get("sessions", "s1") == {"user": "ann"}
        assert r.call("sessions", "s2", "touch") is True  # a write restarts s2's ttl
        r.advance(1.5)
        assert r.call("sessions", "s1", "who") == "nobody"  # ctx.get's default
        assert r.get("sessions", "s1") is None and r.get("sessions", "s1", "x") == "x"
        assert r.state("sessions", "s1", "gone") == "gone"
        assert r.items("sessions") == {"s2": {"user": "bob"}}
        assert r.scan("sessions") == [("s2", {"user": "bob"})]
        assert r.call("sessions", "s1", "touch") is False  # nothing to keep alive
        r.advance(60)
        assert r.items("sessions") == {} and r.scan("sessions") == []
        assert r.call("sessions", "s2", "who") == "nobody"
        # an operator without a ttl keeps its values
        assert r.get("carts", "c") == ["tea"]
        # an expired key can be written again
        r.call("sessions", "s1", "login", "cy")
        assert r.call("sessions", "s1", "who") == {"user": "cy"}
        assert r.call("sessions", "s9", "login_and_check", "dee") == {"user": "dee"}


def test_a_scan_limit_counts_live_values_only() -> None:
    with LocalRunner(sessions_app(10)) as r:
        for i in range(5):
            r.call("sessions", f"a{i}", "login", "x")
        r.advance(11)
        for i in range(5, 8):
            r.call("sessions", f"a{i}", "login", "y")
        assert [k for k, _ in r.scan("sessions", limit=2)] == ["a5", "a6"]


def test_expired_values_leave_the_store_after_the_horizon_passes(tmp_path: Path) -> None:
    """The runtime gives the stores of ttl operators (only) a horizon after each epoch; a
    merge then drops what expired before it, so state stops growing."""
    with LocalRunner(sessions_app(5), directory=tmp_path, workers=1, partitions=2) as r:
        for i in range(200):
            r.call("sessions", f"s{i}", "login", "u")
        r.call("carts", "c", "add", "tea")
        stores = r.engines[0].operator_stores("sessions")
        before = r.now()
        r.call("sessions", "live", "login", "v")
        horizons = {s.expiry_horizon for s in stores}
        assert len(horizons) == 1 and r.loops[0].horizon in horizons
        h = horizons.pop()
        assert h is not None and to_ms(before - HORIZON_LAG) <= h <= to_ms(r.now() - HORIZON_LAG)
        assert all(s.expiry_horizon is None for s in r.engines[0].operator_stores("carts"))
        r.advance(5 + HORIZON_LAG)
        r.call("sessions", "fresh", "login", "w")  # an epoch after the time passed
        for s in stores:
            s.compact()
        left = sorted(k for s in stores for k, _ in s.items())
        assert left == [b"fresh"]
        assert r.items("sessions") == {"fresh": {"user": "w"}}
        assert r.get("carts", "c") == ["tea"]


def test_values_written_before_a_ttl_was_declared_never_expire(tmp_path: Path) -> None:
    plain = App("web")
    s = plain.operator("sessions", store="lsm")

    @s.function
    async def login(ctx: Context, user: str) -> None:
        ctx.put({"user": user})

    with LocalRunner(plain, directory=tmp_path) as r:
        r.call("sessions", "old", "login", "ann")
    with LocalRunner(sessions_app(1), directory=tmp_path) as r:
        r.advance(100)
        assert r.call("sessions", "old", "who") == {"user": "ann"}
        assert r.call("sessions", "old", "touch") is True  # rewritten: now it expires
        r.advance(1)
        assert r.call("sessions", "old", "who") == "nobody"


def test_ttl_and_versions_together(tmp_path: Path) -> None:
    app = App("mixed")
    op = app.operator("tokens", store="lsm", version=2, upcast={1: lambda v: [v]}, ttl=30)

    @op.function
    async def put(ctx: Context, v: Any) -> None:
        ctx.put(v)

    with LocalRunner(app, directory=tmp_path) as r:
        r.call("tokens", "t", "put", ["a"])
        expiry, version, _ = open_envelope(raw(r, "tokens", "t") or b"")
        assert version == 2 and expiry is not None
        assert abs(expiry - to_ms(r.now() + 30)) < 5000
        assert r.get("tokens", "t") == ["a"]
        r.advance(30)
        assert r.get("tokens", "t") is None


@pytest.mark.timeout(60)
def test_a_nondeterministic_function_on_a_ttl_operator_is_caught() -> None:
    """(the determinism check shows the differing stored values: enveloped ones too)"""
    import random

    from sfaas import NondeterminismError

    app = App("nd")
    s = app.operator("sessions", ttl=100)

    @s.function
    async def put(ctx: Context) -> None:
        ctx.put(random.random())

    with LocalRunner(app) as r, pytest.raises(NondeterminismError, match=r"wrote sessions/'x' = 0\."):
        r.call("sessions", "x", "put")


def test_the_horizon_waits_for_the_oldest_transaction_still_held() -> None:
    """A re-run or a run parked at an effect keeps its first ``now``: the stores may not
    drop what it could still read as live."""

    class Held:
        def __init__(self, now: float) -> None:
            self.now, self.attempts = now, 0

    with LocalRunner(sessions_app(5), workers=1, partitions=1) as r:
        lp = r.loops[0]
        lp.begin(1, 1000.0)
        lp.apply({}, {})
        assert lp.horizon == to_ms(1000.0 - HORIZON_LAG)
        lp.begin(2, 1100.0)
        lp.parked[7] = Held(1050.0)  # type: ignore[assignment]
        lp.sequencer.requeue(8, Held(1070.0))
        lp.apply({}, {})
        assert lp.horizon == to_ms(1050.0 - HORIZON_LAG)
        [store] = r.engines[0].operator_stores("sessions")
        assert store.expiry_horizon == to_ms(1050.0 - HORIZON_LAG)
        del lp.parked[7]
        lp.begin(3, 1200.0)  # (takes the re-run into its batch: still held)
        lp.apply({}, {})
        assert lp.horizon == to_ms(1070.0 - HORIZON_LAG)
