"""Fuzz: the store files an engine reads when it opens and serves — run files (blocks,
fence index, Bloom filter, footer), log segments and their hints, WALs, ``CURRENT`` — each
damaged (bit flips, truncation, splices, huge lengths, zeroed ranges) in a real store's
crash image, which is then opened and read in full.

Outcomes: a ``CorruptionError`` naming the file (or another ``StoreError``), or data
equal to what was written. Never another exception, and never wrong data: a value read is
the one written, no key appears that was not written, and a key goes missing without an
error only when the damage is at the end of a write-ahead log (exactly what a crash
mid-append leaves, which reopening truncates). After an error the store's other files are
intact: with the damaged file put back, the store opens with all its data.

The decoders themselves get the same treatment with well-framed hostile contents (the
checksum recomputed after the damage): ``CURRENT``, hints, log records.
"""

from __future__ import annotations

import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

import statestores
from statestores import background, current, hints, records
from statestores.checksum import crc32c
from statestores.errors import CorruptionError, StoreError
from statestores.fs import FileSystem
from statestores.lsm import runfile
from statestores.version import decode_entries

from .budget import fuzz
from .outcomes import Outcomes
from .strategies import deep_values, mix, mutated, values

OPTIONS: dict[str, dict[str, Any]] = {
    "lsm": {"memtable_bytes": 4096, "max_runs_per_level": 2, "density_factor": 4, "sync": "os"},
    "appendlog": {"threshold": 4096, "max_runs_per_level": 2, "sync": "os"},
    "hybridlog": {"ro_lag_interval": 40, "flush_interval": 80, "max_runs_per_level": 2, "sync": "os"},
    "memonly": {"sync": "os"},
}
N_KEYS = 300
#: per engine: the crash image's files (name → bytes) and their kinds in ``CURRENT``
IMAGES: dict[str, dict[str, bytes]] = {}
KINDS: dict[str, dict[str, str]] = {}


def model() -> dict[bytes, bytes]:
    """Every key written once, never overwritten or deleted: any value a damaged file
    could yield for a key is then either the right one or detectably wrong."""
    return {f"key-{i:05d}".encode(): f"value-{i}-".encode() * (1 + i % 4) for i in range(N_KEYS)}


def _write(engine: str, directory: Path) -> None:
    s = statestores.open(engine, directory, **OPTIONS[engine])
    items = list(model().items())
    for i in range(0, len(items), 10):
        if i % 50 == 0:
            s.write_batch(items[i:i + 10])
        else:
            for k, v in items[i:i + 10]:
                s.put(k, v)
    time.sleep(0.3)  # let background flushes and merges land (the image is checked below)
    image = directory.parent / f"{engine}-image"
    shutil.copytree(directory, image, ignore=shutil.ignore_patterns("LOCK", "*.tmp"))
    s.close()


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Per engine, a crash image (the files of an open store with WAL data in it), in IMAGES."""
    if IMAGES:
        return
    root = tmp_path_factory.mktemp("fuzz-stores")
    old = background.set_mode("thread")
    try:
        for engine in statestores.ENGINES:
            _write(engine, root / engine)
            image = root / f"{engine}-image"
            IMAGES[engine] = {p.name: p.read_bytes() for p in sorted(image.iterdir())}
            KINDS[engine] = {n: k for n, k, _ in current.read(FileSystem(), str(image))["files"]}
            assert _read_all(engine, image) == model(), f"{engine}: the undamaged image must hold the model"
    finally:
        background.set_mode(old)


def _read_all(engine: str, directory: Path) -> dict[bytes, bytes]:
    with statestores.open(engine, directory, **OPTIONS[engine]) as s:
        got = {k: v for k, v in s.items()}
        for k in model():
            v = s.get(k)
            assert v == got.get(k), (k, v, got.get(k))
        return got


@st.composite
def damage(draw: st.DrawFn) -> tuple[str, str, bytes]:
    engine = draw(st.sampled_from(statestores.ENGINES))
    name = draw(st.sampled_from(sorted(IMAGES[engine])))
    original = IMAGES[engine][name]
    if name.endswith(".run") and draw(st.booleans()):
        return engine, name, draw(reframed_footer(original))
    return engine, name, draw(mutated(st.just(original)))


_HOSTILE = st.one_of(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]), st.integers(0, 2**16))


@st.composite
def reframed_footer(draw: st.DrawFn, run: bytes) -> bytes:
    """A run whose footer fields (counts, offsets, Bloom ``m``/``k``) are hostile but whose
    footer checksum is right: only the reader's sanity checks stand in the way."""
    fields = list(runfile.FOOTER.unpack(run[-runfile.FOOTER.size:]))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(3, 10))  # count .. k
        hostile = draw(_HOSTILE)
        fields[i] = hostile & (0xFFFFFFFF if i == 10 else 0xFFFFFFFFFFFFFFFF)
    head = runfile.FOOTER.pack(*fields[:-1], 0)[:-4]
    return run[:-runfile.FOOTER.size] + head + struct.pack("<I", crc32c(head))


@pytest.fixture
def background_threads() -> Iterator[None]:
    old = background.set_mode("thread")  # no process start per example
    try:
        yield
    finally:
        background.set_mode(old)


@pytest.mark.spread(accepted=["all data", "wal tail truncated"],
                    min_accepted=0.05,
                    stages=["CURRENT: bad magic or checksum", ".wal: checksum mismatch", ".run: ", ".hint: ", ".log: "],
                    each=["all data", "wal tail truncated"])
@fuzz()
@given(data=st.data())
def test_a_damaged_store_file_gives_a_named_error_never_wrong_data(
        data: st.DataObject, images: None, tmp_path_factory: pytest.TempPathFactory,
        background_threads: None, outcomes: Outcomes) -> None:
    engine, name, damaged = data.draw(damage())
    work = tmp_path_factory.getbasetemp() / "fuzz-store-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    for n, b in IMAGES[engine].items():
        (work / n).write_bytes(damaged if n == name else b)
    want = model()
    try:
        got = _read_all(engine, work)
    except StoreError as exc:
        assert not isinstance(exc, CorruptionError) or exc.path and exc.detail
        outcomes.error(exc)
        # the other files are intact: put the damaged one back and everything is there
        (work / name).write_bytes(IMAGES[engine][name])
        assert _read_all(engine, work) == want, f"{engine}: data lost after an error on {name}"
        return
    wrong = {k: v for k, v in got.items() if want.get(k) != v}
    assert not wrong, f"{engine}: damaged {name} gave wrong data {list(wrong.items())[:3]}"
    missing = set(want) - set(got)
    if missing:
        # only the end of a log still being appended to may go (reopening truncates a torn tail)
        assert KINDS[engine].get(name) == "wal", f"{engine}: damaged {name} silently lost {len(missing)} keys"
        outcomes.add("wal tail truncated")
    else:
        outcomes.add("all data")


# -- decoders, with hostile contents behind a valid checksum --------------------------------------


def _current_bytes(doc: Any) -> bytes:
    try:
        body = msgpack.packb(doc, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        body = b"\xc0"
    return struct.pack("<4sI", b"SFCU", crc32c(body)) + body


@st.composite
def current_docs(draw: st.DrawFn) -> Any:
    doc: dict[Any, Any] = {"seq": 7, "version": 3, "files": [["lsm-L0-0000000001.run", "run", 0]]}
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(["seq", "version", "files", "other"]))
        doc[key] = draw(st.one_of(values(), deep_values(), st.lists(st.lists(values(3), max_size=4), max_size=3)))
    return draw(st.one_of(st.just(doc), values()))


@pytest.mark.spread(accepted=["version"],
                    min_accepted=0.05,
                    stages=["bad magic or checksum", "not a document", "seq must be", "version must be", "bad file entry"])
@fuzz(share=0.4)
@given(data=mix((3, current_docs().map(_current_bytes)), (2, mutated(st.just(_current_bytes({"seq": 1, "version": 1,
                                                                                           "files": []}))))))
def test_current_reads_a_version_or_raises_corruption(data: bytes, tmp_path: Path, outcomes: Outcomes) -> None:
    d = tmp_path / "s"
    d.mkdir(exist_ok=True)
    (d / current.NAME).write_bytes(data)
    try:
        doc = current.read(FileSystem(), str(d))
    except CorruptionError as exc:
        outcomes.error(exc)
        return
    outcomes.add("version")
    assert type(doc["seq"]) is int and type(doc["version"]) is int and isinstance(doc["files"], list)
    try:
        decode_entries(doc["files"], "fuzz")
    except CorruptionError as exc:
        outcomes.error(exc)


def _hint(keys: list[bytes], tombs: list[bytes]) -> bytes:
    return hints.encode(3, 1000, sorted(keys), [hints.address(3, 13 * i) for i in range(len(keys))], sorted(tombs))


@st.composite
def hint_inputs(draw: st.DrawFn) -> bytes:
    keys = draw(st.lists(st.binary(min_size=1, max_size=8), unique=True, max_size=6))
    tombs = draw(st.lists(st.binary(min_size=1, max_size=8), unique=True, max_size=3))
    data = _hint(keys, tombs)
    kind = draw(st.sampled_from(["valid", "bytes", "reframed"]))
    if kind == "valid":
        return data
    damaged = bytearray(draw(mutated(st.just(data))))
    if kind == "reframed" and len(damaged) >= 12:  # keep the magic, fix the checksum
        damaged[:8] = data[:8]
        damaged[8:12] = struct.pack("<I", crc32c(bytes(damaged[12:])))
    return bytes(damaged)


@pytest.mark.spread(accepted=["hint"],
                    min_accepted=0.1,
                    stages=["too short", "not a hint file", "checksum mismatch", "hint section lengths"])
@fuzz(share=0.3)
@given(data=hint_inputs())
def test_hint_decodes_or_raises_corruption(data: bytes, outcomes: Outcomes) -> None:
    try:
        h = hints.decode(data, "fuzz.hint")
    except CorruptionError as exc:
        outcomes.error(exc)
        return
    outcomes.add("hint")
    assert len(h.keys) == len(h.addresses) and all(isinstance(k, bytes) for k in h.keys + h.tombstones)


@st.composite
def log_inputs(draw: st.DrawFn) -> bytes:
    ops = draw(st.lists(st.tuples(st.binary(min_size=1, max_size=6), st.one_of(st.none(), st.binary(max_size=8))),
                        min_size=1, max_size=5))
    data = b"".join(records.encode(k, v) for k, v in ops[:2]) + records.encode_batch(ops[2:])
    return draw(st.one_of(st.just(data), mutated(st.just(data))))


@pytest.mark.spread(accepted=["records", "torn tail"],
                    min_accepted=0.2,
                    stages=["checksum mismatch"],
                    each=["records", "torn tail"])
@fuzz(share=0.3)
@given(data=log_inputs())
def test_log_records_scan_or_raise_corruption(data: bytes, outcomes: Outcomes) -> None:
    res = records.ScanResult(0, False)
    try:
        got = list(records.scan(data, "fuzz.log", res))
    except CorruptionError as exc:
        outcomes.error(exc)
        return
    outcomes.add("torn tail" if res.torn else "records")
    assert 0 <= res.valid_end <= len(data)
    assert all(isinstance(k, bytes) and (v is None or isinstance(v, bytes)) for _, k, v in got)


def test_a_run_claiming_too_many_bloom_probes_is_corrupt(tmp_path: Path) -> None:
    """A footer (with a right checksum) claiming 2**32 - 1 probes over an all-ones filter
    would make every lookup loop billions of times: the reader refuses it."""
    fs = FileSystem()
    path = str(tmp_path / "lsm-L0-0000000001.run")
    runfile.write_run(fs, path, [b"a", b"b"], [b"1", b"2"], density_factor=4, block_bytes=4096, bloom_fpr=0.01)
    run = bytearray(Path(path).read_bytes())
    fields = list(runfile.FOOTER.unpack(bytes(run[-runfile.FOOTER.size:])))
    bloom_off, bloom_len = fields[7], fields[8]
    ones = b"\xff" * (bloom_len - 4)
    run[bloom_off:bloom_off + bloom_len] = ones + struct.pack("<I", crc32c(ones))
    fields[10] = 2**32 - 1
    head = runfile.FOOTER.pack(*fields[:-1], 0)[:-4]
    run[-runfile.FOOTER.size:] = head + struct.pack("<I", crc32c(head))
    Path(path).write_bytes(bytes(run))
    with pytest.raises(CorruptionError, match="probe count"):
        runfile.RunReader(fs, path)
