"""A rollback gives up the uploads of newer snapshots (``snapshots.abandon_uploads``) and its
restore does not wait them out (a remote back from an outage kept them retrying for seconds,
and a recovery's rollback waited behind them); nothing an abandoned upload leaves behind is
taken for complete: its caller learns at once, its mark never reaches a subscriber, its
files are not kept, a snapshot queued behind it never starts, and the snapshot its id is
taken again by wins. A restore nobody abandoned uploads for still waits for all of them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import remotes
import statestores
from statestores import snapshots
from statestores.snapshots import SnapshotAbandoned
from statestores.version import SnapshotMark

#: a guard only: a test whose restore waits behind a held upload fails instead of hanging
GUARD = 30.0


class HeldRemote(remotes.PathRemote):
    """A directory remote whose file uploads wait while it is held (only this process can
    reach it: the uploads then run on a thread here, where the test holds them)."""

    shareable = False

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.released = threading.Event()
        self.released.set()
        self.entered = threading.Event()  # an upload is waiting
        self.manifests: list[int] = []

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("held uploads cannot cross processes")

    def hold(self) -> None:
        self.entered.clear()
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def put_file(self, name: str, path: Any) -> int:
        if not self.released.is_set():
            self.entered.set()
            self.released.wait()
        return super().put_file(name, path)

    def write_manifest(self, manifest: Any) -> None:
        self.manifests.append(manifest.snapshot_id)
        super().write_manifest(manifest)


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[HeldRemote]:
    r = HeldRemote(tmp_path / "remote")
    guard = threading.Timer(GUARD, r.release)
    guard.daemon = True
    guard.start()
    yield r
    guard.cancel()
    r.release()


def fill(s: statestores.Store, lo: int, hi: int, tag: bytes = b"v") -> dict[bytes, bytes]:
    out = {}
    for i in range(lo, hi):
        k, v = b"key-%06d" % i, tag + b"-%06d-" % i + b"x" * 80
        s.put(k, v)
        out[k] = v
    return out


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_a_restore_abandons_a_newer_upload_instead_of_waiting(
    engine: str, tmp_path: Path, remote: HeldRemote
) -> None:
    with statestores.open(engine, tmp_path / "db", remote=remote, sync="os") as s:
        v1 = fill(s, 0, 200)
        s.snapshot(1)
        fill(s, 100, 300, b"w")
        s.settle()
        pinned = s.stats()["pinned_files"]
        marks: list[int] = []
        s.subscribe(lambda e: marks.append(e.snapshot_id) if isinstance(e, SnapshotMark) else None)
        remote.hold()
        stale = s.snapshot_async(2)
        assert remote.entered.wait(GUARD)  # its upload is under way, held
        assert snapshots.abandon_uploads(s, 1) == 1
        s.restore(1)
        assert not remote.released.is_set(), "the restore waited for the upload of snapshot 2"
        with pytest.raises(SnapshotAbandoned):
            stale.result(timeout=0)  # told at once
        assert dict(s.items()) == v1
        remote.release()
        snapshots.wait_uploads(s)  # the abandoned upload ran to its end (its manifest too)
        assert remote.manifests == [1, 2]
        s.settle()
        assert marks == [1], "an abandoned upload published its mark after the restore"
        assert s.stats()["pinned_files"] == pinned, "an abandoned upload kept its files"
        # the id is taken again from the restored state: that snapshot wins
        v2 = {**v1, **fill(s, 500, 520, b"n")}
        s.snapshot(2)
        assert dict(s.items()) == v2
    with statestores.open(engine, tmp_path / "fresh", remote=remote, sync="os") as f:
        assert dict(f.items()) == v2
        f.restore(1)
        assert dict(f.items()) == v1


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_an_abandoned_upload_not_begun_never_begins(
    engine: str, tmp_path: Path, remote: HeldRemote
) -> None:
    with statestores.open(engine, tmp_path / "db", remote=remote, sync="os") as s:
        v1 = fill(s, 0, 200)
        s.snapshot(1)
        fill(s, 100, 300, b"w")
        remote.hold()
        held = s.snapshot_async(2)
        assert remote.entered.wait(GUARD)
        fill(s, 300, 400, b"z")
        queued = s.snapshot_async(3)  # behind 2, on the store's uploader thread
        assert snapshots.abandon_uploads(s, 1) == 2
        s.restore(1)
        for fut in (held, queued):
            with pytest.raises(SnapshotAbandoned):
                fut.result(timeout=0)
        remote.release()
        snapshots.wait_uploads(s)
        assert 3 not in remote.manifests and 3 not in s.snapshots()
        assert dict(s.items()) == v1
        s.put(b"after", b"1")
        s.snapshot(3)
    with statestores.open(engine, tmp_path / "fresh", remote=remote, sync="os") as f:
        assert dict(f.items()) == {**v1, b"after": b"1"}


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_a_restore_nobody_abandoned_uploads_for_waits_for_every_one(
    engine: str, tmp_path: Path, remote: HeldRemote
) -> None:
    """The library's contract without a rollback: every ``snapshot_async`` completes, also
    one newer than the snapshot restored."""
    with statestores.open(engine, tmp_path / "db", remote=remote, sync="os") as s:
        v1 = fill(s, 0, 100)
        s.snapshot(1)
        v2 = {**v1, **fill(s, 100, 200, b"w")}
        remote.hold()
        fut = s.snapshot_async(2)
        assert remote.entered.wait(GUARD)
        assert snapshots.abandon_uploads(s, 2) == 0  # (none newer than 2)
        got: list[tuple[object, bool]] = []
        t = threading.Thread(target=lambda: got.append((_restore(s, 1), fut.done())))
        t.start()
        t.join(0.2)
        remote.release()
        t.join(GUARD)
        assert got and not isinstance(got[0][0], BaseException), got
        assert got[0][1], "the restore returned before the upload of snapshot 2 ended"
        assert fut.result(timeout=0).snapshot_id == 2
        assert dict(s.items()) == v1 and s.snapshots() == [1, 2]
        s.restore(2)
        assert dict(s.items()) == v2


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_a_restore_waits_for_the_upload_of_its_own_snapshot(
    engine: str, tmp_path: Path, remote: HeldRemote
) -> None:
    with statestores.open(engine, tmp_path / "db", remote=remote, sync="os") as s:
        v1 = fill(s, 0, 100)
        remote.hold()
        fut = s.snapshot_async(1)
        assert remote.entered.wait(GUARD)
        s.put(b"later", b"x")
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(_restore(s, 1)))
        t.start()
        t.join(0.2)  # (it waits for the upload, or it would have failed already)
        remote.release()
        t.join(GUARD)
        assert got and not isinstance(got[0], BaseException), got
        assert fut.result(timeout=0).snapshot_id == 1
        assert dict(s.items()) == v1


def _restore(s: statestores.Store, sid: int) -> object:
    try:
        return s.restore(sid)
    except Exception as exc:
        return exc
