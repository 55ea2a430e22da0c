"""Direct state reads on a real cluster (``sfaas.reads``, ``worker.protocols.reads``,
``coordinator.protocols.reads``): the owning worker answers over an authenticated channel;
it turns away what it must not answer (another worker's partition, anything during a
recovery), names bad reads, drops a client that sends anything else — and a client keeps
getting the committed values while a worker is SIGKILLed and the cluster recovers
(``SFAAS_CHAOS_SEED`` reproduces the kill's timing)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas.client import Client
from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, wire
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.protocols.reads import NOT_HERE
from tests.runtime.test_recovery import chaos_settings, log_tails

SEED = int(os.environ.get("SFAAS_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
ACCOUNTS = [f"direct-{i}" for i in range(40)]


@pytest.mark.timeout(300)
def test_direct_reads_answer_refuse_and_survive_a_worker_kill(kafka: Any, minio: Any,
                                                               tmp_path: Path) -> None:
    print(f"seed {SEED}")
    rnd = random.Random(SEED)
    s = chaos_settings(kafka, minio, tmp_path)
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]

        async def go() -> None:
            async with Client("ledger", settings=cs, timeout=120) as c:
                await asyncio.gather(*(c.call("accounts", a, "deposit", i + 1)
                                       for i, a in enumerate(ACCOUNTS)))
                want = {a: i + 1 for i, a in enumerate(ACCOUNTS)}
                assert [await c.get("accounts", a) for a in ACCOUNTS] == list(want.values())
                assert c.direct is not None and c.direct.direct == len(ACCOUNTS)

                # a raw client channel to the worker owning ACCOUNTS[0]'s partition
                where = await channels.connect(*_split(cs.coordinator), cs.secret)
                where.send(wire.Where("ledger"))
                placement = (await where.recv())[0]
                assert isinstance(placement, wire.Placement) and len(placement.peers) == 2
                where.send(wire.Where("another-app"))
                assert (await where.recv())[0] == wire.Placement([], [])
                where.close()
                p = partition_of("accounts", ACCOUNTS[0], c.partitions)
                owner = placement.owners[p]
                other = next(q for q, o in enumerate(placement.owners) if o != owner)
                peer = placement.peers[owner]
                chan = await channels.connect(peer.host, peer.port, cs.secret)
                chan.send(wire.Read(1, "accounts", p, ACCOUNTS[0], "", 0))
                chan.send(wire.Read(2, "accounts", other, "", "", 10))
                chan.send(wire.Read(3, "nope", p, ACCOUNTS[0], "", 0))
                chan.send(wire.Read(4, "accounts", p, "", "", 0))
                wrong_part = next(q for q in range(c.partitions) if q != p and
                                  placement.owners[q] == owner)
                chan.send(wire.Read(5, "accounts", wrong_part, ACCOUNTS[0], "", 0))
                got: dict[int, wire.ReadReply] = {}
                while len(got) < 5:
                    for m in await asyncio.wait_for(chan.recv(), 10):
                        assert isinstance(m, wire.ReadReply)
                        got[m.id] = m
                assert (got[1].ok, got[1].value) == (True, 1)
                assert (got[2].ok, got[2].error_type) == (False, NOT_HERE)
                assert (got[3].ok, got[3].error_type) == (False, "UnknownOperator")
                assert (got[4].ok, got[4].error_type) == (False, "BadArguments")
                assert "limit" in got[4].reason
                assert not got[5].ok and f"not in partition {wrong_part}" in got[5].reason
                chan.send(wire.Hello(0))  # not a read: the worker drops this client
                with pytest.raises(ChannelClosed):
                    await asyncio.wait_for(chan.recv(), 10)
                chan.close()

                # reads while a worker is killed and the cluster recovers: always the
                # committed values (the direct path steps aside during the recovery)
                await asyncio.sleep(1.5)  # a round holds the deposits
                t_kill = time.monotonic() + rnd.uniform(0.2, 1.0)
                killed = False
                reads = 0
                timeline: list[tuple[float, str]] = []  # (seconds since the kill, how read)
                t_end = time.monotonic() + 15
                while time.monotonic() < t_end:
                    if not killed and time.monotonic() >= t_kill:
                        victim = rnd.choice([x for x in cluster.ps(s) if x.role == "worker"
                                             and x.alive])
                        os.kill(victim.pid, signal.SIGKILL)
                        killed = True
                    a = rnd.choice(ACCOUNTS)
                    before = (c.direct.direct, c.direct.fell_back)
                    assert await c.get("accounts", a) == want[a], a
                    reads += 1
                    how = "direct" if c.direct.direct > before[0] else c.direct.why_not
                    if not timeline or timeline[-1][1] != how:  # (what a failure prints)
                        timeline.append((round(time.monotonic() - t_kill, 2), how))
                print(f"how the reads went since the kill (s, how): {timeline}")
                assert killed and reads > 50
                assert c.direct.fell_back > 0, "no read went through Kafka during the recovery"
                assert c.direct.direct > len(ACCOUNTS), \
                    f"the direct path never came back: {timeline}"

        asyncio.run(go())
    except BaseException:
        print(log_tails(s))
        raise
    finally:
        cluster.down(s)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@pytest.mark.timeout(60)
def test_a_lost_workers_address_is_asked_again_and_retried_soon() -> None:
    """After a worker is lost, its old address refuses: the client forgets the placement
    (the coordinator has the new one once it recovered) and retries the direct path after
    ``RETRY_FIRST`` — doubled with each failure in a row, up to ``RETRY_AFTER`` — not a flat
    5 s, and a read answered directly starts the count again (stand-ins for the
    coordinator and the worker on real authenticated channels)."""
    from sfaas.reads import RETRY_AFTER, RETRY_FIRST, DirectReads
    from sfaas.runtime.protocols.membership import Peer
    from sfaas.runtime.settings import Settings

    secret = "test-secret"

    async def go() -> None:
        asked: list[str] = []
        peers: list[Peer] = []

        async def coordinator(chan: channels.Channel) -> None:
            while True:
                for m in await chan.recv():
                    assert isinstance(m, wire.Where)
                    asked.append(m.app)
                    chan.send(wire.Placement(list(peers), [0]))

        async def worker(chan: channels.Channel) -> None:
            for m in await chan.recv():  # (one answer, then it is lost: the channel closes)
                assert isinstance(m, wire.Read)
                chan.send(wire.ReadReply(m.id, True, 7, "", ""))
            await asyncio.sleep(0.2)
            chan.close()

        coord = await channels.serve("127.0.0.1", 0, secret, coordinator)
        gone = await channels.serve("127.0.0.1", 0, secret, worker)
        gone_port = gone.sockets[0].getsockname()[1]
        gone.close()
        await gone.wait_closed()
        peers.append(Peer("127.0.0.1", gone_port))  # (the lost worker's old address)
        port = coord.sockets[0].getsockname()[1]
        dr = DirectReads(Settings.load({"coordinator": f"127.0.0.1:{port}",
                                        "secret": secret}), "app")
        try:
            offs = []
            for _ in range(5):  # refused each time: off for 0.25, 0.5, 1, 2, 4 s
                assert await dr.read("op", 0, "k") == (False, None)
                assert "cannot connect" in dr.why_not
                t0 = time.monotonic()
                while not dr.available:
                    await asyncio.sleep(0.01)
                offs.append(time.monotonic() - t0)
            want = [min(RETRY_AFTER, RETRY_FIRST * 2 ** i) for i in range(5)]
            # (the window opens inside the read, a moment before t0: hence - 0.05)
            assert all(w * 0.9 - 0.05 <= o <= w + 0.5
                       for o, w in zip(offs, want, strict=True)), (offs, want)
            assert len(asked) == 5, f"the placement was asked {len(asked)} times, not per failure"

            back = await channels.serve("127.0.0.1", 0, secret, worker)  # the recovered one
            peers[0] = Peer("127.0.0.1", back.sockets[0].getsockname()[1])
            assert await dr.read("op", 0, "k") == (True, 7) and dr.direct == 1
            back.close()
            await back.wait_closed()
            peers[0] = Peer("127.0.0.1", gone_port)  # (lost again, its channel closes)
            await asyncio.sleep(0.5)
            assert await dr.read("op", 0, "k") == (False, None)
            assert "cannot connect" in dr.why_not
            t0 = time.monotonic()
            while not dr.available:
                await asyncio.sleep(0.01)
            off = time.monotonic() - t0
            assert RETRY_FIRST * 0.9 - 0.05 <= off <= RETRY_FIRST + 0.5, \
                f"off {off:.2f} s after a direct answer: the count did not start again"
            for _ in range(1100):  # (an hour and a half of failures: 2 ** n overflowed)
                dr._off_until = 0.0
                assert await dr.read("op", 0, "k") == (False, None)
            assert not dr.available
        finally:
            await dr.close()
            coord.close()

    asyncio.run(go())
