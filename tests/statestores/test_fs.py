"""The file-system seam and its fault-injecting variant."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from statestores import FileSystem, LockedError
from statestores.testing import FaultyFS, InjectedFault


def test_write_file_atomic_replaces_whole(tmp_path: Path) -> None:
    fs = FileSystem()
    p = str(tmp_path / "doc")
    fs.write_file_atomic(p, b"one", sync=True)
    fs.write_file_atomic(p, b"two", sync=False)
    assert fs.read_file(p) == b"two"
    assert os.listdir(tmp_path) == ["doc"]


def test_faulty_fs_tears_the_failing_write_and_then_is_dead(tmp_path: Path) -> None:
    fs = FaultyFS(fail_at=2, torn=True, seed=3)
    p = str(tmp_path / "log")
    fd = fs.open_append(p)
    fs.write(fd, b"a" * 10)
    with pytest.raises(InjectedFault):
        fs.write(fd, b"b" * 100)
    size = os.path.getsize(p)
    assert 10 < size < 110  # a prefix of the second write reached the file
    with pytest.raises(InjectedFault):
        fs.write(fd, b"c")
    with pytest.raises(InjectedFault):
        fs.open_read(p)
    assert os.path.getsize(p) == size  # nothing after the fault


def test_faulty_fs_counts_every_mutating_call(tmp_path: Path) -> None:
    fs = FaultyFS()
    fs.write_file_atomic(str(tmp_path / "x"), b"data", sync=True)
    assert fs.calls == 4  # write, fsync, rename, fsync_dir


def test_crash_releases_the_directory_lock(tmp_path: Path) -> None:
    fs = FaultyFS()
    fs.lock(str(tmp_path / "LOCK"))
    with pytest.raises(LockedError):
        FileSystem().lock(str(tmp_path / "LOCK"))
    fs.crash()
    FileSystem().lock(str(tmp_path / "LOCK"))


def test_corruption_error_crosses_process_boundaries() -> None:
    import pickle

    from statestores import CorruptionError

    err = pickle.loads(pickle.dumps(CorruptionError("lsm-L1-0000000007.run", "checksum mismatch")))
    assert isinstance(err, CorruptionError)
    assert err.path == "lsm-L1-0000000007.run" and "checksum mismatch" in str(err)


def test_a_forked_child_does_not_keep_a_closed_store_locked(tmp_path: Path) -> None:
    """A child forked while a store is open (a background worker being spawned, the
    user's own subprocess) shares its descriptors until it execs or exits: the store must
    still reopen once closed, and a second open in this process must be refused."""
    import os
    import signal

    import statestores

    s = statestores.open("lsm", tmp_path)
    with pytest.raises(statestores.LockedError, match="already open in this process"):
        statestores.open("lsm", tmp_path)
    pid = os.fork()
    if pid == 0:  # the child holds copies of every descriptor, the LOCK's included
        signal.pause()
        os._exit(0)
    try:
        s.put(b"k", b"v")
        s.close()
        with statestores.open("lsm", tmp_path) as again:
            assert again.get(b"k") == b"v"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
