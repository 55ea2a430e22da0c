"""The replica port's simulated filling: standbys follow their primaries' stores on the loop.

A real primary serves its ``Shipper`` s over ``tcp`` (``statestores.replica.tcp``: a
listening socket, a thread per follower, ``sendfile``), and each standby's ``Follower``
blocks on its own thread in the source. Neither can run on the virtual loop: threads run
in wall time, beside the loop, in an order no seed decides. Here instead:

- a primary's server (:meth:`SimReplicaPort.serve`) is an entry of the run's
  :class:`SimReplicas`, at an address of its own (ports from :data:`FIRST_PORT`, apart
  from the network's, so a run without standbys gets the ports it got before);
- a standby's source (:class:`SimSource`) reads the primary's shipper in this process,
  as ``statestores.replica.LocalSource`` does — a delivery's bodies copied from the staging
  links, a mark acknowledged once the follower asks for the next — but never waits: with
  nothing new it yields a ``Tip`` at once (``Shipper.stream(idle=0)``). It reaches the
  primary as a connection would: refused (``ConnectionRefusedError``) while no server
  listens there, its process is dead or the two processes are cut apart, and a stream
  ends (``ConnectionResetError``) at the first message after that;
- the follower runs no thread: :func:`drive` runs its steps (``Follower._steps``) as a
  task of the standby's process, waiting a step's backoff, or :data:`POLL` after a tip,
  on the virtual clock. The task belongs to the process (killed with it).

So the shipper's side runs where the primary's store calls it (its maintainer, on the
loop in ``loop`` mode), the follower's at virtual times, and a run of a seed replays alike.
Not simulated: bytes on a wire (a body is a file copy: no torn or slow transfer), the
transport's window and the follower's ack timing beyond "after it installed the mark".
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Generator, Iterator
from typing import Any

import statestores
from sfaas.sim.network import SimNetwork, SimNetworkPort
from statestores.replica import Follower, Received, Shipper
from statestores.replica.source import copier
from statestores.replica.wire import Hello, MarkMsg, Tip, bodies_of

__all__ = ["SimReplicas", "SimReplicaPort", "SimReplicaServer", "SimSource", "drive", "POLL",
           "FIRST_PORT"]

#: Simulated seconds a follower waits after a tip (nothing new) before it looks again
#: (``LocalSource`` waits 0.05 s of wall time in the shipper for news).
POLL = 0.01
#: The first port a replication server gets (the network's servers count from 7700 on).
FIRST_PORT = 47000


class SimReplicaServer:
    """A primary's replication server: the shippers its ``lookup`` names, at ``address``."""

    def __init__(self, owner: SimNetworkPort, lookup: Callable[[str], Shipper | None],
                 secret: str, address: tuple[str, int], gone: Callable[[tuple[str, int]], None],
                 ) -> None:
        self.owner = owner
        self.lookup = lookup
        self.secret = secret
        self._address = address
        self._gone = gone
        self.serving = True

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    def close(self) -> None:
        if self.serving:
            self.serving = False
            self._gone(self._address)


class SimReplicas:
    """The run's replication servers by address, on the run's network (its cuts)."""

    def __init__(self, net: SimNetwork, on_event: Callable[[str], None] | None = None) -> None:
        self.net = net
        #: told each message a follower receives (a trace line, without the time)
        self.on_event = on_event or (lambda _e: None)
        self._servers: dict[tuple[str, int], SimReplicaServer] = {}
        self._next = FIRST_PORT

    def port(self, network: SimNetworkPort) -> SimReplicaPort:
        """The replica port of the process whose network port is ``network``."""
        return SimReplicaPort(self, network)

    def listen(self, owner: SimNetworkPort, lookup: Callable[[str], Shipper | None], secret: str,
               host: str) -> SimReplicaServer:
        address = (host, self._next)
        self._next += 1
        server = self._servers[address] = SimReplicaServer(owner, lookup, secret, address,
                                                           self._unlisten)
        return server

    def _unlisten(self, address: tuple[str, int]) -> None:
        self._servers.pop(address, None)

    def reach(self, client: SimNetworkPort, address: tuple[str, int]) -> SimReplicaServer:
        """The server ``client`` reaches at ``address``; ``ConnectionRefusedError`` if none
        listens there, either process is dead or the two are cut apart."""
        server = self._servers.get(address)
        if server is None or server.owner.dead or client.dead \
                or self.net.cut_apart(client.name, server.owner.name):
            raise ConnectionRefusedError(111, f"replication server {address[0]}:{address[1]} "
                                              "refused the connection (simulated)")
        return server


class SimReplicaPort:
    """One process's replica port (``sfaas.runtime.ports.ReplicaPort``)."""

    def __init__(self, replicas: SimReplicas, network: SimNetworkPort) -> None:
        self._replicas = replicas
        self._network = network

    def serve(self, shippers: Callable[[str], Shipper | None], secret: str,
              host: str) -> SimReplicaServer:
        return self._replicas.listen(self._network, shippers, secret, host)

    def follow(self, engine: str, directory: str, address: tuple[str, int], store: str,
               secret: str, **options: Any) -> Follower:
        source = SimSource(self._replicas, self._network, address, store, secret)
        fol: Follower = statestores.follow(engine, directory, source, driver=drive, **options)
        return fol


class SimSource:
    """A follower's source: the store ``store`` of the server at ``address``, reached
    from the process of ``client`` (see the module docstring)."""

    def __init__(self, replicas: SimReplicas, client: SimNetworkPort, address: tuple[str, int],
                 store: str, secret: str) -> None:
        self._replicas = replicas
        self._client = client
        self._address = address
        self.store = store
        self._secret = secret
        self._closed = False

    def _shipper(self, name: str) -> Shipper:
        server = self._replicas.reach(self._client, self._address)
        if server.secret != self._secret:
            raise ConnectionError(f"{self._address}: the secret differs (simulated)")
        shipper = server.lookup(name)
        if shipper is None:
            raise ConnectionResetError(f"{self._address} ships no store {name!r} (simulated)")
        return shipper

    def open(self, hello: Hello) -> Iterator[Received | Tip]:
        shipper = self._shipper(hello.store)
        stream = shipper.stream(hello, idle=0)
        try:
            for d in stream:
                if self._closed:
                    return
                if self._shipper(hello.store) is not shipper:  # (it died, or was cut off)
                    raise ConnectionResetError("the replication stream broke (simulated)")
                if isinstance(d, Tip):
                    yield d
                    continue
                msg = d.msg
                what = (f"mark {msg.snapshot_id}" if isinstance(msg, MarkMsg)
                        else "base" if msg.base else "edit")
                self._replicas.on_event(
                    f"replica {self._client.name} <- {self._address[1]} {hello.store}: {what} "
                    f"at version {msg.seq}, {len(bodies_of(msg))} files")
                yield Received(msg, copier(d.paths))
                if isinstance(d.msg, MarkMsg):  # asked for the next: the mark is installed
                    shipper.note_ack(d.msg.snapshot_id)
        finally:
            stream.close()

    def close(self) -> None:
        self._closed = True


def drive(steps: Generator[float, None, None], name: str) -> Callable[[], None]:
    """Run a follower's ``steps`` as a task of the calling process (its ``driver``):
    each step after the wait the one before yielded, :data:`POLL` after a tip. Returns
    the call that ends them (between two steps: from the loop, or from a thread while
    the loop waits for it — a promotion's)."""
    task = asyncio.get_running_loop().create_task(_steps(steps), name=name)
    _DRIVEN.add(task)
    task.add_done_callback(_DRIVEN.discard)

    def halt() -> None:  # (the task ends at its next step: the steps are closed)
        if inspect.getgeneratorstate(steps) != inspect.GEN_RUNNING:
            steps.close()

    return halt


#: the followers' tasks running (held: the loop keeps weak references)
_DRIVEN: set[asyncio.Task[None]] = set()


async def _steps(steps: Generator[float, None, None]) -> None:
    try:
        for wait in steps:
            await asyncio.sleep(wait if wait > 0 else POLL)
    finally:
        steps.close()
