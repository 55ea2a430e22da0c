"""The store API every engine shares: semantics, bad input, lifecycle."""

from __future__ import annotations

from pathlib import Path

import pytest

import remotes
import statestores
from statestores import StoreClosedError

ENGINES = statestores.ENGINES


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


def test_engines_tuple_is_the_documented_one() -> None:
    assert statestores.ENGINES == ("lsm", "appendlog", "hybridlog", "memonly")


def test_basic_semantics_survive_reopen(engine: str, tmp_path: Path) -> None:
    with statestores.open(engine, tmp_path) as s:
        s.put(b"a", b"1")
        s[b"b"] = b""
        s.put(b"c", b"3")
        s.delete(b"c")
        s.delete(b"never-there")
        s.write_batch([(b"d", b"4"), (b"a", None), (b"e", b"5")])
        assert s.get(b"a") is None
        assert s.get(b"a", b"dflt") == b"dflt"
        assert s[b"b"] == b"" and b"b" in s  # an empty value is a value
        assert b"c" not in s
        with pytest.raises(KeyError):
            s[b"c"]
        with pytest.raises(KeyError):
            del s[b"zzz"]
        del s[b"e"]
        expected = {b"b": b"", b"d": b"4"}
        assert dict(s.items()) == expected
    with statestores.open(engine, tmp_path) as s:
        assert dict(s.items()) == expected
        pairs = list(s.items())
        assert len(pairs) == len({k for k, _ in pairs})  # every live pair once


def test_lsm_items_come_in_key_order(tmp_path: Path) -> None:
    keys = [bytes([b]) * 3 for b in range(200, 0, -3)]
    with statestores.open("lsm", tmp_path, memtable_bytes=300) as s:
        for k in keys:
            s.put(k, k)
        s.flush()
        s.put(b"\x00first", b"x")
        got = [k for k, _ in s.items()]
    assert got == sorted(keys + [b"\x00first"])


def test_prefixed_is_items_filtered_in_key_order(engine: str, tmp_path: Path) -> None:
    """Across the memtable, flushed files and deletes; prefixes inside, between, before
    and after the keys; a closed store and a prefix that is not bytes are refused."""
    model: dict[bytes, bytes] = {}
    with statestores.open(engine, tmp_path, **({"memtable_bytes": 2000} if engine == "lsm" else {})) as s:
        for i in range(3000):
            k = (b"\x00t", b"\x00a", b"user", b"u")[i % 4] + b"%05d" % (i * 7919 % 3001)
            s.put(k, b"v%d" % i)
            model[k] = b"v%d" % i
            if i % 5 == 0:
                s.delete(k)
                del model[k]
            if i % 700 == 699:
                s.flush()
        for prefix in (b"", b"\x00", b"\x00t", b"\x00a", b"u", b"user", b"user0", b"u01", b"\x00z",
                       b"a", b"zz", b"\xff"):
            want = sorted((k, v) for k, v in model.items() if k.startswith(prefix))
            assert list(s.prefixed(prefix)) == want, prefix
        with pytest.raises(TypeError, match="prefix must be bytes"):
            s.prefixed("u")  # type: ignore[arg-type]
    with statestores.open(engine, tmp_path) as s:  # (reopened: everything from files)
        assert list(s.prefixed(b"\x00t")) == sorted((k, v) for k, v in model.items() if k.startswith(b"\x00t"))
    with pytest.raises(StoreClosedError):
        s.prefixed(b"u")


def test_lsm_prefixed_reads_only_the_blocks_that_can_hold_the_prefix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime finds its timers this way at every recovery: at 10M keys a scan of
    every block held a worker for seconds."""
    from statestores.lsm.runfile import RunReader

    with statestores.open("lsm", tmp_path) as s:
        s.write_batch([(b"\x00t%03d" % i, b"t") for i in range(5)]
                      + [(b"user%06d" % i, b"x" * 100) for i in range(20_000)])
        s.flush()
        reads: list[int] = []
        real = RunReader.read_block

        def counted(self: RunReader, i: int) -> tuple[list[bytes], list[bytes | None]]:
            reads.append(i)
            return real(self, i)

        monkeypatch.setattr(RunReader, "read_block", counted)
        assert [k for k, _ in s.prefixed(b"\x00t")] == [b"\x00t%03d" % i for i in range(5)]
        assert 1 <= len(reads) <= 2
        reads.clear()
        assert [k for k, _ in s.prefixed(b"user019998")] == [b"user019998"]
        assert 1 <= len(reads) <= 2
        reads.clear()
        assert len(list(s.items())) == 20_005
        assert len(reads) > 100  # (the whole store: the count above is not a coincidence)


@pytest.mark.parametrize(
    "key, exc, words",
    [
        ("str-key", TypeError, "key must be bytes"),
        (123, TypeError, "key must be bytes"),
        (None, TypeError, "key must be bytes"),
        (b"", ValueError, "must not be empty"),
        (b"k" * (statestores.MAX_KEY_BYTES + 1), ValueError, "larger than the maximum"),
    ],
)
def test_bad_keys_are_named_and_change_nothing(engine: str, tmp_path: Path, key: object, exc: type, words: str) -> None:
    with statestores.open(engine, tmp_path) as s:
        s.put(b"keep", b"v")
        for call in (lambda: s.put(key, b"v"), lambda: s.get(key), lambda: s.delete(key),  # type: ignore[arg-type]
                     lambda: s.write_batch([(b"ok", b"1"), (key, b"v")])):  # type: ignore[list-item]
            with pytest.raises(exc, match=words):
                call()
        assert dict(s.items()) == {b"keep": b"v"}  # the batch's good op was not applied either


def test_bad_values_are_named(engine: str, tmp_path: Path) -> None:
    with statestores.open(engine, tmp_path) as s:
        with pytest.raises(TypeError, match="value for key b'k' must be bytes, got str"):
            s.put(b"k", "text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="delete"):
            s.put(b"k", None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="op #1"):
            s.write_batch([(b"a", b"1"), b"not-a-pair"])  # type: ignore[list-item]
        assert list(s.items()) == []


def test_unknown_engine_and_options_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown engine 'rocks'"):
        statestores.open("rocks", tmp_path)
    with pytest.raises(TypeError, match="'memtable_size'"):
        statestores.open("lsm", tmp_path, memtable_size=10)
    with pytest.raises(ValueError, match="'sync'"):
        statestores.open("appendlog", tmp_path, sync="always")
    assert not (tmp_path / "CURRENT").exists()  # nothing was created by the failed opens


def test_large_keys_and_values(engine: str, tmp_path: Path) -> None:
    big_key = b"K" * (64 * 1024)
    big_value = bytes(range(256)) * (64 * 1024 * 1024 // 256)  # 64 MiB
    with statestores.open(engine, tmp_path) as s:
        s.put(big_key, b"small")
        s.put(b"big", big_value)
        s.put(b"after", b"x")
        assert s.get(big_key) == b"small"
        assert s.get(b"big") == big_value
    with statestores.open(engine, tmp_path) as s:
        assert s.get(big_key) == b"small"
        assert s.get(b"big") == big_value
        assert s.get(b"after") == b"x"


def test_closed_store_refuses_use(engine: str, tmp_path: Path) -> None:
    s = statestores.open(engine, tmp_path)
    s.put(b"a", b"1")
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreClosedError):
        s.get(b"a")
    with pytest.raises(StoreClosedError):
        s.put(b"a", b"2")


def test_a_directory_opens_once(engine: str, tmp_path: Path) -> None:
    with statestores.open(engine, tmp_path):
        with pytest.raises(statestores.LockedError):
            statestores.open(engine, tmp_path)


def test_snapshot_ids_must_increase(engine: str, tmp_path: Path) -> None:
    remote = remotes.PathRemote(tmp_path / "remote")
    with statestores.open(engine, tmp_path / "db", remote=remote) as s:
        s.put(b"a", b"1")
        assert s.snapshot(5).snapshot_id == 5
        for bad in (5, 4):
            with pytest.raises(ValueError, match=f"snapshot_id {bad} must be greater than the last snapshot id 5"):
                s.snapshot(bad)
        with pytest.raises(TypeError, match="snapshot_id must be an int"):
            s.snapshot("6")  # type: ignore[arg-type]
        assert s.snapshots() == [5]


def test_snapshot_without_remote_says_how_to_fix(engine: str, tmp_path: Path) -> None:
    with statestores.open(engine, tmp_path) as s:
        with pytest.raises(statestores.StoreError, match="needs a remote"):
            s.snapshot(1)


def test_stats_report_disk_and_engine(engine: str, tmp_path: Path) -> None:
    with statestores.open(engine, tmp_path) as s:
        for i in range(1000):
            s.put(b"key%05d" % i, b"v" * 100)
        s.flush()
        st = s.stats()
    assert st["engine"] == engine
    assert st["disk_bytes"] > 50_000


@pytest.mark.parametrize("engine", ["lsm", "appendlog", "hybridlog"])
def test_paused_merges_wait_for_resume_and_the_data_stays_whole(engine: str, tmp_path: Path) -> None:
    """``pause_merges`` (a store being shipped for a move): flushes go on, no merge starts,
    so the file count only grows; after ``resume`` the store merges again."""
    from tests.statestores.engines import TINY

    db = statestores.open(engine, tmp_path / "db", **TINY[engine])
    resume = db.pause_merges()
    model = {}
    for i in range(600):
        k, v = b"k%04d" % (i % 150), b"v%d" % i
        db.put(k, v)
        model[k] = v
    db.settle()
    paused_files = len(db.version()[1])
    assert dict(db.items()) == model
    resume()
    resume()  # a second call does nothing
    db.put(b"more", b"x")
    db.settle()
    model[b"more"] = b"x"
    assert len(db.version()[1]) < paused_files, "no merge after resume"
    assert dict(db.items()) == model
    db.close()


def test_stats_count_the_files_left_when_one_vanishes_during_the_count(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Background work (a retired WAL, a merged run) may remove a file between the listing
    and its size: the count skips that file, never the others (it once reported 0)."""
    import os

    import statestores.files as files

    real_scandir = os.scandir

    class VanishingFirst:
        """The directory listed with a stray file first, then the stray removed."""

        def __init__(self, path: str) -> None:
            with real_scandir(path) as it:
                self.entries = sorted(it, key=lambda e: e.name != "aaa-vanishing.tmp")
            os.remove(os.path.join(path, "aaa-vanishing.tmp"))

        def __enter__(self) -> list[os.DirEntry[str]]:
            return self.entries

        def __exit__(self, *exc: object) -> None:
            pass

    with statestores.open(engine, tmp_path) as s:
        for i in range(1000):
            s.put(b"key%05d" % i, b"v" * 100)
        s.flush()
        (tmp_path / "aaa-vanishing.tmp").write_bytes(b"x" * 10)
        monkeypatch.setattr(files.os, "scandir", VanishingFirst)
        st = s.stats()
        monkeypatch.undo()
    assert st["disk_bytes"] > 50_000  # the store's own files, without the vanished one
