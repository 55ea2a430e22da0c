"""A worker's channels to its peers (``worker.links.PeerLinks``) follow its generation.

A peer refuses what a channel opened under an older generation of this worker sends
(``worker.calls.stale_generation``). After a rejoin (``worker.membership.Membership.rejoin``:
a new generation, the same slot) the worker must open fresh channels, or every call it
sends is refused and the cluster stalls — what the simulator found (issue 51,
``tests/sim/test_cluster.py``: a worker cut from the coordinator for a second)."""

from __future__ import annotations

import asyncio

from sfaas.runtime import channels, wire
from worker.links import PeerLinks

SECRET = "peer-links-secret-0123456789"


def test_a_new_generation_opens_fresh_channels_that_say_it() -> None:
    async def go() -> list[tuple[int, int]]:
        hellos: list[tuple[int, int]] = []

        async def peer(ch: channels.Channel) -> None:
            while True:
                for m in await ch.recv():
                    if isinstance(m, wire.Hello):
                        hellos.append((m.index, m.generation))

        server = await channels.serve("127.0.0.1", 0, SECRET, peer)
        port = server.sockets[0].getsockname()[1]
        links = PeerLinks(SECRET, 5.0)
        peers = [["127.0.0.1", 0], ["127.0.0.1", port]]
        try:
            links.generation = 7
            await links.connect(peers, 0)
            first = links.channels[1]
            await links.connect(peers, 0)  # same address, same generation: kept
            assert links.channels[1] is first
            links.generation = 8  # (a rejoin)
            await links.connect(peers, 0)
            assert links.channels[1] is not first and first.closed
            for _ in range(100):
                if len(hellos) == 2:
                    break
                await asyncio.sleep(0.01)
            return hellos
        finally:
            links.close()
            server.close()

    assert asyncio.run(asyncio.wait_for(go(), 30)) == [(0, 7), (0, 8)]
