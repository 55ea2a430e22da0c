"""Snapshot rounds on a real cluster: Kafka, MinIO, a coordinator and 2 worker processes.

Under load (transfers between accounts on both workers, plus counter bumps), rounds are
taken every 0.5 s. Each published round is restored from MinIO into fresh stores and
checked as a user would: the money is all there (the cut is consistent across workers),
and each counter equals the number of its bump requests the round's ingress positions
say are in the state (the recorded offsets match the state exactly). Retention keeps
``snapshot_retain`` rounds and collects the rest; a MinIO that is down fails rounds but
never the transactions.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaConnectionError

from launcher import cluster
from remotes.errors import SnapshotNotFoundError
from sfaas.app import App
from sfaas.client import Client
from sfaas.runtime import wire
from sfaas.runtime.epochlog import EpochRecord, decode_record, live
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.protocols.rounds import RoundManifest, Rounds
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import open_partition_stores, rounds_remote, store_remote
from sfaas.testing.replay import replay_log as serial_replay
from tests.conftest import TEST_BUCKET
from tests.namespaces import fresh_namespace
from tests.runtime.apps import ledger

ACCOUNTS = [f"acct-{i}" for i in range(12)]
COUNTERS = [f"ctr-{i}" for i in range(6)]
START = 1000
PARTITIONS = 4


def _settings(kafka, minio, home: Path, **extra: object) -> Settings:
    return Settings.load({
        "kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace(), "home": str(home),
        "store": "lsm", "partitions": PARTITIONS, "snapshot_interval": 0.5, "snapshot_retain": 2,
        "minio": minio.minio_endpoint, "minio_access_key": minio.minio_access_key,
        "minio_secret_key": minio.minio_secret_key, "bucket": TEST_BUCKET, **extra,
    })


@pytest.fixture(scope="module")
def ledger_cluster(kafka, minio, tmp_path_factory) -> Iterator[tuple[Settings, Settings]]:
    """``(settings the cluster was started with, settings for clients)``."""
    s = _settings(kafka, minio, tmp_path_factory.mktemp("sfaas-home"))
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        yield s, cluster.cluster_settings(s)[1]
    finally:
        cluster.down(s)
        rounds_remote(s, "ledger").destroy()
        for op in ledger.app.operators:
            for p in range(PARTITIONS):
                store_remote(s, "ledger", op, p).destroy()


async def _wait_rounds(rounds: Rounds, above: int, timeout: float = 60.0) -> list[int]:
    """Wait until a round with id > ``above`` is published; returns the retained ids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ids = await asyncio.to_thread(rounds.ids)
        if ids and ids[-1] > above:
            return ids
        await asyncio.sleep(0.2)
    raise AssertionError(f"no snapshot round above {above} published within {timeout} s")


async def _started_consumer(s: Settings, committed: bool, patience: float = 90.0) -> AIOKafkaConsumer:
    """A started consumer of ``s.kafka``, tried again while no broker answers its bootstrap
    (a chaos run's last fault may have stopped one broker while another restarts: the
    nemesis seed 99017787 read the replies as every broker refused or closed, once)."""
    deadline = time.monotonic() + patience
    while True:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.kafka, enable_auto_commit=False,
            isolation_level="read_committed" if committed else "read_uncommitted")
        try:
            await consumer.start()
            return consumer
        except KafkaConnectionError:
            await consumer.stop()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


async def _read_topic(s: Settings, topic: str, partitions: int,
                      committed: bool = False) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of ``topic``: partition → [(offset, value)]; ``committed``: as a
    ``read_committed`` reader sees it (the egress topic's replies are transactional)."""
    consumer = await _started_consumer(s, committed)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                out[tp.partition] += [(r.offset, r.value) for r in records]
        return out
    finally:
        await consumer.stop()


async def _ingress_requests(s: Settings, app: str = "ledger") -> dict[int, list[tuple[int, wire.Request]]]:
    """Every request in the ingress topic: partition → [(offset, request)]."""
    raw = await _read_topic(s, s.topics(app)[0], PARTITIONS)
    return {p: [(o, wire.Request.decode(v)) for o, v in recs] for p, recs in raw.items()}


def epoch_records(raw: list[tuple[int, bytes]]) -> list[tuple[int, EpochRecord]]:
    """The epoch records of the whole log's ``(offset, value)`` that count, as a recovery
    replays them: no cut or fence records; none a fence voids (``sfaas.runtime.epochlog.
    live``: sent before its writer's fence and landed after it, so no recovery replayed
    it); and a second copy of the same bytes only once, at its first offset — a record
    sent again through a new producer can land twice, the retired producer delivering its
    copy late, even many epochs later (the nemesis saw epoch 536's land after 596's); a
    recovery keys the records it replays by epoch (``worker.clients``). Both are printed."""
    decoded = [(off, decode_record(v)) for off, v in raw]
    kept = live(decoded, raw[0][0] if raw else 0)
    counted, value_at = {off for off, _ in kept}, dict(raw)
    void = [(off, r.epoch, r.worker, r.fence) for off, r in decoded
            if isinstance(r, EpochRecord) and off not in counted]
    first: dict[tuple[int, int], bytes] = {}
    out, copies = [], []
    for off, r in kept:
        if not isinstance(r, EpochRecord):
            continue
        if first.get((r.epoch, r.worker)) == value_at[off]:
            copies.append((off, r.epoch, r.worker))
            continue
        first.setdefault((r.epoch, r.worker), value_at[off])
        out.append((off, r))
    if void or copies:
        print(f"epoch log: void records (offset, epoch, worker, fence) {void[:10]}; second "
              f"copies (offset, epoch, worker) {copies[:10]}")
    return out


def logged_request(rec: EpochRecord, tid: int, p: int, o: int,
                   by_pos: dict[tuple[int, int], wire.Request]) -> wire.Request:
    """The request of ``rec``'s batch entry ``(tid, p, o)``: from the ingress topic, or, a
    direct one, from the record itself."""
    if o >= 0:
        return by_pos[(p, o)]
    return wire.Request.decode(dict(rec.direct)[tid])


async def _replay(m: RoundManifest, records: list[tuple[int, EpochRecord]],
                  requests: dict[int, list[tuple[int, wire.Request]]], directory: Path,
                  maps: Sequence[tuple[int, list[int]]] = (),
                  ) -> tuple[dict[str, tuple[bool, Any]], dict[str, int], dict[str, int]]:
    """Re-execute the logged epochs after round ``m`` on its restored stores (in
    ``directory``) with the shared epoch loop; the fates by request id, then the state.
    ``maps``: ``(epoch, owners)`` — the partition map epochs after ``epoch`` ran under (rescales)."""
    fates, items = await replay_log(ledger.app, m, records, requests, directory, maps)
    return fates, items["accounts"], items["counters"]


async def replay_log(app: App, m: RoundManifest, records: list[tuple[int, EpochRecord]],
                     requests: dict[int, list[tuple[int, wire.Request]]], directory: Path,
                     maps: Sequence[tuple[int, list[int]]] = (), store: str = "lsm",
                     ) -> tuple[dict[str, tuple[bool, Any]], dict[str, dict[str, Any]]]:
    """:func:`_replay` of any app (``sfaas replay``'s re-executor,
    :func:`sfaas.testing.replay.replay_log`): the fates by request id, and every operator's
    state. No request id commits twice in the whole log (a copy run under another tid
    after its first run aborted on a conflict is one run; one committed twice is a double)."""
    # every record of a later epoch is at or after the round's epoch-log position
    assert all(off >= m.epoch_log for off, rec in records if rec.epoch > m.epoch)
    by_pos = {(p, o): req for p, reqs in requests.items() for o, req in reqs}
    out = await serial_replay(app, m, [rec for _, rec in records], by_pos, directory, maps=maps,
                              store=store)
    assert not out.doubled, (f"requests committed twice (request id, epoch): {out.doubled[:5]}; "
                             f"(epoch, partition, offset) of the first and second commit: "
                             f"{out.origins[:5]}")
    return out.fates, out.state


def _restore(s: Settings, round_id: int, directory: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The accounts and counters of round ``round_id``, restored from MinIO into ``directory``."""
    stores = open_partition_stores(ledger.app, str(directory), range(PARTITIONS), PARTITIONS, store="lsm",
                                   remote_of=lambda op, p: store_remote(s, "ledger", op, p))
    try:
        values: dict[str, dict[str, int]] = {"accounts": {}, "counters": {}}
        for (op, _), store in stores.items():
            info = store.restore(round_id)
            assert info.snapshot_id == round_id
            for k, v in store.items():
                from sfaas.runtime.codec import unpack

                values[op][k.decode()] = int(unpack(v))
        return values["accounts"], values["counters"]
    finally:
        stores.close()


def _check_round(m: RoundManifest, accounts: dict[str, int], counters: dict[str, int],
                 requests: dict[int, list[tuple[int, wire.Request]]]) -> None:
    """Round ``m`` (restored: ``accounts``, ``counters``) is a consistent cut that matches its offsets."""
    assert {(st.operator, st.partition) for st in m.stores} == {
        (op, p) for op in ("accounts", "counters") for p in range(PARTITIONS)
    }
    assert sorted(m.ingress) == list(range(PARTITIONS)) and m.workers == 2
    # a consistent cut: no transfer is half in the round, no money appears or vanishes
    assert sum(accounts.values()) == START * len(ACCOUNTS), (m.round, accounts)
    assert min(accounts.values()) >= 0
    # each counter holds exactly the bumps before the round's ingress position (+ skips)
    for k in COUNTERS:
        p = partition_of("counters", k, PARTITIONS)
        skip = set(m.skip.get(p, []))
        want = sum(1 for off, req in requests[p]
                   if req.operator == "counters" and req.key == k and (off < m.ingress[p] or off in skip))
        assert counters.get(k, 0) == want, (m.round, k, counters.get(k), want, m.ingress, m.skip)


async def test_rounds_under_load_are_consistent_cuts_that_match_their_offsets(ledger_cluster, tmp_path) -> None:
    s, cs = ledger_cluster
    rounds = Rounds(rounds_remote(s, "ledger"))
    async with Client("ledger", settings=cs, direct_calls=False) as c:  # (rounds vs ingress)
        await asyncio.gather(*(c.call("accounts", a, "deposit", START) for a in ACCOUNTS))
        # a round in flight now may have started before the deposits: check later ones only
        published = await asyncio.to_thread(rounds.ids)
        first_checked = (published[-1] if published else 0) + 2

        rnd = random.Random(7)
        bumps: dict[str, list[int]] = {k: [] for k in COUNTERS}
        futs: list[tuple[str, asyncio.Future[wire.Reply]]] = []
        t_end = time.monotonic() + 4.0
        # ~4 s of load, ~250 requests/s, and on until a round past ``first_checked + 1`` is
        # published: a round is taken only if something committed since the last one, so
        # one that cut after the load's last commit is the last (slow uploads on a cold
        # MinIO made only three rounds in the 4 s: CI, session 17)
        newest, polled = 0, t_end
        while time.monotonic() < t_end or newest <= first_checked + 1:
            if time.monotonic() > t_end + 60:
                raise AssertionError(f"no snapshot round above {first_checked + 1} published "
                                     f"within 60 s of load past the first 4 s")
            if time.monotonic() >= polled:
                newest = max(await asyncio.to_thread(rounds.ids), default=0)
                polled = time.monotonic() + 0.25
            for _ in range(5):
                a, b = rnd.sample(ACCOUNTS, 2)
                futs.append(("t", await c.submit("accounts", a, "transfer", b, rnd.randint(1, 300))))
                k = rnd.choice(COUNTERS)
                futs.append((k, await c.submit("counters", k, "bump")))
            await asyncio.sleep(0.02)
        replies = await asyncio.wait_for(asyncio.gather(*(f for _, f in futs)), 120)
        for (what, _), reply in zip(futs, replies, strict=True):
            if what != "t":
                assert reply.ok, reply
                bumps[what].append(reply.value)
            elif not reply.ok:
                assert "insufficient funds" in (reply.reason or ""), reply
        requests = await _ingress_requests(cs)
        await _wait_rounds(rounds, first_checked + 1)
    # every bump answered once, with the values 0..n-1 (no failure here: nothing repeats)
    for k, vals in bumps.items():
        assert sorted(vals) == list(range(len(vals))), k

    # Rounds go on every 0.5 s and only 2 are retained, so a round may be collected while it
    # is checked: check the newest first, skip one that is no longer listed when reading it
    # fails, and require two rounds checked (a round still listed must read and restore).
    manifests: dict[int, RoundManifest] = {}
    for _ in range(10):
        ids = await asyncio.to_thread(rounds.ids)
        for round_id in [r for r in reversed(ids) if r >= first_checked and r not in manifests]:
            try:
                m = await asyncio.to_thread(rounds.read, round_id)
                accounts, counters = await asyncio.to_thread(_restore, s, round_id, tmp_path / f"r{round_id}")
            except Exception:
                if round_id in await asyncio.to_thread(rounds.ids):
                    raise
                continue  # collected while it was read: a newer one is checked instead
            _check_round(m, accounts, counters, requests)
            manifests[round_id] = m
        if len(manifests) >= 2:
            break
        await _wait_rounds(rounds, max(ids))
    assert len(manifests) >= 2, f"fewer than two rounds checked: {sorted(manifests)} (first checked {first_checked})"

    # deterministic replay: the epoch log after the first checked round, re-executed on that
    # round's state, gives every request exactly the reply its client got, and today's state
    raw = await _read_topic(cs, cs.epoch_log_topic("ledger"), 1)
    records = epoch_records(raw[0])
    assert [rec.epoch for _, rec in records] == sorted(rec.epoch for _, rec in records)
    first = min(manifests)
    fates, accounts, counters = await _replay(manifests[first], records, requests, tmp_path / f"r{first}")
    got = {r.rid: r for r in replies}
    replayed = [rid for rid in fates if rid in got]
    assert len(replayed) > 50, len(replayed)
    for rid in replayed:
        ok, value = fates[rid]
        reply = got[rid]
        assert ok == reply.ok and (value if ok else list(value)) == (
            reply.value if ok else [reply.error_type, reply.reason]), (rid, fates[rid], reply)
    async with Client("ledger", settings=cs) as c:
        now_accounts = dict(zip(ACCOUNTS, await asyncio.gather(*(c.call("accounts", a, "balance") for a in ACCOUNTS)),
                                strict=True))
    assert accounts == now_accounts
    assert counters == {k: len(v) for k, v in bumps.items() if v}


async def test_retention_keeps_the_newest_rounds_and_collects_older_files(ledger_cluster, monkeypatch, capsys) -> None:
    s, cs = ledger_cluster
    rounds = Rounds(rounds_remote(s, "ledger"))
    start = (await asyncio.to_thread(rounds.ids) or [0])[-1]
    async with Client("ledger", settings=cs) as c:
        for i in range(3):  # a change per round, so each interval takes one
            await c.call("counters", f"gc-{i}", "bump")
            start = (await _wait_rounds(rounds, start))[-1]
    ids = await asyncio.to_thread(rounds.ids)
    last: RoundManifest = await asyncio.to_thread(rounds.read, ids[-1])  # at once: rounds go on
    assert len(ids) == s.snapshot_retain and ids == sorted(ids)
    for dropped in range(1, ids[0]):
        assert rounds.remote.get_blob(f"round-{dropped:012d}") is None
    assert last.bytes_uploaded > 0 and last.created >= last.started
    # each store keeps only retained rounds' snapshots, and (once the last round's gc ran;
    # no upload is in flight: nothing changed since) only the files they reference
    for op in ("accounts", "counters"):
        for p in range(PARTITIONS):
            remote = store_remote(s, "ledger", op, p)
            deadline = time.monotonic() + 15
            while True:
                snaps = await asyncio.to_thread(remote.list_snapshots)
                refs: set[str] = set()
                try:
                    for x in snaps:
                        refs |= set((await asyncio.to_thread(remote.read_manifest, x)).files)
                except SnapshotNotFoundError:  # collected since the listing: the gc is running, look again
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.3)
                    continue
                stray = set(await asyncio.to_thread(remote.list_files)) - refs
                if (set(snaps) <= set(ids) and not stray) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.3)
            assert set(snaps) <= set(ids), (op, p, snaps, ids)
            assert not stray, (op, p, stray)

    # what `sfaas snapshots` shows is what is retained
    from launcher import main

    for name, value in (("MINIO", s.minio), ("MINIO_ACCESS_KEY", s.minio_access_key),
                        ("MINIO_SECRET_KEY", s.minio_secret_key), ("BUCKET", s.bucket)):
        monkeypatch.setenv(f"SFAAS_{name}", value)
    capsys.readouterr()
    assert main(["snapshots", "--namespace", s.namespace, "--app", "ledger", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["round"] for r in listed] == ids
    assert listed[-1]["partitions"] == list(range(PARTITIONS)) and listed[-1]["stores"] == 2 * PARTITIONS
    assert main(["snapshots", "--namespace", s.namespace, "--app", "ledger"]) == 0
    table = capsys.readouterr().out
    assert table.startswith(" ROUND") and len(table.splitlines()) == 1 + len(ids)
    assert main(["snapshots", "--namespace", s.namespace, "--app", "nothing-here"]) == 0
    assert "no complete snapshot round of app 'nothing-here'" in capsys.readouterr().out


def test_transactions_go_on_while_minio_is_unreachable(kafka, tmp_path) -> None:
    from tests.conftest import Endpoints

    nowhere = Endpoints(kafka.kafka_bootstrap, "127.0.0.1:1", "sfaas", "not-a-real-secret-xyz")
    s = _settings(kafka, nowhere, tmp_path / "home")
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]

        async def load() -> list[int]:
            async with Client("ledger", settings=cs) as c:
                out = []
                for _ in range(8):  # spread over > 2 round intervals
                    out.append(await c.call("counters", "c", "bump"))
                    await asyncio.sleep(0.5)
                return out

        assert asyncio.run(load()) == list(range(8))
        coord_log = Path(cluster.state_dir(s) / "coordinator.log")
        deadline = time.monotonic() + 30
        while "snapshot round" not in coord_log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        text = coord_log.read_text()
        assert "snapshot round 1 failed" in text or "cannot read the published snapshot rounds" in text, text[-3000:]
        assert "not-a-real-secret-xyz" not in text
        assert all(p.alive for p in cluster.ps(s))
    finally:
        cluster.down(s)
    counts = Counter(p.role for p in cluster.ps(s) if p.alive)
    assert not counts
