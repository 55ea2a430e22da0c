"""The network between simulated processes: byte streams in memory (issue 51).

:class:`SimNetwork` is the switch; ``net.port(name)`` is one process's network port
(``sfaas.runtime.ports.NetworkPort``): ``start_server(on_connect, host, port)`` listens on
``(host, port)`` (0: the next free port, counted from :data:`FIRST_PORT`), and
``open_connection(host, port)`` returns an ``asyncio.StreamReader`` and a writer with
asyncio's ``StreamWriter`` surface — refused (``ConnectionRefusedError``) when nobody
listens there or the two processes are cut apart. ``sfaas.runtime.channels`` runs its
shared-secret handshake over these streams as over TCP: the simulation gives streams,
never a way around the authentication.

Each direction of a connection is a :class:`_Pipe`: bytes written arrive at the reader
after a delay drawn from the seeded ``random.Random`` (``delay``: the range, seconds), in
the order written (a chunk never overtakes the one before it) — TCP's guarantee. Time is
the loop's, so on ``sfaas.sim.clock.VirtualLoop`` a run is a function of its seed.

Faults: :meth:`SimNetwork.cut` (a partition between two processes: their connections
break — the readers see the end of the stream, writes are dropped, a drain raises
``ConnectionResetError`` — and new connections between them are refused until
:meth:`SimNetwork.heal`), :meth:`SimNetwork.crash` (every connection and server of a
process gone, as when it dies), and :meth:`SimNetwork.slow` (a slow link: every chunk
between two processes arrives later by a fixed extra delay, still in order, until
:meth:`SimNetwork.unslow`).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

__all__ = ["SimNetwork", "SimNetworkPort", "SimServer", "FIRST_PORT"]

#: The first port a server on port 0 gets (then the next one, and so on).
FIRST_PORT = 40_000

Connected = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _handle(on_connect: Connected, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    await on_connect(reader, writer)


class _Pipe:
    """One direction of a connection: what the writer wrote reaches ``reader`` after a
    delay, in order; :meth:`cut` ends it at once (what is in flight is lost)."""

    def __init__(self, net: SimNetwork, reader: asyncio.StreamReader,
                 link: frozenset[str]) -> None:
        self._net = net
        self.reader = reader
        #: the two processes the connection joins (what :meth:`SimNetwork.slow` names)
        self.link = link
        self._flight: deque[tuple[float, bytes | None]] = deque()  # (due, data; None: EOF)
        self._timer: asyncio.TimerHandle | None = None
        self.in_flight = 0
        self.closed = False  # the writer closed (an EOF follows what is in flight)
        self.broken = False  # cut: nothing more arrives
        self._drained = asyncio.Event()
        self._drained.set()

    def send(self, data: bytes | None) -> None:
        if self.broken or (self.closed and data is not None):
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + self._net.draw_delay() + self._net.extra(self.link)
        if self._flight:  # (in order: never before the chunk ahead, slowed or not)
            due = max(due, self._flight[-1][0])
        self._flight.append((due, data))
        if data is not None:
            self.in_flight += len(data)
            self._drained.clear()
        if self._timer is None:
            self._timer = loop.call_at(due, self._deliver)

    def _deliver(self) -> None:
        self._timer = None
        if self.broken:
            return
        now = asyncio.get_running_loop().time()
        while self._flight and self._flight[0][0] <= now:
            _, data = self._flight.popleft()
            if data is None:
                self.reader.feed_eof()
            else:
                self.in_flight -= len(data)
                self.reader.feed_data(data)
        if not self.in_flight:
            self._drained.set()
        if self._flight:
            self._timer = asyncio.get_running_loop().call_at(self._flight[0][0], self._deliver)

    def cut(self) -> None:
        if self.broken:
            return
        self.broken = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._flight.clear()
        self.in_flight = 0
        self._drained.set()
        if not self.reader.at_eof():
            self.reader.feed_eof()

    async def drained(self) -> None:
        await self._drained.wait()


class _Transport:
    """What ``sfaas.runtime.channels.Channel`` asks a writer's transport: its buffer."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # (a simulated pipe holds what is in flight, whatever the limits)

    def get_write_buffer_size(self) -> int:
        return self._pipe.in_flight

    def is_closing(self) -> bool:
        return self._pipe.closed or self._pipe.broken


class _Writer:
    """asyncio's ``StreamWriter`` surface over a :class:`_Pipe`."""

    def __init__(self, out: _Pipe, back: _Pipe, peer: tuple[str, int]) -> None:
        self._out = out
        self._back = back  # (closing ends our side of the other direction too)
        self._peer = peer
        self.transport = _Transport(out)

    def write(self, data: bytes) -> None:
        self._out.send(bytes(data))

    def writelines(self, data: Any) -> None:
        for chunk in data:
            self.write(chunk)

    async def drain(self) -> None:
        if self._out.broken:
            raise ConnectionResetError("Connection lost (simulated network cut)")
        await asyncio.sleep(0)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self._out.send(None)
        self._out.closed = True

    def close(self) -> None:
        if not self._out.closed:
            self.write_eof()
        self._back.cut()  # (nothing more is read on this side)

    def is_closing(self) -> bool:
        return self._out.closed or self._out.broken

    async def wait_closed(self) -> None:
        await asyncio.sleep(0)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peer if name == "peername" else default


class _Socket:
    def __init__(self, address: tuple[str, int]) -> None:
        self._address = address

    def getsockname(self) -> tuple[str, int]:
        return self._address


class SimServer:
    """A listening server (asyncio's ``Server`` surface the product uses)."""

    def __init__(self, net: SimNetwork, owner: str, address: tuple[str, int],
                 on_connect: Connected) -> None:
        self._net = net
        self.owner = owner
        self.address = address
        self.on_connect = on_connect
        #: the context of the task that listened: each connection's handler runs in it
        #: (the server's process's, not the connecting one's: ``sfaas.runtime.ports.current``)
        self.context = contextvars.copy_context()
        self.sockets = [_Socket(address)]
        self.serving = True

    def close(self) -> None:
        if self.serving:
            self.serving = False
            self._net.unlisten(self)

    def is_serving(self) -> bool:
        return self.serving

    async def wait_closed(self) -> None:
        await asyncio.sleep(0)


class _Connection:
    def __init__(self, a: str, b: str, pipes: tuple[_Pipe, _Pipe]) -> None:
        self.ends = (a, b)
        self.pipes = pipes


class SimNetwork:
    """The switch between simulated processes (see the module docstring)."""

    def __init__(self, rng: random.Random, delay: tuple[float, float] = (0.0001, 0.0005),
                 ) -> None:
        self._rng = rng
        self.delay = delay
        self._servers: dict[tuple[str, int], SimServer] = {}
        self._next_port = FIRST_PORT
        self._connections: list[_Connection] = []
        self._cuts: set[frozenset[str]] = set()
        #: slow links: the two processes → the seconds every chunk between them takes more
        self._slow: dict[frozenset[str], float] = {}
        #: connections made, refused (nobody listening, or cut apart)
        self.connected = 0
        self.refused = 0

    def draw_delay(self) -> float:
        lo, hi = self.delay
        return lo if hi <= lo else self._rng.uniform(lo, hi)

    def port(self, name: str) -> SimNetworkPort:
        """The network port of the process ``name``."""
        return SimNetworkPort(self, name)

    # -- faults ------------------------------------------------------------------------------
    def cut(self, a: str, b: str) -> None:
        """Partition ``a`` from ``b``: their connections break, new ones are refused."""
        self._cuts.add(frozenset((a, b)))
        for conn in list(self._connections):
            if frozenset(conn.ends) == frozenset((a, b)):
                self._break(conn)

    def cut_apart(self, a: str, b: str) -> bool:
        """Are ``a`` and ``b`` cut apart now?"""
        return frozenset((a, b)) in self._cuts

    def heal(self, a: str, b: str) -> None:
        """End the partition between ``a`` and ``b`` (broken connections stay broken)."""
        self._cuts.discard(frozenset((a, b)))

    def slow(self, a: str, b: str, extra: float) -> None:
        """Slow the link between ``a`` and ``b``: every chunk either sends to the other
        from now on — on the connections they have and the ones they make, a connect's
        first packet included — arrives ``extra`` seconds later than it would, until
        :meth:`unslow`. Still in order: a chunk sent once the link is fast again arrives
        after the slowed ones ahead of it, as on TCP."""
        assert a != b and extra >= 0, (a, b, extra)
        self._slow[frozenset((a, b))] = extra

    def unslow(self, a: str, b: str) -> None:
        """The link between ``a`` and ``b`` is fast again (for what is sent from now on)."""
        self._slow.pop(frozenset((a, b)), None)

    def extra(self, link: frozenset[str]) -> float:
        """The seconds a chunk sent now on ``link`` takes more than the drawn delay."""
        return self._slow.get(link, 0.0) if self._slow else 0.0

    def connect_extra(self, client: str, host: str, port: int) -> float:
        """The seconds ``client``'s connect to ``(host, port)`` takes more (a slow link)."""
        server = self._servers.get((host, port)) if self._slow else None
        return 0.0 if server is None else self.extra(frozenset((client, server.owner)))

    def crash(self, name: str) -> None:
        """``name`` died: its servers stop listening and its connections break."""
        for server in [s for s in self._servers.values() if s.owner == name]:
            server.close()
        for conn in list(self._connections):
            if name in conn.ends:
                self._break(conn)

    def _break(self, conn: _Connection) -> None:
        for pipe in conn.pipes:
            pipe.cut()
        self._connections.remove(conn)

    # -- what the ports do --------------------------------------------------------------------
    def listen(self, owner: str, on_connect: Connected, host: str, port: int) -> SimServer:
        if port == 0:
            while (host, self._next_port) in self._servers:
                self._next_port += 1
            port = self._next_port
            self._next_port += 1
        if (host, port) in self._servers:
            raise OSError(98, f"address already in use: {host}:{port} (simulated)")
        server = self._servers[(host, port)] = SimServer(self, owner, (host, port), on_connect)
        return server

    def unlisten(self, server: SimServer) -> None:
        if self._servers.get(server.address) is server:
            del self._servers[server.address]

    def connect(self, client: str, host: str, port: int,
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        server = self._servers.get((host, port))
        if server is None or frozenset((client, server.owner)) in self._cuts:
            self.refused += 1
            raise ConnectionRefusedError(111, f"connect to {host}:{port} refused (simulated)")
        self.connected += 1
        c_reader, s_reader = asyncio.StreamReader(), asyncio.StreamReader()
        link = frozenset((client, server.owner))
        to_server, to_client = _Pipe(self, s_reader, link), _Pipe(self, c_reader, link)
        client_addr = (client, self.connected)
        c_writer = _Writer(to_server, to_client, (host, port))
        s_writer = _Writer(to_client, to_server, client_addr)
        self._connections.append(_Connection(client, server.owner, (to_server, to_client)))
        task = asyncio.get_running_loop().create_task(
            _handle(server.on_connect, s_reader, cast(asyncio.StreamWriter, s_writer)),
            context=server.context)
        _HANDLERS.add(task)
        task.add_done_callback(_HANDLERS.discard)
        return c_reader, cast(asyncio.StreamWriter, c_writer)


#: the servers' connection handlers running (held: the loop keeps weak references)
_HANDLERS: set[asyncio.Task[None]] = set()


class SimNetworkPort:
    """One process's network port (``sfaas.runtime.ports.NetworkPort``) on a
    :class:`SimNetwork`."""

    def __init__(self, net: SimNetwork, name: str) -> None:
        self._net = net
        self.name = name
        #: the process died (:meth:`kill`): it connects and listens no more
        self.dead = False

    def kill(self) -> None:
        """The process died: its servers stop, its connections break, and it makes no new
        one (a task of it the crash did not end yet must not reach the next incarnation's
        peers under the same name)."""
        self.dead = True
        self._net.crash(self.name)

    def _alive(self) -> None:
        if self.dead:
            raise ConnectionRefusedError(111, f"{self.name} is dead (simulated)")

    async def open_connection(self, host: str,
                              port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self._alive()
        # (the SYN's way there)
        await asyncio.sleep(self._net.draw_delay() + self._net.connect_extra(self.name, host, port))
        self._alive()
        return self._net.connect(self.name, host, port)

    async def start_server(self, on_connect: Connected, host: str, port: int) -> SimServer:
        self._alive()
        return self._net.listen(self.name, on_connect, host, port)
