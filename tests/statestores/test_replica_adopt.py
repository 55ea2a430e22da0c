"""A promoted replica adopted at its snapshot (``statestores.snapshots.adopt``): a promoted
standby's first rollback is to the round it was promoted at, whose files it already holds
as they are; installing them again (an lsm store replays the round's WALs and rewrites its
version) took 0.13-0.19 s per store of the failover's gap. Adopting checks instead, and
refuses — the store untouched, for the caller's restore — whatever it cannot vouch for."""

from __future__ import annotations

from pathlib import Path

import pytest

import remotes
import statestores
from statestores import snapshots
from statestores.replica import LocalSource, Shipper
from statestores.version import seq_of

from .engines import TINY
from .replicas import _fill


def _promoted(tmp_path: Path, runs_only: bool = False,
              ) -> tuple[statestores.Store, remotes.PathRemote, dict[bytes, bytes], list[object]]:
    """An lsm primary with three snapshots and writes after the third, followed by a
    replica promoted at snapshot 3 (into another directory, with the primary's remote).
    The snapshot holds runs and a sealed WAL (``runs_only``: runs alone, and no merge)."""
    remote = remotes.PathRemote(tmp_path / "remote")
    opts = {**TINY["lsm"], "memtable_bytes": 1 << 16, "max_runs_per_level": 8}
    db = statestores.open("lsm", tmp_path / "primary", remote=remote, **opts)
    shipper = Shipper(db)
    f = statestores.follow("lsm", tmp_path / "replica", LocalSource(shipper), **opts)
    for r in range(1, 4):
        _fill(db, 150, start=100 * r)
        if r == 2 or runs_only:
            db.flush()  # runs (and a sealed WAL) in the snapshot
        db.snapshot(r)
        db.settle()
    want = dict(db.items())
    _fill(db, 50, start=900)  # after the round: the replica follows these too
    db.settle()
    f.wait(seq=db.version()[0], snapshot_id=3)
    store = f.promote(3, directory=tmp_path / "promoted", remote=remote, **opts)
    return store, remote, want, [shipper, db]


def _close(store: statestores.Store, others: list[object]) -> None:
    store.close()
    for o in others:
        o.close()  # type: ignore[attr-defined]


def test_a_promoted_lsm_replica_is_adopted_at_its_snapshot_without_installing_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from statestores.lsm.engine import LSMStore

    store, remote, want, others = _promoted(tmp_path)
    installs: list[int] = []
    install = LSMStore._install
    monkeypatch.setattr(LSMStore, "_install", lambda self, *a, **k: (installs.append(1), install(self, *a, **k))[1])
    try:
        info = snapshots.adopt(store, remote, 3)
        assert info is not None and info.snapshot_id == 3 and info.files_downloaded == 0
        assert installs == [], "adopting installed the snapshot again"
        assert dict(store.items()) == want
        assert store.stats()["last_snapshot_id"] == 3  # a later round must be above it
        with pytest.raises(ValueError, match="greater than the last snapshot id 3"):
            store.snapshot(3)
        # it goes on as the primary: its next round uploads beside the remote's names, and
        # that round restores elsewhere to exactly what it holds
        _fill(store, 200, start=2000)
        store.flush()
        _fill(store, 10, start=3000)
        store.snapshot(4)
        store.settle()
        now = dict(store.items())
        with statestores.open("lsm", tmp_path / "elsewhere", remote=remote) as other:
            other.restore(4)
            assert dict(other.items()) == now
        assert snapshots.adopt(store, remote, 4) is None, "a store written since is adopted"
    finally:
        _close(store, others)


@pytest.mark.parametrize("why", ["engine", "later-round", "unchecked", "written", "flushed"])
def test_adopting_refuses_what_it_cannot_vouch_for_and_leaves_the_store_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    """``engine``: one whose open goes on writing into a file the snapshot names (appendlog,
    hybridlog, memonly append to their last WAL); ``later-round``: the remote holds a name
    above the store's new WAL (a run of a round the lost primary uploaded and its replica
    never received), which a later upload would meet; ``unchecked``: a file not checked at
    its crc when it arrived; ``written``: writes flushed since the promotion, the
    snapshot's WAL gone with them; ``flushed``: the same beside a snapshot of runs alone —
    every file it names still there, and a new run."""
    from statestores.lsm.engine import LSMStore

    store, remote, want, others = _promoted(tmp_path, runs_only=why == "flushed")
    try:
        if why == "engine":
            monkeypatch.setattr(LSMStore, "NEW_FILES_AT_OPEN", False)
        if why == "later-round":
            top = max(seq_of(e.name) for e in store.version()[1])
            remote.put_file(f"lsm-L0-{top + 5:010d}.run", tmp_path / "promoted" / store.version()[1][0].name)
        if why == "unchecked":
            del store.snapshot_state.verified[next(iter(remote.read_manifest(3).files))]
        if why in ("written", "flushed"):
            _fill(store, 200, start=5000)
            store.flush()
        store.settle()  # (background work — a spare WAL, a merge — is not the adopt's doing)
        before = (store.version(), store.stats()["last_snapshot_id"], dict(store.items()))
        assert snapshots.adopt(store, remote, 3) is None
        store.settle()
        assert (store.version(), store.stats()["last_snapshot_id"], dict(store.items())) == before
        store.restore(3)  # what the caller does instead
        assert dict(store.items()) == want
    finally:
        _close(store, others)
