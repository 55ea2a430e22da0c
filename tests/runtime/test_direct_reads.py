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
                t_end = time.monotonic() + 15
                while time.monotonic() < t_end:
                    if not killed and time.monotonic() >= t_kill:
                        victim = rnd.choice([x for x in cluster.ps(s) if x.role == "worker"
                                             and x.alive])
                        os.kill(victim.pid, signal.SIGKILL)
                        killed = True
                    a = rnd.choice(ACCOUNTS)
                    assert await c.get("accounts", a) == want[a], a
                    reads += 1
                assert killed and reads > 50
                assert c.direct.fell_back > 0, "no read went through Kafka during the recovery"
                assert c.direct.direct > len(ACCOUNTS), "the direct path never came back"

        asyncio.run(go())
    except BaseException:
        print(log_tails(s))
        raise
    finally:
        cluster.down(s)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)
