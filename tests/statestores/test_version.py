"""The version-edit stream: every engine's file set changes only through ordered, durable
edits that a subscriber can follow, and files are deleted only when nothing needs them."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

import remotes
import statestores
from statestores.errors import CorruptionError
from statestores.version import FileEntry, SnapshotMark, Version, VersionEdit, decode_entries

from .engines import TINY


def _drive(s: statestores.Store, rng: random.Random, n: int, model: dict[bytes, bytes]) -> None:
    for i in range(n):
        k = b"k%03d" % rng.randrange(60)
        if rng.random() < 0.2:
            s.delete(k)
            model.pop(k, None)
        else:
            v = b"v%d-" % i + b"x" * rng.randrange(40)
            s.put(k, v)
            model[k] = v


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_a_subscriber_can_follow_the_file_set_edit_by_edit(tmp_path: Path, engine: str) -> None:
    rng = random.Random(3)
    model: dict[bytes, bytes] = {}
    edits: list[VersionEdit] = []
    seen_on_disk: list[bool] = []
    lock = threading.Lock()
    with statestores.open(engine, tmp_path / "db", remote=remotes.PathRemote(tmp_path / "r"), **TINY[engine]) as s:
        marks: list[tuple[int, int, int]] = []  # (snapshot id, mark seq, seq of the last edit before it)
        seq0 = -1  # set right after subscribing, below

        def on_edit(edit: VersionEdit | SnapshotMark) -> None:
            with lock:
                if isinstance(edit, SnapshotMark):
                    marks.append((edit.snapshot_id, edit.seq, edits[-1].seq if edits else seq0))
                    # a mark's files are on disk while the subscriber is called
                    seen_on_disk.append(all(os.path.exists(tmp_path / "db" / e.name) for e in edit.files))
                    return
                edits.append(edit)
                # a file an edit removes is still there while the subscriber is called
                seen_on_disk.append(all(os.path.exists(tmp_path / "db" / n) for n in edit.removed))

        # subscribe, then read the version: an edit the store's own background work makes
        # in between (e.g. right after open) then reaches the subscriber too, and one at or
        # below the version read is already in it (the other order could miss one)
        unsubscribe = s.subscribe(on_edit)
        seq0, files0 = s.version()
        follower = Version(seq0, {e.name: e for e in files0})
        for rnd in range(4):
            _drive(s, rng, 300, model)
            s.snapshot_async(rnd + 1)
        s.snapshot(5)
        s.flush()
        s.settle()
        seq, files = s.version()
        with lock:
            got = [e for e in edits if e.seq > seq0]
        assert got, f"{engine}: no edit was published"
        ids = [m[0] for m in marks]
        assert ids == sorted(ids) and ids[-1] == 5, f"snapshot marks arrive in order: {ids}"
        assert all(m_seq <= before for _i, m_seq, before in marks), "a mark comes after every edit it covers"
        assert [e.seq for e in got] == list(range(seq0 + 1, seq + 1)), "edits arrive in order, none missing"
        assert all(seen_on_disk)
        for e in got:
            follower.apply(e.added, e.removed)
        assert follower.seq == seq and sorted(follower.files.values(), key=lambda f: f.name) == sorted(
            files, key=lambda f: f.name
        )
        for f in files:
            assert (tmp_path / "db" / f.name).exists(), f"{f.name} is in the version but not on disk"
        unsubscribe()
        n = len(edits)
        _drive(s, rng, 200, model)
        s.flush()
        s.settle()
        assert len(edits) == n, "no edit after unsubscribing"
        assert dict(s.items()) == model
    with statestores.open(engine, tmp_path / "db", **TINY[engine]) as s:
        s.settle()  # opening hands the next spare WAL/segment to the maintainer: let it land
        seq2, files2 = s.version()
        on_disk = {p.name for p in (tmp_path / "db").iterdir() if p.name.startswith(s.PREFIX + "-")}
        assert {f.name for f in files2} == on_disk, "after close, the directory holds exactly the version's files"
        assert dict(s.items()) == model


def _files(s: statestores.Store) -> set[str]:
    _, files = s.version()
    return {f.name for f in files}


def _on_disk(s: statestores.Store, d: Path) -> set[str]:
    return {p.name for p in d.iterdir() if p.name.startswith(s.PREFIX + "-")}


@pytest.mark.parametrize("engine", ["lsm", "appendlog", "hybridlog"])
def test_merged_away_files_are_deleted_once_no_snapshot_keeps_them(tmp_path: Path, engine: str) -> None:
    """Files merged away stay while one of the newest KEEP_LOCAL (2) uploaded snapshots
    names them, and go once newer snapshots take their place; no stray file is left."""
    rng = random.Random(5)
    model: dict[bytes, bytes] = {}
    db = tmp_path / "db"
    remote = remotes.PathRemote(tmp_path / "r")
    with statestores.open(engine, db, remote=remote, **TINY[engine]) as s:
        _drive(s, rng, 400, model)
        s.snapshot(1)
        first, at_1 = set(remote.read_manifest(1).files), dict(model)
        _drive(s, rng, 400, model)
        s.flush()
        s.settle()
        assert s.stats()["merges_done"] > 0
        assert first - _files(s), "no file of snapshot 1 was merged away: the test proves nothing"
        assert _on_disk(s, db) == _files(s) | first, "snapshot 1's files are kept, nothing else"
        s.snapshot(2)
        s.snapshot(3)
        s.settle()
        kept = set(remote.read_manifest(2).files) | set(remote.read_manifest(3).files)
        want = _files(s) | kept
        assert _on_disk(s, db) == want, f"stray or missing files: {sorted(_on_disk(s, db) ^ want)}"
        assert not (first - want) & _on_disk(s, db), "snapshot 1's files went with snapshots 2 and 3"
        # files merged away since snapshot 1 come back from the remote
        assert s.restore(1).files_downloaded > 0  # (released: snapshots 2 and 3 are kept now)
        assert all((db / name).exists() for name in _files(s))
        assert dict(s.items()) == at_1


@pytest.mark.parametrize("engine", ["lsm", "appendlog", "hybridlog"])
def test_a_rollback_to_either_newest_snapshot_downloads_nothing(tmp_path: Path, engine: str) -> None:
    """A survivor of a lost worker rolls back to the newest complete round: its newest
    snapshot, or the one before when the round after it failed. Merges since then must
    not cost a download."""
    rng = random.Random(7)
    model: dict[bytes, bytes] = {}
    with statestores.open(engine, tmp_path / "db", remote=remotes.PathRemote(tmp_path / "r"), **TINY[engine]) as s:
        _drive(s, rng, 400, model)
        s.snapshot(1)
        at_1 = dict(model)
        _drive(s, rng, 400, model)
        s.snapshot(2)
        _drive(s, rng, 400, model)
        s.flush()
        s.settle()
        assert s.stats()["merges_done"] > 0
        assert s.remote is not None
        assert set(s.remote.read_manifest(1).files) - _files(s), "nothing merged away: the test proves nothing"
        info = s.restore(1)
        assert info.files_downloaded == 0, info
        assert dict(s.items()) == at_1


def test_entries_are_checked_when_decoded() -> None:
    good = [["al-0-0000000001.log", "segment", 0], ["al-0-0000000001.hint", "hint", 0]]
    assert decode_entries(good, "x") == [
        FileEntry("al-0-0000000001.log", "segment", 0),
        FileEntry("al-0-0000000001.hint", "hint", 0),
    ]
    for bad in (
        {"a": 1},
        [["x.log", "blob", 0]],
        [["x.log", "segment"]],
        [["../escape.log", "segment", 0]],
        [["x.log", "segment", "0"]],
    ):
        with pytest.raises(CorruptionError, match="CURRENT"):
            decode_entries(bad, "CURRENT")


def test_subscribe_needs_a_callable(tmp_path: Path) -> None:
    with statestores.open("lsm", tmp_path) as s, pytest.raises(TypeError, match="callable"):
        s.subscribe("not a function")  # type: ignore[arg-type]
