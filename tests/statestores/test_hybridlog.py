"""The hybridlog engine on its own: in-place updates, the read-only boundary, flushes,
the optional WAL, crashes, snapshots."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import remotes
import statestores
from statestores.log.store import MAX_HANDOFFS
from statestores.testing import FaultyFS

from .test_appendlog import (
    apply_all,
    check_small_update_uploads_little,
    check_snapshot_files_bounded,
    crash_everywhere,
    inline_merges,
    lazy_index,
    machine,
    random_ops,
    run_machine,
    snapshot_round,
)

__all__ = ["inline_merges", "lazy_index"]  # fixtures, re-exported for pytest

TINY: dict[str, Any] = {"ro_lag_interval": 3, "flush_interval": 5, "max_runs_per_level": 2}


def test_hot_keys_are_updated_in_place(tmp_path: Path) -> None:
    with statestores.open("hybridlog", tmp_path, ro_lag_interval=4, flush_interval=4) as s:
        for i in range(1000):
            s.put(b"hot%d" % (i % 3), b"%d" % i)
        st = s.stats()
        assert st["mutable_records"] == 3 and st["boundary_advances"] == 0 and st["segments"] == 0
        assert st["tail_appends"] == 3  # the other 997 puts were in-place updates
        assert [s.get(b"hot%d" % j) for j in range(3)] == [b"999", b"997", b"998"]


def test_the_boundary_advances_and_read_only_records_are_flushed(tmp_path: Path) -> None:
    with statestores.open("hybridlog", tmp_path, ro_lag_interval=4, flush_interval=8) as s:
        for i in range(4):
            s.put(b"k%d" % i, b"a")
        s.put(b"k4", b"b")  # a new key with a full mutable region: the region turns read-only
        st = s.stats()
        assert (st["mutable_records"], st["read_only_records"], st["segments"]) == (1, 4, 0)
        s.put(b"k0", b"c")  # k0 is read-only: the update is appended to the tail
        assert s.get(b"k0") == b"c" and s.stats()["read_only_records"] == 4
        for i in range(5, 12):
            s.put(b"k%d" % i, b"d")
        assert s.get(b"k1") == b"a"  # readable while its region is being written
        s.settle()  # the read-only region is written by the store's maintainer thread
        st = s.stats()
        assert st["segments"] == 1 and st["flushes"] == 1 and st["read_only_records"] == 0
        assert s.get(b"k1") == b"a" and s.get(b"k0") == b"c" and s.get(b"k11") == b"d"


def test_regions_are_written_in_the_background_process(tmp_path: Path, monkeypatch) -> None:
    """A handed-off region (and a snapshot's freeze) becomes its log file in the ``flush``
    background process: encoding every record never holds the serving process's GIL."""
    from statestores import background
    from statestores.log import sealed as log_sealed

    if background.mode() != "process":
        pytest.skip("background mode 'thread' (SFAAS_BACKGROUND, set_mode) runs background work in this process")
    lanes: list[tuple[str, str]] = []
    real_submit = background.submit

    def recording_submit(fn, *args, lane="merge", local=False):  # type: ignore[no-untyped-def]
        lanes.append((fn.__name__, lane))
        return real_submit(fn, *args, lane=lane, local=local)

    monkeypatch.setattr(log_sealed.background, "submit", recording_submit)
    with statestores.open("hybridlog", tmp_path, ro_lag_interval=4, flush_interval=8) as s:
        for i in range(12):
            s.put(b"k%d" % i, b"v%d" % i)
        s.settle()
        assert s.stats()["segments"] >= 1
        assert ("write_segment", "flush") in lanes
    with statestores.open("hybridlog", tmp_path) as s:  # what the background wrote reads back
        assert [s.get(b"k%d" % i) for i in range(12)] == [b"v%d" % i for i in range(12)]


def test_regions_and_log_files_agree_with_a_dict(tmp_path: Path, inline_merges: None) -> None:
    model: dict[bytes, bytes] = {}
    with statestores.open("hybridlog", tmp_path, **TINY) as s:
        apply_all(s, random_ops(5, 3000), model)
        st = s.stats()
        assert st["flushes"] > 50 and st["merges_done"] > 10 and st["keys"] == len(model)
        assert dict(s.items()) == model
    with statestores.open("hybridlog", tmp_path, **TINY) as s:
        assert dict(s.items()) == model


def test_sync_none_crash_keeps_exactly_the_last_flush(tmp_path: Path) -> None:
    fs = FaultyFS()
    s = statestores.open("hybridlog", tmp_path, fs=fs)
    s.put(b"a", b"1")
    s.write_batch([(b"b", b"2"), (b"c", b"3")])
    s.flush()
    s.put(b"a", b"changed")
    s.delete(b"b")
    assert s.get(b"a") == b"changed" and s.get(b"b") is None
    fs.crash()
    with statestores.open("hybridlog", tmp_path) as r:
        assert dict(r.items()) == {b"a": b"1", b"b": b"2", b"c": b"3"}


def test_sync_os_replays_the_wal_and_truncates_a_torn_tail(tmp_path: Path) -> None:
    fs = FaultyFS()
    s = statestores.open("hybridlog", tmp_path, sync="os", ro_lag_interval=2, flush_interval=100, fs=fs)
    s.put(b"a", b"1")
    s.put(b"b", b"2")
    s.put(b"c", b"3")  # advance: a, b read-only (older WAL), c mutable (active WAL)
    s.write_batch([(b"a", None), (b"d", b"4")])
    wals = s.stats()["wals"]
    assert len(wals) == 2
    fs.crash()
    with open(tmp_path / wals[-1], "ab") as f:
        f.write(b"\x07torn record")
    with statestores.open("hybridlog", tmp_path, sync="os") as r:
        assert dict(r.items()) == {b"b": b"2", b"c": b"3", b"d": b"4"}


def test_wal_of_a_sync_os_run_becomes_a_log_file_under_sync_none(tmp_path: Path) -> None:
    """Opened under sync="none", the WALs stay sealed in the version (as a restore leaves a
    snapshot's tails: a store opened at a snapshot must not lose its files) and are never
    appended to; the flush at close makes them a log file."""
    fs = FaultyFS()
    s = statestores.open("hybridlog", tmp_path, sync="os", fs=fs)
    s.put(b"a", b"1")
    fs.crash()
    [wal] = [p.name for p in tmp_path.glob("*.wal")]
    size = (tmp_path / wal).stat().st_size
    with statestores.open("hybridlog", tmp_path) as r:
        assert r.get(b"a") == b"1"
        r.put(b"b", b"2")
        assert r.stats()["wals"] == [wal] and (tmp_path / wal).stat().st_size == size
    with statestores.open("hybridlog", tmp_path) as r:
        assert dict(r.items()) == {b"a": b"1", b"b": b"2"}
        assert r.stats()["wals"] == [] and r.stats()["segments"] == 1
    assert not list(tmp_path.glob("*.wal"))


def wal_bytes(directory: Path) -> int:
    """Bytes of the WAL files in ``directory`` (one the maintainer deletes meanwhile counts 0)."""
    total = 0
    for p in directory.glob("*.wal"):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


@pytest.mark.parametrize("how", ["put", "write_batch", "delete"])
def test_hot_keys_updated_in_place_do_not_grow_the_wal_without_bound(tmp_path: Path, how: str) -> None:
    """With a WAL and no snapshots, five hot keys updated in place 4,000 times never
    advance the boundary; once the active WAL holds ``max_wal_bytes`` both regions are
    flushed and a new WAL starts, so the WALs stay within a few times that size, and a crash then a
    reopen gives the last value of every key."""
    fs = FaultyFS()
    s = statestores.open("hybridlog", tmp_path, sync="os", max_wal_bytes=4096, fs=fs)
    model: dict[bytes, bytes] = {}
    largest = 0
    for i in range(4000):
        key, value = b"hot%d" % (i % 5), b"v%06d" % i
        if how == "put":
            s.put(key, value)
        elif how == "write_batch":
            s.write_batch([(key, value)])
        elif i % 7 == 0:
            s.delete(key)
        else:
            s.put(key, value)
        if how == "delete" and i % 7 == 0:
            model.pop(key, None)
        else:
            model[key] = value
        largest = max(largest, wal_bytes(tmp_path))
    assert s.stats()["flushes"] >= 10
    # the active WAL, and those of the regions still being written (at most MAX_HANDOFFS);
    # before the bound: 4,000 records of ~20 bytes, 80 KB in one WAL
    assert largest <= (MAX_HANDOFFS + 1) * (4096 + 32), largest
    fs.crash()
    with statestores.open("hybridlog", tmp_path, sync="os") as r:
        assert dict(r.items()) == model


def test_deletes_of_keys_never_flushed_leave_no_tombstone_on_disk(tmp_path: Path) -> None:
    with statestores.open("hybridlog", tmp_path) as s:
        s.put(b"old", b"1")
        s.flush()
        s.put(b"young", b"2")
        s.delete(b"young")
        s.delete(b"old")
        s.delete(b"never")
        s.flush()
    data = b"".join(p.read_bytes() for p in tmp_path.glob("*.log"))
    assert b"young" not in data and b"never" not in data
    assert data.count(b"old") == 2  # the value and its tombstone
    with statestores.open("hybridlog", tmp_path) as s:
        assert dict(s.items()) == {}


def test_a_small_update_uploads_a_small_file(tmp_path: Path) -> None:
    check_small_update_uploads_little("hybridlog", tmp_path)


def test_corrupt_value_in_a_log_file_is_reported_not_returned(tmp_path: Path) -> None:
    with statestores.open("hybridlog", tmp_path) as s:
        for i in range(100):
            s.put(b"key%03d" % i, b"value-%03d" % i)
    (seg,) = tmp_path.glob("*.log")
    data = bytearray(seg.read_bytes())
    data[data.index(b"value-042") + 6] ^= 0x10
    seg.write_bytes(bytes(data))
    with statestores.open("hybridlog", tmp_path) as s:
        assert s.get(b"key041") == b"value-041"
        with pytest.raises(statestores.CorruptionError, match=seg.name):
            s.get(b"key042")


@pytest.mark.parametrize("sync", ["os", "none"])
def test_crash_at_every_call_with_merges(tmp_path: Path, inline_merges: None, sync: str) -> None:
    for run in crash_everywhere("hybridlog", dict(TINY, sync=sync), random_ops(9, 50, nkeys=8), tmp_path):
        if sync == "os":  # every acknowledged write, plus possibly the one in flight
            assert run.got in (run.acknowledged, run.with_in_flight), f"crash at call {run.fail_at}"
        else:  # some prefix of the writes: nothing torn, nothing resurrected
            assert run.got in run.prefixes + [run.with_in_flight], f"crash at call {run.fail_at}"


def test_bad_options_are_named(tmp_path: Path) -> None:
    for name in ("ro_lag_interval", "flush_interval", "max_snapshot_wals", "max_wal_bytes"):
        with pytest.raises(ValueError, match=name):
            statestores.open("hybridlog", tmp_path, **{name: 0})


@pytest.mark.parametrize("sync", ["none", "os"])
def test_snapshot_rounds_seal_one_small_file_and_start_no_flush(tmp_path: Path, sync: str) -> None:
    """After the first snapshot, a round seals the records written since the last one in
    one small file (without a WAL: a tail it writes; with one: the active WAL) and
    starts no flush and no merge; a restore elsewhere after any round is that state."""
    remote = remotes.PathRemote(tmp_path / "remote")
    model: dict[bytes, bytes] = {}
    states: dict[int, dict[bytes, bytes]] = {}
    with statestores.open("hybridlog", tmp_path / "db", remote=remote, sync=sync, max_snapshot_wals=1000) as s:
        for i in range(2000):
            s.put(b"k%05d" % i, b"v%d" % i)
            model[b"k%05d" % i] = b"v%d" % i
        s.snapshot(1)
        s.settle()
        before = s.stats()
        for r in range(2, 12):
            info = snapshot_round(s, r, model)
            states[r] = dict(model)
            assert info.files_uploaded == 1 and info.bytes_uploaded < 2000, info
        s.settle()
        after = s.stats()
        assert (after["flushes"], after["merges_done"], after["segments"]) == (
            before["flushes"], before["merges_done"], before["segments"]
        )
        # one per round; with a WAL also the first snapshot's (no flush) and the active one
        assert len(after["wals"]) == (10 if sync == "none" else 12)
    for snap in (6, 11):
        with statestores.open("hybridlog", tmp_path / f"restored{snap}", remote=remote) as r:
            r.restore(snap)
            assert dict(r.items()) == states[snap]


def test_a_snapshot_flushes_once_a_store_holds_max_snapshot_wals(tmp_path: Path) -> None:
    """Sealed WALs are bounded: a restore never replays more than ``max_snapshot_wals``."""
    check_snapshot_files_bounded("hybridlog", tmp_path, lambda st: len(st["wals"]), "flushes")


@pytest.mark.parametrize("sync", ["none", "os"])
def test_hybridlog_matches_a_dict(inline_merges: None, sync: str) -> None:
    run_machine(machine("hybridlog", dict(TINY, sync=sync)))


def test_hybridlog_matches_a_dict_with_a_lazy_index(inline_merges: None, lazy_index: None) -> None:
    run_machine(machine("hybridlog", dict(TINY, sync="os")))


def test_a_snapshot_tail_is_written_by_the_maintainer_not_the_freeze(tmp_path: Path) -> None:
    """The freeze only swaps the tail's dict and names the file: with the maintainer held
    busy, ``snapshot_async`` returns before the tail exists, the upload waits for it, and
    a restore elsewhere is the state at the freeze (writes after it excluded)."""
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open("hybridlog", tmp_path / "db", remote=remote) as s:
        for i in range(500):
            s.put(b"k%04d" % i, b"a")
        s.snapshot(1)  # the first snapshot flushes; from now on each writes a tail
        s.settle()
        for i in range(0, 500, 7):
            s.put(b"k%04d" % i, b"b")
        s.delete(b"k0001")
        gate = threading.Event()
        s.tasks.maintainer.post(gate.wait, 30)
        fut = s.snapshot_async(2)
        tails = [w for w in s.stats()["wals"] if not (tmp_path / "db" / w).exists()]
        assert len(tails) == 1, s.stats()["wals"]  # named, not yet written
        s.put(b"k0000", b"after the freeze")
        assert not fut.done()
        gate.set()
        assert fut.result(timeout=30).files_uploaded == 1
        assert (tmp_path / "db" / tails[0]).exists()
    with statestores.open("hybridlog", tmp_path / "restored", remote=remote) as r:
        r.restore(2)
        want = {b"k%04d" % i: (b"b" if i % 7 == 0 else b"a") for i in range(500) if i != 1}
        assert dict(r.items()) == want


def test_a_tail_that_cannot_be_written_fails_its_snapshot_and_goes_into_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statestores import hybridlog

    remote = remotes.PathRemote(tmp_path / "remote")
    real = hybridlog.write_tail
    calls = []

    def failing_once(fs: Any, path: str, items: Any) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise OSError(28, "No space left on device (injected)")
        real(fs, path, items)

    monkeypatch.setattr(hybridlog, "write_tail", failing_once)
    with statestores.open("hybridlog", tmp_path / "db", remote=remote, fs=FaultyFS()) as s:  # tails on this thread's fs
        s.put(b"a", b"1")
        s.snapshot(1)
        s.put(b"a", b"2")
        s.put(b"b", b"2")
        with pytest.raises(remotes.RemoteError, match="injected"):
            s.snapshot(2)
        s.put(b"c", b"3")
        s.snapshot(3)
        assert len(calls) == 2
    with statestores.open("hybridlog", tmp_path / "restored", remote=remote) as r:
        r.restore(3)
        assert dict(r.items()) == {b"a": b"2", b"b": b"2", b"c": b"3"}
