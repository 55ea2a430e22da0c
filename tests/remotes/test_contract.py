"""The contract every remote honours, run against PathRemote and a real MinIO."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from crc32c import crc32c

from launcher.services import Endpoints
from remotes import (
    FileInfo,
    GcInfo,
    Manifest,
    Remote,
    RemoteError,
    SnapshotNotFoundError,
)
from remotes.minio import MinioRemote
from remotes.path import PathRemote
from tests.conftest import make_minio_remote


@pytest.fixture(params=["path", "minio"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Remote]:
    if request.param == "path":
        r: Remote = PathRemote(tmp_path / "remote")
    else:
        ep: Endpoints = request.getfixturevalue("minio")
        r = make_minio_remote(ep)
    try:
        yield r
    finally:
        r.destroy()
        r.close()


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def manifest(sid: int, files: dict[str, bytes], **meta: object) -> Manifest:
    return Manifest(
        snapshot_id=sid,
        engine="test",
        files={n: FileInfo(len(d), crc32c(d)) for n, d in files.items()},
        meta=dict(meta),
    )


def upload(remote: Remote, tmp_path: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert remote.put_file(name, write(tmp_path / f"up-{name}", data)) == len(data)


# -- files --------------------------------------------------------------------------------


def test_file_roundtrip_and_listing(remote: Remote, tmp_path: Path) -> None:
    payloads = {"a.run": b"alpha" * 1000, "b.run": b"", "c-0001.log": os.urandom(70_000)}
    upload(remote, tmp_path, payloads)
    assert remote.list_files() == {n: len(d) for n, d in payloads.items()}
    for name, data in payloads.items():
        dst = tmp_path / "down" / name
        dst.parent.mkdir(exist_ok=True)
        assert remote.get_file(name, dst) == len(data)
        assert dst.read_bytes() == data
    # downloads leave no temp files beside the destination
    assert sorted(p.name for p in (tmp_path / "down").iterdir()) == sorted(payloads)


def test_put_replaces_and_get_overwrites_destination(remote: Remote, tmp_path: Path) -> None:
    upload(remote, tmp_path, {"f": b"old"})
    upload(remote, tmp_path, {"f": b"newer"})
    dst = write(tmp_path / "dst", b"stale local content")
    assert remote.get_file("f", dst) == 5
    assert dst.read_bytes() == b"newer"
    assert remote.list_files() == {"f": 5}


def test_large_file_roundtrip(remote: Remote, tmp_path: Path) -> None:
    # bigger than one S3 part (5 MiB): exercises MinIO's multipart path
    data = os.urandom(12 * 1024 * 1024 + 17)
    upload(remote, tmp_path, {"big": data})
    dst = tmp_path / "big.out"
    assert remote.get_file("big", dst) == len(data)
    assert crc32c(dst.read_bytes()) == crc32c(data)
    assert remote.list_files() == {"big": len(data)}


def test_get_missing_file_raises_remote_error_naming_it(remote: Remote, tmp_path: Path) -> None:
    down = tmp_path / "down"
    down.mkdir()
    with pytest.raises(RemoteError, match="nope.run"):
        remote.get_file("nope.run", down / "never")
    assert list(down.iterdir()) == []  # no destination, no leftover temp file


def test_delete_file_is_idempotent(remote: Remote, tmp_path: Path) -> None:
    upload(remote, tmp_path, {"x": b"1", "y": b"2"})
    remote.delete_file("x")
    remote.delete_file("x")
    remote.delete_file("never-existed")
    assert remote.list_files() == {"y": 1}


def test_put_of_missing_local_file_fails_without_publishing(remote: Remote, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        remote.put_file("ghost", tmp_path / "does-not-exist")
    assert remote.list_files() == {}


# -- names --------------------------------------------------------------------------------

BAD_NAMES = ["", "a/b", "..", "a..b", ".", "../escape", "x\\y"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_names_rejected_everywhere(remote: Remote, tmp_path: Path, bad: str) -> None:
    src = write(tmp_path / "src", b"data")
    calls = [
        lambda: remote.put_file(bad, src),
        lambda: remote.get_file(bad, tmp_path / "dst"),
        lambda: remote.delete_file(bad),
        lambda: remote.put_blob(bad, b"x"),
        lambda: remote.get_blob(bad),
        lambda: remote.delete_blob(bad),
    ]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        assert repr(bad) in str(info.value)
    assert remote.list_files() == {}


def test_non_str_name_is_a_type_error(remote: Remote, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="name must be a str"):
        remote.put_file(7, write(tmp_path / "src", b"d"))  # type: ignore[arg-type]


# -- manifests ------------------------------------------------------------------------------


def test_manifest_roundtrip_and_numeric_order(remote: Remote, tmp_path: Path) -> None:
    files = {"r1": b"one", "r2": b"two"}
    upload(remote, tmp_path, files)
    written = {sid: manifest(sid, files, seq=sid, blob=b"\x00\xff") for sid in (10, 2, 1, 100)}
    for m in written.values():
        remote.write_manifest(m)
    assert remote.list_snapshots() == [1, 2, 10, 100]
    assert remote.latest_snapshot() == 100
    for sid, m in written.items():
        assert remote.read_manifest(sid) == m


def test_publish_ordering_manifest_absent_until_written(remote: Remote, tmp_path: Path) -> None:
    files = {"run-1": b"a" * 100, "run-2": b"b" * 200}
    upload(remote, tmp_path, files)
    # every file is there, but the snapshot is not published yet
    assert set(remote.list_files()) == set(files)
    assert remote.list_snapshots() == []
    assert remote.latest_snapshot() is None
    with pytest.raises(SnapshotNotFoundError, match="7"):
        remote.read_manifest(7)
    remote.write_manifest(manifest(7, files))
    assert remote.list_snapshots() == [7]
    assert remote.read_manifest(7).total_bytes == 300


def test_manifest_rewrite_replaces(remote: Remote) -> None:
    remote.write_manifest(manifest(3, {}, v=1))
    remote.write_manifest(manifest(3, {}, v=2))
    assert remote.list_snapshots() == [3]
    assert remote.read_manifest(3).meta == {"v": 2}


def test_delete_snapshot_unpublishes_but_keeps_files(remote: Remote, tmp_path: Path) -> None:
    upload(remote, tmp_path, {"f": b"data"})
    remote.write_manifest(manifest(1, {"f": b"data"}))
    remote.write_manifest(manifest(2, {"f": b"data"}))
    remote.delete_snapshot(1)
    remote.delete_snapshot(1)  # idempotent
    assert remote.list_snapshots() == [2]
    with pytest.raises(SnapshotNotFoundError):
        remote.read_manifest(1)
    assert remote.list_files() == {"f": 4}


def test_delete_snapshots_unpublishes_several_in_one_request(remote: Remote, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    upload(remote, tmp_path, {"f": b"data"})
    for sid in (1, 2, 3, 4):
        remote.write_manifest(manifest(sid, {"f": b"data"}))
    with pytest.raises((TypeError, ValueError), match="snapshot_id"):
        remote.delete_snapshots([1, -1])  # checked before anything is deleted
    assert remote.list_snapshots() == [1, 2, 3, 4]
    if isinstance(remote, MinioRemote):  # the point of it: one DeleteObjects, not one per id
        calls: list[str] = []
        real = remote._call
        monkeypatch.setattr(remote, "_call", lambda op, key, fn, **kw: calls.append(op) or real(op, key, fn, **kw))
    remote.delete_snapshots([1, 3, 7])  # 7: missing is fine
    if isinstance(remote, MinioRemote):
        assert calls == ["delete manifests"]
    assert remote.list_snapshots() == [2, 4]
    remote.delete_snapshots([])
    assert remote.list_snapshots() == [2, 4] and remote.list_files() == {"f": 4}


@pytest.mark.parametrize("bad", [-1, 10**20, True, "3", 1.5])
def test_bad_snapshot_ids_rejected(remote: Remote, bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="snapshot_id"):
        remote.read_manifest(bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="snapshot_id"):
        remote.delete_snapshot(bad)  # type: ignore[arg-type]


# -- blobs --------------------------------------------------------------------------------


def test_blobs_roundtrip_are_separate_from_files(remote: Remote) -> None:
    assert remote.get_blob("global") is None
    remote.put_blob("global", b"v1")
    remote.put_blob("global", b"v2")
    remote.put_blob("empty", b"")
    assert remote.get_blob("global") == b"v2"
    assert remote.get_blob("empty") == b""
    assert remote.list_files() == {}
    assert remote.list_snapshots() == []
    remote.delete_blob("global")
    remote.delete_blob("global")  # deleting a missing blob is not an error
    assert remote.get_blob("global") is None and remote.get_blob("empty") == b""


# -- gc -------------------------------------------------------------------------------------


def test_gc_keeps_newest_snapshots_and_their_files(remote: Remote, tmp_path: Path) -> None:
    # snapshot i references run-i and run-(i+1): consecutive snapshots share one file
    data = {f"run-{i}": bytes([i]) * (10 * i) for i in range(1, 7)}
    upload(remote, tmp_path, data)
    for sid in range(1, 6):
        names = [f"run-{sid}", f"run-{sid + 1}"]
        remote.write_manifest(manifest(sid, {n: data[n] for n in names}))
    upload(remote, tmp_path, {})  # nothing; orphan below is older than manifest 5 anyway
    info = remote.gc(keep=2)
    assert isinstance(info, GcInfo)
    assert info.snapshots_deleted == [1, 2, 3]
    assert remote.list_snapshots() == [4, 5]
    # retained: 4 -> run-4, run-5; 5 -> run-5, run-6
    assert set(remote.list_files()) == {"run-4", "run-5", "run-6"}
    assert info.files_deleted == 3
    assert info.bytes_deleted == 10 + 20 + 30
    # every retained snapshot is fully restorable
    for sid in remote.list_snapshots():
        for name, fi in remote.read_manifest(sid).files.items():
            out = tmp_path / f"check-{name}"
            assert remote.get_file(name, out) == fi.size
            assert crc32c(out.read_bytes()) == fi.crc


def test_gc_deletes_orphans_older_than_newest_manifest(remote: Remote, tmp_path: Path) -> None:
    upload(remote, tmp_path, {"orphan-old": b"x" * 5, "kept": b"k"})
    time.sleep(0.05)  # mtimes are compared; keep the two events apart
    remote.write_manifest(manifest(1, {"kept": b"k"}))
    time.sleep(0.05)
    # uploaded after the newest manifest: may belong to a snapshot still uploading
    upload(remote, tmp_path, {"in-flight": b"y" * 7})
    info = remote.gc(keep=1)
    assert info.snapshots_deleted == []
    assert set(remote.list_files()) == {"kept", "in-flight"}
    assert (info.files_deleted, info.bytes_deleted) == (1, 5)
    # once its manifest is published, the in-flight file is safe; a later gc keeps it
    remote.write_manifest(manifest(2, {"kept": b"k", "in-flight": b"y" * 7}))
    remote.gc(keep=1)
    assert set(remote.list_files()) == {"kept", "in-flight"}
    assert remote.list_snapshots() == [2]


def test_gc_with_more_keep_than_snapshots_deletes_nothing(remote: Remote, tmp_path: Path) -> None:
    upload(remote, tmp_path, {"a": b"1"})
    remote.write_manifest(manifest(1, {"a": b"1"}))
    info = remote.gc(keep=5)
    assert info == GcInfo([], 0, 0)
    assert remote.list_snapshots() == [1]
    assert remote.list_files() == {"a": 1}


def test_gc_without_snapshots_deletes_no_files(remote: Remote, tmp_path: Path) -> None:
    upload(remote, tmp_path, {"first-upload": b"in progress"})
    assert remote.gc(keep=1) == GcInfo([], 0, 0)
    assert "first-upload" in remote.list_files()


@pytest.mark.parametrize("keep", [0, -3])
def test_gc_keep_must_be_positive(remote: Remote, keep: int) -> None:
    remote.write_manifest(manifest(1, {}))
    with pytest.raises(ValueError, match="keep"):
        remote.gc(keep=keep)
    assert remote.list_snapshots() == [1]


def test_gc_keep_must_be_int(remote: Remote) -> None:
    with pytest.raises(TypeError, match="keep"):
        remote.gc(keep="2")  # type: ignore[arg-type]


# -- lifecycle ------------------------------------------------------------------------------


def test_destroy_removes_everything_and_remote_stays_usable(remote: Remote, tmp_path: Path) -> None:
    upload(remote, tmp_path, {"a": b"1", "b": b"22"})
    remote.write_manifest(manifest(1, {"a": b"1"}))
    remote.put_blob("meta", b"m")
    remote.destroy()
    assert remote.list_files() == {}
    assert remote.list_snapshots() == []
    assert remote.get_blob("meta") is None
    upload(remote, tmp_path, {"c": b"333"})
    assert remote.list_files() == {"c": 3}


def test_concurrent_use_from_threads(remote: Remote, tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(8):
                name = f"t{t}-f{i}"
                payload = f"{name}:".encode() * (i + 1)
                src = write(tmp_path / f"src-{name}", payload)
                remote.put_file(name, src)
                dst = tmp_path / f"dst-{name}"
                remote.get_file(name, dst)
                assert dst.read_bytes() == payload
                remote.put_blob(f"blob-{t}", payload)
        except BaseException as e:  # collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(remote.list_files()) == 6 * 8
    for t in range(6):
        assert remote.get_blob(f"blob-{t}") == f"t{t}-f7:".encode() * 8


def test_pickled_copy_sees_the_same_namespace(remote: Remote, tmp_path: Path) -> None:
    # e.g. handed to a merge worker process: the copy gets its own pool and locks
    import pickle

    upload(remote, tmp_path, {"before": b"1"})
    copy = pickle.loads(pickle.dumps(remote))
    try:
        assert copy.list_files() == {"before": 1}
        copy.put_blob("from-copy", b"hi")
        assert remote.get_blob("from-copy") == b"hi"
        assert repr(copy) == repr(remote)
    finally:
        copy.close()
