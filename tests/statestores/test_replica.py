"""Followers (statestores.replica) against a model: after any history of writes, flushes,
merges and snapshots on the primary, shipped through a stream that drops, duplicates,
reorders, corrupts and disconnects, the replica holds exactly the primary's immutable
files, byte for byte, and each retained snapshot promotes to exactly the model's state."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remotes
import statestores
from statestores.replica import (
    SHIPPED_KINDS,
    LocalSource,
    ProtocolError,
    Received,
    Shipper,
    TcpServer,
    TcpSource,
    wire,
)
from statestores.replica.follower import STATE_NAME
from statestores.replica.wire import Hello, Tip

from .engines import TINY

FAULTS = ("none", "drop", "dup", "corrupt", "truncate", "disconnect", "swap")


class FaultySource:
    """A LocalSource whose stream misbehaves on a fixed schedule of faults (one per message)."""

    def __init__(self, shipper: Shipper, schedule: list[str]) -> None:
        self.inner = LocalSource(shipper)
        self.store = shipper.name
        self.schedule = list(schedule)
        self.injected: list[str] = []

    def _fault(self) -> str:
        return self.schedule.pop(0) if self.schedule else "none"

    def open(self, hello: Hello) -> Iterator[Received | Tip]:
        it = self.inner.open(hello)
        for item in it:
            if isinstance(item, Tip):
                yield item
                continue
            fault = self._fault()
            if fault != "none":
                self.injected.append(fault)
            if fault == "drop":
                continue
            if fault == "disconnect":
                raise ConnectionError("injected disconnect")
            if fault == "dup":
                yield item
                yield item
                continue
            if fault == "swap":
                later = next(it, None)
                if later is not None:
                    yield later  # a Tip or the next message, then the held one
                yield item
                continue
            if fault in ("corrupt", "truncate"):
                yield Received(item.msg, _damaging(item.fetch, fault))
                continue
            yield item

    def close(self) -> None:
        self.inner.close()


def _damaging(fetch: Any, how: str) -> Any:
    def damaged(dests: dict[str, str] | None) -> None:
        fetch(dests)
        for path in (dests or {}).values():
            data = bytearray(Path(path).read_bytes())
            if how == "truncate" or not data:
                Path(path).write_bytes(bytes(data[: len(data) // 2]))
            else:
                data[len(data) // 2] ^= 0x5A
                Path(path).write_bytes(bytes(data))
            return  # one damaged body is enough

    return damaged


def _immutable(store: statestores.Store) -> dict[str, bytes]:
    _seq, files = store.version()
    return {e.name: Path(store.directory, e.name).read_bytes() for e in files if e.kind in SHIPPED_KINDS}


KEYS = st.sampled_from([b"k%02d" % i for i in range(16)])
VALUES = st.binary(min_size=0, max_size=80)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, VALUES),
        st.tuples(st.just("del"), KEYS, st.none()),
        st.tuples(st.just("snap"), st.none(), st.none()),
        st.tuples(st.just("flush"), st.none(), st.none()),
    ),
    min_size=1,
    max_size=60,
)


def apply_op(db: statestores.Store, op: str, k: Any, v: Any, model: dict[bytes, bytes],
             snaps: dict[int, dict[bytes, bytes]]) -> None:
    """One step of a history on ``db`` and on its ``model``; snapshots are numbered 1, 2, …
    and ``snaps`` keeps the model at each."""
    if op == "put":
        db[k] = v
        model[k] = v
    elif op == "del":
        db.delete(k)
        model.pop(k, None)
    elif op == "flush":
        db.flush()
    else:
        sid = len(snaps) + 1
        db.snapshot(sid)
        snaps[sid] = dict(model)


def _run_history(engine: str, ops: list[tuple[str, Any, Any]], schedule: list[str], tmp: Path,
                 source_for: Any = None, chaos: Any = None) -> statestores.replica.Follower:
    """Run ``ops`` on a primary followed through ``source_for(shipper)`` (default: a
    FaultySource with ``schedule``), then check the replica against the primary and the model."""
    remote = remotes.PathRemote(tmp / "remote")
    db = statestores.open(engine, tmp / "primary", remote=remote, **TINY[engine])
    shipper = Shipper(db)
    source = source_for(shipper) if source_for else FaultySource(shipper, schedule)
    follower = statestores.follow(engine, tmp / "replica", source, **TINY[engine])
    try:
        model: dict[bytes, bytes] = {}
        snaps: dict[int, dict[bytes, bytes]] = {}
        for op, k, v in ops:
            apply_op(db, op, k, v, model, snaps)
            if chaos is not None:
                chaos()
        apply_op(db, "snap", None, None, model, snaps)
        sid = len(snaps)
        db.settle()
        seq = db.version()[0]
        follower.wait(seq=seq, snapshot_id=sid, timeout=30)
        with follower.hold() as (held_seq, files):
            assert held_seq == seq
            want = _immutable(db)
            assert {e.name for e in files} == set(want), "the replica's version is not the primary's"
            for name, data in want.items():
                assert Path(follower.directory, name).read_bytes() == data, f"{name} differs from the primary's"
        retained = follower.snapshots()
        assert retained[-1] == sid and len(retained) <= 2
        for r in retained:  # each retained snapshot names exactly the files of the primary's manifest
            assert {e.name for e in follower.marks[retained.index(r)][2]} == set(remote.read_manifest(r).files)
        needed = follower._needed()
        assert set(os.listdir(follower.directory)) == needed | {STATE_NAME, "LOCK"}, "stray or missing files"
        promoted = follower.promote(retained[0])
        try:
            assert dict(promoted.items()) == snaps[retained[0]]
            promoted[b"after"] = b"promotion"  # a normal writable store now
            assert promoted[b"after"] == b"promotion"
        finally:
            promoted.close()
        return follower
    finally:
        follower.close()
        shipper.close()
        db.close()


@pytest.mark.parametrize("engine", statestores.ENGINES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, schedule=st.lists(st.sampled_from(FAULTS), max_size=30))
def test_follower_equals_the_primary_after_any_history_and_stream_faults(engine: str, ops: Any, schedule: list[str]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sfaas-replica-"))
    try:
        _run_history(engine, ops, schedule, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("engine", ["lsm", "hybridlog"])
def test_seeded_long_history_with_faults(engine: str) -> None:
    """A longer history than hypothesis draws, with a fault on a third of the messages."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    ops = []
    for _ in range(1500):
        r = rng.random()
        k = b"k%03d" % rng.randrange(300)
        ops.append(("put", k, os.urandom(rng.randrange(1, 120))) if r < 0.8 else ("del", k, None) if r < 0.95 else ("snap", None, None))
    schedule = [rng.choice(FAULTS) if rng.random() < 0.33 else "none" for _ in range(5000)]
    tmp = Path(tempfile.mkdtemp(prefix="sfaas-replica-"))
    try:
        _run_history(engine, ops, schedule, tmp)
    except BaseException:
        print(f"seed={seed}")
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fill(db: statestores.Store, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        db[b"key%05d" % i] = b"value%d" % i


def test_a_restarted_follower_resumes_and_a_restarted_shipper_sends_only_what_is_missing(tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open("lsm", tmp_path / "primary", remote=remote, **TINY["lsm"])
    shipper = Shipper(db)
    f = statestores.follow("lsm", tmp_path / "replica", LocalSource(shipper))
    _fill(db, 200)
    db.snapshot(1)
    db.settle()
    f.wait(seq=db.version()[0], snapshot_id=1)
    first = f.stats()
    f.close()
    _fill(db, 200, 200)  # written while the follower is down
    db.snapshot(2)
    db.settle()
    f = statestores.follow("lsm", tmp_path / "replica", LocalSource(shipper))
    f.wait(seq=db.version()[0], snapshot_id=2)
    assert f.stats()["bases"] == 0, "a follower of the same shipper resumes from its version, no base"
    f.close()
    shipper.close()
    shipper = Shipper(db)  # a new lineage: the follower gets a base, but no body it already has
    f = statestores.follow("lsm", tmp_path / "replica", LocalSource(shipper))
    db.snapshot(3)
    db.settle()
    f.wait(seq=db.version()[0], snapshot_id=3)
    stats = f.stats()
    assert stats["bases"] == 1
    assert stats["bytes_received"] < sum(len(b) for b in _immutable(db).values()) or not _immutable(db)
    store = f.promote(3)
    assert dict(store.items()) == dict(db.items())
    assert first["bytes_received"] > 0
    store.close()
    shipper.close()
    db.close()


def test_a_follower_behind_the_backlog_gets_a_base(tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open("hybridlog", tmp_path / "primary", remote=remote, **TINY["hybridlog"])
    shipper = Shipper(db, backlog=2)
    f = statestores.follow("hybridlog", tmp_path / "replica", LocalSource(shipper))
    _fill(db, 50)
    db.snapshot(1)
    db.settle()
    f.wait(seq=db.version()[0], snapshot_id=1)
    f.close()
    _fill(db, 400, 50)  # many edits: the backlog keeps 2
    db.snapshot(2)
    db.settle()
    f = statestores.follow("hybridlog", tmp_path / "replica", LocalSource(shipper))
    f.wait(seq=db.version()[0], snapshot_id=2)
    assert f.stats()["bases"] == 1
    store = f.promote(2)
    assert dict(store.items()) == dict(db.items())
    store.close()
    shipper.close()
    db.close()


@pytest.mark.parametrize("engine", ["lsm", "hybridlog"])
def test_a_live_only_follower_receives_the_live_files_not_the_newest_snapshots(tmp_path: Path, engine: str) -> None:
    """A replica to be promoted at a later snapshot (a partition moving in a rescale) asks
    for the live files only: after merges rewrote what snapshot 1 holds, it receives less
    than a replica that holds snapshot 1 too, and still becomes the store at snapshot 2."""
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open(engine, tmp_path / "primary", remote=remote, **TINY[engine])
    shipper = Shipper(db)
    _fill(db, 300)
    db.snapshot(1)
    _fill(db, 300, 150)  # overwrites half: merges replace what snapshot 1 holds
    db.settle()
    seq, live = db.version()
    live_bytes = sum(os.path.getsize(tmp_path / "primary" / e.name) for e in live if e.kind in SHIPPED_KINDS)
    full = statestores.follow(engine, tmp_path / "full", LocalSource(shipper))
    part = statestores.follow(engine, tmp_path / "part", LocalSource(shipper), live_only=True)
    for f in (full, part):
        f.wait(seq=seq)
    full.wait(snapshot_id=1)
    assert full.snapshots() == [1] and part.snapshots() == []
    assert part.stats()["bytes_received"] == live_bytes < full.stats()["bytes_received"]
    db.snapshot(2)
    db.settle()
    part.wait(snapshot_id=2)
    store = part.promote(2)
    assert dict(store.items()) == dict(db.items())
    store.close()
    full.close()
    shipper.close()
    db.close()


def test_promotion_errors_and_bad_directories(tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open("appendlog", tmp_path / "primary", remote=remote)
    shipper = Shipper(db)
    with pytest.raises(statestores.StoreError, match="holds a store, not a replica"):
        statestores.follow("appendlog", tmp_path / "primary2-is-primary" if False else db.directory + "-copy", LocalSource(shipper)) if False else statestores.follow(
            "appendlog", _store_dir(tmp_path), LocalSource(shipper)
        )
    with pytest.raises(ValueError, match="keep_marks"):
        statestores.follow("appendlog", tmp_path / "r0", LocalSource(shipper), keep_marks=0)
    with pytest.raises(TypeError, match="unknown option"):
        statestores.follow("appendlog", tmp_path / "r1", LocalSource(shipper), bogus=1)
    f = statestores.follow("appendlog", tmp_path / "replica", LocalSource(shipper))
    db[b"a"] = b"1"
    db.snapshot(7)
    db.settle()
    f.wait(snapshot_id=7)
    with pytest.raises(statestores.SnapshotNotFoundError, match=r"holds snapshots \[7\], not 8"):
        f.promote(8)
    store = f.promote(7)  # the failed promote left the replica usable
    assert dict(store.items()) == {b"a": b"1"}
    store.close()
    shipper.close()
    db.close()


def _store_dir(tmp_path: Path) -> Path:
    d = tmp_path / "a-store"
    statestores.open("appendlog", d).close()
    return d


_ATOM = st.one_of(st.integers(-(1 << 63), (1 << 64) - 1), st.text(max_size=5), st.booleans(), st.none(), st.binary(max_size=4))
_GARBAGE = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda tag, rest: wire.msgpack.packb([tag, *rest]),
        st.sampled_from(["hello", "edit", "mark", "ack", "tip", "nope"]),
        st.lists(st.one_of(_ATOM, st.lists(st.one_of(_ATOM, st.lists(_ATOM, max_size=7)), max_size=3)), max_size=6),
    ),
)


@settings(max_examples=500, deadline=None)
@given(_GARBAGE)
def test_decoding_garbage_raises_protocol_error_only(data: bytes) -> None:
    """Any bytes decode to a valid message or raise ProtocolError (nothing else escapes)."""
    try:
        msg = wire.decode(data)
    except ProtocolError:
        return
    assert wire.decode(wire.encode(msg)) == msg


@given(st.one_of(
    st.builds(Hello, st.text(min_size=1, max_size=10), st.integers(0, 1 << 40), st.integers(-1, 1 << 40),
              st.lists(st.sampled_from(["a.run", "b.hint"]), max_size=3).map(tuple), st.text(max_size=10),
              st.booleans()),
    st.builds(wire.Ack, st.integers(0, 1 << 40), st.integers(-1, 1 << 40)),
    st.builds(Tip, st.integers(0, 1 << 40), st.integers(-1, 1 << 40)),
))
def test_messages_round_trip(msg: Any) -> None:
    assert wire.decode(wire.encode(msg)) == msg


SECRET = b"test-cluster-secret"


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_tcp_follower_equals_the_primary_across_dropped_connections(engine: str, tmp_path: Path) -> None:
    """The tcp transport, with its connections cut at random moments and a window of one
    message: the follower resumes each time and ends byte-identical to the primary."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    servers: list[TcpServer] = []

    def source_for(shipper: Shipper) -> TcpSource:
        servers.append(TcpServer({shipper.name: shipper}, SECRET, window_bytes=1))
        return TcpSource(*servers[0].address, shipper.name, SECRET)

    def chaos() -> None:
        if rng.random() < 0.05:
            with servers[0]._lock:
                conns = list(servers[0]._conns)
            for c in conns:
                with contextlib.suppress(OSError):  # it may be closing already
                    c.shutdown(socket.SHUT_RDWR)

    ops = [("put", b"k%02d" % rng.randrange(40), os.urandom(rng.randrange(1, 90))) if rng.random() < 0.9 else ("snap", None, None)
           for _ in range(400)]
    try:
        follower = _run_history(engine, ops, [], tmp_path, source_for, chaos)
        assert follower.stats()["reconnects"] > 0, "the chaos never cut a connection: the test proved nothing"
    except BaseException:
        print(f"seed={seed}")
        raise
    finally:
        for s in servers:
            s.close()


def test_tcp_refuses_a_wrong_secret_and_an_unknown_store(tmp_path: Path) -> None:
    db = statestores.open("lsm", tmp_path / "primary")
    shipper = Shipper(db)
    with TcpServer({"primary": shipper}, SECRET) as server:
        bad = TcpSource(*server.address, "primary", b"not-the-secret")
        with pytest.raises(ConnectionError, match="handshake"):
            next(bad.open(Hello("primary", 0, -1)))
        assert server.refused == 1
        unknown = TcpSource(*server.address, "elsewhere", SECRET)
        with pytest.raises(ConnectionError):
            next(unknown.open(Hello("elsewhere", 0, -1)))
        f = statestores.follow("lsm", tmp_path / "replica", TcpSource(*server.address, "primary", SECRET))
        db[b"a"] = b"b"
        db.flush()
        db.settle()
        f.wait(seq=db.version()[0])
        f.close()
    with pytest.raises(ValueError, match="at least 8 bytes"):
        TcpSource("127.0.0.1", 1, "x", b"short")
    assert SECRET.decode() not in repr(TcpSource("127.0.0.1", 1, "x", SECRET))
    shipper.close()
    db.close()


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
    moved = {n: os.stat(stale / n).st_ino for n in inode if (stale / n).exists()}
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
            monkeypatch.setattr(lsm_engine.LSMStore, "_preopen", classmethod(lambda cls, fs, path, e: None))
        f = statestores.follow("lsm", tmp_path / name, LocalSource(shipper), **opts)
        f.wait(snapshot_id=1)
        opened.clear()
        monkeypatch.setattr(lsm_engine, "RunReader", Counting)
        monkeypatch.setattr(lsm_engine, "replay", counting_replay)
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
