"""The lsm engine against a dict: tiny thresholds so flushes and background merges happen
every few operations; reopen, crash at every file-system call, snapshots, corruption."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import remotes
import statestores
from statestores.errors import CorruptionError, RemoteError
from statestores.lsm import LSMStore
from statestores.testing import FaultyFS, InjectedFault

from .test_crash import apply as _apply

TINY: dict[str, Any] = {"memtable_bytes": 400, "max_runs_per_level": 2, "density_factor": 2, "block_bytes": 64}


def settle(store: LSMStore, *, dead: bool = False) -> None:
    """Wait until no background flush or merge is in flight.

    For a crashed store (``dead``) only wait for the background jobs to stop writing
    their ``.tmp`` files; installing them fails on the dead file system.
    """
    if not dead:
        store.settle()
        return
    futs = [imm.future for imm in store._imms]
    if store._merges.job is not None:
        futs.append(store._merges.job[0])
    concurrent.futures.wait(futs, timeout=30)
    time.sleep(0.05)


def run_files(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".run"))


# ---------------------------------------------------------------- basics


def test_options_are_validated_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_runs_per_level"):
        statestores.open("lsm", tmp_path, max_runs_per_level=1)
    with pytest.raises(ValueError, match="bloom_fpr"):
        statestores.open("lsm", tmp_path, bloom_fpr=1.0)
    with pytest.raises(TypeError, match="memtable_bytes"):
        statestores.open("lsm", tmp_path, memtable_bytes="big")
    with pytest.raises(TypeError, match="memtable_size"):
        statestores.open("lsm", tmp_path, memtable_size=10)


def test_merges_run_and_tombstones_never_resurrect(tmp_path: Path) -> None:
    model: dict[bytes, bytes] = {}
    with statestores.open("lsm", tmp_path, **TINY) as s:
        for rnd in range(6):
            for i in range(150):
                k = b"k%04d" % ((i * 7 + rnd) % 200)
                if (i + rnd) % 4 == 0:
                    s.delete(k)
                    model.pop(k, None)
                else:
                    v = b"r%d-%d" % (rnd, i)
                    s.put(k, v)
                    model[k] = v
            settle(s)
        st_ = s.stats()
        assert st_["merges_done"] > 0 and st_["flushes"] > 10
        assert len(st_["runs_per_level"]) >= 2  # data really moved down the levels
        assert dict(s.items()) == model
        assert [k for k, _ in s.items()] == sorted(model)
        for i in range(200):
            k = b"k%04d" % i
            assert s.get(k) == model.get(k)
            assert (k in s) == (k in model)
    with statestores.open("lsm", tmp_path, **TINY) as s:
        assert dict(s.items()) == model
        assert all(s.get(k) == v for k, v in model.items())


def test_clean_close_leaves_no_wal_to_replay(tmp_path: Path) -> None:
    with statestores.open("lsm", tmp_path) as s:
        for i in range(100):
            s.put(b"%03d" % i, b"v")
    with statestores.open("lsm", tmp_path) as s:
        assert s.stats()["memtable_keys"] == 0
        assert s.get(b"050") == b"v"
        assert len(run_files(tmp_path)) == 1


def test_sync_none_keeps_writes_until_close(tmp_path: Path) -> None:
    with statestores.open("lsm", tmp_path, sync="none") as s:
        s.put(b"a", b"1")
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".wal")]
    with statestores.open("lsm", tmp_path, sync="fsync") as s:
        assert s[b"a"] == b"1"
        s.put(b"b", b"2")
        s.write_batch([(b"a", None), (b"c", b"3")])
    with statestores.open("lsm", tmp_path) as s:
        assert dict(s.items()) == {b"b": b"2", b"c": b"3"}


def test_stats_describe_memory_disk_and_levels(tmp_path: Path) -> None:
    with statestores.open("lsm", tmp_path, memtable_bytes=2000) as s:
        for i in range(200):
            s.put(b"key%05d" % i, b"x" * 50)
        settle(s)  # flushes run in the background; count them once they have landed
        st_ = s.stats()
    for field in ("memory_bytes", "disk_bytes", "runs_per_level", "files_per_level", "flushes", "merges_done", "merges_running", "memtable_keys"):
        assert field in st_
    assert st_["flushes"] >= 5 and st_["disk_bytes"] > 200 * 50
    assert st_["memory_bytes"] > 0


# ---------------------------------------------------------------- corruption


def test_damaged_block_raises_and_restore_repairs(tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    db = tmp_path / "db"
    model = {b"key%04d" % i: b"value%04d" % i for i in range(300)}
    with statestores.open("lsm", db, remote=remote) as s:
        for k, v in model.items():
            s.put(k, v)
        s.flush()
        s.snapshot(1)
    (run,) = run_files(db)
    raw = bytearray((db / run).read_bytes())
    raw[20] ^= 0xFF  # inside the first data block
    (db / run).write_bytes(bytes(raw))
    with statestores.open("lsm", db, remote=remote) as s:
        with pytest.raises(CorruptionError, match=run):
            s.get(b"key0000")
        with pytest.raises(CorruptionError, match=run):
            dict(s.items())
        info = s.restore()
        assert info.files_downloaded == 1
        assert dict(s.items()) == model


def test_damaged_current_or_footer_fails_open(tmp_path: Path) -> None:
    with statestores.open("lsm", tmp_path) as s:
        s.put(b"a", b"1")
    (run,) = run_files(tmp_path)
    raw = bytearray((tmp_path / run).read_bytes())
    raw[-3] ^= 1
    (tmp_path / run).write_bytes(bytes(raw))
    with pytest.raises(CorruptionError, match=run):
        statestores.open("lsm", tmp_path)


# ---------------------------------------------------------------- snapshots


def test_snapshot_seals_the_wal_and_uploads_only_new_bytes(tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open("lsm", tmp_path / "db", remote=remote, memtable_bytes=64 << 10) as s:
        for i in range(3000):
            s.put(b"key%06d" % i, b"v" * 100)
        settle(s)
        first = s.snapshot(1)
        assert first.bytes_uploaded >= 3000 * 100
        # the last flush may have started a merge; let it finish and take it into a baseline,
        # so the next snapshot measures the update alone (a merge's output is new bytes)
        settle(s)
        s.snapshot(2)
        for i in range(30):  # 1% update
            s.put(b"key%06d" % (i * 100), b"w" * 100)
        fut = s.snapshot_async(3)
        s.put(b"after", b"not in 3")  # writes go on during the upload
        second = fut.result()
        assert second.files_uploaded == 1  # just the sealed WAL
        assert second.bytes_uploaded < 0.05 * first.bytes_total
        s.restore(3)
        assert s.get(b"after") is None
        assert s.get(b"key000000") == b"w" * 100
        assert s.get(b"key000001") == b"v" * 100
    with statestores.open("lsm", tmp_path / "fresh", remote=remote) as s:
        assert s.get(b"key000100") == b"w" * 100
        assert len(dict(s.items())) == 3000


def test_merge_inputs_survive_until_upload_is_done(tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open("lsm", tmp_path / "db", remote=remote, **TINY) as s:
        for i in range(300):
            s.put(b"k%04d" % i, b"v%d" % i)
        fut = s.snapshot_async(1)
        for i in range(300):  # flushes and merges while the upload runs
            s.put(b"k%04d" % i, b"w%d" % i)
        fut.result()
        settle(s)
        s.restore(1)
        assert dict(s.items()) == {b"k%04d" % i: b"v%d" % i for i in range(300)}


# ---------------------------------------------------------------- crashes


def _history() -> list[tuple[str, Any]]:
    h: list[tuple[str, Any]] = []
    for i in range(36):
        k = b"k%02d" % (i * 5 % 13)
        if i % 9 == 4:
            h.append(("batch", [(k, b"b%d" % i), (b"k%02d" % (i % 7), None), (b"z%d" % i, b"" )]))
        elif i % 5 == 3:
            h.append(("delete", k))
        elif i == 20:
            h.append(("snapshot", 1))
        else:
            h.append(("put", (k, b"v%d-" % i + b"x" * 30)))
    return h



def _run(s: statestores.Store, op: tuple[str, Any]) -> None:
    kind, arg = op
    if kind == "put":
        s.put(*arg)
    elif kind == "delete":
        s.delete(arg)
    elif kind == "batch":
        s.write_batch(arg)
    else:
        s.snapshot(arg)


@pytest.mark.parametrize("torn", [True, False])
def test_crash_at_every_file_system_call(tmp_path: Path, torn: bool) -> None:
    history = _history()
    states = [{}]
    for op in history:
        m = dict(states[-1])
        _apply(m, op)
        states.append(m)
    probe = FaultyFS()
    with LSMStore(tmp_path / "probe", fs=probe, remote=remotes.PathRemote(tmp_path / "r0"), **TINY) as s:
        for op in history:
            _run(s, op)
    total = probe.calls
    assert total > 50
    for fail_at in range(1, total + 1, 1 if torn else 3):
        d = tmp_path / f"c{fail_at}"
        fs = FaultyFS(fail_at, torn=torn, seed=fail_at)
        acked = 0
        store = None
        try:
            store = LSMStore(d, fs=fs, remote=remotes.PathRemote(tmp_path / f"r{fail_at}"), **TINY)
            for op in history:
                _run(store, op)
                acked += 1
            store.close()
        except (InjectedFault, RemoteError):  # a fault mid-upload surfaces as RemoteError
            pass
        if store is not None:
            settle(store, dead=True)
        with LSMStore(d, **TINY) as s:
            got = dict(s.items())
            assert got in (states[acked], states[min(acked + 1, len(history))]), f"fail_at={fail_at} acked={acked}"
            for k in (b"k%02d" % i for i in range(13)):
                assert s.get(k) == got.get(k)
            s.put(b"after-crash", b"1")
        with LSMStore(d, **TINY) as s:
            assert s.get(b"after-crash") == b"1"
        leftovers = [n for n in os.listdir(d) if n.endswith(".tmp")]
        assert not leftovers, leftovers


# ---------------------------------------------------------------- model-based


class LSMMachine(RuleBasedStateMachine):
    """Drive one lsm store (tiny thresholds) and a dict through the same history."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.tmp = Path(tempfile.mkdtemp(prefix="lsm-model-"))
        self.remote = remotes.PathRemote(self.tmp / "remote")
        self.model: dict[bytes, bytes] = {}
        self.snaps: dict[int, dict[bytes, bytes]] = {}
        self.next_id = 1
        self.fs = FaultyFS()
        self.store: LSMStore | None = None

    @initialize(
        opts=st.sampled_from(
            [
                TINY,
                {**TINY, "max_runs_per_level": 3, "density_factor": 5},
                {**TINY, "cache_bytes": 0},  # every lookup searches the raw block
                {"memtable_bytes": 1500, "cache_bytes": 2000},
            ]
        )
    )
    def open_store(self, opts: dict[str, Any]) -> None:
        self.opts = opts
        self.store = LSMStore(self.tmp / "db", fs=self.fs, remote=self.remote, **opts)

    keys = st.sampled_from([b"a", b"b", b"c", b"key-%d" % 1, b"key-%d" % 2, b"\x00", b"\xff" * 3, b"long" * 20])
    values = st.binary(max_size=40)

    @rule(k=keys, v=values)
    def put(self, k: bytes, v: bytes) -> None:
        assert self.store is not None
        self.store.put(k, v)
        self.model[k] = v

    @rule(k=keys)
    def delete(self, k: bytes) -> None:
        assert self.store is not None
        self.store.delete(k)
        self.model.pop(k, None)

    @rule(ops=st.lists(st.tuples(keys, st.one_of(st.none(), values)), max_size=5))
    def batch(self, ops: list[tuple[bytes, bytes | None]]) -> None:
        assert self.store is not None
        self.store.write_batch(ops)
        for k, v in ops:
            if v is None:
                self.model.pop(k, None)
            else:
                self.model[k] = v

    @rule(n=st.integers(1, 30))
    def many(self, n: int) -> None:
        assert self.store is not None
        for i in range(n):
            k = b"bulk-%d" % (i % 11)
            self.store.put(k, b"%d" % i)
            self.model[k] = b"%d" % i

    @rule()
    def flush(self) -> None:
        assert self.store is not None
        self.store.flush()

    @rule()
    def reopen(self) -> None:
        assert self.store is not None
        self.store.close()
        self.fs = FaultyFS()
        self.store = LSMStore(self.tmp / "db", fs=self.fs, remote=self.remote, **self.opts)

    @rule()
    def crash_reopen(self) -> None:
        assert self.store is not None
        self.fs.crash()  # kill -9 between two calls: sync="os" loses nothing
        settle(self.store, dead=True)
        self.fs = FaultyFS()
        self.store = LSMStore(self.tmp / "db", fs=self.fs, remote=self.remote, **self.opts)

    @rule()
    def snapshot(self) -> None:
        assert self.store is not None
        self.store.snapshot(self.next_id)
        self.snaps[self.next_id] = dict(self.model)
        self.next_id += 1

    @precondition(lambda self: bool(self.snaps))
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        assert self.store is not None
        sid = data.draw(st.sampled_from(sorted(self.snaps)))
        self.store.restore(sid)
        self.model = dict(self.snaps[sid])

    @invariant()
    def agrees(self) -> None:
        if self.store is None:
            return
        for k in [b"a", b"c", b"key-1", b"\xff" * 3, b"long" * 20, b"bulk-3", b"missing"]:
            assert self.store.get(k) == self.model.get(k), k
        assert list(self.store.items()) == sorted(self.model.items())

    def teardown(self) -> None:
        if self.store is not None:
            try:
                self.store.close()
            except InjectedFault:
                pass
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


TestLSMModel = LSMMachine.TestCase
TestLSMModel.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# ---------------------------------------------------------------- background failures


@pytest.mark.parametrize("failure", ["died", "busy"])
def test_flushes_fall_back_to_the_foreground_when_the_pool_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """Flush jobs whose process dies (their futures fail) or a flush lane that refuses
    work (submit raises): the memtable is flushed in the foreground, nothing is lost."""
    from statestores import background
    from statestores.errors import BackgroundBusy, BackgroundDied

    real_submit = background.submit
    flushes = []

    def submit(fn: Any, *args: Any, lane: str = "merge", local: bool = False) -> concurrent.futures.Future[Any]:
        if lane != "flush":
            return real_submit(fn, *args, lane=lane, local=local)
        flushes.append(args[0])
        if failure == "busy":
            raise BackgroundBusy("injected: the flush lane is full")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_exception(BackgroundDied("injected: background flush process died (exit code -9)"))
        return fut

    monkeypatch.setattr(background, "submit", submit)
    model = {}
    with statestores.open("lsm", tmp_path, memtable_bytes=2000, max_runs_per_level=3) as s:
        for i in range(400):
            k, v = b"k%03d" % (i % 150), b"v%d" % i
            s.put(k, v)
            model[k] = v
        settle(s)
        assert s.stats()["flushes"] > 5
        assert len(flushes) > 5  # every flush went to the (broken) lane first
        assert dict(s.items()) == model
    with statestores.open("lsm", tmp_path) as s:
        assert dict(s.items()) == model


# ---------------------------------------------------------------- a real kill -9

_CHILD = r"""
import sys
import statestores
s = statestores.open("lsm", sys.argv[1], memtable_bytes=3000, max_runs_per_level=2, density_factor=4)
i = 0
while True:
    s.put(b"key-%06d" % i, b"value-%06d" % i)
    if i % 7 == 6:
        s.delete(b"key-%06d" % (i - 3))
    if i % 50 == 49:
        s.write_batch([(b"batch-%06d" % i, b"b"), (b"key-%06d" % (i - 10), None)])
    sys.stdout.write("%d\n" % i)
    sys.stdout.flush()
    i += 1
"""


def _states_after(start_iteration: int, iterations: int) -> Iterator[tuple[int, dict[bytes, bytes]]]:
    """``(iteration, state)`` after every atomic op of ``_CHILD``'s loop (put, delete,
    batch) from ``start_iteration`` on; an iteration is complete once its last op is."""
    m: dict[bytes, bytes] = {}
    for i in range(iterations):
        ops: list[list[tuple[bytes, bytes | None]]] = [[(b"key-%06d" % i, b"value-%06d" % i)]]
        if i % 7 == 6:
            ops.append([(b"key-%06d" % (i - 3), None)])
        if i % 50 == 49:
            ops.append([(b"batch-%06d" % i, b"b"), (b"key-%06d" % (i - 10), None)])
        for batch in ops:
            for k, v in batch:
                if v is None:
                    m.pop(k, None)
                else:
                    m[k] = v
            if i >= start_iteration:
                yield i, m


def test_kill_9_during_writes_flushes_and_merges(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True)
    assert proc.stdout is not None
    acked = -1
    for line in proc.stdout:
        acked = int(line)
        if acked >= 1500:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.2)  # the orphaned pool workers notice their parent is gone
    with statestores.open("lsm", tmp_path) as s:
        got = dict(s.items())
    # the state after some op at or after the last acknowledged iteration (the child may
    # have run ahead of what we read): every acknowledged write, no torn batch, no
    # resurrected delete
    matches = [i for i, state in _states_after(acked, acked + 20_000) if state == got]
    assert matches, f"state after kill -9 matches no prefix of the history (acked {acked})"


def test_a_snapshot_without_a_wal_hands_the_memtable_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``sync="none"`` there is no WAL to seal: the freeze hands the memtable to the
    background flush (as a full one is) and names the run being written — it writes no
    run itself — and each snapshot restores elsewhere to the state at its freeze."""
    from statestores.lsm import writes

    foreground: list[str] = []
    real = writes.write_run

    def recording(fs: Any, path: str, *a: Any, **kw: Any) -> Any:
        foreground.append(path)
        return real(fs, path, *a, **kw)

    monkeypatch.setattr(writes, "write_run", recording)
    remote = remotes.PathRemote(tmp_path / "remote")
    states = {}
    model: dict[bytes, bytes] = {}
    with statestores.open("lsm", tmp_path / "db", remote=remote, sync="none") as s:
        for r in range(1, 5):
            for i in range(r, 2000, r + 1):
                s.put(b"k%05d" % i, b"r%d" % r)
                model[b"k%05d" % i] = b"r%d" % r
            s.delete(b"k%05d" % (r * 3))
            model.pop(b"k%05d" % (r * 3), None)
            fut = s.snapshot_async(r)
            s.put(b"k00000", b"after the freeze")  # not part of snapshot r
            states[r] = dict(model)
            model[b"k00000"] = b"after the freeze"
            fut.result(timeout=60)
        assert foreground == []
    for r in (1, 4):
        with statestores.open("lsm", tmp_path / f"restored{r}", remote=remote) as x:
            x.restore(r)
            assert dict(x.items()) == states[r]


def test_a_restore_does_not_wait_for_a_merge_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 50M keys a merge runs for tens of seconds, and a recovery's restore waited for
    it. Now the restore drops the merge's result: it returns while the merge still runs,
    the merge's output is deleted when it ends, and nothing of it reaches the store."""
    import threading

    from statestores import background
    from statestores.lsm import merge as merge_mod

    monkeypatch.setattr(background, "mode", lambda: "thread")
    gate = threading.Event()
    merged = threading.Event()
    real = merge_mod.merge_runs

    def held(*a: Any, **k: Any) -> Any:
        gate.wait(60)
        try:
            return real(*a, **k)
        finally:
            merged.set()

    monkeypatch.setattr(merge_mod, "merge_runs", held)
    db = LSMStore(tmp_path / "db", remote=remotes.PathRemote(tmp_path / "remote"), **TINY)
    try:
        for i in range(40):
            db.put(b"k%03d" % i, b"v%d" % i)
        db.flush()
        db.snapshot(1)
        want = dict(db.items())
        i = 0
        while db._merges.job is None and i < 5000:  # write until a merge is in flight (held)
            db.put(b"x%05d" % i, b"w" * 20)
            i += 1
        assert db._merges.job is not None
        held_merge, name = db._merges.job[0], db._merges.job[3]
        info = db.restore(1)
        assert not merged.is_set(), "the restore waited for the merge in flight"
        assert not gate.is_set() and info.files_downloaded == 0
        assert dict(db.items()) == want
    finally:
        gate.set()
    held_merge.result(timeout=60)  # the abandoned merge ran to its end (its output unused)
    deadline = time.monotonic() + 30
    while os.path.exists(tmp_path / "db" / (name + ".tmp")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(tmp_path / "db" / (name + ".tmp")), "the abandoned merge's output stayed"
    db.settle()
    assert dict(db.items()) == want and not (tmp_path / "db" / name).exists()
    db.put(b"after", b"1")
    db.close()
    with LSMStore(tmp_path / "db", **TINY) as again:
        assert dict(again.items()) == {**want, b"after": b"1"}
