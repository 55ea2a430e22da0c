"""A standby's stores through fault series, without a cluster (``worker.protocols.standby``
with its followers' real transports aimed at nothing and MinIO refusing connections).

A standby promoted before MinIO or its primary delivered a single file takes the slot
with empty stores (the recovery downloads the round), instead of exiting and leaving the
slot to a restart. A standby restarting where an earlier promotion left a store follows
from scratch instead of failing every restart — but never deletes a store a live process
holds.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

import pytest

import statestores
from sfaas.runtime import wire
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import stores_root
from tests.runtime.apps.ledger import app
from tests.statestores.replicas import DownRemote
from worker.protocols import standby
from worker.protocols.standby import _Standby

ENGINE = "appendlog"
SECRET = "test-cluster-secret"


def _dead_port() -> int:
    """A port nothing listens on (the lost primary's replication server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """MinIO refuses every connection (an outage while the standby seeds)."""
    monkeypatch.setattr(standby, "store_remote",
                        lambda _s, _app, op, p: DownRemote(tmp_path / "minio" / op / f"p{p}"))
    return Settings(home=str(tmp_path / "home"), store=ENGINE)


def _follow() -> wire.Follow:
    return wire.Follow(0, 1, 2, [0, 1], "127.0.0.1", _dead_port())


def test_a_standby_promoted_before_anything_arrived_takes_the_slot_with_empty_stores(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    sb = _Standby(settings, app, "standby-0", SECRET)
    sb.start(_follow())
    deadline = time.monotonic() + 10
    while any(f.stats()["reconnects"] < 1 for f in sb.followers.values()):
        assert time.monotonic() < deadline, "the followers never tried their primary"
        time.sleep(0.01)
    with caplog.at_level(logging.WARNING, "sfaas.worker.standby"):
        stores = sb.promote(wire.Promote(0, 4, [0, 1]))
    try:
        assert sorted(stores) == [(op, p) for op in sorted(app.operators) for p in (0, 1)]
        for (op, p), store in stores.items():
            assert store.directory == os.path.join(stores_root(settings, app.name), op, f"p{p}")
            assert dict(store.items()) == {}
        held_nothing = [r for r in caplog.records if "holds nothing yet" in r.getMessage()]
        assert len(held_nothing) == 4 and "downloads round 4" in held_nothing[0].getMessage()
        assert "Connection refused" in held_nothing[0].getMessage()
    finally:
        stores.close()
        sb.stop()


def test_a_standby_restarting_over_a_store_an_earlier_promotion_left_follows_from_scratch(
        settings: Settings) -> None:
    first = _Standby(settings, app, "standby-0", SECRET)
    left = os.path.join(first.root, "accounts", "p0")
    db = statestores.open(ENGINE, left)  # promoted in place, then its process died
    db[b"alice"] = b"100"
    db.close()
    restarted = _Standby(settings, app, "standby-0", SECRET)
    restarted.start(_follow())
    try:
        assert len(restarted.followers) == 4
        assert not os.path.exists(os.path.join(left, "CURRENT"))
        assert restarted.followers[("accounts", 0)].stats()["seq"] == 0, "from scratch"
    finally:
        restarted.stop()


def test_a_standby_never_deletes_a_store_a_live_process_holds(settings: Settings) -> None:
    sb = _Standby(settings, app, "standby-0", SECRET)
    left = os.path.join(sb.root, "accounts", "p0")
    live = statestores.open(ENGINE, left)  # promoted in place; its process only paused
    live[b"alice"] = b"100"
    try:
        with pytest.raises(statestores.LockedError):
            sb.start(_follow())
        assert dict(live.items()) == {b"alice": b"100"}
    finally:
        sb.stop()
        live.close()


def test_a_promotion_that_fails_says_so_and_holds_no_store_open(
        settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    sb = _Standby(settings, app, "standby-0", SECRET)
    sb.start(_follow())
    broken = sb.followers[("counters", 1)]

    def lacking(*_a: object, **_k: object) -> statestores.Store:
        raise statestores.CorruptionError("FOLLOW", "version 7 names ['x.run'], which are missing")

    monkeypatch.setattr(broken, "promote", lacking)
    with caplog.at_level(logging.ERROR, "sfaas.worker.standby"), \
            pytest.raises(statestores.CorruptionError):
        sb.promote(wire.Promote(0, 4, [0, 1]))
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "cannot promote the replica of counters/p1 to worker 0" in line and "x.run" in line
    sb.stop()
    for p in (0, 1):  # what was promoted before the failure was closed: a replacement opens it
        statestores.open(ENGINE, os.path.join(stores_root(settings, app.name), "accounts",
                                              f"p{p}")).close()


def test_a_promoted_store_keeps_the_remote_its_replica_was_seeded_from(
        settings: Settings) -> None:
    """A promoted store snapshots and restores through the remote its replica seeded from:
    its connections are open and its bucket checked. A new one paid both on its first call,
    in the middle of the recovery's restore (0.1-0.2 s of a failover on a busy host)."""
    sb = _Standby(settings, app, "standby-0", SECRET)
    sb.start(_follow())
    seeds = {key: fol.seed for key, fol in sb.followers.items()}
    assert all(seed is not None for seed in seeds.values())
    stores = sb.promote(wire.Promote(0, 4, [0, 1]))
    try:
        assert sorted(stores) == sorted(seeds)
        for key, store in stores.items():
            assert store.remote is seeds[key], key
    finally:
        stores.close()
        sb.stop()
