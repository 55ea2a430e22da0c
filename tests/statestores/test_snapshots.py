"""Incremental snapshots and restores, for every engine, against a directory remote and
the real MinIO."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import remotes
import statestores

from .engines import CONFIGS, config_id

INCREMENTAL = ("lsm", "appendlog", "hybridlog")


def fill(s: statestores.Store, lo: int, hi: int, tag: bytes = b"v") -> dict[bytes, bytes]:
    out = {}
    for i in range(lo, hi):
        k, v = b"key-%06d" % i, tag + b"-%06d-" % i + b"x" * 80
        s.put(k, v)
        out[k] = v
    return out


@pytest.mark.parametrize("cfg", CONFIGS, ids=config_id)
def test_restore_older_and_newer_snapshots(cfg: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    engine, opts = cfg
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "db", remote=remote, **opts) as s:
        model = fill(s, 0, 300)
        s.snapshot(1)
        v1 = dict(model)
        model.update(fill(s, 200, 400, b"w"))
        for i in range(0, 100, 3):
            s.delete(b"key-%06d" % i)
            model.pop(b"key-%06d" % i)
        s.snapshot(2)
        v2 = dict(model)
        s.put(b"unsnapshotted", b"lost")
        info = s.restore(1)
        assert info.snapshot_id == 1
        assert dict(s.items()) == v1
        info = s.restore(2)
        assert dict(s.items()) == v2
        # continuing after a restore never reuses a file name with other bytes
        s.restore(1)
        s.put(b"new-branch", b"1")
        s.snapshot(3)
        assert s.snapshots() == [1, 2, 3]
        s.restore(2)
        assert dict(s.items()) == v2
        s.restore(3)
        assert dict(s.items()) == {**v1, b"new-branch": b"1"}
    # a fresh directory restores the latest snapshot on open, downloading everything once
    with statestores.open(engine, tmp_path / "fresh", remote=remote, **opts) as s:
        assert dict(s.items()) == {**v1, b"new-branch": b"1"}


@pytest.mark.parametrize("engine", INCREMENTAL)
def test_snapshots_upload_only_what_changed(engine: str, tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "db", remote=remote) as s:
        fill(s, 0, 20_000)
        first = s.snapshot(1)
        assert first.bytes_uploaded > 20_000 * 100
        for i in range(0, 20_000, 100):  # update 1%
            s.put(b"key-%06d" % i, b"updated")
        second = s.snapshot(2)
        assert second.bytes_uploaded < 0.05 * first.bytes_uploaded, (first, second)
        third = s.snapshot(3)  # nothing changed
        assert third.bytes_uploaded < 0.01 * first.bytes_uploaded


def test_memonly_snapshot_uploads_everything(tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open("memonly", tmp_path / "db", remote=remote) as s:
        fill(s, 0, 5000)
        first = s.snapshot(1)
        s.put(b"key-000001", b"u")
        second = s.snapshot(2)
        assert second.bytes_uploaded > 0.9 * first.bytes_uploaded


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_restore_downloads_only_missing_files(engine: str, tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "db", remote=remote) as s:
        model = fill(s, 0, 3000)
        s.snapshot(1)
        s.put(b"later", b"x")
        info = s.restore(1)
        assert info.bytes_downloaded == 0  # everything it needs is still local
        assert dict(s.items()) == model
    shutil.rmtree(tmp_path / "db")
    with statestores.open(engine, tmp_path / "db2", remote=remote) as s:
        assert dict(s.items()) == model
        again = s.restore(1)
        assert again.files_downloaded == 0


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_writes_go_on_during_an_async_snapshot(engine: str, tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "db", remote=remote) as s:
        model = fill(s, 0, 2000)
        fut = s.snapshot_async(1)
        s.put(b"key-000000", b"after-freeze")
        s.put(b"extra", b"after-freeze")
        info = fut.result(timeout=60)
        assert info.snapshot_id == 1
        s.restore(1)
        assert dict(s.items()) == model  # the snapshot is the state at the freeze


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_a_delayed_upload_starts_later_and_holds_the_state_at_the_freeze(engine: str, tmp_path: Path) -> None:
    """``snapshot_async(delay=…)`` freezes now and uploads later (the runtime spreads a
    round's uploads out this way); bad delays are refused before anything is frozen."""
    import time

    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "db", remote=remote) as s:
        model = fill(s, 0, 500)
        for bad in (-0.1, float("nan"), float("inf"), 61.0, "1", True):
            with pytest.raises(ValueError, match="delay must be a number of seconds in \\[0, 60"):
                s.snapshot_async(1, delay=bad)  # type: ignore[arg-type]
        t0 = time.monotonic()
        fut = s.snapshot_async(1, delay=1.0)  # id 1 still free: the refusals froze nothing
        # returns at the freeze, before the upload (whatever the freeze took on this machine)
        assert not fut.done() and remote.list_snapshots() == []
        s.put(b"key-000000", b"after-freeze")
        time.sleep(0.1)
        if time.monotonic() - t0 < 0.9:  # (always, but on a machine stalled for most of a second)
            assert not fut.done() and remote.list_snapshots() == []  # not uploaded yet
        assert fut.result(timeout=60).snapshot_id == 1
        assert time.monotonic() - t0 >= 1.0
        s.restore(1)
        assert dict(s.items()) == model


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_gc_keeps_retained_snapshots_restorable(engine: str, tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "db", remote=remote) as s:
        states = {}
        for sid in range(1, 6):
            fill(s, sid * 100, sid * 100 + 500, b"s%d" % sid)
            s.snapshot(sid)
            states[sid] = dict(s.items())
        remote.gc(keep=2)
        assert s.snapshots() == [4, 5]
    with statestores.open(engine, tmp_path / "other", remote=remote) as s:
        s.restore(4)
        assert dict(s.items()) == states[4]
        with pytest.raises(statestores.SnapshotNotFoundError):
            s.restore(2)
        assert dict(s.items()) == states[4]  # a failed restore changes nothing


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_snapshot_and_restore_through_real_minio(engine: str, tmp_path: Path, minio_remote: Any) -> None:
    with statestores.open(engine, tmp_path / "db", remote=minio_remote) as s:
        model = fill(s, 0, 2000)
        s.snapshot(1)
        s.put(b"key-000001", b"changed")
        second = s.snapshot(2)
        assert second.files_uploaded >= 1
    with statestores.open(engine, tmp_path / "db2", remote=minio_remote) as s:
        s.restore(1)
        assert dict(s.items()) == model
        s.restore(2)
        assert s.get(b"key-000001") == b"changed"


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_corrupt_byte_is_detected_and_restore_repairs_it(engine: str, tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    db = tmp_path / "db"
    with statestores.open(engine, db, remote=remote) as s:
        model = fill(s, 0, 500)
        s.snapshot(1)
    marker = b"v-000250-"
    hits = [p for p in db.iterdir() if p.is_file() and marker in p.read_bytes()]
    assert hits, "the value must be on disk after a snapshot"
    for p in hits:
        data = bytearray(p.read_bytes())
        data[data.index(marker) + 3] ^= 0x01
        p.write_bytes(bytes(data))
    key = b"key-000250"
    try:
        s = statestores.open(engine, db, remote=remote)
    except statestores.CorruptionError as exc:
        assert any(p.name in str(exc) for p in hits)
        shutil.rmtree(db)  # the user's way out when even opening fails: start from the remote
        s = statestores.open(engine, db, remote=remote)
    else:
        try:
            got = s.get(key)
        except statestores.CorruptionError as exc:
            assert any(p.name in str(exc) for p in hits)
        else:
            assert got == model[key], "a corrupt value must never be returned"
        s.restore(1)
    with s:
        assert s.get(key) == model[key]
        assert dict(s.items()) == model


class PidRecordingRemote(remotes.PathRemote):
    """A directory remote that notes, next to each uploaded file, the pid that uploaded it
    (importable by the background process, like any remote it receives)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (PidRecordingRemote, (str(self.root),))

    def put_file(self, name: str, path: Any) -> int:
        import os

        (self.root / f"uploader-{name}").write_text(str(os.getpid()))
        return super().put_file(name, path)


class InMemoryRemote(remotes.PathRemote):
    """A remote that, like an in-memory fake, only this process can reach (shareable False)."""

    shareable = False

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("an in-memory fake cannot cross processes")


def uploaders(root: Path) -> set[int]:
    return {int(p.read_text()) for p in root.glob("uploader-*")}


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_uploads_run_outside_the_store_process(engine: str, tmp_path: Path) -> None:
    """Checksums and transfers of a snapshot use the background process, not the GIL of
    the process that serves reads and writes; the snapshot is complete and restorable."""
    import os

    from statestores import background

    if background.mode() != "process":
        pytest.skip("background mode 'thread' (SFAAS_BACKGROUND, set_mode) runs background work in this process")
    remote = PidRecordingRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "db", remote=remote, sync="os") as s:
        model = fill(s, 0, 200)
        info = s.snapshot(1)
        assert info.files_uploaded >= 1 and info.bytes_uploaded > 0
        pids = uploaders(tmp_path / "remote")
        assert pids and os.getpid() not in pids
        # the upload process dies between two snapshots: the next one starts a new one
        lane = background._lane("upload")
        assert lane.proc is not None
        lane.proc.kill()
        lane.proc.wait()
        model.update(fill(s, 150, 300, b"w"))
        s.snapshot(2)
        assert len(uploaders(tmp_path / "remote") - {os.getpid()}) >= 1
    with statestores.open(engine, tmp_path / "fresh", remote=remote, sync="os") as s:
        assert dict(s.items()) == model


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_a_remote_only_this_process_reaches_uploads_here(engine: str, tmp_path: Path) -> None:
    remote = InMemoryRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "db", remote=remote, sync="os") as s:
        model = fill(s, 0, 200)
        info = s.snapshot(1)
        assert info.files_uploaded >= 1
        s.put(b"after", b"x")
        s.restore(1)
        assert dict(s.items()) == model


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_a_store_back_to_empty_numbers_its_files_above_the_remotes(engine: str, tmp_path: Path) -> None:
    """A worker rolled back to before any round empties its stores without a restore; a
    round that failed after its uploads left files in the remote. New files numbered from 1
    again would share their names — and, with the same sizes, their uploads would be
    skipped, and the next round would name the old bytes (sim seed 479: money created)."""
    from statestores.snapshots import restore_empty

    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "failed-round", remote=remote) as s:
        fill(s, 0, 300, b"v")
        s.snapshot(1)  # (its files stay in the remote)
    with statestores.open(engine, tmp_path / "empty-again") as s:  # (opening: no remote)
        s.put(b"before", b"the rollback")
        s.remote = remote
        assert restore_empty(s, remote) >= 1
        assert dict(s.items()) == {}
        model = fill(s, 0, 300, b"w")  # the same sizes, other bytes
        s.snapshot(2)
    with statestores.open(engine, tmp_path / "restored") as s:
        s.remote = remote
        s.restore(2)
        assert dict(s.items()) == model
