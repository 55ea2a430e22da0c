"""The appendlog engine's snapshot rounds: they fold the active segment (no hint, no
merge on the round's path), and the folded segments are merged later, in the background,
in order with segments sealed meanwhile, and again after a failed merge. (The rest of
the engine: test_appendlog.py.)"""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import remotes
import statestores
from statestores import background

from .test_appendlog import check_snapshot_files_bounded, snapshot_round


@pytest.mark.parametrize("sync", ["os", "none"])
def test_snapshot_rounds_fold_the_active_segment_without_hints_or_merges(tmp_path: Path, sync: str) -> None:
    """A round folds the active segment: one small file, no hint, no merge; a restore
    elsewhere after any round, and a reopen after close, are that state."""
    remote = remotes.PathRemote(tmp_path / "remote")
    model: dict[bytes, bytes] = {}
    states: dict[int, dict[bytes, bytes]] = {}
    with statestores.open("appendlog", tmp_path / "db", remote=remote, sync=sync, max_snapshot_wals=1000) as s:
        for r in range(1, 13):
            info = snapshot_round(s, r, model, 97 if r > 1 else 1)
            states[r] = dict(model)
            assert info.files_uploaded == 1, info
            assert r == 1 or info.bytes_uploaded < 2000, info
            s.settle()
            st = s.stats()
            assert (st["segments"], st["merges_done"], st["folded_segments"]) == (0, 0, r), st
            assert s.get(b"k00100") == model[b"k00100"]  # read from a folded segment
    with statestores.open("appendlog", tmp_path / "db") as s:  # close sealed them
        assert dict(s.items()) == model and s.stats()["folded_segments"] == 0
    for snap in (1, 7, 12):
        with statestores.open("appendlog", tmp_path / f"restored{snap}", remote=remote) as r:
            r.restore(snap)
            assert dict(r.items()) == states[snap]
            r.put(b"after", b"restore")  # writes on top of restored folded segments
            r.snapshot(100 + snap)
            assert r.get(b"after") == b"restore"


def test_folded_segments_are_merged_at_max_snapshot_wals(tmp_path: Path) -> None:
    """Folded segments are bounded: a snapshot that finds ``max_snapshot_wals`` of them
    merges them into one sealed segment, so a restore never scans more; none is hinted
    on its own (no roll), and four such segments are merged again like any sealed ones."""
    last = check_snapshot_files_bounded("appendlog", tmp_path, lambda st: st["folded_segments"], "folded_merges", max_runs_per_level=4)
    assert last["rolls"] == 0, last
    assert last["merges_done"] > last["folded_merges"], last  # a merge of merged folded segments


@pytest.fixture
def held_merges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Callable[..., Any], tuple[Any, ...], concurrent.futures.Future[Any]]]:
    """Background merges wait in the returned list until the test runs (or fails) them."""
    held: list[tuple[Callable[..., Any], tuple[Any, ...], concurrent.futures.Future[Any]]] = []
    real = background.submit

    def submit(fn: Callable[..., Any], *args: Any, lane: str = "merge", local: bool = False) -> concurrent.futures.Future[Any]:
        if lane != "merge":  # e.g. an upload's
            return real(fn, *args, lane=lane, local=local)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        held.append((fn, args, fut))
        return fut

    monkeypatch.setattr(background, "submit", submit)
    return held


def rounds_until_a_folded_merge(s: statestores.Store, model: dict[bytes, bytes], held: list[Any]) -> int:
    """Write and snapshot rounds until a snapshot starts merging the folded segments."""
    r = 0
    while not held:
        r += 1
        for i in range(10):
            s.put(b"k%d" % i, b"old%d" % r)
            model[b"k%d" % i] = b"old%d" % r
        s.snapshot(r)
        assert r < 10, s.stats()
    return r


def test_the_round_after_a_folded_merge_uploads_one_segment_and_its_hint(tmp_path: Path, held_merges: list[Any]) -> None:
    """The snapshot that finds ``max_snapshot_wals`` folded segments starts their merge;
    the next uploads its folded segment, the merged segment and its hint — three files,
    however many segments were folded — and no folded segment was given a hint."""
    remote = remotes.PathRemote(tmp_path / "remote")
    model: dict[bytes, bytes] = {}
    with statestores.open("appendlog", tmp_path / "db", remote=remote, max_snapshot_wals=8) as s:
        r = 0
        while not held_merges:
            r += 1
            assert snapshot_round(s, r, model, 7).files_uploaded == 1
            assert r <= 8
        fn, args, fut = held_merges.pop()
        fut.set_result(fn(*args))
        s.settle()
        st = s.stats()
        assert r >= 4 and (st["segments"], st["folded_segments"], st["rolls"]) == (1, 0, 0), st
        assert len([f for f in os.listdir(tmp_path / "db") if f.endswith(".hint")]) == 1
        after = snapshot_round(s, r + 1, model, 7)
        assert after.files_uploaded == 3, after
    with statestores.open("appendlog", tmp_path / "restored", remote=remote) as restored:
        assert dict(restored.items()) == model


def test_a_folded_merge_sorts_before_a_segment_sealed_while_it_ran(
    tmp_path: Path, held_merges: list[Any]
) -> None:
    """Newer writes sealed by a roll while the folded segments were being merged stay
    newer than the merge's output: in the store, after a reopen and after a restore."""
    remote = remotes.PathRemote(tmp_path / "remote")
    model: dict[bytes, bytes] = {}
    with statestores.open("appendlog", tmp_path / "db", remote=remote, max_snapshot_wals=2, threshold=4096) as s:
        r = rounds_until_a_folded_merge(s, model, held_merges)
        for i in range(10):  # past the threshold: a roll seals these in a hinted level-0 segment
            s.put(b"k%d" % i, b"new" * 200)
            model[b"k%d" % i] = b"new" * 200
        deadline = time.monotonic() + 10
        while s.stats()["segments"] == 0:
            assert time.monotonic() < deadline, s.stats()
            time.sleep(0.01)
        fn, args, fut = held_merges.pop()
        fut.set_result(fn(*args))
        s.settle()
        st = s.stats()
        assert (st["segments"], st["folded_merges"], st["rolls"]) == (2, 1, 1), st
        assert dict(s.items()) == model
        s.snapshot(r + 1)
    with statestores.open("appendlog", tmp_path / "db") as reopened:
        assert dict(reopened.items()) == model
    with statestores.open("appendlog", tmp_path / "restored", remote=remote) as restored:
        assert dict(restored.items()) == model


def test_a_failed_folded_merge_leaves_them_folded_and_a_later_one_merges_them(
    tmp_path: Path, held_merges: list[Any]
) -> None:
    """A merge of folded segments that fails loses nothing: they stay readable ``wal``
    entries, in every snapshot, and the next snapshot at the cap merges them again."""
    remote = remotes.PathRemote(tmp_path / "remote")
    model: dict[bytes, bytes] = {}
    with statestores.open("appendlog", tmp_path / "db", remote=remote, max_snapshot_wals=2) as s:
        r = rounds_until_a_folded_merge(s, model, held_merges)
        folded = len(held_merges[0][1][2])
        _fn, _args, fut = held_merges.pop()
        fut.set_exception(OSError(28, "No space left on device"))
        deadline = time.monotonic() + 10
        while s.stats()["merge_failures"] == 0:
            assert time.monotonic() < deadline, s.stats()
            time.sleep(0.01)
        st = s.stats()
        assert (st["folded_segments"], st["segments"]) == (folded, 0), st
        assert dict(s.items()) == model
        s.put(b"k0", b"after the failure")
        model[b"k0"] = b"after the failure"
        s.snapshot(r + 1)  # folds one more, and starts merging all of them
        fn, args, fut = held_merges.pop()
        assert len(args[2]) == folded + 1
        fut.set_result(fn(*args))
        s.settle()
        assert (s.stats()["folded_segments"], s.stats()["segments"]) == (0, 1)
        assert dict(s.items()) == model
    with statestores.open("appendlog", tmp_path / "restored", remote=remote) as restored:
        restored.restore(r + 1)  # taken after the failure, before the second merge was installed
        assert dict(restored.items()) == model
