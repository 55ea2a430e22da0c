"""Direct calls on a real cluster (``sfaas.direct``, ``worker.direct``): a client sends
transactions straight to the owning worker and gets each reply on its channel, and every
request runs once — a reply lost in transit is sent again to a copy, concurrent copies
share one run, workers SIGKILLed before or after an epoch is durable lose and double
nothing (``SFAAS_CHAOS_SEED`` reproduces the kills' timing) — while a client with another
secret, or a cluster without snapshot rounds, goes through Kafka instead."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgpack
import pytest

from launcher import cluster
from sfaas.client import Client
from sfaas.errors import AuthenticationError
from sfaas.runtime import channels, wire
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.protocols.reads import NOT_HERE
from tests.runtime.test_metrics import scrape, total
from tests.runtime.test_recovery import chaos_settings, log_tails

SEED = int(os.environ.get("SFAAS_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
KEYS = [f"dc-{i}" for i in range(12)]


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def _answers(chan: channels.Channel, n: int) -> list[wire.Reply]:
    got: list[wire.Reply] = []
    while len(got) < n:
        for m in await asyncio.wait_for(chan.recv(), 20):
            assert isinstance(m, wire.Answer), m
            got.append(wire.Reply.decode(m.reply))
    return got


async def _owner(cs: Any, key: str) -> tuple[Any, Any, int]:
    """The placement, the owner's address of ``key``'s partition, and the partition."""
    where = await channels.connect(*_split(cs.coordinator), cs.secret)
    where.send(wire.Where("ledger"))
    placement = (await asyncio.wait_for(where.recv(), 10))[0]
    where.close()
    assert isinstance(placement, wire.Placement)
    p = partition_of("counters", key, len(placement.owners))
    return placement, placement.peers[placement.owners[p]], p


def _bump(rid: str, key: str) -> bytes:
    return wire.Request(rid, "counters", key, "bump", [], 0, time.time()).encode()


@pytest.mark.timeout(300)
def test_copies_of_one_request_run_once_and_a_lost_reply_is_sent_again(
        kafka: Any, minio: Any, tmp_path: Path) -> None:
    s = chaos_settings(kafka, minio, tmp_path)
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]

        async def go() -> None:
            placement, peer, p = await _owner(cs, KEYS[0])
            # a reply lost in transit: the channel closes before the answer comes; the
            # copy sent on a new channel gets the one reply, and the counter moved once
            lost = await channels.connect(peer.host, peer.port, cs.secret)
            lost.send(wire.Submit(_bump("lost-1", KEYS[0])))
            await lost.drain()
            lost.close()
            await asyncio.sleep(0.5)
            chan = await channels.connect(peer.host, peer.port, cs.secret)
            chan.send(wire.Submit(_bump("lost-1", KEYS[0])))
            first = (await _answers(chan, 1))[0]
            assert (first.rid, first.ok, first.value) == ("lost-1", True, 0)
            chan.send(wire.Submit(_bump("lost-1", KEYS[0])))  # (not acknowledged yet)
            assert (await _answers(chan, 1))[0] == first
            # copies at once, on two channels: one run, the same reply to each
            other = await channels.connect(peer.host, peer.port, cs.secret)
            for c in (chan, other, chan):
                c.send(wire.Submit(_bump("twin-1", KEYS[0])))
            a, b = await _answers(chan, 2), await _answers(other, 1)
            assert {r.value for r in a + b} == {1} and all(r.rid == "twin-1" for r in a + b)
            # another worker's partition, and a malformed request: named, never run
            wrong = next(q for q, o in enumerate(placement.owners) if o != placement.owners[p])
            key = next(k for k in (f"w{i}" for i in range(1000))
                       if partition_of("counters", k, len(placement.owners)) == wrong)
            chan.send(wire.Submit(_bump("wrong-1", key)))
            chan.send(wire.Submit(msgpack.packb(["bad-1", 5, key, "bump", [], 0, 0.0])))
            not_here, bad = await _answers(chan, 2)
            assert (not_here.rid, not_here.error_type) == ("wrong-1", NOT_HERE)
            assert "does not own partition" in (not_here.reason or "")
            assert (bad.rid, bad.error_type) == ("bad-1", "BadRequest")
            assert "operator must be a str" in (bad.reason or "")
            chan.close()
            other.close()
            async with Client("ledger", settings=cs, timeout=60) as client:
                assert await client.call("counters", KEYS[0], "value") == 2
                assert await client.call("counters", key, "value") == 0
                assert client.calls is not None and client.calls.answered == 2
            # the workers' metrics count what they did with them
            scraped = [scrape(p.metrics) for p in cluster.ps(s) if p.role == "worker"]
            assert sum(total(m, "sfaas_direct_calls_copies_total") for m in scraped) == 4
            assert sum(total(m, "sfaas_direct_calls_turned_away_total") for m in scraped) == 1
            assert sum(total(m, "sfaas_direct_calls_taken_total") for m in scraped) == 4
            # another secret: refused, and the client's calls go through Kafka instead
            with pytest.raises(AuthenticationError):
                await channels.connect(peer.host, peer.port, "not-the-secret")
            async with Client("ledger", settings=dataclasses.replace(cs, secret="not-the-secret"),
                              timeout=60) as stranger:
                assert await stranger.call("counters", KEYS[1], "bump") == 0
                assert stranger.calls is not None
                assert (stranger.calls.answered, stranger.calls.fell_back) == (0, 1)

        asyncio.run(go())
    except BaseException:
        print(log_tails(s))
        raise
    finally:
        cluster.down(s)


@pytest.mark.timeout(400)
def test_direct_calls_run_once_while_workers_are_killed(kafka: Any, minio: Any,
                                                         tmp_path: Path) -> None:
    """Bumps from concurrent callers while workers are SIGKILLed at random moments —
    before a request's epoch is durable (the client resends it, it runs once) and after
    (the recovery's replay answers the copy): each key's replies are 0 … n-1, each once,
    and the key holds n."""
    print(f"seed {SEED}")
    rnd = random.Random(SEED)
    s = chaos_settings(kafka, minio, tmp_path)
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]
        replies: dict[str, list[int]] = defaultdict(list)

        async def caller(client: Client, t_end: float) -> None:
            while time.monotonic() < t_end:
                key = rnd.choice(KEYS)
                replies[key].append(await client.call("counters", key, "bump"))

        async def killer(t_end: float) -> int:
            kills = 0
            while time.monotonic() < t_end - 6:
                await asyncio.sleep(rnd.uniform(2.0, 4.0))
                procs = [x for x in cluster.ps(s) if x.role == "worker" and x.alive]
                if procs:
                    os.kill(rnd.choice(procs).pid, signal.SIGKILL)
                    kills += 1
            return kills

        async def go() -> None:
            async with Client("ledger", settings=cs, timeout=120) as client:
                t_end = time.monotonic() + 20
                *_, kills = await asyncio.gather(*(caller(client, t_end) for _ in range(8)),
                                                 killer(t_end))
                assert kills >= 2
                for key in KEYS:
                    got = sorted(replies[key])
                    assert got == list(range(len(got))), (key, got)
                    assert await client.call("counters", key, "value") == len(got), key
                calls = client.calls
                assert calls is not None
                print(f"{sum(map(len, replies.values()))} bumps, {kills} kills; direct "
                      f"{calls.answered}, resent {calls.resent}, through Kafka {calls.fell_back}")
                assert calls.answered > 100 and calls.resent > 0

        asyncio.run(go())
    except BaseException:
        print(log_tails(s))
        raise
    finally:
        cluster.down(s)


@pytest.mark.timeout(300)
def test_a_cluster_without_rounds_takes_calls_through_kafka(kafka: Any, minio: Any,
                                                             tmp_path: Path) -> None:
    s = chaos_settings(kafka, minio, tmp_path, snapshot_interval=0)
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]

        async def go() -> None:
            async with Client("ledger", settings=cs, timeout=60) as client:
                assert [await client.call("counters", KEYS[0], "bump") for _ in range(3)] \
                    == [0, 1, 2]
                assert client.calls is not None and client.calls.off
                assert client.calls.answered == 0

        asyncio.run(go())
    finally:
        cluster.down(s)
