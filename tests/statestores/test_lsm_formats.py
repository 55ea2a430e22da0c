"""The lsm engine's on-disk formats: data blocks, fence index, Bloom filter, run files, WAL
records. Round trips, and every damaged byte detected as ``CorruptionError``."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statestores import records
from statestores.errors import CorruptionError
from statestores.fs import FileSystem
from statestores.lsm.bloom import Bloom, key_hash, params
from statestores.lsm.fence import decode_index, encode_index
from statestores.lsm.runfile import FOOTER, RunReader, decode_block, encode_block, write_run

keys_st = st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=80, unique=True).map(sorted)
value_st = st.one_of(st.none(), st.binary(max_size=60))


def _flip(data: bytes, i: int) -> bytes:
    b = bytearray(data)
    b[i] ^= 0x41
    return bytes(b)


# ---------------------------------------------------------------- data blocks


@given(keys=keys_st, data=st.data())
@settings(max_examples=150, deadline=None)
def test_block_round_trip(keys: list[bytes], data: st.DataObject) -> None:
    values = [data.draw(value_st) for _ in keys]
    raw = encode_block(keys, values)
    assert decode_block(raw, "blk", 0) == (keys, values)


def test_block_fixed_and_mixed_sizes_round_trip() -> None:
    keys = [b"k%03d" % i for i in range(40)]
    for values in (
        [b"v" * 10] * 40,  # fixed-size fast path
        [b""] * 40,  # empty values are values
        [b"v" * (i % 7) for i in range(40)],
        [None if i % 5 == 0 else b"x" * 10 for i in range(40)],
        [None] * 40,
    ):
        assert decode_block(encode_block(keys, values), "blk", 0) == (keys, values)


@given(keys=keys_st, data=st.data(), fixed=st.booleans())
@settings(max_examples=150, deadline=None)
def test_block_get_agrees_with_decode(keys: list[bytes], data: st.DataObject, fixed: bool) -> None:
    from statestores.lsm.runfile import ABSENT, block_get

    if fixed:  # the bytes.find fast path: every key the same length
        keys = sorted({k.ljust(8, b"\x00")[:8] for k in keys})
    values = [data.draw(value_st) for _ in keys]
    raw = encode_block(keys, values)
    for k, v in zip(keys, values, strict=True):
        assert block_get(raw, k, "blk", 0) == v
    probes = data.draw(st.lists(st.binary(min_size=1, max_size=10), max_size=10))
    for p in probes:
        want = dict(zip(keys, values, strict=True)).get(p, ABSENT)
        assert block_get(raw, p, "blk", 0) is want or block_get(raw, p, "blk", 0) == want
    # a key straddling two fixed-size keys is not a match
    if fixed and len(keys) >= 2:
        probe = keys[0][4:] + keys[1][:4]
        want = dict(zip(keys, values, strict=True)).get(probe, ABSENT)
        got = block_get(raw, probe, "blk", 0)
        assert got is want or got == want


def test_block_get_detects_damage() -> None:
    from statestores.lsm.runfile import block_get

    raw = encode_block([b"aa", b"bb"], [b"1", b"2"])
    for i in range(len(raw)):
        with pytest.raises(CorruptionError, match="blk-file"):
            block_get(_flip(raw, i), b"aa", "blk-file", 0)


def test_every_flipped_block_byte_is_detected() -> None:
    raw = encode_block([b"a", b"bb", b"ccc"], [b"1", None, b"333"])
    for i in range(len(raw)):
        with pytest.raises(CorruptionError, match="blk-file"):
            decode_block(_flip(raw, i), "blk-file", 128)
    with pytest.raises(CorruptionError):
        decode_block(raw[:-1], "blk-file", 0)


# ---------------------------------------------------------------- fence index


@given(keys=keys_st)
@settings(max_examples=100, deadline=None)
def test_index_round_trip_and_find(keys: list[bytes]) -> None:
    offsets = [i * 100 for i in range(len(keys) + 1)]
    idx = decode_index(encode_index(offsets, keys, keys[-1] + b"\xff"), "idx")
    assert idx.offsets == offsets and idx.fences == keys and idx.last_key == keys[-1] + b"\xff"
    for i, k in enumerate(keys):
        assert idx.find(k) == i
    assert idx.find(keys[-1] + b"\xff\xff") == -1  # past the last key
    if keys[0] > b"\x00":
        assert idx.find(b"\x00") == -1  # before the first fence


def test_every_flipped_index_byte_is_detected() -> None:
    raw = encode_index([0, 10, 20], [b"a", b"m"], b"z")
    for i in range(len(raw)):
        with pytest.raises(CorruptionError, match="the-index"):
            decode_index(_flip(raw, i), "the-index")


def test_index_rejects_mismatched_offsets() -> None:
    with pytest.raises(ValueError, match="offsets"):
        encode_index([0, 1], [b"a", b"b"], b"b")


# ---------------------------------------------------------------- bloom


def test_bloom_params_follow_the_thesis_formula() -> None:
    m, k = params(1000, 0.01)
    assert m == math.ceil(-1000 * math.log(0.01) / math.log(2) ** 2)
    assert k == math.floor(m / 1000 * math.log(2)) == 6
    assert params(0, 0.01)[0] >= 64
    with pytest.raises(ValueError, match="false-positive"):
        params(10, 1.5)


def test_bloom_has_no_false_negatives_and_about_its_false_positive_rate() -> None:
    from array import array

    present = [b"key-%d" % i for i in range(5000)]
    hashes = array("q", [x for k in present for x in key_hash(k)])
    bloom = Bloom.build(hashes, 0.01)
    assert all(bloom.might_contain(*key_hash(k)) for k in present)
    absent = [b"other-%d" % i for i in range(20000)]
    fp = sum(bloom.might_contain(*key_hash(k)) for k in absent) / len(absent)
    assert fp < 0.02  # ε = 0.01; generous bound, deterministic hashes
    again = Bloom.from_bytes(bloom.to_bytes(), bloom.m, bloom.k)
    assert again.bits == bloom.bits


# ---------------------------------------------------------------- run files


def _write(tmp_path: Path, keys: list[bytes], values: list[bytes | None], **kw: object) -> str:
    path = str(tmp_path / "lsm-L0-0000000001.run")
    opts = {"density_factor": 4, "block_bytes": 64, "bloom_fpr": 0.01}
    opts.update(kw)
    write_run(FileSystem(), path, keys, values, **opts)  # type: ignore[arg-type]
    return path


@given(keys=keys_st, data=st.data(), density=st.integers(1, 9), block_bytes=st.integers(1, 300))
@settings(max_examples=60, deadline=None)
def test_run_round_trip(tmp_path_factory: pytest.TempPathFactory, keys: list[bytes], data: st.DataObject, density: int, block_bytes: int) -> None:
    values = [data.draw(value_st) for _ in keys]
    path = _write(tmp_path_factory.mktemp("run"), keys, values, density_factor=density, block_bytes=block_bytes)
    r = RunReader(FileSystem(), path)
    assert list(r.items()) == list(zip(keys, values, strict=True))
    assert r.count == len(keys) and r.tombstones == values.count(None)
    for i in range(r.nblocks):
        assert len(r.read_block(i)[0]) <= density
    for k, v in zip(keys, values, strict=True):
        assert r.bloom.might_contain(*key_hash(k))
        b = r.index.find(k)
        ks, vs = r.read_block(b)
        assert vs[ks.index(k)] == v


def test_run_rejects_unsorted_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ascend"):
        _write(tmp_path, [b"b", b"a"], [b"1", b"2"])


def test_damaged_run_files_raise_corruption_naming_the_file(tmp_path: Path) -> None:
    keys = [b"key-%04d" % i for i in range(200)]
    path = _write(tmp_path, keys, [b"v" * 20] * 200)
    good = Path(path).read_bytes()
    size = len(good)
    r = RunReader(FileSystem(), path)
    index_off = r.index.offsets[-1]
    # every byte of footer, index and bloom is checked on open
    footer_at = size - FOOTER.size
    for i in [*range(index_off, footer_at, 5), *range(footer_at, size)]:
        Path(path).write_bytes(_flip(good, i))
        with pytest.raises(CorruptionError, match="lsm-L0-0000000001.run"):
            RunReader(FileSystem(), path)
    # a damaged data block opens fine but is never returned as data
    Path(path).write_bytes(_flip(good, 10))
    r = RunReader(FileSystem(), path)
    with pytest.raises(CorruptionError, match="lsm-L0-0000000001.run"):
        list(r.items())
    # truncated files
    for cut in (0, 5, FOOTER.size, size - 1):
        Path(path).write_bytes(good[:cut])
        with pytest.raises(CorruptionError):
            RunReader(FileSystem(), path)


def test_run_open_reads_only_the_index_and_filter(tmp_path: Path) -> None:
    keys = [b"%016d" % i for i in range(20000)]
    path = _write(tmp_path, keys, [b"v" * 100] * 20000, density_factor=32, block_bytes=4096)
    r = RunReader(FileSystem(), path)
    assert r.memory_bytes < os.path.getsize(path) / 10


# ---------------------------------------------------------------- WAL records


def test_inlined_put_record_equals_records_encode(tmp_path: Path) -> None:
    import statestores

    with statestores.open("lsm", tmp_path) as s:
        s.put(b"key", b"value")
        s.put(b"k2", b"")
        # the active WAL (the other, empty one is the spare the next WAL switch takes)
        wal = [n for n in os.listdir(tmp_path) if n.endswith(".wal") and (tmp_path / n).stat().st_size]
        assert len(wal) == 1
        data = (tmp_path / wal[0]).read_bytes()
    assert data == records.encode(b"key", b"value") + records.encode(b"k2", b"")


# ---------------------------------------------------------------- merges


@given(
    sources=st.lists(st.dictionaries(st.binary(min_size=1, max_size=3), value_st, max_size=40), min_size=1, max_size=5),
    chunk=st.integers(1, 7),
    drop=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_chunked_merge_equals_newest_wins(sources: list[dict[bytes, bytes | None]], chunk: int, drop: bool) -> None:
    from statestores.lsm.merge import merge_chunks, merge_sorted

    expect: dict[bytes, bytes | None] = {}
    for src in reversed(sources):  # sources are newest first
        expect.update(src)
    if drop:
        expect = {k: v for k, v in expect.items() if v is not None}

    def chunks(src: dict[bytes, bytes | None]):  # type: ignore[no-untyped-def]
        ks = sorted(src)
        for i in range(0, len(ks), chunk):
            yield ks[i : i + chunk], [src[k] for k in ks[i : i + chunk]]

    out = [kv for ks, vs in merge_chunks([chunks(s) for s in sources], drop_tombstones=drop) for kv in zip(ks, vs, strict=True)]
    assert out == sorted(expect.items())
    tagged = [iter([(k, i, src[k]) for k in sorted(src)]) for i, src in enumerate(sources)]
    assert list(merge_sorted(tagged, drop_tombstones=drop)) == out


def test_merge_and_flush_jobs_write_valid_runs(tmp_path: Path) -> None:
    from statestores.lsm.merge import flush_memtable, merge_runs

    opts = (2, 64, 0.01, False)
    new = str(tmp_path / "new.run")
    old = str(tmp_path / "old.run")
    assert flush_memtable(None, new, {b"a": b"1", b"b": None, b"c": b"3"}, False, *opts)["count"] == 3
    assert flush_memtable(None, old, {b"b": b"old", b"d": b"4", b"e": None}, False, *opts)["count"] == 3
    assert flush_memtable(None, str(tmp_path / "none.run"), {b"x": None}, True, *opts)["count"] == 0
    assert not (tmp_path / "none.run").exists()
    out = str(tmp_path / "out.run")
    res = merge_runs(None, [new, old], out, True, *opts)
    assert res["count"] == 3 and res["inputs"] == 6
    assert list(RunReader(FileSystem(), out).items()) == [(b"a", b"1"), (b"c", b"3"), (b"d", b"4")]
    res = merge_runs(None, [new, old], out, False, *opts)
    assert list(RunReader(FileSystem(), out).items()) == [(b"a", b"1"), (b"b", None), (b"c", b"3"), (b"d", b"4"), (b"e", None)]
