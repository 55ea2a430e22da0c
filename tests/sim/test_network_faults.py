"""The simulator's slow link and wall-clock jump (issue 51 item 1): a slow link delays
every chunk between two processes by its extra seconds and keeps their order; a clock jump
moves one process's ``time()`` — not its ``monotonic()``, not another's — for good, its
restarts included."""

from __future__ import annotations

import asyncio
import faulthandler
from collections.abc import Iterator

import pytest

from sfaas.runtime import channels, wire
from sfaas.sim import clock
from sfaas.sim.network import SimNetwork
from sfaas.sim.ports import WALL_START, VirtualClockPort, WallClocks

SECRET = "s3cret"
#: what each chunk takes without a fault: the switch's delay range (seconds)
DELAY = (0.001, 0.01)


@pytest.fixture(autouse=True)
def _watchdog() -> Iterator[None]:
    faulthandler.dump_traceback_later(300, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _chunk(i: int) -> bytes:
    return b"%04d" % i


async def _arrivals(net: SimNetwork, name: str) -> tuple[int, dict[int, float]]:
    """A server of process ``name`` noting when each 4-byte chunk arrives: (port, times)."""
    loop = asyncio.get_running_loop()
    times: dict[int, float] = {}

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():
            try:
                chunk = await reader.readexactly(4)
            except asyncio.IncompleteReadError:
                return
            times[int(chunk)] = loop.time()

    server = await net.port(name).start_server(on_connect, "sim", 0)
    return server.sockets[0].getsockname()[1], times


@pytest.mark.parametrize("seed", range(5))
def test_a_slow_link_delays_its_chunks_by_the_extra_and_keeps_their_order(seed: int) -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        net = SimNetwork(loop.random, delay=DELAY)  # type: ignore[attr-defined]
        port, times = await _arrivals(net, "server")
        _, slowed = await net.port("client").open_connection("sim", port)
        _, other = await net.port("third").open_connection("sim", port)
        sent: dict[int, float] = {}

        def send(writer: asyncio.StreamWriter, i: int) -> None:
            writer.write(_chunk(i))
            sent[i] = loop.time()

        send(slowed, 0)
        await asyncio.sleep(0.1)
        net.slow("client", "server", 1.0)
        for i in range(1, 6):
            send(slowed, i)
            send(other, 100 + i)  # (another link: not slowed)
            await asyncio.sleep(0.05)
        net.unslow("client", "server")
        for i in range(6, 9):
            send(slowed, i)
        await asyncio.sleep(3.0)
        took = {i: times[i] - sent[i] for i in sent}
        assert [i for i in times if i < 100] == list(range(9))  # (in the order read)
        assert DELAY[0] <= took[0] <= DELAY[1]
        assert all(1.0 + DELAY[0] <= took[i] <= 1.0 + DELAY[1] for i in range(1, 6)), took
        assert all(DELAY[0] <= took[100 + i] <= DELAY[1] for i in range(1, 6)), took
        # sent once the link is fast again: behind the slowed chunks, never before them
        assert all(times[i] >= times[5] and took[i] > 0.8 for i in range(6, 9)), took
        # and what is sent later again takes the drawn delay only
        send(slowed, 9)
        await asyncio.sleep(0.1)
        assert DELAY[0] <= times[9] - sent[9] <= DELAY[1]
    clock.run(body(), seed=seed)


def _ping(i: int) -> wire.Message:
    return wire.Heartbeat(i, i, [], float(i))


def test_a_slow_link_slows_both_ways_and_the_connect_but_not_other_links() -> None:
    """The product's channels over a slowed link: the connect (its first packet and the
    handshake) and each round trip take the extra both ways; a third process's do not."""
    async def body() -> None:
        loop = asyncio.get_running_loop()
        net = SimNetwork(loop.random, delay=DELAY)  # type: ignore[attr-defined]

        async def echo(chan: channels.Channel) -> None:
            while True:
                for msg in await chan.recv():
                    chan.send(msg)

        server = await channels.serve("sim", 0, SECRET, echo, network=net.port("server"))
        port = server.sockets[0].getsockname()[1]
        net.slow("server", "client", 0.5)  # (either order of the two names)
        t0 = loop.time()
        chan = await channels.connect("sim", port, SECRET, network=net.port("client"))
        assert loop.time() - t0 >= 3 * 0.5  # (the SYN, the server's nonce, and its answer)
        fast = await channels.connect("sim", port, SECRET, network=net.port("third"))
        for c, least, most in ((chan, 1.0, 1.0 + 2 * DELAY[1]), (fast, 0.0, 2 * DELAY[1])):
            t0 = loop.time()
            c.send(_ping(1))
            assert await c.recv() == [_ping(1)]
            assert least + 2 * DELAY[0] <= loop.time() - t0 <= most
    clock.run(body(), seed=7)


def test_a_clock_jump_moves_that_process_time_only() -> None:
    """Through the ports :func:`sfaas.sim.ports.process_ports` gives: the jumped process's
    ``time()`` reads the offset from then on, its ``monotonic()`` does not move, another
    process's clock stays on time; the process's next incarnation keeps the offset (its
    machine's clock), and jumps add up."""
    async def body() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop)
        walls = WallClocks()
        coord = VirtualClockPort(loop.clock, walls.of("coordinator"))
        worker = VirtualClockPort(loop.clock, walls.of("worker-0"))
        await asyncio.sleep(5.0)
        assert coord.time() == worker.time() == WALL_START + 5.0 == WALL_START + loop.time()
        walls.jump("coordinator", -12.5)
        assert coord.time() == WALL_START + 5.0 - 12.5
        assert coord.monotonic() == worker.monotonic() == 5.0
        assert worker.time() == WALL_START + 5.0
        await asyncio.sleep(1.0)
        assert coord.time() == WALL_START + 6.0 - 12.5  # (it keeps the offset and runs on)
        restarted = VirtualClockPort(loop.clock, walls.of("coordinator"))
        assert restarted.time() == coord.time()
        walls.jump("coordinator", 30.0)
        assert restarted.time() == coord.time() == WALL_START + 6.0 + 17.5
        assert worker.time() == WALL_START + 6.0
    clock.run(body(), seed=1)
