"""The in-memory network (``sfaas.sim.network``): the product's authenticated channels over
it, order and delay, refusals, cuts and crashes, and the same trace twice for a seed."""

from __future__ import annotations

import asyncio

import pytest

from sfaas.errors import AuthenticationError, ChannelClosed
from sfaas.runtime import channels, wire
from sfaas.sim import clock
from sfaas.sim.network import FIRST_PORT, SimNetwork

SECRET = "s3cret"
SEEDS = range(10)


def _ping(i: int) -> wire.Message:
    return wire.Heartbeat(i, i, [], float(i))


async def _echo_server(net: SimNetwork, name: str = "server",
                       secret: str = SECRET) -> tuple[asyncio.Server, list[wire.Message]]:
    got: list[wire.Message] = []

    async def handler(chan: channels.Channel) -> None:
        while True:
            for msg in await chan.recv():
                got.append(msg)
                chan.send(msg)

    server = await channels.serve("sim", 0, secret, handler, network=net.port(name))
    return server, got


def _run(seed: int, body: object) -> object:
    print(f"seed {seed}")
    return clock.run(body(), seed=seed)  # type: ignore[operator]


@pytest.mark.parametrize("seed", SEEDS)
def test_channels_authenticate_and_keep_order_over_the_sim(seed: int) -> None:
    async def body() -> list[float]:
        loop = asyncio.get_running_loop()
        net = SimNetwork(loop.random, delay=(0.001, 0.01))  # type: ignore[attr-defined]
        server, got = await _echo_server(net)
        port = server.sockets[0].getsockname()[1]
        assert port == FIRST_PORT
        chan = await channels.connect("sim", port, SECRET, network=net.port("client"))
        t0, seen, times = loop.time(), [], []
        for i in range(50):
            chan.send(_ping(i))
            await asyncio.sleep(0)
        while len(seen) < 50:
            seen.extend(await chan.recv())
            times.append(loop.time() - t0)
        assert seen == [_ping(i) for i in range(50)] == got  # in order, each once
        assert times[0] >= 0.002  # a round trip: two delays at least
        chan.close()
        server.close()
        return times
    assert _run(seed, body) == _run(seed, body)  # the same run twice for a seed


@pytest.mark.parametrize("seed", SEEDS)
def test_a_wrong_secret_is_refused_on_the_sim_too(seed: int) -> None:
    async def body() -> None:
        net = SimNetwork(asyncio.get_running_loop().random)  # type: ignore[attr-defined]
        server, got = await _echo_server(net)
        port = server.sockets[0].getsockname()[1]
        before = channels.REJECTED["unauthenticated"]
        with pytest.raises(AuthenticationError):
            await channels.connect("sim", port, "not-the-secret", network=net.port("client"))
        await asyncio.sleep(1.0)
        assert channels.REJECTED["unauthenticated"] == before + 1
        assert got == []
    _run(seed, body)


@pytest.mark.parametrize("seed", SEEDS)
def test_nobody_listening_is_a_refusal(seed: int) -> None:
    async def body() -> None:
        net = SimNetwork(asyncio.get_running_loop().random)  # type: ignore[attr-defined]
        with pytest.raises(ConnectionRefusedError):
            await channels.connect("sim", 1234, SECRET, network=net.port("client"))
        server, _ = await _echo_server(net)
        server.close()
        with pytest.raises(ConnectionRefusedError):
            await channels.connect("sim", server.sockets[0].getsockname()[1], SECRET,
                                   network=net.port("client"))
        assert net.refused == 2
    _run(seed, body)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_cut_closes_both_ends_and_refuses_until_healed(seed: int) -> None:
    async def body() -> None:
        net = SimNetwork(asyncio.get_running_loop().random)  # type: ignore[attr-defined]
        server, _ = await _echo_server(net)
        port = server.sockets[0].getsockname()[1]
        chan = await channels.connect("sim", port, SECRET, network=net.port("client"))
        chan.send(_ping(1))
        assert await chan.recv() == [_ping(1)]
        net.cut("client", "server")
        with pytest.raises(ChannelClosed):
            await chan.recv()
        with pytest.raises(ConnectionRefusedError):
            await channels.connect("sim", port, SECRET, network=net.port("client"))
        other = await channels.connect("sim", port, SECRET, network=net.port("third"))
        other.send(_ping(2))
        assert await other.recv() == [_ping(2)]  # (only the two are cut apart)
        net.heal("client", "server")
        again = await channels.connect("sim", port, SECRET, network=net.port("client"))
        again.send(_ping(3))
        assert await again.recv() == [_ping(3)]
    _run(seed, body)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_crashed_process_stops_listening_and_its_peers_see_the_end(seed: int) -> None:
    async def body() -> None:
        net = SimNetwork(asyncio.get_running_loop().random)  # type: ignore[attr-defined]
        server, _ = await _echo_server(net)
        port = server.sockets[0].getsockname()[1]
        chan = await channels.connect("sim", port, SECRET, network=net.port("client"))
        net.crash("server")
        with pytest.raises(ChannelClosed):
            await chan.recv()
        with pytest.raises(ConnectionRefusedError):
            await channels.connect("sim", port, SECRET, network=net.port("client"))
    _run(seed, body)


def test_a_closed_channel_ends_the_peers_stream_after_what_was_sent() -> None:
    async def body() -> None:
        net = SimNetwork(asyncio.get_running_loop().random)  # type: ignore[attr-defined]
        received: list[wire.Message] = []
        done = asyncio.Event()

        async def handler(chan: channels.Channel) -> None:
            try:
                while True:
                    received.extend(await chan.recv())
            finally:
                done.set()

        server = await channels.serve("sim", 0, SECRET, handler, network=net.port("server"))
        chan = await channels.connect("sim", server.sockets[0].getsockname()[1], SECRET,
                                      network=net.port("client"))
        chan.send(_ping(7))
        chan.close()  # (flushes, then the end of the stream)
        await done.wait()
        assert received == [_ping(7)]
    _run(3, body)
