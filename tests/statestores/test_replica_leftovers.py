"""Replicas that never received anything, and directories a promotion left behind.

A standby seeding while MinIO refused connections, whose primary then died before its
first edit arrived, holds a replica that installed nothing (no ``FOLLOW`` yet); promoting
it must give an empty store — which the recovery's restore then fills from the round —
not crash. A promotion never takes a version whose files are missing. A directory a
promotion turned into a store is refused by a follower and can be discarded by its owner,
but never while a live store holds it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import remotes
import statestores
from statestores import current
from statestores.fs import FileSystem
from statestores.replica import LocalSource, Shipper, discard
from statestores.replica.follower import STATE_NAME

from .replicas import DeadSource, DownRemote


def _primary(tmp_path: Path, engine: str, shipped: bool = False,
             ) -> tuple[statestores.Store, remotes.PathRemote, Shipper | None]:
    """A primary holding 50 keys as of snapshot 3 (uploaded), shipping it if ``shipped``."""
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open(engine, tmp_path / "primary", remote=remote)
    shipper = Shipper(db) if shipped else None
    for i in range(50):
        db[b"k%02d" % i] = b"v%d" % i
    db.flush()
    db.snapshot(3)
    db.settle()
    return db, remote, shipper


def _starved(engine: str, directory: Path, remote: remotes.PathRemote) -> statestores.replica.Follower:
    """A follower whose seeding and stream both failed (it tried each at least once)."""
    f = statestores.follow(engine, directory, DeadSource(), seed=DownRemote(remote.root))
    deadline = time.monotonic() + 10
    while f.stats()["reconnects"] < 1:
        assert time.monotonic() < deadline, "the follower never tried its source"
        time.sleep(0.01)
    assert not os.path.exists(directory / STATE_NAME), "nothing installed: no FOLLOW yet"
    return f


@pytest.mark.parametrize("restarted", [False, True])
@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_a_replica_that_installed_nothing_promotes_to_an_empty_store_the_round_restores(
        tmp_path: Path, engine: str, restarted: bool) -> None:
    db, remote, _ = _primary(tmp_path, engine)
    f = _starved(engine, tmp_path / "replica", remote)
    if restarted:  # a standby restarted: its follower opens the directory again
        f.close()
        f = _starved(engine, tmp_path / "replica", remote)
    assert f.snapshots() == []
    with pytest.raises(statestores.SnapshotNotFoundError, match=r"holds snapshots \[\], not 3"):
        f.promote(3, directory=tmp_path / "slot")
    assert not current.exists(FileSystem(), str(tmp_path / "replica")), \
        "a refused promotion leaves the replica a replica"
    store = f.promote(None, directory=tmp_path / "slot")
    try:
        assert dict(store.items()) == {}, "it held nothing: it is empty, not a guess"
        assert not (tmp_path / "replica").exists()
        store.remote = remote
        info = store.restore(3)  # what the recovery after a promotion does
        assert info.files_downloaded == info.files_total > 0
        assert dict(store.items()) == dict(db.items())
    finally:
        store.close()
        db.close()


def test_a_promotion_refuses_a_version_whose_files_are_missing(tmp_path: Path) -> None:
    db, _remote, shipper = _primary(tmp_path, "lsm", shipped=True)
    assert shipper is not None
    f = statestores.follow("lsm", tmp_path / "replica", LocalSource(shipper))
    f.wait(snapshot_id=3)
    with f.hold() as (_seq, files):
        victim = files[0].name
    os.remove(tmp_path / "replica" / victim)  # a disk lost it, or an operator
    with pytest.raises(statestores.CorruptionError, match=victim):
        f.promote(3, directory=tmp_path / "slot")
    assert not (tmp_path / "slot").exists()
    assert not current.exists(FileSystem(), str(tmp_path / "replica"))
    f.close()
    shipper.close()
    db.close()


def test_a_directory_a_promotion_left_is_refused_and_can_be_discarded_when_nobody_holds_it(
        tmp_path: Path) -> None:
    db, _remote, shipper = _primary(tmp_path, "appendlog", shipped=True)
    assert shipper is not None
    where = tmp_path / "standby" / "accounts" / "p0"
    f = statestores.follow("appendlog", where, LocalSource(shipper))
    f.wait(snapshot_id=3)
    store = f.promote(3)  # in place: its lost primary still held the slot's directory
    with pytest.raises(statestores.LockedError):
        discard(where)
    assert dict(store.items()) == dict(db.items()), "a live store is never discarded"
    store.close()
    with pytest.raises(statestores.StoreError, match="holds a store, not a replica"):
        statestores.follow("appendlog", where, LocalSource(shipper))
    assert discard(where) and not where.exists()
    assert not discard(where)
    f = statestores.follow("appendlog", where, LocalSource(shipper))
    f.wait(snapshot_id=3)
    again = f.promote(3)
    assert dict(again.items()) == dict(db.items())
    again.close()
    shipper.close()
    db.close()
