"""A replica's snapshots (statestores.replica): marks lost on the way are sent again with
every body the replica lacks, a follower told to stop at a snapshot takes nothing after
it, a new follower seeded from the snapshot remote receives only what changed, and a
replica promoted at a snapshot restores it without a download. (The model and the
transports: test_replica.py.)"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import remotes
import statestores
from statestores.replica import (
    LocalSource,
    Received,
    Shipper,
    TcpServer,
    TcpSource,
    wire,
)
from statestores.replica.wire import Hello, Tip

from .engines import TINY
from .replicas import SECRET, FaultySource, _fill


def test_promotion_into_another_directory_moves_the_files_and_replaces_what_was_there(tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open("hybridlog", tmp_path / "primary", remote=remote, **TINY["hybridlog"])
    shipper = Shipper(db)
    f = statestores.follow("hybridlog", tmp_path / "replica", LocalSource(shipper))
    _fill(db, 100)
    db.snapshot(1)
    want = dict(db.items())
    f.wait(snapshot_id=1)
    inode = {n: os.stat(tmp_path / "replica" / n).st_ino for n in os.listdir(tmp_path / "replica") if n.endswith(".log")}
    stale = tmp_path / "data" / "p0"
    statestores.open("hybridlog", stale).close()  # a dead primary's old directory
    with statestores.open("hybridlog", tmp_path / "busy"), pytest.raises(statestores.LockedError):
        f.promote(1, directory=tmp_path / "busy")  # a live store there: refused, nothing lost
    f.close()  # a failed promotion has stopped following; the replica is intact
    f2 = statestores.follow("hybridlog", tmp_path / "replica", LocalSource(shipper))
    f2.wait(snapshot_id=1)
    store = f2.promote(1, directory=stale)
    assert dict(store.items()) == want
    assert not (tmp_path / "replica").exists()
    moved = {}
    for n in inode:  # (the promoted store merges at once: a file may go between two looks)
        with contextlib.suppress(FileNotFoundError):
            moved[n] = os.stat(stale / n).st_ino
    assert moved and all(moved[n] == inode[n] for n in moved), "promotion renamed the files, it did not copy them"
    store.close()
    shipper.close()
    db.close()


class _DropFirstMark(FaultySource):
    """Drops the first snapshot mark it sees, once; everything else passes."""

    def open(self, hello: Hello) -> Iterator[Received | Tip]:
        for item in self.inner.open(hello):
            if not isinstance(item, Tip) and isinstance(item.msg, wire.MarkMsg) and not self.injected:
                self.injected.append("drop-mark")
                continue
            yield item


def test_a_mark_lost_before_later_edits_is_sent_again(tmp_path: Path) -> None:
    """The follower installs edits after a lost mark; the shipper's tip shows the loss and
    the resumed stream carries the mark again, without waiting for another snapshot."""
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open("lsm", tmp_path / "primary", remote=remote, **TINY["lsm"])
    shipper = Shipper(db)
    source = _DropFirstMark(shipper, [])
    f = statestores.follow("lsm", tmp_path / "replica", source)
    _fill(db, 50)
    db.snapshot(1)
    want = dict(db.items())
    _fill(db, 200, 50)  # later edits (flushes) after the lost mark
    db.settle()
    f.wait(seq=db.version()[0], snapshot_id=1, timeout=30)
    assert source.injected == ["drop-mark"] and f.stats()["gaps"] >= 1
    store = f.promote(1)
    assert dict(store.items()) == want
    store.close()
    shipper.close()
    db.close()


class _LosesMarksUntil(FaultySource):
    """The first stream loses every mark and heartbeat until ``done`` is set, then breaks;
    the streams after it are intact (a link that dropped marks for a while)."""

    def __init__(self, shipper: Shipper, done: threading.Event) -> None:
        super().__init__(shipper, [])
        self.done = done
        self.opened = 0

    def open(self, hello: Hello) -> Iterator[Received | Tip]:
        self.opened += 1
        if self.opened > 1:
            yield from self.inner.open(hello)
            return
        for item in self.inner.open(hello):
            if self.done.is_set():
                raise ConnectionError("injected: the lossy link breaks")
            if isinstance(item, Tip) or isinstance(item.msg, wire.MarkMsg):
                self.injected.append("lost")
                if not isinstance(item, Tip):
                    item.fetch(None)
                continue
            yield item


@pytest.mark.parametrize("engine", ["lsm", "hybridlog"])
def test_marks_lost_over_a_long_history_are_sent_again_with_every_body_the_replica_lacks(
        tmp_path: Path, engine: str, caplog: pytest.LogCaptureFixture) -> None:
    """The follower installs every edit but no mark; when the link breaks it reopens at
    the newest version, and the stream replays from the oldest mark it lacks. The edits
    replayed between the marks are duplicates it skips, so a file one of them added and a
    later one merged away is not on the replica: a later mark naming it must carry its
    body. (The stream once counted the skipped edits' files as held, and each such mark
    came without them: a gap, a reopen, one mark further, again.)

    Not appendlog: a segment folded at a snapshot reaches a follower only in marks until
    an edit seals it, so there a link that silently loses marks is a gap at that edit,
    which the follower notices and reopens at (as for any lost message; the transports
    lose none without breaking the stream)."""
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open(engine, tmp_path / "primary", remote=remote, **TINY[engine])
    shipper = Shipper(db)
    done = threading.Event()
    source = _LosesMarksUntil(shipper, done)
    f = statestores.follow(engine, tmp_path / "replica", source, **TINY[engine])
    caplog.set_level("INFO", logger="statestores.replica")
    try:
        snaps: dict[int, dict[bytes, bytes]] = {}
        for sid in range(1, 9):
            _fill(db, 60, 37 * sid)  # flushes, and merges that replace earlier files
            db.snapshot(sid)
            snaps[sid] = dict(db.items())
        db.settle()
        f.wait(seq=db.version()[0], timeout=30)
        assert f.marks == [] and "lost" in source.injected, "the lossy link delivered a mark: the test proved nothing"
        done.set()
        f.wait(seq=db.version()[0], snapshot_id=8, timeout=30)
        lacking = [r.getMessage() for r in caplog.records if "which this replica lacks" in r.getMessage()]
        assert not lacking, f"a replayed mark came without bodies the replica lacks: {lacking[:2]}"
        assert f.stats()["reconnects"] == 1 and f.stats()["gaps"] == 0, f.last_error
        assert f.snapshots()[-1] == 8
        store = f.promote(8)
        try:
            assert dict(store.items()) == snaps[8]
        finally:
            store.close()
    finally:
        f.close()
        shipper.close()
        db.close()


def test_the_shipper_knows_when_a_follower_holds_a_snapshot(tmp_path: Path) -> None:
    """What a primary waits for before it reports a round (worker.replication.wait_marks)."""
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open("lsm", tmp_path / "primary", remote=remote, **TINY["lsm"])
    with TcpServer({"primary": (shipper := Shipper(db, name="primary"))}, SECRET) as server:
        _fill(db, 30)
        db.snapshot(1)
        assert shipper.followers == 0 and not shipper.wait_acked(1, 0.2), "no follower: nothing acknowledged"
        f = statestores.follow("lsm", tmp_path / "replica", TcpSource(*server.address, "primary", SECRET))
        assert shipper.wait_acked(1, 10), "the follower's ack of the mark reached the shipper"
        assert shipper.followers == 1 and 1 in f.snapshots()
        db.snapshot(2)
        assert shipper.wait_acked(2, 10) and 2 in f.snapshots()
        f.close()
    shipper.close()
    db.close()


def test_a_follower_told_to_stop_at_a_snapshot_acknowledges_it_and_takes_nothing_after(tmp_path: Path) -> None:
    """A partition moving in a rescale: the receiver stops at the switch round's snapshot
    (``stop_at``), the primary still hears its acknowledgement of that round at once (its
    round report waits for it), what the primary flushes or merges afterwards is not
    shipped, and the replica becomes the store as of that snapshot."""
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open("lsm", tmp_path / "primary", remote=remote, **TINY["lsm"])
    with TcpServer({"primary": (shipper := Shipper(db, name="primary"))}, SECRET) as server:
        _fill(db, 200)
        f = statestores.follow("lsm", tmp_path / "replica", TcpSource(*server.address, "primary", SECRET),
                               live_only=True)
        db.settle()
        f.wait(seq=db.version()[0])
        f.stop_at(2)
        db.snapshot(1)
        assert shipper.wait_acked(1, 10) and f.snapshots() == [1]
        _fill(db, 100, 200)
        db.snapshot(2)
        at_two = dict(db.items())
        assert shipper.wait_acked(2, 10), "the mark it stops at is acknowledged"
        received = f.stats()["bytes_received"]
        _fill(db, 400, 300)  # flushes and merges after the snapshot
        db.settle()
        time.sleep(0.5)
        assert f.stats()["bytes_received"] == received and f.snapshots() == [1, 2]
        store = f.promote(2)
        assert dict(store.items()) == at_two
        store.close()
    shipper.close()
    db.close()


def test_a_stream_ships_each_file_body_once(tmp_path: Path) -> None:
    """A snapshot mark names files the stream's edits already brought: they go without
    their bodies (a standby or a receiver pays each file's bytes once, not once per round).
    The exception: a file an edit removed before the mark came (the follower may have
    deleted it) is sent again."""
    from statestores.replica.wire import EditMsg

    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open("lsm", tmp_path / "primary", remote=remote, **TINY["lsm"])
    shipper = Shipper(db)
    stream = shipper.stream(Hello("primary", 0, -1), idle=0.05)
    shipped: set[str] = set()
    removed: set[str] = set()
    again: list[str] = []
    marks = 0

    def drain() -> None:
        nonlocal marks
        for d in stream:
            if isinstance(d, Tip):
                return
            files = d.msg.added if isinstance(d.msg, EditMsg) else d.msg.files
            marks += not isinstance(d.msg, EditMsg)
            again.extend(f.entry.name for f in files if f.body and f.entry.name in shipped - removed)
            shipped.update(f.entry.name for f in files if f.body)
            if isinstance(d.msg, EditMsg):
                removed.update(d.msg.removed)

    drain()
    for r in range(1, 5):
        _fill(db, 120, r * 60)
        db.snapshot(r)
        db.settle()
        drain()
    stream.close()
    assert marks == 4 and len(shipped) > 10 and not again, again
    shipper.close()
    db.close()


@pytest.mark.parametrize("engine", ["lsm", "hybridlog", "appendlog"])
def test_a_new_follower_seeded_from_the_snapshot_remote_receives_only_what_changed(tmp_path: Path, engine: str) -> None:
    """A new replica given the store's remote downloads the newest snapshot there first; the
    primary then ships only the files written since, and the replica promotes to the same
    state as one that received everything from the primary.

    Seeding takes a snapshot's immutable runs, segments and hints, not its WALs (a new
    replica's base would collect them), so appendlog seals its segments here (a small
    ``threshold``): a snapshot's folded segments reach a replica from the primary."""
    remote = remotes.PathRemote(tmp_path / "remote")
    sizes = {"threshold": 16 << 10} if engine == "appendlog" else {}  # otherwise default sizes: no merge below
    db = statestores.open(engine, tmp_path / "primary", remote=remote, **sizes)
    shipper = Shipper(db)
    _fill(db, 2000)
    db.flush()
    db.snapshot(1)
    _fill(db, 30, 2000)  # after the snapshot: only the primary has these
    db.flush()
    db.settle()
    seq = db.version()[0]
    plain = statestores.follow(engine, tmp_path / "plain", LocalSource(shipper))
    seeded = statestores.follow(engine, tmp_path / "seeded", LocalSource(shipper), seed=remote)
    for f in (plain, seeded):
        f.wait(seq=seq, snapshot_id=1)
    got, full = seeded.stats(), plain.stats()
    assert full["bytes_seeded"] == 0 and got["bytes_seeded"] > 0
    assert got["bytes_received"] + got["bytes_seeded"] >= full["bytes_received"]
    assert got["bytes_received"] < full["bytes_received"] / 2, (got, full)
    _fill(db, 30, 2030)
    db.snapshot(2)
    db.settle()
    for f in (plain, seeded):
        f.wait(seq=db.version()[0], snapshot_id=2)
    stores = [f.promote(2) for f in (plain, seeded)]
    assert dict(stores[1].items()) == dict(stores[0].items()) == dict(db.items())
    for s in stores:
        s.close()
    shipper.close()
    db.close()


def test_a_seeded_file_that_is_not_the_primarys_is_fetched_from_the_primary(tmp_path: Path) -> None:
    """Seeded from a remote whose copy of a live run differs from the primary's (its own
    manifest agrees with it), the replica notices the checksum the primary lists, drops
    that file and receives the primary's own."""
    from remotes.manifest import FileInfo, Manifest
    from statestores.checksum import crc32c

    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open("lsm", tmp_path / "primary", remote=remote, **TINY["lsm"])
    shipper = Shipper(db)
    _fill(db, 300)
    db.settle()
    db.snapshot(1)
    db.settle()
    seq, live = db.version()
    m = remote.read_manifest(1)
    (victim, *_) = sorted(e.name for e in live if e.kind == "run" and e.name in m.files)
    other = remotes.PathRemote(tmp_path / "other")
    files = dict(m.files)
    for name in m.files:
        data = (tmp_path / "primary" / name).read_bytes() if (tmp_path / "primary" / name).exists() else None
        if data is None:
            continue
        if name == victim:
            data = data[:10] + bytes([data[10] ^ 0xFF]) + data[11:]
            files[name] = FileInfo(len(data), crc32c(data))
        (tmp_path / "blob").write_bytes(data)
        other.put_file(name, tmp_path / "blob")
    other.write_manifest(Manifest(1, m.engine, {n: i for n, i in files.items() if n in other.list_files()}, m.meta))
    f = statestores.follow("lsm", tmp_path / "replica", LocalSource(shipper), seed=other)
    f.wait(seq=seq)
    got = f.stats()
    assert got["bytes_seeded"] > 0 and got["corrupt"] >= 1, got
    store = f.promote()
    assert dict(store.items()) == dict(db.items())
    store.close()
    shipper.close()
    db.close()


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_a_replica_promoted_at_a_snapshot_restores_it_without_a_download(tmp_path: Path, engine: str) -> None:
    """A promoted standby's first act in a recovery is a restore to the round it was
    promoted at: every file of that snapshot is already local, so nothing is downloaded
    (hybridlog used to flush the snapshot's tails into a log file when it opened, and the
    restore fetched the tails again from the remote)."""
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open(engine, tmp_path / "primary", remote=remote)
    shipper = Shipper(db)
    f = statestores.follow(engine, tmp_path / "replica", LocalSource(shipper))
    for r in range(1, 4):
        for i in range(300):
            db[b"k%05d" % (i * r)] = b"v%d" % r
        db.snapshot(r)
        db.settle()
    want = dict(db.items())
    _fill(db, 300)  # after the snapshot: the replica follows these too
    db.settle()
    f.wait(seq=db.version()[0], snapshot_id=3)
    store = f.promote(3, directory=tmp_path / "promoted", remote=remote)
    try:
        assert dict(store.items()) == want
        info = store.restore(3)
        assert (info.files_downloaded, info.files_total) == (0, len(remote.read_manifest(3).files))
        assert dict(store.items()) == want
    finally:
        store.close()
        shipper.close()
        db.close()


def test_a_promoted_lsm_replica_reads_none_of_its_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The follower opened each run ahead (fence index, Bloom filter) and read each sealed
    WAL: the promotion opens no run and replays no WAL, also into another directory, and
    the store merges those runs at their new paths."""
    from statestores.lsm import engine as lsm_engine
    from statestores.lsm import wal as lsm_wal

    opts = {**TINY["lsm"], "memtable_bytes": 1 << 16}  # the snapshot's last writes stay in its WAL
    db = statestores.open("lsm", tmp_path / "primary", remote=remotes.PathRemote(tmp_path / "remote"), **opts)
    shipper = Shipper(db)
    for start in (0, 100, 200):
        _fill(db, 100, start=start)
        db.flush()  # three runs
    _fill(db, 20, start=300)  # and a sealed WAL
    db.snapshot(1)
    want = dict(db.items())
    opened: list[str] = []

    class Counting(lsm_engine.RunReader):
        def __init__(self, *a: Any, **k: Any) -> None:
            if "-promoted" in str(a[1]):  # (not the primary's merges meanwhile)
                opened.append(str(a[1]))
            super().__init__(*a, **k)

    replay = lsm_engine.replay

    def counting_replay(fs: Any, path: str, *a: Any, **k: Any) -> Any:
        if "-promoted" in path:
            opened.append(path)
        return replay(fs, path, *a, **k)

    def promoted(name: str, ahead: bool) -> tuple[statestores.Store, list[str]]:
        if not ahead:
            monkeypatch.setattr(lsm_engine.LSMStore, "preopen", classmethod(lambda cls, fs, path, e: None))
        f = statestores.follow("lsm", tmp_path / name, LocalSource(shipper), **opts)
        f.wait(snapshot_id=1)
        opened.clear()
        monkeypatch.setattr(lsm_engine, "RunReader", Counting)
        monkeypatch.setattr(lsm_engine, "replay", counting_replay)
        monkeypatch.setattr(lsm_wal, "replay", counting_replay)  # open replays in wal.py
        store = f.promote(1, directory=tmp_path / f"{name}-promoted")
        monkeypatch.undo()
        return store, list(opened)

    cold, reads = promoted("cold", ahead=False)  # the control: without opening ahead
    runs = [n for n in reads if n.endswith(".run")]
    assert len(runs) == sum(e.kind == "run" for e in cold.version()[1]) > 0
    assert [n for n in reads if n.endswith(".wal")], "the snapshot holds no sealed WAL to replay"
    cold.close()
    store, reads = promoted("warm", ahead=True)
    assert reads == [], f"the promotion opened {reads}"
    assert dict(store.items()) == want
    _fill(store, 300, start=320)
    store.compact()  # merges read the runs by path: those of the moved directory
    assert dict(store.items()) == {**want, **{b"key%05d" % i: b"value%d" % i for i in range(320, 620)}}
    store.close()
    shipper.close()
    db.close()
