"""Round manifests and their index: the codec, publishing with retention, and the garbage
collection of store snapshots no retained round needs (on real stores and a PathRemote)."""

from __future__ import annotations

import os
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import statestores
from remotes import PathRemote
from sfaas.errors import ConfigError
from sfaas.runtime.protocols.rounds import (
    INDEX_BLOB,
    RoundError,
    RoundIndex,
    RoundManifest,
    Rounds,
    StoreCut,
    collect_garbage,
    round_blob,
)
from sfaas.runtime.settings import Settings

_ints = st.integers(min_value=0, max_value=2**40)
def _with_map(m: RoundManifest, data: st.DataObject) -> RoundManifest:
    import dataclasses

    owners = data.draw(st.none() | st.lists(st.integers(0, m.workers - 1), min_size=m.partitions,
                                             max_size=m.partitions).map(tuple))
    return m if owners is None else dataclasses.replace(m, owners=owners)


manifests = st.builds(
    RoundManifest,
    round=st.integers(min_value=1, max_value=2**40),
    epoch=_ints,
    workers=st.integers(min_value=1, max_value=64),
    partitions=st.integers(min_value=1, max_value=512),
    stores=st.lists(st.builds(StoreCut, st.text(min_size=1, max_size=20), _ints, _ints, _ints, _ints,
                               st.sampled_from(["", "lsm", "hybridlog"])),
                    max_size=8).map(tuple),
    ingress=st.dictionaries(_ints, _ints, max_size=8),
    skip=st.dictionaries(_ints, st.lists(_ints, max_size=5), max_size=4),
    egress=st.dictionaries(_ints, _ints, max_size=8),
    retries=st.lists(st.tuples(_ints, _ints, _ints, st.floats(min_value=0, max_value=2e9),
                               st.dictionaries(st.text(max_size=8), st.tuples(st.booleans(), _ints).map(list),
                                               max_size=2)), max_size=5).map(tuple),
    epoch_log=_ints,
    started=st.floats(min_value=0, max_value=2e9),
    created=st.floats(min_value=0, max_value=2e9),
)


@given(manifests, st.data())
@settings(max_examples=200, deadline=None)
def test_manifest_roundtrips(m: RoundManifest, data: st.DataObject) -> None:
    m = _with_map(m, data)  # a rescale's round names its partition map
    assert RoundManifest.decode(m.encode()) == m


def test_a_map_naming_a_missing_worker_is_refused() -> None:
    bad = RoundManifest(1, 1, 2, 3, (), {}, {}, {}, owners=(0, 1, 2))
    with pytest.raises(RoundError, match="owners must name one of 2 workers for each of 3 partitions"):
        RoundManifest.decode(bad.encode(), "blob round-1")


def test_formats_written_before_re_runs_kept_their_now_still_decode() -> None:
    """A round manifest whose retries are ``[tid, partition, offset]`` (their re-runs get the
    round's start as ``now``), and a version-1 epoch-log record (its re-runs replay with the
    epoch's ``now``), as an older sfaas wrote them to MinIO and Kafka."""
    import struct

    import msgpack

    from sfaas.runtime.epochlog import EpochRecord
    from sfaas.runtime.protocols.rounds import _decode, _encode

    m = RoundManifest(3, 40, 2, 4, (), {0: 5}, {}, {}, ((9, 0, 7, 123.5),), 11, started=100.25, created=101.0)
    body = _decode(b"SFRM", m.encode(), "new", "round manifest")
    assert body["retries"] == [[9, 0, 7, 123.5]]
    body["retries"] = [[9, 0, 7]]
    assert RoundManifest.decode(_encode(b"SFRM", body)).retries == ((9, 0, 7, 100.25, {}),)
    body["retries"] = [[9, 0]]
    with pytest.raises(RoundError, match="old: a retries row is not"):
        RoundManifest.decode(_encode(b"SFRM", body), "old")

    v1 = struct.pack("<4sB", b"SFEL", 1) + msgpack.packb([5, 1, 77.0, [[3, 0, 9], [4, 1, 2]]])
    rec = EpochRecord.decode(v1)
    assert (rec.batch, rec.kept_now, rec.nows()) == (((3, 0, 9), (4, 1, 2)), (), [77.0, 77.0])
    v2 = EpochRecord(5, 1, 77.0, ((3, 0, 9), (4, 1, 2)), ((3, 70.5),))
    assert EpochRecord.decode(v2.encode()).nows() == [70.5, 77.0]


@given(manifests, st.data())
@settings(max_examples=200, deadline=None)
def test_any_changed_byte_is_refused_with_the_source_named(m: RoundManifest, data: st.DataObject) -> None:
    raw = bytearray(m.encode())
    i = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(RoundError, match="blob round-7"):
        RoundManifest.decode(bytes(raw), "blob round-7")
    with pytest.raises(RoundError, match="too short"):
        RoundManifest.decode(bytes(raw[:5]), "blob round-7")


def test_index_refuses_unsorted_or_bad_ids() -> None:
    assert RoundIndex.decode(RoundIndex((1, 5, 9)).encode()).rounds == (1, 5, 9)
    for bad in ((5, 1), (0,), (3, 3)):
        with pytest.raises(RoundError, match="ascending distinct"):
            RoundIndex.decode(RoundIndex(bad).encode())
    with pytest.raises(RoundError, match="magic"):
        RoundIndex.decode(RoundManifest(1, 1, 1, 1, (), {}, {}, {}).encode())


@given(st.lists(st.tuples(st.integers(min_value=1, max_value=40), st.integers(min_value=1, max_value=4)),
                min_size=1, max_size=12))
@settings(max_examples=40, deadline=None)
def test_publish_keeps_the_newest_rounds_and_deletes_the_others(tmp_path_factory, steps) -> None:
    rounds = Rounds(PathRemote(tmp_path_factory.mktemp("rounds")))
    published: set[int] = set()
    for rid, retain in steps:
        m = RoundManifest(rid, rid * 10, 2, 4, (), {0: rid}, {}, {})
        retained, dropped = rounds.publish(m, retain)
        published.add(rid)
        want = sorted(published)[-retain:]
        assert rounds.ids() == retained == want
        assert set(dropped).isdisjoint(want)
        published = set(want)
        assert rounds.read(want[-1]).ingress == {0: want[-1]}
        for r in dropped:
            assert rounds.remote.get_blob(round_blob(r)) is None
    assert rounds.latest() == rounds.read(max(published))


def test_a_listed_round_whose_blob_is_gone_is_a_clear_error(tmp_path: Path) -> None:
    rounds = Rounds(PathRemote(tmp_path))
    rounds.publish(RoundManifest(3, 1, 1, 1, (), {}, {}, {}), 2)
    rounds.remote.delete_blob(round_blob(3))
    with pytest.raises(RoundError, match="round 3 is listed but its manifest 'round-000000000003' is missing"):
        rounds.latest()


@pytest.mark.parametrize("engine", ["lsm", "appendlog", "hybridlog"])
def test_gc_keeps_retained_and_newer_snapshots_and_their_files(tmp_path: Path, engine: str) -> None:
    remotes = {p: PathRemote(tmp_path / "remote" / f"p{p}") for p in range(2)}
    small = {  # small files and eager merges, so rounds make earlier files obsolete
        "lsm": {"memtable_bytes": 32 << 10, "max_runs_per_level": 2, "density_factor": 2},
        "appendlog": {"threshold": 32 << 10, "max_runs_per_level": 2},
        "hybridlog": {"ro_lag_interval": 2, "flush_interval": 4, "max_runs_per_level": 2},
    }[engine]
    stores = {p: statestores.open(engine, tmp_path / "local" / f"p{p}", remote=remotes[p], **small) for p in range(2)}
    try:
        for rid in range(1, 8):
            for p, s in stores.items():
                # new keys, and the same hot keys rewritten: merges make files obsolete
                s.write_batch([(f"k{rid}-{i}".encode(), os.urandom(64)) for i in range(200)]
                              + [(f"hot-{i}".encode(), os.urandom(64)) for i in range(2000)])
                if rid == 5 and p == 1:
                    continue  # round 5 failed midway: only partition 0 took part
                s.snapshot(rid)
                s.settle()
        kept = {4, 6, 7}
        unneeded = {}
        for p, r in remotes.items():
            refs = set().union(*(r.read_manifest(x).files for x in kept if x in r.list_snapshots()))
            unneeded[p] = {n: size for n, size in r.list_files().items() if n not in refs}
        # rounds 4 and 6 complete and retained; 7 is newer (in flight): it must survive
        dropped, freed = collect_garbage([("op", 0), ("op", 1)], lambda op, p: remotes[p], [4, 6])
        assert dropped == 2 * 3 + 1  # 1, 2, 3 of both, 5 of partition 0
        for r in remotes.values():
            assert r.list_snapshots() == [4, 6, 7]
            refs = set().union(*(r.read_manifest(x).files for x in r.list_snapshots()))
            assert set(r.list_files()) == refs
        assert freed == sum(sum(u.values()) for u in unneeded.values()) > 0
        for s in stores.values():  # the retained rounds still restore completely
            s.restore(4)
            assert s.get(b"k4-0") is not None and s.get(b"k6-0") is None
    finally:
        for s in stores.values():
            s.close()


def test_round_settings_are_checked(monkeypatch) -> None:
    monkeypatch.setenv("SFAAS_SNAPSHOT_INTERVAL", "0.25")
    assert Settings.load().snapshot_interval == 0.25
    monkeypatch.setenv("SFAAS_SNAPSHOT_INTERVAL", "soon")
    with pytest.raises(ConfigError, match="SFAAS_SNAPSHOT_INTERVAL must be a number, got 'soon'"):
        Settings.load()
    monkeypatch.delenv("SFAAS_SNAPSHOT_INTERVAL")
    with pytest.raises(ConfigError, match="snapshot_interval must be a number of seconds >= 0"):
        Settings.load({"snapshot_interval": -1.0})
    with pytest.raises(ConfigError, match="snapshot_retain must be >= 1, got 0"):
        Settings.load({"snapshot_retain": 0})
    with pytest.raises(ConfigError, match="bucket 'Bad_Bucket' is not a valid S3 bucket name"):
        Settings.load({"bucket": "Bad_Bucket"})
    assert Settings.load({"bucket": "Bad_Bucket", "snapshot_interval": 0.0}).bucket == "Bad_Bucket"
    assert "sfaas-local-secret" not in repr(Settings.load())


async def test_the_coordinator_publishes_and_collects_rounds_in_its_background_process(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """Publishing a round and collecting garbage run in the coordinator's ``upload``
    background process, never on a thread of its own (there the MinIO client's work held
    the GIL the epoch loop needs for ~70 ms per round: issue 8's p99 spikes). Garbage is
    collected once ``GC_EVERY`` rounds were published and ``GC_PERIOD`` seconds passed
    since the last collection, and once rounds pause — not after each round."""
    import asyncio

    from coordinator.protocols import rounds as keeper_module
    from coordinator.protocols.rounds import GC_EVERY, RoundKeeper
    from coordinator.state import Layout
    from sfaas.runtime import wire
    from statestores import background

    submitted: list[tuple[str, str, bool]] = []
    real_submit = background.submit

    def recording_submit(fn, *args, lane="merge", local=False):  # type: ignore[no-untyped-def]
        submitted.append((fn.__name__, lane, local))
        return real_submit(fn, *args, lane=lane, local=local)

    monkeypatch.setattr(keeper_module.background, "submit", recording_submit)
    monkeypatch.setattr(keeper_module, "GC_PERIOD", 0.0)  # the period's own part is below
    interval = 0.2  # (a pause is 2 intervals without a round: longer than any stall between two)
    store_remotes = {p: PathRemote(tmp_path / "stores" / f"p{p}") for p in range(2)}
    stores = {p: statestores.open("lsm", tmp_path / "local" / f"p{p}", remote=store_remotes[p]) for p in range(2)}
    keeper = RoundKeeper(interval, 1, lambda: Layout(2, 1, ()), lambda: PathRemote(tmp_path / "rounds"),
                         lambda op, p: store_remotes[p])

    async def one_round(txns: int) -> int:
        round_id = None
        while round_id is None:  # (the first call starts reading the published rounds)
            await asyncio.sleep(interval / 5)
            round_id = keeper.marker(epoch=txns, txns=txns)
        for s in stores.values():
            s.put(f"k{round_id}".encode(), b"v")
            s.snapshot(round_id)
        keeper.on_report(wire.Snapshotted(round_id, 0, txns, [["op", p, 1, 1, 1, "lsm"] for p in stores],
                                          {}, {}, {}, [], 0, ""))
        assert keeper._publishing is not None
        await keeper._publishing
        return round_id

    def collections_run() -> int:
        return submitted.count(("collect_store_garbage", "upload", False))

    def snapshots() -> list[list[int]]:
        return [r.list_snapshots() for r in store_remotes.values()]

    try:
        for n in range(1, GC_EVERY):
            assert await one_round(n) == n
        assert collections_run() == 0 and snapshots() == [list(range(1, GC_EVERY))] * 2  # not after each round
        await one_round(GC_EVERY)  # the GC_EVERY-th: collected
        assert keeper._collecting is not None
        await keeper._collecting
        assert collections_run() == 1 and snapshots() == [[GC_EVERY]] * 2
        # no round starts while a collection runs (a snapshot a round wrote meanwhile could
        # take the place of a retained one among those a store's gc keeps)
        running: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keeper._collecting = running  # type: ignore[assignment]
        try:
            await asyncio.sleep(1.5 * interval)
            assert keeper.marker(epoch=GC_EVERY + 1, txns=GC_EVERY + 1) is None
        finally:
            keeper._collecting = None
            running.cancel()
        # GC_PERIOD seconds since the last collection began are needed too: GC_EVERY more
        # rounds within it do not collect
        monkeypatch.setattr(keeper_module, "GC_PERIOD", 3600.0)
        last = 2 * GC_EVERY
        for n in range(GC_EVERY + 1, last + 1):
            await one_round(n)
        assert keeper._collecting is None and collections_run() == 1
        assert snapshots() == [list(range(GC_EVERY, last + 1))] * 2
        await asyncio.sleep(2.5 * interval)  # rounds pause (no new transactions): collected
        assert keeper.marker(epoch=99, txns=last) is None
        assert keeper._collecting is not None
        await keeper._collecting
        assert collections_run() == 2 and snapshots() == [[last]] * 2
        assert Rounds(PathRemote(tmp_path / "rounds")).ids() == [last]
        assert ("publish_round", "upload", False) in submitted
    finally:
        await keeper.close()
        for s in stores.values():
            s.close()


class _CountingRounds(PathRemote):
    """A rounds remote that counts reads of the index and can lose the answer to one index
    write that landed (as a timeout after the object store stored it would)."""

    shareable = False  # (the keeper then publishes on a thread here, where the counts are)
    index_reads = 0
    lose_next_index_answer = False

    def get_blob(self, name: str) -> bytes | None:
        if name == INDEX_BLOB:
            type(self).index_reads += 1
        return super().get_blob(name)

    def put_blob(self, name: str, data: bytes) -> None:
        super().put_blob(name, data)
        if name == INDEX_BLOB and type(self).lose_next_index_answer:
            type(self).lose_next_index_answer = False
            raise OSError("the answer to the index write was lost")


async def test_the_coordinator_reads_the_round_index_once_not_per_round(tmp_path: Path) -> None:
    """The coordinator is the index's only writer: it reads the index when it starts and
    then publishes from what it wrote (one MinIO request fewer per round). After a publish
    that failed midway it does not know what the index holds and reads it again, so the
    rounds a lost answer hid are neither lost from the index nor left undeleted."""
    import asyncio

    from coordinator.protocols.rounds import RoundKeeper
    from coordinator.state import Layout
    from sfaas.runtime import wire

    interval, retain = 0.05, 2
    remote_dir = tmp_path / "rounds"
    Rounds(PathRemote(remote_dir)).publish(RoundManifest(7, 1, 1, 1, (), {}, {}, {}), retain)  # an earlier run's
    keeper = RoundKeeper(interval, retain, lambda: Layout(1, 1, ()), lambda: _CountingRounds(remote_dir),
                         lambda op, p: PathRemote(tmp_path))

    async def one_round(txns: int) -> int:
        round_id = None
        while round_id is None:  # (the first call starts reading the published rounds)
            await asyncio.sleep(interval / 5)
            round_id = keeper.marker(epoch=txns, txns=txns)
        keeper.on_report(wire.Snapshotted(round_id, 0, txns, [], {}, {}, {}, [], 0, ""))
        assert keeper._publishing is not None
        await keeper._publishing
        return round_id

    try:
        ids = [await one_round(n) for n in range(1, 6)]
        assert ids == [8, 9, 10, 11, 12]  # continuing above the published rounds
        assert _CountingRounds.index_reads == 1  # at start only
        assert Rounds(PathRemote(remote_dir)).ids() == [11, 12]
        _CountingRounds.lose_next_index_answer = True
        assert await one_round(6) == 13  # published, but the keeper saw it fail
        assert keeper.failed == 1 and keeper.last_complete is not None and keeper.last_complete.round == 12
        assert await one_round(7) == 14
        assert _CountingRounds.index_reads == 2  # read again after the failure, and only then
        rounds = Rounds(PathRemote(remote_dir))
        assert rounds.ids() == [13, 14]
        assert [r for r in range(1, 15) if rounds.remote.get_blob(round_blob(r)) is not None] == [13, 14]
    finally:
        await keeper.close()
