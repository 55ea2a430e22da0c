"""memonly's dump cache (each key's encoded record, re-encoded only when written): a dump
after any mix of writes, deletes and restores holds exactly the state, and churning
through keys between dumps does not hoard memory."""

from __future__ import annotations

from pathlib import Path

import remotes
import statestores


def _reopened(path: Path) -> dict[bytes, bytes]:
    with statestores.open("memonly", path) as s:
        return dict(s.items())


def test_a_dump_after_overwrites_deletes_and_a_restore_holds_exactly_the_state(tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open("memonly", tmp_path / "db", remote=remote) as s:
        for i in range(100):
            s.put(b"k%03d" % i, b"v0")
        s.snapshot(1)
        s.write_batch([(b"k001", b"v1"), (b"k002", None), (b"new", b"n")])
        s.delete(b"k003")
        s.snapshot(2)
        s.restore(1)  # everything the cache knew is stale now
        s.put(b"k004", b"v4")
        s.flush()
    want = {b"k%03d" % i: b"v0" for i in range(100)} | {b"k004": b"v4"}
    assert _reopened(tmp_path / "db") == want


def test_churning_through_keys_between_dumps_keeps_the_cache_bounded(tmp_path: Path) -> None:
    with statestores.open("memonly", tmp_path / "db") as s:
        s.put(b"live", b"1")
        s.flush()  # the first dump: from now on writes are tracked
        for i in range(20_000):
            s.put(b"gone%05d" % i, b"x")
            s.delete(b"gone%05d" % i)
        assert s._dirty is None or len(s._dirty) <= 2 * len(s) + 1024
        assert len(s._enc) <= len(s) + 1
        s.put(b"after", b"2")
        s.flush()
    assert _reopened(tmp_path / "db") == {b"live": b"1", b"after": b"2"}
