"""The ``path`` and ``rdma`` replication transports: after any history on the primary,
with the follower or the sink restarted midway, the replica holds exactly the primary's
immutable files and promotes to the model's state."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import socket
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import remotes
import statestores
from statestores.replica import ReplicationError, Shipper, rdma
from statestores.replica import path as path_mod
from statestores.replica.path import PathSink, PathSource

from .engines import TINY
from .test_replica import SECRET, _immutable, _run_history, apply_op

HAS_RDMA = os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))


def _ops(rng: random.Random, n: int) -> list[tuple[str, Any, Any]]:
    out: list[tuple[str, Any, Any]] = []
    for _ in range(n):
        r = rng.random()
        k = b"k%02d" % rng.randrange(40)
        out.append(("put", k, rng.randbytes(rng.randrange(1, 90))) if r < 0.8 else ("del", k, None) if r < 0.9
                   else ("snap", None, None) if r < 0.95 else ("flush", None, None))
    return out


@pytest.fixture
def seed() -> Iterator[random.Random]:
    """A seeded generator; the seed is printed when the test fails (rerun with SFAAS_SEED)."""
    value = int(os.environ.get("SFAAS_SEED") or random.randrange(1 << 30))
    print(f"seed={value}")  # pytest shows captured output only for failing tests
    yield random.Random(value)


# ---------------------------------------------------------------------- path


class SlowPathSource(PathSource):
    """Copies some bodies late, so the sink runs ahead and must wait for slots."""

    def __init__(self, *args: Any, rng: random.Random) -> None:
        super().__init__(*args)
        self.rng = rng

    def _fetch(self, pub: Any, dests: dict[str, str] | None) -> None:
        if self.rng.random() < 0.3:
            time.sleep(0.005)
        super()._fetch(pub, dests)


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_path_follower_equals_the_primary_with_three_reused_slots(engine: str, tmp_path: Path, seed: random.Random) -> None:
    sinks: list[PathSink] = []

    def source_for(shipper: Shipper) -> PathSource:
        sinks.append(PathSink(shipper, tmp_path / "shared", slots=3))
        return SlowPathSource(tmp_path / "shared", shipper.name, rng=random.Random(seed.random()))

    try:
        follower = _run_history(engine, _ops(seed, 300), [], tmp_path, source_for)
        stats = follower.stats()
        assert stats["corrupt"] == 0, "a slot was rewritten before the follower copied it out"
        assert stats["reconnects"] == stats["gaps"] == 0, f"the stream broke without a fault: {follower.last_error}"
        assert sinks[0]._next - 1 > 3, "fewer messages than slots: no slot was reused"
        assert sorted(n for n in os.listdir(tmp_path / "shared") if n.startswith("slot-")) == ["slot-0000", "slot-0001", "slot-0002"]
    finally:
        for s in sinks:
            s.close()


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_path_sink_killed_and_restarted_on_the_same_directory_converges(engine: str, tmp_path: Path, seed: random.Random) -> None:
    """A new PathSink on the directory (same shipper) adopts the follower's stream where
    its ack stands; the follower never notices beyond duplicates."""
    sinks: list[PathSink] = []
    shippers: list[Shipper] = []

    def source_for(shipper: Shipper) -> PathSource:
        shippers.append(shipper)
        sinks.append(PathSink(shipper, tmp_path / "shared", slots=3))
        return PathSource(tmp_path / "shared", shipper.name)

    def chaos() -> None:
        if seed.random() < 0.06:
            sinks[-1].close()
            if seed.random() < 0.5:  # what a killed sink leaves: a half-written message
                (tmp_path / "shared" / "edits" / "00000000000000099999.msg.tmp").write_bytes(b"torn")
            sinks.append(PathSink(shippers[0], tmp_path / "shared", slots=3))

    try:
        follower = _run_history(engine, _ops(seed, 300), [], tmp_path, source_for, chaos)
        assert len(sinks) > 1, "the chaos never restarted the sink: the test proved nothing"
        assert follower.stats()["corrupt"] == 0, "a new sink rewrote a slot the follower had not copied out"
    finally:
        for s in sinks:
            s.close()


def _follow(engine: str, tmp: Path, store: str) -> Any:
    return statestores.follow(engine, tmp / "replica", PathSource(tmp / "shared", store), **TINY[engine])


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_path_follower_closed_reopened_and_restored_from_an_older_copy_converges(
        engine: str, tmp_path: Path, seed: random.Random) -> None:
    """The follower is closed and reopened (it resumes where its ack stands), then restored
    from an older copy of its directory (its hello no longer matches the ack: it asks for
    a new stream); both converge to the primary."""
    remote = remotes.PathRemote(tmp_path / "remote")
    db = statestores.open(engine, tmp_path / "primary", remote=remote, **TINY[engine])
    shipper = Shipper(db)
    sink = PathSink(shipper, tmp_path / "shared", slots=3)
    f = _follow(engine, tmp_path, shipper.name)
    model: dict[bytes, bytes] = {}
    snaps: dict[int, dict[bytes, bytes]] = {}
    try:
        for phase in range(3):
            for op, k, v in _ops(seed, seed.randrange(40, 120)):
                apply_op(db, op, k, v, model, snaps)
            f.close()
            if phase == 0:
                shutil.copytree(tmp_path / "replica", tmp_path / "older")
            elif phase == 1:  # a replica restored from a backup: older than its ack says
                shutil.rmtree(tmp_path / "replica")
                shutil.copytree(tmp_path / "older", tmp_path / "replica")
            f = _follow(engine, tmp_path, shipper.name)
        apply_op(db, "snap", None, None, model, snaps)
        sid = len(snaps)
        db.settle()
        f.wait(seq=db.version()[0], snapshot_id=sid, timeout=30)
        with f.hold() as (_seq, files):
            want = _immutable(db)
            assert {e.name for e in files} == set(want)
            for name, data in want.items():
                assert (tmp_path / "replica" / name).read_bytes() == data, f"{name} differs from the primary's"
        promoted = f.promote(sid)
        try:
            assert dict(promoted.items()) == model
        finally:
            promoted.close()
    finally:
        f.close()
        sink.close()
        shipper.close()
        db.close()


def test_a_sink_restarted_before_the_follower_read_its_new_stream_announces_what_was_published(tmp_path: Path) -> None:
    """The follower asked for a new stream and is waiting for it; the sink answering fills
    every slot and is killed before the follower read a message; the next sink must point
    the follower at those messages. (It once announced only its own next message: the
    follower waited for that, the sink for the slots the unread messages held — forever.)"""
    shared = tmp_path / "shared"
    shared.mkdir()
    db = statestores.open("lsm", tmp_path / "primary", **TINY["lsm"])
    shipper = Shipper(db)
    sinks: list[PathSink] = []
    # a directory whose ack is not this follower's state: its first open asks for a new
    # stream, finds no sink, and sleeps a poll (long: the sink's life and kill below fit in it)
    path_mod._write_ack(str(shared), path_mod._AckRec("an-older-stream", 4, 9, -1, "elsewhere"))
    source = WaitingPathSource(shared, shipper.name, poll=8.0)
    f = statestores.follow("lsm", tmp_path / "replica", source, **TINY["lsm"])
    try:
        assert source.waiting.wait(10), "the follower never asked for a new stream"
        epoch = path_mod._read_ack(str(shared)).epoch  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        sinks.append(PathSink(shipper, shared, slots=3))
        i = 0
        while len(sinks[0]._published) < 3:  # the sink answers, until every slot is taken
            assert time.monotonic() < deadline, f"the sink published {len(sinks[0]._published)} messages, not 3"
            _fill_lsm(db, i)
            i += 1
            time.sleep(0.02)
        assert sinks[0]._epoch == epoch and f.seq == 0, "the follower read the stream before the kill: no test"
        sinks[0].close()
        sinks.append(PathSink(shipper, shared, slots=3))
        source.poll = 0.03  # its next wake-up reads the stream; no need to dawdle after it
        db.settle()
        f.wait(seq=db.version()[0], timeout=20)
        assert f.stats()["gaps"] == 0
    finally:
        f.close()
        for s in sinks:
            s.close()
        shipper.close()
        db.close()


class WaitingPathSource(PathSource):
    """Tells when its follower asked for a new stream and found no sink answering yet."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting = threading.Event()

    def _tip(self, epoch: str, waiting: bool) -> Any:
        tip = super()._tip(epoch, waiting)
        if waiting and tip is None:
            self.waiting.set()
        return tip


def _fill_lsm(db: statestores.Store, i: int) -> None:
    for k in range(30):
        db[b"k%03d-%03d" % (i, k)] = b"v" * 40
    db.flush()


class CorruptingPathSource(PathSource):
    """Damages one fetched body now and then (a bad block on the shared mount): the
    follower's crc check rejects the message and asks the sink for a new stream."""

    def __init__(self, *args: Any, rng: random.Random) -> None:
        super().__init__(*args)
        self.rng = rng
        self.damaged = 0

    def _fetch(self, pub: Any, dests: dict[str, str] | None) -> None:
        super()._fetch(pub, dests)
        if dests and (not self.damaged or self.rng.random() < 0.08):  # the first for sure
            path = Path(next(iter(dests.values())))
            data = bytearray(path.read_bytes())
            if data:
                data[len(data) // 2] ^= 0xFF
                path.write_bytes(bytes(data))
                self.damaged += 1


@pytest.mark.parametrize("engine", ["lsm", "hybridlog"])
def test_path_follower_with_damaged_bodies_and_killed_sinks_converges(engine: str, tmp_path: Path, seed: random.Random) -> None:
    """Damaged bodies make the follower ask for new streams while sinks are killed and
    restarted on the directory: it still converges to the primary, byte for byte."""
    sinks: list[PathSink] = []
    shippers: list[Shipper] = []
    sources: list[CorruptingPathSource] = []

    def source_for(shipper: Shipper) -> PathSource:
        shippers.append(shipper)
        sinks.append(PathSink(shipper, tmp_path / "shared", slots=3))
        sources.append(CorruptingPathSource(tmp_path / "shared", shipper.name, rng=random.Random(seed.random())))
        return sources[0]

    def chaos() -> None:
        if seed.random() < 0.06:
            sinks[-1].close()
            sinks.append(PathSink(shippers[0], tmp_path / "shared", slots=3))

    try:
        follower = _run_history(engine, _ops(seed, 300), [], tmp_path, source_for, chaos)
        assert sources[0].damaged > 0 and len(sinks) > 1, "no body was damaged or no sink restarted: no test"
        assert follower.stats()["corrupt"] == sources[0].damaged
    finally:
        for s in sinks:
            s.close()


def test_path_sink_and_source_refuse_bad_arguments(tmp_path: Path) -> None:
    db = statestores.open("memonly", tmp_path / "primary")
    shipper = Shipper(db)
    try:
        with pytest.raises(ValueError, match="slots must be an int"):
            PathSink(shipper, tmp_path / "shared", slots=0)
        with PathSink(shipper, tmp_path / "shared", slots=2):
            with pytest.raises(ReplicationError, match="another PathSink"):
                PathSink(shipper, tmp_path / "shared")
        source = PathSource(tmp_path / "shared", "primary")
        with pytest.raises(ConnectionError, match="not 'elsewhere'"):
            next(source.open(statestores.replica.wire.Hello("elsewhere", 0, -1)))
    finally:
        shipper.close()
        db.close()


# ---------------------------------------------------------------------- rdma


@pytest.mark.skipif(HAS_RDMA, reason="this machine has an RDMA device")
def test_rdma_without_a_device_fails_at_construction_naming_the_device_and_tcp() -> None:
    for make in (lambda: rdma.RdmaServer({}, SECRET, port=0), lambda: rdma.RdmaSource("127.0.0.1", 1, "x", SECRET)):
        with pytest.raises(ReplicationError, match="RDMA device") as info:
            make()
        assert "tcp" in str(info.value) and "TcpServer/TcpSource" in str(info.value)


def test_rdma_with_a_device_but_no_pyverbs_names_pyverbs_and_tcp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ib" / "mlx5_0").mkdir(parents=True)
    monkeypatch.setattr(rdma, "SYSFS", str(tmp_path / "ib"))
    monkeypatch.setitem(sys.modules, "pyverbs", None)  # an import of it fails, installed or not
    monkeypatch.setitem(sys.modules, "pyverbs.device", None)
    with pytest.raises(ReplicationError, match="pyverbs cannot be imported.*python3-pyverbs.*tcp transport"):
        rdma.RdmaSource("127.0.0.1", 1, "x", SECRET)
    with pytest.raises(ReplicationError, match="no RDMA device named 'mlx5_9'.*found: mlx5_0.*tcp"):
        rdma.RdmaServer({}, SECRET, device="mlx5_9")


def _rdma_history(engine: str, tmp_path: Path, rng: random.Random, **source_options: Any) -> None:
    servers: list[rdma.RdmaServer] = []

    def source_for(shipper: Shipper) -> rdma.RdmaSource:
        servers.append(rdma.RdmaServer({shipper.name: shipper}, SECRET))
        return rdma.RdmaSource(*servers[0].address, shipper.name, SECRET, **source_options)

    def chaos() -> None:
        if rng.random() < 0.05:
            with servers[0]._lock:
                conns = list(servers[0]._conns)
            for c in conns:
                with contextlib.suppress(OSError):  # it may be ending already
                    c.shutdown(socket.SHUT_RDWR)

    try:
        follower = _run_history(engine, _ops(rng, 300), [], tmp_path, source_for, chaos)
        assert follower.stats()["reconnects"] > 0, "the chaos never cut a connection: the test proved nothing"
        assert follower.stats()["corrupt"] == 0, "a body was overwritten in the region before it was copied out"
    finally:
        for s in servers:
            s.close()


@pytest.mark.skipif(not HAS_RDMA, reason="needs an RDMA device (/sys/class/infiniband is empty); the rdma transport's data path cannot run here")
@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_rdma_follower_equals_the_primary_across_dropped_connections(engine: str, tmp_path: Path, seed: random.Random) -> None:
    _rdma_history(engine, tmp_path, seed)


def _fake_pyverbs() -> dict[str, types.ModuleType]:
    """Just enough of pyverbs for the rdma transport to run in one process: an RDMA WRITE
    copies between registered buffers (found by rkey) and completes on the sender's CQ."""
    keys = itertools.count(1)
    mrs: dict[int, Any] = {}
    qps: dict[int, Any] = {}
    E = types.SimpleNamespace(IBV_ACCESS_LOCAL_WRITE=1, IBV_ACCESS_REMOTE_WRITE=2, IBV_QPT_RC=2, IBV_WR_RDMA_WRITE=0,
                              IBV_SEND_SIGNALED=2, IBV_WC_SUCCESS=0)

    class Obj:
        def __init__(self, *args: Any, **kw: Any) -> None:
            self.__dict__.update(kw)
            self.args = args

        def close(self) -> None:
            mrs.pop(getattr(self, "rkey", -1), None)
            qps.pop(getattr(self, "qp_num", -1), None)

    class Context(Obj):
        def query_port(self, port: int) -> Any:
            return types.SimpleNamespace(lid=7, active_mtu=3)

        def query_gid(self, port: int, index: int) -> Any:
            return types.SimpleNamespace(gid="fe80:0000:0000:0000:0000:0000:0000:0001")

    class CQ(Obj):
        done: list[Any]

        def poll(self, n: int = 1) -> tuple[int, list[Any]]:
            out, self.done[:] = self.done[:n], self.done[n:]
            return len(out), out

    class MR(Obj):
        def __init__(self, pd: Any, length: int, access: int) -> None:
            self.data, self.access, self.buf = bytearray(length), access, next(keys) << 32
            self.lkey = self.rkey = next(keys)
            mrs[self.rkey] = self

        def write(self, data: bytes, length: int, offset: int = 0) -> None:
            self.data[offset:offset + length] = data[:length]

        def read(self, length: int, offset: int) -> bytes:
            return bytes(self.data[offset:offset + length])

    class QP(Obj):
        def __init__(self, pd: Any, init: Any, attr: Any) -> None:
            self.qp_num, self.cq = next(keys), init.scq
            self.peer: int | None = None
            qps[self.qp_num] = self

        def to_rts(self, attr: Any) -> None:
            self.peer = attr.dest_qp_num

        def post_send(self, wr: Any, bad: Any) -> None:
            peer = qps.get(self.peer) if self.peer is not None else None  # None: the follower closed it (a real HCA retries, then fails)
            assert self.peer is not None and (peer is None or peer.peer == self.qp_num), "wrote before both QPs were connected"
            (addr, length, lkey), = (s.args for s in wr.sg)
            local, remote = mrs[lkey], mrs.get(wr.rdma[0])
            at = wr.rdma[1] - remote.buf if remote else -1
            ok = peer and remote and remote.access & E.IBV_ACCESS_REMOTE_WRITE and 0 <= at <= len(remote.data) - length
            if ok and remote is not None:
                remote.data[at:at + length] = local.data[addr - local.buf:addr - local.buf + length]
            self.cq.done.append(types.SimpleNamespace(status=0 if ok else 10, wr_id=wr.wr_id))

    class SendWR(Obj):
        def set_wr_rdma(self, rkey: int, addr: int) -> None:
            self.rdma = (rkey, addr)

    def cq(*args: Any) -> CQ:
        return CQ(*args, done=[])

    names: dict[str, dict[str, Any]] = {"device": {"Context": Context}, "pd": {"PD": Obj}, "cq": {"CQ": cq}, "mr": {"MR": MR},
             "qp": {"QP": QP, "QPAttr": Obj, "QPCap": Obj, "QPInitAttr": Obj}, "wr": {"SGE": Obj, "SendWR": SendWR},
             "addr": {"GID": Obj, "GlobalRoute": Obj, "AHAttr": Obj}, "enums": vars(E),
             "pyverbs_error": {"PyverbsError": type("PyverbsError", (Exception,), {})}}
    mods = {"pyverbs": types.ModuleType("pyverbs")}
    for sub, attrs in names.items():
        mods[f"pyverbs.{sub}"] = m = types.ModuleType(f"pyverbs.{sub}")
        m.__dict__.update(attrs)
        setattr(mods["pyverbs"], sub, m)
    return mods


@pytest.mark.parametrize("engine", statestores.ENGINES)
def test_rdma_protocol_over_simulated_verbs_equals_the_primary(engine: str, tmp_path: Path, seed: random.Random,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The control protocol, credits and chunking of the rdma transport, with pyverbs
    simulated in-process and a 64-byte region: bodies span many chunks and credits."""
    (tmp_path / "ib" / "fake0").mkdir(parents=True)
    monkeypatch.setattr(rdma, "SYSFS", str(tmp_path / "ib"))
    for name, module in _fake_pyverbs().items():
        monkeypatch.setitem(sys.modules, name, module)
    _rdma_history(engine, tmp_path, seed, region_bytes=64)
