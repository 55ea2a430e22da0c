"""PathRemote specifics: atomic publication on disk, temp-file hygiene, bad roots."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from remotes import FileInfo, Manifest
from remotes.path import PathRemote


def test_layout_on_disk(tmp_path: Path) -> None:
    r = PathRemote(tmp_path / "r")
    src = tmp_path / "src"
    src.write_bytes(b"payload")
    r.put_file("run-1", src)
    r.write_manifest(Manifest(42, "test", {"run-1": FileInfo(7, 0)}))
    r.put_blob("global", b"g")
    assert (tmp_path / "r" / "files" / "run-1").read_bytes() == b"payload"
    assert (tmp_path / "r" / "manifests" / f"{42:020d}.manifest").is_file()
    assert (tmp_path / "r" / "blobs" / "global").read_bytes() == b"g"
    assert list((tmp_path / "r" / "tmp").iterdir()) == []  # every write was renamed into place


def test_failed_upload_publishes_nothing_and_leaves_no_temp(tmp_path: Path) -> None:
    r = PathRemote(tmp_path / "r")
    not_a_file = tmp_path / "a-directory"
    not_a_file.mkdir()
    with pytest.raises(IsADirectoryError):
        r.put_file("run-1", not_a_file)
    assert r.list_files() == {}
    assert list((tmp_path / "r" / "tmp").iterdir()) == []


def test_gc_sweeps_stale_temp_files_only(tmp_path: Path) -> None:
    r = PathRemote(tmp_path / "r")
    stale = tmp_path / "r" / "tmp" / "crashed.tmp"
    fresh = tmp_path / "r" / "tmp" / "in-flight.tmp"
    stale.write_bytes(b"half a file")
    fresh.write_bytes(b"being written")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    r.write_manifest(Manifest(1, "test", {}))
    r.gc(keep=1)
    assert not stale.exists()
    assert fresh.exists()


def test_root_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(ValueError, match="not a directory"):
        PathRemote(f)


def test_corrupt_manifest_is_reported_with_its_path(tmp_path: Path) -> None:
    r = PathRemote(tmp_path / "r")
    r.write_manifest(Manifest(3, "test", {}))
    path = tmp_path / "r" / "manifests" / f"{3:020d}.manifest"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum") as info:
        r.read_manifest(3)
    assert str(path) in str(info.value)


def test_foreign_entries_in_manifests_dir_are_ignored(tmp_path: Path) -> None:
    r = PathRemote(tmp_path / "r")
    r.write_manifest(Manifest(5, "test", {}))
    (tmp_path / "r" / "manifests" / "README").write_text("not a manifest")
    (tmp_path / "r" / "manifests" / "7.manifest").write_text("unpadded: not ours")
    assert r.list_snapshots() == [5]
